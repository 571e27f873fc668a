//! Queues that no handler owns any more: a handler that was renamed or removed leaves its queue
//! on the broker, and whatever is in it waits for nobody.
//!
//! The broker cannot list queues over AMQP (that takes the management plugin), so the store
//! remembers every handler queue a worker declared (`declared_queues`); at startup, the queues
//! it remembers that the current handlers do not declare are looked at with a passive declare:
//! one that still exists is reported with its message count, one that is gone is forgotten.

use crate::rabbitmq::topology::inspect_queue;
use crate::rabbitmq::{RabbitMqConnection, Topology};
use crate::store::{DeclaredQueue, DeclaredQueues};

/// A queue declared for a handler this program does not have, still on the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnownedQueue {
    /// The queue as the store remembers it: name, former handler, message type.
    pub(crate) declared: DeclaredQueue,
    /// Messages in it (ready, not counting unacknowledged ones).
    pub(crate) messages: u32,
    /// Consumers on it (another deployment may still run that handler).
    pub(crate) consumers: u32,
}

/// Remembers `topology`'s handler queues in `store`, then returns the remembered queues under
/// `topology`'s prefix that it does not declare and that still exist on the broker, forgetting
/// those that are gone.
pub(crate) async fn record_and_find_unowned(
    connection: &RabbitMqConnection,
    topology: &Topology,
    store: &dyn DeclaredQueues,
) -> Result<Vec<UnownedQueue>, crate::Error> {
    // `validate` (at startup) refused two handlers sharing a queue, so the names are unique.
    let current: Vec<DeclaredQueue> = topology
        .handler_queues()
        .into_iter()
        .map(|queue| DeclaredQueue {
            queue: queue.queue,
            handler: queue.handler,
            message_type: queue.message_type,
            declared_at: chrono::Utc::now(),
        })
        .collect();
    store.record_declared_queues(&current).await?;
    find_unowned(connection, topology, store).await
}

/// The remembered queues `topology` does not declare and that still exist on the broker; those
/// that are gone are forgotten.
pub(crate) async fn find_unowned(
    connection: &RabbitMqConnection,
    topology: &Topology,
    store: &dyn DeclaredQueues,
) -> Result<Vec<UnownedQueue>, crate::Error> {
    let owned: Vec<String> = topology
        .handler_queues()
        .into_iter()
        .map(|queue| queue.queue)
        .collect();
    // Only this program's prefix: another service may share the database and the broker
    // under a prefix of its own (`HEXERACT_QUEUE_PREFIX`), and its queues are not ours.
    let ours = format!("{}.", topology.queue_prefix());
    let mut unowned = Vec::new();
    for declared in store.declared_queues().await? {
        if owned.contains(&declared.queue) || !declared.queue.starts_with(&ours) {
            continue;
        }
        match inspect_queue(connection, &declared.queue).await? {
            Some((messages, consumers)) => unowned.push(UnownedQueue {
                declared,
                messages,
                consumers,
            }),
            None => {
                store.forget_declared_queue(&declared.queue).await?;
            }
        }
    }
    Ok(unowned)
}

/// Logs one warning per unowned queue.
pub(crate) fn warn(unowned: &[UnownedQueue]) {
    for queue in unowned {
        tracing::warn!(
            queue = %queue.declared.queue,
            former_handler = %queue.declared.handler,
            message_type = %queue.declared.message_type,
            messages = queue.messages,
            consumers = queue.consumers,
            "no registered handler owns this queue (a renamed or removed handler?); its messages \
             wait for nobody: move them to the new handler's queue, or delete the queue"
        );
    }
}
