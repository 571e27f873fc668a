//! The Kafka wire format: an [`Envelope`] as a record (key, value, headers) and back.
//!
//! The headers follow the CloudEvents Kafka protocol binding in binary mode, so that consumers
//! not written with Hexeract can read a record without knowing Hexeract: `ce_specversion`
//! (`1.0`), `ce_id`, `ce_type`, `ce_source`, `ce_time` and `content-type`, plus the extensions
//! `ce_correlationid`, `ce_causationid` and `ce_partitionkey` (the aggregate id, also the
//! record key). The envelope's other headers (such as `traceparent`) travel under their own
//! names. `docs/kafka.md` lists them.

use std::collections::BTreeMap;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use uuid::Uuid;

use crate::delivery::verdict::Unreadable;
use crate::envelope::Envelope;
use crate::reason::Reason;

/// The content type of every Hexeract payload.
const CONTENT_TYPE: &str = "application/json";

/// Names of the record headers Hexeract reads and writes.
pub mod headers {
    /// CloudEvents version: always `1.0`.
    pub const SPEC_VERSION: &str = "ce_specversion";
    /// The message id (a UUID; handlers deduplicate on it).
    pub const ID: &str = "ce_id";
    /// The message type (`OrderPlaced`).
    pub const TYPE: &str = "ce_type";
    /// Who published it: `/hexeract/<topic prefix>`.
    pub const SOURCE: &str = "ce_source";
    /// When the message was first published, RFC 3339 with milliseconds.
    pub const TIME: &str = "ce_time";
    /// The id shared by every message of one conversation.
    pub const CORRELATION_ID: &str = "ce_correlationid";
    /// The id of the message whose handler published this one.
    pub const CAUSATION_ID: &str = "ce_causationid";
    /// The aggregate id, also the record key.
    pub const PARTITION_KEY: &str = "ce_partitionkey";
    /// The payload's media type: `application/json`.
    pub const CONTENT_TYPE: &str = "content-type";
    /// On a dead letter sent back by `dead-letters replay`: the one handler it is for. The
    /// consumer groups of the topic's other handlers pass over it only when it also carries
    /// [`REPLAY_OF`] naming a record that they have already passed and of which it is an exact
    /// copy; otherwise they handle it too, so that no producer can make a handler skip a
    /// message it never received.
    pub const REPLAY_FOR: &str = "hexeract-replay-for";
    /// On a dead letter sent back by `dead-letters replay`: the record it copies, as
    /// `<topic>/<partition>/<offset>` (the [`RECORD`] of the letter).
    pub const REPLAY_OF: &str = "hexeract-replay-of";
    /// Kept with a dead letter written by a Kafka consumer, never sent: where the record was,
    /// as `<topic>/<partition>/<offset>`.
    pub const RECORD: &str = "hexeract-kafka-record";
}

/// The record a dead letter of `envelope` read at `topic`/`partition`/`offset` came from, as
/// [`headers::RECORD`] keeps it.
pub(crate) fn position(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}/{partition}/{offset}")
}

/// `<topic>/<partition>/<offset>` read back.
pub(crate) fn parse_position(position: &str) -> Option<(&str, i32, i64)> {
    let mut parts = position.rsplitn(3, '/');
    let offset = parts.next()?.parse().ok()?;
    let partition = parts.next()?.parse().ok()?;
    let topic = parts.next().filter(|topic| !topic.is_empty())?;
    Some((topic, partition, offset))
}

