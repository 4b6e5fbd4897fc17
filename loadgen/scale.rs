//! Scale phases: `GET /api/tools` with 1,000 registered tools, and what 2,000
//! live model sessions cost the server in memory.

use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::{Value, json};

use super::{Api, figure, open_event_stream, progress, sequential};

/// Registered tools the listing is measured with (the server's default cap).
const LISTED_TOOLS: usize = 1000;
/// Live model sessions whose memory is measured.
const LIVE_SESSIONS: usize = 2000;

fn registered(listing: &Value) -> usize {
    listing["tools_by_role"].as_object().map_or(0, |by_role| {
        by_role
            .values()
            .filter_map(Value::as_array)
            .map(Vec::len)
            .sum()
    })
}

/// Fills the registry to 1,000 tools, then times `GET /api/tools`; leaves the
/// registry as it found it.
pub async fn tools_list_phase(api: &Api, callback_url: &str, samples: u64) -> anyhow::Result<()> {
    progress("GET /api/tools with 1,000 registered tools");
    let before = registered(&Api::json(api.get("/api/tools")).await?);
    let mut added = Vec::new();
    for i in before..LISTED_TOOLS {
        let name = format!("bench_listed_{i:04}");
        let body = serde_json::to_vec(&json!({
            "name": name, "description": "a listed bench tool",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            "callback_url": callback_url, "role": "Lanlan", "source": "plugin:bench-list",
        }))?;
        Api::json(api.post_bytes("/api/tools/register", body)).await?;
        added.push(name);
    }
    let listing = Api::json(api.get("/api/tools")).await?;
    ensure!(
        registered(&listing) >= LISTED_TOOLS,
        "only {} tools registered",
        registered(&listing)
    );
    let stats = {
        let api = api.clone();
        sequential(samples, Duration::from_secs(30), move |_| {
            let request = api.get("/api/tools");
            async move {
                let response = request.send().await?;
                ensure!(response.status().is_success(), "HTTP {}", response.status());
                response.bytes().await?;
                Ok(())
            }
        })
        .await
    };
    stats.check("GET /api/tools")?;
    stats.report_latency("list_1000_tools");
    for name in added {
        let body = serde_json::to_vec(&json!({"name": name, "role": "Lanlan"}))?;
        Api::json(api.post_bytes("/api/tools/unregister", body)).await?;
    }
    Ok(())
}

/// Resident memory of process `pid`, in MiB (Linux `/proc`).
fn rss_mb(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context("reading the server's /proc status (Linux only)")?;
    let kb: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .context("no VmRSS line")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb / 1024.0)
}

/// Opens 2,000 live model sessions (one event stream each, every one past its
/// `ready`) and reports the server's resident memory growth.
pub async fn sessions_rss_phase(api: &Api, server_pid: u32) -> anyhow::Result<()> {
    progress("2,000 live model sessions: server memory");
    let idle = rss_mb(server_pid)?;
    let mut sessions = Vec::with_capacity(LIVE_SESSIONS);
    for _ in 0..LIVE_SESSIONS {
        let session = Api::json(api.post("/sessions", br#"{"character":"Lanlan"}"#)).await?;
        sessions.push(
            session["data"]["id"]
                .as_str()
                .context("session id")?
                .to_owned(),
        );
    }
    let with_sessions = rss_mb(server_pid)?;
    let mut streams = Vec::with_capacity(LIVE_SESSIONS);
    for session in &sessions {
        streams.push(open_event_stream(api, session).await?);
    }
    let live = rss_mb(server_pid)?;
    figure("server_idle_rss_mb", idle);
    figure("model_sessions_2k_rss_mb", live - with_sessions);
    for stream in streams {
        stream.abort();
    }
    Ok(())
}
