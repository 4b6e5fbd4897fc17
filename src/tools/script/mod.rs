//! The script handler's sandbox: user JavaScript runs in an embedded QuickJS engine
//! with memory, time, stack and output limits, on blocking threads so that a busy
//! script cannot stall the server's other requests.

mod engine;
mod memory;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::reason::ReasonCode;

/// Resource limits of one script run.
#[derive(Debug, Clone)]
pub struct ScriptLimits {
    /// Heap the engine may allocate, in bytes.
    pub memory_bytes: usize,
    /// Wall-clock time from the start of the run, enforced by the interrupt handler.
    pub time: Duration,
    /// Native stack the engine may use, in bytes (bounds recursion).
    pub stack_bytes: usize,
    /// Largest serialised JSON result, in bytes.
    pub output_bytes: usize,
}

impl ScriptLimits {
    pub const DEFAULT_MEMORY_BYTES: usize = 16 * 1024 * 1024;
    pub const DEFAULT_TIME: Duration = Duration::from_secs(1);
    pub const DEFAULT_STACK_BYTES: usize = 512 * 1024;
    pub const DEFAULT_OUTPUT_BYTES: usize = 1024 * 1024;
}

impl ScriptLimits {
    /// Limits of one script-handler call on a server with `settings`.
    pub fn from_settings(settings: &crate::config::Settings) -> Self {
        Self {
            memory_bytes: settings.script_memory_limit_bytes,
            time: Duration::from_millis(settings.script_timeout_ms),
            ..Self::default()
        }
    }
}

impl Default for ScriptLimits {
    fn default() -> Self {
        Self {
            memory_bytes: Self::DEFAULT_MEMORY_BYTES,
            time: Self::DEFAULT_TIME,
            stack_bytes: Self::DEFAULT_STACK_BYTES,
            output_bytes: Self::DEFAULT_OUTPUT_BYTES,
        }
    }
}

/// Why a script produced no result. Every variant is a tool error the model sees;
/// none of them is a server failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    #[error("the script threw {0}")]
    Thrown(String),
    #[error("the script's promise was rejected with {0}")]
    Rejected(String),
    #[error("the script ran longer than its time limit of {} ms and was stopped", .0.as_millis())]
    TimeLimit(Duration),
    #[error("the script exceeded its memory limit of {} bytes and was stopped", .0)]
    MemoryLimit(usize),
    #[error("the script exceeded its stack limit of {} bytes (recursion too deep) and was stopped", .0)]
    StackLimit(usize),
    #[error("the script's result is {size} bytes of JSON, over the limit of {limit} bytes")]
    OutputLimit { limit: usize, size: usize },
    #[error("{0}")]
    NotSerializable(String),
    #[error(
        "the script returned a promise that never settled (nothing was left to run that could resolve it)"
    )]
    NeverSettled,
    #[error("{0}")]
    Invalid(String),
    /// Never started: no slot in time, or the account already holds as many
    /// scripts as there are slots (the text says which).
    #[error("{0}")]
    Busy(&'static str),
    #[error("the script engine failed: {0}")]
    Engine(String),
}

impl ScriptError {
    /// The journal's reason code of this failure, one per variant.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            ScriptError::Thrown(_) => ReasonCode::ScriptThrew,
            ScriptError::Rejected(_) => ReasonCode::ScriptPromiseRejected,
            ScriptError::TimeLimit(_) => ReasonCode::ScriptTimeLimit,
            ScriptError::MemoryLimit(_) => ReasonCode::ScriptMemoryLimit,
            ScriptError::StackLimit(_) => ReasonCode::ScriptStackLimit,
            ScriptError::OutputLimit { .. } => ReasonCode::ScriptOutputLimit,
            ScriptError::NotSerializable(_) => ReasonCode::ScriptResultNotSerializable,
            ScriptError::NeverSettled => ReasonCode::ScriptNeverSettled,
            ScriptError::Invalid(_) => ReasonCode::ScriptInvalid,
            ScriptError::Busy(_) => ReasonCode::ScriptSandboxBusy,
            ScriptError::Engine(_) => ReasonCode::ScriptEngineError,
        }
    }
}

