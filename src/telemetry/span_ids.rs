//! W3C trace ids for the trace spans when nothing exports them.
//!
//! Without an exporter, the only use of a span's OpenTelemetry context is
//! the `traceparent` that each callback and MCP request carries. The
//! OpenTelemetry layer builds a whole span for it all the same (its
//! attributes formatted into strings, a span object made and dropped at the
//! close): about 10 of toolgate's 60 µs of CPU per loaded remote call
//! (BENCHMARKS.md, issue 20, twenty-second pass). This layer gives each
//! trace span only its ids, as the OpenTelemetry SDK with its default
//! sampler would: a child of the nearest trace span, or of the caller's
//! trace once [`adopt`]ed, or a new sampled trace.

use opentelemetry::trace::{SpanContext, TraceFlags, TraceState};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use tracing::span::{Attributes, Id};
use tracing_subscriber::Layer;
use tracing_subscriber::Registry;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// A trace span's context, kept in its extensions.
struct SpanIds(SpanContext);

/// The layer that gives trace spans their ids (filter it to the trace spans).
pub(super) struct SpanIdsLayer;

impl<S> Layer<S> for SpanIdsLayer
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    fn on_new_span(&self, _attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        // The layer's filter admits trace spans only, and a span's parent
        // as this layer sees it is the nearest trace span above it.
        let parent = span.parent().and_then(|parent| {
            parent
                .extensions()
                .get::<SpanIds>()
                .map(|ids| ids.0.clone())
        });
        let context = match parent {
            Some(parent) => child_of(&parent, RandomIdGenerator::default().new_span_id()),
            None => new_root(),
        };
        span.extensions_mut().insert(SpanIds(context));
    }
}

/// The first span of a new trace, flagged sampled like every span here (the
/// sampler keeps all), so that a plugin sampling by its parent keeps its own
/// trace of the request.
pub(super) fn new_root() -> SpanContext {
    let ids = RandomIdGenerator::default();
    SpanContext::new(
        ids.new_trace_id(),
        ids.new_span_id(),
        TraceFlags::SAMPLED,
        false,
        TraceState::NONE,
    )
}

/// A span of `parent`'s trace, sampled as it is, as the SDK's parent-based
/// sampler decides.
fn child_of(parent: &SpanContext, span_id: opentelemetry::trace::SpanId) -> SpanContext {
    SpanContext::new(
        parent.trace_id(),
        span_id,
        parent.trace_flags(),
        false,
        parent.trace_state().clone(),
    )
}

/// The context of `span`, or of the nearest trace span above it; `None` when
/// no trace span encloses it or this layer is not installed.
pub(super) fn of(span: &tracing::Span) -> Option<SpanContext> {
    span.with_subscriber(|(id, dispatch)| {
        let registry = dispatch.downcast_ref::<Registry>()?;
        registry
            .span(id)?
            .scope()
            .find_map(|span| span.extensions().get::<SpanIds>().map(|ids| ids.0.clone()))
    })
    .flatten()
}

/// Makes `span` a child of `remote` (an incoming request's `traceparent`),
/// keeping its own span id. False when `span` has no ids of this layer's
/// (the OpenTelemetry layer traces it instead).
pub(super) fn adopt(span: &tracing::Span, remote: &SpanContext) -> bool {
    span.with_subscriber(|(id, dispatch)| {
        let Some(span) = dispatch
            .downcast_ref::<Registry>()
            .and_then(|registry| registry.span(id))
        else {
            return false;
        };
        let mut extensions = span.extensions_mut();
        match extensions.get_mut::<SpanIds>() {
            Some(ids) => {
                ids.0 = child_of(remote, ids.0.span_id());
                true
            }
            None => false,
        }
    })
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{SpanId, TraceId};
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// The server's stack without an exporter: a log layer that takes every
    /// span at `info` (so that spans of other targets exist), and this one.
    fn with_layer(test: impl FnOnce()) {
        let log = tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(tracing::level_filters::LevelFilter::INFO);
        let subscriber = tracing_subscriber::registry()
            .with(log)
            .with(super::super::span_ids_layer());
        tracing::subscriber::with_default(subscriber, test);
    }

    /// A caller's span context, as an incoming `traceparent` names it.
    fn remote(flags: TraceFlags, state: TraceState) -> SpanContext {
        SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            flags,
            true,
            state,
        )
    }

    fn trace_span() -> tracing::Span {
        tracing::info_span!(target: "toolgate::trace", "http_request")
    }

    #[test]
    fn a_root_span_starts_a_sampled_trace_and_its_child_joins_it() {
        with_layer(|| {
            let request = trace_span();
            let root = of(&request).expect("the trace span has ids");
            assert!(root.is_valid());
            assert!(root.is_sampled());
            let child = request.in_scope(|| {
                let call = tracing::info_span!(target: "toolgate::trace", "tool_call");
                of(&call).expect("the child has ids")
            });
            assert_eq!(child.trace_id(), root.trace_id());
            assert_ne!(child.span_id(), root.span_id());
            assert!(child.is_sampled());
            let other = of(&trace_span()).unwrap();
            assert_ne!(
                other.trace_id(),
                root.trace_id(),
                "a new root is a new trace"
            );
        });
    }

    #[test]
    fn an_adopted_span_and_its_children_are_in_the_callers_trace() {
        with_layer(|| {
            let state = TraceState::from_key_value([("vendor", "x")]).unwrap();
            let remote = remote(TraceFlags::default(), state.clone());
            let request = trace_span();
            let own = of(&request).unwrap().span_id();
            assert!(adopt(&request, &remote));
            let adopted = of(&request).unwrap();
            assert_eq!(adopted.trace_id(), remote.trace_id());
            assert_eq!(adopted.span_id(), own, "the span keeps its own id");
            assert!(
                !adopted.is_sampled(),
                "an unsampled caller's trace stays unsampled"
            );
            assert_eq!(adopted.trace_state(), &state);
            let child = request.in_scope(|| {
                of(&tracing::info_span!(target: "toolgate::trace", "tool_call")).unwrap()
            });
            assert_eq!(child.trace_id(), remote.trace_id());
            assert_ne!(child.span_id(), own);
        });
    }

    #[test]
    fn spans_of_other_targets_are_skipped_both_ways() {
        with_layer(|| {
            let request = trace_span();
            let root = of(&request).unwrap();
            let (inner, call) = request.in_scope(|| {
                let inner = tracing::info_span!(target: "sqlx::query", "query");
                let call = inner.in_scope(|| {
                    of(&tracing::info_span!(target: "toolgate::trace", "tool_call")).unwrap()
                });
                (of(&inner), call)
            });
            assert_eq!(
                call.trace_id(),
                root.trace_id(),
                "the call's parent is the request"
            );
            assert_eq!(
                inner.map(|ids| ids.span_id()),
                Some(root.span_id()),
                "a span of another target answers its trace span's ids"
            );
            let unrelated = tracing::info_span!(target: "sqlx::query", "query");
            assert!(of(&unrelated).is_none());
            assert!(!adopt(&unrelated, &root));
        });
    }

    #[test]
    fn without_the_layer_there_are_no_ids() {
        let subscriber = tracing_subscriber::registry();
        tracing::subscriber::with_default(subscriber, || {
            let request = trace_span();
            assert!(of(&request).is_none());
            assert!(!adopt(
                &request,
                &remote(TraceFlags::SAMPLED, TraceState::NONE)
            ));
        });
    }
}
