//! [`OutboxWorker`]: the poll loop that takes a batch (due deliveries claimed under a lease, new
//! outbox rows expanded into deliveries already claimed), calls their handlers outside any
//! transaction and settles them.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::delivery::{spawn_grace_timer, Engine, Policy, Slot, Target, Verdict, World};
use crate::health::Probe;
use crate::metrics::Metrics;
use crate::publish::{Publish, PublishError};
use crate::store::{ClaimedRows, DeliveryId, DeliveryStore, Routes, Row, StoreError, NO_HANDLER};
use crate::worker::{
    claim_lease, handler_slot, BuildError, ClaimSource, MessageSource, Source, WorkerBuilder,
};

/// Builds an [`OutboxWorker`]: the one [`WorkerBuilder`] over the outbox's [`OutboxSource`].
/// The defaults are the library's: `poll_interval` 100 ms, `batch_size` 10, 5 deliveries,
/// handler timeout 30 s, and a `lease` of the longest handler timeout and 5 s to settle
/// (35 s).
pub type OutboxWorkerBuilder = WorkerBuilder<OutboxSource>;

/// The outbox's own half of an [`OutboxWorker`]: the store it claims deliveries from, what
/// wakes it, and the probe it reports to. Its setters are on [`OutboxWorkerBuilder`].
pub struct OutboxSource {
    store: Arc<dyn DeliveryStore>,
    wake: Option<Arc<Notify>>,
    polling_only: bool,
    health: Option<Probe>,
}

impl fmt::Debug for OutboxSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxSource")
            .field("store", &self.store.kind())
            .finish_non_exhaustive()
    }
}

impl crate::worker::sealed::Sealed for OutboxSource {}
impl MessageSource for OutboxSource {}
impl ClaimSource for OutboxSource {}

impl Source for OutboxSource {
    type Worker = OutboxWorker;

    fn build(builder: OutboxWorkerBuilder) -> Result<OutboxWorker, BuildError> {
        let (handlers, policy, source) = builder.into_parts();
        policy
            .checks("max_deliveries")
            .at_least_one("batch_size", policy.batch_size.into())
            .not_zero_when_set("lease", policy.lease)
            .not_zero("store_timeout", policy.store_timeout)
            .finish()?;
        let registry = handlers.build(None)?;
        let longest_call = crate::policy::longest_call(
            policy.handler_timeout,
            "handler_timeout",
            registry.handlers().map(|info| (&*info.name, info.timeout)),
        );
        let health = source
            .health
            .unwrap_or_else(|| Probe::detached("outbox worker"));
        let lease = claim_lease(&policy, "lease (DELIVERY_LEASE_MS)", longest_call, &health)?;
        let handlers = registry
            .handlers()
            .filter_map(|info| registry.get(&info.name))
            .map(|handler| {
                let slot = handler_slot(&policy, handler, Metrics::global(), Some(&health));
                (handler.info().name.to_string(), slot)
            })
            .collect();
        Ok(OutboxWorker {
            routes: Routes::from_registry(&registry),
            handlers,
            engine: Engine::new(policy.retry, policy.max_payload_bytes, source.store.kind()),
            store: source.store,
            poll_interval: policy.poll_interval,
            batch_size: policy.batch_size,
            lease,
            store_timeout: policy.store_timeout,
            shutdown_grace: policy.shutdown_grace,
            wake: source.wake,
            polling_only: source.polling_only,
            health,
        })
    }
}

impl WorkerBuilder<OutboxSource> {
    /// A worker over `store`, with no handlers yet.
    pub fn new(store: impl DeliveryStore) -> OutboxWorkerBuilder {
        OutboxWorkerBuilder::shared(Arc::new(store))
    }

    /// A worker over a store shared with other parts of the program (such as
    /// [`default_store`](crate::store::default_store)), with no handlers yet.
    pub fn shared(store: Arc<dyn DeliveryStore>) -> OutboxWorkerBuilder {
        WorkerBuilder::from_source(
            OutboxSource {
                store,
                wake: None,
                polling_only: false,
                health: None,
            },
            Policy::library(),
        )
    }

    /// Reports readiness to `probe`: ready after each cycle that reached the store, failing
    /// after one that did not.
    ///
    /// ```
    /// use hexeract::health::Health;
    /// use hexeract::outbox::OutboxWorker;
    /// use hexeract::store::sqlite::SqliteStore;
    ///
    /// # async fn example(store: SqliteStore) -> Result<(), hexeract::Error> {
    /// let health = Health::new();
    /// let worker = OutboxWorker::builder(store)
    ///     .from_registry()
    ///     .health(health.probe("outbox worker"))
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn health(mut self, probe: Probe) -> OutboxWorkerBuilder {
        self.source.health = Some(probe);
        self
    }

    /// Wakes the worker from its poll sleep when notified, instead of the store's own signal
    /// ([`DeliveryStore::wakeups`]).
    pub fn wake_on(mut self, wake: Arc<Notify>) -> OutboxWorkerBuilder {
        self.source.wake = Some(wake);
        self
    }

