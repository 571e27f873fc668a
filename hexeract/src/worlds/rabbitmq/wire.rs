//! The wire format: an [`Envelope`] as AMQP properties and headers, and back
//! (`docs/wire-format.md` describes it for other producers and consumers).

use std::collections::BTreeMap;

use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use uuid::Uuid;

use crate::dead_letter::{truncate, DeadLetter};
use crate::delivery::verdict::Unreadable;
use crate::envelope::Envelope;
use crate::reason::Reason;

/// The content type of every Hexeract payload.
pub(crate) const CONTENT_TYPE: &str = "application/json";

/// Longest reason detail carried in a parked message's headers, in bytes.
pub(crate) const MAX_HEADER_DETAIL_BYTES: usize = 1024;

/// Names of the AMQP headers Hexeract reads and writes.
pub mod headers {
    /// Handler calls already made for this message by earlier deliveries that failed: absent or
    /// 0 on a fresh message. Hexeract counts attempts in this header of its own, never in
    /// `x-death`, which RabbitMQ 3.13 and later ignore when a client sets it.
    pub const ATTEMPTS: &str = "x-hexeract-attempts";
    /// The id of the message whose handler published this one.
    pub const CAUSATION_ID: &str = "x-causation-id";
    /// When the message was first published, RFC 3339 with milliseconds (the `timestamp`
    /// property has whole seconds only).
    pub const CREATED_AT: &str = "x-created-at";
    /// The message id as the producer gave it, when it was not a UUID (Hexeract then uses a
    /// UUID derived from it).
    pub const ORIGINAL_MESSAGE_ID: &str = "x-original-message-id";
    /// On a parked message: why it was parked (one of the dead-letter reasons).
    pub const REASON: &str = "x-hexeract-reason";
    /// On a parked message: what happened, at most 1 KiB.
    pub const DETAIL: &str = "x-hexeract-detail";
    /// On a parked message: the handler that gave up.
    pub const HANDLER: &str = "x-hexeract-handler";
    /// On a parked message: the queue it was consumed from.
    pub const QUEUE: &str = "x-hexeract-queue";
    /// On a copy sent back by `dead-letters replay`: the id of the dead letter it replays. A
    /// copy parked again gets a dead letter of its own, not the one it was replayed from.
    pub const REPLAY: &str = "x-hexeract-replay";
    /// On a retried or parked copy: the names (comma-separated) of the original's headers
    /// left out because with them the copy's properties would not fit in one AMQP frame
    /// (`frame_max`). The largest go first; Hexeract's own headers are kept.
    pub const DROPPED_HEADERS: &str = "x-hexeract-dropped-headers";
    /// Set by quorum queues on a redelivery: how many earlier deliveries of this copy ended
    /// without an ack.
    pub const DELIVERY_COUNT: &str = "x-delivery-count";
}

/// Headers the broker manages, never copied onto a republished message.
const BROKER_HEADERS: [&str; 8] = [
    headers::DELIVERY_COUNT,
    "x-death",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
];

/// The properties of `envelope` as published, with `attempts_made` earlier calls.
pub(crate) fn properties(envelope: &Envelope, attempts_made: u32) -> BasicProperties {
    let mut table = FieldTable::default();
    for (name, value) in &envelope.headers {
        if let Ok(name) = ShortString::try_new(name.as_str()) {
            table.insert(name, text(value));
        }
    }
    if let Some(causation) = envelope.causation_id {
        table.insert(headers::CAUSATION_ID.into(), text(&causation.to_string()));
    }
    table.insert(
        headers::CREATED_AT.into(),
        text(
            &envelope
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        ),
    );
    if attempts_made > 0 {
        table.insert(
            headers::ATTEMPTS.into(),
            AMQPValue::LongLongInt(i64::from(attempts_made)),
        );
    }
    let mut properties = BasicProperties::default()
        .with_message_id(envelope.id.to_string().into())
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(envelope.created_at.timestamp()).unwrap_or(0))
        .with_headers(table);
    if let Ok(kind) = ShortString::try_new(envelope.message_type.as_str()) {
        properties = properties.with_type(kind);
    }
    if let Some(correlation) = envelope.correlation_id {
        properties = properties.with_correlation_id(correlation.to_string().into());
    }
    properties
}

/// The properties of a dead letter's message sent back by `dead-letters replay`: its own, no
/// attempts made, and `x-hexeract-replay` naming the dead letter, so that the copy, should it
/// be parked again, gets a dead letter of its own.
pub(crate) fn replay_properties(envelope: &Envelope, dead_letter: Uuid) -> BasicProperties {
    let properties = properties(envelope, 0);
    let mut table = properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    table.insert(headers::REPLAY.into(), text(&dead_letter.to_string()));
    properties.with_headers(table.into())
}

/// The properties of `envelope` as the outbox relay publishes it: [`properties`], less the
/// largest headers Hexeract did not write when they would not fit in `budget` bytes (see
/// [`property_budget`]), their names in `x-hexeract-dropped-headers`. A row with headers over a
/// frame would otherwise make the broker close the connection on every pass.
pub(crate) fn relay_properties(envelope: &Envelope, budget: usize) -> BasicProperties {
    let properties = properties(envelope, 0);
    let size = other_properties_size(&properties)
        + properties
            .headers()
            .as_ref()
            .map_or(0, |table| table_size(table.inner()));
    if size <= budget {
        return properties;
    }
    let table = properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    fit(properties, table, budget)
}

