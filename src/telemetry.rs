//! Traces: the tracing subscriber (log lines, plus OpenTelemetry spans when
//! they are exported), the OTLP export when `OTEL_EXPORTER_OTLP_ENDPOINT` is
//! set, and W3C trace context in and out. Every trace span has a trace
//! context even without an exporter ([`span_ids`] gives it one), so the
//! `traceparent` sent with each callback lets a plugin's own trace join the
//! call's; only the export is off. The spans themselves are built here too,
//! so the criterion bench measures the ones the server makes.

mod span_ids;

use std::collections::HashMap;
use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context as LayerContext, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// Whether the installed subscriber exports spans (set once, by [`init`]).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans leave the process (over OTLP): fields that only an exported span shows
/// need not be recorded otherwise.
pub fn spans_exported() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The installed tracer provider; shut down (flushed) at exit.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Flushes the spans still buffered (blocking: call off the async workers).
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            eprintln!("toolgate: flushing traces failed: {error}");
        }
    }
}

/// Whether the environment asks for an OTLP export.
fn export_configured() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()))
}

/// The tracer provider: with a batch OTLP exporter when configured, else
/// none (spans get ids for propagation but go nowhere).
fn provider() -> (SdkTracerProvider, bool) {
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("toolgate")
        .build();
    let builder = SdkTracerProvider::builder().with_resource(resource);
    if !export_configured() {
        return (builder.build(), false);
    }
    match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(exporter) => (builder.with_batch_exporter(exporter).build(), true),
        Err(error) => {
            eprintln!(
                "toolgate: the OTLP exporter could not be built, traces are not exported: {error}"
            );
            (builder.build(), false)
        }
    }
}

/// The spans traced, whatever `RUST_LOG` says: the `toolgate::trace` target
/// (requests, tool calls).
fn trace_spans() -> AskedEachTime {
    AskedEachTime(Targets::new().with_target("toolgate::trace", tracing::Level::INFO))
}

/// The OpenTelemetry layer: the trace spans, traced by `provider` (installed
/// when spans are exported).
pub fn otel_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let spans = trace_spans();
    // Neither the OpenTelemetry context as "current" while a span is entered
    // (nothing here reads `Context::current`: the traceparent is taken from
    // the span itself) nor busy/idle times: both cost clock reads and
    // thread-local work on every poll of every instrumented future, the
    // event streams' included (BENCHMARKS.md, issue 20).
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("toolgate"))
        .with_context_activation(false)
        .with_tracked_inactivity(false)
        .with_filter(spans)
}

/// A per-layer filter that never lets a callsite skip the question.
///
/// tracing-subscriber's per-layer filters leave, in a thread-local, which
/// filters refused the last span or event asked about, and the next span or
/// event consumes it. A question that nothing follows leaves it behind: sqlx
/// asks after each statement whether its query log is on (`log_enabled!`,
/// refused under `sqlx=warn`), on the async workers on PostgreSQL. A callsite
/// that every filter enables `always` is not asked again, so it consumed that
/// leftover: the next request span on the worker was recorded as refused, its
/// lines were logged without it and OpenTelemetry never saw it
/// (tests/log_span_context.rs). With this filter no callsite is `always` for
/// both layers, so every span and event is asked about first: a target
/// match per span, within the noise of a remote call's instructions
/// (BENCHMARKS.md, issue 20, twentieth look).
struct AskedEachTime(Targets);

// `Targets` is a `Layer` too, whose methods share these names: each call
// names the `Filter` it means.
impl<S> Filter<S> for AskedEachTime {
    fn enabled(&self, metadata: &tracing::Metadata<'_>, cx: &LayerContext<'_, S>) -> bool {
        Filter::<S>::enabled(&self.0, metadata, cx)
    }

    fn callsite_enabled(&self, metadata: &'static tracing::Metadata<'static>) -> Interest {
        match Filter::<S>::callsite_enabled(&self.0, metadata) {
            interest if interest.is_always() => Interest::sometimes(),
            interest => interest,
        }
    }

    /// Passed on: without a hint the global maximum level would be `TRACE`,
    /// and every `trace!` in the process would ask the filters.
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Filter::<S>::max_level_hint(&self.0)
    }
}

