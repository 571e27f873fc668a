//! [`OutboxWorker`]: the poll loop that expands outbox rows into deliveries, claims due
//! deliveries under a lease, calls their handlers outside any transaction and settles them.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use crate::config::EnvSettings;
use crate::context::Context;
use crate::dispatch::{call_handler, spawn_grace_timer, Call};
use crate::error::{Error, KnobChecks};
use crate::handler::Handler;
use crate::health::Probe;
use crate::message::Message;
use crate::metrics::{HandlerMetrics, Metrics};
use crate::outcome::HandlerOutcome;
use crate::publish::{Publish, PublishError};
use crate::reason::Reason;
use crate::registry::{HandlerOptions, RegisteredHandler, Registry};
use crate::retry::RetryPolicy;
use crate::runtime::Registration;
use crate::store::{Claimed, DeliveryStore, Routes, NO_HANDLER};

/// Builds an [`OutboxWorker`]. The defaults are the library's: `poll_interval` 100 ms,
/// `batch_size` 10, `lease` 30 s, 5 deliveries, handler timeout 30 s.
#[must_use]
pub struct OutboxWorkerBuilder {
    store: Arc<dyn DeliveryStore>,
    registry: Option<Registry>,
    registrations: Vec<Registration>,
    poll_interval: Duration,
    batch_size: u32,
    lease: Duration,
    retry: RetryPolicy,
    max_deliveries: u32,
    handler_timeout: Duration,
    store_timeout: Duration,
    shutdown_grace: Duration,
    max_payload_bytes: usize,
    wake: Option<Arc<Notify>>,
    polling_only: bool,
    health: Option<Probe>,
}

impl OutboxWorkerBuilder {
    /// A worker over `store`, with no handlers yet.
    pub fn new(store: impl DeliveryStore) -> OutboxWorkerBuilder {
        OutboxWorkerBuilder::shared(Arc::new(store))
    }

    /// A worker over a store shared with other parts of the program (such as
    /// [`default_store`](crate::store::default_store)), with no handlers yet.
    pub fn shared(store: Arc<dyn DeliveryStore>) -> OutboxWorkerBuilder {
        OutboxWorkerBuilder {
            store,
            registry: Some(Registry::new()),
            registrations: Vec::new(),
            poll_interval: Duration::from_millis(100),
            batch_size: 10,
            lease: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            max_deliveries: 5,
            handler_timeout: Duration::from_secs(30),
            store_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(8),
            max_payload_bytes: 1024 * 1024,
            wake: None,
            polling_only: false,
            health: None,
        }
    }

    /// Every `#[handler]` in the program (plus those registered with
    /// [`register_handler`](OutboxWorkerBuilder::register_handler)).
    pub fn from_registry(mut self) -> OutboxWorkerBuilder {
        self.registry = None;
        self
    }

    /// These handlers (plus those registered with `register_handler`).
    pub fn registry(mut self, registry: Registry) -> OutboxWorkerBuilder {
        self.registry = Some(registry);
        self
    }

    /// Adds a handler written as a type; its name is the type's path.
    pub fn register_handler<M: Message, H: Handler<M>>(self, handler: H) -> OutboxWorkerBuilder {
        self.register_handler_with::<M, H>(handler, HandlerOptions::new())
    }

    /// Adds a handler written as a type, with its name, timeout or concurrency.
    pub fn register_handler_with<M: Message, H: Handler<M>>(
        mut self,
        handler: H,
        options: HandlerOptions,
    ) -> OutboxWorkerBuilder {
        self.registrations.push(Box::new(move |registry| {
            registry.register::<M, H>(handler, options)
        }));
        self
    }

    /// How long to sleep after a poll that found nothing (default 100 ms). A publish in this
    /// process wakes the worker sooner.
    pub fn poll_interval(mut self, interval: Duration) -> OutboxWorkerBuilder {
        self.poll_interval = interval;
        self
    }

    /// Deliveries claimed per poll (default 10).
    pub fn batch_size(mut self, batch_size: u32) -> OutboxWorkerBuilder {
        self.batch_size = batch_size;
        self
    }