/// Whether `envelope`'s properties fit in `budget` bytes once [`relay_properties`] left out
/// what it may: not so when headers named like Hexeract's own (`x-hexeract-…`, which it never
/// drops) are over a frame by themselves. Cheap for ordinary headers.
pub(crate) fn fits_in_a_frame(envelope: &Envelope, budget: usize) -> bool {
    let rough: usize = envelope
        .headers
        .iter()
        .map(|(name, value)| name.len() + value.len() + 8)
        .sum();
    if rough + 1024 <= budget {
        return true;
    }
    let properties = relay_properties(envelope, budget);
    let size = other_properties_size(&properties)
        + properties
            .headers()
            .as_ref()
            .map_or(0, |table| table_size(table.inner()));
    size <= budget
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes()))
}

/// How many times the broker delivered this message before (`x-delivery-count`, which a quorum
/// queue keeps; 1 for a classic queue's redelivery).
pub(crate) fn redeliveries_of(delivery: &Delivery) -> u64 {
    delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|table| {
            table
                .inner()
                .iter()
                .find(|(name, _)| name.as_str() == headers::DELIVERY_COUNT)
                .and_then(|(_, value)| number(value))
        })
        .unwrap_or(u64::from(delivery.redelivered))
}

/// The number of the call a delivery is for: the calls made before it was published
/// (`x-hexeract-attempts`), plus the broker's redeliveries of it (`x-delivery-count`), plus
/// one. What [`read`] puts in `attempt`, without reading the rest.
pub(crate) fn attempt_of(delivery: &Delivery) -> u32 {
    let mut attempts_made = 0;
    let mut redeliveries = None;
    if let Some(table) = delivery.properties.headers() {
        for (name, value) in table.inner() {
            match name.as_str() {
                headers::ATTEMPTS => attempts_made = number(value).unwrap_or(0),
                headers::DELIVERY_COUNT => redeliveries = number(value),
                _ => {}
            }
        }
    }
    attempt_from(delivery, attempts_made, redeliveries)
}

fn attempt_from(delivery: &Delivery, attempts_made: u64, redeliveries: Option<u64>) -> u32 {
    // A classic queue only says "redelivered"; a quorum queue counts.
    let redeliveries = redeliveries.unwrap_or(u64::from(delivery.redelivered));
    // Saturating: a publisher can put any number in these headers.
    let attempt = attempts_made.saturating_add(redeliveries).saturating_add(1);
    u32::try_from(attempt).unwrap_or(u32::MAX)
}

/// Reads a delivery into an envelope whose `attempt` is the number of the call about to be
/// made. The size is checked first, before anything is copied or parsed.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn read(
    delivery: &Delivery,
    exchange: &str,
    max_payload_bytes: usize,
) -> Result<Envelope, Unreadable> {
    read_payload(
        delivery,
        Bytes::from(delivery.data.clone()),
        exchange,
        max_payload_bytes,
    )
}

/// [`read`] with the delivery's body already taken out of it as `payload`: the worker moves
/// the body into the envelope instead of copying it.
pub(crate) fn read_payload(
    delivery: &Delivery,
    payload: Bytes,
    exchange: &str,
    max_payload_bytes: usize,
) -> Result<Envelope, Unreadable> {
    if payload.len() > max_payload_bytes {
        return Err(Unreadable {
            reason: Reason::PAYLOAD_TOO_LARGE,
            detail: crate::delivery::payload_too_large_detail(payload.len(), max_payload_bytes),
        });
    }
    let properties = &delivery.properties;
    let table = properties.headers().as_ref();
    let (id, original_id) = match properties.message_id().as_ref().map(ShortString::as_str) {
        None | Some("") => {
            return Err(Unreadable {
                reason: Reason::MESSAGE_ID_MISSING,
                detail: "the delivery has no message_id property: without one, redeliveries \
                         cannot be told apart from new messages"
                    .to_owned(),
            })
        }
        Some(id) => match Uuid::parse_str(id) {
            Ok(uuid) => (uuid, None),
            Err(_) => (derived_id(id), Some(id.to_owned())),
        },
    };
    if let Some(content_type) = properties.content_type() {
        let essence = content_type.as_str().split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case(CONTENT_TYPE) {
            return Err(Unreadable {
                reason: Reason::PAYLOAD_INVALID,
                detail: format!(
                    "content type {:?} is not {CONTENT_TYPE}",
                    content_type.as_str()
                ),
            });
        }
    }
    let message_type = message_type_of(delivery, exchange);
    // Built whole: `Envelope::from_raw` would draw a fresh id and read the clock, both
    // overwritten here (a `getrandom` call per delivery).
    let mut envelope = Envelope {
        id,
        message_type,
        payload,
        correlation_id: None,
        causation_id: None,
        headers: BTreeMap::new(),
        attempt: 0,
        created_at: DateTime::<Utc>::UNIX_EPOCH,
        // Not carried over AMQP: RabbitMQ keeps no per-aggregate order to use them for.
        aggregate: None,
        aggregate_key: None,
    };
    envelope.correlation_id = properties
        .correlation_id()
        .as_ref()
        .and_then(|value| Uuid::parse_str(value.as_str()).ok());
    let mut attempts_made = 0u64;
    let mut redeliveries = None;
    let mut created_at = None;
    if let Some(table) = table {
        for (name, value) in table.inner() {
            match name.as_str() {
                headers::ATTEMPTS => attempts_made = number(value).unwrap_or(0),
                headers::DELIVERY_COUNT => redeliveries = number(value),
                headers::CAUSATION_ID => {
                    envelope.causation_id =
                        text_of(value).and_then(|value| Uuid::parse_str(value).ok());
                }
                headers::CREATED_AT => created_at = text_of(value).and_then(created_at_of),
                name if name.starts_with("x-") => {}
                name => {
                    if let Some(value) = string(value) {
                        envelope.headers.insert(name.to_owned(), value);
                    }
                }
            }
        }
    }
    if let Some(original) = original_id {
        envelope
            .headers
            .insert(headers::ORIGINAL_MESSAGE_ID.to_owned(), original);
    }
    envelope.created_at = created_at
        .or_else(|| {
            properties
                .timestamp()
                .and_then(|seconds| i64::try_from(seconds).ok())
                .and_then(|seconds| Utc.timestamp_opt(seconds, 0).single())
        })
        .unwrap_or_else(Utc::now);
    envelope.attempt = attempt_from(delivery, attempts_made, redeliveries);
    Ok(envelope)
}

