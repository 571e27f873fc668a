//! The in-memory [`MemoryWorker`]: a world of the delivery engine whose messages wait in an
//! [`InMemoryStore`]. It fans each message out to every handler of its type; the engine applies
//! timeouts, concurrency limits and the retry policy; dead letters stay in the store.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::dead_letter::DeadLetter;
use crate::delivery::{Engine, Policy, Slot, Verdict, IN_MEMORY_CONCURRENCY};
use crate::envelope::Envelope;
use crate::health::Probe;
use crate::memory::{Consumer, InMemoryStore, StoreBusy, Waiting};
use crate::metrics::Metrics;
use crate::registry::{HandlerInfo, HandlerSet, Registry};
use crate::signals::stop_on_signal;
use crate::worker::feed::{Arrival, Feed, Pace, Pass, Refill, Row, Started, To, Worker};
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
        let mut by_type: ByType = HashMap::default();
        for (index, slot) in slots.iter().enumerate() {
            let message_type = slot.registered().expect("a handler").info().message_type;
            by_type.entry(message_type).or_default().push(index);
        }
        let feed = MemoryFeed {
            store,
            registry,
            by_type,
            consumer: std::sync::Mutex::new(None),
            backlog: AtomicBool::new(false),
        };
        let engine =
            Engine::new(policy.retry, policy.max_payload_bytes, "memory").metrics_in(metrics);
        let pace = Pace {
            poll_interval: policy.poll_interval,
            busy_delay: Duration::ZERO,
            // No bound of its own: each handler's concurrency is.
            batch_size: u32::MAX,
            shutdown_grace: policy.shutdown_grace,
            refill: Refill::WhenAnyEnds,
        };
        Ok(MemoryWorker {
            worker: Worker::new(
                feed,
                slots,
                engine,
                pace,
                Probe::detached("in-memory worker"),
            ),
            handle_signals: source.handle_signals,
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

/// Messages the worker takes from its store per pass: each is started before the next pass,
/// and the stop is checked between passes.
const RECEIVE_BATCH: usize = 64;

/// A configured in-memory worker; [`MemoryWorker::run`] runs it. Clones share everything.
#[derive(Clone)]
pub struct MemoryWorker {
    worker: Worker<MemoryFeed>,
    handle_signals: bool,
}

/// The slots of each message type's handlers, looked up once per message.
type ByType = HashMap<&'static str, Vec<usize>, BuildHasherDefault<NameHasher>>;

/// Hashes the message types of the worker's lookup: a multiplication per eight bytes of the
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

/// What one handler did, as counted in the worker's metrics (those of
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

    /// The store this worker takes messages from: publish there, wait for it to be idle, read
    /// its dead letters.
    pub fn store(&self) -> &InMemoryStore {
        &self.worker.feed().store
    }

    /// The handlers this worker runs.
    pub fn registry(&self) -> &Registry {
        &self.worker.feed().registry
    }

    /// Counters per handler, sorted by handler name.
    pub fn stats(&self) -> Vec<HandlerStats> {
        self.worker
            .slots()
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
    /// (those the worker had taken but not started go back behind the others: the in-memory
    /// store keeps no order across a stop).
    ///
    /// One worker runs on a store at a time (it fans messages out to its own handlers): a
    /// second `run` on the same store returns [`StoreBusy`].
    ///
    /// Stopping has one hard deadline: the grace and 5 s to settle.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), StoreBusy> {
        let stop = cancel.child_token();
        if self.handle_signals {
            tokio::spawn(stop_on_signal(stop.clone()));
        }
        let store = self.store().clone();
        self.worker.run(stop).await?;
        let left = store.pending();
        if left > 0 {
            tracing::info!(pending = left, "messages left in the in-memory store");
        }
        Ok(())
    }
}

impl fmt::Debug for MemoryWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWorker")
            .field("handlers", self.registry())
            .field("retry", self.worker.engine().retry())
            .field("store", self.store())
            .finish_non_exhaustive()
    }
}

/// The in-memory store as a [`Feed`]: each pass takes a batch of waiting messages and fans each
/// out to every handler of its type (or to the one handler a retry or a replay is for); the
/// attempt is counted as it is taken. A retry waits in its call's task and goes back into the
/// store; dead letters stay in the store.
struct MemoryFeed {
    store: InMemoryStore,
    registry: Registry,
    by_type: ByType,
    /// The store's messages, taken by [`start`](Feed::start) and given back by
    /// [`finish`](Feed::finish), and the buffer each pass takes a batch into. A pass holds
    /// them while it waits: dropped there, the consumer gives the store back itself.
    consumer: std::sync::Mutex<Option<(Consumer, Vec<Waiting>)>>,
    /// The last pass took a full batch: the next gives way to other tasks first.
    backlog: AtomicBool,
}

impl MemoryFeed {
    /// The consumer and its buffer, while the worker holds the store.
    fn taken(&self) -> std::sync::MutexGuard<'_, Option<(Consumer, Vec<Waiting>)>> {
        // Nothing panics while holding it: a poisoned lock holds a whole value.
        self.consumer
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Back in the store, for `handler` (every handler of its type when `None`).
    fn put_back(&self, envelope: Envelope, handler: Option<&str>) {
        self.store.requeue(Waiting {
            envelope,
            handler: handler.map(str::to_owned),
        });
    }
}

impl Feed for MemoryFeed {
    type Claim = ();
    type Error = StoreBusy;
    const NAME: &'static str = "in-memory worker";

