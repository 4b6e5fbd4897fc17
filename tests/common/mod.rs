//! Black-box test helpers: spawn the real `toolgate` binary on port 0 with its own
//! temporary data directory and talk to it over real HTTP.
#![allow(dead_code)]

pub mod callbacks;
pub mod console;
pub mod database;
pub mod events;
pub mod mcp;
pub mod metrics;
pub mod model;
pub mod ports;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub const ADMIN_TOKEN: &str = "tg_test_admin_token_0123456789abcdef";

/// A running server process and a client for it.
pub struct TestServer {
    pub base_url: String,
    pub addr: std::net::SocketAddr,
    pub token: String,
    pub client: reqwest::Client,
    pub data_dir: PathBuf,
    /// The keyless metrics listener, when started with `--metrics-listen`.
    pub metrics_url: Option<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    /// The server's own PostgreSQL database, when the suite runs on one;
    /// declared after `child` so the server is killed before it is dropped.
    database: Option<database::TestDatabase>,
    _temp: Option<tempfile::TempDir>,
}

/// Options for spawning a server.
#[derive(Default, Clone)]
pub struct SpawnOptions {
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// Leave TOOLGATE_ADMIN_TOKEN unset so a key is generated.
    pub no_admin_token: bool,
    pub listen: Option<String>,
    /// Standard error on a pipe the test takes ([`TestServer::take_stderr`])
    /// instead of in `server.log`.
    pub piped_stderr: bool,
}

/// Runs a toolgate command (`doctor`, `migrate`, ...) on `data_dir`, with
/// `database_url` when given, ignoring the environment's database and config.
pub fn toolgate_command(
    args: &[&str],
    data_dir: &Path,
    database_url: Option<&str>,
) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"));
    command
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("TOOLGATE_DATABASE_URL")
        .env_remove("TOOLGATE_CONFIG")
        .env_remove("TOOLGATE_SECRETS_KEY");
    if let Some(url) = database_url {
        command.arg("--database-url").arg(url);
    }
    command.output().expect("run toolgate")
}

/// The JSON report `toolgate doctor --json` printed.
pub fn doctor_report(output: &std::process::Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|err| panic!("doctor --json printed no JSON ({err}): {stdout}"))
}

pub async fn spawn_app() -> TestServer {
    spawn_with(SpawnOptions::default()).await
}

pub async fn spawn_with(mut options: SpawnOptions) -> TestServer {
    let temp = tempfile::tempdir().expect("temp dir");
    let data_dir = temp.path().join("data");
    let chosen = options
        .env
        .iter()
        .any(|(key, _)| key == "TOOLGATE_DATABASE_URL");
    let database = match database::postgres_server() {
        Some(server) if !chosen => {
            let database = database::TestDatabase::fresh(&server);
            options
                .env
                .push(("TOOLGATE_DATABASE_URL".into(), database.url.clone()));
            Some(database)
        }
        _ => None,
    };
    let mut server = start(&data_dir, &options).await;
    server._temp = Some(temp);
    server.database = database;
    server
}

