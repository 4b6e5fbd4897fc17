//! One MCP client connection (rmcp, client side) over stdio or streamable HTTP:
//! opening it, what the server tells it unasked (`tools/list_changed`), and
//! closing it with its child process group.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use process_wrap::tokio::{CommandWrap, ProcessGroup};
#[allow(deprecated)]
use rmcp::model::{
    ClientConfig, ClientRequest, CreateMessageRequestParams, CreateMessageResult, CustomRequest,
    CustomResult, ElicitRequestParams, ElicitResult, ElicitationAction, Implementation,
    ListRootsResult, PaginatedRequestParams, PingRequest, ProtocolVersion, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, RunningServiceCancellationToken};
use rmcp::transport::common::client_side_sse::FixedInterval;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::traced_http::{DEPLOYMENT_HEADER, TracedHttpClient};
use crate::domain::mcp::{HttpConfig, McpServerConfig, McpTransport, StdioConfig};
use crate::domain::mcp_rules::Reach;

/// Most tools toolgate takes from one server.
pub const MAX_TOOLS_PER_SERVER: usize = 1_000;
/// Most `tools/list` pages of one listing.
pub const MAX_LIST_PAGES: usize = 100;
/// Longest stderr line of a stdio server kept in the log.
const MAX_STDERR_LINE_BYTES: usize = 1024;
/// stderr bytes of one child logged before the rest is dropped.
const MAX_STDERR_BYTES: usize = 64 * 1024;
/// Environment variables of toolgate a child never inherits (the admin token,
/// the secrets key and every other setting).
const PRIVATE_ENV_PREFIX: &str = "TOOLGATE_";

/// What the server told the connection without being asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    ToolListChanged,
}

/// Hands server notifications to the supervisor: at most one waits, so a
/// server repeating `tools/list_changed` thousands of times a second asks for
/// one listing, not thousands.
struct Handler {
    notices: mpsc::Sender<Notice>,
    requests: RequestBudget,
}

/// Requests a server may send toolgate (ping, sampling, roots, elicitation,
/// its own) in one second. A server has no need of more, and each is answered
/// over its own exchange: a server sending thousands a second grew toolgate's
/// memory without bound, so past this its connection is dropped as a flood
/// (and the supervisor's breaker spaces out the reconnects).
pub const MAX_SERVER_REQUESTS_PER_SECOND: u32 = 50;

/// Counts a connection's server requests per second.
struct RequestBudget {
    window: std::sync::Mutex<(std::time::Instant, u32)>,
    /// Cancelled when the server went past the budget.
    flooded: CancellationToken,
}

impl RequestBudget {
    fn new(flooded: CancellationToken) -> Self {
        Self {
            window: std::sync::Mutex::new((std::time::Instant::now(), 0)),
            flooded,
        }
    }

    /// Takes one request, or refuses it (and marks the connection flooded).
    fn take(&self) -> Result<(), rmcp::ErrorData> {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let (started, taken) = &mut *window;
        if started.elapsed() >= Duration::from_secs(1) {
            (*started, *taken) = (std::time::Instant::now(), 0);
        }
        *taken += 1;
        if *taken <= MAX_SERVER_REQUESTS_PER_SECOND {
            return Ok(());
        }
        self.flooded.cancel();
        Err(rmcp::ErrorData::internal_error(
            "too many requests from this server; the connection is being closed",
            None,
        ))
    }
}

// Sampling and roots are deprecated (SEP-2577), but servers may still send
// them: they are answered, as rmcp's defaults do, after being counted.
#[allow(deprecated)]
impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            Default::default(),
            Implementation::new("toolgate", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn ping(&self, _context: RequestContext<RoleClient>) -> Result<(), rmcp::ErrorData> {
        self.requests.take()
    }

    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, rmcp::ErrorData> {
        self.requests.take()?;
        Err(rmcp::ErrorData::method_not_found::<
            rmcp::model::CreateMessageRequestMethod,
        >())
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, rmcp::ErrorData> {
        self.requests.take()?;
        Ok(ListRootsResult::default())
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        self.requests.take()?;
        Ok(ElicitResult::new(ElicitationAction::Decline))
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleClient>,
    ) -> Result<CustomResult, rmcp::ErrorData> {
        self.requests.take()?;
        Err(rmcp::ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            request.method,
            None,
        ))
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        // Full: a listing is already asked for, and will see this change.
        let _ = self.notices.try_send(Notice::ToolListChanged);
    }
}

