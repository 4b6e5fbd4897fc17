//! The script handler's sandbox through the real server: hostile scripts end as
//! tool errors, and the server keeps answering other requests promptly meanwhile.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{SpawnOptions, TestServer, spawn_with};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// What "promptly" means for a request that does not touch a script.
const PROMPT: Duration = Duration::from_millis(500);

async fn server() -> TestServer {
    spawn_with(SpawnOptions {
        env: vec![("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into())],
        ..Default::default()
    })
    .await
}

/// A session and a way to define-and-call scripts in it.
struct Sandbox {
    server: TestServer,
    session: String,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Sandbox {
    async fn new() -> Self {
        let server = server().await;
        let session = server.create_session().await;
        Self { server, session }
    }

    /// A sandbox whose scripts' time limit is `timeout_ms`.
    async fn with_timeout_ms(timeout_ms: u32) -> Self {
        let server = spawn_with(SpawnOptions {
            env: vec![
                ("ENABLE_UNSAFE_SCRIPT_HANDLER".into(), "true".into()),
                ("TOOLGATE_SCRIPT_TIMEOUT_MS".into(), timeout_ms.to_string()),
            ],
            ..Default::default()
        })
        .await;
        let session = server.create_session().await;
        Self { server, session }
    }

    /// Stores `script` as a new definition and returns its tool name.
    async fn define(&self, script: &str) -> String {
        let name = format!("script_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let reply = self
            .server
            .post(
                "/tools/definitions",
                json!({"name": name, "handler_type": "script", "handler": {"script": script}}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        name
    }

    async fn call(&self, name: &str, arguments: Value) -> Value {
        let reply = self
            .server
            .post(
                &format!("/sessions/{}/tool-calls", self.session),
                json!({"name": name, "arguments": arguments}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        reply.body["data"].clone()
    }

    async fn run(&self, script: &str) -> Value {
        let name = self.define(script).await;
        self.call(&name, json!({"name": "Aria"})).await
    }

    /// Runs `script` and checks it ended as a tool error whose message contains
    /// `expected`, and that the server is still healthy afterwards.
    async fn expect_error(&self, script: &str, expected: &str) -> Value {
        let result = self.run(script).await;
        assert_eq!(result["is_error"], true, "{script}: {result}");
        let message = result["output"].as_str().unwrap_or_default();
        assert!(
            message.contains(expected),
            "{script}: expected {expected:?} in {message:?}"
        );
        self.assert_healthy().await;
        result
    }

    async fn assert_healthy(&self) {
        let started = Instant::now();
        let reply = self.server.get("/healthz").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(
            started.elapsed() < PROMPT,
            "healthz took {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn happy_path_returns_the_scripts_value() {
    let sandbox = Sandbox::new().await;
    let result = sandbox
        .run("return { found: true, info: args.name };")
        .await;
    assert_eq!(result["is_error"], false, "{result}");
    assert_eq!(result["status"], "success");
    assert_eq!(result["output"], json!({"found": true, "info": "Aria"}));
    let result = sandbox
        .run("return new Promise(resolve => resolve({ later: args.name }));")
        .await;
    assert_eq!(result["output"], json!({"later": "Aria"}));
    let result = sandbox
        .run("return (async () => { await null; return [1, 'two', null, true]; })();")
        .await;
    assert_eq!(result["output"], json!([1, "two", null, true]));
}

#[tokio::test]
async fn an_endless_loop_is_stopped_while_the_server_stays_responsive() {
    let sandbox = Sandbox::new().await;
    let looping = sandbox.define("while (true) {}").await;
    let quick = sandbox.define("return args.name;").await;
    let started = Instant::now();
    // More looping calls than the sandbox has slots, all at once.
    let calls: Vec<_> = (0..3).map(|_| sandbox.call(&looping, json!({}))).collect();
    let calls = futures::future::join_all(calls);
    let probes = async {
        // While the loops run, other requests keep answering promptly.
        let mut probes = 0;
        while started.elapsed() < Duration::from_millis(800) {
            let before = Instant::now();
            let reply = sandbox.server.get("/healthz").await;
            assert_eq!(reply.status, StatusCode::OK);
            assert!(
                before.elapsed() < PROMPT,
                "healthz took {:?}",
                before.elapsed()
            );
            let before = Instant::now();
            let reply = sandbox.server.get("/tools/definitions").await;
            assert_eq!(reply.status, StatusCode::OK);
            assert!(
                before.elapsed() < PROMPT,
                "list took {:?}",
                before.elapsed()
            );
            probes += 1;
        }
        probes
    };
    let (results, probes) = tokio::join!(calls, probes);
    assert!(
        probes >= 3,
        "only {probes} probes completed while scripts ran"
    );
    // One account holds at most as many scripts as there are slots: the
    // others are refused at once, never started.
    let mut timed_out = 0;
    for result in results {
        assert_eq!(result["is_error"], true, "{result}");
        if result["execution_reason_code"] == "script_sandbox_busy" {
            continue;
        }
        assert_eq!(result["status"], "timeout", "{result}");
        assert!(
            result["output"].as_str().unwrap().contains("time limit"),
            "{result}"
        );
        timed_out += 1;
    }
    assert!(timed_out >= 1, "a loop ran until its time limit");
    // Stopped at the 1 s deadline (queued ones after a slot freed), not hanging.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    let result = sandbox.call(&quick, json!({"name": "after"})).await;
    assert_eq!(result["output"], "after");
    sandbox.assert_healthy().await;
}

#[tokio::test]
async fn catching_the_interrupt_does_not_help() {
    let sandbox = Sandbox::new().await;
    sandbox
        .expect_error(
            "for (;;) { try { while (true) {} } catch (e) {} }",
            "time limit",
        )
        .await;
    sandbox
        .expect_error("return /(a+)+$/.test('a'.repeat(40) + 'b');", "time limit")
        .await;
}

/// Array methods run natively, past the interrupt: walking a huge sparse array
/// (no memory, half a minute of CPU in one shared sandbox slot) is refused
/// before it starts, and journalled as the script's error.
#[tokio::test]
async fn walking_a_huge_sparse_array_is_refused() {
    let sandbox = Sandbox::new().await;
    for script in [
        "return Array(2e9).join('').length;",
        "let n = 0; Array(2e9).forEach(() => n++); return n;",
        "return Array.prototype.includes.call({ length: 2 ** 53 - 1 }, 1);",
        "return [].concat({ length: 2e9, [Symbol.isConcatSpreadable]: true }).length;",
        "return [1].flatMap(() => Array(2e9)).length;",
        "return Array(2e9).values().drop(2e9).next().done;",
    ] {
        let result = sandbox
            .expect_error(script, "the sandbox walks at most 16777216")
            .await;
        assert_eq!(result["status"], "error", "{script}: {result}");
    }
}

#[tokio::test]
async fn a_recursion_bomb_hits_the_stack_limit() {
    let sandbox = Sandbox::new().await;
    sandbox
        .expect_error(
            "function f(n) { return f(n + 1) + 1; } return f(0);",
            "stack limit",
        )
        .await;
    sandbox
        .expect_error(
            "const o = {}; o.toString = function () { return String(this); }; return String(o);",
            "stack limit",
        )
        .await;
}

#[tokio::test]
async fn allocating_a_gibibyte_hits_the_memory_limit() {
    let sandbox = Sandbox::new().await;
    for script in [
        "const b = new ArrayBuffer(1024 * 1024 * 1024); return b.byteLength;",
        "const a = new Array(1024 * 1024 * 16).fill(1.5); return a.length;",
        "const a = []; for (let i = 0; i < 1e9; i++) a.push({ i, s: 'x' + i }); return a.length;",
    ] {
        sandbox.expect_error(script, "memory limit").await;
    }
}

#[tokio::test]
async fn huge_outputs_are_refused() {
    let sandbox = Sandbox::new().await;
    // Fits in memory but not in the output limit.
    sandbox
        .expect_error("return 'x'.repeat(2 * 1024 * 1024);", "over the limit")
        .await;
    // Does not even fit in memory.
    sandbox
        .expect_error(
            "let s = 'x'.repeat(1024 * 1024); const parts = []; for (let i = 0; i < 64; i++) parts.push(s + i); return parts.join('');",
            "memory limit",
        )
        .await;
}

#[tokio::test]
async fn host_apis_do_not_exist() {
    let sandbox = Sandbox::new().await;
    for (script, expected) in [
        (
            "const fs = require('fs'); return fs.readFileSync('/etc/passwd', 'utf8');",
            "require is not defined",
        ),
        ("process.exit(1);", "process is not defined"),
        ("return fetch('http://127.0.0.1');", "fetch is not defined"),
        (
            "return Deno.readTextFileSync('/etc/passwd');",
            "Deno is not defined",
        ),
        ("return import('x');", "could not load module"),
        (
            "return import('fs').then(m => m.readFileSync('/etc/passwd'));",
            "could not load module",
        ),
        (
            "setTimeout(() => {}, 1); return 1;",
            "setTimeout is not defined",
        ),
        (
            "return new XMLHttpRequest();",
            "XMLHttpRequest is not defined",
        ),
        ("return std.loadFile('/etc/passwd');", "std is not defined"),
        ("return os.exec(['ls']);", "os is not defined"),
        // The one blocking wait QuickJS has is refused on this runtime.
        (
            "return Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5000);",
            "cannot block",
        ),
    ] {
        sandbox.expect_error(script, expected).await;
    }
}

#[tokio::test]
async fn global_tampering_does_not_leak_into_the_next_call() {
    let sandbox = Sandbox::new().await;
    let tamper = sandbox
        .run(
            "globalThis.secret = 'leak'; Object.prototype.polluted = 'yes'; \
             Array.prototype.map = function () { return 'hijacked'; }; JSON.stringify = null; \
             Math.random = () => 4; return 'tampered';",
        )
        .await;
    assert_eq!(tamper["output"], "tampered");
    let check = sandbox
        .run(
            "return { secret: typeof secret, polluted: ({}).polluted === undefined, \
             map: [1, 2].map(x => x * 2), stringify: typeof JSON.stringify, random: Math.random() < 1 };",
        )
        .await;
    assert_eq!(check["is_error"], false, "{check}");
    assert_eq!(
        check["output"],
        json!({"secret": "undefined", "polluted": true, "map": [2, 4], "stringify": "function", "random": true})
    );
    // Even the script that breaks JSON itself still gets a clean conversion.
    let broken = sandbox
        .run("JSON.stringify = () => 'evil'; return { ok: 1 };")
        .await;
    assert_eq!(broken["output"], json!({"ok": 1}));
}

#[tokio::test]
async fn thrown_values_become_tool_errors() {
    let sandbox = Sandbox::new().await;
    for (script, expected) in [
        ("throw new Error('boom');", "the script threw Error: boom"),
        ("throw new RangeError('out');", "RangeError: out"),
        ("throw 'a string';", "non-Error value: \"a string\""),
        ("throw 42;", "non-Error value: 42"),
        ("throw null;", "non-Error value: null"),
        ("throw undefined;", "non-Error value: undefined"),
        ("throw { code: 7 };", "non-Error value: {\"code\":7}"),
        ("throw Symbol('s');", "non-Error value"),
        (
            "return Promise.reject('nope');",
            "rejected with a non-Error value: \"nope\"",
        ),
        (
            "return (async () => { throw new TypeError('late'); })();",
            "rejected with TypeError: late",
        ),
        ("return {", "SyntaxError"),
    ] {
        let result = sandbox.expect_error(script, expected).await;
        assert_eq!(result["status"], "error", "{script}: {result}");
    }
}

#[tokio::test]
async fn values_without_a_json_form_are_tool_errors() {
    let sandbox = Sandbox::new().await;
    for (script, expected) in [
        ("return undefined;", "returned undefined"),
        ("args.name;", "returned undefined"),
        ("return function () {};", "returned a function"),
        ("return () => 1;", "returned a function"),
        ("return Symbol('s');", "returned a symbol"),
        (
            "const a = { name: 'a' }; a.self = a; return a;",
            "cannot be converted to JSON",
        ),
        ("return 10n;", "cannot be converted to JSON"),
        ("return new Promise(() => {});", "never settled"),
        (
            "return new Promise(resolve => { globalThis.keep = resolve; });",
            "never settled",
        ),
        (
            "let d = {}; let c = d; for (let i = 0; i < 500; i++) { c.a = {}; c = c.a; } return d;",
            "nested more than",
        ),
    ] {
        sandbox.expect_error(script, expected).await;
    }
}

#[tokio::test]
async fn an_endless_promise_chain_is_stopped_by_the_deadline() {
    let sandbox = Sandbox::new().await;
    let result = sandbox
        .expect_error(
            "function spin() { Promise.resolve().then(spin); } spin(); return new Promise(() => {});",
            "time limit",
        )
        .await;
    assert_eq!(result["status"], "timeout");
}

/// A call refused because every sandbox slot stayed busy never ran: it is an
/// `error` row whose provider did not start, and the caller is told when to
/// retry. Calls that did run are `provider_started`.
#[tokio::test]
async fn a_full_sandbox_refuses_calls_that_never_start_and_says_when_to_retry() {
    let sandbox = Sandbox::with_timeout_ms(150).await;
    let looping = sandbox.define("while (true) {}").await;
    // Slots are cores − 1 and a call waits at most 4 time limits for one, so
    // this many calls at once always leaves some without a slot.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let calls = 8 * cores + 8;
    let results =
        futures::future::join_all((0..calls).map(|_| sandbox.call(&looping, json!({})))).await;
    let busy: Vec<&Value> = results
        .iter()
        .filter(|r| r["output"].as_str().unwrap_or_default().contains("busy"))
        .collect();
    assert!(
        !busy.is_empty(),
        "no call found the sandbox full: {results:?}"
    );
    for refused in &busy {
        assert_eq!(refused["status"], "error", "{refused}");
        assert_eq!(
            refused["execution_reason_code"], "script_sandbox_busy",
            "{refused}"
        );
        assert!(
            refused["output"].as_str().unwrap().contains("retry after"),
            "{refused}"
        );
        let id = refused["execution_id"].as_str().unwrap();
        let row = sandbox.server.get(&format!("/tool-executions/{id}")).await;
        assert_eq!(row.body["data"]["provider_started"], false, "{row:?}");
        assert_eq!(
            row.body["data"]["execution_reason_code"], "script_sandbox_busy",
            "{row:?}"
        );
    }
    let ran = results
        .iter()
        .find(|r| {
            r["output"]
                .as_str()
                .unwrap_or_default()
                .contains("time limit")
        })
        .expect("some call ran until its time limit");
    let id = ran["execution_id"].as_str().unwrap();
    let row = sandbox.server.get(&format!("/tool-executions/{id}")).await;
    assert_eq!(row.body["data"]["provider_started"], true, "{row:?}");
    assert_eq!(
        row.body["data"]["execution_reason_code"], "script_time_limit",
        "{row:?}"
    );
}

/// The sandbox's slots are every account's: an account that sends more
/// scripts at once than there are slots has the extra ones refused at once,
/// instead of filling the queue that another account's script waits in
/// (found by a probe: the other account's call waited past the queue limit
/// and was refused).
#[tokio::test]
async fn one_account_cannot_fill_the_sandbox_queue_for_another() {
    let greedy = Sandbox::with_timeout_ms(300).await;
    let looping = greedy.define("while (true) {}").await;
    let other = greedy.server.create_account("other").await;
    let session = greedy.server.create_session_as(&other, "Other").await;
    let defined = greedy
        .server
        .send_as(
            &other,
            Method::POST,
            "/tools/definitions",
            Some(json!({"name": "quick", "handler_type": "script", "handler": {"script": "return 'mine';"}})),
        )
        .await;
    assert_eq!(defined.status, StatusCode::CREATED, "{defined:?}");
    // Far more loops than slots: queued, they would hold the queue for longer
    // than a call may wait in it (4 time limits).
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let sent = 8 * cores + 8;
    let loops = futures::future::join_all((0..sent).map(|_| greedy.call(&looping, json!({}))));
    let theirs = async {
        // Once every loop is journalled: running, waiting for a slot, or refused.
        let all_in = || async {
            let page = greedy
                .server
                .get(&format!(
                    "/tool-executions?session_id={}&tool_name={looping}&limit=1",
                    greedy.session
                ))
                .await;
            page.body["meta"]["total"].as_u64() == Some(sent as u64)
        };
        common::wait_until(Duration::from_secs(30), "every loop journalled", all_in).await;
        greedy
            .server
            .send_as(
                &other,
                Method::POST,
                &format!("/sessions/{session}/tool-calls"),
                Some(json!({"name": "quick", "arguments": {}})),
            )
            .await
    };
    let (loops, theirs) = tokio::join!(loops, theirs);
    assert_eq!(theirs.body["data"]["status"], "success", "{theirs:?}");
    assert_eq!(theirs.body["data"]["output"], "mine");
    let refused = loops
        .iter()
        .filter(|r| r["execution_reason_code"] == "script_sandbox_busy")
        .filter(|r| {
            r["output"]
                .as_str()
                .is_some_and(|text| text.contains("busy with this account's scripts"))
        })
        .count();
    assert!(
        refused > 0,
        "the greedy account's extra loops were refused for its share: {loops:?}"
    );
}
