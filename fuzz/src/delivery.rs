//! `decode_delivery`: an AMQP delivery as lapin hands it to the RabbitMQ worker, read by
//! `rabbitmq::wire::read` (and, when it is refused, kept by `salvage` for its dead letter).
//!
//! Layout of the input (see [`crate::bytes`] for the field encodings):
//!
//! | field | encoding | |
//! |---|---|---|
//! | `max_payload_bytes` | `u16` | |
//! | flags | `u8` | bit 0 redelivered; bits 1–5: `message_id`, `content_type`, `type`, `correlation_id`, `timestamp` present; bit 6 another exchange than the message exchange; bit 7 a header table present |
//! | exchange | text | with bit 6 |
//! | `message_id`, `content_type`, `type`, `correlation_id` | text each | each with its bit |
//! | `timestamp` | `u64` | with bit 5 |
//! | routing key | text | |
//! | header count | `u8` | with bit 7; the low 4 bits count |
//! | each header | name, value | name: a byte, below [`KNOWN_HEADERS`]`.len()` one of them, else a text follows; value: see [`read_value`] |
//! | body | the rest | |

use hexeract::rabbitmq::headers;
use hexeract::Reason;
use lapin::message::Delivery;
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use lapin::BasicProperties;
use uuid::Uuid;

use crate::bytes::{Reader, Writer};

/// The worker's message exchange: a delivery from it with no `type` takes its routing key as
/// the type.
pub const EXCHANGE: &str = "hexeract";

/// Header names the decoder treats specially, each one byte away for the fuzzer.
pub const KNOWN_HEADERS: [&str; 8] = [
    headers::ATTEMPTS,
    headers::DELIVERY_COUNT,
    headers::CREATED_AT,
    headers::CAUSATION_ID,
    headers::ORIGINAL_MESSAGE_ID,
    "x-death",
    "traceparent",
    headers::REASON,
];

/// Tables and arrays nested deeper than this are read as empty.
const MAX_DEPTH: usize = 4;

const REDELIVERED: u8 = 1;
const MESSAGE_ID: u8 = 1 << 1;
const CONTENT_TYPE: u8 = 1 << 2;
const KIND: u8 = 1 << 3;
const CORRELATION_ID: u8 = 1 << 4;
const TIMESTAMP: u8 = 1 << 5;
const OTHER_EXCHANGE: u8 = 1 << 6;
const HEADERS: u8 = 1 << 7;

/// What a broker can put in a delivery, and the worker's payload limit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeliveryInput {
    pub max_payload_bytes: u16,
    pub redelivered: bool,
    /// `None`: the message exchange ([`EXCHANGE`]).
    pub exchange: Option<String>,
    pub message_id: Option<String>,
    pub content_type: Option<String>,
    pub kind: Option<String>,
    pub correlation_id: Option<String>,
    pub timestamp: Option<u64>,
    pub routing_key: String,
    /// `None`: no header table at all.
    pub headers: Option<Vec<(String, AMQPValue)>>,
    pub body: Vec<u8>,
}

crate::arbitrary_from_bytes!(DeliveryInput);

impl DeliveryInput {
    pub fn from_bytes(data: &[u8]) -> DeliveryInput {
        let mut r = Reader::new(data);
        let max_payload_bytes = r.u16();
        let flags = r.u8();
        let text_if = |r: &mut Reader<'_>, bit: u8| (flags & bit != 0).then(|| r.short_text());
        let exchange = text_if(&mut r, OTHER_EXCHANGE);
        let message_id = text_if(&mut r, MESSAGE_ID);
        let content_type = text_if(&mut r, CONTENT_TYPE);
        let kind = text_if(&mut r, KIND);
        let correlation_id = text_if(&mut r, CORRELATION_ID);
        let timestamp = (flags & TIMESTAMP != 0).then(|| r.u64());
        let routing_key = r.short_text();
        let headers = (flags & HEADERS != 0).then(|| {
            let count = r.u8() & 0x0f;
            (0..count)
                .map(|_| {
                    let selector = usize::from(r.u8());
                    let name = match KNOWN_HEADERS.get(selector) {
                        Some(known) => (*known).to_owned(),
                        None => r.short_text(),
                    };
                    (name, read_value(&mut r, 0))
                })
                .collect()
        });
        DeliveryInput {
            max_payload_bytes,
            redelivered: flags & REDELIVERED != 0,
            exchange,
            message_id,
            content_type,
            kind,
            correlation_id,
            timestamp,
            routing_key,
            headers,
            body: r.rest().to_vec(),
        }
    }

