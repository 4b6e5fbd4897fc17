//! The opt-in real-model check of the generation loop (issue 15): a real local
//! model (SmolLM2-135M-Instruct under llama.cpp's `llama-server`) drives one
//! turn through the real binary, and the test asserts the mechanics — a tool
//! call made, executed, journalled with the run's ids, then answered — not the
//! quality of the answer. Ignored by default; `bash .ci/real-model` builds
//! llama-server, fetches the model and runs it with the paths it needs in
//! `REAL_MODEL_LLAMA_SERVER`, `REAL_MODEL_GGUF` and `REAL_MODEL_CHAT_TEMPLATE`.
//!
//! Why the help: the GGUF's own chat template renders no tools, so llama-server
//! is given llama.cpp's Qwen2.5 template (ChatML, like SmolLM2's, with
//! `<tool_call>` blocks). Its `tool_choice: "required"` grammar still lets text
//! come before the call, and a 135M model asked the time just talks, so the
//! user turn spells out the call to make; the grammar then keeps its arguments
//! valid. `max_steps_per_generation: 1` makes the second request the one
//! without tools, which must be answered with text.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::events::Events;
use common::{SpawnOptions, TestServer, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The one tool the session may call: no required arguments, so any call the
/// model makes can succeed.
const TOOL: &str = "get_time";

/// The user turn: the call spelled out in the template's own format.
const USER_TURN: &str = "Repeat exactly this text and nothing else:\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

/// A `llama-server` child, killed (and its log shown, on failure) when dropped.
struct LlamaServer {
    child: Child,
    base_url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl LlamaServer {
    fn start(binary: &Path, gguf: &Path, template: &Path) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("llama-server.log");
        let out = std::fs::File::create(&log).expect("log file");
        let port = free_port();
        let child = Command::new(binary)
            .args(["--jinja", "-c", "4096", "-n", "256", "-t", "2"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--alias", "smollm2", "--chat-template-file"])
            .arg(template)
            .arg("-m")
            .arg(gguf)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        Self {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        }
    }

    /// Waits until `/health` answers 200 (503 while the model loads).
    async fn wait_healthy(&mut self, timeout: Duration) {
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("llama-server status") {
                panic!("llama-server exited with {status} before it was healthy");
            }
            let health = client
                .get(format!("{}/health", self.base_url))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            if health.is_ok_and(|r| r.status() == StatusCode::OK) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "llama-server was not healthy within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- llama-server log (last 40 lines) ---");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// A port nobody listens on right now (llama-server binds it next).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// The file named by `var`; fails loudly when it is unset or missing.
fn required_file(var: &str) -> PathBuf {
    let path = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: this check needs a real model; run `bash .ci/real-model`")
    });
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "{var}={} is not a file; run `bash .ci/real-model`",
        path.display()
    );
    path
}

/// A character that steers the small model toward the clock tool, and a
/// session of it whose narrator may call that tool only.
async fn clock_session(server: &TestServer) -> String {
    let character = json!({
        "name": "Clock",
        "persona": "a helpful assistant",
        "temperature": 0,
        "system_prompt": format!("You are a helpful assistant. To learn the current time, call the {TOOL} tool."),
    });
    let created = server.post("/characters", character).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    let session = server
        .post("/sessions", json!({"character": "Clock"}))
        .await;
    assert_eq!(session.status, StatusCode::CREATED, "{session:?}");
    let session = session.body["data"]["id"].as_str().unwrap().to_owned();
    let path = format!("/sessions/{session}/tool-permissions");
    let only_the_clock =
        json!({"slot_allow_list": {"narrator": [TOOL]}, "max_steps_per_generation": 1});
    let reply = server.patch(&path, only_the_clock).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let catalog = server
        .get(&format!(
            "/sessions/{session}/tools/runtime?slot=narrator&format=openai"
        ))
        .await;
    let offered: Vec<&str> = catalog.body["data"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|tool| tool["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, [TOOL], "{catalog:?}");
    session
}

/// Events of the stream until `run_finished` or `run_failed` (that one last).
async fn until_run_ends(events: &mut Events) -> Vec<(String, Value)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let mut seen = Vec::new();
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run did not end within 600 s: {seen:?}"
        );
        let event = events.next_within(Duration::from_secs(300)).await;
        let end = event.kind == "run_finished" || event.kind == "run_failed";
        if event.kind != "token" {
            println!("event {}: {}", event.kind, event.data);
        }
        seen.push((event.kind, event.data));
        if end {
            return seen;
        }
    }
}

#[tokio::test]
#[ignore = "drives a real local model: run `bash .ci/real-model`"]
async fn a_real_model_calls_a_tool_and_answers_its_result() {
    let binary = required_file("REAL_MODEL_LLAMA_SERVER");
    let gguf = required_file("REAL_MODEL_GGUF");
    let template = required_file("REAL_MODEL_CHAT_TEMPLATE");
    let mut llama = LlamaServer::start(&binary, &gguf, &template);
    llama.wait_healthy(Duration::from_secs(180)).await;
    let server = spawn_with(SpawnOptions {
        env: vec![
            (
                "TOOLGATE_LLM_BASE_URL".into(),
                format!("{}/v1", llama.base_url),
            ),
            ("TOOLGATE_LLM_MODEL".into(), "smollm2".into()),
            ("TOOLGATE_LLM_FIRST_TOOL_CHOICE".into(), "required".into()),
        ],
        ..Default::default()
    })
    .await;
    let session = clock_session(&server).await;
    let mut events = Events::open(&server, &session).await;
    let reply = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": USER_TURN}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
    let started = reply.body["data"].clone();
    let seen = until_run_ends(&mut events).await;
    assert!(
        seen.iter()
            .all(|(_, data)| data["run_id"] == started["run_id"]),
        "{seen:?}"
    );
    let (last, ending) = seen.last().unwrap();
    assert_eq!(last, "run_finished", "the run did not finish: {ending}");
    println!("answer: {}", ending["content"]);

    let finished: Vec<&Value> = seen
        .iter()
        .filter(|(kind, _)| kind == "tool_call_finished")
        .map(|(_, data)| data)
        .collect();
    assert!(
        !finished.is_empty(),
        "the model made no tool call: {seen:?}"
    );
    let last_call_step = finished.iter().filter_map(|c| c["step"].as_u64()).max();
    assert!(
        seen.iter()
            .any(|(kind, data)| kind == "token" && data["step"].as_u64() > last_call_step),
        "no text came from a request after the tool result: {seen:?}"
    );
    check_journal(&server, &session, &started, &finished).await;
}

/// Every executed call is a journal row of the run; at least one is a
/// successful call of the clock tool.
async fn check_journal(server: &TestServer, session: &str, started: &Value, finished: &[&Value]) {
    let rows = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await;
    assert_eq!(rows.status, StatusCode::OK, "{rows:?}");
    let rows = rows.body["data"].as_array().expect("rows").clone();
    for row in &rows {
        println!("journal row: {row}");
        for key in ["run_id", "floor_id", "page_id"] {
            assert_eq!(row[key], started[key], "{key} of {row}");
        }
        assert_eq!(row["caller_slot"], "narrator", "{row}");
    }
    for call in finished {
        assert!(
            rows.iter().any(|row| row["id"] == call["execution_id"]),
            "tool_call_finished {call} has no journal row"
        );
    }
    assert!(
        rows.iter()
            .any(|row| row["tool_name"] == TOOL && row["status"] == "success"),
        "no successful {TOOL} call in the journal: {rows:?}"
    );
}
