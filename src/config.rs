//! Settings: command-line flags, `TOOLGATE_*` environment variables and an optional
//! TOML file, in that order of precedence, over embedded defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

/// The `toolgate` command line.
#[derive(Debug, Parser)]
#[command(
    name = "toolgate",
    version,
    about = "A tool runtime for AI character chat servers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The closed set of things the binary can do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP server.
    #[command(
        after_help = "Every setting can also come from its environment variable or from the --config file; a flag overrides its variable, which overrides the file, which overrides the default."
    )]
    Serve(Box<ServeArgs>),
    /// Create the database if missing and bring its schema up to date, then
    /// exit (`serve` does the same at start-up). Refuses a database a newer
    /// toolgate migrated.
    Migrate(DatabaseArgs),
    /// Report on the database without changing it: connectivity, schema
    /// version against this binary's, runtime jobs, calls a stopped process
    /// left open. Exits 1 when toolgate could not run on it.
    Doctor(DoctorArgs),
    /// Drop every stored MCP secret (stdio env, http headers) and the
    /// database's secrets key check, for a secrets key that is lost: the
    /// servers that had secrets are kept without them, disabled. Refused while
    /// an instance runs on the database. The next start's key takes over.
    ForgetSecrets(ForgetSecretsArgs),
}

/// Where the database is, as `serve` finds it (flag, environment, file).
#[derive(Debug, Args, Default, Clone)]
pub struct DatabaseArgs {
    /// Directory of the embedded database (default: ./data).
    #[arg(long, env = "TOOLGATE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// SQLite database URL used instead of the data directory's file (default: <data-dir>/toolgate.db).
    #[arg(long, env = "TOOLGATE_DATABASE_URL")]
    pub database_url: Option<String>,
    /// TOML file with the settings of `serve` (only data_dir and database_url are read here).
    #[arg(long, env = "TOOLGATE_CONFIG")]
    pub config: Option<PathBuf>,
}

impl DatabaseArgs {
    /// The data directory and database URL these arguments resolve to, by
    /// the same precedence as `serve`.
    pub fn resolve(self) -> anyhow::Result<(PathBuf, Option<String>)> {
        let settings = self.settings(None)?;
        Ok((settings.data_dir, settings.database_url))
    }

    /// The settings `serve` would have with these arguments and
    /// `secrets_key` (the flag or environment variable), the config file's
    /// other fields included.
    pub fn settings(self, secrets_key: Option<String>) -> anyhow::Result<Settings> {
        Settings::resolve(ServeArgs {
            data_dir: self.data_dir,
            database_url: self.database_url,
            config: self.config,
            secrets_key,
            ..ServeArgs::default()
        })
    }
}

/// Flags of `toolgate doctor`.
#[derive(Debug, Args, Default, Clone)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// The secrets key `serve` would be given, to check against the database's (default: the config file's `secrets_key`, else <data-dir>/secrets-key); prefer the environment variable.
    #[arg(long, env = "TOOLGATE_SECRETS_KEY", hide_env_values = true)]
    pub secrets_key: Option<String>,
}

/// Flags of `toolgate forget-secrets`.
#[derive(Debug, Args, Default, Clone)]
pub struct ForgetSecretsArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Confirms that the stored secrets are to be dropped (they cannot be
    /// recovered without the key that sealed them).
    #[arg(long, required = true)]
    pub yes: bool,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// What the generation loop asks of the model's tool use on a turn's first
/// step: `auto` sends no `tool_choice` (the model decides), `required` sends
/// `"tool_choice": "required"` so the first answer must call a tool (small
/// local models emit real tool calls only when told to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FirstToolChoice {
    #[default]
    Auto,
    Required,
}

/// Whether the process records metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum MetricsSwitch {
    #[default]
    On,
    Off,
}

