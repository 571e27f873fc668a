//! The one decision of the engine: what a delivery's call (or the checks before it) means for
//! the message. Pure: no I/O, no clock, tested as a table.

use std::time::Duration;

use crate::outcome::HandlerOutcome;
use crate::reason::Reason;
use crate::retry::RetryPolicy;

/// How a call ended, as the engine saw it.
#[derive(Debug)]
pub(crate) enum Call {
    /// The handler returned, panicked or timed out; the outcome says which.
    Finished(HandlerOutcome),
    /// The call was given up on at a shutdown past its grace: it may still be running, and it
    /// says nothing about the message.
    Interrupted,
    /// No call was made: the worker stopped while the delivery waited for a concurrency
    /// permit.
    NotStarted,
}

/// What is to become of a delivery; each world carries it out in its own way (a row update, a
/// wait-queue republish or a park, a wait in the partition, an occurrence update).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Done: remove the message from its source.
    Ack,
    /// Call again after `delay`; `reason` is what a dead letter would say.
    Retry {
        delay: Duration,
        reason: Reason,
        detail: String,
    },
    /// Give up: into the dead letters, with the handler calls made.
    DeadLetter {
        reason: Reason,
        detail: String,
        calls: u32,
    },
    /// Given up on at a shutdown past the grace, the call maybe still running: due again only
    /// once a call could no longer overlap it, with its attempt counted.
    Abandoned,
    /// Back to the source without charging an attempt: the call never started, or the worker
    /// was stopping and the handler gave up because of it.
    Release,
}

/// The verdict on call number `attempt` (1-based) that ended as `call`. `stopping`: the worker
/// was told to stop before the call ended, so a failure may be the handler's answer to that
/// (a cooperative handler watching `Context::cancellation`), and costs no attempt.
pub(crate) fn verdict(policy: &RetryPolicy, attempt: u32, call: Call, stopping: bool) -> Verdict {
    match call {
        Call::Finished(HandlerOutcome::Ack) => Verdict::Ack,
        Call::Finished(HandlerOutcome::DeadLetter { reason, detail }) => Verdict::DeadLetter {
            reason,
            detail,
            calls: attempt,
        },
        Call::Finished(HandlerOutcome::Retry { .. }) if stopping => Verdict::Release,
        Call::Finished(HandlerOutcome::Retry { reason, detail, .. })
            if policy.is_exhausted(attempt) =>
        {
            Verdict::DeadLetter {
                reason,
                detail,
                calls: attempt,
            }
        }
        Call::Finished(HandlerOutcome::Retry {
            reason,
            detail,
            after,
        }) => Verdict::Retry {
            delay: policy.delay_after(attempt, after),
            reason,
            detail,
        },
        Call::Interrupted => Verdict::Abandoned,
        Call::NotStarted => Verdict::Release,
    }
}

/// The checks before a call: the attempt budget already spent (attempts are counted when a
/// delivery is taken, so calls that never finished count), then the payload's size (never
/// decoded when too large). `Some` is the verdict without a call.
pub(crate) fn precheck(
    policy: &RetryPolicy,
    attempt: u32,
    payload_len: usize,
    max_payload_bytes: usize,
) -> Option<Verdict> {
    let max = policy.max_deliveries_value();
    if attempt > max {
        return Some(Verdict::DeadLetter {
            reason: Reason::MAX_DELIVERIES_EXCEEDED,
            detail: budget_spent_detail(attempt, max),
            calls: max,
        });
    }
    if payload_len > max_payload_bytes {
        return Some(Verdict::DeadLetter {
            reason: Reason::PAYLOAD_TOO_LARGE,
            detail: payload_too_large_detail(payload_len, max_payload_bytes),
            calls: attempt.saturating_sub(1),
        });
    }
    None
}

