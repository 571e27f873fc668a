//! The in-memory [`MemoryWorker`]: a world of the delivery engine whose messages wait in an
//! [`InMemoryStore`]. It fans each message out to every handler of its type; the engine applies
//! timeouts, concurrency limits and the retry policy; dead letters stay in the store.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::dead_letter::DeadLetter;
use crate::delivery::{Engine, Policy, Slot, Target, Verdict, World, IN_MEMORY_CONCURRENCY};
use crate::envelope::Envelope;
use crate::memory::{InMemoryStore, StoreBusy, Waiting};
use crate::metrics::Metrics;
use crate::publish::Publish;
use crate::registry::{HandlerInfo, HandlerSet, Registry};
use crate::signals::stop_on_signal;
use crate::worker::{handler_slot, BuildError, MessageSource, Source, WorkerBuilder};

type Filter = Box<dyn Fn(&HandlerInfo) -> bool + Send>;

/// Builds a [`MemoryWorker`], the in-memory world, with explicit settings. (Its durable counterpart,
/// [`hexeract::run`](crate::run), runs the same handlers on the outbox.)
///
/// ```
/// use std::time::Duration;
/// use hexeract::{InMemoryStore, MemoryWorker};
///
/// let runtime = MemoryWorker::builder()
///     .store(InMemoryStore::new())
///     .max_deliveries(3)
///     .retry_delays(Duration::from_millis(10), Duration::from_millis(100))
///     .handler_timeout(Duration::from_secs(5))
///     .build()?;
/// # Ok::<(), hexeract::Error>(())
/// ```
pub type MemoryWorkerBuilder = WorkerBuilder<MemorySource>;

/// The in-memory world's own half of a [`MemoryWorker`]: the store its messages wait in, which
/// handlers it keeps, where it counts their outcomes. Its setters are on [`MemoryWorkerBuilder`].
pub struct MemorySource {
    filter: Option<Filter>,
    store: Option<InMemoryStore>,
    handle_signals: bool,
    metrics: Option<Metrics>,
}

impl fmt::Debug for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySource")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl crate::worker::sealed::Sealed for MemorySource {}
impl MessageSource for MemorySource {}

impl Source for MemorySource {
    type Worker = MemoryWorker;

    fn build(builder: MemoryWorkerBuilder) -> Result<MemoryWorker, BuildError> {
        let (handlers, policy, source) = builder.into_parts();
        policy.checks("max_deliveries").finish()?;

        let keep = source
            .filter
            .as_ref()
            .map(|keep| keep as &dyn Fn(&HandlerInfo) -> bool);
        let registry = handlers.build(keep)?;

        let store = source
            .store
            .unwrap_or_else(|| InMemoryStore::global().clone());
        let metrics = source.metrics.unwrap_or_else(|| Metrics::global().clone());
        let slots: Vec<Slot> = registry
            .handlers()
            .filter_map(|info| registry.get(&info.name))
            .map(|handler| handler_slot(&policy, handler, &metrics, None))
            .collect();
        let by_name = slots
            .iter()
            .enumerate()
            .map(|(index, slot)| (slot.name().to_string(), index))
            .collect();
        let mut by_type: ByType = HashMap::default();
        for (index, slot) in slots.iter().enumerate() {
            let message_type = slot.registered().expect("a handler").info().message_type;
            by_type.entry(message_type).or_default().push(index);
        }
        Ok(MemoryWorker {
            shared: Arc::new(Shared {
                publisher: Arc::new(store.clone()),
                store,
                registry,
                slots,
                by_name,
                by_type,
                engine: Engine::new(policy.retry, policy.max_payload_bytes, "memory")
                    .metrics_in(metrics),
                shutdown_grace: policy.shutdown_grace,
                handle_signals: source.handle_signals,
            }),
        })
    }
}

impl Default for WorkerBuilder<MemorySource> {
    /// Every `#[handler]` of the program, 16 calls of a handler at once, the library's other
    /// defaults.
    fn default() -> MemoryWorkerBuilder {
        let mut builder = WorkerBuilder::from_source(
            MemorySource {
                filter: None,
                store: None,
                handle_signals: false,
                metrics: None,
            },
            Policy {
                concurrency: Some(IN_MEMORY_CONCURRENCY),
                ..Policy::library()
            },
        );
        builder.handlers = HandlerSet::program();
        builder
    }
}

