//! The inbox: idempotent handlers on at-least-once delivery.
//!
//! Every message may reach a handler more than once (a retry after a failure, a lease that
//! ran out, a crash before the ack). A handler whose work is a database write makes the
//! repeat harmless by recording the message id in the same transaction as the write:
//! [`mark_processed`] inserts `(handler name, message id)` into the `inbox` table and says
//! whether this is the first time. The mark commits with the work or rolls back with it, so a
//! call that failed leaves no mark and the retry does the work again, and a call that
//! committed makes every later delivery a no-op.
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # mod example {
//! use hexeract::outbox::inbox::mark_processed;
//! use hexeract::{Context, Handler, Message};
//!
//! #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
//! #[message(type = "OrderPlaced")]
//! struct OrderPlaced { order_id: i64, total_cents: i64 }
//!
//! struct RecordRevenue { pool: sqlx::PgPool }
//!
//! impl Handler<OrderPlaced> for RecordRevenue {
//!     type Error = hexeract::store::StoreError;
//!
//!     async fn handle(&self, event: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
//!         let mut tx = self.pool.begin().await?;
//!         if !mark_processed(&mut tx, ctx).await? {
//!             return Ok(()); // a redelivery: this handler's work for it is committed
//!         }
//!         sqlx::query("INSERT INTO revenue (order_id, cents) VALUES ($1, $2)")
//!             .bind(event.order_id)
//!             .bind(event.total_cents)
//!             .execute(&mut *tx)
//!             .await?;
//!         tx.commit().await?; // the revenue row and the mark, or neither
//!         Ok(())
//!     }
//! }
//! # }
//! ```
//!
//! What the pattern covers, and what it does not:
//!
//! - The mark is per handler: `ctx.handler_name()` is part of the key, so two handlers of one
//!   message each do their work once. The name is `module::path::fn` unless the handler is
//!   given one (`#[handler(…, name = "…")]`); give it one if the code may move, since a new
//!   name starts an empty inbox.
//! - Only what the transaction writes is done once. A call to another system (an email, a
//!   payment API) made before the commit runs again if the process dies between the call
//!   and the commit: pass it `ctx.message_id()` as its idempotency key. Messages the handler
//!   sends belong in the transaction too: [`enqueue_envelope`](super::enqueue_envelope)
//!   with [`ctx.follow_up(&message)`](crate::Context::follow_up) keeps the conversation.
//! - On PostgreSQL, a second delivery running at the same time waits at `mark_processed`
//!   until the first transaction ends: it then returns `false` if the first committed, `true`
//!   if it rolled back. On SQLite the insert takes the write lock, so call `mark_processed`
//!   first in the transaction (or begin it with `BEGIN IMMEDIATE`).
//! - The `inbox` table is created by `migrate` of
//!   [`PgStore`](crate::store::postgres::PgStore) or
//!   [`SqliteStore`](crate::store::sqlite::SqliteStore) on the database the transaction is
//!   on. Marks stay until `purge_inbox_older_than` removes them.

use crate::context::Context;
use crate::outbox::OutboxTransaction;
use crate::store::{Identifier, StoreError};

/// Records in the caller's transaction that `ctx`'s handler processed `ctx`'s message, in the
/// inbox of the default namespace (`hexeract`). Returns `true` the first time, and `false`
/// when a committed transaction already recorded it: the handler should then return `Ok(())`
/// without doing its work again.
pub async fn mark_processed<T: OutboxTransaction>(
    tx: &mut T,
    ctx: &Context,
) -> Result<bool, StoreError> {
    mark_processed_in(tx, T::DEFAULT_NAMESPACE, ctx).await
}

/// [`mark_processed`] in the inbox of `namespace`: a PostgreSQL schema, or a SQLite table
/// prefix.
pub async fn mark_processed_in<T: OutboxTransaction>(
    tx: &mut T,
    namespace: &str,
    ctx: &Context,
) -> Result<bool, StoreError> {
    let namespace = Identifier::new(namespace)?;
    tx.insert_inbox(&namespace, ctx.handler_name(), ctx.message_id())
        .await
}
