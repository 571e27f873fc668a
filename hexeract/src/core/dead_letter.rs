//! [`DeadLetter`]: the record of a message that could not be handled.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::envelope::Envelope;
use crate::reason::Reason;

/// Longest `detail` kept, in bytes; longer details are cut at a character boundary.
pub const MAX_DETAIL_BYTES: usize = 4096;

/// A message that will not be handled without a person's help, with everything needed to
/// understand and replay it: the original envelope (bytes and headers as received), the handler,
/// the reason, the detail and the number of calls made.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Id of this record.
    pub id: Uuid,
    /// The message as it was received, payload bytes unchanged.
    pub envelope: Envelope,
    /// The handler the delivery was for (each handler has its own delivery, so a payload too
    /// large or undecodable is one letter per handler); `None` when no handler knows the
    /// message's type, except on RabbitMQ, where it is the handler whose queue it arrived in.
    pub handler: Option<String>,
    /// Why, from [`Reason`] or the handler's own word.
    pub reason: Reason,
    /// What happened, truncated to [`MAX_DETAIL_BYTES`].
    pub detail: String,
    /// Handler calls made.
    pub attempts: u32,
    /// When it was dead-lettered.
    pub dead_lettered_at: DateTime<Utc>,
}

impl DeadLetter {
    /// A dead letter of `envelope` for `handler`, dead-lettered now with `reason` and `detail`
    /// (cut to [`MAX_DETAIL_BYTES`]), its attempts those of the envelope: what a program that
    /// parks messages of its own records with
    /// [`DeadLetterStore::insert_dead_letter`](crate::store::DeadLetterStore::insert_dead_letter).
    ///
    /// ```
    /// use hexeract::{DeadLetter, Envelope, Reason};
    ///
    /// let envelope = Envelope::from_raw("OrderPlaced", &b"{not json"[..]);
    /// let letter = DeadLetter::new(envelope, None, Reason::PAYLOAD_INVALID, "expected a JSON object");
    /// assert_eq!(letter.reason, Reason::PAYLOAD_INVALID);
    /// ```
    pub fn new(
        envelope: Envelope,
        handler: Option<String>,
        reason: Reason,
        detail: &str,
    ) -> DeadLetter {
        DeadLetter {
            id: Uuid::now_v7(),
            attempts: envelope.attempt,
            envelope,
            handler,
            reason,
            detail: truncate(detail, MAX_DETAIL_BYTES),
            dead_lettered_at: Utc::now(),
        }
    }
}

/// `detail` cut to [`MAX_DETAIL_BYTES`], as every store keeps it.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn truncate_detail(detail: &str) -> String {
    truncate(detail, MAX_DETAIL_BYTES)
}

/// `text` cut to at most `max` bytes at a character boundary, with `…` when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::truncate;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("ééé", 3), "é…");
        assert_eq!(truncate(&"x".repeat(5000), 4096).len(), 4096 + "…".len());
    }
}