    /// Polls only: ignore the store's wake-up signal (for measuring what it saves).
    pub fn polling_only(mut self) -> OutboxWorkerBuilder {
        self.source.polling_only = true;
        self
    }
}

/// Delivers the outbox to handlers: take (expand and claim), call, settle, in a loop, until
/// cancelled.
///
/// Several workers (tasks or processes) may share one store: claims skip each other's rows.
/// Each cycle's handlers run outside any transaction; the database is only touched by short
/// statements that are never interrupted, so cancellation waits for the end of the cycle.
pub struct OutboxWorker {
    store: Arc<dyn DeliveryStore>,
    routes: Routes,
    handlers: HashMap<String, Slot>,
    engine: Engine,
    poll_interval: Duration,
    batch_size: u32,
    lease: Duration,
    store_timeout: Duration,
    shutdown_grace: Duration,
    wake: Option<Arc<Notify>>,
    polling_only: bool,
    health: Probe,
}

impl fmt::Debug for OutboxWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxWorker")
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .field("batch_size", &self.batch_size)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl OutboxWorker {
    /// A builder over `store`.
    pub fn builder(store: impl DeliveryStore) -> OutboxWorkerBuilder {
        OutboxWorkerBuilder::new(store)
    }

    /// A builder over a store shared with other parts of the program.
    pub fn builder_shared(store: Arc<dyn DeliveryStore>) -> OutboxWorkerBuilder {
        OutboxWorkerBuilder::shared(store)
    }

    /// Runs until `cancel` fires, then finishes the cycle in progress (handlers get the shutdown
    /// grace) and returns `Ok(())`. Store errors are logged and retried after `poll_interval`.
    ///
    /// Stopping has one hard deadline: the grace and 5 s to settle. A worker whose last writes
    /// cannot land by then (the database stopped answering) stops anyway; its claims run again
    /// once their lease ends.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), StoreError> {
        let grace = self.shutdown_grace;
        crate::delivery::stop_by_deadline(
            "outbox worker",
            &cancel,
            grace,
            self.serve(cancel.clone()),
        )
        .await
    }

    async fn serve(self, cancel: CancellationToken) -> Result<(), StoreError> {
        let interrupt = CancellationToken::new();
        let _grace = spawn_grace_timer(cancel.clone(), interrupt.clone(), self.shutdown_grace);
        let wake = match (&self.wake, self.polling_only) {
            (Some(wake), _) => wake.clone(),
            (None, true) => Arc::new(Notify::new()),
            (None, false) => crate::store::wake_signal(&*self.store).await,
        };
        let publisher: Arc<dyn Publish> = Arc::new(StorePublisher {
            store: self.store.clone(),
            wake: wake.clone(),
        });
        tracing::info!(handlers = self.handlers.len(), "outbox worker started");
        // The acks of the last cycle, written while the next one takes its batch.
        let mut owed = None;
        while !cancel.is_cancelled() {
            let cycle = self.cycle(&mut owed, &cancel, &interrupt, &publisher).await;
            match &cycle {
                Ok(_) => self.health.pass(),
                Err(error) => self.health.fail(format!("an outbox cycle failed: {error}")),
            }
            match cycle {
                Ok(0) => crate::store::idle(&cancel, &wake, self.poll_interval).await,
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "outbox worker cycle failed; retrying after the poll interval");
                    crate::store::idle(&cancel, &wake, self.poll_interval).await;
                }
            }
        }
        if let Some(acks) = owed {
            if let Err(error) = self.ack(acks).await {
                tracing::warn!(%error, "the last acks failed; those deliveries will run again when their lease ends");
            }
        }
        tracing::info!("outbox worker stopped");
        Ok(())
    }

    /// Deletes the acked deliveries of one claim.
    async fn ack(&self, acks: Acks) -> Result<(), crate::store::StoreError> {
        let deliveries = self.store.deliveries();
        let landed = self
            .timed("ack", deliveries.ack(acks.token, &acks.ids))
            .await?;
        warn_unless_all_acked(landed, acks.ids.len());
        Ok(())
    }

    /// `statement` with the worker's deadline ([`store_timeout`](OutboxWorkerBuilder::store_timeout)).
    async fn timed<T>(
        &self,
        what: &'static str,
        statement: impl std::future::Future<Output = Result<T, crate::store::StoreError>>,
    ) -> Result<T, crate::store::StoreError> {
        crate::store::within(what, self.store_timeout, statement).await
    }

    /// One take-call-settle pass; returns how many deliveries it handled. The acks of the
    /// last pass (`owed`) are written with this pass's take, in one write: one statement on
    /// PostgreSQL, one transaction on SQLite ([`DeliveryStore::ack_and_take`]), so that a pass
    /// commits once. This pass's acks are left in `owed` for the next (or for the end of
    /// [`run`](OutboxWorker::run)); its retries, dead letters and releases are written before
    /// it returns.
    async fn cycle(
        &self,
        owed: &mut Option<Acks>,
        cancel: &CancellationToken,
        interrupt: &CancellationToken,
        publisher: &Arc<dyn Publish>,
    ) -> Result<usize, crate::store::StoreError> {
        let token = Uuid::now_v7();
        let taken = match owed.take() {
            Some(acks) => {
                let both = self.store.ack_and_take(
                    (acks.token, &acks.ids),
                    &self.routes,
                    token,
                    self.batch_size,
                    self.lease,
                );
                let (landed, claimed) = self.timed("ack and take", both).await?;
                warn_unless_all_acked(landed, acks.ids.len());
                claimed
            }
            None => {
                let take = self
                    .store
                    .take(&self.routes, token, self.batch_size, self.lease);
                self.timed("take", take).await?
            }
        };
        self.run_claimed(taken, token, owed, cancel, interrupt, publisher)
            .await
    }

    /// Calls the handlers of one claimed batch and settles it: acks into `owed`, the rest
    /// written at once.
    async fn run_claimed(
        &self,
        mut claimed: Vec<crate::store::Claimed>,
        token: Uuid,
        owed: &mut Option<Acks>,
        cancel: &CancellationToken,
        interrupt: &CancellationToken,
        publisher: &Arc<dyn Publish>,
    ) -> Result<usize, crate::store::StoreError> {
        if let Some(suspect) = claimed.iter().position(|delivery| delivery.recovered) {
            // A claim of this batch was never settled: one of these messages may crash the
            // process. Run one suspect alone and give the rest back, so a crash costs no other
            // delivery an attempt.
            let suspect = claimed.swap_remove(suspect);
            let others: Vec<DeliveryId> = claimed.iter().map(|delivery| delivery.id).collect();
            let deliveries = self.store.deliveries();
            self.timed("release", deliveries.release(token, &others))
                .await?;
            tracing::info!(
                message_id = %suspect.envelope.id,
                handler = %suspect.handler,
                attempt = suspect.envelope.attempt,
                "delivery recovered from an unsettled claim; running it alone"
            );
            claimed = vec![suspect];
        }
        let count = claimed.len();
        if count == 0 {
            return Ok(0);
        }
        let verdicts = join_all(claimed.into_iter().map(|delivery| async move {
            let target = self.target(&delivery.handler);
            if let Some(detail) = delivery.unreadable {
                // A row another program wrote, which no call would read either: dead-lettered
                // alone, the rest of the batch handled.
                tracing::error!(message_id = %delivery.envelope.id, %detail, "stored message cannot be read; dead-lettered");
                let verdict = self.engine.reject(
                    target,
                    &delivery.envelope,
                    crate::reason::Reason::MESSAGE_UNREADABLE,
                    detail,
                    0,
                );
                return (delivery.id, verdict);
            }
            let envelope = Arc::new(delivery.envelope);
            let verdict = self
                .engine
                .deliver(target, &envelope, cancel, interrupt, publisher)
                .await;
            (delivery.id, verdict)
        }))
        .await;

        let acks: Vec<DeliveryId> = verdicts
            .iter()
            .filter(|(_, verdict)| *verdict == Verdict::Ack)
            .map(|(id, _)| *id)
            .collect();
        if !acks.is_empty() {
            *owed = Some(Acks { token, ids: acks });
        }
        let deliveries = self.store.deliveries();
        let world = ClaimedRows {
            claims: deliveries,
            token,
            lease: self.lease,
            store_timeout: self.store_timeout,
        };
        for (id, verdict) in verdicts {
            if world.settle(id, verdict).await? == Row::Lost {
                tracing::warn!("a delivery's lease ended before it was settled: it will run again");
            }
        }
        Ok(count)
    }

    /// Where a delivery for `handler` goes.
    fn target<'a>(&'a self, handler: &'a str) -> Target<'a> {
        match self.handlers.get(handler) {
            Some(slot) => Target::Slot(slot),
            None if handler == NO_HANDLER => Target::NoHandlerForType(None),
            None => Target::NoSuchHandler(handler),
        }
    }
}

