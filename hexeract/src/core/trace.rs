//! The trace a message carries from hop to hop: W3C `traceparent` and `tracestate` headers.
//!
//! Without the `opentelemetry` feature, a follow-up published by a handler carries its
//! message's trace one hop further, with the call's span id as parent id
//! ([`Context::span_id`](crate::Context::span_id)), and the `hexeract.handle` span logs the
//! trace id: logs of one conversation can be joined.
//!
//! With the feature, and a [`tracing_opentelemetry`] layer in the application's subscriber:
//!
//! - publishing ([`hexeract::publish`](crate::publish), [`outbox::enqueue`](crate::outbox::enqueue),
//!   the delayed publishes, [`Context::publish`](crate::Context::publish) and
//!   [`Context::follow_up`](crate::Context::follow_up)) opens a `create <type>` span (kind
//!   producer) as a child of the caller's current span, and writes its context into the
//!   envelope: an enqueue inside an HTTP request's span is that request's child;
//! - every call of a handler is a `process <type>` span (kind consumer) whose parent is the
//!   context its message carries, through the outbox, RabbitMQ and Kafka alike; a retry is a
//!   new span under the same parent, so all attempts are in one trace;
//! - the spans carry OpenTelemetry's messaging attributes (`messaging.system`,
//!   `messaging.operation.type`, `messaging.destination.name`, `messaging.message.id`,
//!   `messaging.message.conversation_id`, `messaging.consumer.group.name` on Kafka) and
//!   Hexeract's (`hexeract.handler`, `hexeract.attempt`, `hexeract.outcome`).
//!
//! With no subscriber, or a span filtered out, none of this runs.

use crate::envelope::Envelope;

/// Whether per-message spans can go anywhere: a `tracing` subscriber was set, globally or for a
/// scope. With none, a span would only feed `tracing`'s bridge to the `log` crate (which sqlx
/// turns on for the whole program): building it there costs about 385 instructions a message
/// (a tenth of what the engine does per delivery), and it would say nothing the delivery's log
/// events do not already say.
pub(crate) fn spans_wanted() -> bool {
    tracing::dispatcher::has_been_set()
}

/// Opens the producer span of `envelope`, a new message published where the caller is, and
/// writes its context into the envelope's headers. Without the feature, or with no
/// OpenTelemetry layer, the envelope is left as it is.
#[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
pub(crate) fn produce(envelope: &mut Envelope) {
    #[cfg(feature = "opentelemetry")]
    otel::produce(envelope);
}

/// The span of one relay publish of `envelopes` to `transport`: `send` (kind producer), linked
/// to each message's own context (a batch has no single parent). `Span::none()` without the
/// feature.
#[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
#[cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]
pub(crate) fn relay(transport: &'static str, envelopes: &[&Envelope]) -> tracing::Span {
    #[cfg(feature = "opentelemetry")]
    return otel::relay(transport, envelopes);
    #[cfg(not(feature = "opentelemetry"))]
    tracing::Span::none()
}

/// What a consumer span records once the call ended: its outcome, and an error status when it
/// did not succeed.
#[cfg(feature = "opentelemetry")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Handled,
    Failed,
    Rejected,
    Interrupted,
}

#[cfg(feature = "opentelemetry")]
impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Handled => "handled",
            Outcome::Failed => "failed",
            Outcome::Rejected => "rejected",
            Outcome::Interrupted => "interrupted",
        }
    }
}

/// Makes `span` (a `hexeract.handle` span not entered yet) the consumer span of `envelope`:
/// its parent is the context the envelope carries, its name `process <type>`, with the
/// messaging attributes.
#[cfg_attr(not(feature = "opentelemetry"), allow(unused_variables))]
pub(crate) fn consume(
    span: &tracing::Span,
    envelope: &Envelope,
    transport: &'static str,
    handler: &str,
    consumer_group: Option<&str>,
) {
    #[cfg(feature = "opentelemetry")]
    otel::consume(span, envelope, transport, handler, consumer_group);
}

