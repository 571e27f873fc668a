//! [`Envelope`]: a message on its way, with the metadata every transport carries.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use uuid::{ContextV7, Timestamp, Uuid};

use crate::message::Message;

/// A message with its identity and metadata: what stores keep and transports carry.
///
/// The payload is JSON. Ids are UUID v7, so they sort by creation time. The correlation id is
/// shared by every message of one conversation; the causation id is the id of the message
/// whose handler published this one ([`Envelope::caused_by`] sets both).
///
/// ```
/// use hexeract::{Envelope, Message};
///
/// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// struct OrderPlaced { order_id: u64 }
///
/// let envelope = Envelope::new(&OrderPlaced { order_id: 7 })?;
/// assert_eq!(envelope.message_type, "OrderPlaced");
/// assert_eq!(&envelope.payload[..], br#"{"order_id":7}"#);
/// assert_eq!(envelope.decode::<OrderPlaced>()?, OrderPlaced { order_id: 7 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Envelope {
    /// Unique id of this message (UUID v7). Handlers deduplicate on it.
    ///
    /// Its random bits come from a generator per thread (`uuid`'s `fast-rng`), seeded from
    /// the operating system and reseeded now and then, but not at a `fork`. A process that
    /// forks without `exec` and makes ids on both sides of the fork continues the same
    /// sequence in both: build envelopes in one of them only, or `exec` first.
    pub id: Uuid,
    /// The wire name, [`Message::MESSAGE_TYPE`] of the payload's type.
    pub message_type: String,
    /// The JSON payload, as published.
    pub payload: Bytes,
    /// Id shared by every message of one conversation.
    pub correlation_id: Option<Uuid>,
    /// Id of the message whose handling published this one.
    pub causation_id: Option<Uuid>,
    /// Further headers (for example `traceparent`).
    pub headers: BTreeMap<String, String>,
    /// Number of the handler call this envelope is given to: 1 on the first delivery. 0 before
    /// any delivery.
    pub attempt: u32,
    /// When the message was first published.
    pub created_at: DateTime<Utc>,
    /// The aggregate the message belongs to (`#[message(aggregate = "order")]`), for transports
    /// that keep one aggregate's messages in order (Kafka: the topic
    /// `<prefix>.<aggregate>`). `None` for a message that declares none.
    pub aggregate: Option<String>,
    /// The id of that aggregate (the `#[message(key)]` field, as text): the partition key, so
    /// that one aggregate's messages are consumed in the order they were published.
    pub aggregate_key: Option<String>,
}

impl Envelope {
    /// Serializes `message` into a new envelope with a fresh id.
    pub fn new<M: Message>(message: &M) -> Result<Envelope, EncodeError> {
        let payload = encode(message).map_err(|source| EncodeError {
            message_type: M::MESSAGE_TYPE,
            source,
        })?;
        let mut envelope = Envelope::from_raw(M::MESSAGE_TYPE, payload);
        envelope.aggregate = M::AGGREGATE.map(str::to_owned);
        envelope.aggregate_key = message.aggregate_key();
        Ok(envelope)
    }

    /// An envelope around bytes that were not produced by [`Envelope::new`]: another producer's
    /// payload, or input to test the dead-letter path. Nothing is checked here; a payload that
    /// does not decode is dead-lettered as `payload_invalid` when it is handled.
    pub fn from_raw(message_type: impl Into<String>, payload: impl Into<Bytes>) -> Envelope {
        let (id, created_at) = new_id();
        Envelope {
            id,
            message_type: message_type.into(),
            payload: payload.into(),
            correlation_id: None,
            causation_id: None,
            headers: BTreeMap::new(),
            attempt: 0,
            created_at,
            aggregate: None,
            aggregate_key: None,
        }
    }

    /// Decodes the payload as `M`, checking that the envelope carries that message type.
    pub fn decode<M: Message>(&self) -> Result<M, DecodeError> {
        if self.message_type != M::MESSAGE_TYPE {
            return Err(DecodeError::WrongType {
                expected: M::MESSAGE_TYPE,
                found: self.message_type.clone(),
            });
        }
        serde_json::from_slice(&self.payload).map_err(|source| DecodeError::InvalidPayload {
            message_type: M::MESSAGE_TYPE,
            source,
        })
    }

