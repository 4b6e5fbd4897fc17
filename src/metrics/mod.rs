//! Prometheus metrics: the process-wide registry every layer records into,
//! and the `/metrics` rendering. Label sets are bounded by construction:
//! providers, statuses, routes and builtin tool names are closed sets; the
//! names of remote and MCP tools are open, so they label one counter only,
//! rendered at scrape time for the 50 busiest names with the rest summed as
//! `tool="other"`.

mod scrape;
mod tool_volume;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use scrape::{ScrapeSnapshot, render};
use tool_volume::ToolVolume;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of a tool call: the journal's own provider type and status values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub provider_type: &'static str,
    pub status: &'static str,
}

/// Labels of a call duration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider_type: &'static str,
}

/// A builtin tool (a closed set of names).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuiltinLabels {
    pub tool: &'static str,
}

/// A remote tool's source tag: the first [`MAX_SOURCE_SERIES`] sources seen
/// by their own name, any later one as [`OTHER_SOURCES`], since sources come
/// and go with registrations and a process may see any number of them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: String,
}

/// An HTTP request: the matched route template, the method and the status class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub route: String,
    pub method: &'static str,
    pub status_class: &'static str,
}

/// An HTTP route's latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

/// A limit a sandboxed script ran into.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub kind: &'static str,
}

/// How a model request ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

type Timings<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds from 0.25 ms to about 8 s, doubling.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

/// Seconds from 50 ms to about 100 s, doubling (model requests).
fn slow_latency() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 12))
}

/// Rows per journal batch, 1 to 512.
fn batch_sizes() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 10))
}

/// Seconds from 10 µs to about 5 s, doubling (waits for a pooled connection,
/// mostly far under the call latencies' first bucket).
fn short_waits() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 2.0, 20))
}

/// How many sources get series of their own.
pub const MAX_SOURCE_SERIES: usize = 100;
/// The label of every source past [`MAX_SOURCE_SERIES`].
pub const OTHER_SOURCES: &str = "_other";

/// Every series this process records outside scrape time.
pub struct Metrics {
    enabled: AtomicBool,
    registry: Registry,
    pub tool_calls: Family<CallLabels, Counter>,
    pub tool_call_seconds: Timings<ProviderLabels>,
    pub builtin_call_seconds: Timings<BuiltinLabels>,
    tool_volume: ToolVolume,
    pub callback_connect_failures: Family<SourceLabels, Counter>,
    pub evictions: Family<SourceLabels, Counter>,
    /// The sources that have series of their own.
    sources: std::sync::Mutex<std::collections::HashSet<String>>,
    pub journal_batch_rows: Histogram,
    pub journal_commit_seconds: Histogram,
    pub journal_fold_raises: Counter,
    pub db_pool_acquire_seconds: Histogram,
    pub job_lease_losses: Counter,
    pub script_runs: Counter,
    pub script_limits: Family<LimitLabels, Counter>,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_request_seconds: Timings<RouteLabels>,
    pub mcp_reconnects: Counter,
    pub model_requests: Family<OutcomeLabels, Counter>,
    pub model_tokens: Counter,
    pub model_request_seconds: Histogram,
}

impl Metrics {
    fn new() -> Self {
        let mut m = Self {
            enabled: AtomicBool::new(true),
            registry: Registry::with_prefix("toolgate"),
            tool_calls: Family::default(),
            tool_call_seconds: Family::new_with_constructor(latency),
            builtin_call_seconds: Family::new_with_constructor(latency),
            tool_volume: ToolVolume::default(),
            callback_connect_failures: Family::default(),
            evictions: Family::default(),
            sources: Default::default(),
            journal_batch_rows: batch_sizes(),
            journal_commit_seconds: latency(),
            journal_fold_raises: Counter::default(),
            db_pool_acquire_seconds: short_waits(),
            job_lease_losses: Counter::default(),
            script_runs: Counter::default(),
            script_limits: Family::default(),
            http_requests: Family::default(),
            http_request_seconds: Family::new_with_constructor(latency),
            mcp_reconnects: Counter::default(),
            model_requests: Family::default(),
            model_tokens: Counter::default(),
            model_request_seconds: slow_latency(),
        };
        m.register();
        m.register_internals();
        m
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        r.register(
            "tool_calls",
            "Tool calls decided, by provider type and journal status",
            self.tool_calls.clone(),
        );
        r.register(
            "tool_call_duration_seconds",
            "Time from a call's arrival to its journalled result, by provider type",
            self.tool_call_seconds.clone(),
        );
        r.register(
            "builtin_call_duration_seconds",
            "Duration of builtin tool calls, by tool",
            self.builtin_call_seconds.clone(),
        );
        r.register(
            "callback_connect_failures",
            "Remote callbacks that could not connect (refused or connect timeout), by source",
            self.callback_connect_failures.clone(),
        );
        r.register(
            "plugin_evictions",
            "Plugin origins evicted after consecutive connect failures, by source",
            self.evictions.clone(),
        );
    }

