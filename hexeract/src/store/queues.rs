//! The handler queues a broker worker declared, as the store remembers them: how a later start
//! tells which queues no registered handler owns any more (a renamed or removed handler).
//! RabbitMQ's bookkeeping, kept in the store's database but apart from its deliveries.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;

use crate::store::StoreError;

/// A handler queue a broker worker declared, as the store remembers it
/// ([`DeclaredQueues::record_declared_queues`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredQueue {
    /// The queue's name on the broker.
    pub queue: String,
    /// The handler it was declared for.
    pub handler: String,
    /// The message type that handler consumed.
    pub message_type: String,
    /// When it was last declared (set by the store; ignored when recording).
    pub declared_at: DateTime<Utc>,
}

/// The handler queues broker workers declared, remembered across starts.
pub trait DeclaredQueues: Send + Sync + 'static {
    /// Remembers that a broker worker declared these handler queues (each with the handler and
    /// message type it was declared for). `declared_at` is set by the store. Recording a queue
    /// again replaces its owner.
    fn record_declared_queues<'a>(
        &'a self,
        queues: &'a [DeclaredQueue],
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Every queue [`record_declared_queues`](Self::record_declared_queues) remembers, by
    /// name.
    fn declared_queues(&self) -> BoxFuture<'_, Result<Vec<DeclaredQueue>, StoreError>>;

    /// Forgets a declared queue (it was deleted from the broker); `false` when it was not
    /// remembered.
    fn forget_declared_queue<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}