async fn start(data_dir: &Path, options: &SpawnOptions) -> TestServer {
    std::fs::create_dir_all(data_dir).expect("data dir");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.join("..").join("server.log"))
        .expect("log file");
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    command
        .arg("serve")
        .arg("--listen")
        .arg(options.listen.as_deref().unwrap_or("127.0.0.1:0"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(&options.args)
        .env_remove("TOOLGATE_DATABASE_URL")
        .env_remove("TOOLGATE_LISTEN")
        .env_remove("TOOLGATE_DATA_DIR")
        .env_remove("ENABLE_UNSAFE_SCRIPT_HANDLER")
        .env_remove("TOOLGATE_SECRETS_KEY")
        .env_remove("TOOLGATE_LLM_BASE_URL")
        .env_remove("TOOLGATE_LLM_API_KEY")
        .env_remove("TOOLGATE_LLM_MODEL")
        .env_remove("TOOLGATE_LOG_FORMAT")
        .env_remove("TOOLGATE_CONFIG")
        // NO_COLOR in the test's environment would hide a missing terminal check.
        .env_remove("NO_COLOR")
        // The server's own default filter, whatever the test's environment.
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(if options.piped_stderr {
            Stdio::piped()
        } else {
            Stdio::from(log)
        })
        .kill_on_drop(true);
    if options.no_admin_token {
        command.env_remove("TOOLGATE_ADMIN_TOKEN");
    } else {
        command.env("TOOLGATE_ADMIN_TOKEN", ADMIN_TOKEN);
    }
    for (key, value) in &options.env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("spawn toolgate");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut metrics_url = None;
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if let Some(url) = line.strip_prefix("toolgate metrics on ") {
                metrics_url = Some(url.trim().to_owned());
            }
            if let Some(url) = line.strip_prefix("toolgate listening on http://") {
                return url.trim().parse::<std::net::SocketAddr>().expect("address");
            }
        }
        panic!("toolgate exited before listening; see server.log beside the data dir");
    })
    .await
    .expect("toolgate did not start listening within 60s");
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let token = if options.no_admin_token {
        std::fs::read_to_string(data_dir.join("admin-token"))
            .map(|t| t.trim().to_owned())
            .unwrap_or_default()
    } else {
        ADMIN_TOKEN.to_owned()
    };
    let connect_host = if addr.ip().is_unspecified() {
        format!("127.0.0.1:{}", addr.port())
    } else {
        addr.to_string()
    };
    TestServer {
        base_url: format!("http://{connect_host}"),
        addr,
        token,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client"),
        data_dir: data_dir.to_owned(),
        metrics_url,
        env: options.env.clone(),
        child: Some(child),
        database: None,
        _temp: None,
    }
}

/// A response read whole: status and JSON body (Null when the body is not JSON).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Value,
    pub text: String,
}

impl Reply {
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    /// Sends a request with the admin key.
    pub async fn send(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        self.send_as(&self.token.clone(), method, path, body).await
    }