/// A delivery's message type: its `type` property or, for a message published straight to the
/// message `exchange` without one, its routing key; empty when neither says.
pub(crate) fn message_type_of(delivery: &Delivery, exchange: &str) -> String {
    match delivery.properties.kind() {
        Some(kind) => kind.to_string(),
        None if delivery.exchange.as_str() == exchange => delivery.routing_key.to_string(),
        None => String::new(),
    }
}

/// What a dead-letter record can keep of a delivery that could not be read.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn salvage(delivery: &Delivery, exchange: &str) -> Envelope {
    salvage_payload(delivery, Bytes::from(delivery.data.clone()), exchange)
}

/// [`salvage`] with the delivery's body already taken out of it as `payload`.
pub(crate) fn salvage_payload(delivery: &Delivery, payload: Bytes, exchange: &str) -> Envelope {
    let properties = &delivery.properties;
    let mut envelope = Envelope::from_raw(message_type_of(delivery, exchange), payload);
    if let Some(id) = properties.message_id() {
        envelope.id = Uuid::parse_str(id.as_str()).unwrap_or_else(|_| derived_id(id.as_str()));
    }
    envelope.attempt = properties
        .headers()
        .as_ref()
        .and_then(|table| table.inner().get(headers::ATTEMPTS))
        .and_then(number)
        .and_then(|attempts| u32::try_from(attempts).ok())
        .unwrap_or(0);
    envelope
}

/// A stable UUID for a producer's id that is not one (UUID v5 in a namespace of Hexeract's).
fn derived_id(id: &str) -> Uuid {
    derived_id_of(id.as_bytes())
}

/// [`derived_id`] of any bytes.
fn derived_id_of(name: &[u8]) -> Uuid {
    const NAMESPACE: Uuid = Uuid::from_u128(0x6865_7865_7261_6374_2d61_6d71_702d_6964);
    Uuid::new_v5(&NAMESPACE, name)
}

fn number(value: &AMQPValue) -> Option<u64> {
    match value {
        AMQPValue::ShortShortInt(v) => u64::try_from(*v).ok(),
        AMQPValue::ShortShortUInt(v) => Some(u64::from(*v)),
        AMQPValue::ShortInt(v) => u64::try_from(*v).ok(),
        AMQPValue::ShortUInt(v) => Some(u64::from(*v)),
        AMQPValue::LongInt(v) => u64::try_from(*v).ok(),
        AMQPValue::LongUInt(v) => Some(u64::from(*v)),
        AMQPValue::LongLongInt(v) => u64::try_from(*v).ok(),
        AMQPValue::Timestamp(v) => Some(*v),
        other => string(other).and_then(|text| text.trim().parse().ok()),
    }
}

fn string(value: &AMQPValue) -> Option<String> {
    text_of(value).map(str::to_owned)
}

/// A header's text, borrowed from the delivery; `None` for a value that is not text.
fn text_of(value: &AMQPValue) -> Option<&str> {
    match value {
        AMQPValue::LongString(v) => std::str::from_utf8(v.as_bytes()).ok(),
        AMQPValue::ShortString(v) => Some(v.as_str()),
        _ => None,
    }
}

