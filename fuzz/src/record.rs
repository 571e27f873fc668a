//! `decode_record`: a Kafka record as the Kafka worker reads it, with `kafka::wire::read` (and,
//! when it is refused, `salvage` for its dead letter).
//!
//! Layout of the input (see [`crate::bytes`] for the field encodings):
//!
//! | field | encoding | |
//! |---|---|---|
//! | `max_payload_bytes` | `u16` | |
//! | flags | `u8` | bit 0 a payload; bit 1 a key; bit 2 a create time, bit 3 a log-append time |
//! | key | short bytes | with bit 1 |
//! | timestamp | `u64` | with bit 2 or 3 (milliseconds, as an `i64`) |
//! | partition, offset | `u8`, `u32` | |
//! | header count | `u8` | the low 4 bits count |
//! | each header | name, value | name: a byte, below [`KNOWN_HEADERS`]`.len()` one of them, else a text follows; value: a byte, odd for a value, then short bytes (any bytes, not only UTF-8) |
//! | payload | the rest | with bit 0 |

use hexeract::kafka::wire::headers;
use hexeract::Reason;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

use crate::bytes::{Reader, Writer};

/// The topic's aggregate.
pub const AGGREGATE: &str = "order";

/// Header names the decoder treats specially, each one byte away for the fuzzer.
pub const KNOWN_HEADERS: [&str; 9] = [
    headers::ID,
    headers::TYPE,
    headers::TIME,
    headers::CONTENT_TYPE,
    headers::CORRELATION_ID,
    headers::CAUSATION_ID,
    headers::PARTITION_KEY,
    headers::SPEC_VERSION,
    "traceparent",
];

const PAYLOAD: u8 = 1;
const KEY: u8 = 1 << 1;
const CREATE_TIME: u8 = 1 << 2;
const LOG_APPEND_TIME: u8 = 1 << 3;

/// What a producer can put in a record, and the worker's payload limit.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordInput {
    pub max_payload_bytes: u16,
    pub key: Option<Vec<u8>>,
    pub timestamp: Timestamp,
    pub partition: u8,
    pub offset: u32,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub payload: Option<Vec<u8>>,
}

crate::arbitrary_from_bytes!(RecordInput);

impl Default for RecordInput {
    fn default() -> RecordInput {
        RecordInput::from_bytes(&[])
    }
}

impl RecordInput {
    pub fn from_bytes(data: &[u8]) -> RecordInput {
        let mut r = Reader::new(data);
        let max_payload_bytes = r.u16();
        let flags = r.u8();
        let key = (flags & KEY != 0).then(|| r.short_bytes().to_vec());
        let timestamp = if flags & CREATE_TIME != 0 {
            Timestamp::CreateTime(r.u64() as i64)
        } else if flags & LOG_APPEND_TIME != 0 {
            Timestamp::LogAppendTime(r.u64() as i64)
        } else {
            Timestamp::NotAvailable
        };
        let partition = r.u8();
        let offset = r.u32();
        let count = r.u8() & 0x0f;
        let headers = (0..count)
            .map(|_| {
                let selector = usize::from(r.u8());
                let name = match KNOWN_HEADERS.get(selector) {
                    Some(known) => (*known).to_owned(),
                    None => r.short_text(),
                };
                let value = (r.u8() & 1 == 1).then(|| r.short_bytes().to_vec());
                (name, value)
            })
            .collect();
        RecordInput {
            max_payload_bytes,
            key,
            timestamp,
            partition,
            offset,
            headers,
            payload: (flags & PAYLOAD != 0).then(|| r.rest().to_vec()),
        }
    }

    /// The bytes [`RecordInput::from_bytes`] reads back as this input.
    ///
    /// # Panics
    ///
    /// When a key, header name or value is longer than 255 bytes, or there are more than 15
    /// headers: inputs the layout cannot hold.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        let (time_flag, millis) = match self.timestamp {
            Timestamp::NotAvailable => (0, None),
            Timestamp::CreateTime(millis) => (CREATE_TIME, Some(millis)),
            Timestamp::LogAppendTime(millis) => (LOG_APPEND_TIME, Some(millis)),
        };
        let flag = |set: bool, bit: u8| if set { bit } else { 0 };
        let flags =
            flag(self.payload.is_some(), PAYLOAD) | flag(self.key.is_some(), KEY) | time_flag;
        w.u16(self.max_payload_bytes).u8(flags);
        if let Some(key) = &self.key {
            w.short_bytes(key);
        }
        if let Some(millis) = millis {
            w.u64(millis as u64);
        }
        assert!(self.headers.len() <= 0x0f, "at most 15 headers");
        w.u8(self.partition)
            .u32(self.offset)
            .u8(self.headers.len() as u8);
        for (name, value) in &self.headers {
            match KNOWN_HEADERS.iter().position(|known| known == name) {
                Some(index) => w.u8(index as u8),
                None => w.u8(u8::MAX).short_text(name),
            };
            match value {
                Some(value) => w.u8(1).short_bytes(value),
                None => w.u8(0),
            };
        }
        if let Some(payload) = &self.payload {
            w.bytes(payload);
        }
        w.finish()
    }

    /// The record the consumer would hand the worker.
    pub fn to_record(&self) -> OwnedMessage {
        let mut list = OwnedHeaders::new_with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            list = list.insert(Header {
                key: name,
                value: value.as_deref(),
            });
        }
        OwnedMessage::new(
            self.payload.clone(),
            self.key.clone(),
            format!("shop.{AGGREGATE}"),
            self.timestamp,
            i32::from(self.partition),
            i64::from(self.offset),
            Some(list),
        )
    }
}