/// Flags of `toolgate serve`; each may also come from the environment or the file.
///
/// Each help line states the default: the fields are `Option`s (not clap
/// defaults) so that an unset flag falls through to the environment and then
/// the file before the default of [`Settings`] applies.
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// Address (IP:port) to listen on; port 0 picks a free port (default: 127.0.0.1:8700).
    #[arg(long, env = "TOOLGATE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Directory of the embedded database and the generated admin token, created if missing (default: ./data).
    #[arg(long, env = "TOOLGATE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// SQLite database URL used instead of the data directory's file (default: <data-dir>/toolgate.db).
    #[arg(long, env = "TOOLGATE_DATABASE_URL")]
    pub database_url: Option<String>,
    /// API key given to the default account at first start only (default: a generated key, printed once and saved to <data-dir>/admin-token).
    #[arg(long, env = "TOOLGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Key sealing stored secrets (MCP servers' env and headers) at rest: 32 bytes as 64 hexadecimal digits, e.g. from `openssl rand -hex 32`; prefer the environment variable to the flag, which other users can see (default: generated at first start into <data-dir>/secrets-key, mode 0600, and reused).
    #[arg(long, env = "TOOLGATE_SECRETS_KEY", hide_env_values = true)]
    pub secrets_key: Option<String>,
    /// Base URL of an OpenAI-compatible chat-completions endpoint, e.g. http://127.0.0.1:8080/v1 (default: none; floors then start no run).
    #[arg(long, env = "TOOLGATE_LLM_BASE_URL")]
    pub llm_base_url: Option<String>,
    /// API key sent as a bearer token to the model endpoint, never logged (default: none).
    #[arg(long, env = "TOOLGATE_LLM_API_KEY", hide_env_values = true)]
    pub llm_api_key: Option<String>,
    /// Model name sent with every chat-completions request; required with --llm-base-url (default: none).
    #[arg(long, env = "TOOLGATE_LLM_MODEL")]
    pub llm_model: Option<String>,
    /// Tool choice of a turn's first model request when tools are offered: `auto` (the model decides) or `required` (it must call one; for small local models) (default: auto).
    #[arg(long, env = "TOOLGATE_LLM_FIRST_TOOL_CHOICE")]
    pub llm_first_tool_choice: Option<FirstToolChoice>,
    /// Record Prometheus metrics (`on`) or not (`off`, for measuring their cost); `/metrics` answers either way (default: on).
    #[arg(long, env = "TOOLGATE_METRICS")]
    pub metrics: Option<MetricsSwitch>,
    /// Extra address (IP:port) serving only `GET /metrics`, without a key, for a private scrape network (default: none; /metrics on the main listener needs the admin key).
    #[arg(long, env = "TOOLGATE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Format of the log lines written to stderr, filtered by RUST_LOG (default: text).
    #[arg(long, env = "TOOLGATE_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// TOML file with these settings under snake_case keys; flags and environment override it (default: none).
    #[arg(long, env = "TOOLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Name of the character created at first start (default: Lanlan).
    #[arg(long, env = "TOOLGATE_DEFAULT_CHARACTER")]
    pub default_character: Option<String>,
    /// Largest accepted request body, in bytes; larger ones are refused with 413 (default: 1048576, 1 MiB).
    #[arg(long, env = "TOOLGATE_BODY_LIMIT_BYTES")]
    pub body_limit_bytes: Option<usize>,
    /// Largest accepted response body of a remote tool's callback, in bytes (default: 1048576, 1 MiB).
    #[arg(long, env = "TOOLGATE_CALLBACK_RESPONSE_LIMIT_BYTES")]
    pub callback_response_limit_bytes: Option<usize>,
    /// How many async tool jobs this instance runs at once; 0 starts no job worker, so deferred calls are queued in the database but not run by this instance (default: 4).
    #[arg(long, env = "TOOLGATE_JOB_WORKERS")]
    pub job_workers: Option<usize>,
    /// Allow tool definitions with a `script` handler; the environment variable turns it on only when it is exactly `true` (default: off).
    #[arg(
        long,
        env = "ENABLE_UNSAFE_SCRIPT_HANDLER",
        num_args = 0,
        default_missing_value = "true",
        value_parser = exactly_true
    )]
    pub enable_unsafe_script_handler: Option<bool>,
    /// Let every account attach stdio MCP servers, which run their command as the server's own user; without it only the admin account may (default: off, only the exact value `true` turns it on).
    #[arg(
        long,
        env = "TOOLGATE_MCP_STDIO_FOR_ALL_ACCOUNTS",
        num_args = 0,
        default_missing_value = "true",
        value_parser = exactly_true
    )]
    pub mcp_stdio_for_all_accounts: Option<bool>,
    /// Let every account attach HTTP MCP servers on loopback and private-network addresses (127.0.0.0/8, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, ::1, fc00::/7, `localhost`), where toolgate itself and the machine's other services answer; without it only the admin account may (default: off, only the exact value `true` turns it on).
    #[arg(
        long,
        env = "TOOLGATE_MCP_PRIVATE_URLS_FOR_ALL_ACCOUNTS",
        num_args = 0,
        default_missing_value = "true",
        value_parser = exactly_true
    )]
    pub mcp_private_urls_for_all_accounts: Option<bool>,
    /// Wall-clock limit of one script-handler call, in milliseconds (default: 1000).
    #[arg(long, env = "TOOLGATE_SCRIPT_TIMEOUT_MS")]
    pub script_timeout_ms: Option<u64>,
    /// Time budget of validating one call's arguments against its tool's schema, in milliseconds; a call over it is refused and never run (default: 1000).
    #[arg(long, env = "TOOLGATE_ARGUMENT_VALIDATION_TIMEOUT_MS")]
    pub argument_validation_timeout_ms: Option<u64>,
    /// Heap limit of one script-handler call, in bytes, at least 1 MiB (default: 16777216, 16 MiB).
    #[arg(long, env = "TOOLGATE_SCRIPT_MEMORY_LIMIT_BYTES")]
    pub script_memory_limit_bytes: Option<usize>,
    /// Time a connection has to send a whole request head, in milliseconds, else it is closed (default: 10000).
    #[arg(long, env = "TOOLGATE_HEADER_READ_TIMEOUT_MS")]
    pub header_read_timeout_ms: Option<u64>,
    /// Time a request's body has to arrive whole once its head has, in milliseconds, else it is answered 408 and its connection closed (default: 30000).
    #[arg(long, env = "TOOLGATE_REQUEST_BODY_TIMEOUT_MS")]
    pub request_body_timeout_ms: Option<u64>,
    /// Time an idle keep-alive connection is kept open, in milliseconds (default: 60000).
    #[arg(long, env = "TOOLGATE_IDLE_TIMEOUT_MS")]
    pub idle_timeout_ms: Option<u64>,
    /// Concurrent client connections; one over the cap is accepted and closed at once (default: 4096).
    #[arg(long, env = "TOOLGATE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Event streams (`GET /sessions/{id}/events`) one account other than the admin may hold open at once, so that no account can take every connection (default: a quarter of --max-connections).
    #[arg(long, env = "TOOLGATE_MAX_EVENT_STREAMS_PER_ACCOUNT")]
    pub max_event_streams_per_account: Option<usize>,
    /// Most runtime tools (/api/tools registrations) held at once, all sources together; a tool registered for several roles counts once (default: 1000).
    #[arg(long, env = "TOOLGATE_MAX_RUNTIME_TOOLS")]
    pub max_runtime_tools: Option<usize>,
    /// Most runtime tools one source tag may hold at once (default: 1000).
    #[arg(long, env = "TOOLGATE_MAX_RUNTIME_TOOLS_PER_SOURCE")]
    pub max_runtime_tools_per_source: Option<usize>,
    /// Largest runtime tool, in bytes: its parameters schema as compact JSON plus its description (default: 262144, 256 KiB).
    #[arg(long, env = "TOOLGATE_MAX_TOOL_SCHEMA_BYTES")]
    pub max_tool_schema_bytes: Option<usize>,
}