    async fn start(&self) -> Result<Started, StoreBusy> {
        let consumer = self.store.claim_consumer().ok_or(StoreBusy)?;
        *self.taken() = Some((consumer, Vec::with_capacity(RECEIVE_BATCH)));
        for info in self.registry.handlers() {
            tracing::debug!(handler = %info.name, message_type = info.message_type, "handler registered");
        }
        Ok(Started {
            wake: None,
            publisher: Arc::new(self.store.clone()),
        })
    }

    async fn pass(
        &self,
        _acks: Vec<()>,
        room: u32,
        stop: &CancellationToken,
    ) -> Result<Pass<()>, StoreBusy> {
        let limit = usize::try_from(room)
            .unwrap_or(usize::MAX)
            .min(RECEIVE_BATCH);
        // A backlog is always ready: let the spawned handlers (and the application's other
        // tasks) run on a single-threaded executor too. A batch takes one unit of the task's
        // budget where a message took one before, so a full batch gives way itself. Done
        // before taking, so that nothing taken waits here.
        if self.backlog.swap(false, Ordering::Relaxed) {
            tokio::task::yield_now().await;
        } else {
            tokio::task::consume_budget().await;
        }
        let (mut consumer, mut batch) = self.taken().take().expect("taken when the worker started");
        if limit > 0 {
            tokio::select! {
                biased;
                () = stop.cancelled() => {}
                () = consumer.next_batch(&mut batch, limit) => {}
            }
        }
        self.backlog
            .store(batch.len() == RECEIVE_BATCH, Ordering::Relaxed);
        let mut arrivals = Vec::with_capacity(batch.len());
        let arrival = |to, envelope| Arrival {
            claim: (),
            to,
            envelope,
            recovered: false,
            refused: None,
        };
        for Waiting {
            mut envelope,
            handler,
        } in batch.drain(..)
        {
            // Counted as it is taken, so a call that never finished (its worker was stopped
            // past the grace) still uses one up.
            envelope.attempt += 1;
            let slots = match &handler {
                None => self.by_type.get(envelope.message_type.as_str()),
                Some(_) => None,
            };
            match (handler, slots) {
                (Some(name), _) => {
                    self.store.fan_out(1);
                    arrivals.push(arrival(To::Named(name), Arc::new(envelope)));
                }
                (None, Some(slots)) => {
                    self.store.fan_out(slots.len());
                    // One envelope for every handler: a delivery copies it only when it is put
                    // back while another still holds it.
                    let envelope = Arc::new(envelope);
                    for slot in slots {
                        arrivals.push(arrival(To::Slot(*slot), envelope.clone()));
                    }
                }
                (None, None) => {
                    self.store.fan_out(1);
                    arrivals.push(arrival(To::Nobody, Arc::new(envelope)));
                }
            }
        }
        *self.taken() = Some((consumer, batch));
        Ok(Pass::of(arrivals))
    }

    async fn settle(
        &self,
        _claim: &(),
        handler: Option<&str>,
        envelope: Arc<Envelope>,
        verdict: Verdict,
        stop: &CancellationToken,
    ) -> Result<Row, StoreBusy> {
        // A call that finished holds the envelope no more: this takes it without a copy.
        let envelope = || Arc::unwrap_or_clone(envelope);
        match verdict {
            Verdict::Ack => self.store.settle(),
            Verdict::DeadLetter {
                reason,
                detail,
                calls,
            } => {
                let mut envelope = envelope();
                envelope.attempt = calls;
                let handler = handler.map(str::to_owned);
                let dead_letter = DeadLetter::new(envelope, handler, reason, &detail);
                self.store.record_dead_letter(dead_letter);
            }
            Verdict::Retry { delay, .. } => {
                // Back in the store once the delay is over, or at once when the worker stops.
                tokio::select! {
                    biased;
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(delay) => {}
                }
                self.put_back(envelope(), handler);
            }
            // Back in the store with the attempt counted: the call may still be running.
            Verdict::Abandoned => self.put_back(envelope(), handler),
            Verdict::Release => {
                let mut envelope = envelope();
                envelope.attempt -= 1;
                self.put_back(envelope, handler);
            }
        }
        Ok(Row::Settled)
    }

    /// Taken but not started (the worker was told to stop): back in the store, their attempt
    /// not counted. A message none of whose handlers started goes back as it came, for every
    /// handler of its type; one a handler's retry or a replay was for, for that handler.
    async fn hand_back(&self, arrivals: Vec<Arrival<()>>) -> Result<(), StoreBusy> {
        let mut arrivals = arrivals.into_iter().peekable();
        while let Some(arrival) = arrivals.next() {
            let handler = match arrival.to {
                To::Named(name) => Some(name),
                // The deliveries of one message (the loop starts them all or none).
                To::Slot(_) => {
                    let mut deliveries = 1;
                    while arrivals
                        .next_if(|next| Arc::ptr_eq(&next.envelope, &arrival.envelope))
                        .is_some()
                    {
                        deliveries += 1;
                    }
                    self.store.fold_back(deliveries);
                    None
                }
                To::Nobody | To::QueueOf(_) => None,
            };
            let mut envelope = Arc::unwrap_or_clone(arrival.envelope);
            envelope.attempt -= 1;
            self.store.requeue(Waiting { envelope, handler });
        }
        Ok(())
    }

    async fn close(&self, _acks: Vec<()>) -> Result<(), StoreBusy> {
        Ok(())
    }

    /// Gives the store back: another worker may run on it.
    fn finish(&self) {
        self.taken().take();
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
