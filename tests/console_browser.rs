//! Issue 17 in a real browser: headless Chromium driven over WebDriver
//! (chromedriver, Debian's `chromium` and `chromium-driver`) against the real
//! binary. Sign in (a wrong key first), see an unavailable tool's reason, deny
//! a tool in the permission form and watch the next call appear as `denied`
//! without a reload, open that execution, discard a run from the floor page,
//! and a hostile page on another origin whose form post is refused; a tool
//! registered meanwhile appears in the catalog without a reload; a discarded
//! run stays listed on its floor; a definition is created in the form and
//! tried into the session. The pages are saved as PNG screenshots in a folder
//! that is kept and printed.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::{SpawnOptions, TestServer, spawn_with};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

const WAIT: Duration = Duration::from_secs(30);

/// Finds a program or fails the test saying how to install it.
fn required_program(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|path| path.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "{name} is not installed: the console's browser tests need headless Chromium. \
             Install it with `apt-get install -y chromium chromium-driver` (listed in \
             .ci/packages.txt, which .ci/test installs)"
        )
    })
}

/// chromedriver on a free port, stopped when dropped.
struct Driver {
    url: String,
    _child: Child,
}

async fn start_driver() -> Driver {
    required_program("chromium");
    let chromedriver = required_program("chromedriver");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromedriver");
    let url = format!("http://127.0.0.1:{port}");
    let status = format!("{url}/status");
    common::wait_until(WAIT, "chromedriver ready", || {
        let status = status.clone();
        async move {
            match reqwest::get(&status).await {
                Ok(answer) => answer
                    .json::<Value>()
                    .await
                    .is_ok_and(|body| body["value"]["ready"] == true),
                Err(_) => false,
            }
        }
    })
    .await;
    Driver { url, _child: child }
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,2200"]}),
    );
    ClientBuilder::rustls()
        .expect("tls")
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a Chromium session from chromedriver")
}

/// Saves what the browser shows as `<dir>/<name>.png`.
async fn screenshot(client: &Client, dir: &Path, name: &str) {
    let png = client.screenshot().await.expect("screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
}

async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|err| panic!("{css}: {err}"))
        .click()
        .await
        .unwrap();
}

async fn text_of(client: &Client, css: &str) -> String {
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|err| panic!("{css}: {err}"))
        .text()
        .await
        .unwrap()
}

/// A tool whose catalog entry is unavailable (irreversible, not allowed by the
/// default permissions), a session with a floor and an open run on it.
async fn fixture(server: &TestServer) -> (String, String, String) {
    common::register_remote(server, json!({"name": "launch_rocket", "callback_url": "http://127.0.0.1:9/launch",
        "source": "plugin:rockets", "side_effect_level": "irreversible", "description": "Launches a rocket"})).await;
    let session = server.create_session().await;
    let (floor, run) = server.floor_and_run(&session, "Roll for me").await;
    let call = server
        .post(&format!("/sessions/{session}/tool-calls"),
            json!({"name": "roll_dice", "arguments": {"sides": 20}, "floor_id": floor, "run_id": run}))
        .await;
    assert_eq!(call.body["data"]["status"], "success", "{call:?}");
    (session, floor, run)
}

async fn sign_in(client: &Client, server: &TestServer) {
    client.goto(&server.url("/console/sessions")).await.unwrap();
    let key = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("input[name=api_key]"))
        .await
        .unwrap();
    key.send_keys("tg_wrong_key").await.unwrap();
    click(client, "form.login button").await;
    assert!(text_of(client, "p.error").await.contains("not valid"));
    let key = client
        .find(Locator::Css("input[name=api_key]"))
        .await
        .unwrap();
    key.send_keys(&server.token).await.unwrap();
    click(client, "form.login button").await;
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("form.search"))
        .await
        .unwrap();
}

async fn deny_and_watch(client: &Client, server: &TestServer, session: &str, dir: &Path) -> String {
    let deny = client.find(Locator::Css("#deny_narrator")).await.unwrap();
    deny.clear().await.unwrap();
    deny.send_keys("get_time").await.unwrap();
    click(client, "#permissions button").await;
    assert!(
        text_of(client, "p.notice")
            .await
            .contains("permissions saved")
    );
    let live = client.find(Locator::Css("#live-status")).await.unwrap();
    live_state(client, "live").await;
    let journal = client.find(Locator::Css("#journal")).await.unwrap();
    common::register_remote(
        server,
        json!({"name": "summon_owl", "callback_url": "http://127.0.0.1:9/owl",
        "source": "plugin:owls", "description": "Summons an owl"}),
    )
    .await;
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(
            "#catalog tr[data-tool=summon_owl] .availability",
        ))
        .await
        .expect("a tool registered meanwhile appears in the catalog live");
    let call = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "get_time", "arguments": {}}),
        )
        .await;
    assert_eq!(call.body["data"]["status"], "denied", "{call:?}");
    let execution = call.body["data"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let row = format!("#exec-{execution}[data-status=denied]");
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(&row))
        .await
        .expect("the denied call appears live");
    // Elements found before the call still belong to the page: no reload happened.
    assert!(journal.text().await.expect("same page").contains("denied"));
    assert!(live.text().await.expect("same page").contains("Live"));
    screenshot(client, dir, "session").await;
    let section = client.find(Locator::Css("#journal")).await.unwrap();
    let png = section.screenshot().await.expect("journal screenshot");
    std::fs::write(dir.join("session-journal.png"), png).unwrap();
    execution
}

