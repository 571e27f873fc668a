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
pub use worker::{OutboxSource, OutboxWorker, OutboxWorkerBuilder};

use futures_util::future::BoxFuture;

use crate::envelope::Envelope;
use crate::message::Message;
use crate::store::{Due, Identifier, StoreError};

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

    /// Keeps `envelopes` in the delayed messages of `namespace` until `due`, in this
    /// transaction.
    #[doc(hidden)]
    fn insert_scheduled<'a>(
        &'a mut self,
        namespace: &'a Identifier,
        envelopes: &'a [Envelope],
        due: Due,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// `OutboxTransaction` for a transaction of one backend: each method hands its work to the
/// backend's store module, which has the statements.
macro_rules! outbox_transaction {
    ($feature:literal, $database:ty, $store:ident) => {
        #[cfg(feature = $feature)]
        impl OutboxTransaction for sqlx::Transaction<'_, $database> {
            fn insert_envelopes<'a>(
                &'a mut self,
                namespace: &'a Identifier,
                envelopes: &'a [Envelope],
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                Box::pin(async move {
                    crate::store::$store::insert_outbox(self, namespace, envelopes)
                        .await
                        .map_err(|error| error.unless_not_migrated(namespace))
                })
            }

            fn insert_inbox<'a>(
                &'a mut self,
                namespace: &'a Identifier,
                handler: &'a str,
                message_id: uuid::Uuid,
            ) -> BoxFuture<'a, Result<bool, StoreError>> {
                Box::pin(async move {
                    crate::store::$store::insert_inbox(self, namespace, handler, message_id)
                        .await
                        .map_err(|error| error.unless_not_migrated(namespace))
                })
            }

            fn insert_scheduled<'a>(
                &'a mut self,
                namespace: &'a Identifier,
                envelopes: &'a [Envelope],
                due: Due,
            ) -> BoxFuture<'a, Result<(), StoreError>> {
                Box::pin(async move {
                    crate::store::$store::insert_scheduled_in(self, namespace, envelopes, due)
                        .await
                        .map_err(|error| error.unless_not_migrated(namespace))
                })
            }
        }
    };
}

outbox_transaction!("postgres", sqlx::Postgres, postgres);
outbox_transaction!("sqlite", sqlx::Sqlite, sqlite);

/// Writes `message` to the outbox inside the caller's transaction (PostgreSQL or SQLite).
/// Nothing is visible to workers until the transaction commits; a rollback leaves nothing
/// behind. Returns the message id. With headers of your own: [`enqueue_envelope`].
pub async fn enqueue<T: OutboxTransaction, M: Message>(
    tx: &mut T,
    message: &M,
) -> Result<uuid::Uuid, EnqueueError> {
    let mut envelope = Envelope::new(message)?;
    crate::trace::produce(&mut envelope);
    enqueue_envelope(tx, envelope).await
}

/// Keeps `message` inside the caller's transaction (PostgreSQL or SQLite) until `at`, then the
/// scheduler puts it in the outbox and it goes to its handlers like any other. Nothing is kept
/// if the transaction rolls back. Returns the message id. Needs a running scheduler
/// ([`hexeract::run`](crate::run) runs one).
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use hexeract::Message;
///
/// #[derive(serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "PaymentDue")]
/// struct PaymentDue { invoice_id: u64 }
///
/// let mut tx = pool.begin().await?;
/// // … insert the invoice …
/// let due = chrono::Utc::now() + chrono::Duration::days(30);
/// hexeract::outbox::schedule_at(&mut tx, due, &PaymentDue { invoice_id: 7 }).await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
pub async fn schedule_at<T: OutboxTransaction, M: Message>(
    tx: &mut T,
    at: chrono::DateTime<chrono::Utc>,
    message: &M,
) -> Result<uuid::Uuid, EnqueueError> {
    schedule_in(tx, message, Due::At(at)).await
}

/// [`schedule_at`] `delay` after now (on the database's clock; on SQLite the process's).
pub async fn schedule_after<T: OutboxTransaction, M: Message>(
    tx: &mut T,
    delay: std::time::Duration,
    message: &M,
) -> Result<uuid::Uuid, EnqueueError> {
    schedule_in(tx, message, Due::After(delay)).await
}

async fn schedule_in<T: OutboxTransaction, M: Message>(
    tx: &mut T,
    message: &M,
    due: Due,
) -> Result<uuid::Uuid, EnqueueError> {
    let mut envelope = Envelope::new(message)?;
    crate::trace::produce(&mut envelope);
    let id = envelope.id;
    schedule_envelopes(
        tx,
        T::DEFAULT_NAMESPACE,
        std::slice::from_ref(&envelope),
        due,
    )
    .await?;
    Ok(id)
}

/// Keeps envelopes in the delayed messages of `namespace` (PostgreSQL schema or SQLite table
/// prefix) until `due`, inside the caller's transaction: [`schedule_at`] for a batch, or for
/// a store in another namespace.
pub async fn schedule_envelopes<T: OutboxTransaction>(
    tx: &mut T,
    namespace: &str,
    envelopes: &[Envelope],
    due: Due,
) -> Result<(), EnqueueError> {
    let namespace = Identifier::new(namespace).map_err(StoreError::from)?;
    tx.insert_scheduled(&namespace, envelopes, due).await?;
    Ok(())
}

/// Writes `envelope` to the outbox inside the caller's transaction (PostgreSQL or SQLite), in
/// the namespace [`enqueue`] writes to (`hexeract`): [`enqueue`] for a message with headers of
/// your own, or for a handler's follow-up made with
/// [`ctx.follow_up(&message)`](crate::Context::follow_up). Returns the message id.
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use hexeract::{Envelope, Message};
///
/// #[derive(serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// struct OrderPlaced { order_id: i64 }
///
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES ($1)").bind(7_i64).execute(&mut *tx).await?;
/// let envelope = Envelope::new(&OrderPlaced { order_id: 7 })?.with_header("tenant", "acme");
/// let id = hexeract::outbox::enqueue_envelope(&mut tx, envelope).await?;
/// tx.commit().await?; // the order and its event, with its header, or neither
/// # let _ = id;
/// # Ok(())
/// # }
/// ```
pub async fn enqueue_envelope<T: OutboxTransaction>(
    tx: &mut T,
    envelope: Envelope,
) -> Result<uuid::Uuid, EnqueueError> {
    let id = envelope.id;
    enqueue_envelopes(tx, T::DEFAULT_NAMESPACE, std::slice::from_ref(&envelope)).await?;
    Ok(id)
}

/// Writes envelopes (a batch) to the outbox of `namespace` (PostgreSQL schema or SQLite table
/// prefix) inside the caller's transaction (on PostgreSQL in one statement). One envelope in
/// the default namespace: [`enqueue_envelope`].
pub async fn enqueue_envelopes<T: OutboxTransaction>(
    tx: &mut T,
    namespace: &str,
    envelopes: &[Envelope],
) -> Result<(), EnqueueError> {
    let namespace = Identifier::new(namespace).map_err(StoreError::from)?;
    tx.insert_envelopes(&namespace, envelopes).await?;
    Ok(())
}
