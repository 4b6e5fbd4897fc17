//! The `generation` phase: the loop's own overhead per step, against an
//! in-process stand-in model. Every turn is two model requests: the first
//! answer calls the builtin `get_time`, the second is text. Measured: from the
//! floor POST to the first model request (run open, history, catalog), and from
//! the stand-in's first answer to the second request (assembling the answer,
//! running the call through the call path with its journal rows, the next
//! catalog and request). The stand-in's answer time is when its handler
//! returns (the answer is a few hundred bytes written at once).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use futures::StreamExt;
use serde_json::{Value, json};

use super::{Api, Args, Server, Stats, progress};

/// Arrival and answer times of the stand-in's requests.
#[derive(Default)]
struct Timeline {
    arrivals: Vec<Instant>,
    answered: Vec<Instant>,
}

async fn stand_in(timeline: Arc<Mutex<Timeline>>) -> anyhow::Result<String> {
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let timeline = timeline.clone();
            async move {
                timeline.lock().unwrap().arrivals.push(Instant::now());
                let after_tool = body["messages"]
                    .as_array()
                    .and_then(|m| m.last())
                    .is_some_and(|m| m["role"] == "tool");
                let delta = if after_tool {
                    json!({"content": "It is now."})
                } else {
                    json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"}}]})
                };
                let chunk = json!({"object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
                let body = format!("data: {chunk}\n\ndata: [DONE]\n\n");
                timeline.lock().unwrap().answered.push(Instant::now());
                ([("content-type", "text/event-stream")], body)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}/v1"))
}

/// Counts `run_finished` events of a session's stream.
async fn count_finished(
    api: &Api,
    session: &str,
) -> anyhow::Result<tokio::sync::watch::Receiver<usize>> {
    let mut stream = super::events_response(api, session).await?.bytes_stream();
    let (sender, receiver) = tokio::sync::watch::channel(0usize);
    tokio::spawn(async move {
        let (mut pending, mut total) = (String::new(), 0usize);
        while let Some(Ok(chunk)) = stream.next().await {
            pending.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = pending.find("\n\n") {
                let block: String = pending.drain(..end + 2).collect();
                if block.contains("event: run_finished") {
                    total += 1;
                    sender.send_replace(total);
                }
            }
        }
    });
    Ok(receiver)
}

pub(super) async fn generation_phase(
    args: &Args,
    binary: &Path,
    work: &Path,
) -> anyhow::Result<()> {
    let turns = if args.quick {
        30
    } else {
        args.samples.clamp(10, 2000) as usize
    };
    progress(&format!(
        "generation: {turns} turns of two model requests each"
    ));
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let base = stand_in(timeline.clone()).await?;
    let env = vec![
        ("TOOLGATE_LLM_BASE_URL".to_owned(), base),
        ("TOOLGATE_LLM_MODEL".to_owned(), "stand-in".to_owned()),
    ];
    let work = work.join("generation");
    std::fs::create_dir_all(&work)?;
    let mut server = Server::start_with(binary, &work, &env).await?;
    let api = Api {
        client: reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .build()?,
        base: server.base_url.clone(),
    };
    let session = Api::json(api.post("/sessions", br#"{"character":"Lanlan"}"#)).await?;
    let session = session["data"]["id"]
        .as_str()
        .context("session id")?
        .to_owned();
    let mut finished = count_finished(&api, &session).await?;
    let (mut first, mut step) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for turn in 0..turns {
        let posted = Instant::now();
        let body = format!(r#"{{"content":"what time is it? ({turn})"}}"#).into_bytes();
        Api::json(api.post_bytes(&format!("/sessions/{session}/floors"), body)).await?;
        tokio::time::timeout(Duration::from_secs(30), finished.wait_for(|n| *n > turn))
            .await
            .context("a generation did not finish within 30 s")??;
        let timeline = timeline.lock().unwrap();
        let at = turn * 2;
        ensure!(
            timeline.arrivals.len() == at + 2,
            "expected two model requests per turn"
        );
        first.push(timeline.arrivals[at] - posted);
        step.push(timeline.arrivals[at + 1] - timeline.answered[at]);
    }
    let elapsed = started.elapsed();
    Stats::from(first, elapsed, Vec::new()).report("generation_floor_to_first_request");
    Stats::from(step, elapsed, Vec::new()).report("generation_step_overhead");
    server.stop().await
}