/// The script switch's rule: only the exact value `true` turns it on; any other
/// value (`1`, `TRUE`, `yes`, ...) leaves it off rather than failing.
fn exactly_true(raw: &str) -> Result<bool, std::convert::Infallible> {
    Ok(raw == "true")
}

/// The optional TOML file. Unknown keys are refused so that typos are noticed.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    database_url: Option<String>,
    admin_token: Option<String>,
    secrets_key: Option<String>,
    llm_base_url: Option<String>,
    llm_api_key: Option<String>,
    llm_model: Option<String>,
    llm_first_tool_choice: Option<FirstToolChoice>,
    metrics: Option<MetricsSwitch>,
    metrics_listen: Option<SocketAddr>,
    log_format: Option<LogFormat>,
    default_character: Option<String>,
    body_limit_bytes: Option<usize>,
    callback_response_limit_bytes: Option<usize>,
    job_workers: Option<usize>,
    enable_unsafe_script_handler: Option<bool>,
    mcp_stdio_for_all_accounts: Option<bool>,
    mcp_private_urls_for_all_accounts: Option<bool>,
    script_timeout_ms: Option<u64>,
    argument_validation_timeout_ms: Option<u64>,
    script_memory_limit_bytes: Option<usize>,
    header_read_timeout_ms: Option<u64>,
    request_body_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    max_connections: Option<usize>,
    max_event_streams_per_account: Option<usize>,
    max_runtime_tools: Option<usize>,
    max_runtime_tools_per_source: Option<usize>,
    max_tool_schema_bytes: Option<usize>,
}