/// Says when fewer acks landed than were written.
fn warn_unless_all_acked(landed: u64, expected: usize) {
    if landed != expected as u64 {
        tracing::warn!(
            acked = landed,
            expected,
            "some acked deliveries were no longer ours (their lease ended): they will run again"
        );
    }
}

/// Deliveries a pass acked, not yet deleted: the claim's token and the rows.
struct Acks {
    token: Uuid,
    ids: Vec<DeliveryId>,
}

/// What `ctx.publish` writes to in a worker: the store's outbox, in a transaction of its own,
/// waking the worker.
pub(crate) struct StorePublisher {
    store: Arc<dyn DeliveryStore>,
    wake: Arc<Notify>,
}

impl StorePublisher {
    pub(crate) fn new(store: Arc<dyn DeliveryStore>, wake: Arc<Notify>) -> StorePublisher {
        StorePublisher { store, wake }
    }
}

impl Publish for StorePublisher {
    fn publish_envelope(
        &self,
        envelope: crate::Envelope,
    ) -> futures_util::future::BoxFuture<'_, Result<Uuid, PublishError>> {
        Box::pin(async move {
            let id = envelope.id;
            self.store
                .publish(vec![envelope])
                .await
                .map_err(|error| PublishError::Store(error.to_string()))?;
            self.wake.notify_one();
            Ok(id)
        })
    }
}