    /// The bytes [`DeliveryInput::from_bytes`] reads back as this input.
    ///
    /// # Panics
    ///
    /// When a string is longer than 255 bytes, a header table has more than 15 entries or a
    /// nested one more than 7: inputs the layout cannot hold.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        let flag = |set: bool, bit: u8| if set { bit } else { 0 };
        let flags = flag(self.redelivered, REDELIVERED)
            | flag(self.message_id.is_some(), MESSAGE_ID)
            | flag(self.content_type.is_some(), CONTENT_TYPE)
            | flag(self.kind.is_some(), KIND)
            | flag(self.correlation_id.is_some(), CORRELATION_ID)
            | flag(self.timestamp.is_some(), TIMESTAMP)
            | flag(self.exchange.is_some(), OTHER_EXCHANGE)
            | flag(self.headers.is_some(), HEADERS);
        w.u16(self.max_payload_bytes).u8(flags);
        for text in [
            &self.exchange,
            &self.message_id,
            &self.content_type,
            &self.kind,
            &self.correlation_id,
        ]
        .into_iter()
        .flatten()
        {
            w.short_text(text);
        }
        if let Some(timestamp) = self.timestamp {
            w.u64(timestamp);
        }
        w.short_text(&self.routing_key);
        if let Some(headers) = &self.headers {
            assert!(headers.len() <= 0x0f, "at most 15 headers");
            w.u8(headers.len() as u8);
            for (name, value) in headers {
                match KNOWN_HEADERS.iter().position(|known| known == name) {
                    Some(index) => w.u8(index as u8),
                    None => w.u8(u8::MAX).short_text(name),
                };
                write_value(&mut w, value);
            }
        }
        w.bytes(&self.body).finish()
    }

    /// The delivery lapin would hand the worker.
    pub fn to_delivery(&self) -> Delivery {
        let mut properties = BasicProperties::default();
        if let Some(headers) = &self.headers {
            let mut table = FieldTable::default();
            for (name, value) in headers {
                table.insert(short(name), value.clone());
            }
            properties = properties.with_headers(table);
        }
        if let Some(id) = &self.message_id {
            properties = properties.with_message_id(short(id));
        }
        if let Some(content_type) = &self.content_type {
            properties = properties.with_content_type(short(content_type));
        }
        if let Some(kind) = &self.kind {
            properties = properties.with_type(short(kind));
        }
        if let Some(correlation) = &self.correlation_id {
            properties = properties.with_correlation_id(short(correlation));
        }
        if let Some(timestamp) = self.timestamp {
            properties = properties.with_timestamp(timestamp);
        }
        let exchange = self.exchange.as_deref().unwrap_or(EXCHANGE);
        let mut delivery = Delivery::mock(
            1,
            short(exchange),
            short(&self.routing_key),
            self.redelivered,
            self.body.clone(),
        );
        delivery.properties = properties;
        delivery
    }
}

/// A short string; what [`Reader::short_text`] reads always fits.
fn short(text: &str) -> ShortString {
    ShortString::try_new(text).expect("at most 255 bytes")
}

/// A header value: a tag byte (modulo 18) choosing the AMQP type, then the value — numbers
/// little-endian, floats as their bits, strings as text or long bytes, arrays and tables as
/// a count byte (low 3 bits) and their entries.
pub fn read_value(r: &mut Reader<'_>, depth: usize) -> AMQPValue {
    let count = |r: &mut Reader<'_>| {
        let count = r.u8() & 0x07;
        if depth < MAX_DEPTH {
            count
        } else {
            0
        }
    };
    match r.u8() % 18 {
        0 => AMQPValue::Boolean(r.u8() & 1 == 1),
        1 => AMQPValue::ShortShortInt(r.u8() as i8),
        2 => AMQPValue::ShortShortUInt(r.u8()),
        3 => AMQPValue::ShortInt(r.u16() as i16),
        4 => AMQPValue::ShortUInt(r.u16()),
        5 => AMQPValue::LongInt(r.u32() as i32),
        6 => AMQPValue::LongUInt(r.u32()),
        7 => AMQPValue::LongLongInt(r.u64() as i64),
        8 => AMQPValue::Float(f32::from_bits(r.u32())),
        9 => AMQPValue::Double(f64::from_bits(r.u64())),
        10 => AMQPValue::DecimalValue(DecimalValue {
            scale: r.u8(),
            value: r.u32(),
        }),
        11 => AMQPValue::ShortString(short(&r.short_text())),
        12 => AMQPValue::LongString(LongString::from(r.long_bytes())),
        13 => {
            let count = count(r);
            let values: Vec<AMQPValue> = (0..count).map(|_| read_value(r, depth + 1)).collect();
            AMQPValue::FieldArray(FieldArray::from(values))
        }
        14 => AMQPValue::Timestamp(r.u64()),
        15 => {
            let count = count(r);
            let mut table = FieldTable::default();
            for _ in 0..count {
                let name = short(&r.short_text());
                table.insert(name, read_value(r, depth + 1));
            }
            AMQPValue::FieldTable(table)
        }
        16 => AMQPValue::ByteArray(ByteArray::from(r.long_bytes())),
        _ => AMQPValue::Void,
    }
}