/// A configured secret (API key, token): its Debug form never shows the value,
/// so printing the settings cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    /// The secret itself, for the one place that must send or use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for SecretString {
    fn from(secret: String) -> Self {
        Self(secret)
    }
}

impl From<&str> for SecretString {
    fn from(secret: &str) -> Self {
        Self(secret.to_owned())
    }
}

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Fully resolved settings of a running server.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    pub admin_token: Option<SecretString>,
    /// The secrets key as configured (hex); None uses the data directory's key file.
    pub secrets_key: Option<SecretString>,
    /// The model endpoint (`--llm-base-url`); None: no generation loop.
    pub llm_base_url: Option<String>,
    pub llm_api_key: Option<SecretString>,
    pub llm_model: Option<String>,
    pub llm_first_tool_choice: FirstToolChoice,
    pub metrics: MetricsSwitch,
    pub metrics_listen: Option<SocketAddr>,
    pub log_format: LogFormat,
    pub default_character: String,
    pub body_limit_bytes: usize,
    pub callback_response_limit_bytes: usize,
    pub job_workers: usize,
    pub enable_unsafe_script_handler: bool,
    /// Whether accounts other than the admin may attach stdio MCP servers.
    pub mcp_stdio_for_all_accounts: bool,
    /// Whether accounts other than the admin may attach HTTP MCP servers on
    /// loopback and private-network addresses.
    pub mcp_private_urls_for_all_accounts: bool,
    pub script_timeout_ms: u64,
    pub script_memory_limit_bytes: usize,
    pub argument_validation_timeout_ms: u64,
    pub header_read_timeout_ms: u64,
    pub request_body_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub max_connections: usize,
    pub max_event_streams_per_account: usize,
    pub max_runtime_tools: usize,
    pub max_runtime_tools_per_source: usize,
    pub max_tool_schema_bytes: usize,
}