    /// How long one statement of the worker's own (expand, claim, settle) may take before the
    /// cycle gives up on it (default 30 s): the cycle fails, `/health/ready` says so, and the
    /// next one starts on another connection. PostgreSQL has no heartbeat: without this, a
    /// connection whose network path went silent mid-statement would hold the worker until the
    /// kernel gives up on the socket (many minutes, or never without keepalives). The
    /// connection given up on stays out of the pool until its socket fails.
    ///
    /// ```
    /// # fn example(store: hexeract::store::postgres::PgStore) {
    /// use std::time::Duration;
    /// use hexeract::outbox::OutboxWorker;
    ///
    /// let builder = OutboxWorker::builder(store).store_timeout(Duration::from_secs(5));
    /// # let _ = builder;
    /// # }
    /// ```
    pub fn store_timeout(mut self, timeout: Duration) -> OutboxWorkerBuilder {
        self.store_timeout = timeout;
        self
    }

    /// How long a claim lasts (default 30 s): a worker that dies holding deliveries releases
    /// them when it ends. Keep it above the handler timeout.
    pub fn lease(mut self, lease: Duration) -> OutboxWorkerBuilder {
        self.lease = lease;
        self
    }

    /// Handler calls per delivery in total (default 5).
    pub fn max_deliveries(mut self, max_deliveries: u32) -> OutboxWorkerBuilder {
        self.max_deliveries = max_deliveries;
        self
    }

    /// First and longest delay between calls (default 1 s and 300 s).
    pub fn retry_delays(mut self, initial: Duration, max: Duration) -> OutboxWorkerBuilder {
        self.retry = self.retry.initial_delay(initial).max_delay(max);
        self
    }

    /// Timeout of a handler call unless the handler sets its own (default 30 s).
    pub fn handler_timeout(mut self, timeout: Duration) -> OutboxWorkerBuilder {
        self.handler_timeout = timeout;
        self
    }

    /// How long a cancelled worker lets running handlers finish (default 8 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> OutboxWorkerBuilder {
        self.shutdown_grace = grace;
        self
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
        self.health = Some(probe);
        self
    }

    /// Largest payload handed to a handler (default 1 MiB); a larger message is dead-lettered
    /// as `payload_too_large` without being decoded.
    pub fn max_payload_bytes(mut self, max: usize) -> OutboxWorkerBuilder {
        self.max_payload_bytes = max;
        self
    }

    /// Wakes the worker from its poll sleep when notified, instead of the store's own signal
    /// ([`DeliveryStore::wakeups`]).
    pub fn wake_on(mut self, wake: Arc<Notify>) -> OutboxWorkerBuilder {
        self.wake = Some(wake);
        self
    }

    /// Polls only: ignore the store's wake-up signal (for measuring what it saves).
    pub fn polling_only(mut self) -> OutboxWorkerBuilder {
        self.polling_only = true;
        self
    }

    /// Applies the environment's settings (see `docs/configuration.md`): the process defaults
    /// of `hexeract::run`.
    pub(crate) fn configure(mut self, settings: &EnvSettings) -> OutboxWorkerBuilder {
        self.batch_size = settings.relay_batch_size.unwrap_or(100);
        self.poll_interval = settings
            .relay_poll_interval
            .unwrap_or(Duration::from_millis(500));
        if let Some(max) = settings.max_deliveries {
            self.max_deliveries = max.get();
        }
        if let Some(delay) = settings.retry_max_delay {
            self.retry = self.retry.max_delay(delay);
        }
        if let Some(timeout) = settings.handler_timeout {
            self.handler_timeout = timeout;
        }
        if let Some(grace) = settings.shutdown_grace {
            self.shutdown_grace = grace;
        }
        self
    }

    /// Checks the knobs and registers the handlers.
    pub fn build(self) -> Result<OutboxWorker, Error> {
        KnobChecks::default()
            .at_least_one("batch_size", self.batch_size.into())
            .not_zero("lease", self.lease)
            .at_least_one("max_deliveries", self.max_deliveries.into())
            .not_zero("handler_timeout", self.handler_timeout)
            .not_zero("store_timeout", self.store_timeout)
            .at_least_one("max_payload_bytes", self.max_payload_bytes as u64)
            .finish()?;
        let mut registry = match self.registry {
            Some(registry) => registry,
            None => Registry::from_inventory()?,
        };
        for registration in self.registrations {
            registration(&mut registry)?;
        }
        for info in registry.handlers() {
            let timeout = info.timeout.unwrap_or(self.handler_timeout);
            if timeout > self.lease {
                tracing::warn!(
                    handler = %info.name,
                    timeout = ?timeout,
                    lease = ?self.lease,
                    "the handler's timeout is longer than the lease: while a slow call still \
                     runs, another worker may claim the same delivery; raise the lease"
                );
            }
        }
        let handlers = registry
            .handlers()
            .filter_map(|info| registry.get(&info.name))
            .map(|handler| {
                let runner = Runner {
                    name: Arc::from(&*handler.info().name),
                    metrics: Metrics::global().handler(&handler.info().name),
                    permits: handler
                        .info()
                        .concurrency
                        .map(|limit| Arc::new(Semaphore::new(limit.get() as usize))),
                    handler: handler.clone(),
                };
                (handler.info().name.to_string(), runner)
            })
            .collect();
        Ok(OutboxWorker {
            routes: Routes::from_registry(&registry),
            handlers,
            store: self.store,
            poll_interval: self.poll_interval,
            batch_size: self.batch_size,
            lease: self.lease,
            retry: self
                .retry
                .max_deliveries(NonZeroU32::new(self.max_deliveries).expect("checked above")),
            handler_timeout: self.handler_timeout,
            store_timeout: self.store_timeout,
            shutdown_grace: self.shutdown_grace,
            max_payload_bytes: self.max_payload_bytes,
            wake: self.wake,
            polling_only: self.polling_only,
            health: self
                .health
                .unwrap_or_else(|| Probe::detached("outbox worker")),
        })
    }
}