/// An open connection: the peer calls are sent through, and the task that ends
/// when the connection does.
pub struct Connection {
    pub peer: Peer<RoleClient>,
    /// Taken by `close`; a connection dropped without it is closed by `Drop`.
    cancel: Option<RunningServiceCancellationToken>,
    /// Cancelled when the service loop has ended.
    done: CancellationToken,
    /// Cancelled when the server sent more requests than it may.
    flooded: CancellationToken,
    /// Cancelled when the connection is given up (`close` or `Drop`).
    given_up: CancellationToken,
    /// A stdio child's process group (its pid: the child leads it).
    process_group: Option<u32>,
}

impl Connection {
    /// Connects to the server and completes the MCP handshake.
    pub async fn open(
        config: &McpServerConfig,
        server_id: &str,
        notices: mpsc::Sender<Notice>,
        reach: Reach,
        deployment_mark: &str,
    ) -> Result<Self, String> {
        let flooded = CancellationToken::new();
        let handler = Handler {
            notices,
            requests: RequestBudget::new(flooded.clone()),
        };
        let lifecycle = ClientLifecycleMode::Initialize;
        let mut process_group = None;
        let service = match &config.transport {
            McpTransport::Stdio(stdio) => {
                let transport = spawn_child(stdio, server_id)?;
                process_group = transport.id();
                let served = handler.serve_with_lifecycle(transport, lifecycle).await;
                if served.is_err() {
                    kill_group(process_group);
                }
                served
            }
            McpTransport::Http(http) => {
                let transport = http_transport(http, reach, deployment_mark)?;
                handler.serve_with_lifecycle(transport, lifecycle).await
            }
        }
        .map_err(|err| format!("the MCP handshake failed: {err}"))?;
        let peer = service.peer().clone();
        if let Some(unknown) = peer
            .peer_info()
            .map(|info| info.protocol_version.clone())
            .filter(|version| !ProtocolVersion::KNOWN_VERSIONS.contains(version))
        {
            // Its messages could mean anything: nothing is listed or called.
            let _ = service.cancel().await;
            kill_group(process_group);
            let shown: String = unknown.as_str().chars().take(64).collect();
            return Err(format!(
                "the server answered protocol version {shown:?}, which toolgate does not speak"
            ));
        }
        let cancel = service.cancellation_token();
        let done = CancellationToken::new();
        let finished = done.clone();
        tokio::spawn(async move {
            let _ = service.waiting().await;
            finished.cancel();
        });
        Ok(Self {
            peer,
            cancel: Some(cancel),
            done,
            flooded,
            given_up: CancellationToken::new(),
            process_group,
        })
    }