impl Settings {
    pub const DEFAULT_LISTEN: &'static str = "127.0.0.1:8700";
    pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;
    /// Time limit of one script-handler call.
    pub const DEFAULT_SCRIPT_TIMEOUT_MS: u64 = 1000;
    /// Heap limit of one script-handler call.
    pub const DEFAULT_SCRIPT_MEMORY_BYTES: usize = 16 * 1024 * 1024;
    /// Time budget of one call's argument validation.
    pub const DEFAULT_ARGUMENT_VALIDATION_TIMEOUT_MS: u64 = 1000;
    /// Time a connection has to send a whole request head.
    pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
    pub const DEFAULT_REQUEST_BODY_TIMEOUT_MS: u64 = 30_000;
    /// Time an idle keep-alive connection is kept open.
    pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
    /// Concurrent client connections.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
    /// Runtime tools held at once, over all sources; far above any real plugin.
    pub const DEFAULT_MAX_RUNTIME_TOOLS: usize = 1000;
    /// Runtime tools one source may hold at once.
    pub const DEFAULT_MAX_RUNTIME_TOOLS_PER_SOURCE: usize = 1000;
    /// Size of one runtime tool's parameters schema (compact JSON) plus description.
    pub const DEFAULT_MAX_TOOL_SCHEMA_BYTES: usize = 256 * 1024;

    /// Settings for tests and embedding: port 0 and the given data directory.
    pub fn for_data_dir(data_dir: &Path) -> Self {
        Self {
            listen: "127.0.0.1:0".parse().expect("static address"),
            data_dir: data_dir.to_owned(),
            ..Self::from_parts(ServeArgs::default(), FileSettings::default())
        }
    }

    /// Resolves flags/env over the optional file over defaults.
    pub fn resolve(args: ServeArgs) -> anyhow::Result<Self> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading config file {}", path.display()))?;
                toml::from_str(&text).map_err(|err| {
                    anyhow::anyhow!(
                        "parsing config file {}: {}",
                        path.display(),
                        config_error(&text, &err)
                    )
                })?
            }
            None => FileSettings::default(),
        };
        let settings = Self::from_parts(args, file);
        if settings.body_limit_bytes == 0 || settings.callback_response_limit_bytes == 0 {
            anyhow::bail!("body limits must be greater than zero");
        }
        if settings.argument_validation_timeout_ms == 0 {
            anyhow::bail!("the argument validation time budget must be above 0 ms");
        }
        if settings.script_timeout_ms == 0 || settings.script_memory_limit_bytes < 1024 * 1024 {
            anyhow::bail!(
                "script limits too small: the time limit must be above 0 ms and the memory limit at least 1 MiB"
            );
        }
        if settings.header_read_timeout_ms == 0
            || settings.request_body_timeout_ms == 0
            || settings.idle_timeout_ms == 0
            || settings.max_connections == 0
            || settings.max_event_streams_per_account == 0
        {
            anyhow::bail!(
                "connection limits must be greater than zero (header read timeout, request body timeout, idle timeout, max connections, max event streams per account)"
            );
        }
        if settings.llm_base_url.is_some() != settings.llm_model.is_some() {
            anyhow::bail!(
                "a model endpoint needs both --llm-base-url and --llm-model (TOOLGATE_LLM_BASE_URL, TOOLGATE_LLM_MODEL); only one is set"
            );
        }
        if settings.max_runtime_tools == 0
            || settings.max_runtime_tools_per_source == 0
            || settings.max_tool_schema_bytes == 0
        {
            anyhow::bail!("runtime tool limits must be greater than zero");
        }
        Ok(settings)
    }

    fn from_parts(args: ServeArgs, file: FileSettings) -> Self {
        // The flag's value, else the file's, else the default.
        macro_rules! pick {
            ($field:ident, $default:expr) => {
                args.$field.or(file.$field).unwrap_or($default)
            };
        }
        let max_connections = pick!(max_connections, Self::DEFAULT_MAX_CONNECTIONS);
        Self {
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or_else(|| Self::DEFAULT_LISTEN.parse().expect("static address")),
            data_dir: args
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from("./data")),
            database_url: args.database_url.or(file.database_url),
            admin_token: non_empty(args.admin_token, file.admin_token).map(SecretString),
            secrets_key: non_empty(args.secrets_key, file.secrets_key).map(SecretString),
            llm_base_url: non_empty(args.llm_base_url, file.llm_base_url),
            llm_api_key: non_empty(args.llm_api_key, file.llm_api_key).map(SecretString),
            llm_model: non_empty(args.llm_model, file.llm_model),
            llm_first_tool_choice: args
                .llm_first_tool_choice
                .or(file.llm_first_tool_choice)
                .unwrap_or_default(),
            metrics: args.metrics.or(file.metrics).unwrap_or_default(),
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            default_character: args
                .default_character
                .or(file.default_character)
                .unwrap_or_else(|| "Lanlan".to_owned()),
            body_limit_bytes: pick!(body_limit_bytes, Self::DEFAULT_BODY_LIMIT),
            callback_response_limit_bytes: pick!(
                callback_response_limit_bytes,
                Self::DEFAULT_BODY_LIMIT
            ),
            job_workers: args.job_workers.or(file.job_workers).unwrap_or(4),
            // A flag, or the variable however it is spelled, wins over the file.
            enable_unsafe_script_handler: pick!(enable_unsafe_script_handler, false),
            mcp_stdio_for_all_accounts: pick!(mcp_stdio_for_all_accounts, false),
            mcp_private_urls_for_all_accounts: pick!(mcp_private_urls_for_all_accounts, false),
            script_timeout_ms: pick!(script_timeout_ms, Self::DEFAULT_SCRIPT_TIMEOUT_MS),
            argument_validation_timeout_ms: pick!(
                argument_validation_timeout_ms,
                Self::DEFAULT_ARGUMENT_VALIDATION_TIMEOUT_MS
            ),
            script_memory_limit_bytes: pick!(
                script_memory_limit_bytes,
                Self::DEFAULT_SCRIPT_MEMORY_BYTES
            ),
            header_read_timeout_ms: pick!(
                header_read_timeout_ms,
                Self::DEFAULT_HEADER_READ_TIMEOUT_MS
            ),
            request_body_timeout_ms: pick!(
                request_body_timeout_ms,
                Self::DEFAULT_REQUEST_BODY_TIMEOUT_MS
            ),
            idle_timeout_ms: pick!(idle_timeout_ms, Self::DEFAULT_IDLE_TIMEOUT_MS),
            max_connections,
            max_event_streams_per_account: pick!(
                max_event_streams_per_account,
                (max_connections / 4).max(1)
            ),
            max_runtime_tools: pick!(max_runtime_tools, Self::DEFAULT_MAX_RUNTIME_TOOLS),
            max_runtime_tools_per_source: pick!(
                max_runtime_tools_per_source,
                Self::DEFAULT_MAX_RUNTIME_TOOLS_PER_SOURCE
            ),
            max_tool_schema_bytes: pick!(
                max_tool_schema_bytes,
                Self::DEFAULT_MAX_TOOL_SCHEMA_BYTES
            ),
        }
    }
}

