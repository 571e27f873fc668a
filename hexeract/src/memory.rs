//! [`InMemoryStore`]: pending messages and dead letters kept in the process.

use std::collections::VecDeque;
use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::dead_letter::DeadLetter;
use crate::envelope::Envelope;
use crate::message::Message;
use crate::publish::{Publish, PublishError};

/// The store of the in-memory [`Runtime`](crate::Runtime): pending messages, their retries and
/// dead letters live in memory, so they do not survive the process. For tests and for
/// programs that need no durability; [`hexeract::run`](crate::run) uses the outbox instead.
///
/// Each `Runtime` uses [`InMemoryStore::global`] unless given another; tests give each
/// runtime a [`InMemoryStore::new`] of its own to stay apart.
///
/// ```
/// # use hexeract::{InMemoryStore, Message};
/// # #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// # #[message(type = "OrderPlaced")]
/// # struct OrderPlaced { order_id: u64 }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), hexeract::PublishError> {
/// let store = InMemoryStore::new();
/// store.publish(&OrderPlaced { order_id: 1 }).await?;
/// assert_eq!(store.pending(), 1);
/// assert!(!store.is_idle());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct InMemoryStore {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    queue: Mutex<VecDeque<Pending>>,
    ready: Notify,
    dead_letters: Mutex<Vec<DeadLetter>>,
    /// Deliveries not settled yet: a message waiting to be fanned out counts once, then once
    /// per handler until that handler acks or dead-letters it.
    outstanding: AtomicUsize,
    idle: Notify,
    /// A runtime is taking messages from this store.
    consumed: AtomicBool,
}

/// Marks a store as taken by one runtime until dropped.
pub(crate) struct Consumer {
    store: InMemoryStore,
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.store.inner.consumed.store(false, Ordering::SeqCst);
    }
}

/// A message waiting for a runtime: for every handler of its type, or for one handler (a retry
/// handed back at shutdown, or a replayed dead letter).
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) envelope: Envelope,
    pub(crate) handler: Option<String>,
}

impl InMemoryStore {
    /// A store of its own, shared by nothing else.
    pub fn new() -> InMemoryStore {
        InMemoryStore::default()
    }

    /// The process's default store.
    pub fn global() -> &'static InMemoryStore {
        static GLOBAL: OnceLock<InMemoryStore> = OnceLock::new();
        GLOBAL.get_or_init(InMemoryStore::new)
    }

    /// Publishes `message`, to be delivered to every handler of its type. Returns its id.
    pub async fn publish<M: Message>(&self, message: &M) -> Result<Uuid, PublishError> {
        Ok(self.publish_envelope(Envelope::new(message)?))
    }

    /// Publishes an envelope as it is: bytes from another producer, or input to test the
    /// dead-letter path. Returns its id.
    pub fn publish_envelope(&self, envelope: Envelope) -> Uuid {
        let id = envelope.id;
        self.inner.outstanding.fetch_add(1, Ordering::SeqCst);
        self.push(Pending {
            envelope,
            handler: None,
        });
        id
    }

    /// Messages waiting for a runtime to take them. A message a runtime has taken is not
    /// counted, even while its handler waits for a concurrency permit or a retry:
    /// [`is_idle`](InMemoryStore::is_idle) tells whether everything is settled.
    pub fn pending(&self) -> usize {
        self.lock_queue().len()
    }

    /// `true` when every published message has been acked or dead-lettered by every handler.
    pub fn is_idle(&self) -> bool {
        self.inner.outstanding.load(Ordering::SeqCst) == 0
    }

    /// Waits until [`is_idle`](InMemoryStore::is_idle): nothing queued, running or waiting to
    /// be retried.
    pub async fn wait_idle(&self) {
        loop {
            let mut notified = pin!(self.inner.idle.notified());
            notified.as_mut().enable();
            if self.is_idle() {
                return;
            }
            notified.await;
        }
    }

    /// The dead letters, oldest first.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.lock_dead_letters().clone()
    }

    /// Sends a dead letter back to its handler (or to every handler of its type, when it had
    /// none) with a fresh retry budget, and removes it from the dead letters. Returns `false`
    /// when there is no dead letter with this id.
    pub fn replay_dead_letter(&self, id: Uuid) -> bool {
        let dead_letter = {
            let mut dead_letters = self.lock_dead_letters();
            let Some(position) = dead_letters.iter().position(|letter| letter.id == id) else {
                return false;
            };
            dead_letters.remove(position)
        };
        let mut envelope = dead_letter.envelope;
        envelope.attempt = 0;
        self.inner.outstanding.fetch_add(1, Ordering::SeqCst);
        self.push(Pending {
            envelope,
            handler: dead_letter.handler,
        });
        true
    }

    /// Removes every dead letter; returns how many there were.
    pub fn purge_dead_letters(&self) -> usize {
        std::mem::take(&mut *self.lock_dead_letters()).len()
    }

    /// Takes the store for one runtime, or `None` when another runtime has it.
    pub(crate) fn claim_consumer(&self) -> Option<Consumer> {
        self.inner
            .consumed
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| Consumer {
                store: self.clone(),
            })
    }

    /// Takes the next pending message, waiting for one. Cancel-safe: dropping the future loses
    /// nothing.
    pub(crate) async fn next(&self) -> Pending {
        loop {
            let mut notified = pin!(self.inner.ready.notified());
            notified.as_mut().enable();
            if let Some(pending) = self.lock_queue().pop_front() {
                return pending;
            }
            notified.await;
        }
    }

    /// Puts back a message a runtime took but did not settle (shutdown), keeping its attempts.
    pub(crate) fn requeue(&self, pending: Pending) {
        self.push(pending);
    }

    /// A taken message became `deliveries` deliveries (one per handler).
    pub(crate) fn fan_out(&self, deliveries: usize) {
        self.inner
            .outstanding
            .fetch_add(deliveries, Ordering::SeqCst);
        self.settle();
    }

    /// One delivery was acked or dead-lettered.
    pub(crate) fn settle(&self) {
        if self.inner.outstanding.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.idle.notify_waiters();
        }
    }

    pub(crate) fn record_dead_letter(&self, dead_letter: DeadLetter) {
        self.lock_dead_letters().push(dead_letter);
        self.settle();
    }

    fn push(&self, pending: Pending) {
        self.lock_queue().push_back(pending);
        self.inner.ready.notify_one();
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        // A panic while holding this lock cannot leave the queue half-updated: recover it.
        self.inner
            .queue
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn lock_dead_letters(&self) -> std::sync::MutexGuard<'_, Vec<DeadLetter>> {
        self.inner
            .dead_letters
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

impl Publish for InMemoryStore {
    fn publish_envelope(&self, envelope: Envelope) -> BoxFuture<'_, Result<Uuid, PublishError>> {
        let id = InMemoryStore::publish_envelope(self, envelope);
        Box::pin(async move { Ok(id) })
    }
}

impl fmt::Debug for InMemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryStore")
            .field("pending", &self.pending())
            .field(
                "outstanding",
                &self.inner.outstanding.load(Ordering::SeqCst),
            )
            .field("dead_letters", &self.lock_dead_letters().len())
            .finish()
    }
}
