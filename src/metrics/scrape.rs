//! The scrape: the recorded series plus the values read at scrape time
//! (registry sizes, live model sessions, jobs, MCP connection states, pool)
//! and the top-50 tool-name counter, as one OpenMetrics text.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::metrics;

/// Values read when Prometheus scrapes.
#[derive(Debug, Default, Clone)]
pub struct ScrapeSnapshot {
    /// Remote tools registered, by role (character).
    pub remote_tools_by_role: Vec<(String, u64)>,
    pub live_model_sessions: u64,
    /// Runtime jobs, by state.
    pub jobs_by_state: Vec<(String, u64)>,
    /// Age of the oldest claimable (queued) job, seconds; 0 when none.
    pub oldest_claimable_job_seconds: f64,
    /// Attached MCP servers, by connection state.
    pub mcp_servers_by_state: Vec<(String, u64)>,
    pub db_connections: u64,
    pub db_idle_connections: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
}

fn gauge(value: i64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(value);
    gauge
}

fn by_label<L, F>(values: &[(String, u64)], label: F) -> Family<L, Gauge>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    F: Fn(String) -> L,
{
    let family = Family::<L, Gauge>::default();
    for (name, value) in values {
        family
            .get_or_create(&label(name.clone()))
            .set(*value as i64);
    }
    family
}

fn snapshot_registry(snapshot: &ScrapeSnapshot) -> Registry {
    let mut r = Registry::with_prefix("toolgate");
    r.register(
        "remote_tools",
        "Remote tools registered through /api/tools, by role",
        by_label(&snapshot.remote_tools_by_role, |role| RoleLabels { role }),
    );
    r.register(
        "live_model_sessions",
        "Live model sessions (event-stream subscribers and running generations)",
        gauge(snapshot.live_model_sessions as i64),
    );
    r.register(
        "runtime_jobs",
        "Runtime (async tool) jobs, by state",
        by_label(&snapshot.jobs_by_state, |state| StateLabels { state }),
    );
    let oldest = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    oldest.set(snapshot.oldest_claimable_job_seconds);
    r.register(
        "oldest_claimable_job_age_seconds",
        "Queue age of the oldest claimable job",
        oldest,
    );
    r.register(
        "mcp_servers",
        "Attached MCP servers, by connection state",
        by_label(&snapshot.mcp_servers_by_state, |state| StateLabels {
            state,
        }),
    );
    r.register(
        "db_connections",
        "Open database connections",
        gauge(snapshot.db_connections as i64),
    );
    r.register(
        "db_idle_connections",
        "Idle database connections",
        gauge(snapshot.db_idle_connections as i64),
    );
    let by_tool = Family::<ToolLabels, Counter>::default();
    let (top, rest) = metrics().tool_volume.top();
    for (tool, count) in top {
        by_tool.get_or_create(&ToolLabels { tool }).inc_by(count);
    }
    if rest > 0 {
        by_tool
            .get_or_create(&ToolLabels {
                tool: "other".into(),
            })
            .inc_by(rest);
    }
    r.register(
        "open_tool_calls",
        "Calls of remote and MCP tools by name: the 50 busiest, the rest as tool=\"other\"",
        by_tool,
    );
    r
}

/// The whole scrape as OpenMetrics text.
pub fn render(snapshot: &ScrapeSnapshot) -> String {
    let mut recorded = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut recorded, &metrics().registry);
    let mut scraped = String::new();
    let _ = encode(&mut scraped, &snapshot_registry(snapshot));
    // Each encoding ends with the `# EOF` marker; the joined text has one.
    let recorded = recorded.strip_suffix("# EOF\n").unwrap_or(&recorded);
    format!("{recorded}{scraped}")
}