/// The message `dead-letters replay` sends back through the outbox for `letter` under
/// `KAFKA_BROKERS`: the letter's message as it was (id, type, payload), attempts from 0,
/// addressed to the letter's handler ([`headers::REPLAY_FOR`]) and naming the record it copies
/// ([`headers::REPLAY_OF`]) when a Kafka consumer wrote the letter. The topic's other handlers
/// pass over it only once they have checked that it is an exact copy of a record they have
/// already passed; a letter without its record (written by a relay, or before this header
/// existed) is handled again by every handler of its type.
///
/// ```
/// use hexeract::kafka::wire::{headers, replay_envelope};
/// use hexeract::{DeadLetter, Envelope, Reason};
///
/// let envelope = Envelope::from_raw("shop.OrderPlaced", &b"{}"[..])
///     .with_header(headers::RECORD, "shop.order/2/41");
/// let letter = DeadLetter::new(envelope, Some("shop::reserve_stock".into()), Reason::HANDLER_REJECTED, "");
/// let replay = replay_envelope(&letter);
/// assert_eq!(replay.id, letter.envelope.id);
/// assert_eq!(replay.headers[headers::REPLAY_FOR], "shop::reserve_stock");
/// assert_eq!(replay.headers[headers::REPLAY_OF], "shop.order/2/41");
/// assert!(!replay.headers.contains_key(headers::RECORD));
/// ```
pub fn replay_envelope(letter: &crate::dead_letter::DeadLetter) -> Envelope {
    let mut envelope = letter.envelope.clone();
    envelope.attempt = 0;
    envelope.headers.remove(headers::REPLAY_FOR);
    envelope.headers.remove(headers::REPLAY_OF);
    if let Some(handler) = &letter.handler {
        envelope
            .headers
            .insert(headers::REPLAY_FOR.to_owned(), handler.clone());
        if let Some(record) = envelope.headers.remove(headers::RECORD) {
            envelope
                .headers
                .insert(headers::REPLAY_OF.to_owned(), record);
        }
    }
    envelope.headers.remove(headers::RECORD);
    envelope
}

/// The record headers of `envelope`, published by `source`.
pub(crate) fn record_headers(envelope: &Envelope, source: &str) -> OwnedHeaders {
    let id = envelope.id.to_string();
    let time = envelope
        .created_at
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let correlation = envelope.correlation_id.map(|id| id.to_string());
    let causation = envelope.causation_id.map(|id| id.to_string());
    let mut out = OwnedHeaders::new_with_capacity(8 + envelope.headers.len());
    let mut add = |key: &str, value: &str| {
        out = std::mem::take(&mut out).insert(Header {
            key,
            value: Some(value.as_bytes()),
        });
    };
    add(headers::SPEC_VERSION, "1.0");
    add(headers::ID, &id);
    add(headers::TYPE, &envelope.message_type);
    add(headers::SOURCE, source);
    add(headers::TIME, &time);
    add(headers::CONTENT_TYPE, CONTENT_TYPE);
    if let Some(correlation) = &correlation {
        add(headers::CORRELATION_ID, correlation);
    }
    if let Some(causation) = &causation {
        add(headers::CAUSATION_ID, causation);
    }
    if let Some(key) = &envelope.aggregate_key {
        add(headers::PARTITION_KEY, key);
    }
    for (name, value) in &envelope.headers {
        if !name.starts_with("ce_") && name != headers::CONTENT_TYPE {
            add(name, value);
        }
    }
    out
}

/// Reads a record into an envelope (attempt 0). The size is checked first, before anything is
/// copied or parsed. `aggregate` is the topic's aggregate.
pub(crate) fn read(
    record: &impl rdkafka::Message,
    aggregate: &str,
    max_payload_bytes: usize,
) -> Result<Envelope, Unreadable> {
    let payload = record.payload().unwrap_or_default();
    if payload.len() > max_payload_bytes {
        return Err(Unreadable {
            reason: Reason::PAYLOAD_TOO_LARGE,
            detail: crate::delivery::payload_too_large_detail(payload.len(), max_payload_bytes),
        });
    }
    let (mut envelope, given) = parse(record, aggregate);
    if !given.header_names_readable {
        return Err(Unreadable {
            reason: Reason::PAYLOAD_INVALID,
            detail: "a header name is not valid UTF-8: the record's headers cannot be read"
                .to_owned(),
        });
    }
    if let Some(content_type) = &given.content_type {
        let essence = content_type.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case(CONTENT_TYPE) {
            return Err(Unreadable {
                reason: Reason::PAYLOAD_INVALID,
                detail: format!("content type {content_type:?} is not {CONTENT_TYPE}"),
            });
        }
    }
    match given.id.as_deref() {
        None | Some("") => {
            return Err(Unreadable {
                reason: Reason::MESSAGE_ID_MISSING,
                detail: format!(
                    "the record has no {} header: without one, redeliveries cannot be told \
                     apart from new messages",
                    headers::ID
                ),
            })
        }
        Some(id) if Uuid::parse_str(id).is_err() => {
            envelope
                .headers
                .insert("x-original-message-id".to_owned(), id.to_owned());
        }
        Some(_) => {}
    }
    if envelope.message_type.is_empty() {
        return Err(Unreadable {
            reason: Reason::UNKNOWN_MESSAGE_TYPE,
            detail: format!(
                "the record has no {} header: no handler can be chosen for it",
                headers::TYPE
            ),
        });
    }
    Ok(envelope)
}