    fn register_internals(&mut self) {
        let r = &mut self.registry;
        r.register(
            "journal_batch_rows",
            "Journal rows written per batch by the journal writer",
            self.journal_batch_rows.clone(),
        );
        r.register(
            "journal_commit_duration_seconds",
            "Time of one journal writer batch commit",
            self.journal_commit_seconds.clone(),
        );
        r.register(
            "journal_fold_raises",
            "Times the journal thread was raised from the background scheduling class (SCHED_IDLE) because a read, a write or the fold backlog needed it",
            self.journal_fold_raises.clone(),
        );
        r.register(
            "db_pool_acquire_duration_seconds",
            "Time a database statement or transaction waited for a connection from the SQLite pool",
            self.db_pool_acquire_seconds.clone(),
        );
        r.register(
            "job_lease_losses",
            "Runtime jobs whose lease was lost while running (they end uncertain)",
            self.job_lease_losses.clone(),
        );
        r.register(
            "script_runs",
            "Sandboxed script-handler runs",
            self.script_runs.clone(),
        );
        r.register(
            "script_limit_hits",
            "Script runs stopped by a sandbox limit, by kind (time, memory, stack, output)",
            self.script_limits.clone(),
        );
        r.register(
            "http_requests",
            "HTTP requests answered, by matched route, method and status class",
            self.http_requests.clone(),
        );
        r.register(
            "http_request_duration_seconds",
            "HTTP request latency, by matched route",
            self.http_request_seconds.clone(),
        );
        r.register(
            "mcp_reconnects",
            "MCP server connections re-established after a loss",
            self.mcp_reconnects.clone(),
        );
        r.register(
            "model_requests",
            "Chat-completion requests of the generation loop, by outcome",
            self.model_requests.clone(),
        );
        r.register(
            "model_stream_deltas",
            "Text deltas (streamed tokens) received from the model",
            self.model_tokens.clone(),
        );
        r.register(
            "model_request_duration_seconds",
            "Time of one chat-completion request, retries included",
            self.model_request_seconds.clone(),
        );
    }

    /// Whether recording is on (`--metrics off` turns it off for comparison).
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Records one decided call. `tool` is counted by name only for open
    /// providers (remote, MCP), where it feeds the top-50 counter.
    pub fn record_call(
        &self,
        provider_type: &'static str,
        status: &'static str,
        tool: &str,
        builtin: Option<&'static str>,
        elapsed: Duration,
    ) {
        if !self.enabled() {
            return;
        }
        let seconds = elapsed.as_secs_f64();
        self.tool_calls
            .get_or_create(&CallLabels {
                provider_type,
                status,
            })
            .inc();
        self.tool_call_seconds
            .get_or_create(&ProviderLabels { provider_type })
            .observe(seconds);
        match builtin {
            Some(tool) => self
                .builtin_call_seconds
                .get_or_create(&BuiltinLabels { tool })
                .observe(seconds),
            None if matches!(provider_type, "remote" | "mcp") => self.tool_volume.count(tool),
            None => {}
        }
    }

    /// Records one answered HTTP request.
    pub fn record_http(&self, route: &str, method: &'static str, status: u16, elapsed: Duration) {
        if !self.enabled() {
            return;
        }
        let status_class = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.http_requests
            .get_or_create(&HttpLabels {
                route: route.to_owned(),
                method,
                status_class,
            })
            .inc();
        self.http_request_seconds
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Records how long taking a pooled database connection waited.
    pub fn record_pool_wait(&self, waited: Duration) {
        if self.enabled() {
            self.db_pool_acquire_seconds.observe(waited.as_secs_f64());
        }
    }

    /// Counts a source's connect failure.
    pub fn record_connect_failure(&self, source: &str) {
        if self.enabled() {
            self.callback_connect_failures
                .get_or_create(&self.source_labels(source))
                .inc();
        }
    }

    /// Counts an eviction of a source's origin.
    pub fn record_eviction(&self, source: &str) {
        if self.enabled() {
            self.evictions
                .get_or_create(&self.source_labels(source))
                .inc();
        }
    }

    /// The labels of `source`'s series, within [`MAX_SOURCE_SERIES`].
    fn source_labels(&self, source: &str) -> SourceLabels {
        let mut sources = self.sources.lock().expect("metrics sources lock");
        let own = sources.contains(source)
            || (sources.len() < MAX_SOURCE_SERIES && sources.insert(source.to_owned()));
        SourceLabels {
            source: if own { source } else { OTHER_SOURCES }.to_owned(),
        }
    }

    /// Counts a script stopped by `kind` of limit.
    pub fn record_script_limit(&self, kind: &'static str) {
        if self.enabled() {
            self.script_limits
                .get_or_create(&LimitLabels { kind })
                .inc();
        }
    }

    /// Records one model request.
    pub fn record_model_request(&self, outcome: &'static str, deltas: u64, elapsed: Duration) {
        if self.enabled() {
            self.model_requests
                .get_or_create(&OutcomeLabels { outcome })
                .inc();
            self.model_tokens.inc_by(deltas);
            self.model_request_seconds.observe(elapsed.as_secs_f64());
        }
    }
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    METRICS.get_or_init(Metrics::new)
}

/// Turns recording on or off for the whole process (start-up setting).
pub fn set_enabled(enabled: bool) {
    metrics().enabled.store(enabled, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_past_the_limit_share_one_series() {
        let metrics = Metrics::new();
        for n in 0..MAX_SOURCE_SERIES {
            let source = format!("plugin:{n}");
            assert_eq!(metrics.source_labels(&source).source, source);
        }
        assert_eq!(metrics.source_labels("plugin:late").source, OTHER_SOURCES);
        assert_eq!(metrics.source_labels("plugin:0").source, "plugin:0");
    }
}