/// Records how the call of `span` ended.
#[cfg(feature = "opentelemetry")]
pub(crate) fn ended(span: &tracing::Span, outcome: Outcome, detail: Option<&str>) {
    otel::ended(span, outcome, detail);
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::Outcome;
    use crate::envelope::TRACESTATE;
    use crate::envelope::{parse_traceparent, Envelope, TRACEPARENT};

    /// The remote context `envelope` carries, when it has a valid `traceparent`.
    pub(super) fn extract(envelope: &Envelope) -> Option<opentelemetry::Context> {
        let (trace_id, parent_id, flags) = parse_traceparent(envelope.header(TRACEPARENT)?)?;
        let state = envelope
            .header(TRACESTATE)
            .and_then(|state| state.parse::<TraceState>().ok())
            .unwrap_or_default();
        let parent = SpanContext::new(
            TraceId::from_hex(trace_id).ok()?,
            SpanId::from_hex(parent_id).ok()?,
            TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
            true,
            state,
        );
        Some(opentelemetry::Context::new().with_remote_span_context(parent))
    }

    fn inject(envelope: &mut Envelope, span: &SpanContext) {
        envelope.headers.insert(
            TRACEPARENT.to_owned(),
            format!(
                "00-{}-{}-{:02x}",
                span.trace_id(),
                span.span_id(),
                span.trace_flags().to_u8()
            ),
        );
        let state = span.trace_state().header();
        if state.is_empty() {
            envelope.headers.remove(TRACESTATE);
        } else {
            envelope.headers.insert(TRACESTATE.to_owned(), state);
        }
    }

    /// `messaging.operation.type` and `.name`: `create`, `send` or `process`.
    fn operation(span: &tracing::Span, operation: &'static str) {
        span.set_attribute("messaging.operation.type", operation);
        span.set_attribute("messaging.operation.name", operation);
    }

    /// The attributes of the one message a `create` or `process` span is about.
    fn message(span: &tracing::Span, envelope: &Envelope) {
        span.set_attribute(
            "messaging.destination.name",
            envelope.message_type.to_string(),
        );
        span.set_attribute("messaging.message.id", envelope.id.to_string());
        if let Some(conversation) = envelope.correlation_id {
            span.set_attribute(
                "messaging.message.conversation_id",
                conversation.to_string(),
            );
        }
    }

    pub(super) fn produce(envelope: &mut Envelope) {
        let span = tracing::info_span!(
            "hexeract.publish",
            otel.name = tracing::field::Empty,
            otel.kind = "producer",
            message_type = %envelope.message_type,
        );
        if span.is_disabled() {
            return;
        }
        span.record(
            "otel.name",
            tracing::field::display(format_args!("create {}", envelope.message_type)),
        );
        operation(&span, "create");
        message(&span, envelope);
        let context = span.context();
        let produced = context.span().span_context().clone();
        if produced.is_valid() {
            inject(envelope, &produced);
        }
    }

    pub(super) fn relay(transport: &'static str, envelopes: &[&Envelope]) -> tracing::Span {
        let span = tracing::info_span!(
            "hexeract.relay",
            otel.name = "send",
            otel.kind = "producer",
            rows = envelopes.len(),
        );
        if span.is_disabled() {
            return span;
        }
        span.set_attribute("messaging.system", transport);
        operation(&span, "send");
        span.set_attribute(
            "messaging.batch.message_count",
            i64::try_from(envelopes.len()).unwrap_or(i64::MAX),
        );
        for envelope in envelopes {
            if let Some(context) = extract(envelope) {
                span.add_link(context.span().span_context().clone());
            }
        }
        span
    }

    pub(super) fn consume(
        span: &tracing::Span,
        envelope: &Envelope,
        transport: &'static str,
        handler: &str,
        consumer_group: Option<&str>,
    ) {
        if span.is_disabled() {
            return;
        }
        span.record(
            "otel.name",
            tracing::field::display(format_args!("process {}", envelope.message_type)),
        );
        span.record("otel.kind", "consumer");
        if let Some(parent) = extract(envelope) {
            // Fails only without an OpenTelemetry layer: then there is no span to parent.
            let _ = span.set_parent(parent);
        }
        span.set_attribute("messaging.system", transport);
        operation(span, "process");
        message(span, envelope);
        span.set_attribute("hexeract.handler", handler.to_owned());
        span.set_attribute("hexeract.attempt", i64::from(envelope.attempt));
        if let Some(group) = consumer_group {
            span.set_attribute("messaging.consumer.group.name", group.to_owned());
        }
    }

    pub(super) fn ended(span: &tracing::Span, outcome: Outcome, detail: Option<&str>) {
        if span.is_disabled() {
            return;
        }
        span.set_attribute("hexeract.outcome", outcome.as_str());
        if outcome != Outcome::Handled {
            span.set_status(Status::error(detail.unwrap_or(outcome.as_str()).to_owned()));
        }
    }
}