/// Everything a record says about its message, without judging it: what [`read`] starts from,
/// and what a dead letter keeps of a record that cannot be read. A record without a usable id
/// gets one derived from where it is (topic, partition, offset), so that reading it again
/// gives the same id.
pub(crate) fn salvage(record: &impl rdkafka::Message, aggregate: &str) -> Envelope {
    parse(record, aggregate).0
}

/// What a record's headers said that the envelope does not keep as given.
struct Given {
    id: Option<String>,
    content_type: Option<String>,
    /// False when a header name is not UTF-8 (see [`header_names_readable`]).
    header_names_readable: bool,
}

/// Whether rdkafka can read every header of `record`. rdkafka 0.38 panics on a header name
/// that is not UTF-8 (`CStr::to_str().unwrap()` in its header reader), which any producer
/// can send: a partition task would die on such a record, and read it again, forever. Each
/// header is tried once, with the panic caught; the record is then dead-lettered without
/// its headers instead.
fn header_names_readable(record: &impl rdkafka::Message) -> bool {
    let Some(list) = record.headers() else {
        return true;
    };
    (0..list.count()).all(|idx| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = list.try_get(idx);
        }))
        .is_ok()
    })
}

/// The envelope of [`salvage`] and what [`read`] judges it by, in one pass over the headers.
fn parse(record: &impl rdkafka::Message, aggregate: &str) -> (Envelope, Given) {
    let mut given = Given {
        id: None,
        content_type: None,
        header_names_readable: header_names_readable(record),
    };
    let mut envelope = Envelope {
        id: position_id(record.topic(), record.partition(), record.offset()),
        message_type: String::new(),
        payload: Bytes::copy_from_slice(record.payload().unwrap_or_default()),
        correlation_id: None,
        causation_id: None,
        headers: BTreeMap::new(),
        attempt: 0,
        created_at: record
            .timestamp()
            .to_millis()
            .and_then(DateTime::<Utc>::from_timestamp_millis)
            .unwrap_or_else(Utc::now),
        aggregate: Some(aggregate.to_owned()),
        aggregate_key: record
            .key()
            .and_then(|key| std::str::from_utf8(key).ok())
            .map(str::to_owned),
    };
    let Some(list) = record.headers().filter(|_| given.header_names_readable) else {
        return (envelope, given);
    };
    for header in list.iter() {
        let Some(value) = header
            .value
            .and_then(|value| std::str::from_utf8(value).ok())
        else {
            continue;
        };
        match header.key {
            headers::ID => {
                envelope.id = Uuid::parse_str(value).unwrap_or_else(|_| derived_id(value));
                given.id = Some(value.to_owned());
            }
            headers::TYPE => envelope.message_type = value.to_owned(),
            headers::CORRELATION_ID => envelope.correlation_id = Uuid::parse_str(value).ok(),
            headers::CAUSATION_ID => envelope.causation_id = Uuid::parse_str(value).ok(),
            headers::TIME => {
                if let Ok(at) = DateTime::parse_from_rfc3339(value) {
                    envelope.created_at = at.with_timezone(&Utc);
                }
            }
            headers::PARTITION_KEY => envelope.aggregate_key = Some(value.to_owned()),
            headers::CONTENT_TYPE => given.content_type = Some(value.to_owned()),
            name if name.starts_with("ce_") => {}
            name => {
                envelope.headers.insert(name.to_owned(), value.to_owned());
            }
        }
    }
    (envelope, given)
}

/// A stable UUID for a producer's id that is not one (UUID v5 in a namespace of Hexeract's).
fn derived_id(id: &str) -> Uuid {
    const NAMESPACE: Uuid = Uuid::from_u128(0x6865_7865_7261_6374_2d6b_6166_6b61_6964);
    Uuid::new_v5(&NAMESPACE, id.as_bytes())
}