/// The creation time in `x-created-at`: RFC 3339. The shape every Hexeract publisher writes
/// (`2026-12-05T10:30:00.123Z`, UTC with milliseconds) is read directly; any other goes
/// through chrono's parser.
fn created_at_of(text: &str) -> Option<DateTime<Utc>> {
    fn digits(bytes: &[u8]) -> Option<u32> {
        bytes.iter().try_fold(0u32, |number, &byte| {
            byte.is_ascii_digit()
                .then(|| number * 10 + u32::from(byte - b'0'))
        })
    }
    let bytes = text.as_bytes();
    let published_shape = bytes.len() == 24
        && bytes[4] == b'-'
        && bytes[7] == b'-'
        && bytes[10] == b'T'
        && bytes[13] == b':'
        && bytes[16] == b':'
        && bytes[19] == b'.'
        && bytes[23] == b'Z';
    if published_shape {
        let at = chrono::NaiveDate::from_ymd_opt(
            i32::try_from(digits(&bytes[0..4])?).ok()?,
            digits(&bytes[5..7])?,
            digits(&bytes[8..10])?,
        )
        .and_then(|date| {
            date.and_hms_milli_opt(
                digits(&bytes[11..13])?,
                digits(&bytes[14..16])?,
                digits(&bytes[17..19])?,
                digits(&bytes[20..23])?,
            )
        });
        // A leap second or an impossible date: chrono says what it makes of it.
        if let Some(at) = at {
            return Some(at.and_utc());
        }
    }
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|at| at.with_timezone(&Utc))
}

/// The properties of a message republished for a retry: the original's, with the attempts made
/// so far and without the broker's own bookkeeping. The copy comes back through the default
/// exchange, whose routing key is the queue's name, so it carries its type in `type` even when
/// the producer gave it only as the routing key.
pub(crate) fn retry_properties(
    original: &BasicProperties,
    message_type: &str,
    attempts_made: u32,
    budget: usize,
) -> BasicProperties {
    let mut table = own_headers(original);
    table.insert(
        headers::ATTEMPTS.into(),
        AMQPValue::LongLongInt(i64::from(attempts_made)),
    );
    let mut properties = original.clone();
    if properties.kind().is_none() && !message_type.is_empty() {
        if let Ok(kind) = ShortString::try_new(message_type) {
            properties = properties.with_type(kind);
        }
    }
    fit(properties, table, budget)
}

/// The properties of a message parked with `reason`: the original's, plus why.
pub(crate) fn parked_properties(
    original: &BasicProperties,
    letter: &ParkedInfo<'_>,
    budget: usize,
) -> BasicProperties {
    let mut table = own_headers(original);
    table.insert(headers::REASON.into(), text(letter.reason.as_str()));
    table.insert(
        headers::DETAIL.into(),
        text(&truncate(letter.detail, MAX_HEADER_DETAIL_BYTES)),
    );
    if let Some(handler) = letter.handler {
        table.insert(headers::HANDLER.into(), text(handler));
    }
    table.insert(headers::QUEUE.into(), text(letter.queue));
    table.insert(
        headers::ATTEMPTS.into(),
        AMQPValue::LongLongInt(i64::from(letter.attempts)),
    );
    fit(original.clone(), table, budget)
}

/// The bytes of message properties a republished copy may take on a connection whose frames
/// are at most `frame_max` bytes: the content header (its frame's 8 bytes of framing, the
/// class, weight, body size and property flags) must fit in one frame, or the broker closes
/// the whole connection (`frame_too_large`).
pub(crate) fn property_budget(frame_max: u32) -> usize {
    const CONTENT_HEADER_OVERHEAD: usize = 8 + 2 + 2 + 8 + 2;
    // 0 means "no limit" in AMQP; the broker's own ceiling is then what counts.
    let frame_max = if frame_max == 0 { 131_072 } else { frame_max };
    usize::try_from(frame_max)
        .unwrap_or(usize::MAX)
        .saturating_sub(CONTENT_HEADER_OVERHEAD)
}

/// `properties` with `table` as its headers, less the largest headers Hexeract did not write
/// until they fit in `budget` bytes; the names of those left out go in
/// `x-hexeract-dropped-headers`. A message can arrive with headers that nearly fill a frame:
/// the headers a retry or a park adds would then make a frame the broker refuses.
fn fit(
    properties: BasicProperties,
    mut table: BTreeMap<ShortString, AMQPValue>,
    budget: usize,
) -> BasicProperties {
    let others = other_properties_size(&properties);
    let mut size = others + table_size(&table);
    if size > budget {
        let mut foreign: Vec<(usize, ShortString)> = table
            .iter()
            .filter(|(name, _)| !name.as_str().starts_with("x-hexeract-"))
            .map(|(name, value)| (entry_size(name, value), name.clone()))
            .collect();
        foreign.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let mut dropped = Vec::new();
        // Room for the list of names itself.
        let reserve = MAX_HEADER_DETAIL_BYTES + 64;
        for (entry, name) in foreign {
            if size + reserve <= budget {
                break;
            }
            table.remove(&name);
            size -= entry;
            dropped.push(name.to_string());
        }
        table.insert(
            headers::DROPPED_HEADERS.into(),
            text(&truncate(&dropped.join(","), MAX_HEADER_DETAIL_BYTES)),
        );
    }
    properties.with_headers(table.into())
}

