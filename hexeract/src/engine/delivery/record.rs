//! The one record of what became of a delivery: the same log line with the same fields in
//! every world, and the handler's metrics, written from here only.

use std::time::Duration;

use uuid::Uuid;

use crate::delivery::verdict::Verdict;
use crate::envelope::Envelope;
use crate::metrics::HandlerMetrics;

/// Where a delivery came from, as logs name it: `memory`, `sqlite`, `postgresql`, `rabbitmq`,
/// `kafka`, or `scheduler` for a scheduled job's run.
pub(crate) type Transport = &'static str;

/// What the record says about the delivery.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Delivered<'a> {
    pub(crate) message_id: Uuid,
    pub(crate) message_type: &'a str,
    /// The handler it was for, when one is known.
    pub(crate) handler: Option<&'a str>,
    /// The call this was (1-based), counted as the world counts it.
    pub(crate) attempt: u32,
    pub(crate) transport: Transport,
}

impl<'a> Delivered<'a> {
    /// `envelope` for `handler`, at the envelope's attempt.
    pub(crate) fn of(
        envelope: &'a Envelope,
        handler: Option<&'a str>,
        transport: Transport,
    ) -> Delivered<'a> {
        Delivered {
            message_id: envelope.id,
            message_type: &envelope.message_type,
            handler,
            attempt: envelope.attempt,
            transport,
        }
    }
}

/// Logs `verdict` and counts it in the handler's `metrics`. `took`: how long the call ran;
/// `None` when no call was made.
pub(crate) fn record(
    delivered: &Delivered<'_>,
    verdict: &Verdict,
    took: Option<Duration>,
    metrics: &HandlerMetrics,
) {
    let Delivered {
        message_id,
        message_type,
        handler,
        attempt,
        transport,
    } = *delivered;
    match verdict {
        Verdict::Ack => {
            metrics.handled(took.unwrap_or_default());
            tracing::debug!(%message_id, message_type, handler, attempt, transport, "message handled");
        }
        Verdict::Retry {
            delay,
            reason,
            detail,
        } => {
            metrics.retried(reason, took);
            tracing::warn!(
                %message_id,
                message_type,
                handler,
                attempt,
                transport,
                reason = reason.retry_cause(),
                detail = detail.as_str(),
                retry_in = ?delay,
                "handler failed; will retry"
            );
        }
        Verdict::DeadLetter {
            reason,
            detail,
            calls,
        } => {
            metrics.dead_lettered(reason, took);
            tracing::error!(
                %message_id,
                message_type,
                handler,
                attempt,
                transport,
                %reason,
                detail = detail.as_str(),
                attempts = calls,
                "message dead-lettered"
            );
        }
        Verdict::Abandoned => {
            tracing::warn!(
                %message_id,
                message_type,
                handler,
                attempt,
                transport,
                "call still running after the shutdown grace; abandoned, the message comes again"
            );
        }
        Verdict::Release => {
            tracing::debug!(%message_id, message_type, handler, attempt, transport, "message given back uncharged");
        }
    }
}