/// The flag's value, else the file's; an empty string counts as unset.
fn non_empty(flag: Option<String>, file: Option<String>) -> Option<String> {
    flag.or(file).filter(|value| !value.is_empty())
}

/// Keys of the config file whose values are secrets.
const SECRET_KEYS: [&str; 4] = ["admin_token", "secrets_key", "llm_api_key", "database_url"];

/// A config file's parse error as line, column and reason, never quoting a
/// value: the file holds secrets, and TOML's own message shows the line and,
/// for a value of the wrong type, the value itself.
fn config_error(text: &str, err: &toml::de::Error) -> String {
    let at = err.span().map_or(0, |span| span.start).min(text.len());
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    let line_text = text.lines().nth(line - 1).unwrap_or_default();
    let key = line_text.split('=').next().unwrap_or_default().trim();
    let message = err.message();
    let quotes_a_value =
        message.starts_with("invalid type") || message.starts_with("invalid value");
    let reason = if SECRET_KEYS.contains(&key) || quotes_a_value {
        match message.split_once("expected ") {
            Some((_, expected)) => format!("the value is not valid here (expected {expected})"),
            None => "the value is not valid here".to_owned(),
        }
    } else {
        message.trim().replace('\n', "; ")
    };
    format!("line {line}, column {column}: {reason}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printing_settings_never_shows_a_secret() {
        let mut settings = Settings::for_data_dir(Path::new("/tmp"));
        settings.admin_token = Some("admin-secret-1".into());
        settings.secrets_key = Some("key-secret-2".into());
        settings.llm_api_key = Some("model-secret-3".into());
        let printed = format!("{settings:?}");
        for secret in ["admin-secret-1", "key-secret-2", "model-secret-3"] {
            assert!(!printed.contains(secret), "{secret} printed: {printed}");
        }
        assert!(printed.contains("<redacted>"));
    }

    #[test]
    fn a_config_file_that_does_not_parse_is_refused_without_its_values() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("llm_api_key = sk-live-TOPSECRET-998877\n", "TOPSECRET"),
            ("admin_token = 31415926535897932\n", "31415926535897932"),
            (
                "job_workers = 2\nsecrets_key = \"0123456789abcdef0123456789abcdef\n",
                "0123456789abcdef",
            ),
            ("body_limit_bytes = \"SECRETISH\"\n", "SECRETISH"),
        ];
        for (text, secret) in cases {
            let path = dir.path().join("toolgate.toml");
            std::fs::write(&path, text).unwrap();
            let args = ServeArgs {
                config: Some(path),
                ..ServeArgs::default()
            };
            let refusal = format!("{:#}", Settings::resolve(args).expect_err(text));
            assert!(!refusal.contains(secret), "{text}: {refusal}");
            assert!(refusal.contains("line "), "{text}: {refusal}");
        }
    }

    /// A zero time or count limit would refuse every request (or wait
    /// forever), so each is refused at start-up, naming what is wrong.
    #[test]
    fn a_zero_limit_is_refused_at_start_up() {
        type Set = fn(&mut ServeArgs);
        let zeroes: [(&str, Set); 6] = [
            ("header read timeout", |a| {
                a.header_read_timeout_ms = Some(0)
            }),
            ("request body timeout", |a| {
                a.request_body_timeout_ms = Some(0)
            }),
            ("idle timeout", |a| a.idle_timeout_ms = Some(0)),
            ("max connections", |a| a.max_connections = Some(0)),
            ("max event streams per account", |a| {
                a.max_event_streams_per_account = Some(0)
            }),
            ("body limits", |a| a.body_limit_bytes = Some(0)),
        ];
        for (named, set) in zeroes {
            let mut args = ServeArgs::default();
            set(&mut args);
            let refusal = Settings::resolve(args).expect_err(named).to_string();
            assert!(refusal.contains(named), "{named}: {refusal}");
        }
        assert!(Settings::resolve(ServeArgs::default()).is_ok());
    }

    #[test]
    fn a_model_endpoint_without_its_model_is_refused_at_start_up() {
        for (base_url, model) in [(Some("http://127.0.0.1:9/v1"), None), (None, Some("m"))] {
            let args = ServeArgs {
                llm_base_url: base_url.map(Into::into),
                llm_model: model.map(Into::into),
                ..ServeArgs::default()
            };
            let refusal = Settings::resolve(args)
                .expect_err("half a model")
                .to_string();
            assert!(refusal.contains("--llm-model"), "{refusal}");
        }
    }

    #[test]
    fn an_account_may_hold_a_quarter_of_the_connections_as_streams() {
        let streams = |max_connections| {
            let args = ServeArgs {
                max_connections,
                ..Default::default()
            };
            Settings::resolve(args)
                .unwrap()
                .max_event_streams_per_account
        };
        assert_eq!(streams(None), Settings::DEFAULT_MAX_CONNECTIONS / 4);
        assert_eq!(streams(Some(30)), 7);
        assert_eq!(streams(Some(2)), 1, "never 0");
        let args = ServeArgs {
            max_event_streams_per_account: Some(5),
            ..Default::default()
        };
        assert_eq!(
            Settings::resolve(args)
                .unwrap()
                .max_event_streams_per_account,
            5
        );
    }
}