impl WorkerBuilder<MemorySource> {
    /// Keeps only the handlers `keep` accepts.
    pub fn handlers_where(
        mut self,
        keep: impl Fn(&HandlerInfo) -> bool + Send + 'static,
    ) -> MemoryWorkerBuilder {
        self.source.filter = Some(Box::new(keep));
        self
    }

    /// Where messages wait and dead letters are kept (default: [`InMemoryStore::global`]).
    pub fn store(mut self, store: InMemoryStore) -> MemoryWorkerBuilder {
        self.source.store = Some(store);
        self
    }

    /// Counts the handlers' outcomes in `metrics` (default: [`Metrics::global`], which
    /// `/metrics` renders); a registry of its own keeps a runtime's [`MemoryWorker::stats`] apart
    /// from other runtimes with handlers of the same names.
    ///
    /// ```
    /// use hexeract::metrics::Metrics;
    /// use hexeract::{InMemoryStore, MemoryWorker};
    ///
    /// let runtime = MemoryWorker::builder()
    ///     .store(InMemoryStore::new())
    ///     .metrics(Metrics::new())
    ///     .build()?;
    /// # Ok::<(), hexeract::Error>(())
    /// ```
    pub fn metrics(mut self, metrics: Metrics) -> MemoryWorkerBuilder {
        self.source.metrics = Some(metrics);
        self
    }

    /// Also stop on SIGTERM and Ctrl-C (default off; on in [`hexeract::run`](crate::run)).
    pub fn handle_signals(mut self, handle: bool) -> MemoryWorkerBuilder {
        self.source.handle_signals = handle;
        self
    }
}

/// Messages the runtime takes from its store at a time: each is started before the next batch
/// is taken, and the stop is checked between messages.
const RECEIVE_BATCH: usize = 64;

/// A configured runtime; [`MemoryWorker::run`] runs it. Clones share everything.
#[derive(Clone)]
pub struct MemoryWorker {
    shared: Arc<Shared>,
}

struct Shared {
    store: InMemoryStore,
    publisher: Arc<dyn Publish>,
    registry: Registry,
    /// Every handler as the engine calls it, in name order.
    slots: Vec<Slot>,
    by_name: HashMap<String, usize>,
    by_type: ByType,
    engine: Engine,
    shutdown_grace: Duration,
    handle_signals: bool,
}

/// The slots of each message type's handlers, looked up once per message.
type ByType = HashMap<&'static str, Vec<usize>, BuildHasherDefault<NameHasher>>;

/// Hashes the message types of the runtime's lookup: a multiplication per eight bytes of the
/// name. The standard hasher (SipHash) resists keys chosen to collide, and costs as much as a
/// tenth of the rest of a delivery; here the keys are the program's own message types, and a
/// name that is not one of them only misses.
#[derive(Default)]
struct NameHasher(u64);

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// What one handler did, as counted in the runtime's metrics (those of
/// [`MemoryWorkerBuilder::metrics`], [`Metrics::global`] by default).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandlerStats {
    /// The handler's name.
    pub name: String,
    /// The message type it handles.
    pub message_type: &'static str,
    /// Messages it acked.
    pub handled: u64,
    /// Failed calls that were retried.
    pub retried: u64,
    /// Messages it dead-lettered (its own decision, or retries ran out).
    pub dead_lettered: u64,
}

impl MemoryWorker {
    /// A builder with the library defaults.
    pub fn builder() -> MemoryWorkerBuilder {
        MemoryWorkerBuilder::default()
    }

    /// The store this runtime takes messages from: publish there, wait for it to be idle, read
    /// its dead letters.
    pub fn store(&self) -> &InMemoryStore {
        &self.shared.store
    }

    /// The handlers this runtime runs.
    pub fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    /// Counters per handler, sorted by handler name.
    pub fn stats(&self) -> Vec<HandlerStats> {
        self.shared
            .slots
            .iter()
            .map(|slot| {
                let metrics = slot.metrics();
                HandlerStats {
                    name: slot.name().to_string(),
                    message_type: slot.registered().expect("a handler").info().message_type,
                    handled: metrics.handled_count(),
                    retried: metrics.retried_count(),
                    dead_lettered: metrics.dead_lettered_count(),
                }
            })
            .collect()
    }