/// Reads the record of `input` and panics if an invariant of the decoder does not hold:
///
/// - it is an envelope, or refused with one of [`Reason::ALL`] and a detail;
/// - a payload over the limit is refused as `payload_too_large`, whatever else is wrong with
///   the record, and only such a payload is;
/// - an envelope has the record's payload, a type, the topic's aggregate, attempt 0, the same
///   id at every read, and none of the CloudEvents headers among its own;
/// - the dead-letter salvage of the record keeps its payload and has the same id at every read.
pub fn check(input: &RecordInput) {
    let record = input.to_record();
    let limit = usize::from(input.max_payload_bytes);
    let payload = input.payload.as_deref().unwrap_or_default();
    let oversized = payload.len() > limit;
    match hexeract::fuzzing::read_record(&record, AGGREGATE, limit) {
        Err((reason, detail)) => {
            assert!(Reason::ALL.contains(&reason), "unknown reason {reason:?}");
            assert!(!detail.is_empty(), "{reason} without a detail");
            assert_eq!(
                reason == Reason::PAYLOAD_TOO_LARGE,
                oversized,
                "{} bytes, limit {limit}: refused as {reason} ({detail})",
                payload.len(),
            );
        }
        Ok(envelope) => {
            assert!(!oversized, "{} bytes read, limit {limit}", payload.len());
            assert_eq!(&envelope.payload[..], payload, "the payload, as recorded");
            assert!(
                !envelope.message_type.is_empty(),
                "an envelope without a type"
            );
            assert_eq!(envelope.aggregate.as_deref(), Some(AGGREGATE));
            assert_eq!(envelope.attempt, 0);
            for name in envelope.headers.keys() {
                assert!(
                    !name.starts_with("ce_") && name != headers::CONTENT_TYPE,
                    "header {name:?} copied into the envelope"
                );
            }
            let again = hexeract::fuzzing::read_record(&record, AGGREGATE, limit)
                .expect("readable the second time");
            assert_eq!(again.id, envelope.id, "the same id at every read");
        }
    }
    let salvaged = hexeract::fuzzing::salvage_record(&record, AGGREGATE);
    assert_eq!(
        &salvaged.payload[..],
        payload,
        "a dead letter keeps the payload"
    );
    let again = hexeract::fuzzing::salvage_record(&record, AGGREGATE);
    assert_eq!(
        again.id, salvaged.id,
        "a dead letter's id is the same at every read"
    );
}

/// The corpus seeds of `decode_record` (`fuzz/corpus/decode_record/`), by file name: an
/// `envelope-…` seed is read as an envelope, any other is refused with the reason it is named
/// after.
pub fn seeds() -> Vec<(&'static str, RecordInput)> {
    let header = |name: &str, value: &str| (name.to_owned(), Some(value.as_bytes().to_vec()));
    let published = RecordInput {
        max_payload_bytes: 1024,
        key: Some(b"order-7".to_vec()),
        timestamp: Timestamp::CreateTime(1_720_000_000_123),
        partition: 2,
        offset: 41,
        headers: vec![
            header(headers::SPEC_VERSION, "1.0"),
            header(headers::ID, "0190b3c4-7d2e-7a1b-9c3d-5e6f7a8b9c0d"),
            header(headers::TYPE, "OrderPlaced"),
            header(headers::SOURCE, "/hexeract/shop"),
            header(headers::TIME, "2024-07-03T09:46:40.123Z"),
            header(headers::CONTENT_TYPE, "application/json"),
            header(headers::PARTITION_KEY, "order-7"),
            header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ],
        payload: Some(br#"{"order_id":7,"total_cents":1999}"#.to_vec()),
    };
    vec![
        ("envelope-published", published),
        (
            "envelope-foreign",
            RecordInput {
                max_payload_bytes: 1024,
                headers: vec![
                    header(headers::ID, "order-7-placed"),
                    header(headers::TYPE, "OrderPlaced"),
                    ("x-binary".to_owned(), Some(vec![0xff, 0xfe])),
                    ("x-empty".to_owned(), None),
                ],
                payload: Some(br#"{"order_id":7}"#.to_vec()),
                ..RecordInput::default()
            },
        ),
        (
            "payload_too_large",
            RecordInput {
                max_payload_bytes: 8,
                payload: Some(b"more than eight bytes".to_vec()),
                ..RecordInput::default()
            },
        ),
        (
            "message_id_missing",
            RecordInput {
                max_payload_bytes: 1024,
                headers: vec![header(headers::TYPE, "OrderPlaced")],
                payload: Some(b"{}".to_vec()),
                ..RecordInput::default()
            },
        ),
        (
            "unknown_message_type",
            RecordInput {
                max_payload_bytes: 1024,
                headers: vec![header(headers::ID, "m-1")],
                ..RecordInput::default()
            },
        ),
    ]
}
