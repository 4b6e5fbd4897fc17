//! Issue 20: crash safety of the journal under load. SIGKILL in the middle of
//! a burst of remote calls (some answering, some hanging in their callback,
//! more arriving all the time) leaves every call that reached its provider as
//! exactly one journal row: none lost, none doubled, none still `running`
//! after the restart, and every call the client saw answered keeps the status
//! it was answered with.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use common::{TestServer, spawn_app};
use serde_json::{Value, json};

/// Workers firing calls at once.
const WORKERS: usize = 12;
/// Calls hanging in their callback when the server is killed.
const HANGING: usize = 6;
/// Calls answered before the kill, at least.
const ANSWERED: usize = 150;

/// The callback server: which call ids reached a provider.
#[derive(Clone, Default)]
struct Provider {
    received: Arc<Mutex<Vec<String>>>,
    hanging: Arc<AtomicUsize>,
}

async fn start_provider() -> (String, Provider) {
    let state = Provider::default();
    let app = axum::Router::new()
        .route(
            "/ok",
            post(
                |State(p): State<Provider>, Json(body): Json<Value>| async move {
                    p.received.lock().unwrap().push(call_id_of(&body));
                    Json(json!({"output": {"done": true}, "is_error": false}))
                },
            ),
        )
        .route(
            "/hang",
            post(
                |State(p): State<Provider>, Json(body): Json<Value>| async move {
                    p.received.lock().unwrap().push(call_id_of(&body));
                    p.hanging.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                    Json(json!({"output": "never", "is_error": false}))
                },
            ),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, state)
}

fn call_id_of(body: &Value) -> String {
    body["call_id"].as_str().expect("a call_id").to_owned()
}

/// What the clients saw: the status each answered call was answered with.
type Answers = Arc<Mutex<HashMap<String, String>>>;

/// Fires calls until `stop`: every `HANGING`-th of the first calls goes to the
/// hanging tool, the rest to the answering one.
fn fire(server: &TestServer, session: &str, stop: Arc<AtomicBool>, answers: Answers) {
    let sent = Arc::new(AtomicUsize::new(0));
    for worker in 0..WORKERS {
        let (client, token) = (server.client.clone(), server.token.clone());
        let url = server.url(&format!("/sessions/{session}/tool-calls"));
        let (stop, answers, sent) = (stop.clone(), answers.clone(), sent.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let n = sent.fetch_add(1, Ordering::SeqCst);
                let tool = if n % 10 == 3 && n < HANGING * 10 {
                    "hang"
                } else {
                    "ok"
                };
                let call_id = format!("burst_{worker}_{n}");
                let reply = client
                    .post(&url)
                    .bearer_auth(&token)
                    .json(&json!({"name": tool, "arguments": {"n": n}, "call_id": call_id}))
                    .send()
                    .await;
                let Ok(reply) = reply else { return };
                let Ok(body) = reply.json::<Value>().await else {
                    return;
                };
                let status = body["data"]["status"].as_str().unwrap_or("?").to_owned();
                answers.lock().unwrap().insert(call_id, status);
            }
        });
    }
}

/// `toolgate doctor --json`'s count of interrupted calls on the stopped
/// server's database.
fn doctor_interrupted_calls(server: &TestServer) -> usize {
    let database_url = server.database_url();
    let output =
        common::toolgate_command(&["doctor", "--json"], &server.data_dir, Some(&database_url));
    let report = common::doctor_report(&output);
    assert_eq!(report["ok"], true, "{report}");
    report["checkup"]["interrupted_calls"]
        .as_u64()
        .unwrap_or_else(|| panic!("no interrupted_calls: {report}")) as usize
}

/// Every journal row of the session, through keyset pages.
async fn all_rows(server: &TestServer, session: &str) -> Vec<Value> {
    let mut rows = Vec::new();
    let mut path = format!("/tool-executions?session_id={session}&limit=200");
    loop {
        let page = server.get(&path).await;
        assert_eq!(page.status, reqwest::StatusCode::OK, "{page:?}");
        rows.extend(page.body["data"].as_array().unwrap().iter().cloned());
        let Some(cursor) = page.body["meta"]["next_cursor"].as_str() else {
            return rows;
        };
        let cursor: String = form_urlencoded::byte_serialize(cursor.as_bytes()).collect();
        path = format!("/tool-executions?session_id={session}&limit=200&cursor={cursor}");
    }
}

