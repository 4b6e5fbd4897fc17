//! The console phase: a session with 10,000 journal rows (written through
//! `POST /sessions/{id}/tool-calls`, as a model's calls would be), a console
//! sign-in, then sequential GETs of the console's pages over it, timed.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};

use super::{Api, Limit, TOKEN, drive, progress, sequential};

/// Journal rows of the measured session (the issue's acceptance figure).
const CONSOLE_ROWS: u64 = 10_000;

fn hidden_token(html: &str) -> anyhow::Result<String> {
    let marker = "name=\"csrf_token\" value=\"";
    let start = html.find(marker).context("no csrf_token")? + marker.len();
    let end = html[start..].find('"').context("unterminated token")? + start;
    Ok(html[start..end].to_owned())
}

/// Signs the bench key in and returns the `Cookie` header value.
async fn sign_in(api: &Api) -> anyhow::Result<String> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let login = client
        .get(format!("{}/console/login", api.base))
        .send()
        .await?;
    let token = hidden_token(&login.text().await?)?;
    let body = serde_urlencoded::to_string([("csrf_token", token.as_str()), ("api_key", TOKEN)])?;
    let answer = client
        .post(format!("{}/console/login", api.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await?;
    ensure!(
        answer.status().as_u16() == 303,
        "sign-in answered {}",
        answer.status()
    );
    let cookie = answer
        .headers()
        .get("set-cookie")
        .context("no cookie")?
        .to_str()?;
    Ok(cookie.split(';').next().unwrap_or_default().to_owned())
}

/// Writes `CONSOLE_ROWS` calls into `session` and returns one execution id.
async fn seed(api: &Api, concurrency: usize, session: &str) -> anyhow::Result<String> {
    let path = Arc::new(format!("/sessions/{session}/tool-calls"));
    let request = api.clone();
    let stats = drive(
        concurrency,
        Limit {
            duration: Duration::from_secs(600),
            max_requests: CONSOLE_ROWS,
        },
        move |_| {
            let request = request.post(&path, br#"{"name":"roll_dice","arguments":{"sides":6}}"#);
            async move { Api::json(request).await.map(drop) }
        },
    )
    .await;
    stats.check("console_seed")?;
    // The last seeded row's page: `meta.total` is exact up to a page's end.
    let rows = Api::json(api.get(&format!(
        "/tool-executions?session_id={session}&limit=1&offset={}",
        CONSOLE_ROWS - 1
    )))
    .await?;
    ensure!(
        rows["meta"]["total"].as_i64() >= Some(CONSOLE_ROWS as i64),
        "seeded {rows}"
    );
    Ok(rows["data"][0]["id"].as_str().context("no row")?.to_owned())
}

pub async fn console_phase(args: &super::Args, api: &Api, session: &str) -> anyhow::Result<()> {
    progress("console pages over 10,000 journal rows");
    let execution = seed(api, args.concurrency, session).await?;
    let cookie = Arc::new(sign_in(api).await?);
    let pages = [
        ("session", format!("/console/sessions/{session}")),
        (
            "session_journal_offset_5000",
            format!("/console/sessions/{session}?offset=5000"),
        ),
        ("sessions", "/console/sessions".to_owned()),
        ("execution", format!("/console/executions/{execution}")),
        ("activity", "/console/activity".to_owned()),
    ];
    for (label, path) in pages {
        let url = Arc::new(format!("{}{path}", api.base));
        let client = api.client.clone();
        let cookie = cookie.clone();
        let stats = sequential(args.samples.min(300), Duration::from_secs(30), move |_| {
            let request = client.get(url.as_str()).header("cookie", cookie.as_str());
            async move {
                let answer = request.send().await?;
                ensure!(
                    answer.status().is_success(),
                    "{} answered {}",
                    answer.url(),
                    answer.status()
                );
                let body: String = answer.text().await?;
                ensure!(body.contains("</html>"), "not a whole page");
                Ok(())
            }
        })
        .await;
        stats.check(label)?;
        stats.report_latency(&format!("console_{label}"));
    }
    Ok(())
}
