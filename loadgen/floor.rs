//! The floor: the least a separate server process can do for the bench's
//! remote call and register fan-out, measured by the same client in the same
//! run as toolgate. It is a bare hyper server with no authentication, journal,
//! catalog or logging: `POST /call` forwards one fixed callback request through
//! a pooled hyper client (as toolgate's callback client does) and answers with
//! the callback's output; `GET /events` holds an event stream open; `POST
//! /fanout` queues one event on every open stream and answers. What toolgate
//! costs above these figures is its own; what the floor costs above the direct
//! round trip is the machine's (a second process and two more loopback hops).
//! `PUT /page` keeps a body that `GET /page` then answers with: the journal's
//! worst page as toolgate sent it, so that the client's own share of reading
//! it is measured apart from toolgate's.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::{CallbackServer, Limit, Stats, callback_post, drive, figure, progress, sequential};

const LISTENING: &str = "floor listening on ";

/// What a `catalog_changed` event of a one-tool register looks like on the
/// wire (toolgate's is about this long).
const EVENT: &[u8] = b"event: catalog_changed\ndata: {\"model_session_id\":\"ms_01JEXAMPLE0000000000000000\",\"session_id\":\"ses_01JEXAMPLE0000000000000000\",\"role\":\"Bench042\",\"change\":{\"scope\":\"character\",\"kind\":\"tools_registered\"},\"accepted\":true,\"error\":null,\"tools\":[\"bench_seq_17\",\"get_current_time\",\"roll_dice\"]}\n\n";

type Body = BoxBody<Bytes, Infallible>;

struct Floor {
    callback: hyper::Uri,
    client: Client<HttpConnector, Full<Bytes>>,
    streams: Mutex<Vec<mpsc::Sender<Bytes>>>,
    page: Mutex<Bytes>,
}