fn write_value(w: &mut Writer, value: &AMQPValue) {
    match value {
        AMQPValue::Boolean(v) => w.u8(0).u8(u8::from(*v)),
        AMQPValue::ShortShortInt(v) => w.u8(1).u8(*v as u8),
        AMQPValue::ShortShortUInt(v) => w.u8(2).u8(*v),
        AMQPValue::ShortInt(v) => w.u8(3).u16(*v as u16),
        AMQPValue::ShortUInt(v) => w.u8(4).u16(*v),
        AMQPValue::LongInt(v) => w.u8(5).u32(*v as u32),
        AMQPValue::LongUInt(v) => w.u8(6).u32(*v),
        AMQPValue::LongLongInt(v) => w.u8(7).u64(*v as u64),
        AMQPValue::Float(v) => w.u8(8).u32(v.to_bits()),
        AMQPValue::Double(v) => w.u8(9).u64(v.to_bits()),
        AMQPValue::DecimalValue(v) => w.u8(10).u8(v.scale).u32(v.value),
        AMQPValue::ShortString(v) => w.u8(11).short_text(v.as_str()),
        AMQPValue::LongString(v) => w.u8(12).long_bytes(v.as_bytes()),
        AMQPValue::FieldArray(values) => {
            let values = values.as_slice();
            assert!(values.len() <= 0x07, "at most 7 values in an array");
            w.u8(13).u8(values.len() as u8);
            for value in values {
                write_value(w, value);
            }
            w
        }
        AMQPValue::Timestamp(v) => w.u8(14).u64(*v),
        AMQPValue::FieldTable(table) => {
            let entries = table.inner();
            assert!(entries.len() <= 0x07, "at most 7 entries in a table");
            w.u8(15).u8(entries.len() as u8);
            for (name, value) in entries {
                w.short_text(name.as_str());
                write_value(w, value);
            }
            w
        }
        AMQPValue::ByteArray(v) => w.u8(16).long_bytes(v.as_slice()),
        AMQPValue::Void => w.u8(17),
    };
}

/// Reads the delivery of `input` and panics if an invariant of the decoder does not hold:
///
/// - it is an envelope, or refused with one of [`Reason::ALL`] and a detail;
/// - a body over the limit is refused as `payload_too_large`, whatever else is wrong with
///   the delivery, and only such a body is;
/// - an envelope has the delivery's body, a message id (the delivery's UUID, or one derived
///   from it with the original kept in `x-original-message-id`, the same at every read), the
///   attempt number `attempt_of` gives (at least 1), and none of the `x-` headers the
///   framework and broker keep for themselves;
/// - the dead-letter salvage of the delivery keeps its body.
pub fn check(input: &DeliveryInput) {
    let delivery = input.to_delivery();
    let limit = usize::from(input.max_payload_bytes);
    let oversized = delivery.data.len() > limit;
    match hexeract::fuzzing::read_delivery(&delivery, EXCHANGE, limit) {
        Err((reason, detail)) => {
            assert!(Reason::ALL.contains(&reason), "unknown reason {reason:?}");
            assert!(!detail.is_empty(), "{reason} without a detail");
            assert_eq!(
                reason == Reason::PAYLOAD_TOO_LARGE,
                oversized,
                "{} bytes, limit {limit}: refused as {reason} ({detail})",
                delivery.data.len(),
            );
        }
        Ok(envelope) => {
            assert!(
                !oversized,
                "{} bytes read, limit {limit}",
                delivery.data.len()
            );
            assert_eq!(envelope.payload, delivery.data, "the body, as delivered");
            assert!(envelope.attempt >= 1, "attempt {}", envelope.attempt);
            assert_eq!(
                envelope.attempt,
                hexeract::fuzzing::attempt_of_delivery(&delivery),
                "the attempt read with the envelope and alone"
            );
            let id = input.message_id.as_deref().unwrap_or_default();
            assert!(
                !id.is_empty(),
                "an envelope from a delivery without a message id"
            );
            match Uuid::parse_str(id) {
                Ok(uuid) => assert_eq!(envelope.id, uuid),
                Err(_) => assert_eq!(envelope.header(headers::ORIGINAL_MESSAGE_ID), Some(id)),
            }
            for name in envelope.headers.keys() {
                assert!(
                    !name.starts_with("x-") || name == headers::ORIGINAL_MESSAGE_ID,
                    "header {name:?} copied into the envelope"
                );
            }
            let again = hexeract::fuzzing::read_delivery(&delivery, EXCHANGE, limit)
                .expect("readable the second time");
            assert_eq!(again.id, envelope.id, "the same id at every read");
        }
    }
    let salvaged = hexeract::fuzzing::salvage_delivery(&delivery, EXCHANGE);
    assert_eq!(
        salvaged.payload, delivery.data,
        "a dead letter keeps the body"
    );
}

