//! [`HandlerOutcome`]: what a handler says about one delivery, and how return types map to it.

use std::fmt::Display;
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
/// // Called again after a backoff. Its log line and the `last_error` it leaves read
/// // "handler_failed: stock service unavailable"; should the calls run out, the dead letter's
/// // reason is `max_deliveries_exceeded`.
/// let retry = HandlerOutcome::retry("stock service unavailable");
/// assert!(matches!(retry, HandlerOutcome::Retry { ref reason, .. } if *reason == Reason::MAX_DELIVERIES_EXCEEDED));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "an outcome does nothing unless the handler returns it"]
pub enum HandlerOutcome {
    /// Done: the message is settled for this handler.
    Ack,
    /// Failed, may pass: call the handler again after a backoff, until `MAX_DELIVERIES` calls
    /// were made; then dead-letter with `reason`.
    Retry {
        /// The reason the dead letter gives if the calls run out: `max_deliveries_exceeded` for
        /// a failed call. It is not what the retry itself reports: a retry's log line and
        /// `last_error` say `handler_failed` for such a call, or name this reason when it is
        /// another (`handler_timeout`, `unknown_message_type`; its metric label is `other` for
        /// a reason of a handler's own).
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

    /// This outcome as a typed [`Handler`](crate::Handler)'s result, with
    /// `type Error = HandlerOutcome`: `Ok(())` for an ack, `Err(self)` for anything else.
    ///
    /// ```
    /// use hexeract::HandlerOutcome;
    ///
    /// assert_eq!(HandlerOutcome::Ack.into_result(), Ok(()));
    /// assert!(HandlerOutcome::reject("no such SKU").into_result().is_err());
    /// ```
    pub fn into_result(self) -> Result<(), HandlerOutcome> {
        match self {
            HandlerOutcome::Ack => Ok(()),
            other => Err(other),
        }
    }

    /// `true` for [`HandlerOutcome::Ack`].
    pub fn is_ack(&self) -> bool {
        matches!(self, HandlerOutcome::Ack)
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

impl<E: HandlerError> IntoOutcome for Result<(), E> {
    fn into_outcome(self) -> HandlerOutcome {
        match self {
            Ok(()) => HandlerOutcome::Ack,
            Err(error) => error.into_outcome(),
        }
    }
}

impl<E: HandlerError> IntoOutcome for Result<HandlerOutcome, E> {
    fn into_outcome(self) -> HandlerOutcome {
        match self {
            Ok(outcome) => outcome,
            Err(error) => error.into_outcome(),
        }
    }
}

/// What the `Err` of a handler call means: the [`Handler::Error`](crate::Handler::Error) of a
/// typed handler, the `E` of a `#[handler]` fn's `Result<(), E>`.
///
/// Any error that implements `Display` (every `std::error::Error`, `anyhow::Error`, `String`)
/// is a failure that may pass: the call is retried, and dead-lettered as
/// `max_deliveries_exceeded` when the calls run out. A [`HandlerOutcome`] says what to do
/// itself: `Err(HandlerOutcome::dead_letter("sku_unknown", …))` dead-letters at once with that
/// reason.
///
/// ```
/// use hexeract::{HandlerError, HandlerOutcome};
///
/// let io = std::io::Error::other("stock service unavailable");
/// assert!(matches!(io.into_outcome(), HandlerOutcome::Retry { .. }));
/// let unknown = HandlerOutcome::dead_letter("sku_unknown", "SKU 42");
/// assert!(matches!(unknown.into_outcome(), HandlerOutcome::DeadLetter { .. }));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a handler's error",
    label = "not a handler error",
    note = "a handler's error is a type that implements Display (std::error::Error types, anyhow::Error, Box<dyn Error>, String), whose `Err` retries, or `hexeract::HandlerOutcome`, which says itself what to do"
)]
pub trait HandlerError {
    /// The outcome this error stands for.
    fn into_outcome(self) -> HandlerOutcome;
}

impl<E: Display> HandlerError for E {
    fn into_outcome(self) -> HandlerOutcome {
        HandlerOutcome::retry(format_args!("{self:#}"))
    }
}

// `HandlerOutcome` has no `Display`: that is what lets it be an error of its own here.
impl HandlerError for HandlerOutcome {
    fn into_outcome(self) -> HandlerOutcome {
        self
    }
}