/// The encoded size of the properties other than the headers, a little over rather than under.
fn other_properties_size(properties: &BasicProperties) -> usize {
    let short = |value: &Option<ShortString>| value.as_ref().map_or(0, |s| 1 + s.as_str().len());
    short(properties.content_type())
        + short(properties.content_encoding())
        + short(properties.correlation_id())
        + short(properties.reply_to())
        + short(properties.expiration())
        + short(properties.message_id())
        + short(properties.kind())
        + short(properties.user_id())
        + short(properties.app_id())
        + short(properties.cluster_id())
        // delivery mode, priority, timestamp
        + 1
        + 1
        + 8
}

fn table_size(table: &BTreeMap<ShortString, AMQPValue>) -> usize {
    4 + table
        .iter()
        .map(|(name, value)| entry_size(name, value))
        .sum::<usize>()
}

fn entry_size(name: &ShortString, value: &AMQPValue) -> usize {
    1 + name.as_str().len() + value_size(value)
}

/// The encoded size of a field value, its type tag included.
fn value_size(value: &AMQPValue) -> usize {
    1 + match value {
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::ShortString(value) => 1 + value.as_str().len(),
        AMQPValue::LongString(value) => 4 + value.as_bytes().len(),
        AMQPValue::ByteArray(value) => 4 + value.as_slice().len(),
        AMQPValue::FieldArray(values) => {
            4 + values.as_slice().iter().map(value_size).sum::<usize>()
        }
        AMQPValue::FieldTable(table) => table_size(table.inner()),
        AMQPValue::Void => 0,
    }
}

/// Why and where a message is parked.
pub(crate) struct ParkedInfo<'a> {
    pub(crate) reason: &'a Reason,
    pub(crate) detail: &'a str,
    pub(crate) handler: Option<&'a str>,
    pub(crate) queue: &'a str,
    pub(crate) attempts: u32,
}

impl ParkedInfo<'_> {
    /// The same, as a record for the `dead_letters` table, for the copy of the message whose
    /// properties are `copy`. Its id depends on the queue, the message id, the attempt, the
    /// replay that sent this copy (`x-hexeract-replay`) and the payload's bytes, so that writing
    /// it again for the same copy (the delivery came back after a park that failed) keeps one
    /// row, while a copy parked again after a replay, or another message reusing the id, gets a
    /// row of its own. A delivery without a message id cannot be told from another, and gets a
    /// fresh one.
    pub(crate) fn dead_letter(&self, mut envelope: Envelope, copy: &BasicProperties) -> DeadLetter {
        envelope.attempt = self.attempts;
        let id = (*self.reason != Reason::MESSAGE_ID_MISSING).then(|| {
            let replay = copy
                .headers()
                .as_ref()
                .and_then(|table| table.inner().get(headers::REPLAY))
                .and_then(text_of)
                .unwrap_or("");
            let mut name = format!(
                "dead-letter/{}/{}/{}/{replay}/",
                self.queue, envelope.id, self.attempts
            )
            .into_bytes();
            name.extend_from_slice(&envelope.payload);
            derived_id_of(&name)
        });
        let mut letter = DeadLetter::new(
            envelope,
            self.handler.map(str::to_owned),
            self.reason.clone(),
            self.detail,
        );
        if let Some(id) = id {
            letter.id = id;
        }
        letter
    }
}