/// Why a delivery taken for call `attempt`, past `max`, gets no call. One past the budget is
/// what a call that never finished leaves (the process died or was stopped mid-call); further
/// past it, the count came from elsewhere (a producer's attempt header).
pub(crate) fn budget_spent_detail(attempt: u32, max: u32) -> String {
    if attempt == max.saturating_add(1) {
        format!(
            "taken for call {attempt} of at most {max}: the last allowed call never finished \
             (the process died or lost its connection during it, or it was interrupted by a \
             shutdown past its grace; a message that crashes the process?); no call was made"
        )
    } else {
        format!(
            "taken for call {attempt} of at most {max}: the attempt count it arrived with is \
             past the budget (set by its producer, or calls that never finished); no call was \
             made"
        )
    }
}

/// Why a delivery read from a broker (an AMQP delivery, a Kafka record) cannot be handed to any
/// handler: the reason and detail of its dead letter.
#[cfg(any(feature = "rabbitmq", feature = "kafka"))]
#[derive(Debug)]
pub(crate) struct Unreadable {
    pub(crate) reason: Reason,
    pub(crate) detail: String,
}

/// Why a payload was not handed to a handler.
#[cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]
pub(crate) fn payload_too_large_detail(len: usize, max: usize) -> String {
    format!("payload is {len} bytes, more than max_payload_bytes ({max}); it was not decoded")
}

/// The outcome of a message no handler here knows: retried like a failure (the handler may
/// come with the next deployment), then dead-lettered as `unknown_message_type`.
pub(crate) fn no_handler_for_type(message_type: &str) -> HandlerOutcome {
    HandlerOutcome::Retry {
        reason: Reason::UNKNOWN_MESSAGE_TYPE,
        detail: missing_handler(message_type),
        after: None,
    }
}

/// The one text of a message no handler here knows: the detail of its verdict and the
/// message of `BusError::MissingHandler`.
pub(crate) fn missing_handler(message_type: &str) -> String {
    format!("no handler is registered for message type {message_type:?}")
}