/// The corpus seeds of `decode_delivery` (`fuzz/corpus/decode_delivery/`), by file name: an
/// `envelope-…` seed is read as an envelope, any other is refused with the reason it is named
/// after.
pub fn seeds() -> Vec<(&'static str, DeliveryInput)> {
    let published = DeliveryInput {
        max_payload_bytes: 1024,
        message_id: Some("0190b3c4-7d2e-7a1b-9c3d-5e6f7a8b9c0d".to_owned()),
        content_type: Some("application/json".to_owned()),
        kind: Some("OrderPlaced".to_owned()),
        correlation_id: Some("0190b3c4-7d2e-7a1b-9c3d-000000000001".to_owned()),
        timestamp: Some(1_720_000_000),
        routing_key: "OrderPlaced".to_owned(),
        headers: Some(vec![
            (headers::ATTEMPTS.to_owned(), AMQPValue::LongLongInt(2)),
            (
                headers::CREATED_AT.to_owned(),
                AMQPValue::LongString("2024-07-03T09:46:40.123Z".into()),
            ),
            (
                headers::CAUSATION_ID.to_owned(),
                AMQPValue::LongString("0190b3c4-7d2e-7a1b-9c3d-000000000002".into()),
            ),
            (
                "traceparent".to_owned(),
                AMQPValue::LongString(
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
                ),
            ),
        ]),
        body: br#"{"order_id":7,"total_cents":1999}"#.to_vec(),
        ..DeliveryInput::default()
    };
    let mut death = FieldTable::default();
    death.insert(short("count"), AMQPValue::LongLongInt(1));
    death.insert(short("queue"), AMQPValue::LongString("shop.reserve".into()));
    let foreign = DeliveryInput {
        max_payload_bytes: 1024,
        redelivered: true,
        message_id: Some("order-7-placed".to_owned()),
        content_type: Some("Application/JSON; charset=utf-8".to_owned()),
        routing_key: "OrderPlaced".to_owned(),
        headers: Some(vec![
            (
                headers::DELIVERY_COUNT.to_owned(),
                AMQPValue::ShortShortUInt(3),
            ),
            (
                "x-death".to_owned(),
                AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into()),
            ),
            ("tenant".to_owned(), AMQPValue::ShortString(short("acme"))),
            ("retries".to_owned(), AMQPValue::Double(0.5)),
        ]),
        body: br#"{"order_id":7}"#.to_vec(),
        ..DeliveryInput::default()
    };
    vec![
        ("envelope-published", published),
        ("envelope-foreign", foreign),
        (
            "payload_too_large",
            DeliveryInput {
                max_payload_bytes: 16,
                content_type: Some("text/xml".to_owned()),
                body: br#"{"order_id":7,"note":"more than sixteen bytes"}"#.to_vec(),
                ..DeliveryInput::default()
            },
        ),
        (
            "message_id_missing",
            DeliveryInput {
                max_payload_bytes: 1024,
                message_id: Some(String::new()),
                kind: Some("OrderPlaced".to_owned()),
                body: b"{}".to_vec(),
                ..DeliveryInput::default()
            },
        ),
        (
            "payload_invalid",
            DeliveryInput {
                max_payload_bytes: 1024,
                message_id: Some("m-1".to_owned()),
                content_type: Some("text/xml".to_owned()),
                exchange: Some("amq.topic".to_owned()),
                body: b"<order id=\"7\"/>".to_vec(),
                ..DeliveryInput::default()
            },
        ),
    ]
}
