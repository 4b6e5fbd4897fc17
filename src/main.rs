//! The `toolgate` binary: parse settings, build the app, serve.

use std::io::IsTerminal;

use clap::Parser;
use toolgate::app::{App, shutdown_signal};
use toolgate::config::{Cli, Command, LogFormat, Settings};
use toolgate::logging::LogOutput;
use toolgate::telemetry::Telemetry;

/// mimalloc instead of glibc's malloc: under load the server's threads
/// (tokio workers, the journal thread, the blocking pool) allocate and free
/// each other's memory, and glibc's arena locks showed as futex wake-ups in
/// the profile (BENCHMARKS.md, issue 20).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let settings = Settings::resolve(*args)?;
            let (telemetry, log_output) = init_tracing(settings.log_format);
            tokio::spawn(
                log_output
                    .dropped
                    .clone()
                    .warn_every(std::time::Duration::from_secs(10)),
            );
            if toolgate::telemetry::spans_exported() {
                tracing::info!("traces are exported over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT)");
            }
            // Before anything says it is ready: a signal from then on is a
            // graceful stop, never the default kill.
            let shutdown = shutdown_signal();
            let app = App::build(settings).await?;
            if let Some(key) = &app.bootstrap.generated_key {
                println!(
                    "toolgate: created the default account; its API key (shown once, also saved to the data directory as admin-token): {key}"
                );
            }
            // Printed before the main address, so a reader that stops at
            // that line has seen it.
            if let Some(metrics) = app.metrics_addr() {
                tracing::info!(%metrics, "metrics listening");
                println!("toolgate metrics on http://{metrics}/metrics");
            }
            let addr = app.local_addr();
            tracing::info!(%addr, "listening");
            // Tests and scripts read this line to learn the bound port.
            println!("toolgate listening on http://{addr}");
            let served = app.run(shutdown).await;
            log_output.dropped.warn_if_newly_dropped();
            // Flushing blocks on the exporter's HTTP client.
            let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
            // Writes the log lines still queued before the process ends.
            drop(log_output);
            served
        }
        Command::Migrate(args) => toolgate::operator::migrate(args).await,
        Command::ForgetSecrets(args) => toolgate::operator::forget_secrets(args).await,
        Command::Doctor(args) => {
            if toolgate::operator::doctor(args).await? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
    }
}

/// What is logged without `RUST_LOG`. rmcp logs every notification an MCP
/// server sends, payload and all, at `info` (and each bad line of a stream at
/// `warn`): a server an account attaches could fill the disk through it.
/// toolgate logs what matters of its connections itself.
const DEFAULT_LOG_FILTER: &str = "info,sqlx=warn,rmcp=off";

/// The filter directives for `RUST_LOG`'s value: the default without one,
/// and rmcp kept off unless the value names rmcp itself (an operator who
/// raises the level to `info` for toolgate's lines must not let every MCP
/// server's notices through with them).
fn log_filter_spec(rust_log: Option<&str>) -> String {
    match rust_log.map(str::trim) {
        None | Some("") => DEFAULT_LOG_FILTER.to_owned(),
        Some(spec) if spec.contains("rmcp") => spec.to_owned(),
        Some(spec) => format!("{spec},rmcp=off"),
    }
}

fn init_tracing(format: LogFormat) -> (Telemetry, LogOutput) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter_spec(rust_log.as_deref()))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // Escape codes are noise in a log file or a pipe to a collector; NO_COLOR
    // is honoured on a terminal, as the library would by default.
    let colour = format == LogFormat::Text
        && std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let (writer, output) = toolgate::logging::stderr_off_thread(colour);
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let telemetry = match format {
        LogFormat::Text => toolgate::telemetry::init(fmt.with_ansi(colour), filter),
        LogFormat::Json => toolgate::telemetry::init(fmt.json().with_ansi(false), filter),
    };
    (telemetry, output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmcp_stays_off_unless_rust_log_names_it() {
        assert_eq!(log_filter_spec(None), DEFAULT_LOG_FILTER);
        assert_eq!(log_filter_spec(Some(" ")), DEFAULT_LOG_FILTER);
        assert_eq!(log_filter_spec(Some("info")), "info,rmcp=off");
        assert_eq!(
            log_filter_spec(Some("debug,sqlx=info")),
            "debug,sqlx=info,rmcp=off"
        );
        assert_eq!(log_filter_spec(Some("info,rmcp=info")), "info,rmcp=info");
    }
}