/// The id of the record at `topic`/`partition`/`offset`, the same each time it is read.
fn position_id(topic: &str, partition: i32, offset: i64) -> Uuid {
    derived_id(&format!("{topic}/{partition}/{offset}"))
}

/// The id of the dead letter `handler` writes for message `message` at this position: the
/// same when the record is read again after a restart, so the store keeps one letter, not two;
/// another for another message at the same position (a topic deleted and created again).
pub(crate) fn dead_letter_id(
    topic: &str,
    partition: i32,
    offset: i64,
    handler: &str,
    message: Uuid,
) -> Uuid {
    derived_id(&format!(
        "dead-letter/{handler}/{topic}/{partition}/{offset}/{message}"
    ))
}

/// The record's `ce_type`, when it has one.
pub(crate) fn message_type(record: &impl rdkafka::Message) -> Option<&str> {
    if !header_names_readable(record) {
        return None;
    }
    record
        .headers()?
        .iter()
        .find(|header| header.key == headers::TYPE)
        .and_then(|header| header.value)
        .and_then(|value| std::str::from_utf8(value).ok())
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{OwnedMessage, Timestamp};

    use super::*;

    fn record(headers: OwnedHeaders, payload: &[u8]) -> OwnedMessage {
        OwnedMessage::new(
            Some(payload.to_vec()),
            Some(b"order-7".to_vec()),
            "shop.order".to_owned(),
            Timestamp::CreateTime(1_700_000_000_000),
            2,
            41,
            Some(headers),
        )
    }

    #[test]
    fn an_envelope_survives_the_trip_through_a_record() {
        let mut envelope = Envelope::from_raw("OrderPlaced", &b"{\"order\":7}"[..])
            .with_correlation_id(Uuid::now_v7())
            .with_header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            );
        envelope.causation_id = Some(Uuid::now_v7());
        envelope.aggregate = Some("order".to_owned());
        envelope.aggregate_key = Some("order-7".to_owned());
        let record = record(
            record_headers(&envelope, "/hexeract/shop"),
            &envelope.payload,
        );
        let read = read(&record, "order", 1024).expect("readable");
        assert_eq!(read.id, envelope.id);
        assert_eq!(read.message_type, "OrderPlaced");
        assert_eq!(read.payload, envelope.payload);
        assert_eq!(read.correlation_id, envelope.correlation_id);
        assert_eq!(read.causation_id, envelope.causation_id);
        assert_eq!(read.headers, envelope.headers);
        assert_eq!(read.aggregate.as_deref(), Some("order"));
        assert_eq!(read.aggregate_key.as_deref(), Some("order-7"));
        assert_eq!(
            read.created_at.timestamp_millis(),
            envelope.created_at.timestamp_millis()
        );
    }

    #[test]
    fn records_hexeract_cannot_use_say_why() {
        let none = record(OwnedHeaders::new(), b"{}");
        let error = read(&none, "order", 1024).unwrap_err();
        assert_eq!(error.reason, Reason::MESSAGE_ID_MISSING);
        let untyped = record(
            OwnedHeaders::new().insert(Header {
                key: headers::ID,
                value: Some("order-7-placed"),
            }),
            b"{}",
        );
        assert_eq!(
            read(&untyped, "order", 1024).unwrap_err().reason,
            Reason::UNKNOWN_MESSAGE_TYPE
        );
        let xml = record(
            OwnedHeaders::new()
                .insert(Header {
                    key: headers::ID,
                    value: Some("1"),
                })
                .insert(Header {
                    key: headers::TYPE,
                    value: Some("OrderPlaced"),
                })
                .insert(Header {
                    key: headers::CONTENT_TYPE,
                    value: Some("application/xml"),
                }),
            b"<order/>",
        );
        assert_eq!(
            read(&xml, "order", 1024).unwrap_err().reason,
            Reason::PAYLOAD_INVALID
        );
        let big = record(OwnedHeaders::new(), &[b'x'; 2048]);
        assert_eq!(
            read(&big, "order", 1024).unwrap_err().reason,
            Reason::PAYLOAD_TOO_LARGE
        );
    }

    #[test]
    fn a_record_without_a_usable_id_keeps_one_id_across_reads() {
        let none = record(OwnedHeaders::new(), b"garbage");
        assert_eq!(salvage(&none, "order").id, salvage(&none, "order").id);
        assert_eq!(
            salvage(&none, "order").payload,
            Bytes::from_static(b"garbage")
        );
        let named = record(
            OwnedHeaders::new().insert(Header {
                key: headers::ID,
                value: Some("order-7-placed"),
            }),
            b"{}",
        );
        assert_ne!(salvage(&named, "order").id, salvage(&none, "order").id);
        assert_eq!(salvage(&named, "order").id, derived_id("order-7-placed"));
    }
}

