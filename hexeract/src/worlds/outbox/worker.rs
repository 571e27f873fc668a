//! [`OutboxWorker`]: the poll loop that takes a batch (due deliveries claimed under a lease, new
//! outbox rows expanded into deliveries already claimed), calls their handlers outside any
//! transaction and settles them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::delivery::{Engine, Policy, Slot};
use crate::health::Probe;
use crate::metrics::Metrics;
use crate::publish::{Publish, PublishError};
use crate::store::{
    by_token, warn_unless_all_acked, DeliveryId, DeliveryStore, Leased, LeasedFeed, Routes,
    StoreError, NO_HANDLER,
};
use crate::worker::feed::{Arrival, Pace, Pass, Refill, Refusal, Started, To, Worker};
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
        let handlers: Vec<Slot> = registry
            .handlers()
            .filter_map(|info| registry.get(&info.name))
            .map(|handler| handler_slot(&policy, handler, Metrics::global(), Some(&health)))
            .collect();
        let feed = OutboxFeed {
            routes: Routes::from_registry(&registry),
            store: source.store,
            lease,
            store_timeout: policy.store_timeout,
            wake: source.wake,
            polling_only: source.polling_only,
        };
        let engine = Engine::new(policy.retry, policy.max_payload_bytes, feed.store.kind());
        let pace = Pace {
            poll_interval: policy.poll_interval,
            busy_delay: Duration::ZERO,
            batch_size: policy.batch_size,
            shutdown_grace: policy.shutdown_grace,
            refill: Refill::WhenAllEnded,
        };
        Ok(OutboxWorker {
            worker: Worker::new(feed, handlers, engine, pace, health),
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
/// Handlers run outside any transaction, up to `batch_size` at once; each pass takes as many
/// deliveries as there is room for, and acks the calls that succeeded since the last pass in
/// the same statement. The database is only touched by short statements that are never
/// interrupted, so cancellation waits for the pass in progress.
pub struct OutboxWorker {
    worker: Worker<OutboxFeed>,
}

impl fmt::Debug for OutboxWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxWorker")
            .field("handlers", &self.worker.names())
            .field("batch_size", &self.worker.pace().batch_size)
            .field("lease", &self.worker.feed().lease)
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

    /// Runs until `cancel` fires, then lets the calls in flight end (handlers get the shutdown
    /// grace) and returns `Ok(())`. Store errors are logged and retried after `poll_interval`.
    ///
    /// Stopping has one hard deadline: the grace and 5 s to settle. A worker whose last writes
    /// cannot land by then (the database stopped answering) stops anyway; its claims run again
    /// once their lease ends.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), StoreError> {
        self.worker.run(cancel).await
    }
}

/// The outbox as a feed ([`LeasedFeed`]): each pass acks what succeeded and takes (expands
/// and claims) due deliveries under a fresh token, in one statement on PostgreSQL, one
/// transaction on SQLite ([`DeliveryStore::ack_and_take`]).
struct OutboxFeed {
    store: Arc<dyn DeliveryStore>,
    routes: Routes,
    lease: Duration,
    store_timeout: Duration,
    wake: Option<Arc<Notify>>,
    polling_only: bool,
}

impl LeasedFeed for OutboxFeed {
    type Id = DeliveryId;
    const NAME: &'static str = "outbox worker";

    async fn start(&self) -> Result<Started, StoreError> {
        let wake = match (&self.wake, self.polling_only) {
            (Some(wake), _) => wake.clone(),
            (None, true) => Arc::new(Notify::new()),
            (None, false) => crate::store::wake_signal(&*self.store).await,
        };
        Ok(Started {
            publisher: Arc::new(StorePublisher::new(self.store.clone(), wake.clone())),
            wake: Some(wake),
        })
    }

    async fn take(
        &self,
        acks: Vec<(Uuid, DeliveryId)>,
        room: u32,
    ) -> Result<Pass<(Uuid, DeliveryId)>, StoreError> {
        if room == 0 {
            self.rows().ack(acks).await?;
            return Ok(Pass::of(Vec::new()));
        }
        // The largest group of acks rides with the take; any other claim's are written first.
        let mut groups = by_token(acks).into_iter();
        let with_take = groups.next();
        let others: Vec<_> = groups
            .flat_map(|(token, ids)| ids.into_iter().map(move |id| (token, id)))
            .collect();
        if let Err(error) = self.rows().ack(others).await {
            // Those run again after their lease; the take goes on.
            tracing::warn!(%error, "could not ack a claim's deliveries; they run again when their lease ends");
        }
        let token = Uuid::now_v7();
        let claimed = match with_take {
            Some((acked, ids)) => {
                let both =
                    self.store
                        .ack_and_take((acked, &ids), &self.routes, token, room, self.lease);
                let (landed, claimed) = self.rows().within("ack and take", both).await?;
                warn_unless_all_acked(landed, ids.len());
                claimed
            }
            None => {
                let take = self.store.take(&self.routes, token, room, self.lease);
                self.rows().within("take", take).await?
            }
        };
        Ok(Pass::of(
            claimed
                .into_iter()
                .map(|delivery| Arrival {
                    claim: (token, delivery.id),
                    to: if delivery.handler == NO_HANDLER {
                        To::Nobody
                    } else {
                        To::Named(delivery.handler)
                    },
                    envelope: Arc::new(delivery.envelope),
                    recovered: delivery.recovered,
                    refused: delivery.unreadable.map(Refusal::unreadable),
                })
                .collect(),
        ))
    }

    fn rows(&self) -> Leased<'_, DeliveryId> {
        Leased {
            claims: self.store.deliveries(),
            lease: self.lease,
            store_timeout: self.store_timeout,
        }
    }
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
                .map_err(|error| PublishError::Store(error.into()))?;
            self.wake.notify_one();
            Ok(id)
        })
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[tokio::test]
    async fn a_store_refusal_is_the_publish_errors_source() {
        let store = crate::store::sqlite::SqliteStore::in_memory()
            .await
            .unwrap();
        store.pool().close().await;
        let publisher = StorePublisher::new(Arc::new(store), Arc::new(Notify::new()));
        let envelope = crate::Envelope::from_raw("test.Note", &b"{}"[..]);

        let error = publisher.publish_envelope(envelope).await.unwrap_err();

        assert!(matches!(error, PublishError::Store(_)), "{error:?}");
        let source = error.source().expect("the store's error is the source");
        let store_error = source
            .downcast_ref::<StoreError>()
            .expect("the source is the store's error");
        assert_eq!(
            error.to_string(),
            format!("the outbox could not take the message: {store_error}")
        );
    }
}
