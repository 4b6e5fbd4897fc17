//! `toolgate-bench`: a load generator that starts a real toolgate server and a
//! real loopback callback server, drives them over HTTP and prints one line per
//! figure (`name value`). Progress goes to stderr, figures to stdout.
//!
//! Every phase is bounded by time and count, and all traffic stays on 127.0.0.1.
//! See BENCHMARKS.md for what each figure means and what limits it.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

mod console;
mod database;
mod floor;
mod generation;
mod instances;
mod ratios;
mod scale;

const TOKEN: &str = "tg_bench_admin_token_0123456789abcdef";
/// The secrets key of every instance the bench starts on a PostgreSQL
/// database (with `--postgres`).
const SHARED_SECRETS_KEY: &str = "b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0";

/// Load generator for toolgate: register fan-out, remote and builtin tool calls,
/// and journal queries on a large journal.
#[derive(Debug, Parser)]
#[command(name = "toolgate-bench")]
struct Args {
    /// Requests in flight at once in the loaded phases.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// How long each loaded measurement runs, in seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Upper bound on requests per loaded measurement (on top of --duration).
    #[arg(long)]
    requests: Option<u64>,
    /// Requests per sequential (concurrency 1) latency measurement.
    #[arg(long, default_value_t = 1000)]
    samples: u64,
    /// Journal rows to seed for the query phase.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// A smoke run: short phases and 20,000 journal rows.
    #[arg(long)]
    quick: bool,
    /// The toolgate binary; default: `toolgate` next to this executable.
    #[arg(long)]
    server: Option<PathBuf>,
    /// Work in this (new or empty) directory and keep it afterwards, e.g. to
    /// inspect the seeded database; default: a temporary directory.
    #[arg(long)]
    keep_dir: Option<PathBuf>,
    /// Only these phases (comma-separated: register, remote, builtin, console, tools_list,
    /// sessions_rss, generation, journal, instances, floor).
    #[arg(long, value_delimiter = ',')]
    phases: Vec<String>,
    /// Run every server on a fresh database of this PostgreSQL server
    /// (e.g. `postgres://postgres@127.0.0.1:5432`; dropped at the end)
    /// instead of the embedded SQLite file. Adds the `instances` phase: calls/s
    /// of two instances on the database against one.
    #[arg(long)]
    postgres: Option<String>,
    /// Internal: run the floor server (see `floor.rs`) forwarding calls to
    /// this callback URL, instead of a bench.
    #[arg(long, hide = true)]
    floor_server: Option<String>,
}

impl Args {
    fn wants(&self, phase: &str) -> bool {
        self.phases.is_empty() || self.phases.iter().any(|p| p == phase)
    }

    fn limit(&self) -> Limit {
        Limit {
            duration: Duration::from_secs_f64(self.duration.clamp(0.1, 120.0)),
            max_requests: self.requests.unwrap_or(u64::MAX),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.duration = args.duration.min(1.0);
        args.samples = args.samples.min(100);
        args.rows = args.rows.min(20_000);
    }
    ensure!(
        (1..=1024).contains(&args.concurrency),
        "--concurrency must be 1-1024"
    );
    ensure!(args.rows <= 20_000_000, "--rows must be at most 20,000,000");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Some(callback_url) = &args.floor_server {
        return runtime.block_on(floor::serve(callback_url));
    }
    runtime.block_on(run(args))
}

/// Prints one figure on stdout (and keeps it for the ratios at the end).
/// The database URL every server of this run uses (PostgreSQL), if any.
static DATABASE_URL: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

fn database_url() -> Option<&'static str> {
    DATABASE_URL.get().and_then(|url| url.as_deref())
}

fn figure(name: &str, value: f64) {
    ratios::record(name, value);
    if value.abs() >= 100.0 {
        println!("{name} {value:.0}");
    } else {
        println!("{name} {value:.3}");
    }
}

fn progress(message: &str) {
    eprintln!("[toolgate-bench] {message}");
}