    /// Every tool the server lists, following pagination, at most
    /// [`MAX_TOOLS_PER_SERVER`] tools in [`MAX_LIST_PAGES`] pages: a server
    /// whose cursor never ends, or that lists without end, fails the listing
    /// instead of filling memory until a timeout.
    pub async fn list_tools(&self) -> Result<Vec<Tool>, String> {
        let mut tools = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut params = PaginatedRequestParams::default();
            params.cursor = cursor;
            let page = self
                .peer
                .list_tools(Some(params))
                .await
                .map_err(|err| format!("tools/list failed: {err}"))?;
            tools.extend(page.tools);
            if tools.len() > MAX_TOOLS_PER_SERVER {
                return Err(format!(
                    "the server lists more than {MAX_TOOLS_PER_SERVER} tools, the most toolgate takes from one server"
                ));
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(tools),
            }
        }
        Err(format!(
            "the server's tool list goes on past {MAX_LIST_PAGES} pages (a cursor that never ends?)"
        ))
    }

    /// Whether the server still answers, within `timeout`.
    pub async fn ping(&self, timeout: Duration) -> Result<(), String> {
        let request = ClientRequest::PingRequest(PingRequest::default());
        match tokio::time::timeout(timeout, self.peer.send_request(request)).await {
            Ok(Ok(ServerResult::EmptyResult(_))) => Ok(()),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(format!("ping failed: {err}")),
            Err(_) => Err(format!("ping unanswered after {} ms", timeout.as_millis())),
        }
    }

    /// The peer calls are sent through, with the token that ends them when
    /// this connection is given up.
    pub fn live_peer(&self) -> super::status::LivePeer {
        super::status::LivePeer {
            peer: self.peer.clone(),
            given_up: self.given_up.clone(),
        }
    }

    /// Resolves when the connection has ended (the server hung up, the child
    /// exited, or it was closed).
    pub fn ended(&self) -> WaitForCancellationFutureOwned {
        self.done.clone().cancelled_owned()
    }

    /// Resolves when the server has sent more requests in a second than
    /// [`MAX_SERVER_REQUESTS_PER_SECOND`].
    pub fn flooded(&self) -> WaitForCancellationFutureOwned {
        self.flooded.clone().cancelled_owned()
    }

    /// Closes the connection; a stdio child is asked to exit, then killed with
    /// its process group.
    pub async fn close(mut self) {
        self.given_up.cancel();
        if let Some(cancel) = self.cancel.take() {
            cancel.cancel();
        }
        finish_closing(self.done.clone(), self.process_group).await;
    }
}

impl Drop for Connection {
    /// A connection given up without `close` (a timeout around listing its
    /// tools, a cancelled task) is closed all the same: otherwise its service
    /// task would hold the child's pipes and its process group would outlive
    /// the server's deletion and toolgate itself.
    fn drop(&mut self) {
        self.given_up.cancel();
        let Some(cancel) = self.cancel.take() else {
            return;
        };
        cancel.cancel();
        let (done, process_group) = (self.done.clone(), self.process_group);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(finish_closing(done, process_group));
            }
            Err(_) => kill_group(process_group),
        }
    }
}

/// Waits a while for a cancelled connection's service to end, then kills what
/// is left of its process group (the child may have exited on its own and
/// left others of its group).
async fn finish_closing(done: CancellationToken, process_group: Option<u32>) {
    if tokio::time::timeout(Duration::from_secs(10), done.cancelled())
        .await
        .is_err()
    {
        tracing::warn!("an MCP connection did not close within 10 s");
    }
    kill_group(process_group);
}

/// Kills what is left of a stdio child's process group.
fn kill_group(process_group: Option<u32>) {
    let Some(pgid) = process_group.and_then(|pid| i32::try_from(pid).ok()) else {
        return;
    };
    use nix::sys::signal::{Signal, killpg};
    match killpg(nix::unistd::Pid::from_raw(pgid), Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(error) => tracing::warn!(pgid, %error, "could not kill an MCP server's process group"),
    }
}

/// Starts a stdio server in its own process group, its stderr into the log.
fn spawn_child(stdio: &StdioConfig, server_id: &str) -> Result<TokioChildProcess, String> {
    let mut command = tokio::process::Command::new(&stdio.command);
    command.args(&stdio.args);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with(PRIVATE_ENV_PREFIX) {
            command.env_remove(&key);
        }
    }
    command.envs(&stdio.env);
    if let Some(cwd) = &stdio.cwd {
        command.current_dir(cwd);
    }
    let mut wrapped = CommandWrap::from(command);
    wrapped.wrap(ProcessGroup::leader());
    let (child, stderr) = TokioChildProcess::builder(wrapped)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("could not start {:?}: {err}", stdio.command))?;
    if let Some(stderr) = stderr {
        tokio::spawn(log_stderr(stderr, server_id.to_owned()));
    }
    Ok(child)
}

