//! The transactional outbox: write messages in the same transaction as the business data, and
//! let [`OutboxWorker`] deliver them to every handler once that transaction commits.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use hexeract::Message;
//!
//! #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
//! #[message(type = "OrderPlaced")]
//! struct OrderPlaced { order_id: i64 }
//!
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(7_i64).execute(&mut *tx).await?;
//! hexeract::outbox::enqueue(&mut tx, &OrderPlaced { order_id: 7 }).await?;
//! tx.commit().await?; // the order and its event, or neither
//! # Ok(())
//! # }
//! ```

pub mod inbox;
mod worker;

pub(crate) use worker::StorePublisher;
pub use worker::{OutboxWorker, OutboxWorkerBuilder};

use futures_util::future::BoxFuture;

use crate::envelope::Envelope;
use crate::message::Message;
use crate::store::{Identifier, StoreError};

/// An error from [`enqueue`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The message could not be serialized.
    #[error(transparent)]
    Encode(#[from] crate::envelope::EncodeError),
    /// The outbox row could not be written.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A transaction the outbox can write into: `sqlx::Transaction` on PostgreSQL or SQLite.
pub trait OutboxTransaction: Send {
    /// Where the outbox is unless told otherwise: the PostgreSQL schema, or the SQLite table
    /// prefix, `hexeract`.
    const DEFAULT_NAMESPACE: &'static str = "hexeract";

    /// Inserts `envelopes` into the outbox of `namespace` in this transaction.
    #[doc(hidden)]
    fn insert_envelopes<'a>(
        &'a mut self,
        namespace: &'a Identifier,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Records in the inbox of `namespace`, in this transaction, that `handler` processed
    /// `message_id`: `true` when it was not recorded yet.
    #[doc(hidden)]
    fn insert_inbox<'a>(
        &'a mut self,
        namespace: &'a Identifier,
        handler: &'a str,
        message_id: uuid::Uuid,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}

#[cfg(feature = "postgres")]
impl OutboxTransaction for sqlx::Transaction<'_, sqlx::Postgres> {
    fn insert_envelopes<'a>(
        &'a mut self,
        namespace: &'a Identifier,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(crate::store::postgres::insert_outbox(
            self, namespace, envelopes,
        ))
    }

    fn insert_inbox<'a>(
        &'a mut self,
        namespace: &'a Identifier,
        handler: &'a str,
        message_id: uuid::Uuid,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(crate::store::postgres::insert_inbox(
            self, namespace, handler, message_id,
        ))
    }
}

#[cfg(feature = "sqlite")]
impl OutboxTransaction for sqlx::Transaction<'_, sqlx::Sqlite> {
    fn insert_envelopes<'a>(
        &'a mut self,
        namespace: &'a Identifier,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(crate::store::sqlite::insert_outbox(
            self, namespace, envelopes,
        ))
    }

    fn insert_inbox<'a>(
        &'a mut self,
        namespace: &'a Identifier,
        handler: &'a str,
        message_id: uuid::Uuid,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(crate::store::sqlite::insert_inbox(
            self, namespace, handler, message_id,
        ))
    }
}

/// Writes `message` to the outbox inside the caller's transaction (PostgreSQL or SQLite).
/// Nothing is visible to workers until the transaction commits; a rollback leaves nothing
/// behind. Returns the message id.
pub async fn enqueue<T: OutboxTransaction, M: Message>(
    tx: &mut T,
    message: &M,
) -> Result<uuid::Uuid, EnqueueError> {
    let envelope = Envelope::new(message)?;
    let id = envelope.id;
    enqueue_envelopes(tx, T::DEFAULT_NAMESPACE, &[envelope]).await?;
    Ok(id)
}

/// Writes envelopes (a batch, or messages with headers of your own) to the outbox of
/// `namespace` (PostgreSQL schema or SQLite table prefix) inside the caller's transaction (on
/// PostgreSQL in one statement).
pub async fn enqueue_envelopes<T: OutboxTransaction>(
    tx: &mut T,
    namespace: &str,
    envelopes: &[Envelope],
) -> Result<(), EnqueueError> {
    let namespace = Identifier::new(namespace).map_err(StoreError::from)?;
    tx.insert_envelopes(&namespace, envelopes).await?;
    Ok(())
}