async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let work = WorkDir::new(args.keep_dir.clone())?;
    let binary = match &args.server {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("executable has no directory")?
            .join("toolgate"),
    };
    ensure!(
        binary.exists(),
        "toolgate binary not found at {} (build it with `cargo build --release`, or pass --server)",
        binary.display()
    );
    let database = match &args.postgres {
        Some(server) => Some(database::BenchDatabase::create(server).await?),
        None => None,
    };
    let _ = DATABASE_URL.set(database.as_ref().map(|db| db.url.clone()));
    println!(
        "backend {}",
        if database.is_some() {
            "postgres"
        } else {
            "sqlite"
        }
    );
    let callback = CallbackServer::start().await?;
    let mut server = Server::start(&binary, &work.path).await?;
    let client = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(args.concurrency * 2)
        .timeout(Duration::from_secs(30))
        .build()?;
    let api = Api {
        client: client.clone(),
        base: server.base_url.clone(),
    };
    println!(
        "machine_cpus {}",
        std::thread::available_parallelism()?.get()
    );
    println!("concurrency {}", args.concurrency);

    // Characters with a live model session each, shared by the phases.
    let mut roles = Roles::default();
    if args.wants("register") {
        for characters in [1usize, 10, 100] {
            roles.grow_to(&api, characters).await?;
            register_phase(&args, &api, &callback, characters).await?;
        }
    }
    roles.grow_to(&api, 1).await?;
    let session = roles.sessions[0].clone();
    if args.wants("remote") {
        remote_phase(&args, &api, &client, &callback, &session).await?;
    }
    if args.wants("floor") {
        let load = (args.concurrency, args.limit());
        floor::floor_phase(args.samples, load, &client, &callback).await?;
    }
    if args.wants("builtin") {
        builtin_phase(&args, &api, &session).await?;
    }
    if args.wants("console") {
        let fresh = Api::json(api.post("/sessions", br#"{"character":"Lanlan"}"#)).await?;
        let fresh = fresh["data"]["id"]
            .as_str()
            .context("no session id")?
            .to_owned();
        console::console_phase(&args, &api, &fresh).await?;
    }
    if args.wants("tools_list") {
        scale::tools_list_phase(&api, &callback.url, args.samples).await?;
    }
    if args.wants("sessions_rss") {
        let pid = server.child.id().context("server pid")?;
        scale::sessions_rss_phase(&api, pid).await?;
    }
    drop(roles);
    if database.is_some() && args.wants("instances") {
        instances::instances_phase(&args, &binary, &work.path, &api, &session).await?;
    }
    if args.wants("generation") {
        // On a shared database the phase's server runs alone, as the one
        // instance of a deployment does: beside the main server it would
        // relay its sessions' events to it.
        if database.is_some() {
            server.stop().await?;
        }
        generation::generation_phase(&args, &binary, &work.path).await?;
        if database.is_some() {
            server = Server::start(&binary, &work.path).await?;
        }
    }
    if args.wants("journal") {
        server.stop().await?;
        let plan = seed_journal(&work.path, args.rows).await?;
        server = Server::start(&binary, &work.path).await?;
        let api = Api {
            client: client.clone(),
            base: server.base_url.clone(),
        };
        let worst_page = journal_phase(&args, &api, &plan).await?;
        if args.wants("floor") {
            floor::journal_floor(journal_samples(&args), &client, &callback, worst_page).await?;
        }
    }
    server.stop().await?;
    callback.stop();
    if let Some(database) = database {
        database.drop_it().await?;
    }
    ratios::print_ratios();
    figure("bench_wall_seconds", started.elapsed().as_secs_f64());
    Ok(())
}

// ---------------------------------------------------------------------------
// Processes and servers

/// A temporary working directory, removed on drop.
struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl WorkDir {
    fn new(keep: Option<PathBuf>) -> anyhow::Result<Self> {
        let (path, keep) = match keep {
            Some(path) => (path, true),
            None => (
                std::env::temp_dir().join(format!(
                    "toolgate-bench-{}-{}",
                    std::process::id(),
                    toolgate::ids::now_ms()
                )),
                false,
            ),
        };
        std::fs::create_dir_all(&path)?;
        ensure!(
            std::fs::read_dir(&path)?.next().is_none(),
            "{} must be empty",
            path.display()
        );
        Ok(Self { path, keep })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A running toolgate process.
struct Server {
    child: Child,
    base_url: String,
}

impl Server {
    async fn start(binary: &Path, work: &Path) -> anyhow::Result<Self> {
        Self::start_with(binary, work, &[]).await
    }

    /// Starts toolgate with extra environment (`(name, value)` pairs).
    async fn start_with(
        binary: &Path,
        work: &Path,
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        Self::start_in(binary, work, "data", env).await
    }

    /// Starts toolgate on the data directory `work/<data>` (one per instance).
    async fn start_in(
        binary: &Path,
        work: &Path,
        data: &str,
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let data_dir = work.join(data);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(work.join("server.log"))?;
        let mut child = Command::new(binary)
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&data_dir)
            .env("TOOLGATE_ADMIN_TOKEN", TOKEN)
            .env_remove("TOOLGATE_DATABASE_URL")
            .env_remove("TOOLGATE_LISTEN")
            .env_remove("TOOLGATE_DATA_DIR")
            .env_remove("TOOLGATE_CONFIG")
            .envs(database_url().map(|url| ("TOOLGATE_DATABASE_URL", url)))
            // Every instance on one database must share its secrets key (a
            // second one with a key of its own is refused at start).
            .envs(database_url().map(|_| ("TOOLGATE_SECRETS_KEY", SHARED_SECRETS_KEY)))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdout = child.stdout.take().context("server stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.strip_prefix("toolgate listening on http://") {
                    return Ok(addr.trim().to_owned());
                }
            }
            bail!(
                "toolgate exited before listening; see {}",
                work.join("server.log").display()
            )
        })
        .await
        .context("toolgate did not start listening within 120 s")??;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        progress(&format!("toolgate listening on {addr}"));
        Ok(Self {
            child,
            base_url: format!("http://{addr}"),
        })
    }

    /// SIGTERM, then SIGKILL if it does not exit within 30 s.
    async fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
        }
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => {
                status?;
            }
            Err(_) => {
                progress("toolgate did not stop within 30 s; killing it");
                self.child.kill().await?;
            }
        }
        Ok(())
    }
}