/// Copies a child's stderr into the log, line by line, up to a cap. The pipe
/// is read in the reader's buffer and at most [`MAX_STDERR_LINE_BYTES`] of a
/// line are kept, so a child writing without newlines costs no more memory
/// than one that writes lines; past the cap the pipe is still drained (a
/// child blocked on a full pipe would stop answering).
async fn log_stderr(stderr: tokio::process::ChildStderr, server_id: String) {
    let mut reader = BufReader::new(stderr);
    let mut log = StderrLog::new(server_id);
    loop {
        let chunk = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(chunk) => chunk,
        };
        let (part, ends_line) = match memchr::memchr(b'\n', chunk) {
            Some(at) => (&chunk[..=at], true),
            None => (chunk, false),
        };
        log.take(part);
        let used = part.len();
        reader.consume(used);
        if ends_line {
            log.end_line();
        }
    }
    log.end_line();
}

/// The stderr line being read and how much of a child's stderr was logged.
struct StderrLog {
    server_id: String,
    /// The line's first bytes, at most [`MAX_STDERR_LINE_BYTES`].
    kept: Vec<u8>,
    /// Every byte of the line, kept or not.
    line_bytes: usize,
    logged: usize,
}

impl StderrLog {
    fn new(server_id: String) -> Self {
        Self {
            server_id,
            kept: Vec::with_capacity(MAX_STDERR_LINE_BYTES),
            line_bytes: 0,
            logged: 0,
        }
    }

    fn take(&mut self, part: &[u8]) {
        let room = MAX_STDERR_LINE_BYTES.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&part[..part.len().min(room)]);
        self.line_bytes += part.len();
    }

    fn end_line(&mut self) {
        let line_bytes = std::mem::take(&mut self.line_bytes);
        if line_bytes == 0 || self.logged >= MAX_STDERR_BYTES {
            self.kept.clear();
            return;
        }
        self.logged += line_bytes;
        let text = String::from_utf8_lossy(&self.kept);
        let server_id = &self.server_id;
        tracing::info!(server_id, line = ?text.trim_end(), "mcp server stderr");
        self.kept.clear();
        if self.logged >= MAX_STDERR_BYTES {
            tracing::warn!(
                server_id,
                "mcp server stderr exceeded {MAX_STDERR_BYTES} bytes; the rest is not logged"
            );
        }
    }
}

fn http_transport(
    http: &HttpConfig,
    reach: Reach,
    deployment_mark: &str,
) -> Result<StreamableHttpClientTransport<TracedHttpClient>, String> {
    // A configuration stored before these addresses were refused is held to
    // the rule here too: the resolver never sees an IP-literal host.
    if let Ok(url) = url::Url::parse(&http.url)
        && !reach.allows_url(&url)
    {
        return Err(format!("http.url is out of reach: {}", reach.refusal()));
    }
    let mut headers = HashMap::new();
    for (name, value) in &http.headers {
        let name = reqwest::header::HeaderName::try_from(name.as_str())
            .map_err(|_| format!("http.headers has an invalid header name {name:?}"))?;
        let value = reqwest::header::HeaderValue::try_from(value.as_str())
            .map_err(|_| format!("http.headers.{name} has an invalid value"))?;
        headers.insert(name, value);
    }
    // Last, over a configured header of the same name: rmcp's per-request
    // headers win over the client's defaults, and a configured value would
    // hide the mark from this deployment's own endpoint.
    headers.insert(
        reqwest::header::HeaderName::from_static(DEPLOYMENT_HEADER),
        reqwest::header::HeaderValue::try_from(deployment_mark)
            .map_err(|_| "the deployment mark is no header value".to_owned())?,
    );
    let mut config = StreamableHttpClientTransportConfig::with_uri(http.url.clone())
        .custom_headers(headers)
        .reinit_on_expired_session(true);
    // rmcp's default retries a lost stream forever, so a dead server would
    // never fail anything; one retry, then the supervisor's breaker decides.
    let mut retry = FixedInterval::default();
    retry.max_times = Some(1);
    config.retry_config = Arc::new(retry);
    Ok(StreamableHttpClientTransport::with_client(
        TracedHttpClient::new(reach, deployment_mark)?,
        config,
    ))
}
