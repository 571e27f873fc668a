//! Entry points for the fuzz targets in `fuzz/`: thin wrappers over the decoders that every
//! untrusted byte from a broker goes through.
//!
//! Not a stable API. It is hidden from the docs, compiled only with the `fuzzing` feature (off
//! by default), and changes whenever the decoders it wraps do; nothing but `fuzz/` should use
//! it. The wrappers return only public types: an [`Envelope`], or the [`Reason`] and detail a
//! dead letter would get.

use crate::envelope::Envelope;
use crate::reason::Reason;

/// Why a delivery or record cannot be handled: the dead-letter reason and its detail.
pub type Refusal = (Reason, String);

/// Reads an AMQP delivery as the RabbitMQ worker does, for a worker whose message exchange is
/// `exchange`.
#[cfg(feature = "rabbitmq")]
pub fn read_delivery(
    delivery: &lapin::message::Delivery,
    exchange: &str,
    max_payload_bytes: usize,
) -> Result<Envelope, Refusal> {
    crate::rabbitmq::wire::read(delivery, exchange, max_payload_bytes)
        .map_err(|unreadable| (unreadable.reason, unreadable.detail))
}

/// What the RabbitMQ worker keeps of a delivery it cannot read, for its dead letter.
#[cfg(feature = "rabbitmq")]
pub fn salvage_delivery(delivery: &lapin::message::Delivery, exchange: &str) -> Envelope {
    crate::rabbitmq::wire::salvage(delivery, exchange)
}

/// The number of the handler call a delivery is for, read from its headers alone.
#[cfg(feature = "rabbitmq")]
pub fn attempt_of_delivery(delivery: &lapin::message::Delivery) -> u32 {
    crate::rabbitmq::wire::attempt_of(delivery)
}

/// Reads a Kafka record as the Kafka worker does, for a topic of `aggregate`.
#[cfg(feature = "kafka")]
pub fn read_record(
    record: &impl rdkafka::Message,
    aggregate: &str,
    max_payload_bytes: usize,
) -> Result<Envelope, Refusal> {
    crate::kafka::wire::read(record, aggregate, max_payload_bytes)
        .map_err(|unreadable| (unreadable.reason, unreadable.detail))
}

/// What the Kafka worker keeps of a record it cannot read, for its dead letter.
#[cfg(feature = "kafka")]
pub fn salvage_record(record: &impl rdkafka::Message, aggregate: &str) -> Envelope {
    crate::kafka::wire::salvage(record, aggregate)
}