/// The loopback callback server: answers every call at once.
struct CallbackServer {
    url: String,
    handle: tokio::task::JoinHandle<()>,
}

impl CallbackServer {
    async fn start() -> anyhow::Result<Self> {
        let app = axum::Router::new().route(
            "/cb",
            axum::routing::post(|| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    r#"{"output":{"ok":true,"forecast":"sunny"}}"#,
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/cb", listener.local_addr()?);
        let handle = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, handle })
    }

    fn stop(self) {
        self.handle.abort();
    }
}

/// A client bound to the server's base URL and admin key.
#[derive(Clone)]
struct Api {
    client: reqwest::Client,
    base: String,
}

impl Api {
    fn post(&self, path: &str, body: &'static [u8]) -> reqwest::RequestBuilder {
        self.post_bytes(path, body.to_vec())
    }

    fn post_bytes(&self, path: &str, body: Vec<u8>) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body)
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.client
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
    }

    /// Sends and insists on a 2xx JSON answer.
    async fn json(request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        Self::answer(request).await
    }

    /// The JSON answer of a successful request as `T`: a type naming only
    /// the fields a phase checks skips the rest without building it.
    async fn answer<T: serde::de::DeserializeOwned>(
        request: reqwest::RequestBuilder,
    ) -> anyhow::Result<T> {
        let response = request.send().await?;
        let status = response.status();
        let bytes = response.bytes().await?;
        if !status.is_success() {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&bytes));
        }
        Ok(serde_json::from_slice(&bytes)?)
    }
}

/// Characters (beyond the default `Lanlan`), each with one session whose event
/// stream is held open and drained: one live model session per character.
#[derive(Default)]
struct Roles {
    names: Vec<String>,
    sessions: Vec<String>,
    streams: Vec<tokio::task::JoinHandle<()>>,
}

impl Roles {
    async fn grow_to(&mut self, api: &Api, characters: usize) -> anyhow::Result<()> {
        while self.names.len() < characters {
            let name = if self.names.is_empty() {
                "Lanlan".to_owned()
            } else {
                let name = format!("Bench{:03}", self.names.len());
                let body = serde_json::to_vec(&json!({"name": name}))?;
                Api::json(api.post_bytes("/characters", body)).await?;
                name
            };
            let body = serde_json::to_vec(&json!({"character": name, "title": "bench"}))?;
            let session = Api::json(api.post_bytes("/sessions", body)).await?;
            let session_id = session["data"]["id"]
                .as_str()
                .context("session id")?
                .to_owned();
            self.streams
                .push(open_event_stream(api, &session_id).await?);
            self.names.push(name);
            self.sessions.push(session_id);
        }
        Ok(())
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        for stream in &self.streams {
            stream.abort();
        }
    }
}

/// Opens a session's `GET /sessions/{id}/events` stream (kept open for the run).
async fn events_response(api: &Api, session_id: &str) -> anyhow::Result<reqwest::Response> {
    let response = api
        .client
        .get(format!("{}/sessions/{session_id}/events", api.base))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(24 * 3600))
        .send()
        .await?;
    ensure!(
        response.status().is_success(),
        "events: HTTP {}",
        response.status()
    );
    Ok(response)
}

/// Opens `GET /sessions/{id}/events`, waits for `ready`, then drains it in a task.
async fn open_event_stream(
    api: &Api,
    session_id: &str,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut stream = events_response(api, session_id).await?.bytes_stream();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("event: ready") {
        let chunk = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .context("no ready event within 30 s")?
            .context("event stream ended before ready")??;
        seen.extend_from_slice(&chunk);
    }
    Ok(tokio::spawn(async move {
        while let Some(Ok(_)) = stream.next().await {}
    }))
}

/// What toolgate itself sends the callback.
const DIRECT_BODY: &[u8] = br#"{"name":"bench_weather","arguments":{"location":"Shanghai","days":3},"call_id":"call_direct","raw_arguments":"{\"location\":\"Shanghai\",\"days\":3}"}"#;