#[tokio::test]
async fn sigkill_during_a_burst_leaves_every_started_call_as_exactly_one_row() {
    let mut server = spawn_app().await;
    let (base, provider) = start_provider().await;
    for tool in ["ok", "hang"] {
        common::register_remote(
            &server,
            json!({"name": tool, "callback_url": format!("{base}/{tool}"), "timeout_seconds": 300}),
        )
        .await;
    }
    let session = server.create_session().await;
    let (stop, answers) = (Arc::new(AtomicBool::new(false)), Answers::default());
    fire(&server, &session, stop.clone(), answers.clone());
    let (hanging, answered) = (provider.hanging.clone(), answers.clone());
    common::wait_until(
        Duration::from_secs(60),
        "the hanging calls to reach their callback and enough calls to be answered",
        || {
            let (hanging, answered) = (hanging.clone(), answered.clone());
            async move {
                hanging.load(Ordering::SeqCst) == HANGING
                    && answered.lock().unwrap().len() >= ANSWERED
            }
        },
    )
    .await;
    // Killed while the workers keep calling: calls are at every stage.
    server.kill().await;
    stop.store(true, Ordering::SeqCst);
    // What the operator's doctor reads off the dead server's files (on
    // SQLite, calls still in the journal's log included) is what the restart
    // then marks uncertain.
    let interrupted = doctor_interrupted_calls(&server);
    server.restart().await;

    let rows = all_rows(&server, &session).await;
    let marked = rows
        .iter()
        .filter(|r| r["execution_reason_code"] == "interrupted_by_restart")
        .count();
    assert_eq!(
        interrupted, marked,
        "doctor counted {interrupted} interrupted calls; the restart marked {marked}"
    );
    let mut by_call: HashMap<String, Vec<&Value>> = HashMap::new();
    for row in &rows {
        by_call
            .entry(row["call_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(row);
    }
    let doubled: Vec<_> = by_call.iter().filter(|(_, rows)| rows.len() > 1).collect();
    assert!(
        doubled.is_empty(),
        "calls with more than one row: {doubled:?}"
    );
    let received: HashSet<String> = provider.received.lock().unwrap().iter().cloned().collect();
    let lost: Vec<_> = received
        .iter()
        .filter(|id| !by_call.contains_key(*id))
        .collect();
    assert!(
        lost.is_empty(),
        "calls that reached their provider without a row: {lost:?}"
    );
    for row in &rows {
        assert_eq!(row["lifecycle_state"], "finished", "{row}");
        let status = row["status"].as_str().unwrap();
        assert!(["success", "uncertain"].contains(&status), "{row}");
        if status == "uncertain" {
            assert_eq!(
                row["execution_reason_code"], "interrupted_by_restart",
                "{row}"
            );
        }
    }
    for (call_id, status) in answers.lock().unwrap().iter() {
        let row = by_call
            .get(call_id)
            .unwrap_or_else(|| panic!("answered call {call_id} has no row"));
        assert_eq!(
            row[0]["status"].as_str(),
            Some(status.as_str()),
            "{}",
            row[0]
        );
    }
    let uncertain = rows.iter().filter(|r| r["status"] == "uncertain").count();
    assert!(
        uncertain >= HANGING,
        "the {HANGING} hanging calls end uncertain (found {uncertain} uncertain rows)"
    );
    for worker_hang in (0..HANGING).map(|k| k * 10 + 3) {
        let hung: Vec<_> = rows
            .iter()
            .filter(|r| r["args"]["n"] == worker_hang && r["tool_name"] == "hang")
            .collect();
        assert_eq!(hung.len(), 1, "hanging call n={worker_hang}: {hung:?}");
        assert_eq!(hung[0]["status"], "uncertain");
    }
}

/// Checkpoints run on their own thread (automatic ones are off on every
/// connection): the rows of a few calls reach the database file itself, read
/// here ignoring the write-ahead log, without any write passing SQLite's
/// automatic threshold.
#[tokio::test]
async fn journal_rows_are_checkpointed_into_the_database_file() {
    let mut server = spawn_app().await;
    if server.on_postgres() {
        eprintln!("SKIPPED on PostgreSQL: write-ahead-log checkpoints are SQLite's");
        return;
    }
    let session = server.create_session().await;
    for n in 0..5 {
        server.roll_dice(&session, &format!("c{n}")).await;
    }
    let file = server.data_dir.join("toolgate.db");
    let session_id = session.clone();
    common::wait_until(
        Duration::from_secs(20),
        "the calls' rows to be checkpointed into the database file",
        || {
            let (file, session_id) = (file.clone(), session_id.clone());
            async move { rows_in_database_file(&file, &session_id) == 5 }
        },
    )
    .await;
    // A clean stop closes every connection, the journal's and the checkpoint
    // thread's included: the last one checkpoints and removes the log.
    assert!(server.stop().await.success());
    let log = server.data_dir.join("toolgate.db-wal");
    assert!(
        !log.exists(),
        "{} is left after a clean stop",
        log.display()
    );
}

/// Under calls that never pause, the write-ahead log still starts over: the
/// checkpoint thread catches up while journal writes wait, so the next commit
/// reuses the log from its beginning. Before, each checkpoint pass left the
/// frames written during it uncopied, SQLite never restarted the log, and it
/// grew by about 44 KB a call (88 MB for these 2,000 calls) for as long as
/// the calls kept coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_starts_over_under_calls_that_never_pause() {
    const CALLERS: usize = 4;
    const CALLS_EACH: usize = 500;
    /// A restart every pass keeps the log near one pass's frames (about 500
    /// commits, 11 MB); 16 MB is its size limit after a restart.
    const BOUND_BYTES: u64 = 32 << 20;
    let server = Arc::new(spawn_app().await);
    if server.on_postgres() {
        eprintln!("SKIPPED on PostgreSQL: the write-ahead log is SQLite's");
        return;
    }
    let session = server.create_session().await;
    let callers = (0..CALLERS).map(|caller| {
        let (server, session) = (server.clone(), session.clone());
        tokio::spawn(async move {
            for n in 0..CALLS_EACH {
                server.roll_dice(&session, &format!("c{caller}_{n}")).await;
            }
        })
    });
    for caller in futures::future::join_all(callers).await {
        caller.expect("a caller panicked");
    }
    let log = server.data_dir.join("toolgate.db-wal");
    let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    assert!(
        size < BOUND_BYTES,
        "the write-ahead log is {size} bytes after {} calls (bound {BOUND_BYTES})",
        CALLERS * CALLS_EACH
    );
}

/// Finished rows of `session` in the database file alone (`immutable=1` reads
/// no write-ahead log).
fn rows_in_database_file(file: &std::path::Path, session: &str) -> i64 {
    let uri = format!("file:{}?immutable=1", file.display());
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI;
    let Ok(connection) = rusqlite::Connection::open_with_flags(uri, flags) else {
        return -1;
    };
    connection
        .query_row(
            "SELECT COUNT(*) FROM tool_execution_record WHERE session_id = ?1 AND lifecycle_state = 'finished'",
            [session],
            |row| row.get(0),
        )
        .unwrap_or(-1)
}