    /// Marks this envelope as published while handling `parent`: same conversation
    /// (correlation id), caused by the parent's id, and the same W3C trace one hop further (a
    /// new parent id under the parent's trace id). Inside a handler,
    /// [`Context::publish`](crate::Context::publish) does this with the call's own span id as
    /// the parent id.
    pub fn caused_by(self, parent: &Envelope) -> Envelope {
        self.caused_by_span(parent, new_span_id())
    }

    /// [`caused_by`](Envelope::caused_by), with `span_id` (not zero) as the parent id of the
    /// new hop: the span of the call that publishes it.
    pub(crate) fn caused_by_span(mut self, parent: &Envelope, span_id: u64) -> Envelope {
        self.correlation_id = Some(parent.correlation_id.unwrap_or(parent.id));
        self.causation_id = Some(parent.id);
        if let Some((trace_id, _, flags)) = parent.header(TRACEPARENT).and_then(parse_traceparent) {
            let child = format!("00-{trace_id}-{span_id:016x}-{flags}");
            self.headers.insert(TRACEPARENT.to_owned(), child);
            if let Some(state) = parent.header(TRACESTATE) {
                self.headers.insert(TRACESTATE.to_owned(), state.to_owned());
            }
        }
        self
    }

    /// The W3C trace id of the `traceparent` header (32 hex digits), if it has a valid one.
    ///
    /// ```
    /// use hexeract::Envelope;
    ///
    /// let envelope = Envelope::from_raw("Ping", &b"{}"[..])
    ///     .with_header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    /// assert_eq!(envelope.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
    /// let follow_up = Envelope::from_raw("Pong", &b"{}"[..]).caused_by(&envelope);
    /// assert_eq!(follow_up.trace_id(), envelope.trace_id(), "the same trace");
    /// assert_ne!(follow_up.header("traceparent"), envelope.header("traceparent"), "a new hop");
    /// ```
    pub fn trace_id(&self) -> Option<&str> {
        let traceparent = self.header(TRACEPARENT)?;
        parse_traceparent(traceparent).map(|(trace_id, _, _)| trace_id)
    }

    /// Sets the correlation id.
    pub fn with_correlation_id(mut self, correlation_id: Uuid) -> Envelope {
        self.correlation_id = Some(correlation_id);
        self
    }

    /// Sets a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Envelope {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The value of a header, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// A new message's id and creation time, from one reading of the clock (a v7 id holds the
/// millisecond it was made in).
fn new_id() -> (Uuid, DateTime<Utc>) {
    /// Keeps the ids made in one millisecond in the order they were made, as
    /// `Uuid::now_v7` does with a context of its own.
    static SEQUENCE: Mutex<ContextV7> = Mutex::new(ContextV7::new());
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let (seconds, nanos) = (now.as_secs(), now.subsec_nanos());
    let id = Uuid::new_v7(Timestamp::from_unix(&SEQUENCE, seconds, nanos));
    let created_at = i64::try_from(seconds)
        .ok()
        .and_then(|seconds| DateTime::from_timestamp(seconds, nanos))
        .unwrap_or_else(Utc::now);
    (id, created_at)
}

/// Serializes `message` into a buffer kept by the thread, and copies the JSON out into a
/// payload of exactly its size.
///
/// `serde_json::to_vec` grows its vector as it writes (a reallocation or two for a message of a
/// few hundred bytes) and leaves it larger than its contents, which `Bytes` then wraps with a
/// shared header of its own: three allocator calls per message, two of them frees that land on
/// whichever thread drops the envelope (in a runtime, not the one that published it, where each
/// takes the publishing thread's allocator lock). Copying out of a reused buffer is one
/// allocation of the right size, freed in one call.
fn encode<M: serde::Serialize + ?Sized>(message: &M) -> Result<Bytes, serde_json::Error> {
    /// A buffer grown past this is not kept for the next message: a thread keeps at most this
    /// much between messages (a message larger than it costs what `to_vec` did, and a copy).
    const KEEP: usize = 16 * 1024;
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|scratch| {
        // A `Serialize` that itself builds an envelope finds the buffer taken: it gets its own.
        let Ok(mut scratch) = scratch.try_borrow_mut() else {
            return serde_json::to_vec(message).map(Bytes::from);
        };
        scratch.clear();
        let written = serde_json::to_writer(&mut *scratch, message);
        let payload = written.map(|()| Bytes::copy_from_slice(&scratch));
        if scratch.capacity() > KEEP {
            *scratch = Vec::new();
        }
        payload
    })
}