/// The layer that gives the trace spans their W3C ids only (installed when
/// nothing exports them).
pub fn span_ids_layer<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    span_ids::SpanIdsLayer.with_filter(trace_spans())
}

/// Installs the global subscriber: `fmt` (the given writer and filter) for
/// log lines, and for this crate's trace spans the OpenTelemetry layer when
/// they are exported, else only their ids.
pub fn init<W>(fmt_layer: W, filter: tracing_subscriber::EnvFilter) -> Telemetry
where
    W: Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let (provider, exporting) = provider();
    EXPORTING.store(exporting, Ordering::Relaxed);
    tracing_subscriber::registry()
        .with(fmt_layer.with_filter(filter))
        .with(exporting.then(|| otel_layer(&provider)))
        .with((!exporting).then(span_ids_layer))
        .init();
    Telemetry { provider }
}

/// `span`'s trace context, from whichever layer traces it.
fn context_of(span: &tracing::Span) -> opentelemetry::Context {
    match span_ids::of(span) {
        Some(ids) => opentelemetry::Context::new().with_remote_span_context(ids),
        None => span.context(),
    }
}

/// The span of one HTTP request, a child of the caller's trace when its
/// headers name one (the path is a field, escaped, never message text).
pub fn request_span(method: &http::Method, path: &str, headers: &http::HeaderMap) -> tracing::Span {
    let span = tracing::info_span!(
        target: "toolgate::trace",
        "http_request",
        http.method = %method,
        url.path = ?path,
    );
    adopt_parent(&span, headers);
    span
}

/// The span of one tool call; `provider`, `status` and `execution_id` are
/// recorded once the call is decided, when spans are exported: no log line
/// of the call follows that point, so only an exported span shows them, and
/// recording them costs every call about 2 % of its instructions (BENCHMARKS.md,
/// issue 20, thirteenth pass).
pub fn tool_call_span(session_id: &str, tool: &str, caller_slot: impl Display) -> tracing::Span {
    tracing::info_span!(
        target: "toolgate::trace",
        "tool_call",
        session_id = %session_id,
        tool = ?tool,
        caller_slot = %caller_slot,
        provider = tracing::field::Empty,
        status = tracing::field::Empty,
        execution_id = tracing::field::Empty,
    )
}

/// Writes the current span's W3C `traceparent` (and `tracestate`) into
/// `headers` of an outgoing request.
pub fn inject_current(headers: &mut http::HeaderMap) {
    let context = context_of(&tracing::Span::current());
    TraceContextPropagator::new()
        .inject_context(&context, &mut opentelemetry_http::HeaderInjector(headers));
}

/// Makes `span` a child of the trace an incoming request names in its
/// `traceparent`, if it names one.
pub fn adopt_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    let parent =
        TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    if parent.has_active_span() && !span_ids::adopt(span, parent.span().span_context()) {
        let _ = span.set_parent(parent);
    }
}

/// The current span's W3C trace context as named values (`traceparent`,
/// `tracestate`), for a message that carries it itself, such as an MCP
/// request's `_meta` (SEP-414); empty when no span context is current.
pub fn current_fields() -> HashMap<String, String> {
    let mut fields = HashMap::new();
    TraceContextPropagator::new()
        .inject_context(&context_of(&tracing::Span::current()), &mut fields);
    fields
}

/// Writes `traceparent` (and `tracestate`) into `headers` of a request sent
/// where the caller's span is not current, such as a transport's own task:
/// the context `carried` names when it is valid, else the current span's,
/// else a fresh root, so that every request carries one.
pub fn inject_carried_or_root(carried: &HashMap<String, String>, headers: &mut http::HeaderMap) {
    let propagator = TraceContextPropagator::new();
    let mut context = propagator.extract(carried);
    if !context.has_active_span() {
        context = context_of(&tracing::Span::current());
    }
    if !context.has_active_span() {
        context = fresh_root();
    }
    propagator.inject_context(&context, &mut opentelemetry_http::HeaderInjector(headers));
}

/// A context naming a new trace that no span of this process recorded.
fn fresh_root() -> opentelemetry::Context {
    opentelemetry::Context::new().with_remote_span_context(span_ids::new_root())
}
