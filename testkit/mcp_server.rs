//! `toolgate-test-mcp`: the MCP server the MCP integration tests start, built
//! on rmcp's server side. `stdio` serves on stdin/stdout; `http --listen ADDR`
//! serves streamable HTTP (stateful sessions) at `/mcp` and prints one line
//! `listening http://ADDR/mcp` to stdout once it accepts connections. Logs go
//! to stderr only, because stdout is the stdio transport; the filter comes
//! from `TOOLGATE_TEST_MCP_LOG` (default `info`).
//!
//! Tools: echo, shout, fail, hang, slow_lookup, lookup, destroy, add_tool,
//! crash, env, header, request_headers, calls, with_ref (see `catalog.rs` and
//! `tools.rs`).

mod catalog;
mod handler;
mod stdin_eof;
mod tools;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use axum::extract::Request;
use axum::middleware::Next;
use clap::{Parser, Subcommand};
use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use crate::handler::TestServer;

/// The log filter's variable. Not `RUST_LOG`: a child inherits toolgate's own
/// (tests run it at `info` or `debug`), and rmcp's debug lines carry whole tool
/// results, such as what `env` read.
const LOG_ENV: &str = "TOOLGATE_TEST_MCP_LOG";

/// A scriptable MCP server for toolgate's tests.
#[derive(Debug, Parser)]
#[command(name = "toolgate-test-mcp")]
struct Args {
    #[command(subcommand)]
    mode: Mode,
    /// Paginate `tools/list`: this many tools per page, with `nextCursor`.
    #[arg(long, global = true, value_parser = clap::value_parser!(u64).range(1..))]
    page_size: Option<u64>,
    /// List only these tools at start (comma-separated); default: all.
    #[arg(long, global = true, value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// Complete the handshake, then never answer `tools/list`.
    #[arg(long, global = true)]
    hang_tools_list: bool,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Serve on stdin/stdout.
    Stdio,
    /// Serve streamable HTTP at `/mcp`.
    Http {
        /// Address to listen on; port 0 picks a free one.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // A reader that closes our stderr must not take the server down: without
    // `log_internal_errors(false)` a failed log write reports itself with
    // `eprintln!`, which panics on a closed stderr.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .log_internal_errors(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    // Not `eprintln!`, which panics when stderr is closed.
    let _ = writeln!(
        std::io::stderr(),
        "toolgate-test-mcp started pid={}",
        std::process::id()
    );
    let page_size = args.page_size.map(|size| size as usize);
    let server = TestServer::new(
        initial_tools(args.tools.as_deref())?,
        page_size,
        args.hang_tools_list,
    );
    match args.mode {
        Mode::Stdio => serve_stdio(server).await,
        Mode::Http { listen } => serve_http(server, listen).await,
    }
}

fn initial_tools(names: Option<&[String]>) -> anyhow::Result<Vec<rmcp::model::Tool>> {
    let Some(names) = names else {
        return Ok(catalog::BUILTIN_NAMES
            .iter()
            .filter_map(|name| catalog::builtin(name))
            .collect());
    };
    names
        .iter()
        .map(|name| match catalog::builtin(name) {
            Some(tool) => Ok(tool),
            None => bail!("--tools: unknown tool {name:?}"),
        })
        .collect()
}

async fn serve_stdio(server: TestServer) -> anyhow::Result<()> {
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let stdin = stdin_eof::WatchEof::new(stdin, server.closing().clone());
    let running = server
        .serve((stdin, stdout))
        .await
        .context("stdio handshake")?;
    let reason = running.waiting().await?;
    tracing::info!(?reason, "stdio session ended");
    Ok(())
}

async fn serve_http(server: TestServer, listen: SocketAddr) -> anyhow::Result<()> {
    let recorder = server.clone();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    // Every request's headers, also of those no tool call answers
    // (initialize, notifications, the event stream): `request_headers`.
    let record = axum::middleware::from_fn(move |request: Request, next: Next| {
        recorder.record_request(request.method().as_str(), request.headers());
        next.run(request)
    });
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(record);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    let addr = listener.local_addr()?;
    // Bound means accepting (the kernel queues connections), so the line is
    // printed before serving starts, and flushed: the test is reading a pipe.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening http://{addr}/mcp")?;
    stdout.flush()?;
    drop(stdout);
    axum::serve(listener, router).await.context("serve")
}