/// The outcome of a message meant for one handler (a retry, a replayed dead letter) that this
/// worker does not have.
pub(crate) fn no_such_handler(handler: &str) -> HandlerOutcome {
    HandlerOutcome::Retry {
        reason: Reason::UNKNOWN_MESSAGE_TYPE,
        detail: format!(
            "the message is meant for handler `{handler}`, which is not registered here \
             (renamed or removed?)"
        ),
        after: None,
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy::default()
            .max_deliveries(NonZeroU32::new(3).unwrap())
            .jitter(0.0)
    }

    fn retry() -> Call {
        Call::Finished(HandlerOutcome::retry("boom"))
    }

    #[test]
    fn verdicts_as_a_table() {
        let secs = Duration::from_secs;
        let panicked = || {
            Call::Finished(HandlerOutcome::Retry {
                reason: Reason::HANDLER_PANICKED,
                detail: "handler panicked: x".to_owned(),
                after: None,
            })
        };
        let rows: Vec<(u32, Call, bool, Verdict)> = vec![
            (1, Call::Finished(HandlerOutcome::Ack), false, Verdict::Ack),
            (3, Call::Finished(HandlerOutcome::Ack), true, Verdict::Ack),
            (
                1,
                retry(),
                false,
                Verdict::Retry {
                    delay: secs(1),
                    reason: Reason::MAX_DELIVERIES_EXCEEDED,
                    detail: "boom".to_owned(),
                },
            ),
            (
                2,
                retry(),
                false,
                Verdict::Retry {
                    delay: secs(2),
                    reason: Reason::MAX_DELIVERIES_EXCEEDED,
                    detail: "boom".to_owned(),
                },
            ),
            (
                3,
                retry(),
                false,
                Verdict::DeadLetter {
                    reason: Reason::MAX_DELIVERIES_EXCEEDED,
                    detail: "boom".to_owned(),
                    calls: 3,
                },
            ),
            (
                3,
                panicked(),
                false,
                Verdict::DeadLetter {
                    reason: Reason::HANDLER_PANICKED,
                    detail: "handler panicked: x".to_owned(),
                    calls: 3,
                },
            ),
            (
                1,
                Call::Finished(HandlerOutcome::retry_after(secs(7), "later")),
                false,
                Verdict::Retry {
                    delay: secs(7),
                    reason: Reason::MAX_DELIVERIES_EXCEEDED,
                    detail: "later".to_owned(),
                },
            ),
            (
                1,
                Call::Finished(HandlerOutcome::retry_after(secs(3_600), "much later")),
                false,
                Verdict::Retry {
                    delay: secs(300),
                    reason: Reason::MAX_DELIVERIES_EXCEEDED,
                    detail: "much later".to_owned(),
                },
            ),
            (
                1,
                Call::Finished(HandlerOutcome::dead_letter("sku_unknown", "no SKU 42")),
                false,
                Verdict::DeadLetter {
                    reason: Reason::from("sku_unknown"),
                    detail: "no SKU 42".to_owned(),
                    calls: 1,
                },
            ),
            (
                2,
                Call::Finished(HandlerOutcome::dead_letter("sku_unknown", "no SKU 42")),
                true,
                Verdict::DeadLetter {
                    reason: Reason::from("sku_unknown"),
                    detail: "no SKU 42".to_owned(),
                    calls: 2,
                },
            ),
            // Stopping: a failure is not charged, even the last one.
            (1, retry(), true, Verdict::Release),
            (3, retry(), true, Verdict::Release),
            (2, Call::Interrupted, false, Verdict::Abandoned),
            (3, Call::Interrupted, true, Verdict::Abandoned),
            (1, Call::NotStarted, true, Verdict::Release),
            (
                1,
                Call::Finished(no_handler_for_type("Nope")),
                false,
                Verdict::Retry {
                    delay: secs(1),
                    reason: Reason::UNKNOWN_MESSAGE_TYPE,
                    detail: "no handler is registered for message type \"Nope\"".to_owned(),
                },
            ),
        ];
        for (attempt, call, stopping, expected) in rows {
            let shown = format!("{call:?} at attempt {attempt}, stopping {stopping}");
            assert_eq!(
                verdict(&policy(), attempt, call, stopping),
                expected,
                "{shown}"
            );
        }
    }

    #[test]
    fn prechecks_as_a_table() {
        let policy = policy();
        assert_eq!(precheck(&policy, 1, 10, 10), None);
        assert_eq!(precheck(&policy, 3, 0, 10), None);
        let Some(Verdict::DeadLetter {
            reason,
            detail,
            calls,
        }) = precheck(&policy, 4, 0, 10)
        else {
            panic!("the budget is spent");
        };
        assert_eq!(
            (reason, calls),
            (Reason::MAX_DELIVERIES_EXCEEDED, 3),
            "{detail}"
        );
        assert!(
            detail.contains("the last allowed call never finished"),
            "{detail}"
        );
        // A count from elsewhere is not blamed on calls that never happened.
        let Some(Verdict::DeadLetter { detail, calls, .. }) = precheck(&policy, 1_000, 0, 10)
        else {
            panic!("the budget is spent");
        };
        assert_eq!(calls, 3);
        assert!(
            detail.contains("arrived with is past the budget"),
            "{detail}"
        );
        assert!(!detail.contains("never finished ("), "{detail}");
        // The budget is checked before the size.
        assert!(matches!(
            precheck(&policy, 4, 11, 10),
            Some(Verdict::DeadLetter { reason, .. }) if reason == Reason::MAX_DELIVERIES_EXCEEDED
        ));
        assert_eq!(
            precheck(&policy, 2, 11, 10),
            Some(Verdict::DeadLetter {
                reason: Reason::PAYLOAD_TOO_LARGE,
                detail: "payload is 11 bytes, more than max_payload_bytes (10); it was not decoded"
                    .to_owned(),
                calls: 1,
            })
        );
    }
}