/// Runs the floor server (the hidden `--floor-server CALLBACK_URL` mode): prints
/// `floor listening on ADDR` and serves until killed.
pub async fn serve(callback_url: &str) -> anyhow::Result<()> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let floor = Arc::new(Floor {
        callback: callback_url.parse().context("callback url")?,
        client: Client::builder(TokioExecutor::new()).build(connector),
        streams: Mutex::new(Vec::new()),
        page: Mutex::new(Bytes::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("{LISTENING}{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let floor = floor.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let floor = floor.clone();
                async move { Ok::<_, Infallible>(floor.answer(request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

impl Floor {
    async fn answer(&self, request: Request<Incoming>) -> Response<Body> {
        match request.uri().path() {
            "/call" => self.call(request).await,
            "/events" => self.events(),
            "/fanout" => {
                // `try_send` never waits, so the lock is held through.
                let delivered = self
                    .streams
                    .lock()
                    .expect("lock")
                    .iter()
                    .filter(|stream| stream.try_send(Bytes::from_static(EVENT)).is_ok())
                    .count();
                json(200, format!("{{\"delivered\":{delivered}}}"))
            }
            "/page" if request.method() == hyper::Method::PUT => {
                match request.into_body().collect().await {
                    Ok(body) => {
                        *self.page.lock().expect("lock") = body.to_bytes();
                        json(204, Bytes::new())
                    }
                    Err(_) => json(400, "{}"),
                }
            }
            "/page" if request.method() == hyper::Method::GET => {
                json(200, self.page.lock().expect("lock").clone())
            }
            _ => json(404, "{}"),
        }
    }

    async fn call(&self, request: Request<Incoming>) -> Response<Body> {
        if request.into_body().collect().await.is_err() {
            return json(400, "{}");
        }
        let forward = Request::post(self.callback.clone())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(super::DIRECT_BODY)))
            .expect("request");
        let output = match self.client.request(forward).await {
            Ok(response) => match response.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(_) => return json(502, "{}"),
            },
            Err(_) => return json(502, "{}"),
        };
        let mut answer = Vec::with_capacity(output.len() + 24);
        answer.extend_from_slice(b"{\"ok\":true,\"result\":");
        answer.extend_from_slice(&output);
        answer.push(b'}');
        json(200, answer)
    }

    fn events(&self) -> Response<Body> {
        let (sender, receiver) = mpsc::channel::<Bytes>(64);
        let _ = sender.try_send(Bytes::from_static(b"event: ready\ndata: {}\n\n"));
        self.streams.lock().expect("lock").push(sender);
        let frames = futures::stream::unfold(receiver, |mut receiver| async move {
            let bytes = receiver.recv().await?;
            Some((Ok::<_, Infallible>(Frame::data(bytes)), receiver))
        });
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(BodyExt::boxed(StreamBody::new(frames)))
            .expect("response")
    }
}

fn json(status: u16, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(Full::new(body.into())))
        .expect("response")
}

/// The floor server as a child process of the bench.
struct FloorProcess {
    child: Child,
    base: String,
}

impl FloorProcess {
    async fn start(callback: &CallbackServer) -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--floor-server")
            .arg(&callback.url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the floor server")?;
        let stdout = child.stdout.take().context("floor stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .context("the floor server did not start within 30 s")??
            .context("the floor server exited before listening")?;
        let addr = line
            .strip_prefix(LISTENING)
            .with_context(|| format!("unexpected floor output {line:?}"))?;
        Ok(Self {
            base: format!("http://{addr}"),
            child,
        })
    }
}

/// The floor's figures beside a direct round trip measured alongside:
/// `floor_remote_overhead_ratio_c1`, `floor_remote_call_p99_vs_p50_c1`,
/// `floor_remote_overhead_ratio_c16`, `floor_remote_c16_vs_c1_throughput` and
/// `floor_register_100_vs_direct_ratio`, each what the matching toolgate
/// ratio would be for a server doing nothing else on this machine.
pub async fn floor_phase(
    samples: u64,
    (concurrency, limit): (usize, Limit),
    client: &reqwest::Client,
    callback: &CallbackServer,
) -> anyhow::Result<()> {
    progress("floor: the same remote call and fan-out through a bare hyper server");
    let mut floor = FloorProcess::start(callback).await?;
    let direct = callback_post(client, &callback.url);
    let via_floor = callback_post(client, &format!("{}/call", floor.base));
    let (direct_loaded, floor_loaded) = (direct.clone(), via_floor.clone());
    let times = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let sink = times.clone();
    let pairs = sequential(samples, Duration::from_secs(30), move |i| {
        let (direct, via_floor, sink) = (direct.clone(), via_floor.clone(), sink.clone());
        async move {
            let t = Instant::now();
            direct(i).await?;
            let direct_time = t.elapsed();
            let t = Instant::now();
            via_floor(i).await?;
            let mut times = sink.lock().expect("lock");
            times.0.push(direct_time);
            times.1.push(t.elapsed());
            Ok(())
        }
    })
    .await;
    pairs.check("floor calls (sequential)")?;
    let (direct_times, floor_times) = std::mem::take(&mut *times.lock().expect("lock"));
    let direct = Stats::from(direct_times, pairs.elapsed, Vec::new());
    let via_floor = Stats::from(floor_times, pairs.elapsed, Vec::new());
    let direct_p50 = direct.percentile_ms(50.0);
    figure("floor_callback_direct_p50_ms", direct_p50);
    via_floor.report_latency("floor_remote_call_unloaded");
    figure(
        "floor_remote_overhead_ratio_c1",
        (via_floor.percentile_ms(50.0) - direct_p50) / direct_p50,
    );
    figure(
        "floor_remote_call_p99_vs_p50_c1",
        via_floor.percentile_ms(99.0) / via_floor.percentile_ms(50.0),
    );
    // Loaded as the remote phase loads toolgate: the floor of the c=16 ratios.
    let unloaded_per_s = via_floor.serial_per_second();
    let loaded = drive(concurrency, limit, floor_loaded).await;
    loaded.check("floor calls (loaded)")?;
    loaded.report("floor_remote_call");
    let direct = drive(concurrency, limit, direct_loaded).await;
    direct.check("direct callback beside the floor (loaded)")?;
    direct.report_latency("floor_callback_direct_loaded");
    let direct_loaded_p50 = direct.percentile_ms(50.0);
    figure(
        "floor_remote_overhead_ratio_c16",
        (loaded.percentile_ms(50.0) - direct_loaded_p50) / direct_loaded_p50,
    );
    figure(
        "floor_remote_c16_vs_c1_throughput",
        loaded.per_second() / unloaded_per_s,
    );
    let fanout = fanout_latency(samples.min(300), client, &floor.base, 100).await?;
    fanout.report_latency("floor_fanout_100");
    figure(
        "floor_register_100_vs_direct_ratio",
        fanout.percentile_ms(50.0) / direct_p50,
    );
    floor.child.kill().await?;
    Ok(())
}

/// Opens `streams` event streams on the floor (drained in tasks, as the bench
/// drains toolgate's live model sessions), then times one fan-out at a time,
/// each followed by an untimed one (the unregister of toolgate's pairs).
async fn fanout_latency(
    samples: u64,
    client: &reqwest::Client,
    base: &str,
    streams: usize,
) -> anyhow::Result<Stats> {
    let mut drains = Vec::new();
    for _ in 0..streams {
        let response = client.get(format!("{base}/events")).send().await?;
        ensure!(
            response.status().is_success(),
            "floor events: HTTP {}",
            response.status()
        );
        let mut body = response.bytes_stream();
        body.next()
            .await
            .context("floor stream ended before ready")??;
        drains.push(tokio::spawn(async move {
            while let Some(Ok(_)) = body.next().await {}
        }));
    }
    let fanout_url = format!("{base}/fanout");
    let fanout = move |client: reqwest::Client, url: String| async move {
        let answer: serde_json::Value = client.post(url).send().await?.json().await?;
        ensure!(answer["delivered"] == streams, "floor fan-out: {answer}");
        anyhow::Ok(())
    };
    let times = Arc::new(Mutex::new(Vec::new()));
    let sink = times.clone();
    let client = client.clone();
    let stats = sequential(samples, Duration::from_secs(20), move |_| {
        let (client, url, sink) = (client.clone(), fanout_url.clone(), sink.clone());
        async move {
            let t = Instant::now();
            fanout(client.clone(), url.clone()).await?;
            sink.lock().expect("lock").push(t.elapsed());
            fanout(client, url).await
        }
    })
    .await;
    for drain in drains {
        drain.abort();
    }
    stats.check("floor fan-out")?;
    let times = std::mem::take(&mut *times.lock().expect("lock"));
    Ok(Stats::from(times, stats.elapsed, Vec::new()))
}

/// `floor_journal_worst_p99_ms`: the bare server answering with `page` (the
/// journal's worst page, as toolgate answered it), read and checked by the
/// journal phase's own client code one request at a time. It is the least the
/// worst variant can take on this machine, so `floor_journal_worst_vs_best_ratio`
/// (it over toolgate's best variant) is the least `journal_worst_vs_best_ratio`
/// can be beside that best.
pub async fn journal_floor(
    samples: u64,
    client: &reqwest::Client,
    callback: &CallbackServer,
    page: Bytes,
) -> anyhow::Result<()> {
    progress("floor: the journal's worst page through a bare hyper server");
    let mut floor = FloorProcess::start(callback).await?;
    let url = format!("{}/page", floor.base);
    let stored = client.put(&url).body(page).send().await?;
    ensure!(
        stored.status().is_success(),
        "floor page: HTTP {}",
        stored.status()
    );
    let client = client.clone();
    let stats = sequential(samples, Duration::from_secs(20), move |_| {
        let request = client.get(&url);
        async move { super::check_journal_answer(request).await }
    })
    .await;
    stats.check("floor journal page")?;
    stats.report_latency("floor_journal_worst");
    floor.child.kill().await?;
    Ok(())
}