impl fmt::Debug for OutboxWorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxWorkerBuilder")
            .field("poll_interval", &self.poll_interval)
            .field("batch_size", &self.batch_size)
            .field("lease", &self.lease)
            .field("max_deliveries", &self.max_deliveries)
            .finish_non_exhaustive()
    }
}

/// Delivers the outbox to handlers: expand, claim, call, settle, in a loop, until cancelled.
///
/// Several workers (tasks or processes) may share one store: claims skip each other's rows.
/// Each cycle's handlers run outside any transaction; the database is only touched by short
/// statements that are never interrupted, so cancellation waits for the end of the cycle.
pub struct OutboxWorker {
    store: Arc<dyn DeliveryStore>,
    routes: Routes,
    handlers: HashMap<String, Runner>,
    poll_interval: Duration,
    batch_size: u32,
    lease: Duration,
    retry: RetryPolicy,
    handler_timeout: Duration,
    store_timeout: Duration,
    shutdown_grace: Duration,
    max_payload_bytes: usize,
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

/// A handler as the worker calls it: with its own concurrency limit, when it has one
/// (`#[handler(concurrency = N)]`); otherwise a whole batch may run at once.
struct Runner {
    handler: Arc<RegisteredHandler>,
    /// The handler's name as contexts carry it, shared by every call.
    name: Arc<str>,
    permits: Option<Arc<Semaphore>>,
    metrics: Arc<HandlerMetrics>,
}

/// How one claimed delivery is to be settled.
enum Settlement {
    Ack(i64),
    Retry {
        id: i64,
        delay: Duration,
        detail: String,
    },
    DeadLetter {
        id: i64,
        reason: Reason,
        detail: String,
        /// Handler calls made.
        calls: u32,
    },
    /// Given up on at a shutdown past the grace: the call may still be running, so the
    /// delivery comes due again only after a lease, with the attempt counted. It is settled
    /// like a retry, not left claimed: this worker knows why it stopped, so the delivery is
    /// not suspected of crashing a process (which would make it run alone).
    Abandoned(i64),
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
    pub async fn run(self, cancel: CancellationToken) -> Result<(), Error> {
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
        while !cancel.is_cancelled() {
            let cycle = self.cycle(&cancel, &interrupt, &publisher).await;
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
        tracing::info!("outbox worker stopped");
        Ok(())
    }

    /// `call`, given up on after the store timeout.
    async fn timed<T>(
        &self,
        what: &'static str,
        call: impl std::future::Future<Output = Result<T, crate::store::StoreError>>,
    ) -> Result<T, crate::store::StoreError> {
        tokio::time::timeout(self.store_timeout, call)
            .await
            .map_err(|_| crate::store::StoreError::Timeout {
                what,
                after: self.store_timeout,
            })?
    }

    /// One expand-claim-call-settle pass; returns how many deliveries it handled.
    async fn cycle(
        &self,
        cancel: &CancellationToken,
        interrupt: &CancellationToken,
        publisher: &Arc<dyn Publish>,
    ) -> Result<usize, crate::store::StoreError> {
        self.timed("expand", self.store.expand(&self.routes, self.batch_size))
            .await?;
        let token = Uuid::now_v7();
        let mut claimed = self
            .timed(
                "claim",
                self.store.claim(token, self.batch_size, self.lease),
            )
            .await?;
        if let Some(suspect) = claimed.iter().position(|delivery| delivery.recovered) {
            // A claim of this batch was never settled: one of these messages may crash the
            // process. Run one suspect alone and give the rest back, so a crash costs no other
            // delivery an attempt.
            let suspect = claimed.swap_remove(suspect);
            let others: Vec<i64> = claimed.iter().map(|delivery| delivery.id).collect();
            self.timed("release", self.store.release(token, &others))
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
        let settlements = join_all(
            claimed
                .into_iter()
                .map(|delivery| self.handle(delivery, cancel, interrupt, publisher)),
        )
        .await;

        let acks: Vec<i64> = settlements
            .iter()
            .filter_map(|settlement| match settlement {
                Settlement::Ack(id) => Some(*id),
                _ => None,
            })
            .collect();
        let acked = self.timed("ack", self.store.ack(token, &acks)).await?;
        if acked != acks.len() as u64 {
            tracing::warn!(
                acked,
                expected = acks.len(),
                "some acked deliveries were no longer ours (their lease ended): they will run again"
            );
        }
        for settlement in settlements {
            let kept = match settlement {
                Settlement::Ack(_) => true,
                Settlement::Abandoned(id) => {
                    let detail = "the call was still running when the worker stopped \
                                  (shutdown grace exceeded)";
                    self.timed("retry", self.store.retry(token, id, self.lease, detail))
                        .await?
                }
                Settlement::Retry { id, delay, detail } => {
                    self.timed("retry", self.store.retry(token, id, delay, &detail))
                        .await?
                }
                Settlement::DeadLetter {
                    id,
                    reason,
                    detail,
                    calls,
                } => {
                    self.timed(
                        "dead letter",
                        self.store.dead_letter(token, id, &reason, &detail, calls),
                    )
                    .await?
                }
            };
            if !kept {
                tracing::warn!("a delivery's lease ended before it was settled: it will run again");
            }
        }
        Ok(count)
    }

    /// Calls the delivery's handler once and decides how to settle it; counts the outcome in
    /// the handler's metrics.
    async fn handle(
        &self,
        delivery: Claimed,
        cancel: &CancellationToken,
        interrupt: &CancellationToken,
        publisher: &Arc<dyn Publish>,
    ) -> Settlement {
        let mut took = None;
        let metrics = self
            .handlers
            .get(&delivery.handler)
            .map(|runner| runner.metrics.clone());
        let settlement = self
            .decide(delivery, cancel, interrupt, publisher, &mut took)
            .await;
        let metrics = metrics.unwrap_or_else(|| Metrics::global().handler(crate::metrics::UNKNOWN));
        match (&settlement, took) {
            (Settlement::Ack(_), Some(took)) => metrics.handled(took),
            (Settlement::Retry { .. }, Some(took)) => metrics.retried(took),
            (Settlement::Retry { .. }, None) => metrics.retried_without_call(),
            (Settlement::DeadLetter { .. }, took) => metrics.dead_lettered(took),
            _ => {}
        }
        settlement
    }

    async fn decide(
        &self,
        delivery: Claimed,
        cancel: &CancellationToken,
        interrupt: &CancellationToken,
        publisher: &Arc<dyn Publish>,
        took: &mut Option<Duration>,
    ) -> Settlement {
        let Claimed {
            id,
            handler,
            envelope,
            ..
        } = delivery;
        let max = self.retry.max_deliveries_value();
        if envelope.attempt > max {
            // Attempts are counted at claim: the previous claims never settled (a crash, or a
            // shutdown past its grace), and the budget is spent.
            return Settlement::DeadLetter {
                id,
                reason: Reason::MAX_DELIVERIES_EXCEEDED,
                detail: format!(
                    "the last {max} call(s) never finished: the worker died or was stopped during the call \
                     (a message that crashes the process?)"
                ),
                calls: max,
            };
        }
        if envelope.payload.len() > self.max_payload_bytes {
            let detail = format!(
                "payload is {} bytes, more than max_payload_bytes ({}); it was not decoded",
                envelope.payload.len(),
                self.max_payload_bytes
            );
            tracing::error!(message_id = %envelope.id, %handler, detail, "message dead-lettered");
            return Settlement::DeadLetter {
                id,
                reason: Reason::PAYLOAD_TOO_LARGE,
                detail,
                calls: envelope.attempt - 1,
            };
        }
        let outcome = match self.handlers.get(&handler) {
            Some(Runner {
                handler: registered,
                name,
                permits,
                ..
            }) => {
                let _permit = match permits {
                    Some(permits) => Some(permits.acquire().await.expect("never closed")),
                    None => None,
                };
                let info = registered.info();
                let ctx = Context::new(
                    envelope.clone(),
                    name.clone(),
                    cancel.child_token(),
                    publisher.clone(),
                );
                let span = tracing::info_span!(
                    "hexeract.handle",
                    message_id = %envelope.id,
                    message_type = %envelope.message_type,
                    handler = %handler,
                    attempt = envelope.attempt,
                    trace_id = envelope.trace_id().map(tracing::field::display),
                );
                let timeout = info.timeout.unwrap_or(self.handler_timeout);
                let started = std::time::Instant::now();
                let call = call_handler(registered.clone(), ctx, timeout, interrupt);
                let call = call.instrument(span).await;
                *took = Some(started.elapsed());
                match call {
                    Call::Finished(outcome) => outcome,
                    Call::Interrupted => return Settlement::Abandoned(id),
                }
            }
            None if handler == NO_HANDLER => HandlerOutcome::Retry {
                reason: Reason::UNKNOWN_MESSAGE_TYPE,
                detail: format!(
                    "no handler is registered for message type {:?}",
                    envelope.message_type
                ),
                after: None,
            },
            None => HandlerOutcome::Retry {
                reason: Reason::UNKNOWN_MESSAGE_TYPE,
                detail: format!(
                    "the delivery is for handler `{handler}`, which this worker does not have \
                     (renamed or removed?)"
                ),
                after: None,
            },
        };
        match outcome {
            HandlerOutcome::Ack => Settlement::Ack(id),
            HandlerOutcome::DeadLetter { reason, detail } => {
                tracing::error!(message_id = %envelope.id, %handler, %reason, detail, "message dead-lettered");
                Settlement::DeadLetter {
                    id,
                    reason,
                    detail,
                    calls: envelope.attempt,
                }
            }
            HandlerOutcome::Retry {
                reason,
                detail,
                after,
            } => {
                if self.retry.is_exhausted(envelope.attempt) {
                    tracing::error!(message_id = %envelope.id, %handler, %reason, detail, attempts = envelope.attempt, "message dead-lettered");
                    return Settlement::DeadLetter {
                        id,
                        reason,
                        detail,
                        calls: envelope.attempt,
                    };
                }
                let delay = self.retry.delay_after(envelope.attempt, after);
                tracing::warn!(message_id = %envelope.id, %handler, attempt = envelope.attempt, retry_in = ?delay, detail, "handler failed; will retry");
                Settlement::Retry { id, delay, detail }
            }
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
                .map_err(|error| PublishError::Store(error.to_string()))?;
            self.wake.notify_one();
            Ok(id)
        })
    }
}
