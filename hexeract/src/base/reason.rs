//! Why a message was dead-lettered: the one list of reasons every part of Hexeract uses.

use std::borrow::Cow;
use std::fmt;

/// The reason a message ended in the dead-letter store.
///
/// The framework's own reasons are the associated constants; a handler may give its own with
/// [`HandlerOutcome::dead_letter`](crate::HandlerOutcome::dead_letter) (for example
/// `"sku_unknown"`), which is stored as written.
///
/// ```
/// use hexeract::Reason;
///
/// assert_eq!(Reason::PAYLOAD_INVALID.as_str(), "payload_invalid");
/// assert_eq!(Reason::from("sku_unknown"), "sku_unknown");
/// assert!(Reason::ALL.contains(&Reason::HANDLER_TIMEOUT));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Reason(Cow<'static, str>);

impl Reason {
    /// The payload could not be decoded into the handler's message type.
    pub const PAYLOAD_INVALID: Reason = Reason::from_static("payload_invalid");
    /// The payload was larger than `max_payload_bytes`; it was not copied or decoded.
    pub const PAYLOAD_TOO_LARGE: Reason = Reason::from_static("payload_too_large");
    /// A delivery from a broker carried no message id.
    pub const MESSAGE_ID_MISSING: Reason = Reason::from_static("message_id_missing");
    /// No handler is registered for the message type, and retries ran out.
    pub const UNKNOWN_MESSAGE_TYPE: Reason = Reason::from_static("unknown_message_type");
    /// The handler kept failing (`Err` or `HandlerOutcome::Retry`) until `MAX_DELIVERIES` ran out.
    pub const MAX_DELIVERIES_EXCEEDED: Reason = Reason::from_static("max_deliveries_exceeded");
    /// The handler returned `HandlerOutcome::dead_letter` without a reason of its own.
    pub const HANDLER_REJECTED: Reason = Reason::from_static("handler_rejected");
    /// The handler panicked on its last attempt.
    pub const HANDLER_PANICKED: Reason = Reason::from_static("handler_panicked");
    /// The handler was slower than its timeout on its last attempt.
    pub const HANDLER_TIMEOUT: Reason = Reason::from_static("handler_timeout");
    /// RabbitMQ delivered the message as often as its queue's `x-delivery-limit` allows without
    /// an outcome being settled (the consumer crashed or lost its connection each time): parked
    /// by the worker, with a row, before one more return would have the broker park it without
    /// a reason or a row.
    pub const DELIVERY_LIMIT_REACHED: Reason = Reason::from_static("delivery_limit_reached");
    /// The broker could not route the message to any queue: no queue is bound for its type (on
    /// RabbitMQ, the broker returned the mandatory publish). Dead-lettered by the relay, never
    /// deleted unseen; a type meant to have no subscribers is allowed by name instead
    /// (`AMQP_ALLOW_UNROUTED`).
    pub const UNROUTABLE: Reason = Reason::from_static("unroutable");
    /// A stored message could not be read (a header that is not a string, a column of the wrong
    /// type): a row written by something other than Hexeract. Dead-lettered alone, with what
    /// could be read of it, so that the messages behind it go on.
    pub const MESSAGE_UNREADABLE: Reason = Reason::from_static("message_unreadable");
    /// The handler takes state (`State<T>`) the test [`Harness`](crate::testing::Harness) was
    /// not given: at once, no call made. A worker's (or a scheduler's) build refuses such a
    /// handler (or job) instead, so no worker records it, and it is not among [`ALL`](Reason::ALL)
    /// (whose reasons each have a metric series from the start).
    pub const STATE_MISSING: Reason = Reason::from_static("state_missing");

    /// Every reason the framework itself records in a worker.
    pub const ALL: [Reason; 11] = [
        Reason::PAYLOAD_INVALID,
        Reason::PAYLOAD_TOO_LARGE,
        Reason::MESSAGE_ID_MISSING,
        Reason::UNKNOWN_MESSAGE_TYPE,
        Reason::MAX_DELIVERIES_EXCEEDED,
        Reason::HANDLER_REJECTED,
        Reason::HANDLER_PANICKED,
        Reason::HANDLER_TIMEOUT,
        Reason::DELIVERY_LIMIT_REACHED,
        Reason::UNROUTABLE,
        Reason::MESSAGE_UNREADABLE,
    ];

    /// A reason from a string literal, usable in `const` items.
    pub const fn from_static(reason: &'static str) -> Reason {
        Reason(Cow::Borrowed(reason))
    }

    /// The reason as stored and logged.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// What a retry that would end with this reason says went wrong, in its log line and the
    /// `last_error` it leaves (and its metric label, where that is one of the framework's): a
    /// failed call (`Err` or [`HandlerOutcome::retry`](crate::HandlerOutcome::retry), which
    /// dead-letters as `max_deliveries_exceeded` once the calls run out) is `handler_failed`;
    /// any other reason (`handler_timeout`, `unknown_message_type`, …) is itself.
    pub(crate) fn retry_cause(&self) -> &str {
        if *self == Reason::MAX_DELIVERIES_EXCEEDED {
            "handler_failed"
        } else {
            self.as_str()
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&'static str> for Reason {
    fn from(reason: &'static str) -> Reason {
        Reason(Cow::Borrowed(reason))
    }
}

impl From<String> for Reason {
    fn from(reason: String) -> Reason {
        Reason(Cow::Owned(reason))
    }
}

impl PartialEq<str> for Reason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}
