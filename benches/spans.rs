//! What toolgate's per-call spans cost on the call path: the `http_request`
//! span (adopting the caller's `traceparent`), its `tool_call` child with the
//! fields the server records, entered as the call runs, and the trace context
//! written into the outgoing request (a callback's `traceparent` header, or an
//! MCP call's `_meta` and header) — built by the same functions the server
//! uses (`toolgate::telemetry`), under the same subscriber stacks: the `fmt`
//! layer at `info,sqlx=warn` writing into a sink, and the trace spans' ids
//! (the server without an exporter) or the OpenTelemetry layer (with one).
//! Once without any subscriber (the spans are disabled), once with the log
//! layer alone, once with the ids layer beside it (the server's default:
//! what the ids add is the difference), once with the OpenTelemetry layer and
//! no exporter (what the default stack replaced), once with a batch processor
//! over an exporter that drops what it is given (what exporting adds to the
//! call path; the export's own encoding and HTTP run on the processor's
//! thread). Run with `cargo bench --bench spans`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use toolgate::telemetry::{
    current_fields, inject_carried_or_root, inject_current, otel_layer, request_span,
    span_ids_layer, tool_call_span,
};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

const CALLER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Takes every batch and drops it, counting the spans.
#[derive(Debug, Default)]
struct DroppingExporter {
    spans: AtomicU64,
}

impl SpanExporter for DroppingExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.spans.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// The server's log layer: `fmt` at its default filter, into a sink.
fn log_layer<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::sink)
        .with_filter(tracing_subscriber::EnvFilter::new("info,sqlx=warn"))
}

/// The server's subscriber stack without an exporter.
fn default_subscriber() -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::registry()
        .with(log_layer())
        .with(span_ids_layer())
}

/// The server's subscriber stack over `provider`, when spans are exported.
fn subscriber(provider: &SdkTracerProvider) -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::registry()
        .with(log_layer())
        .with(otel_layer(provider))
}

/// One call's spans and its callback's `traceparent`.
fn remote_call(incoming: &http::HeaderMap) -> http::HeaderMap {
    let request = request_span(&http::Method::POST, "/sessions/s1/tool-calls", incoming);
    let _request = request.enter();
    let call = tool_call_span(
        "sess_01JD0000000000000000000000",
        "weather_lookup",
        "narrator",
    );
    let _call = call.enter();
    let mut callback = http::HeaderMap::new();
    inject_current(&mut callback);
    call.record("provider", "remote");
    call.record("status", "success");
    call.record("execution_id", "texec_01JD0000000000000000000000");
    callback
}

/// One MCP call's spans, `_meta` fields and the transport's header.
fn mcp_call(incoming: &http::HeaderMap) -> http::HeaderMap {
    let request = request_span(&http::Method::POST, "/sessions/s1/tool-calls", incoming);
    let _request = request.enter();
    let call = tool_call_span("sess_01JD0000000000000000000000", "m_lookup", "narrator");
    let _call = call.enter();
    let meta: HashMap<String, String> = current_fields();
    let mut post = http::HeaderMap::new();
    inject_carried_or_root(&meta, &mut post);
    call.record("provider", "mcp");
    call.record("status", "success");
    call.record("execution_id", "texec_01JD0000000000000000000000");
    post
}

fn spans(c: &mut Criterion) {
    let mut incoming = http::HeaderMap::new();
    incoming.insert("traceparent", http::HeaderValue::from_static(CALLER));

    c.bench_function("spans/remote_call/no_subscriber", |b| {
        b.iter(|| std::hint::black_box(remote_call(&incoming)))
    });

    // The log layer alone: what the spans cost without OpenTelemetry.
    tracing::subscriber::with_default(tracing_subscriber::registry().with(log_layer()), || {
        c.bench_function("spans/remote_call/log_layer_only", |b| {
            b.iter(|| std::hint::black_box(remote_call(&incoming)))
        });
    });

    tracing::subscriber::with_default(default_subscriber(), || {
        let callback = remote_call(&incoming);
        let traceparent = callback["traceparent"].to_str().expect("ASCII");
        assert!(
            traceparent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "the default stack joins the caller's trace: {traceparent}"
        );
        c.bench_function("spans/remote_call/default", |b| {
            b.iter(|| std::hint::black_box(remote_call(&incoming)))
        });
        c.bench_function("spans/mcp_call/default", |b| {
            b.iter(|| std::hint::black_box(mcp_call(&incoming)))
        });
    });

    let plain = SdkTracerProvider::builder().build();
    tracing::subscriber::with_default(subscriber(&plain), || {
        c.bench_function("spans/remote_call/otel_no_exporter", |b| {
            b.iter(|| std::hint::black_box(remote_call(&incoming)))
        });
    });

    let exporting = SdkTracerProvider::builder()
        .with_batch_exporter(DroppingExporter::default())
        .build();
    tracing::subscriber::with_default(subscriber(&exporting), || {
        c.bench_function("spans/remote_call/batch_exporter", |b| {
            b.iter(|| std::hint::black_box(remote_call(&incoming)))
        });
    });
    let _ = exporting.shutdown();
}

criterion_group!(benches, spans);
criterion_main!(benches);