fn own_headers(original: &BasicProperties) -> BTreeMap<ShortString, AMQPValue> {
    let mut table: BTreeMap<ShortString, AMQPValue> = original
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    for name in BROKER_HEADERS {
        table.remove(name);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(properties: BasicProperties, data: &[u8], redelivered: bool) -> Delivery {
        let mut delivery = Delivery::mock(
            1,
            "hexeract".into(),
            "OrderPlaced".into(),
            redelivered,
            data.to_vec(),
        );
        delivery.properties = properties;
        delivery
    }

    /// `envelope`'s properties after `attempts_made` calls, with `extra` headers beside
    /// Hexeract's, as a broker or another producer adds them.
    fn properties_with(
        envelope: &Envelope,
        attempts_made: u32,
        extra: &[(&str, AMQPValue)],
    ) -> BasicProperties {
        let properties = properties(envelope, attempts_made);
        let mut table = properties.headers().clone().unwrap();
        for (name, value) in extra {
            table.insert((*name).into(), value.clone());
        }
        properties.with_headers(table)
    }

    /// A first delivery of `data`, with an id, typed as `content_type`.
    fn typed(content_type: &str, data: &[u8]) -> Delivery {
        let properties = BasicProperties::default()
            .with_message_id("m".into())
            .with_content_type(content_type.into());
        delivery(properties, data, false)
    }

    #[test]
    fn an_envelope_survives_the_trip_through_amqp_properties() {
        let parent = Envelope::from_raw("Parent", &b"{}"[..]);
        let envelope = Envelope::from_raw("OrderPlaced", &br#"{"order_id":7}"#[..])
            .caused_by(&parent)
            .with_header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            );
        let read = read(
            &delivery(properties(&envelope, 2), &envelope.payload, false),
            "hexeract",
            1024,
        )
        .unwrap();
        assert_eq!(read.id, envelope.id);
        assert_eq!(read.message_type, "OrderPlaced");
        assert_eq!(read.payload, envelope.payload);
        assert_eq!(read.correlation_id, envelope.correlation_id);
        assert_eq!(read.causation_id, Some(parent.id));
        assert_eq!(read.headers, envelope.headers);
        assert_eq!(
            read.created_at.timestamp_millis(),
            envelope.created_at.timestamp_millis()
        );
        assert_eq!(read.attempt, 3, "two calls made, this is the third");
    }

    #[test]
    fn redeliveries_counted_by_the_broker_add_to_the_attempts() {
        let envelope = Envelope::from_raw("OrderPlaced", &b"{}"[..]);
        let props = properties_with(
            &envelope,
            1,
            &[(headers::DELIVERY_COUNT, AMQPValue::LongLongInt(2))],
        );
        let read = read(&delivery(props, b"{}", true), "hexeract", 1024).unwrap();
        assert_eq!(read.attempt, 4);
        // A classic queue says only that it is a redelivery.
        let read = read_plain(true);
        assert_eq!(read.attempt, 2);
        assert_eq!(read_plain(false).attempt, 1);
    }

    #[test]
    fn attempt_counts_near_the_top_of_u64_saturate_instead_of_overflowing() {
        // Found by the property test below: any publisher can put any number in these headers.
        let mut table = FieldTable::default();
        table.insert(headers::ATTEMPTS.into(), AMQPValue::Timestamp(u64::MAX));
        table.insert(
            headers::DELIVERY_COUNT.into(),
            AMQPValue::LongLongInt(i64::MAX),
        );
        let props = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(table);
        let delivery = delivery(props, b"{}", true);
        assert_eq!(attempt_of(&delivery), u32::MAX);
        assert_eq!(read(&delivery, "hexeract", 1024).unwrap().attempt, u32::MAX);
    }

    fn read_plain(redelivered: bool) -> Envelope {
        let props = BasicProperties::default().with_message_id("m-1".into());
        read(&delivery(props, b"{}", redelivered), "hexeract", 1024).unwrap()
    }

    #[test]
    fn foreign_ids_map_to_stable_uuids_and_the_routing_key_gives_the_type() {
        let a = read_plain(false);
        let b = read_plain(false);
        assert_eq!(a.id, b.id);
        assert_eq!(a.header(headers::ORIGINAL_MESSAGE_ID), Some("m-1"));
        assert_eq!(a.message_type, "OrderPlaced");
    }

    #[test]
    fn unreadable_deliveries_get_their_reason_size_first() {
        let big = delivery(BasicProperties::default(), &[b'x'; 2048], false);
        let error = read(&big, "hexeract", 1024).unwrap_err();
        assert_eq!(error.reason, Reason::PAYLOAD_TOO_LARGE);

        let no_id = delivery(BasicProperties::default(), b"{}", false);
        assert_eq!(
            read(&no_id, "hexeract", 1024).unwrap_err().reason,
            Reason::MESSAGE_ID_MISSING
        );

        let xml = typed("text/xml", b"<a/>");
        assert_eq!(
            read(&xml, "hexeract", 1024).unwrap_err().reason,
            Reason::PAYLOAD_INVALID
        );
        let json_utf8 = typed("application/json; charset=utf-8", b"{}");
        assert!(read(&json_utf8, "hexeract", 1024).is_ok());
    }

    /// The encoded size of `properties`, as lapin writes them in a content header.
    fn encoded_size(properties: &BasicProperties) -> usize {
        let generator = lapin::protocol::basic::gen_properties(properties);
        let (bytes, _) = cookie_factory::gen(generator, Vec::new()).expect("encode");
        bytes.len()
    }

    #[test]
    fn copies_of_a_message_whose_headers_fill_the_frame_leave_out_the_largest_foreign_ones() {
        // Found by the chaos suite's bad-input matrix: a 130 848-byte header was accepted by the
        // broker, and the parked copy (its headers plus Hexeract's) closed the connection.
        let frame_max = 131_072;
        let budget = property_budget(frame_max);
        let envelope = Envelope::from_raw("OrderPlaced", &b"{}"[..]);
        let with_big = |len: usize| {
            properties_with(
                &envelope,
                0,
                &[("x-small", text("kept")), ("x-big", text(&"b".repeat(len)))],
            )
        };
        // 10 bytes short of the budget: even the retry's one header does not fit beside it.
        let len = 130_000 + budget - 10 - encoded_size(&with_big(130_000));
        let original = with_big(len);
        assert_eq!(encoded_size(&original), budget - 10);
        let letter = ParkedInfo {
            reason: &Reason::PAYLOAD_INVALID,
            detail: &"d".repeat(5_000),
            handler: Some("billing"),
            queue: "orders.billing",
            attempts: 1,
        };
        for copy in [
            parked_properties(&original, &letter, budget),
            retry_properties(&original, "OrderPlaced", 1, budget),
        ] {
            assert!(
                encoded_size(&copy) <= budget,
                "{} > {budget}",
                encoded_size(&copy)
            );
            let inner = copy.headers().as_ref().unwrap().inner();
            assert!(!inner.contains_key("x-big"));
            assert_eq!(inner.get("x-small"), Some(&text("kept")));
            assert_eq!(inner.get(headers::DROPPED_HEADERS), Some(&text("x-big")));
            assert!(
                inner.contains_key(headers::CREATED_AT),
                "Hexeract's headers stay"
            );
        }
        // Headers that fit are all kept, and nothing says any was dropped.
        let small = properties(&envelope, 0);
        let copy = parked_properties(&small, &letter, budget);
        let inner = copy.headers().as_ref().unwrap().inner();
        assert!(!inner.contains_key(headers::DROPPED_HEADERS));
        assert!(inner.contains_key(headers::REASON));
    }

    #[test]
    fn republished_messages_drop_the_brokers_bookkeeping_and_carry_the_reason() {
        let envelope = Envelope::from_raw("OrderPlaced", &b"{}"[..]);
        let props = properties_with(
            &envelope,
            0,
            &[
                (headers::DELIVERY_COUNT, AMQPValue::LongLongInt(3)),
                ("x-death", AMQPValue::LongLongInt(1)),
            ],
        );
        let retried = retry_properties(&props, "OrderPlaced", 2, property_budget(131_072));
        let inner = retried.headers().as_ref().unwrap().inner();
        assert!(!inner.contains_key(headers::DELIVERY_COUNT));
        assert!(!inner.contains_key("x-death"));
        assert_eq!(
            inner.get(headers::ATTEMPTS),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(retried.message_id(), props.message_id());
        // A producer that gave the type only as the routing key: the copy carries it.
        let untyped = BasicProperties::default().with_message_id("m".into());
        let retried = retry_properties(&untyped, "OrderPlaced", 1, property_budget(131_072));
        assert_eq!(
            retried.kind().as_ref().map(ShortString::as_str),
            Some("OrderPlaced")
        );

        let long = "é".repeat(2000);
        let parked = parked_properties(
            &props,
            &ParkedInfo {
                reason: &Reason::HANDLER_PANICKED,
                detail: &long,
                handler: Some("shop::reserve"),
                queue: "hexeract.shop.reserve",
                attempts: 5,
            },
            property_budget(131_072),
        );
        let inner = parked.headers().as_ref().unwrap().inner();
        assert_eq!(inner.get(headers::REASON), Some(&text("handler_panicked")));
        let detail = string(inner.get(headers::DETAIL).unwrap()).unwrap();
        assert!(detail.len() <= MAX_HEADER_DETAIL_BYTES + "…".len());
    }

    /// One copy parked twice (its park failed, the delivery came back) keeps one dead-letter
    /// row; a copy replayed and parked again, or another message reusing the id, gets its own.
    #[test]
    fn a_dead_letters_id_is_the_copys_own() {
        let info = ParkedInfo {
            reason: &Reason::PAYLOAD_INVALID,
            detail: "no",
            handler: Some("billing"),
            queue: "orders.billing",
            attempts: 0,
        };
        let envelope = Envelope::from_raw("OrderPlaced", &b"{\"order\": 1}"[..]);
        let copy = properties(&envelope, 0);
        let first = info.dead_letter(envelope.clone(), &copy);
        assert_eq!(
            first.id,
            info.dead_letter(envelope.clone(), &copy).id,
            "same copy, same row"
        );
        let replayed = replay_properties(&envelope, first.id);
        let again = info.dead_letter(envelope.clone(), &replayed);
        assert_ne!(
            again.id, first.id,
            "a replayed copy parked again gets a row of its own"
        );
        assert_eq!(again.id, info.dead_letter(envelope.clone(), &replayed).id);
        let mut reused = envelope.clone();
        reused.payload = bytes::Bytes::from_static(b"{\"order\": 2}");
        assert_ne!(
            info.dead_letter(reused, &copy).id,
            first.id,
            "another message under the same id gets a row of its own"
        );
    }
}

/// Properties of the AMQP wire format: every envelope survives the trip through properties and
/// back; any delivery at all is read without a panic, as an envelope or as exactly one of the
/// dead-letter reasons; and a payload over the limit is refused before anything is parsed.
#[cfg(test)]
mod properties {
    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;

    use super::*;
    use crate::proptest_support::envelope as any_envelope;

    fn value() -> impl Strategy<Value = AMQPValue> {
        prop_oneof![
            vec(any::<u8>(), 0..64)
                .prop_map(|bytes| AMQPValue::LongString(LongString::from(bytes))),
            any::<i64>().prop_map(AMQPValue::LongLongInt),
            any::<bool>().prop_map(AMQPValue::Boolean),
            any::<u64>().prop_map(AMQPValue::Timestamp),
        ]
    }

    prop_compose! {
        fn arbitrary_delivery()(
            data in vec(any::<u8>(), 0..4096),
            message_id in proptest::option::of("\\PC{0,40}"),
            content_type in proptest::option::of("\\PC{0,40}"),
            kind in proptest::option::of("\\PC{0,40}"),
            correlation in proptest::option::of("\\PC{0,40}"),
            timestamp in proptest::option::of(any::<u64>()),
            headers in btree_map(
                prop_oneof![
                    Just(headers::ATTEMPTS.to_owned()),
                    Just(headers::DELIVERY_COUNT.to_owned()),
                    Just(headers::CREATED_AT.to_owned()),
                    Just(headers::CAUSATION_ID.to_owned()),
                    "[a-z-]{1,20}",
                ],
                value(),
                0..8,
            ),
            redelivered in any::<bool>(),
            exchange in prop_oneof![Just("hexeract".to_owned()), "[a-z]{0,10}"],
            routing_key in "\\PC{0,40}",
        ) -> Delivery {
            let mut table = FieldTable::default();
            for (name, value) in headers {
                table.insert(ShortString::from(name), value);
            }
            let mut properties = BasicProperties::default().with_headers(table);
            if let Some(id) = message_id {
                properties = properties.with_message_id(id.into());
            }
            if let Some(content_type) = content_type {
                properties = properties.with_content_type(content_type.into());
            }
            if let Some(kind) = kind {
                properties = properties.with_type(kind.into());
            }
            if let Some(correlation) = correlation {
                properties = properties.with_correlation_id(correlation.into());
            }
            if let Some(timestamp) = timestamp {
                properties = properties.with_timestamp(timestamp);
            }
            let mut delivery =
                Delivery::mock(1, exchange.into(), routing_key.into(), redelivered, data);
            delivery.properties = properties;
            delivery
        }
    }

    proptest! {
        #[test]
        fn every_envelope_survives_the_trip(
            envelope in any_envelope("[a-w][a-z0-9-]{0,20}"),
            attempts_made in 0u32..20,
        ) {
            let delivery = {
                let mut delivery = Delivery::mock(
                    1,
                    "hexeract".into(),
                    envelope.message_type.as_str().into(),
                    false,
                    envelope.payload.to_vec(),
                );
                delivery.properties = properties(&envelope, attempts_made);
                delivery
            };
            let read = read(&delivery, "hexeract", 4096).expect("readable");
            prop_assert_eq!(read.id, envelope.id);
            prop_assert_eq!(&read.message_type, &envelope.message_type);
            prop_assert_eq!(&read.payload, &envelope.payload);
            prop_assert_eq!(read.correlation_id, envelope.correlation_id);
            prop_assert_eq!(read.causation_id, envelope.causation_id);
            prop_assert_eq!(&read.headers, &envelope.headers);
            prop_assert_eq!(read.created_at, envelope.created_at);
            prop_assert_eq!(read.attempt, attempts_made + 1);
        }

        #[test]
        fn any_delivery_is_an_envelope_or_one_known_reason(delivery in arbitrary_delivery()) {
            match read(&delivery, "hexeract", 2048) {
                Ok(envelope) => {
                    prop_assert!(envelope.attempt >= 1);
                    prop_assert!(delivery.data.len() <= 2048);
                }
                Err(unreadable) => {
                    prop_assert!(Reason::ALL.contains(&unreadable.reason), "{:?}", unreadable.reason);
                    prop_assert!(!unreadable.detail.is_empty());
                }
            }
            // What a dead letter keeps of it never panics either.
            let salvaged = salvage(&delivery, "hexeract");
            prop_assert_eq!(&salvaged.payload[..], &delivery.data[..]);
        }

        #[test]
        fn the_creation_time_reads_as_chrono_reads_it(
            millis in -62_135_596_800_000i64..253_402_300_799_999,
            offset_minutes in -1439i32..1440,
            precision in 0usize..4,
        ) {
            let at = DateTime::<Utc>::from_timestamp_millis(millis).expect("in range");
            // The shape publishers write, read directly.
            let published = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            prop_assert_eq!(created_at_of(&published), Some(at));
            // Any other RFC 3339 shape (an offset, other precisions) goes through chrono.
            let zone = chrono::FixedOffset::east_opt(offset_minutes * 60).expect("in range");
            let format = [
                chrono::SecondsFormat::Secs,
                chrono::SecondsFormat::Millis,
                chrono::SecondsFormat::Micros,
                chrono::SecondsFormat::Nanos,
            ][precision];
            let other = at.with_timezone(&zone).to_rfc3339_opts(format, false);
            let expected = DateTime::parse_from_rfc3339(&other).ok().map(|at| at.with_timezone(&Utc));
            prop_assert_eq!(created_at_of(&other), expected);
        }

        #[test]
        fn a_creation_time_of_the_published_length_reads_as_chrono_reads_it(
            text in "[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}[.,][0-9]{3}[Zz+]",
        ) {
            let expected = DateTime::parse_from_rfc3339(&text).ok().map(|at| at.with_timezone(&Utc));
            prop_assert_eq!(created_at_of(&text), expected, "{}", text);
        }

        #[test]
        fn an_oversized_payload_is_refused_before_anything_else(
            delivery in arbitrary_delivery(),
            limit in 0usize..64,
        ) {
            prop_assume!(delivery.data.len() > limit);
            let error = read(&delivery, "hexeract", limit).unwrap_err();
            prop_assert_eq!(error.reason, Reason::PAYLOAD_TOO_LARGE);
        }
    }
}