/// Properties of the Kafka record format: every envelope survives the trip through a record;
/// any record at all is read without a panic, as an envelope or as exactly one of the
/// dead-letter reasons; a payload over the limit is refused before anything is parsed.
#[cfg(test)]
mod properties {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use rdkafka::message::{OwnedMessage, Timestamp};

    use super::*;
    use crate::proptest_support::envelope as any_envelope;

    prop_compose! {
        fn arbitrary_record()(
            payload in proptest::option::of(vec(any::<u8>(), 0..4096)),
            key in proptest::option::of(vec(any::<u8>(), 0..64)),
            headers in vec(
                (
                    prop_oneof![
                        Just(headers::ID.to_owned()),
                        Just(headers::TYPE.to_owned()),
                        Just(headers::TIME.to_owned()),
                        Just(headers::CONTENT_TYPE.to_owned()),
                        Just(headers::CORRELATION_ID.to_owned()),
                        "[a-z_-]{1,20}",
                    ],
                    proptest::option::of(vec(any::<u8>(), 0..64)),
                ),
                0..10,
            ),
            offset in 0i64..1_000_000,
        ) -> OwnedMessage {
            let mut list = OwnedHeaders::new();
            for (name, value) in &headers {
                list = list.insert(Header { key: name, value: value.as_deref() });
            }
            OwnedMessage::new(
                payload,
                key,
                "shop.order".to_owned(),
                Timestamp::NotAvailable,
                0,
                offset,
                Some(list),
            )
        }
    }

    proptest! {
        #[test]
        fn every_envelope_survives_the_trip(
            envelope in any_envelope("[a-b][a-z0-9-]{0,20}"),
            key in "\\PC{0,40}",
        ) {
            let mut envelope = envelope;
            envelope.aggregate = Some("order".to_owned());
            envelope.aggregate_key = Some(key);
            let record = OwnedMessage::new(
                Some(envelope.payload.to_vec()),
                envelope.aggregate_key.clone().map(String::into_bytes),
                "shop.order".to_owned(),
                Timestamp::CreateTime(envelope.created_at.timestamp_millis()),
                1,
                7,
                Some(record_headers(&envelope, "/hexeract/shop")),
            );
            let read = read(&record, "order", 4096).expect("readable");
            prop_assert_eq!(read.id, envelope.id);
            prop_assert_eq!(&read.message_type, &envelope.message_type);
            prop_assert_eq!(&read.payload, &envelope.payload);
            prop_assert_eq!(read.correlation_id, envelope.correlation_id);
            prop_assert_eq!(read.causation_id, envelope.causation_id);
            prop_assert_eq!(&read.headers, &envelope.headers);
            prop_assert_eq!(&read.aggregate_key, &envelope.aggregate_key);
            prop_assert_eq!(read.created_at, envelope.created_at);
        }

        #[test]
        fn any_record_is_an_envelope_or_one_known_reason(record in arbitrary_record()) {
            match read(&record, "order", 2048) {
                Ok(envelope) => prop_assert!(!envelope.message_type.is_empty()),
                Err(unreadable) => {
                    prop_assert!(Reason::ALL.contains(&unreadable.reason), "{:?}", unreadable.reason);
                    prop_assert!(!unreadable.detail.is_empty());
                }
            }
            // A record's salvage id is the same each time it is read.
            prop_assert_eq!(salvage(&record, "order").id, salvage(&record, "order").id);
        }

        #[test]
        fn an_oversized_payload_is_refused_before_anything_else(
            record in arbitrary_record(),
            limit in 0usize..64,
        ) {
            prop_assume!(rdkafka::Message::payload(&record).map_or(0, <[u8]>::len) > limit);
            prop_assert_eq!(read(&record, "order", limit).unwrap_err().reason, Reason::PAYLOAD_TOO_LARGE);
        }
    }
}