/// A message could not be serialized (for example a map with non-string keys).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode message {message_type} as JSON: {source}")]
pub struct EncodeError {
    /// The message type that failed to encode.
    pub message_type: &'static str,
    /// What serde_json reported.
    #[source]
    pub source: serde_json::Error,
}

/// An envelope's payload could not be turned into the requested message type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The envelope carries another message type.
    #[error("expected a {expected} message, the envelope carries {found}")]
    WrongType {
        /// The type asked for.
        expected: &'static str,
        /// The type the envelope carries.
        found: String,
    },
    /// The payload is not valid JSON for the message type.
    #[error("payload is not a valid {message_type}: {source}")]
    InvalidPayload {
        /// The type asked for.
        message_type: &'static str,
        /// What serde_json reported, with line and column.
        #[source]
        source: serde_json::Error,
    },
}

/// The W3C Trace Context header a message carries its trace in.
pub(crate) const TRACEPARENT: &str = "traceparent";

/// The header of a message's W3C trace state, carried beside its `traceparent`.
pub(crate) const TRACESTATE: &str = "tracestate";

/// The header a scheduled job's context carries its fire time in (RFC 3339).
pub(crate) const FIRE_TIME_HEADER: &str = "x-hexeract-fire-time";

/// `(trace id, parent id, flags)` of a version-00 `traceparent`, or `None` when it is not one.
pub(crate) fn parse_traceparent(value: &str) -> Option<(&str, &str, &str)> {
    let mut parts = value.split('-');
    let (version, trace_id, parent_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |text: &str, len: usize| {
        text.len() == len
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let valid = parts.next().is_none()
        && version == "00"
        && hex(trace_id, 32)
        && trace_id.bytes().any(|b| b != b'0')
        && hex(parent_id, 16)
        && parent_id.bytes().any(|b| b != b'0')
        && hex(flags, 2);
    valid.then_some((trace_id, parent_id, flags))
}

/// A new W3C span id: random, never zero.
pub(crate) fn new_span_id() -> u64 {
    loop {
        let id = fastrand::u64(..);
        if id != 0 {
            break id;
        }
    }
}

/// A `traceparent` for the next hop of `parent`'s trace: same trace id and flags, a new
/// parent id.
#[cfg(test)]
fn child_traceparent(parent: &str) -> Option<String> {
    let (trace_id, _, flags) = parse_traceparent(parent)?;
    Some(format!("00-{trace_id}-{:016x}-{flags}", new_span_id()))
}

#[cfg(test)]
mod trace_tests {
    use super::*;

    #[test]
    fn only_valid_version_00_traceparents_are_read_and_followed() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(parse_traceparent(valid).is_some());
        for invalid in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-abc-def-01",
        ] {
            assert!(parse_traceparent(invalid).is_none(), "{invalid}");
            assert!(child_traceparent(invalid).is_none(), "{invalid}");
        }
        let child = child_traceparent(valid).unwrap();
        let (trace_id, parent_id, flags) = parse_traceparent(&child).unwrap();
        assert_eq!(trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(parent_id, "00f067aa0ba902b7");
        assert_eq!(flags, "01");
    }
}

/// Decoding takes any bytes at all: never a panic, and JSON nested deeper than serde_json's
/// limit (128) is an error, not a stack overflow.
#[cfg(test)]
mod decode_properties {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, serde::Serialize, serde::Deserialize, crate::Message)]
    #[message(type = "props.Order")]
    struct Order {
        id: u64,
        lines: Vec<serde_json::Value>,
    }

    proptest! {
        #[test]
        fn any_payload_decodes_or_says_why(payload in proptest::collection::vec(any::<u8>(), 0..1024)) {
            let envelope = Envelope::from_raw("props.Order", payload);
            if let Err(error) = envelope.decode::<Order>() {
                prop_assert!(matches!(error, DecodeError::InvalidPayload { .. }), "{error}");
            }
        }

        #[test]
        fn a_payload_of_another_type_is_refused_before_parsing(payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let envelope = Envelope::from_raw("props.Other", payload);
            let is_wrong_type = matches!(envelope.decode::<Order>(), Err(DecodeError::WrongType { .. }));
            prop_assert!(is_wrong_type);
        }
    }

    #[test]
    fn deeply_nested_json_is_an_error_not_a_stack_overflow() {
        let depth = 100_000;
        let nested = format!(
            r#"{{"id":1,"lines":[{}{}]}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let envelope = Envelope::from_raw("props.Order", nested.into_bytes());
        let error = envelope.decode::<Order>().unwrap_err();
        assert!(error.to_string().contains("recursion limit"), "{error}");
    }
}