/// A page on another origin whose form posts to the console (its cookie goes
/// along: another port is the same site) with a valid token; the console must
/// refuse it by its Origin.
async fn hostile_page(target: &str, token: &str) -> String {
    let html = format!(
        "<!doctype html><form id=f method=post action=\"{target}\"><input name=csrf_token value=\"{token}\">\
         <input name=max_calls_per_turn value=1><input name=max_steps_per_generation value=1>\
         <button id=go>go</button></form>"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // Another port of the same host: another origin but the same site, so
    // the SameSite=Strict cookie goes along and only the Origin check stands.
    let url = format!(
        "http://127.0.0.1:{}/",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                html.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        }
    });
    url
}

#[tokio::test]
async fn the_console_in_headless_chromium() {
    let driver = start_driver().await;
    let server = spawn_with(SpawnOptions {
        env: vec![("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into())],
        ..Default::default()
    })
    .await;
    let (session, floor, run) = fixture(&server).await;
    let shots = tempfile::Builder::new()
        .prefix("toolgate-console-screenshots-")
        .tempdir()
        .unwrap()
        .keep();
    println!("console screenshots: {}", shots.display());
    let client = browser(&driver).await;

    sign_in(&client, &server).await;
    screenshot(&client, &shots, "sessions").await;
    click(&client, &format!("a[href='/console/sessions/{session}']")).await;
    let reason = text_of(&client, "tr[data-tool=launch_rocket] .reason").await;
    assert!(reason.contains("allow_irreversible"), "{reason}");
    assert!(
        text_of(&client, "tr[data-tool=launch_rocket] .availability")
            .await
            .contains("unavailable")
    );

    let execution = deny_and_watch(&client, &server, &session, &shots).await;
    click(&client, &format!("#exec-{execution} td.tool a")).await;
    assert_eq!(text_of(&client, "#status").await, "denied");
    let page = client.source().await.unwrap();
    assert!(page.contains("deny list of slot narrator"), "{page}");
    assert_eq!(text_of(&client, "#arguments").await, "{}");
    screenshot(&client, &shots, "execution").await;

    client
        .goto(&server.url(&format!("/console/floors/{floor}")))
        .await
        .unwrap();
    screenshot(&client, &shots, "floor").await;
    click(
        &client,
        &format!("form[action='/console/runs/{run}/discard'] button"),
    )
    .await;
    assert!(text_of(&client, "p.notice").await.contains("run discarded"));
    // A discarded run's page leaves the floor: its buttons are gone.
    let buttons = client
        .find_all(Locator::Css(&format!(
            "form[action='/console/runs/{run}/discard']"
        )))
        .await
        .unwrap();
    assert!(
        buttons.is_empty(),
        "the discarded run still offers a discard"
    );
    assert_eq!(
        server.get(&format!("/runs/{run}")).await.body["data"]["state"],
        "discarded"
    );
    let state = text_of(
        &client,
        &format!("table.discarded tr[data-run='{run}'] td.state"),
    )
    .await;
    assert_eq!(
        state, "discarded",
        "the floor keeps listing the discarded run"
    );

    define_and_try(&client, &server, &shots).await;

    let page = client.source().await.unwrap();
    let token = common::console::csrf_token(&page);
    let target = server.url(&format!("/console/sessions/{session}/permissions"));
    client
        .goto(&hostile_page(&target, &token).await)
        .await
        .unwrap();
    client
        .find(Locator::Id("go"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(text_of(&client, "p.error").await.contains("another site"));
    let permissions = server
        .get(&format!("/sessions/{session}/tool-permissions"))
        .await;
    assert_eq!(
        permissions.body["data"]["max_calls_per_turn"], 10,
        "the hostile post changed nothing"
    );
    signed_out_elsewhere(&client, &server, &session).await;
    client.close().await.unwrap();
}

/// A live session page whose sign-in ends (here: signed out from a script,
/// as another tab would) loses its stream and says it stopped, rather than
/// promising a reconnect that cannot come.
async fn signed_out_elsewhere(client: &Client, server: &TestServer, session: &str) {
    client
        .goto(&server.url(&format!("/console/sessions/{session}")))
        .await
        .unwrap();
    live_state(client, "live").await;
    let token = common::console::csrf_token(&client.source().await.unwrap());
    client
        .execute(
            "fetch('/console/logout', {method: 'POST', body: new URLSearchParams({csrf_token: arguments[0]})});",
            vec![json!(token)],
        )
        .await
        .unwrap();
    live_state(client, "stopped").await;
}

/// Waits for the live journal's status line to say `state`.
async fn live_state(client: &Client, state: &str) {
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(&format!("#live-status[data-state={state}]")))
        .await
        .unwrap_or_else(|err| panic!("the live status never said {state}: {err}"));
}

/// Creates a script definition in the form, then calls it into the session
/// with "try it" and lands on its execution.
async fn define_and_try(client: &Client, server: &TestServer, dir: &Path) {
    client
        .goto(&server.url("/console/definitions/new"))
        .await
        .unwrap();
    let name = client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css("#definition-form input[name=name]"))
        .await
        .unwrap();
    name.send_keys("greet").await.unwrap();
    let script = client
        .find(Locator::Css("#definition-form textarea[name=script]"))
        .await
        .unwrap();
    script
        .send_keys("return 'hello from the console';")
        .await
        .unwrap();
    click(client, "#definition-form button").await;
    assert!(
        text_of(client, "p.notice")
            .await
            .contains("definition created")
    );
    screenshot(client, dir, "definition").await;
    click(client, "#try-it button").await;
    assert_eq!(text_of(client, "#status").await, "success");
    let page = client.source().await.unwrap();
    assert!(page.contains("hello from the console"), "{page}");
    client
        .goto(&server.url("/console/definitions"))
        .await
        .unwrap();
    text_of(client, "tr[data-definition=greet] td.enabled").await;
    screenshot(client, dir, "definitions").await;
}
