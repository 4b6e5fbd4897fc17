//! A request's log lines keep their span whatever the thread asked the
//! subscriber before. sqlx asks, after each statement, whether its query log is
//! on, through the `log` facade (`log_enabled!`); the subscriber's per-layer
//! filters both refuse it under `sqlx=warn`, and nothing is logged after. On
//! PostgreSQL that happens on the async workers. tracing-subscriber keeps such
//! a refusal in a thread-local until the next span or event consumes it, and a
//! callsite that every filter enables `always` consumes it without asking
//! again: the next request span on that worker was recorded as refused, so
//! its lines were logged without it and OpenTelemetry never saw it.
//!
//! One test per process: it installs the global subscriber through the
//! server's own `telemetry::init`.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Log output kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

fn request_span(path: &str) -> tracing::Span {
    toolgate::telemetry::request_span(&http::Method::GET, path, &http::HeaderMap::new())
}

#[test]
fn a_request_span_after_a_question_every_filter_refused_is_still_in_the_log() {
    let captured = Captured::default();
    let writer = captured.clone();
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(move || writer.clone());
    let _telemetry =
        toolgate::telemetry::init(fmt, tracing_subscriber::EnvFilter::new("debug,sqlx=warn"));

    // An earlier request, as in a running server: the callsites are known.
    request_span("/earlier").in_scope(|| tracing::debug!("an earlier request"));
    // sqlx's question after a statement. Its answer does not matter here
    // (tracing-subscriber says yes while any of 64 filter slots is free);
    // what it leaves behind on this thread does.
    let _ = log::log_enabled!(target: "sqlx::query", log::Level::Debug);
    request_span("/api/tools").in_scope(|| tracing::debug!("inside the request"));

    let log = captured.text();
    let line = log
        .lines()
        .find(|line| line.contains("inside the request"))
        .unwrap_or_else(|| panic!("the event inside the request was not logged:\n{log}"));
    assert!(
        line.contains("http_request{") && line.contains("url.path=\"/api/tools\""),
        "the request's line lost its span: {line}"
    );
}
