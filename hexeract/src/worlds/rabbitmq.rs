//! RabbitMQ: the broker transport.
//!
//! With a broker, the exchange does the fan-out: every message is published once to a durable
//! topic exchange with its message type as routing key, and each handler consumes a queue of
//! its own (`<prefix>.<handler name>`) bound by that type. A failed call is republished to a
//! wait queue whose fixed delay is the retry's backoff, which dead-letters it back to the
//! handler's queue; a message that cannot be handled is parked in the handler's parking queue
//! with its reason. The pieces:
//!
//! - [`RabbitMqConnection`]: a named connection (`connect`, `connect_with_retry`);
//! - [`Topology`] and [`ensure_topology`]: the exchange, queues and bindings, derived from the
//!   registry, declared idempotently;
//! - [`migrate_queue`]: moves a queue that exists with another layout to a new one, its
//!   messages kept (what [`Topology::declare`] does for its own queues);
//! - [`RabbitMqWorker`]: consumes handler queues, acks after the outcome, retries through the
//!   wait queues, parks what cannot be handled;
//! - [`RabbitMqPublisher`]: publishes envelopes with publisher confirms;
//! - [`RabbitMqTransport`]: direct publishing that reconnects and retries once after a broker
//!   blip;
//! - [`RabbitMqRelay`]: moves the transactional outbox to the exchange, a row deleted only once
//!   the broker confirmed it.
//!
//! `hexeract::run` wires them when `AMQP_URL` is set: it relays the outbox and runs a worker over
//! every handler's queue, each on a connection of its own, and supervises both: when one loses
//! its connection it reconnects with backoff, declares the topology again and starts anew.
//!
//! The AMQP properties and headers are described in `docs/wire-format.md`, so that producers and
//! consumers not written with Hexeract interoperate.

mod acks;
pub(crate) mod connection;
mod migration;
mod publisher;
mod relay;
pub(crate) mod topology;
mod transport;
pub(crate) mod wire;
mod worker;

pub use connection::{redact_url, RabbitMqConnection};
/// The kind of an [`Exchange`] (`Topic`, `Fanout`, `Direct`, `Headers`), re-exported from lapin
/// so that an application declares its topology with `hexeract` alone.
pub use lapin::ExchangeKind;
pub use migration::{holding_queue, migrate_queue, QueueMigration, MIGRATION_JOURNAL};
pub use publisher::RabbitMqPublisher;
pub use relay::RabbitMqRelay;

/// The RabbitMQ relay's name before it was [`RabbitMqRelay`] (beside Kafka's `KafkaRelay`).
#[deprecated(note = "renamed `RabbitMqRelay`")]
pub type OutboxRelay = RabbitMqRelay;
pub use topology::{
    ensure_topology, tiers_for, Binding, DeadLetterStrategy, Exchange, Overflow, Queue, QueueKind,
    Topology, DEFAULT_DELIVERY_LIMIT, DEFAULT_EXCHANGE, DEFAULT_PARKING_MAX_LENGTH, DEFAULT_PREFIX,
    DEFAULT_WAIT_TIERS,
};
pub use transport::RabbitMqTransport;
pub use wire::headers;
pub use worker::{AckMode, RabbitMqSource, RabbitMqWorker, RabbitMqWorkerBuilder};

/// A broker operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BusError {
    /// The connection or channel is gone (or could not be opened): reconnect and start a new
    /// worker. What [`RabbitMqWorker::run`] returns when its consumer stream ends without a
    /// cancellation.
    #[error("RabbitMQ connection lost: {0}")]
    Connection(String),
    /// The broker refused an operation (a declaration, a publish, an ack).
    #[error("RabbitMQ refused {operation}: {detail}")]
    Transport {
        /// What was attempted.
        operation: String,
        /// What the broker or client said.
        detail: String,
    },
    /// A published message was not confirmed: nacked by the broker, returned as unroutable
    /// (`mandatory`), or not confirmed within the confirm timeout.
    #[error("message {message_id} was not confirmed by the broker: {detail}")]
    NotConfirmed {
        /// The message's id.
        message_id: String,
        /// Why.
        detail: String,
    },
    /// No handler is registered for the message type. The worker logs it and treats it as
    /// a failed call (`unknown_message_type`): retried, since the handler may come with the
    /// next deployment, then parked; its dead-letter detail is this error's text.
    #[error("{}", crate::delivery::verdict::missing_handler(message_type))]
    MissingHandler {
        /// The type the message carries.
        message_type: String,
    },
    /// A name cannot be used on the broker (too long, or empty).
    #[error("{0}")]
    InvalidName(String),
    /// A queue or exchange exists on the broker with another value of an argument than the
    /// worker would declare it with (`PRECONDITION_FAILED - inequivalent arg`). Retrying does
    /// not help: delete the object, or declare it as the worker does (docs/rabbitmq.md), or
    /// give the worker other names.
    #[error(
        "{object} exists on the broker with another {argument} than Hexeract declares it \
         with; move or drain its messages, then delete it, or declare it as docs/rabbitmq.md \
         shows, or use other names (the broker said: {detail})"
    )]
    Mismatch {
        /// The queue or exchange, with its name: `queue "orders.parked"`.
        object: String,
        /// The argument whose value differs: `x-message-ttl`, `x-queue-type`, `durable` …
        argument: String,
        /// What the broker said.
        detail: String,
    },
}

impl BusError {
    pub(crate) fn transport(operation: impl Into<String>, error: lapin::Error) -> BusError {
        if is_connection_error(&error) {
            BusError::Connection(format!("{}: {error}", operation.into()))
        } else {
            BusError::Transport {
                operation: operation.into(),
                detail: error.to_string(),
            }
        }
    }
}

fn is_connection_error(error: &lapin::Error) -> bool {
    use lapin::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::IOError(_)
            | ErrorKind::InvalidConnectionState(_)
            | ErrorKind::InvalidChannelState(..)
            | ErrorKind::MissingHeartbeatError
            | ErrorKind::RuntimeShutdownError(_)
    )
}

#[cfg(test)]
mod tests {
    use super::BusError;
    use crate::delivery::verdict::no_handler_for_type;
    use crate::{HandlerOutcome, Reason};

    #[test]
    fn a_message_no_handler_takes_is_dead_lettered_with_the_missing_handler_text() {
        let missing = BusError::MissingHandler {
            message_type: "billing.Refund".to_owned(),
        };
        match no_handler_for_type("billing.Refund") {
            HandlerOutcome::Retry { reason, detail, .. } => {
                assert_eq!(reason, Reason::UNKNOWN_MESSAGE_TYPE);
                assert_eq!(detail, missing.to_string());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            missing.to_string(),
            "no handler is registered for message type \"billing.Refund\""
        );
    }
}
