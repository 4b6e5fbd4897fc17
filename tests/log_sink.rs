//! A log sink that stops reading never stops the server: log lines are
//! written by a thread of their own, so a stderr pipe nobody drains (a stuck
//! collector, a paused terminal) holds lines in memory instead of holding the
//! async workers that logged them; and once the sink reads again, every line
//! reaches it.

mod common;

use std::time::Duration;

use common::{SpawnOptions, spawn_with};
use tokio::io::AsyncReadExt;

/// Requests sent while nobody reads the log: at debug level each writes
/// several lines, together far more than a pipe holds (64 KiB on Linux).
const REQUESTS: usize = 1_500;

#[tokio::test]
async fn an_undrained_log_pipe_does_not_stall_requests_and_loses_no_line() {
    let mut server = spawn_with(SpawnOptions {
        env: vec![("RUST_LOG".into(), "debug,sqlx=warn".into())],
        piped_stderr: true,
        ..Default::default()
    })
    .await;
    // Held open and not read until every request has been answered.
    let mut stderr = server.take_stderr();

    let client = reqwest::Client::new();
    for sent in 0..REQUESTS {
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            client.get(server.url("/api/tools")).send(),
        )
        .await
        .unwrap_or_else(|_| {
            panic!("request {sent} got no answer in 20 s: the server waits for its log pipe")
        })
        .expect("request");
        assert_eq!(answer.status(), 200);
    }

    let drained = tokio::spawn(async move {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes).await;
        bytes
    });
    let status = server.stop().await;
    assert!(status.success(), "{status:?}");
    let log = String::from_utf8_lossy(&drained.await.expect("stderr reader")).into_owned();
    assert!(
        log.len() > 64 * 1024,
        "the run logged only {} bytes: too few to fill a pipe",
        log.len()
    );
    let answered = log
        .lines()
        .filter(|line| line.contains("url.path=\"/api/tools\"") && line.contains("latency_ms"))
        .count();
    assert_eq!(
        answered, REQUESTS,
        "every request's line reaches the log once it is read"
    );
}
