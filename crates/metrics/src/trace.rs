//! OpenTelemetry traces: one trace per turn, whichever processes drive it.
//!
//! A turn's trace id and the span its spans hang from are derived from the log's own
//! coordinates (the session and the turn's number, recorded by its user message), so
//! a worker that takes over a turn another worker left in flight continues the same
//! trace without asking anyone. Model calls (GenAI semantic conventions), tool calls
//! and gateway exchanges are spans of it; the worker that ends the turn records the
//! `turn` span over its whole length, with the derived ids: the trace's root. Nothing is exported unless the process set up an
//! exporter (`OTEL_EXPORTER_OTLP_ENDPOINT`); until then these are no-ops.

use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
};
use opentelemetry::KeyValue;
use steadfast_log::Usage;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The context every span of `session`'s turn `turn` is a child of.
pub fn turn_context(session: &str, turn: u32) -> opentelemetry::Context {
    let hash = blake3::hash(format!("steadfast turn trace\0{session}\0{turn}").as_bytes());
    let bytes = hash.as_bytes();
    let (mut trace, mut span) = ([0u8; 16], [0u8; 8]);
    trace.copy_from_slice(&bytes[..16]);
    span.copy_from_slice(&bytes[16..24]);
    let context = SpanContext::new(
        TraceId::from_bytes(trace),
        SpanId::from_bytes(span),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    opentelemetry::Context::new().with_remote_span_context(context)
}

/// The hex trace id of a turn, as trace backends show it.
pub fn turn_trace_id(session: &str, turn: u32) -> String {
    turn_context(session, turn)
        .span()
        .span_context()
        .trace_id()
        .to_string()
}

/// A span for one model call of a turn (`chat {model}`, a client span with the GenAI
/// request attributes); [`record_model_reply`] adds the reply's.
pub fn model_call_span(session: &str, turn: u32, provider: &str, model: &str) -> tracing::Span {
    let span = tracing::debug_span!(
        "chat",
        otel.name = %format!("chat {model}"),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.system = %provider,
        gen_ai.provider.name = %provider,
        gen_ai.request.model = %model,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        steadfast.session = %session,
        steadfast.turn = i64::from(turn),
    );
    // Fails only when no exporter is set up (the span is then not exported at all).
    let _ = span.set_parent(turn_context(session, turn));
    span
}

/// Adds a model reply's usage (and why it stopped, when known) to its span.
pub fn record_model_reply(span: &tracing::Span, usage: Option<&Usage>, finish: Option<&str>) {
    if let Some(usage) = usage {
        // As signed integers: the OpenTelemetry layer has no unsigned type and would
        // send a u64 as a string.
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        span.record("gen_ai.usage.input_tokens", count(usage.input_tokens));
        span.record("gen_ai.usage.output_tokens", count(usage.output_tokens));
    }
    if let Some(finish) = finish {
        span.record("gen_ai.response.finish_reasons", finish);
    }
}

/// A span for one tool call of a turn (`execute_tool {tool}`).
pub fn tool_call_span(session: &str, turn: u32, tool: &str, call_id: &str) -> tracing::Span {
    let span = tracing::debug_span!(
        "execute_tool",
        otel.name = %format!("execute_tool {tool}"),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %tool,
        gen_ai.tool.call.id = %call_id,
        steadfast.session = %session,
        steadfast.turn = i64::from(turn),
    );
    let _ = span.set_parent(turn_context(session, turn));
    span
}

thread_local! {
    /// The ids the span being started on this thread must take, if any (see
    /// [`pinned_ids`]).
    static PINNED: std::cell::Cell<Option<(TraceId, SpanId)>> = const { std::cell::Cell::new(None) };
}

/// The trace and span ids the span being started on this thread must take: set while
/// the `turn` span is started, so it is the very span ([`turn_context`]) every other
/// span of the turn names as its parent — the trace's root. The process's id generator
/// asks here first (the SDK's builder ignores given ids).
pub fn pinned_ids() -> Option<(TraceId, SpanId)> {
    PINNED.with(|p| p.get())
}

/// A span for one workspace snapshot (`snapshot workspace`), a child of the tool call
/// that takes it.
pub fn snapshot_span() -> tracing::Span {
    tracing::debug_span!("snapshot", otel.name = "snapshot workspace")
}

/// Records the `turn` span, from the turn's user message to its end: the root of the
/// turn's trace, with the ids its children name as their parent.
pub(crate) fn turn_span(session: &str, turn: u32, from_ms: u64, to_ms: u64, outcome: &str) {
    let tracer = opentelemetry::global::tracer("steadfast");
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    let context = turn_context(session, turn);
    let ids = context.span().span_context().clone();
    PINNED.with(|p| p.set(Some((ids.trace_id(), ids.span_id()))));
    let mut span = tracer
        .span_builder(format!("turn {turn}"))
        .with_start_time(at(from_ms))
        .with_attributes([
            KeyValue::new("steadfast.session", session.to_string()),
            KeyValue::new("steadfast.turn", i64::from(turn)),
            KeyValue::new("steadfast.turn.outcome", outcome.to_string()),
        ])
        .start_with_context(&tracer, &opentelemetry::Context::new());
    PINNED.with(|p| p.set(None));
    span.end_with_timestamp(at(to_ms));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_s_trace_is_the_same_wherever_it_is_computed_and_differs_per_turn() {
        assert_eq!(turn_trace_id("ses_a", 3), turn_trace_id("ses_a", 3));
        assert_ne!(turn_trace_id("ses_a", 3), turn_trace_id("ses_a", 4));
        assert_ne!(turn_trace_id("ses_a", 3), turn_trace_id("ses_b", 3));
        assert_eq!(turn_trace_id("ses_a", 3).len(), 32);
        let context = turn_context("ses_a", 3);
        let span = context.span();
        assert!(span.span_context().is_valid() && span.span_context().is_sampled());
    }
}