    /// Runs until `cancel` fires, then lets running handlers finish (up to the shutdown grace)
    /// and returns `Ok(())`. Messages not started, or waiting for a retry, stay in the store
    /// (those the runtime had taken but not started go back behind the others: the in-memory
    /// store keeps no order across a stop).
    ///
    /// One runtime runs on a store at a time (it fans messages out to its own handlers): a
    /// second `run` on the same store returns [`StoreBusy`].
    ///
    /// Stopping has one hard deadline: the grace and 5 s to settle.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), StoreBusy> {
        let grace = self.shared.shutdown_grace;
        crate::delivery::stop_by_deadline("runtime", &cancel, grace, self.serve(cancel.clone()))
            .await
    }

    async fn serve(self, cancel: CancellationToken) -> Result<(), StoreBusy> {
        let mut consumer = self.shared.store.claim_consumer().ok_or(StoreBusy)?;
        let run = Arc::new(Run {
            shared: self.shared.clone(),
            stop: cancel.child_token(),
            abort: CancellationToken::new(),
        });
        let stop = &run.stop;
        if self.shared.handle_signals {
            tokio::spawn(stop_on_signal(stop.clone()));
        }
        let tracker = TaskTracker::new();
        tracing::info!(
            handlers = self.shared.registry.len(),
            "hexeract runtime started (in-process store)"
        );
        for info in self.shared.registry.handlers() {
            tracing::debug!(handler = %info.name, message_type = info.message_type, "handler registered");
        }
        // One wait for the stop across the loop: a new one per message would register and
        // unregister a waiter on the token, a lock each way.
        let mut stopped = std::pin::pin!(stop.cancelled());
        let mut batch = Vec::with_capacity(RECEIVE_BATCH);
        'taking: loop {
            tokio::select! {
                biased;
                () = &mut stopped => break,
                () = consumer.next_batch(&mut batch, RECEIVE_BATCH) => {}
            }
            let full = batch.len() == RECEIVE_BATCH;
            // Nothing below awaits anything that waits until the batch is empty: a `run`
            // dropped here would drop the messages left in it.
            let mut taken = batch.drain(..);
            while let Some(pending) = taken.next() {
                run.accept(pending, &tracker).await;
                if stop.is_cancelled() {
                    // Not started: back in the store, as if never taken.
                    taken.for_each(|pending| self.shared.store.requeue(pending));
                    break 'taking;
                }
            }
            // A backlog is always ready: let the spawned handlers (and the application's other
            // tasks) run on a single-threaded executor too. A batch takes one unit of the
            // task's budget where a message took one before, so a full batch gives way itself.
            if full {
                tokio::task::yield_now().await;
            } else {
                tokio::task::consume_budget().await;
            }
        }
        tracker.close();
        if tokio::time::timeout(self.shared.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                grace = ?self.shared.shutdown_grace,
                "handlers still running after the shutdown grace; interrupting them, their messages stay in the store"
            );
            run.abort.cancel();
            tracker.wait().await;
        }
        let left = self.shared.store.pending();
        if left > 0 {
            tracing::info!(
                pending = left,
                "hexeract runtime stopped; messages left in the store"
            );
        } else {
            tracing::info!("hexeract runtime stopped");
        }
        Ok(())
    }
}

impl fmt::Debug for MemoryWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWorker")
            .field("handlers", &self.shared.registry)
            .field("retry", self.shared.engine.retry())
            .field("store", &self.shared.store)
            .finish_non_exhaustive()
    }
}

/// Where one of the runtime's deliveries goes: a handler by its place in the slots, or none.
enum Destination {
    Slot(usize),
    NoHandlerForType,
    NoSuchHandler(String),
}

/// One run of a runtime: what its deliveries share, behind one `Arc` (a delivery that goes on
/// in a task of its own holds it).
struct Run {
    shared: Arc<Shared>,
    /// The runtime was told to stop: no new calls, retries wait no longer.
    stop: CancellationToken,
    /// The shutdown grace is over: running calls are given up on.
    abort: CancellationToken,
}

