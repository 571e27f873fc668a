//! [`HandlerOutcome`]: what a handler says about one delivery, and how return types map to it.

use std::fmt::{self, Display};
use std::time::Duration;

use crate::reason::Reason;

/// How one handler call went.
///
/// A handler written as `-> Result<(), E>` never builds one by hand: `Ok(())` is
/// [`HandlerOutcome::Ack`] and `Err(e)` is a retry. Return `HandlerOutcome` (or
/// `Result<HandlerOutcome, E>`) to dead-letter at once or to choose the retry delay.
///
/// ```
/// use hexeract::{HandlerOutcome, Reason};
///
/// let rejected = HandlerOutcome::dead_letter("sku_unknown", "SKU 42 is not in the catalogue");
/// assert!(matches!(rejected, HandlerOutcome::DeadLetter { ref reason, .. } if reason == "sku_unknown"));
///
/// let retry = HandlerOutcome::retry("stock service unavailable");
/// assert!(matches!(retry, HandlerOutcome::Retry { ref reason, .. } if *reason == Reason::MAX_DELIVERIES_EXCEEDED));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerOutcome {
    /// Done: the message is settled for this handler.
    Ack,
    /// Failed, may pass: call the handler again after a backoff, until `MAX_DELIVERIES` calls
    /// were made; then dead-letter with `reason`.
    Retry {
        /// The dead-letter reason if this was the last attempt.
        reason: Reason,
        /// What went wrong, for logs and the dead-letter record.
        detail: String,
        /// Wait this long instead of the policy's backoff.
        after: Option<Duration>,
    },
    /// Will never succeed: dead-letter now, without further attempts.
    DeadLetter {
        /// Why, as a short machine-readable word (`payload_invalid`, `sku_unknown`).
        reason: Reason,
        /// What a person needs to act on it.
        detail: String,
    },
}

impl HandlerOutcome {
    /// Retry after the policy's backoff; dead-letter as `max_deliveries_exceeded` when attempts
    /// run out.
    pub fn retry(detail: impl Display) -> HandlerOutcome {
        HandlerOutcome::Retry {
            reason: Reason::MAX_DELIVERIES_EXCEEDED,
            detail: detail.to_string(),
            after: None,
        }
    }

    /// Retry after `delay` instead of the policy's backoff.
    pub fn retry_after(delay: Duration, detail: impl Display) -> HandlerOutcome {
        HandlerOutcome::Retry {
            reason: Reason::MAX_DELIVERIES_EXCEEDED,
            detail: detail.to_string(),
            after: Some(delay),
        }
    }

    /// Dead-letter now with `reason` (one of the [`Reason`] constants, or a word of your own)
    /// and a human-readable `detail`.
    pub fn dead_letter(reason: impl Into<Reason>, detail: impl Display) -> HandlerOutcome {
        HandlerOutcome::DeadLetter {
            reason: reason.into(),
            detail: detail.to_string(),
        }
    }

    /// Dead-letter now as `handler_rejected`.
    pub fn reject(detail: impl Display) -> HandlerOutcome {
        HandlerOutcome::dead_letter(Reason::HANDLER_REJECTED, detail)
    }

    /// `true` for [`HandlerOutcome::Ack`].
    pub fn is_ack(&self) -> bool {
        matches!(self, HandlerOutcome::Ack)
    }
}

impl fmt::Display for HandlerOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerOutcome::Ack => f.write_str("ack"),
            HandlerOutcome::Retry { detail, .. } => write!(f, "retry: {detail}"),
            HandlerOutcome::DeadLetter { reason, detail } => {
                write!(f, "dead letter ({reason}): {detail}")
            }
        }
    }
}

/// A handler's return type: turned into a [`HandlerOutcome`] after each call.
///
/// Implemented for `HandlerOutcome`, `Result<(), E>` and `Result<HandlerOutcome, E>` where `E`
/// implements `Display` (every `std::error::Error`, `anyhow::Error`, `String`). `Err` retries.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handler return type",
    label = "unsupported return type",
    note = "a handler returns `Result<(), E>` where E implements Display (std::error::Error types, anyhow::Error, Box<dyn Error>, String; `Err` retries), or `hexeract::HandlerOutcome`"
)]
pub trait IntoOutcome {
    /// The outcome this value stands for.
    fn into_outcome(self) -> HandlerOutcome;
}

impl IntoOutcome for HandlerOutcome {
    fn into_outcome(self) -> HandlerOutcome {
        self
    }
}

impl<E: Display> IntoOutcome for Result<(), E> {
    fn into_outcome(self) -> HandlerOutcome {
        match self {
            Ok(()) => HandlerOutcome::Ack,
            Err(error) => HandlerOutcome::retry(format_args!("{error:#}")),
        }
    }
}

impl<E: Display> IntoOutcome for Result<HandlerOutcome, E> {
    fn into_outcome(self) -> HandlerOutcome {
        match self {
            Ok(outcome) => outcome,
            Err(error) => HandlerOutcome::retry(format_args!("{error:#}")),
        }
    }
}
