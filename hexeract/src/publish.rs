//! Publishing: the [`Publish`] seam between handlers and whatever store or transport carries
//! messages, and the process-wide [`publish`] function.

use futures_util::future::BoxFuture;
use uuid::Uuid;

use crate::envelope::{EncodeError, Envelope};
use crate::message::Message;

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
    /// The store could not take the message.
    #[error("the outbox could not take the message: {0}")]
    Store(String),
    /// The broker did not confirm the message.
    #[error("the broker did not take the message: {0}")]
    Transport(String),
}

/// Publishes `message` through the process's outbox store
/// ([`default_store`](crate::store::default_store)), in a transaction of its own, and wakes the
/// worker of this process. Returns the message id. [`hexeract::run`](crate::run) delivers it to
/// every handler of its type, in this process or another one sharing the database.
///
/// To publish together with your own data, atomically, use
/// [`outbox::enqueue`](crate::outbox::enqueue) inside your transaction instead.
///
/// ```no_run
/// # use hexeract::Message;
/// # #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// # #[message(type = "OrderPlaced")]
/// # struct OrderPlaced { order_id: u64 }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), hexeract::PublishError> {
/// let id = hexeract::publish(&OrderPlaced { order_id: 7 }).await?;
/// println!("published {id}");
/// # Ok(())
/// # }
/// ```
pub async fn publish<M: Message>(message: &M) -> Result<Uuid, PublishError> {
    let envelope = Envelope::new(message)?;
    let id = envelope.id;
    let store = crate::store::default_store()
        .await
        .map_err(|error| PublishError::Store(error.to_string()))?;
    store
        .publish(vec![envelope])
        .await
        .map_err(|error| PublishError::Store(error.to_string()))?;
    Ok(id)
}