impl Run {
    /// Fans a message out to its handlers. Each delivery is polled once here: a handler that
    /// does not wait is called, settled and done without a task; one that waits (or must wait
    /// for a permit, or for a retry) goes on in a task of its own.
    async fn accept(self: &Arc<Self>, pending: Waiting, tracker: &TaskTracker) {
        let Waiting { envelope, handler } = pending;
        let shared = &self.shared;
        let only;
        let destinations: &[usize] = match handler {
            Some(name) => match shared.by_name.get(&name) {
                Some(index) => {
                    only = [*index];
                    &only
                }
                None => {
                    shared.store.fan_out(1);
                    let missing = Destination::NoSuchHandler(name);
                    return self.start(Arc::new(envelope), missing, tracker).await;
                }
            },
            None => match shared.by_type.get(envelope.message_type.as_str()) {
                Some(indexes) => indexes,
                None => {
                    shared.store.fan_out(1);
                    let missing = Destination::NoHandlerForType;
                    return self.start(Arc::new(envelope), missing, tracker).await;
                }
            },
        };
        shared.store.fan_out(destinations.len());
        // One envelope for every handler: a delivery copies it only when it counts an attempt
        // while another still holds it.
        let envelope = Arc::new(envelope);
        let (last, others) = destinations.split_last().expect("never empty");
        for index in others {
            let destination = Destination::Slot(*index);
            self.start(envelope.clone(), destination, tracker).await;
        }
        self.start(envelope, Destination::Slot(*last), tracker)
            .await;
    }

    async fn start(
        self: &Arc<Self>,
        envelope: Arc<Envelope>,
        destination: Destination,
        tracker: &TaskTracker,
    ) {
        let mut delivery = Box::pin(self.clone().deliver(envelope, destination));
        if futures_util::poll!(&mut delivery).is_pending() {
            tracker.spawn(delivery);
        }
    }

    /// Calls the handler until the message is acked or dead-lettered, or the runtime stops
    /// (then the message goes back to the store with the attempts it used).
    async fn deliver(self: Arc<Self>, mut envelope: Arc<Envelope>, destination: Destination) {
        let shared = &*self.shared;
        let target = shared.target(&destination);
        loop {
            // Attempts are counted when a call starts, so a call that never finished (its
            // runtime was stopped past the grace) still uses one up.
            Arc::make_mut(&mut envelope).attempt += 1;
            let verdict = shared
                .engine
                .deliver(
                    target,
                    &envelope,
                    &self.stop,
                    &self.abort,
                    &shared.publisher,
                )
                .await;
            let world = Memory {
                shared,
                target,
                stop: &self.stop,
            };
            // A call that finished holds the envelope no more: this takes it without a copy.
            match world.settle(Arc::unwrap_or_clone(envelope), verdict).await {
                Some(again) => envelope = Arc::new(again),
                None => return,
            }
        }
    }
}

impl Shared {
    fn target<'a>(&'a self, destination: &'a Destination) -> Target<'a> {
        match destination {
            Destination::Slot(index) => Target::Slot(&self.slots[*index]),
            Destination::NoHandlerForType => Target::NoHandlerForType(None),
            Destination::NoSuchHandler(name) => Target::NoSuchHandler(name),
        }
    }
}

/// The in-memory world: verdicts become store updates, and a retry waits in the delivery's
/// task.
struct Memory<'a> {
    shared: &'a Shared,
    target: Target<'a>,
    stop: &'a CancellationToken,
}

impl World for Memory<'_> {
    type Delivery = Envelope;
    /// The envelope to call again, after a retry's wait.
    type Settled = Option<Envelope>;

    async fn settle(&self, mut envelope: Envelope, verdict: Verdict) -> Option<Envelope> {
        let store = &self.shared.store;
        let handler = || self.target.handler_name().map(str::to_owned);
        let put_back = |envelope| {
            store.requeue(Waiting {
                envelope,
                handler: handler(),
            });
        };
        match verdict {
            Verdict::Ack => store.settle(),
            Verdict::DeadLetter {
                reason,
                detail,
                calls,
            } => {
                envelope.attempt = calls;
                store.record_dead_letter(DeadLetter::new(envelope, handler(), reason, &detail));
            }
            Verdict::Retry { delay, .. } => {
                tokio::select! {
                    biased;
                    () = self.stop.cancelled() => put_back(envelope),
                    () = tokio::time::sleep(delay) => return Some(envelope),
                }
            }
            // Back in the store with the attempt counted: the call may still be running.
            Verdict::Abandoned => put_back(envelope),
            Verdict::Release => {
                envelope.attempt -= 1;
                put_back(envelope);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configure_from_reads_max_payload_bytes() {
        let builder = MemoryWorker::builder()
            .configure_from(|name| (name == "MAX_PAYLOAD_BYTES").then(|| "2048".to_owned()))
            .unwrap();
        assert!(
            format!("{builder:?}").contains("max_payload_bytes: 2048"),
            "{builder:?}"
        );
    }
}