/// One POST of the body toolgate sends a callback, to `url`, insisting on a
/// 2xx: to the callback server itself it is the direct round trip (what
/// toolgate's callback hop would be if the bench made it), to the floor the
/// same call through a bare server.
fn callback_post(
    client: &reqwest::Client,
    url: &str,
) -> impl Fn(u64) -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    let client = client.clone();
    let url = url.to_owned();
    move |_i: u64| {
        let request = client
            .post(&url)
            .header("content-type", "application/json")
            .body(DIRECT_BODY);
        Box::pin(async move {
            let response = request.send().await?;
            ensure!(
                response.status().is_success(),
                "{}: HTTP {}",
                response.url(),
                response.status()
            );
            response.bytes().await?;
            Ok(())
        })
    }
}

// ---------------------------------------------------------------------------
// Driving load

#[derive(Debug, Clone, Copy)]
struct Limit {
    duration: Duration,
    max_requests: u64,
}

/// Latencies and outcome of one measurement.
struct Stats {
    latencies: Vec<Duration>,
    elapsed: Duration,
    errors: u64,
    first_error: Option<String>,
}

impl Stats {
    fn from(mut latencies: Vec<Duration>, elapsed: Duration, errors: Vec<String>) -> Self {
        latencies.sort_unstable();
        Self {
            latencies,
            elapsed,
            errors: errors.len() as u64,
            first_error: errors.into_iter().next(),
        }
    }

    fn percentile_ms(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let index = ((self.latencies.len() as f64 * p / 100.0).ceil() as usize)
            .clamp(1, self.latencies.len())
            - 1;
        self.latencies[index].as_secs_f64() * 1000.0
    }

    fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.elapsed.as_secs_f64()
    }

    /// Requests per second of their own time, for requests made one at a
    /// time and timed singly between others (interleaved with direct calls):
    /// the c=1 throughput a c=16 run is compared with.
    fn serial_per_second(&self) -> f64 {
        let busy: Duration = self.latencies.iter().sum();
        self.latencies.len() as f64 / busy.as_secs_f64()
    }

    /// Fails the run when any request failed: figures over failed requests lie.
    fn check(&self, what: &str) -> anyhow::Result<()> {
        if self.errors > 0 {
            bail!(
                "{what}: {} of {} requests failed; first: {}",
                self.errors,
                self.latencies.len(),
                self.first_error.as_deref().unwrap_or("?")
            );
        }
        Ok(())
    }

    fn report(&self, name: &str) {
        figure(&format!("{name}_per_s"), self.per_second());
        self.report_latency(name);
    }

    /// `{name}_p50_ms` and `{name}_p99_ms`.
    fn report_latency(&self, name: &str) {
        figure(&format!("{name}_p50_ms"), self.percentile_ms(50.0));
        figure(&format!("{name}_p99_ms"), self.percentile_ms(99.0));
    }
}

/// Runs `op(i)` from `concurrency` tasks until the limit is reached.
async fn drive<F, Fut>(concurrency: usize, limit: Limit, op: F) -> Stats
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + limit.duration;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let op = op.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= limit.max_requests || Instant::now() >= deadline {
                    break;
                }
                let t = Instant::now();
                let outcome = op(i).await;
                latencies.push(t.elapsed());
                if let Err(err) = outcome {
                    errors.push(format!("{err:#}"));
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    for task in tasks {
        match task.await {
            Ok((l, e)) => {
                latencies.extend(l);
                errors.extend(e);
            }
            Err(err) => errors.push(format!("worker task failed: {err}")),
        }
    }
    Stats::from(latencies, started.elapsed(), errors)
}

/// Runs `op(i)` one at a time, `count` times (or until `max` passes).
async fn sequential<F, Fut>(count: u64, max: Duration, op: F) -> Stats
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    drive(
        1,
        Limit {
            duration: max,
            max_requests: count,
        },
        op,
    )
    .await
}

// ---------------------------------------------------------------------------
// Phase 1: register / unregister fan-out