/// Runs `script` on the calling thread. Blocking: use [`ScriptRunner::run`] from
/// async code. Exposed for benchmarks and tests of the engine itself.
pub fn run_blocking(
    script: &str,
    args: &serde_json::Value,
    limits: &ScriptLimits,
) -> Result<serde_json::Value, ScriptError> {
    engine::run(script, args, limits)
}

/// Why a script did not start: every slot stayed busy for the queue wait.
const SANDBOX_FULL: &str = "the script sandbox is busy; try again shortly";
/// Why a script did not start: its account's share of the slots is taken.
const ACCOUNT_FULL: &str = "the script sandbox is busy with this account's scripts (as many running or waiting as it has slots); try again shortly";

/// Runs scripts on tokio's blocking pool, at most `concurrency` at a time. Callers
/// beyond that wait for a slot for at most [`ScriptRunner::QUEUE_WAIT_FACTOR`] times
/// the time limit, so the wait is bounded as well as the run.
///
/// The slots are every account's, so one account may hold at most
/// `concurrency` scripts running or waiting: its next one is refused at once
/// (`script_sandbox_busy`) instead of queueing ahead of other accounts' (the
/// queue is first come, first served), so another account waits for at most
/// the scripts already running.
#[derive(Debug, Clone)]
pub struct ScriptRunner {
    limits: ScriptLimits,
    slots: Arc<Semaphore>,
    concurrency: usize,
    /// Scripts running or waiting, by account.
    shares: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
}

/// One of an account's places among the scripts running or waiting; given
/// back when dropped.
struct Share {
    shares: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    account_id: String,
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut shares = self.shares.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(held) = shares.get_mut(&self.account_id) {
            *held -= 1;
            if *held == 0 {
                shares.remove(&self.account_id);
            }
        }
    }
}

impl ScriptRunner {
    /// How many time limits a call may wait for a free slot before it is refused.
    pub const QUEUE_WAIT_FACTOR: u32 = 4;

    pub fn new(limits: ScriptLimits, concurrency: usize) -> Self {
        Self {
            limits,
            slots: Arc::new(Semaphore::new(concurrency.max(1))),
            concurrency: concurrency.max(1),
            shares: Arc::default(),
        }
    }

    /// One of `account_id`'s places, if it has one left.
    fn take_share(&self, account_id: &str) -> Option<Share> {
        let mut shares = self.shares.lock().unwrap_or_else(|p| p.into_inner());
        let held = shares.entry(account_id.to_owned()).or_default();
        if *held >= self.concurrency {
            return None;
        }
        *held += 1;
        Some(Share {
            shares: self.shares.clone(),
            account_id: account_id.to_owned(),
        })
    }

    /// One slot per core but one (at least one), so scripts never take every core
    /// and the server always has one left for its other requests.
    pub fn with_default_concurrency(limits: ScriptLimits) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self::new(limits, cores.saturating_sub(1).max(1))
    }

    pub fn limits(&self) -> &ScriptLimits {
        &self.limits
    }

    /// Runs one script of `account_id` with `args` and returns its JSON result.
    pub async fn run(
        &self,
        account_id: &str,
        script: Arc<str>,
        args: serde_json::Value,
    ) -> Result<serde_json::Value, ScriptError> {
        let Some(share) = self.take_share(account_id) else {
            tracing::info!(
                account_id,
                places = self.concurrency,
                "script refused: the account already has as many scripts running or waiting as there are sandbox slots"
            );
            return Err(ScriptError::Busy(ACCOUNT_FULL));
        };
        let queue_wait = self.limits.time * Self::QUEUE_WAIT_FACTOR;
        let permit =
            match tokio::time::timeout(queue_wait, self.slots.clone().acquire_owned()).await {
                Ok(Ok(permit)) => permit,
                _ => {
                    tracing::warn!(?queue_wait, "script sandbox busy: no free slot in time");
                    return Err(ScriptError::Busy(SANDBOX_FULL));
                }
            };
        let limits = self.limits.clone();
        let started = std::time::Instant::now();
        let joined = tokio::task::spawn_blocking(move || {
            // Both held until the script ends, even if its caller went away.
            let _held = (permit, share);
            engine::run(&script, &args, &limits)
        })
        .await;
        let result = match joined {
            Ok(result) => result,
            Err(err) => {
                tracing::error!(error = %err, "script thread failed");
                Err(ScriptError::Engine("the script thread failed".to_owned()))
            }
        };
        let elapsed_ms = started.elapsed().as_millis() as u64;
        record_script_metrics(&result);
        match &result {
            Ok(_) => tracing::debug!(elapsed_ms, "script finished"),
            Err(err) => tracing::info!(elapsed_ms, error = %err, "script failed"),
        }
        result
    }
}