#[cfg(test)]
mod encode_tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize, crate::Message)]
    #[message(type = "encode.Note")]
    struct Note {
        text: String,
    }

    /// Builds an envelope of its own while it is being serialized.
    #[derive(Debug, serde::Deserialize, crate::Message)]
    #[message(type = "encode.Nested")]
    struct Nested {
        inner: String,
    }

    impl serde::Serialize for Nested {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let inner = Envelope::new(&Note {
                text: self.inner.clone(),
            })
            .map_err(serde::ser::Error::custom)?;
            use serde::ser::SerializeStruct;
            let mut state = serializer.serialize_struct("Nested", 1)?;
            state.serialize_field("inner", std::str::from_utf8(&inner.payload).unwrap())?;
            state.end()
        }
    }

    #[test]
    fn the_payload_is_the_json_and_no_larger() {
        for len in [0, 1, 100, 5_000, 200_000, 10] {
            let note = Note {
                text: "é\"x".repeat(len),
            };
            let envelope = Envelope::new(&note).unwrap();
            assert_eq!(
                envelope.payload,
                serde_json::to_vec(&note).unwrap(),
                "{len}"
            );
            assert_eq!(envelope.decode::<Note>().unwrap(), note);
            // The only handle on its buffer turns back into the `Vec` it was made from, without
            // a copy: one allocation of exactly the JSON's size.
            let vec = Vec::from(envelope.payload);
            assert_eq!(vec.capacity(), vec.len(), "{len}");
        }
    }

    #[test]
    fn a_message_that_builds_an_envelope_while_serialized_gets_both_right() {
        let envelope = Envelope::new(&Nested {
            inner: "hi".to_owned(),
        })
        .unwrap();
        let outer: serde_json::Value = serde_json::from_slice(&envelope.payload).unwrap();
        assert_eq!(outer["inner"], r#"{"text":"hi"}"#);
    }

    #[test]
    fn ids_made_in_a_row_sort_in_that_order_and_carry_their_creation_time() {
        let envelopes: Vec<Envelope> = (0..10_000)
            .map(|_| Envelope::from_raw("encode.Note", &b"{}"[..]))
            .collect();
        for pair in envelopes.windows(2) {
            assert!(
                pair[0].id < pair[1].id,
                "{} then {}",
                pair[0].id,
                pair[1].id
            );
        }
        for envelope in &envelopes {
            let (seconds, nanos) = envelope.id.get_timestamp().unwrap().to_unix();
            let id_millis = seconds as i64 * 1000 + i64::from(nanos / 1_000_000);
            // The same reading of the clock (an id never goes back in time, even when the
            // clock does: then it keeps the last millisecond).
            let created_millis = envelope.created_at.timestamp_millis();
            assert!(
                (0..1_000).contains(&(id_millis - created_millis)),
                "id at {id_millis} ms, created at {created_millis} ms"
            );
        }
    }
}
