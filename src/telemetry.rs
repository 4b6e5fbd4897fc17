//! Traces: the tracing subscriber (log lines, plus OpenTelemetry spans), the
//! OTLP export when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and W3C trace
//! context in and out. Every span has an OpenTelemetry context even without
//! an exporter, so the `traceparent` sent with each callback lets a plugin's
//! own trace join the call's; only the export is off.

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The installed tracer provider; shut down (flushed) at exit.
pub struct Telemetry {
    provider: SdkTracerProvider,
    exporting: bool,
}

impl Telemetry {
    /// Whether spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.exporting
    }

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

/// Installs the global subscriber: `fmt` (the given writer and filter) for
/// log lines, and the OpenTelemetry layer for this crate's spans.
pub fn init<W>(fmt_layer: W, filter: tracing_subscriber::EnvFilter) -> Telemetry
where
    W: Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let (provider, exporting) = provider();
    let tracer = provider.tracer("toolgate");
    // Only the spans made for traces (requests, tool calls), whatever RUST_LOG says.
    let spans = tracing_subscriber::filter::Targets::new()
        .with_target("toolgate::trace", tracing::Level::INFO);
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(spans);
    tracing_subscriber::registry()
        .with(fmt_layer.with_filter(filter))
        .with(otel)
        .init();
    Telemetry {
        provider,
        exporting,
    }
}

/// Writes the current span's W3C `traceparent` (and `tracestate`) into
/// `headers` of an outgoing request.
pub fn inject_current(headers: &mut http::HeaderMap) {
    let context = tracing::Span::current().context();
    TraceContextPropagator::new()
        .inject_context(&context, &mut opentelemetry_http::HeaderInjector(headers));
}

/// Makes `span` a child of the trace an incoming request names in its
/// `traceparent`, if it names one.
pub fn adopt_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    let parent =
        TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    if opentelemetry::trace::TraceContextExt::has_active_span(&parent) {
        let _ = span.set_parent(parent);
    }
}