/// Counts the run, and the limit it ran into if any.
fn record_script_metrics(result: &Result<serde_json::Value, ScriptError>) {
    let metrics = crate::metrics::metrics();
    if !metrics.enabled() {
        return;
    }
    metrics.script_runs.inc();
    let limit = match result {
        Err(ScriptError::TimeLimit(_)) => "time",
        Err(ScriptError::MemoryLimit(_)) => "memory",
        Err(ScriptError::StackLimit(_)) => "stack",
        Err(ScriptError::OutputLimit { .. }) => "output",
        _ => return,
    };
    metrics.record_script_limit(limit);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(script: &str) -> Result<serde_json::Value, ScriptError> {
        run_within(script, Duration::from_millis(300))
    }

    fn run_within(script: &str, time: Duration) -> Result<serde_json::Value, ScriptError> {
        let limits = ScriptLimits {
            time,
            ..ScriptLimits::default()
        };
        run_blocking(script, &json!({"name": "Aria"}), &limits)
    }

    #[test]
    fn returns_json() {
        assert_eq!(
            run("return { found: true, info: args.name };").unwrap(),
            json!({"found": true, "info": "Aria"})
        );
        assert_eq!(run("return null;").unwrap(), json!(null));
        assert_eq!(run("return [1, 'a'];").unwrap(), json!([1, "a"]));
    }

    #[test]
    fn promises_settle() {
        assert_eq!(
            run("return Promise.resolve(1).then(x => ({ x: x + 1 }));").unwrap(),
            json!({"x": 2})
        );
        assert_eq!(
            run("return (async () => { await null; return args.name; })();").unwrap(),
            json!("Aria")
        );
        let err = run("return Promise.reject(new TypeError('nope'));").unwrap_err();
        assert_eq!(err, ScriptError::Rejected("TypeError: nope".into()));
        assert_eq!(
            run("return new Promise(() => {});").unwrap_err(),
            ScriptError::NeverSettled
        );
    }

    /// Native array methods run without polling the interrupt: walking a huge
    /// sparse array is refused before it starts, however the method is
    /// reached, and the script cannot put the originals back.
    #[test]
    fn array_methods_refuse_huge_walks() {
        for script in [
            "return Array(2e9).join('').length;",
            "return Array(2e9).includes(1);",
            "let n = 0; Array(2e9).forEach(() => n++); return n;",
            "return Array.prototype.indexOf.call({ length: 2e9 }, 1);",
            "const a = []; a.length = 2 ** 32 - 1; return a.lastIndexOf(1);",
            "return String(Array(2e9));",
            // Natives that walk what an argument brings (found by a probe:
            // each ran 30-80 s past the time limit).
            "return [].concat({ length: 2e9, [Symbol.isConcatSpreadable]: true }).length;",
            "return [].concat([1], Array(2e9)).length;",
            "return String.raw({ raw: { length: 2e9 } }).length;",
            "return [Array(2e9)].flat().length;",
            "return [[[Array(2e9)]]].flat(Infinity).length;",
            "return [1].flatMap(() => Array(2e9)).length;",
            "return JSON.stringify({}, Array(2e9));",
            "return Array(2e9).keys().drop(2e9).next().done;",
            "return Array(2e9).values().drop(2e9).next().done;",
            // A getter length the guard cannot trust (found by a probe: a
            // second read answered 2^27, walked for 2-3 s in native code).
            "let n = 0; return Array.prototype.reverse.call({ get length() { return n++ === 0 ? 1 : 2 ** 27; } }).length;",
        ] {
            match run(script) {
                Err(ScriptError::Thrown(text)) => {
                    assert!(
                        text.contains("the sandbox walks at most")
                            || text.contains("the sandbox does not walk it"),
                        "{script}: {text}"
                    )
                }
                other => panic!("{script}: {other:?}"),
            }
        }
    }

    /// Found by a probe: a getter answering the guard a small length and the
    /// native a huge one walked 2^27 elements in native code for seconds.
    #[test]
    fn a_value_read_twice_answers_the_walk_what_it_answered_the_check() {
        // A value read twice answers the walk what it answered the check:
        // each is read once, so the result is the first read's (a native
        // walking 2^27 elements would answer that many, seconds later).
        for (script, first_read) in [
            (
                "let n = 0; const o = { get length() { return n++ === 0 ? 1 : 2 ** 27; }, [Symbol.isConcatSpreadable]: true }; return [].concat(o).length;",
                json!(1),
            ),
            (
                "let n = 0; const o = { length: 2 ** 27, get [Symbol.isConcatSpreadable]() { return n++ > 0; } }; return [].concat(o).length;",
                json!(1),
            ),
            (
                "let n = 0; const o = [0]; Object.defineProperty(o, 0, { get() { return n++ === 0 ? [] : Array(2 ** 27); } }); return o.flat().length;",
                json!(0),
            ),
            (
                "let n = 0; return String.raw({ raw: { get length() { return n++ === 0 ? 1 : 2 ** 27; } } }).length;",
                json!(9),
            ),
            (
                "let n = 0; return Array(2 ** 27).values().drop({ valueOf() { return n++ === 0 ? 1 : 2 ** 27; } }).next().done;",
                json!(false),
            ),
        ] {
            assert_eq!(run(script).unwrap(), first_read, "{script}");
        }
        assert_eq!(run("return typeof Proxy;").unwrap(), json!("undefined"));
        assert_eq!(
            run("const a = []; a[2 ** 25] = 1; a.push(2); return [a.length, a.pop(), a.at(-1)];")
                .unwrap(),
            json!([33554434, 2, 1])
        );
    }

    #[test]
    fn ordinary_arrays_are_untouched_by_the_guard() {
        // Ordinary arrays are untouched, and so is what the methods answer.
        assert_eq!(
            run("return [3, 1, 2].sort().map(x => x * 2).join('-');").unwrap(),
            json!("2-4-6")
        );
        assert_eq!(
            run("return Array(1000).fill(1).reduce((a, b) => a + b);").unwrap(),
            json!(1000)
        );
        assert_eq!(
            run("return [[1, [2, [3]]], 4].flat(2).concat([5], 6, { length: 1, 0: 7, [Symbol.isConcatSpreadable]: true });").unwrap(),
            json!([1, 2, [3], 4, 5, 6, 7])
        );
        assert_eq!(
            run("return [1, 2].flatMap(x => [x, x * 10]).concat(String.raw`a${1}b`, JSON.stringify({a: 1, b: 2}, ['a']));").unwrap(),
            json!([1, 10, 2, 20, "a1b", "{\"a\":1}"])
        );
        assert_eq!(
            run("return [...[1, 2, 3, 4].values().drop(2)];").unwrap(),
            json!([3, 4])
        );
        // Replacing a guarded method only replaces it for this script.
        assert!(matches!(
            run("Array.prototype.join = function () { return 'x'; }; return Array(2e9).join();"),
            Ok(value) if value == json!("x")
        ));
    }

    #[test]
    fn limits_stop_scripts() {
        assert!(matches!(
            run("while (true) {}").unwrap_err(),
            ScriptError::TimeLimit(_)
        ));
        assert!(matches!(
            run("try { while (true) {} } catch (e) { return 'caught'; }").unwrap_err(),
            ScriptError::TimeLimit(_)
        ));
        assert!(matches!(
            run("function f() { return f() + 1; } return f();").unwrap_err(),
            ScriptError::StackLimit(_)
        ));
        for hog in [
            "const a = []; while (true) a.push(new Array(1e5).fill(1));",
            "return new ArrayBuffer(1024 * 1024 * 1024).byteLength;",
            // Many small strings: the engine cannot even allocate its error object.
            "const a = []; for (let i = 0; i < 1e9; i++) a.push('x' + i); return a.length;",
            "try { new Array(2 ** 24).fill(0); } catch (e) { throw e; }",
        ] {
            // Time enough that the memory limit is what stops it, however
            // busy the machine running the suite is.
            let err = run_within(hog, Duration::from_secs(60)).unwrap_err();
            assert!(matches!(err, ScriptError::MemoryLimit(_)), "{hog}: {err:?}");
        }
        let err = run("return /(a+)+$/.test('a'.repeat(40) + 'b');").unwrap_err();
        assert!(matches!(err, ScriptError::TimeLimit(_)), "{err:?}");
        let err = run("function f() { try { return f(); } catch (e) { return f(); } } return f();")
            .unwrap_err();
        assert!(matches!(err, ScriptError::TimeLimit(_)), "{err:?}");
        let err = run("return 'x'.repeat(2 * 1024 * 1024);").unwrap_err();
        assert!(matches!(err, ScriptError::OutputLimit { .. }), "{err:?}");
        let err =
            run("function f() { Promise.resolve().then(f); } f(); return new Promise(() => {});")
                .unwrap_err();
        assert!(matches!(err, ScriptError::TimeLimit(_)), "{err:?}");
    }

    #[test]
    fn natives_that_never_poll_the_interrupt_stop_soon_after_the_deadline() {
        // Each conversion of a large BigInt to a string is one operation to
        // QuickJS's interrupt counter, polled every 10,000: a loop of them
        // ran minutes past a one-second limit (probe J). Caught or not, the
        // script stops within one conversion of its deadline.
        for script in [
            "const x = (1n << 300000n) - 1n; let s = 0; \
             for (let i = 0; i < 1e6; i++) s += String(x + BigInt(i)).length; return s;",
            "const x = (1n << 300000n) - 1n; let s = 0; \
             for (let i = 0; i < 1e6; i++) { try { s += String(x + BigInt(i)).length; } catch (e) {} } \
             return s;",
        ] {
            let (sender, receiver) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = sender.send(run_within(script, Duration::from_millis(300)));
            });
            // A hang detector, not a measurement: without the heap's deadline
            // this loop runs for hours.
            let outcome = receiver
                .recv_timeout(Duration::from_secs(120))
                .expect("the script ran minutes past its time limit");
            assert!(
                matches!(outcome, Err(ScriptError::TimeLimit(_))),
                "{outcome:?}"
            );
        }
    }

    #[test]
    fn each_failure_has_its_own_reason_code() {
        let failures = [
            ScriptError::Thrown(String::new()),
            ScriptError::Rejected(String::new()),
            ScriptError::TimeLimit(Duration::ZERO),
            ScriptError::MemoryLimit(0),
            ScriptError::StackLimit(0),
            ScriptError::OutputLimit { limit: 0, size: 0 },
            ScriptError::NotSerializable(String::new()),
            ScriptError::NeverSettled,
            ScriptError::Invalid(String::new()),
            ScriptError::Busy(SANDBOX_FULL),
            ScriptError::Engine(String::new()),
        ];
        let codes: std::collections::HashSet<_> =
            failures.iter().map(ScriptError::reason_code).collect();
        assert_eq!(codes.len(), failures.len());
        assert!(
            codes
                .iter()
                .all(|code| code.as_str().starts_with("script_"))
        );
    }

    #[test]
    fn throws_are_described() {
        assert_eq!(
            run("throw new Error('boom');").unwrap_err(),
            ScriptError::Thrown("Error: boom".into())
        );
        assert_eq!(
            run("throw 'plain';").unwrap_err(),
            ScriptError::Thrown("a non-Error value: \"plain\"".into())
        );
        assert_eq!(
            run("throw { code: 7 };").unwrap_err(),
            ScriptError::Thrown("a non-Error value: {\"code\":7}".into())
        );
        assert_eq!(
            run("throw undefined;").unwrap_err(),
            ScriptError::Thrown("a non-Error value: undefined".into())
        );
        assert!(
            matches!(run("return (").unwrap_err(), ScriptError::Thrown(m) if m.starts_with("SyntaxError"))
        );
    }

    #[test]
    fn host_apis_are_absent() {
        for script in [
            "return require('fs');",
            "process.exit(1);",
            "return fetch('http://127.0.0.1');",
            "return Deno.readTextFileSync('/etc/passwd');",
            "return setTimeout(() => {}, 10);",
            "return performance.now();",
        ] {
            let err = run(script).unwrap_err();
            assert!(
                matches!(&err, ScriptError::Thrown(m) if m.starts_with("ReferenceError")),
                "{script}: {err:?}"
            );
        }
        let err = run("return import('x');").unwrap_err();
        assert!(matches!(err, ScriptError::Rejected(_)), "{err:?}");
    }

    #[test]
    fn values_without_json_form_are_errors() {
        for script in [
            "return undefined;",
            "return;",
            "return () => 1;",
            "return Symbol('s');",
            "const a = {}; a.self = a; return a;",
            "return 10n;",
        ] {
            let err = run(script).unwrap_err();
            assert!(
                matches!(err, ScriptError::NotSerializable(_)),
                "{script}: {err:?}"
            );
        }
    }

    #[test]
    fn each_run_gets_a_fresh_global() {
        run("globalThis.leaked = 1; Object.prototype.polluted = 1; JSON.stringify = null; return 1;")
            .unwrap();
        assert_eq!(
            run("return [typeof leaked, ({}).polluted === undefined, typeof JSON.stringify];")
                .unwrap(),
            json!(["undefined", true, "function"])
        );
    }

    /// A runner with `slots` slots and a `time_ms` limit, and account `a`'s
    /// endless script started on it.
    fn spinning_runner(
        time_ms: u64,
        slots: usize,
    ) -> (
        ScriptRunner,
        tokio::task::JoinHandle<Result<serde_json::Value, ScriptError>>,
    ) {
        let limits = ScriptLimits {
            time: Duration::from_millis(time_ms),
            ..ScriptLimits::default()
        };
        let runner = ScriptRunner::new(limits, slots);
        let spinning = tokio::spawn({
            let runner = runner.clone();
            async move { runner.run("a", "while (true) {}".into(), json!({})).await }
        });
        (runner, spinning)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runner_keeps_the_async_runtime_free() {
        let (runner, busy) = spinning_runner(500, 2);
        let started = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(started.elapsed() < Duration::from_millis(200));
        let ok = runner
            .run("a", "return args.n * 2;".into(), json!({"n": 21}))
            .await
            .unwrap();
        assert_eq!(ok, json!(42));
        assert!(matches!(
            busy.await.unwrap().unwrap_err(),
            ScriptError::TimeLimit(_)
        ));
    }

    /// Found by a probe: one account keeping the only slot's queue full made
    /// every other account's script wait past the queue limit and be refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_account_holds_at_most_as_many_scripts_as_there_are_slots() {
        let (runner, spinning) = spinning_runner(300, 1);
        // The first script has taken account a's place before the next one asks.
        while runner.shares.lock().unwrap().get("a").is_none() {
            tokio::task::yield_now().await;
        }
        assert!(matches!(
            runner.run("a", "return 1;".into(), json!({})).await,
            Err(ScriptError::Busy(ACCOUNT_FULL))
        ));
        assert_eq!(
            runner
                .run("b", "return 2;".into(), json!({}))
                .await
                .unwrap(),
            json!(2),
            "another account waits for the running script only"
        );
        assert!(matches!(
            spinning.await.unwrap(),
            Err(ScriptError::TimeLimit(_))
        ));
        assert!(
            runner.shares.lock().unwrap().is_empty(),
            "every place given back"
        );
        assert_eq!(
            runner
                .run("a", "return 3;".into(), json!({}))
                .await
                .unwrap(),
            json!(3)
        );
    }
}
