//! [`InMemoryStore`]: pending messages and dead letters kept in the process.

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::dead_letter::DeadLetter;
use crate::envelope::Envelope;
use crate::message::Message;
use crate::publish::{Publish, PublishError};

/// Another [`MemoryWorker`](crate::MemoryWorker) is already running on this store: a worker fans
/// messages out to the handlers it knows, so two with different handlers on one store would
/// each deliver only part of the messages. `?` turns it into
/// [`Error::StoreBusy`](crate::Error::StoreBusy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "another runtime is already running on this store: run one runtime per store, or give \
     each runtime a store of its own"
)]
pub struct StoreBusy;

/// The store of the in-memory [`MemoryWorker`](crate::MemoryWorker): pending messages, their retries and
/// dead letters live in memory, so they do not survive the process. For tests and for
/// programs that need no durability; [`hexeract::run`](crate::run) uses the outbox instead.
///
/// Each `MemoryWorker` uses [`InMemoryStore::global`] unless given another; tests give each
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

struct Inner {
    /// Waiting messages go through a channel, which takes them without a lock per message.
    sender: UnboundedSender<Waiting>,
    /// Its receiving end, while no runtime takes messages (one that does holds it).
    receiver: Mutex<Option<UnboundedReceiver<Waiting>>>,
    /// Messages in the channel.
    queued: AtomicUsize,
    dead_letters: Mutex<Vec<DeadLetter>>,
    /// Deliveries not settled yet: a message waiting to be fanned out counts once, then once
    /// per handler until that handler acks or dead-letters it.
    outstanding: AtomicUsize,
    idle: Notify,
}

impl Default for Inner {
    fn default() -> Inner {
        let (sender, receiver) = unbounded_channel();
        Inner {
            sender,
            receiver: Mutex::new(Some(receiver)),
            queued: AtomicUsize::new(0),
            dead_letters: Mutex::default(),
            outstanding: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }
}

/// A store taken by one runtime: its pending messages come out here. Dropped, it gives the
/// store back, messages left in it included.
pub(crate) struct Consumer {
    store: InMemoryStore,
    receiver: Option<UnboundedReceiver<Waiting>>,
}

impl Consumer {
    /// Takes up to `limit` pending messages into `batch`, waiting for at least one. A backlog
    /// comes out in batches: one wake-up, and one update of the count the publishers also
    /// write, per batch rather than per message. Cancel-safe: dropping the future loses nothing.
    pub(crate) async fn next_batch(&mut self, batch: &mut Vec<Waiting>, limit: usize) {
        let receiver = self.receiver.as_mut().expect("held until dropped");
        let taken = receiver.recv_many(batch, limit).await;
        assert!(taken > 0, "the store keeps a sender while it lives");
        self.store.inner.queued.fetch_sub(taken, Ordering::SeqCst);
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        *lock(&self.store.inner.receiver) = self.receiver.take();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave its value half-updated: recover.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// A message waiting for the in-memory worker: for every handler of its type, or for one handler (a retry
/// handed back at shutdown, or a replayed dead letter).
#[derive(Debug)]
pub(crate) struct Waiting {
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
        let mut envelope = Envelope::new(message)?;
        crate::trace::produce(&mut envelope);
        Ok(self.publish_envelope(envelope))
    }

    /// Publishes an envelope as it is: bytes from another producer, or input to test the
    /// dead-letter path. Returns its id.
    pub fn publish_envelope(&self, envelope: Envelope) -> Uuid {
        let id = envelope.id;
        self.inner.outstanding.fetch_add(1, Ordering::SeqCst);
        self.push(Waiting {
            envelope,
            handler: None,
        });
        id
    }

    /// Messages waiting for a runtime to take them. A message a runtime has taken is not
    /// counted, even while its handler waits for a concurrency permit or a retry:
    /// [`is_idle`](InMemoryStore::is_idle) tells whether everything is settled.
    pub fn pending(&self) -> usize {
        self.inner.queued.load(Ordering::SeqCst)
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
        self.push(Waiting {
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
        let receiver = lock(&self.inner.receiver).take()?;
        Some(Consumer {
            store: self.clone(),
            receiver: Some(receiver),
        })
    }

    /// Puts back a message a runtime took but did not settle (shutdown), keeping its attempts.
    pub(crate) fn requeue(&self, pending: Waiting) {
        self.push(pending);
    }

    /// A taken message became `deliveries` deliveries (one per handler).
    pub(crate) fn fan_out(&self, deliveries: usize) {
        match deliveries {
            0 => self.settle(),
            // The message's own count passes to its one delivery: nothing to write.
            1 => {}
            more => {
                self.inner.outstanding.fetch_add(more - 1, Ordering::SeqCst);
            }
        }
    }

    /// The `deliveries` deliveries of a taken message went back unstarted, as one message.
    pub(crate) fn fold_back(&self, deliveries: usize) {
        if deliveries > 1 {
            self.inner
                .outstanding
                .fetch_sub(deliveries - 1, Ordering::SeqCst);
        }
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

    fn push(&self, pending: Waiting) {
        self.inner.queued.fetch_add(1, Ordering::SeqCst);
        // The receiver lives as long as the store: in it, or in the consumer that took it.
        self.inner
            .sender
            .send(pending)
            .expect("the store keeps its receiver while it lives");
    }

    fn lock_dead_letters(&self) -> std::sync::MutexGuard<'_, Vec<DeadLetter>> {
        lock(&self.inner.dead_letters)
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