async fn register_phase(
    args: &Args,
    api: &Api,
    callback: &CallbackServer,
    characters: usize,
) -> anyhow::Result<()> {
    progress(&format!(
        "register/unregister into {characters} characters, each with a live model session"
    ));
    let callback_url = callback.url.clone();
    let register = move |api: Api, name: String| {
        let body = serde_json::to_vec(&json!({
            "name": name,
            "description": "bench tool",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            "callback_url": callback_url,
            "role": null,
            "source": "plugin:bench",
        }))
        .expect("json");
        async move {
            let answer = Api::json(api.post_bytes("/api/tools/register", body)).await?;
            let affected = answer["affected_roles"].as_array().map_or(0, Vec::len);
            ensure!(
                affected == characters
                    && answer["failed_roles"].as_array().is_some_and(Vec::is_empty),
                "register reached {affected} of {characters} roles: {answer}"
            );
            Ok(())
        }
    };
    let unregister = |api: Api, name: String| async move {
        let body = serde_json::to_vec(&json!({"name": name, "role": null}))?;
        let answer = Api::json(api.post_bytes("/api/tools/unregister", body)).await?;
        ensure!(answer["removed"] == true, "unregister: {answer}");
        Ok(())
    };
    // Latency of one register targeting every role, with nothing else in flight.
    let seq = {
        let api = api.clone();
        let register = register.clone();
        sequential(args.samples.min(300), Duration::from_secs(20), move |i| {
            let api = api.clone();
            let register = register.clone();
            async move {
                let name = format!("bench_seq_{i}");
                register(api.clone(), name.clone()).await?;
                // Unregistering is not timed here; it keeps the catalog small.
                unregister(api, name).await
            }
        })
        .await
    };
    seq.check("register (sequential)")?;
    // `seq` timed register + unregister; time registers alone.
    let seq_register = {
        let api = api.clone();
        let register = register.clone();
        let times = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = times.clone();
        let stats = sequential(args.samples.min(300), Duration::from_secs(20), move |i| {
            let api = api.clone();
            let register = register.clone();
            let sink = sink.clone();
            async move {
                let name = format!("bench_lat_{i}");
                let t = Instant::now();
                register(api.clone(), name.clone()).await?;
                sink.lock().expect("lock").push(t.elapsed());
                unregister(api, name).await
            }
        })
        .await;
        stats.check("register latency")?;
        let times = std::mem::take(&mut *times.lock().expect("lock"));
        Stats::from(times, stats.elapsed, Vec::new())
    };
    let prefix = format!("register_all_roles_{characters}chars");
    figure(
        &format!("{prefix}_p50_ms"),
        seq_register.percentile_ms(50.0),
    );
    figure(
        &format!("{prefix}_p99_ms"),
        seq_register.percentile_ms(99.0),
    );
    // Throughput: each worker registers then unregisters its own names.
    let loaded = {
        let api = api.clone();
        let register = register.clone();
        drive(args.concurrency, args.limit(), move |i| {
            let api = api.clone();
            let register = register.clone();
            async move {
                let name = format!("bench_load_{}", i / 2);
                if i % 2 == 0 {
                    register(api, name).await
                } else {
                    // The odd op unregisters the name its even twin registered;
                    // it may not have landed yet, so retry briefly.
                    for _ in 0..200 {
                        match unregister(api.clone(), name.clone()).await {
                            Ok(()) => return Ok(()),
                            Err(_) => tokio::task::yield_now().await,
                        }
                    }
                    bail!("{name} never became unregistrable")
                }
            }
        })
        .await
    };
    loaded.check("register/unregister (loaded)")?;
    figure(
        &format!("register_unregister_{characters}chars_ops_per_s"),
        loaded.per_second(),
    );
    figure(
        &format!("register_unregister_{characters}chars_loaded_p99_ms"),
        loaded.percentile_ms(99.0),
    );
    // Leave no registrations behind (an odd op may have been cut by the limit).
    let leftover: Value = Api::json(api.get("/api/tools")).await?;
    if let Some(by_role) = leftover["tools_by_role"].as_object() {
        let mut names: Vec<String> = by_role
            .values()
            .flat_map(|tools| tools.as_array().cloned().unwrap_or_default())
            .filter_map(|tool| tool["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names.dedup();
        for name in names {
            let body = serde_json::to_vec(&json!({"name": name, "role": null}))?;
            Api::json(api.post_bytes("/api/tools/unregister", body)).await?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Phase 2: remote tool calls against a callback that answers at once

async fn remote_phase(
    args: &Args,
    api: &Api,
    client: &reqwest::Client,
    callback: &CallbackServer,
    session: &str,
) -> anyhow::Result<()> {
    progress("remote tool calls through POST /sessions/{id}/tool-calls");
    let body = serde_json::to_vec(&json!({
        "name": "bench_weather",
        "description": "Weather forecast",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "minLength": 1},
                "days": {"type": "integer", "minimum": 1, "maximum": 14}
            },
            "required": ["location"]
        },
        "callback_url": callback.url,
        "role": "Lanlan",
        "source": "plugin:bench",
        "timeout_seconds": 10,
    }))?;
    Api::json(api.post_bytes("/api/tools/register", body)).await?;
    let call_path: Arc<str> = format!("/sessions/{session}/tool-calls").into();
    let call_body: &'static [u8] =
        br#"{"name":"bench_weather","arguments":{"location":"Shanghai","days":3}}"#;
    let via_toolgate = {
        let api = api.clone();
        let call_path = call_path.clone();
        move |_i: u64| {
            let request = api.post(&call_path, call_body);
            async move {
                let response = request.send().await?;
                let status = response.status();
                let bytes = response.bytes().await?;
                ensure!(
                    status.is_success() && contains(&bytes, br#""status":"success""#),
                    "tool call: HTTP {status}: {}",
                    String::from_utf8_lossy(&bytes)
                );
                Ok(())
            }
        }
    };
    let direct = callback_post(client, &callback.url);
    // Unloaded latency, interleaving the two so that drift affects both alike.
    let direct_times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let toolgate_times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let interleaved = {
        let direct = direct.clone();
        let via_toolgate = via_toolgate.clone();
        let direct_times = direct_times.clone();
        let toolgate_times = toolgate_times.clone();
        sequential(args.samples, Duration::from_secs(30), move |i| {
            let direct = direct.clone();
            let via_toolgate = via_toolgate.clone();
            let direct_times = direct_times.clone();
            let toolgate_times = toolgate_times.clone();
            async move {
                let t = Instant::now();
                direct(i).await?;
                direct_times.lock().expect("lock").push(t.elapsed());
                let t = Instant::now();
                via_toolgate(i).await?;
                toolgate_times.lock().expect("lock").push(t.elapsed());
                Ok(())
            }
        })
        .await
    };
    interleaved.check("remote calls (sequential)")?;
    let take = |times: &Arc<std::sync::Mutex<Vec<Duration>>>| {
        Stats::from(
            std::mem::take(&mut *times.lock().expect("lock")),
            interleaved.elapsed,
            Vec::new(),
        )
    };
    let direct_seq = take(&direct_times);
    let toolgate_seq = take(&toolgate_times);
    figure("callback_direct_p50_ms", direct_seq.percentile_ms(50.0));
    figure(
        "remote_call_unloaded_p50_ms",
        toolgate_seq.percentile_ms(50.0),
    );
    figure(
        "remote_call_unloaded_p99_ms",
        toolgate_seq.percentile_ms(99.0),
    );
    figure(
        "remote_call_unloaded_per_s",
        toolgate_seq.serial_per_second(),
    );
    figure(
        "remote_call_overhead_p50_ms",
        toolgate_seq.percentile_ms(50.0) - direct_seq.percentile_ms(50.0),
    );
    let loaded = drive(args.concurrency, args.limit(), via_toolgate).await;
    loaded.check("remote calls (loaded)")?;
    loaded.report("remote_call");
    let direct_loaded = drive(args.concurrency, args.limit(), direct).await;
    direct_loaded.check("direct callback (loaded)")?;
    direct_loaded.report("callback_direct_loaded");
    figure(
        "remote_call_loaded_overhead_p50_ms",
        loaded.percentile_ms(50.0) - direct_loaded.percentile_ms(50.0),
    );
    Ok(())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------------------
// Phase 3: builtin tool calls with the journal on

async fn builtin_phase(args: &Args, api: &Api, session: &str) -> anyhow::Result<()> {
    progress("builtin roll_dice calls, each journalled");
    let call_path: Arc<str> = format!("/sessions/{session}/tool-calls").into();
    let call = instances::roll_dice(vec![api.clone()], call_path);
    let seq = sequential(args.samples, Duration::from_secs(20), call.clone()).await;
    seq.check("builtin calls (sequential)")?;
    figure("builtin_call_unloaded_p50_ms", seq.percentile_ms(50.0));
    let loaded = drive(args.concurrency, args.limit(), call).await;
    loaded.check("builtin calls (loaded)")?;
    loaded.report("builtin_call");
    Ok(())
}

// ---------------------------------------------------------------------------
// Phase 4: journal queries on a large journal

/// Ids of the seeded journal that the queries pick from.
struct SeedPlan {
    heavy_session: String,
    sessions: Vec<String>,
    floors: Vec<String>,
    runs: Vec<String>,
}

/// Seeds `rows` journal rows straight into the stopped server's database, in large
/// transactions, with a realistic shape: one heavy session holding 10% of the
/// rows, two with 2% each, the rest in sessions of 50-1,000 calls; floors of 1-3
/// attempts (runs) of 1-6 calls; mostly successes, some errors, denials,
/// timeouts, uncertain and blocked calls; mostly narrator calls.
async fn seed_journal(work: &Path, rows: u64) -> anyhow::Result<SeedPlan> {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
    use sqlx::{ConnectOptions, Connection};

    progress(&format!("seeding {rows} journal rows"));
    let data_dir = work.join("data");
    let database_file = data_dir.join("toolgate.db");
    let store = toolgate::store::Store::open(database_url(), &data_dir).await?;
    let account_id = store.admin_account().await?.context("admin account")?.id;
    store.close().await;
    let mut conn = match database_url() {
        Some(url) => database::SeedConn::Postgres(sqlx::PgConnection::connect(url).await?),
        None => database::SeedConn::Sqlite(
            SqliteConnectOptions::new()
                .filename(&database_file)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Off)
                .connect()
                .await?,
            database_file,
        ),
    };
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(7);
    let tools: [(&str, &str, &str); 8] = [
        ("roll_dice", "builtin", "builtin"),
        ("get_variable", "builtin", "builtin:session"),
        ("set_variable", "builtin", "builtin:session"),
        ("query_memory", "builtin", "builtin:session"),
        ("get_time", "builtin", "builtin"),
        ("get_weather", "remote", "remote:plugin:weather"),
        ("search_web", "remote", "remote:plugin:search"),
        ("send_mail", "remote", "remote:plugin:mail"),
    ];
    let mut plan = SeedPlan {
        heavy_session: String::new(),
        sessions: Vec::new(),
        floors: Vec::new(),
        runs: Vec::new(),
    };
    let mut written = 0u64;
    let mut planned = 0u64;
    let mut session_no = 0u64;
    let mut clock = toolgate::ids::now_ms() - 180 * 24 * 3600 * 1000;
    let mut batch: Vec<SeedRow> = Vec::with_capacity(BATCH_ROWS);
    conn.execute("BEGIN").await?;
    let mut in_tx = 0u64;
    while planned < rows {
        let size = match session_no {
            0 => rows / 10,
            1 | 2 => rows / 50,
            _ => rng.random_range(50..=1000),
        }
        .clamp(1, rows - planned);
        planned += size;
        let session_id = format!("sess_seed_{session_no:06}");
        if session_no == 0 {
            plan.heavy_session = session_id.clone();
        }
        plan.sessions.push(session_id.clone());
        session_no += 1;
        let mut in_session = 0u64;
        let mut floor_no = 0u64;
        while in_session < size {
            let floor_id = format!("{session_id}_f{floor_no:05}");
            floor_no += 1;
            if rng.random_range(0..20) == 0 {
                plan.floors.push(floor_id.clone());
            }
            let attempts = match rng.random_range(0..100) {
                0..80 => 1,
                80..95 => 2,
                _ => 3,
            };
            for attempt in 0..attempts {
                let run_id = format!("{floor_id}_r{attempt}");
                if rng.random_range(0..50) == 0 {
                    plan.runs.push(run_id.clone());
                }
                let committed = attempt + 1 == attempts;
                for _ in 0..rng.random_range(1..=6) {
                    if in_session >= size {
                        break;
                    }
                    in_session += 1;
                    clock += rng.random_range(500..30_000);
                    let (tool_name, provider_type, provider_id) =
                        tools[rng.random_range(0..tools.len())];
                    let status = match rng.random_range(0..1000) {
                        0..880 => "success",
                        880..930 => "error",
                        930..960 => "denied",
                        960..970 => "timeout",
                        970..975 => "uncertain",
                        975..980 => "blocked",
                        980..985 => "queued",
                        _ => "success",
                    };
                    let caller_slot = match rng.random_range(0..100) {
                        0..75 => "narrator",
                        75..87 => "director",
                        87..95 => "verifier",
                        _ => "memory",
                    };
                    let duration = rng.random_range(2..2000);
                    batch.push(SeedRow {
                        id: toolgate::ids::new_id("texec"),
                        session_id: session_id.clone(),
                        run_id: run_id.clone(),
                        floor_id: floor_id.clone(),
                        page_id: format!("{run_id}_p"),
                        caller_slot,
                        tool_name,
                        provider_type,
                        provider_id,
                        status,
                        commit_outcome: match status {
                            "blocked" => "replay_blocked",
                            "uncertain" => "uncertain",
                            _ if committed => "committed",
                            _ => "discarded",
                        },
                        started_at: clock,
                        duration,
                        sides: rng.random_range(2..=100),
                    });
                    if batch.len() == BATCH_ROWS {
                        conn.insert_batch(&account_id, &batch).await?;
                        in_tx += batch.len() as u64;
                        written += batch.len() as u64;
                        batch.clear();
                        if in_tx >= 100_000 {
                            conn.execute("COMMIT").await?;
                            conn.execute("BEGIN").await?;
                            in_tx = 0;
                            progress(&format!("  {written} rows"));
                        }
                    }
                }
            }
        }
    }
    if !batch.is_empty() {
        written += batch.len() as u64;
        conn.insert_batch(&account_id, &batch).await?;
    }
    conn.execute("COMMIT").await?;
    conn.finish().await?;
    let elapsed = started.elapsed().as_secs_f64();
    figure("journal_seed_rows", written as f64);
    figure("journal_seed_rows_per_s", written as f64 / elapsed);
    Ok(plan)
}

const BATCH_ROWS: usize = 500;

/// One seeded journal row.
pub(crate) struct SeedRow {
    id: String,
    session_id: String,
    run_id: String,
    floor_id: String,
    page_id: String,
    caller_slot: &'static str,
    tool_name: &'static str,
    provider_type: &'static str,
    provider_id: &'static str,
    status: &'static str,
    commit_outcome: &'static str,
    started_at: i64,
    duration: i64,
    sides: i64,
}

/// Reads a journal page's answer and checks it (the journal phase's client
/// work per request, also the floor's).
async fn check_journal_answer(request: reqwest::RequestBuilder) -> anyhow::Result<()> {
    // The whole page is read and checked as JSON, but only `meta` is built: a
    // 200-row page is 168 KB, and building it as a `Value` cost the client
    // more than the server's whole answer.
    let answer: JournalAnswer = Api::answer(request).await?;
    ensure!(answer.meta.total >= 0, "a negative meta.total");
    Ok(())
}

/// What the journal phase checks of a `GET /tool-executions` answer.
#[derive(serde::Deserialize)]
struct JournalAnswer {
    meta: JournalMeta,
}

/// A journal page's `meta`.
#[derive(serde::Deserialize)]
struct JournalMeta {
    total: i64,
}

/// The seed of each journal variant's random choices (sessions, floors, runs).
const JOURNAL_QUERY_SEED: u64 = 11;

/// How many requests a journal page is measured with (the journal's floor
/// too): `--samples`, at most 500.
fn journal_samples(args: &Args) -> u64 {
    args.samples.min(500)
}

/// `GET /tool-executions` variants, each measured one request at a time;
/// returns one answer of the variant with the worst p99, as toolgate sent it.
async fn journal_phase(args: &Args, api: &Api, plan: &SeedPlan) -> anyhow::Result<Bytes> {
    progress("journal queries over HTTP");
    let plan = Arc::new(SeedPlan {
        heavy_session: plan.heavy_session.clone(),
        sessions: plan.sessions.clone(),
        floors: plan.floors.clone(),
        runs: plan.runs.clone(),
    });
    type Make = fn(&SeedPlan, &mut StdRng) -> String;
    let variants: Vec<(&str, Make)> = vec![
        ("session", |p, r| {
            format!(
                "session_id={}",
                p.sessions[r.random_range(0..p.sessions.len())]
            )
        }),
        ("session_status", |p, r| {
            format!(
                "session_id={}&status=error",
                p.sessions[r.random_range(0..p.sessions.len())]
            )
        }),
        ("heavy_session", |p, _| {
            format!("session_id={}", p.heavy_session)
        }),
        ("heavy_session_status_error", |p, _| {
            format!("session_id={}&status=error", p.heavy_session)
        }),
        ("heavy_session_status_blocked", |p, _| {
            format!("session_id={}&status=blocked", p.heavy_session)
        }),
        ("heavy_session_finished_asc", |p, _| {
            format!(
                "session_id={}&sort_by=finished_at&sort_order=asc",
                p.heavy_session
            )
        }),
        ("heavy_session_created_offset_1000", |p, _| {
            format!(
                "session_id={}&sort_by=created_at&limit=200&offset=1000",
                p.heavy_session
            )
        }),
        ("heavy_session_tool_slot", |p, _| {
            format!(
                "session_id={}&tool_name=send_mail&caller_slot=verifier",
                p.heavy_session
            )
        }),
        ("floor_slot", |p, r| {
            format!(
                "floor_id={}&caller_slot=narrator",
                p.floors[r.random_range(0..p.floors.len())]
            )
        }),
        ("run", |p, r| {
            format!("run_id={}", p.runs[r.random_range(0..p.runs.len())])
        }),
        ("run_commit_outcome", |p, r| {
            format!(
                "run_id={}&commit_outcome=committed&sort_order=asc",
                p.runs[r.random_range(0..p.runs.len())]
            )
        }),
    ];
    ensure!(
        !plan.floors.is_empty() && !plan.runs.is_empty(),
        "the seeded journal is too small to pick floors and runs from"
    );
    let samples = journal_samples(args);
    let mut worst_p99: f64 = 0.0;
    let mut best_p99 = f64::INFINITY;
    let mut worst_make: Option<Make> = None;
    for (label, make) in variants {
        let api = api.clone();
        let plan = plan.clone();
        let rng = Arc::new(std::sync::Mutex::new(StdRng::seed_from_u64(
            JOURNAL_QUERY_SEED,
        )));
        let stats = sequential(samples, Duration::from_secs(20), move |_| {
            let query = make(&plan, &mut rng.lock().expect("lock"));
            let request = api.get(&format!("/tool-executions?{query}"));
            check_journal_answer(request)
        })
        .await;
        stats.check(label)?;
        stats.report_latency(&format!("journal_query_{label}"));
        let p99 = stats.percentile_ms(99.0);
        if p99 > worst_p99 {
            worst_p99 = p99;
            worst_make = Some(make);
        }
        best_p99 = best_p99.min(p99);
    }
    figure("journal_query_worst_p99_ms", worst_p99);
    figure("journal_query_best_p99_ms", best_p99);
    let make = worst_make.context("no journal variant was measured")?;
    // The variant's first query, as it was measured first.
    let query = make(&plan, &mut StdRng::seed_from_u64(JOURNAL_QUERY_SEED));
    let response = api.get(&format!("/tool-executions?{query}")).send().await?;
    ensure!(
        response.status().is_success(),
        "the worst journal variant's page: HTTP {}",
        response.status()
    );
    Ok(response.bytes().await?)
}