    pub async fn send_as(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Reply {
        let mut request = self
            .client
            .request(method, self.url(path))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        read_reply(request.send().await.expect("request")).await
    }

    /// Sends a request without a key: the loopback-only `/api/tools` and the
    /// public routes.
    pub async fn send_without_key(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        let mut request = self.client.request(method, self.url(path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        read_reply(request.send().await.expect("request")).await
    }

    /// `POST` without a key (e.g. `/api/tools/register`).
    pub async fn post_without_key(&self, path: &str, body: Value) -> Reply {
        self.send_without_key(Method::POST, path, Some(body)).await
    }

    /// `GET` without a key (e.g. `/api/tools`, `/openapi.json`).
    pub async fn get_without_key(&self, path: &str) -> Reply {
        self.send_without_key(Method::GET, path, None).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.send(Method::POST, path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> Reply {
        self.send(Method::PATCH, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Reply {
        self.send(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.send(Method::DELETE, path, None).await
    }

    /// Creates an account and returns its API key.
    pub async fn create_account(&self, name: &str) -> String {
        let reply = self
            .post("/accounts", serde_json::json!({"name": name}))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        reply.body["data"]["api_key"].as_str().unwrap().to_owned()
    }

    /// Creates a session with the default character and returns its id.
    pub async fn create_session(&self) -> String {
        let reply = self
            .post("/sessions", serde_json::json!({"character": "Lanlan"}))
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        reply.body["data"]["id"].as_str().unwrap().to_owned()
    }

    /// Creates an enabled tool definition `name` (no handler) and returns
    /// its id.
    pub async fn create_definition(&self, name: &str) -> String {
        let reply = self
            .post(
                "/tools/definitions",
                serde_json::json!({"name": name, "description": "lore"}),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        reply.body["data"]["id"].as_str().unwrap().to_owned()
    }

    /// Creates, as the account whose key is `key`, a character named
    /// `character` and a session of it; returns the session's id.
    pub async fn create_session_as(&self, key: &str, character: &str) -> String {
        let reply = self
            .send_as(
                key,
                Method::POST,
                "/characters",
                Some(serde_json::json!({"name": character})),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        let reply = self
            .send_as(
                key,
                Method::POST,
                "/sessions",
                Some(serde_json::json!({"character": character})),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        reply.body["data"]["id"].as_str().unwrap().to_owned()
    }

    /// The server's process id.
    /// A floor with `content` in `session` and an open run on it: (floor, run).
    pub async fn floor_and_run(&self, session: &str, content: &str) -> (String, String) {
        let floor = self
            .post(
                &format!("/sessions/{session}/floors"),
                json!({ "content": content }),
            )
            .await;
        assert_eq!(floor.status, reqwest::StatusCode::CREATED, "{floor:?}");
        let floor = floor.body["data"]["id"].as_str().unwrap().to_owned();
        let run = self.post(&format!("/floors/{floor}/runs"), json!({})).await;
        assert_eq!(run.status, reqwest::StatusCode::CREATED, "{run:?}");
        let run = run.body["data"]["id"].as_str().unwrap().to_owned();
        (floor, run)
    }

    /// Changes the session's tool permissions, which must answer 200.
    pub async fn set_permissions(&self, session: &str, body: Value) {
        let reply = self
            .patch(&format!("/sessions/{session}/tool-permissions"), body)
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }

    /// A tool call on the session, which must answer 200; its `data`.
    pub async fn tool_call(&self, session: &str, body: Value) -> Value {
        let reply = self
            .post(&format!("/sessions/{session}/tool-calls"), body)
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        reply.body["data"].clone()
    }

    /// A `roll_dice` call on the session, which must succeed; its `data`.
    pub async fn roll_dice(&self, session: &str, call_id: &str) -> Value {
        let data = self
            .tool_call(
                session,
                serde_json::json!({"name": "roll_dice", "arguments": {"sides": 6}, "call_id": call_id}),
            )
            .await;
        assert_eq!(data["status"], "success", "{data}");
        data
    }

    /// A runtime job's state ("" when it cannot be read), for condition waits.
    pub async fn job_state(&self, job: &str) -> String {
        self.get(&format!("/runtime-jobs/{job}")).await.body["data"]["state"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// The `TOOLGATE_DATABASE_URL` the server runs on: its PostgreSQL
    /// database, or the SQLite file in its data directory.
    pub fn database_url(&self) -> String {
        match &self.database {
            Some(database) => database.url.clone(),
            None => format!("sqlite://{}", self.data_dir.join("toolgate.db").display()),
        }
    }

    /// True when the server runs on PostgreSQL.
    pub fn on_postgres(&self) -> bool {
        self.database.is_some()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().and_then(|c| c.id()).expect("running")
    }

    /// The server's log (its stderr) once it holds `needle`: log lines are
    /// written by a thread of their own, a moment after they are logged.
    pub async fn log_containing(&self, needle: &str) -> String {
        file_containing(&self.data_dir.join("..").join("server.log"), needle).await
    }

    /// The server's standard error, when it was started with
    /// [`SpawnOptions::piped_stderr`].
    pub fn take_stderr(&mut self) -> tokio::process::ChildStderr {
        self.child
            .as_mut()
            .and_then(|child| child.stderr.take())
            .expect("started with piped_stderr, stderr not taken yet")
    }

    /// Stops the server with SIGTERM and waits for it to exit.
    pub async fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        if let Some(pid) = child.id() {
            // kill(1) keeps the tests free of libc bindings.
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
        }
        tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .expect("server did not exit within 30s of SIGTERM")
            .expect("wait")
    }

    /// Kills the server with SIGKILL, as a crash would.
    pub async fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().await.expect("kill");
    }

    /// Starts the server again on the same data directory with other environment.
    pub async fn restart_with_env(&mut self, env: Vec<(String, String)>) {
        self.env = env;
        self.restart().await;
    }

    /// Runs `toolgate serve` on this stopped server's data directory and
    /// database with `env`, for a start that must be refused: its output,
    /// once it has exited (it fails the test if it listens).
    pub async fn start_refused(&self, env: Vec<(String, String)>) -> std::process::Output {
        assert!(self.child.is_none(), "stop the server first");
        let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&self.data_dir)
            .env_remove("TOOLGATE_SECRETS_KEY")
            .env_remove("TOOLGATE_CONFIG")
            .env("TOOLGATE_DATABASE_URL", self.database_url())
            .env("TOOLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .envs(env)
            .kill_on_drop(true);
        let output = tokio::time::timeout(Duration::from_secs(60), command.output())
            .await
            .expect("a refused start did not exit within 60 s")
            .expect("run toolgate");
        assert!(
            !output.status.success()
                && !String::from_utf8_lossy(&output.stdout).contains("listening"),
            "the start was not refused: {output:?}"
        );
        output
    }

    /// Runs one SQL statement on the server's database (PostgreSQL or the
    /// data directory's SQLite file), as an operator's tool would.
    pub async fn execute_sql(&self, sql: impl Into<String>) {
        let sql = sqlx::AssertSqlSafe(sql.into());
        if self.on_postgres() {
            let pool = sqlx::PgPool::connect(&self.database_url()).await.unwrap();
            sqlx::query(sql).execute(&pool).await.unwrap();
            pool.close().await;
        } else {
            let pool = sqlx::SqlitePool::connect(&self.database_url())
                .await
                .unwrap();
            sqlx::query(sql).execute(&pool).await.unwrap();
            pool.close().await;
        }
    }

    /// Starts the server again on the same data directory (a new port).
    pub async fn restart(&mut self) {
        if self.child.is_some() {
            self.stop().await;
        }
        let mut env = self.env.clone();
        // The server's own PostgreSQL database stays its database.
        if let Some(database) = &self.database
            && !env.iter().any(|(key, _)| key == "TOOLGATE_DATABASE_URL")
        {
            env.push(("TOOLGATE_DATABASE_URL".into(), database.url.clone()));
        }
        let options = SpawnOptions {
            env,
            ..Default::default()
        };
        let fresh = start(&self.data_dir, &options).await;
        self.base_url = fresh.base_url.clone();
        self.addr = fresh.addr;
        let mut fresh = fresh;
        self.metrics_url = fresh.metrics_url.clone();
        self.child = fresh.child.take();
    }
}

/// Posts a registration to the loopback-only `/api/tools/register`, whatever
/// the answer.
pub async fn try_register_remote(server: &TestServer, body: Value) -> Reply {
    server.post_without_key("/api/tools/register", body).await
}

/// Registers a remote tool through the loopback-only `/api/tools/register`.
pub async fn register_remote(server: &TestServer, body: Value) -> Reply {
    let reply = try_register_remote(server, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["ok"], true, "{reply:?}");
    reply
}

pub async fn read_reply(response: reqwest::Response) -> Reply {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply { status, body, text }
}

/// The text of the file at `path` once it holds `needle` (a server's log:
/// its lines are written by a thread of their own, a moment after they are
/// logged), failing after 10 s.
pub async fn file_containing(path: &Path, needle: &str) -> String {
    let mut text = String::new();
    wait_until(Duration::from_secs(10), needle, || {
        text = std::fs::read_to_string(path).unwrap_or_default();
        let found = text.contains(needle);
        async move { found }
    })
    .await;
    text
}

/// Polls `check` until it returns true, failing after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The strings of a JSON array (panics with the value when it is not one).
pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("expected an array, got {value}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

impl TestServer {
    /// Sends SIGTERM without waiting, so a test can race something against it.
    pub fn terminate(&self) {
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
    }

    /// Waits up to `timeout` for the server to exit. None when it is still
    /// running; it stays owned here and is killed when the server is dropped.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut().expect("running");
        let status = tokio::time::timeout(timeout, child.wait()).await.ok()?;
        self.child = None;
        Some(status.expect("wait"))
    }
}

/// Creates racing for the last place under a cap: exactly one is 201, every
/// other 409 `limit_exceeded` naming the cap's value `limit`.
pub fn assert_one_created_rest_over_limit(replies: &[Reply], limit: &str) {
    let created = replies
        .iter()
        .filter(|reply| reply.status == StatusCode::CREATED)
        .count();
    assert_eq!(created, 1, "one place, one create: {replies:?}");
    for refused in replies.iter().filter(|r| r.status != StatusCode::CREATED) {
        assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
        assert_eq!(refused.code(), "limit_exceeded");
        assert!(refused.text.contains(limit), "{refused:?}");
    }
}
