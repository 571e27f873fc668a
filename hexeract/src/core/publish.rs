//! Publishing: the [`Publish`] seam between handlers and whatever store or transport carries
//! messages. (The process-wide [`publish`](crate::publish) function, which reaches the
//! environment, lives with the process's store.)

use futures_util::future::BoxFuture;
use uuid::Uuid;

use crate::envelope::{EncodeError, Envelope};

/// Something that accepts envelopes for delivery: a store's outbox or a transport.
pub trait Publish: Send + Sync + 'static {
    /// Accepts `envelope`; when this returns `Ok`, the message will be delivered to its handlers.
    fn publish_envelope(&self, envelope: Envelope) -> BoxFuture<'_, Result<Uuid, PublishError>>;
}

/// A message could not be published.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The message could not be serialized.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The store could not take the message. Its error is the
    /// [`source`](std::error::Error::source): a [`StoreError`](crate::store::StoreError) from
    /// Hexeract's stores, or, from [`publish`](crate::publish) and
    /// [`schedule_after`](crate::schedule_after), the [`Error`](crate::Error) of opening the
    /// process's store.
    #[error("the outbox could not take the message: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The broker did not confirm the message. Its error is the
    /// [`source`](std::error::Error::source): `hexeract::rabbitmq::BusError` on RabbitMQ.
    #[error("the broker did not take the message: {0}")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
}
