//! The runtime: takes published messages from the store, fans them out to every handler of
//! their type, applies timeouts, concurrency limits and the retry policy, records dead letters
//! and shuts down gracefully.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::{EnvSettings, IfSet, SchedulerSettings};
use crate::context::Context;
use crate::dead_letter::DeadLetter;
use crate::dispatch::{call_handler, Call};
use crate::envelope::Envelope;
use crate::error::{ConfigError, Error, KnobChecks};
use crate::handler::Handler;
use crate::memory::{InMemoryStore, Pending};
use crate::message::Message;
use crate::outbox::{OutboxWorker, OutboxWorkerBuilder};
use crate::outcome::HandlerOutcome;
use crate::publish::Publish;
use crate::reason::Reason;
use crate::registry::{HandlerInfo, HandlerOptions, RegisteredHandler, Registry, RegistryError};
use crate::retry::RetryPolicy;
use crate::schedule::{SchedulerBuilder, SchedulerWorker};

/// Runs every registered handler until `cancel` fires (or SIGTERM / Ctrl-C arrives), with the
/// configuration taken from the environment.
///
/// Messages come from the process's outbox store ([`default_store`](crate::store::default_store)):
/// an SQLite file unless `DATABASE_URL` names a PostgreSQL database. An [`OutboxWorker`]
/// delivers them to every handler, with the process defaults of `docs/configuration.md`
/// (batches of 100, polls every 500 ms when idle, woken at once by publishes).
///
/// With `AMQP_URL` set, the broker does the fan-out instead: an
/// [`OutboxRelay`](crate::rabbitmq::OutboxRelay) publishes the outbox to the exchange (a row is
/// deleted once the broker confirmed it), and a [`RabbitMqWorker`](crate::rabbitmq::RabbitMqWorker)
/// consumes every handler's queue; both are restarted after a lost connection
/// (`docs/rabbitmq.md`).
///
/// Returns `Ok(())` after a cancellation, once the handlers running have finished (up to the
/// shutdown grace, 8 s), and only then; an invalid configuration, an unreachable database or
/// two handlers with the same name are an error before anything starts.
///
/// ```no_run
/// use hexeract::CancellationToken;
///
/// #[tokio::main]
/// async fn main() -> Result<(), hexeract::Error> {
///     hexeract::run(CancellationToken::new()).await
/// }
/// ```
pub async fn run(cancel: CancellationToken) -> Result<(), Error> {
    let settings = EnvSettings::from_env()?;
    let store = crate::store::default_schedule_store().await?;
    // Served on WORKER_PORT; its changes (ready, not ready and why) are logged too.
    let health = crate::health::Health::new();
    // Not ready until every loop has added its component: served before they exist, an empty
    // list would read as ready.
    let startup = health.probe("startup");
    let stop = cancel.child_token();
    let listener = bind_worker_port(settings.worker_port).await?;
    let http = tokio::spawn(crate::health::serve(
        listener,
        health.clone(),
        Some(store.clone()),
        stop.clone(),
    ));
    warn_about_unowned(&*store).await;
    let hygiene = tokio::spawn(retention(
        store.clone(),
        settings.inbox_retention,
        settings.dead_letter_retention,
        stop.clone(),
    ));
    let result = run_loops(&settings, store, &health, startup, &stop).await;
    stop.cancel();
    let _ = hygiene.await;
    // A client holding a connection open would keep the server's graceful shutdown waiting.
    let mut http = http;
    match tokio::time::timeout(Duration::from_secs(2), &mut http).await {
        Ok(Ok(Err(error))) => tracing::warn!(%error, "the health endpoint stopped with an error"),
        Ok(_) => {}
        Err(_) => http.abort(),
    }
    result
}

/// Pending deliveries no registered handler owns: `(handler, count)`; `""` stands for message
/// types no handler knew.
pub(crate) async fn unowned_deliveries(
    store: &dyn crate::store::DeliveryStore,
) -> Result<Vec<(String, u64)>, Error> {
    let registry = Registry::from_inventory()?;
    Ok(store
        .pending_by_handler()
        .await?
        .into_iter()
        .filter(|(handler, _)| registry.get(handler).is_none())
        .collect())
}

/// Says at startup which pending deliveries nobody will handle (a handler renamed or removed).
async fn warn_about_unowned(store: &dyn crate::store::DeliveryStore) {
    match unowned_deliveries(store).await {
        Ok(unowned) => {
            for (handler, count) in unowned {
                if handler.is_empty() {
                    tracing::warn!(count, "deliveries of message types no handler knows are waiting; they retry and then go to the dead letters");
                } else {
                    tracing::warn!(%handler, count, "deliveries for a handler this program does not have (renamed or removed?) are waiting; they retry and then go to the dead letters");
                }
            }
        }
        Err(error) => tracing::warn!(%error, "could not look for deliveries no handler owns"),
    }
}

/// Deletes expired inbox marks and dead letters: a minute after startup, then every hour.
async fn retention(
    store: Arc<dyn crate::store::ScheduleStore>,
    inbox: Option<Duration>,
    dead_letters: Option<Duration>,
    stop: CancellationToken,
) {
    let mut wait = Duration::from_secs(60);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        wait = Duration::from_secs(3_600);
        if let Some(age) = inbox {
            match store.purge_inbox_before(age).await {
                Ok(0) => {}
                Ok(purged) => tracing::info!(purged, ?age, "expired inbox marks deleted"),
                Err(error) => tracing::warn!(%error, "could not delete expired inbox marks"),
            }
        }
        if let Some(age) = dead_letters {
            match store.purge_dead_letters_before(age).await {
                Ok(0) => {}
                Ok(purged) => tracing::info!(purged, ?age, "expired dead letters deleted"),
                Err(error) => tracing::warn!(%error, "could not delete expired dead letters"),
            }
        }
    }
}

/// Binds the health and metrics endpoints, or says which variable to change.
async fn bind_worker_port(port: u16) -> Result<tokio::net::TcpListener, Error> {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .map_err(|error| {
            Error::Config(crate::error::ConfigError {
                problems: vec![crate::error::ConfigProblem {
                    setting: "WORKER_PORT".to_owned(),
                    value: port.to_string(),
                    expected: format!(
                        "a port this process can listen on for /health and /metrics ({error})"
                    ),
                }],
            })
        })?;
    if let Ok(address) = listener.local_addr() {
        tracing::info!(%address, "health and metrics on http://{address}/health/ready and /metrics");
    }
    Ok(listener)
}

/// Every loop of `run`: the scheduler, and the outbox worker or the relay and bus worker.
async fn run_loops(
    settings: &EnvSettings,
    store: Arc<dyn crate::store::ScheduleStore>,
    health: &crate::health::Health,
    startup: crate::health::Probe,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let stop = stop.clone();
    // Scheduled jobs and delayed messages, beside whatever delivers the messages.
    let scheduler = configure_scheduler(
        SchedulerWorker::builder_shared(store.clone()).from_inventory(),
        settings,
    )
    .health(health.probe("scheduler"))
    .build()?;
    let store: Arc<dyn crate::store::DeliveryStore> = store;
    #[cfg(feature = "rabbitmq")]
    if let Some(amqp) = &settings.amqp {
        tokio::spawn(stop_on_signal(stop.clone()));
        let broker = crate::rabbitmq::supervisor::BrokerSettings {
            url: amqp.url.clone(),
            exchange: amqp.exchange.clone(),
            prefix: amqp.queue_prefix.clone(),
        };
        let delivering = crate::rabbitmq::supervisor::run_on_broker(
            broker,
            settings,
            store,
            health,
            startup,
            stop.clone(),
        );
        let (delivered, scheduled) = tokio::join!(
            stop_all_on_error(delivering, &stop),
            scheduler.run(stop.clone()),
        );
        return delivered.and(scheduled);
    }
    #[cfg(feature = "kafka")]
    if let Some(kafka) = &settings.kafka {
        tokio::spawn(stop_on_signal(stop.clone()));
        let delivering = crate::kafka::supervisor::run_on_kafka(
            kafka,
            settings,
            store,
            health,
            startup,
            stop.clone(),
        );
        let (delivered, scheduled) = tokio::join!(
            stop_all_on_error(delivering, &stop),
            scheduler.run(stop.clone()),
        );
        return delivered.and(scheduled);
    }
    #[cfg(not(feature = "kafka"))]
    if settings.kafka.is_some() {
        return Err(Error::Unsupported(
            "KAFKA_BROKERS is set, but this build of hexeract lacks its `kafka` feature (it is \
             not among the default features: add `features = [\"kafka\"]` to the dependency)"
                .to_owned(),
        ));
    }
    #[cfg(not(feature = "rabbitmq"))]
    if settings.amqp.is_some() {
        return Err(Error::Unsupported(
            "AMQP_URL is set, but this build of hexeract lacks its `rabbitmq` feature".to_owned(),
        ));
    }
    let worker = configure_outbox_worker(
        OutboxWorker::builder_shared(store).from_registry(),
        settings,
    )
    .health(health.probe("outbox worker"))
    .build()?;
    startup.pass();
    tokio::spawn(stop_on_signal(stop.clone()));
    let (delivered, scheduled) = tokio::join!(
        stop_all_on_error(worker.run(stop.clone()), &stop),
        scheduler.run(stop.clone())
    );
    delivered.and(scheduled)
}

/// The scheduler's knobs under `hexeract::run`: every variable that is set; the others keep
/// the builder's defaults.
fn configure_scheduler(builder: SchedulerBuilder, settings: &EnvSettings) -> SchedulerBuilder {
    // Every field named: a knob added to the settings does not compile until it is named here,
    // and warns as unused until it is applied.
    let SchedulerSettings {
        poll_interval,
        batch_size,
        min_cycle_delay,
        dispatch_timeout,
        lease,
    } = settings.scheduler;
    // `configure` takes MAX_DELIVERIES and RETRY_MAX_DELAY_MS.
    builder
        .configure(settings)
        .if_set(poll_interval, SchedulerBuilder::poll_interval)
        .if_set(batch_size, SchedulerBuilder::batch_size)
        .if_set(min_cycle_delay, SchedulerBuilder::min_cycle_delay)
        .if_set(dispatch_timeout, SchedulerBuilder::dispatch_timeout)
        .lease(lease.unwrap_or_else(|| run_scheduler_lease(dispatch_timeout)))
        .if_set(settings.shutdown_grace, SchedulerBuilder::shutdown_grace)
}

/// The scheduler's lease under `hexeract::run` when `SCHEDULER_LEASE_MS` is unset: the dispatch
/// timeout and 5 s of room for the settle after a timeout (35 s with the defaults), so that a
/// run that takes its whole timeout still holds its claim.
fn run_scheduler_lease(dispatch_timeout: Option<std::time::Duration>) -> std::time::Duration {
    // The builder's default dispatch timeout (the seed's 30 s).
    dispatch_timeout.unwrap_or(std::time::Duration::from_secs(30))
        + std::time::Duration::from_secs(5)
}

/// The outbox worker's knobs under `hexeract::run`: `configure` (batch size and poll interval
/// with `run`'s own defaults, deliveries, retries, timeout, grace), then the lease and the
/// payload limit where set.
fn configure_outbox_worker(
    builder: OutboxWorkerBuilder,
    settings: &EnvSettings,
) -> OutboxWorkerBuilder {
    builder
        .configure(settings)
        .if_set(settings.delivery_lease, OutboxWorkerBuilder::lease)
        .if_set(
            settings.max_payload_bytes,
            OutboxWorkerBuilder::max_payload_bytes,
        )
}

/// Runs `part` of the process; if it fails, stops the other parts too.
async fn stop_all_on_error(
    part: impl std::future::Future<Output = Result<(), Error>>,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let result = part.await;
    if result.is_err() {
        stop.cancel();
    }
    result
}

/// A handler registered in code, applied to the registry at `build()`.
pub(crate) type Registration = Box<dyn FnOnce(&mut Registry) -> Result<(), RegistryError> + Send>;
type Filter = Box<dyn Fn(&HandlerInfo) -> bool + Send>;

/// Builds a [`Runtime`] with explicit settings; [`hexeract::run`](crate::run) is this with the
/// environment's settings.
///
/// ```
/// use std::time::Duration;
/// use hexeract::{InMemoryStore, Runtime};
///
/// let runtime = Runtime::builder()
///     .store(InMemoryStore::new())
///     .max_deliveries(3)
///     .retry_delays(Duration::from_millis(10), Duration::from_millis(100))
///     .handler_timeout(Duration::from_secs(5))
///     .build()?;
/// # Ok::<(), hexeract::Error>(())
/// ```
#[must_use]
pub struct RuntimeBuilder {
    registry: Option<Registry>,
    registrations: Vec<Registration>,
    filter: Option<Filter>,
    store: Option<InMemoryStore>,
    retry: RetryPolicy,
    max_deliveries: u32,
    handler_timeout: Duration,
    concurrency: u32,
    shutdown_grace: Duration,
    max_payload_bytes: usize,
    handle_signals: bool,
}

impl Default for RuntimeBuilder {
    fn default() -> RuntimeBuilder {
        RuntimeBuilder {
            registry: None,
            registrations: Vec::new(),
            filter: None,
            store: None,
            retry: RetryPolicy::default(),
            max_deliveries: 5,
            handler_timeout: Duration::from_secs(30),
            concurrency: 16,
            shutdown_grace: Duration::from_secs(8),
            max_payload_bytes: 1024 * 1024,
            handle_signals: false,
        }
    }
}

impl RuntimeBuilder {
    /// Applies `MAX_DELIVERIES`, `RETRY_MAX_DELAY_MS`, `HANDLER_TIMEOUT_MS`,
    /// `SHUTDOWN_GRACE_MS` and `MAX_PAYLOAD_BYTES` from the environment where set.
    pub fn configure_from_env(self) -> Result<RuntimeBuilder, ConfigError> {
        self.configure_from(|name| std::env::var(name).ok())
    }

    /// Like [`configure_from_env`](RuntimeBuilder::configure_from_env), reading variables through
    /// `lookup`.
    pub fn configure_from(
        mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<RuntimeBuilder, ConfigError> {
        let settings = EnvSettings::from_lookup(lookup)?;
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
        if let Some(max) = settings.max_payload_bytes {
            self.max_payload_bytes = max;
        }
        Ok(self)
    }

    /// Uses these handlers instead of every `#[handler]` in the program.
    pub fn registry(mut self, registry: Registry) -> RuntimeBuilder {
        self.registry = Some(registry);
        self
    }

    /// Keeps only the handlers `keep` accepts.
    pub fn handlers_where(
        mut self,
        keep: impl Fn(&HandlerInfo) -> bool + Send + 'static,
    ) -> RuntimeBuilder {
        self.filter = Some(Box::new(keep));
        self
    }

    /// Adds a handler written as a type; its name is the type's name.
    pub fn register_handler<M: Message, H: Handler<M>>(self, handler: H) -> RuntimeBuilder {
        self.register_handler_with::<M, H>(handler, HandlerOptions::new())
    }

    /// Adds a handler written as a type, with its name, timeout or concurrency.
    pub fn register_handler_with<M: Message, H: Handler<M>>(
        mut self,
        handler: H,
        options: HandlerOptions,
    ) -> RuntimeBuilder {
        self.registrations.push(Box::new(move |registry| {
            registry.register::<M, H>(handler, options)
        }));
        self
    }

    /// Where messages wait and dead letters are kept (default: [`InMemoryStore::global`]).
    pub fn store(mut self, store: InMemoryStore) -> RuntimeBuilder {
        self.store = Some(store);
        self
    }

    /// Handler calls per message in total, the first included (default 5). Must be at least 1.
    pub fn max_deliveries(mut self, max_deliveries: u32) -> RuntimeBuilder {
        self.max_deliveries = max_deliveries;
        self
    }

    /// First and longest delay between calls (default 1 s and 300 s).
    pub fn retry_delays(mut self, initial: Duration, max: Duration) -> RuntimeBuilder {
        self.retry = self.retry.initial_delay(initial).max_delay(max);
        self
    }

    /// The whole retry policy; its `max_deliveries` is replaced by
    /// [`max_deliveries`](RuntimeBuilder::max_deliveries).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> RuntimeBuilder {
        self.max_deliveries = policy.max_deliveries_value();
        self.retry = policy;
        self
    }

    /// Timeout of a handler call, unless the handler sets its own (default 30 s).
    pub fn handler_timeout(mut self, timeout: Duration) -> RuntimeBuilder {
        self.handler_timeout = timeout;
        self
    }

    /// Messages one handler may process at once, unless it sets its own (default 16).
    pub fn concurrency(mut self, limit: u32) -> RuntimeBuilder {
        self.concurrency = limit;
        self
    }

    /// How long shutdown waits for running handlers (default 8 s). Handlers still running
    /// then are interrupted, and their messages are put back in the store.
    pub fn shutdown_grace(mut self, grace: Duration) -> RuntimeBuilder {
        self.shutdown_grace = grace;
        self
    }

    /// Largest payload handled (default 1 MiB); larger messages are dead-lettered as
    /// `payload_too_large` without being decoded.
    pub fn max_payload_bytes(mut self, max: usize) -> RuntimeBuilder {
        self.max_payload_bytes = max;
        self
    }

    /// Also stop on SIGTERM and Ctrl-C (default off; on in [`hexeract::run`](crate::run)).
    pub fn handle_signals(mut self, handle: bool) -> RuntimeBuilder {
        self.handle_signals = handle;
        self
    }

    /// Checks the settings and registers the handlers.
    pub fn build(self) -> Result<Runtime, Error> {
        KnobChecks::default()
            .at_least_one("max_deliveries", self.max_deliveries.into())
            .not_zero("handler_timeout", self.handler_timeout)
            .at_least_one("concurrency", self.concurrency.into())
            .at_least_one("max_payload_bytes", self.max_payload_bytes as u64)
            .finish()?;

        let mut registry = match self.registry {
            Some(registry) => registry,
            None => Registry::from_inventory()?,
        };
        if let Some(keep) = &self.filter {
            registry.retain(|info| keep(info));
        }
        let mut duplicates = Vec::new();
        for registration in self.registrations {
            match registration(&mut registry) {
                Ok(()) => {}
                Err(RegistryError::DuplicateNames(found)) => duplicates.extend(found),
                Err(other) => return Err(other.into()),
            }
        }
        if !duplicates.is_empty() {
            return Err(RegistryError::DuplicateNames(duplicates).into());
        }

        let store = self
            .store
            .unwrap_or_else(|| InMemoryStore::global().clone());
        let default_concurrency = NonZeroU32::new(self.concurrency).expect("checked above");
        let slots = registry
            .handlers()
            .filter_map(|info| registry.get(&info.name))
            .map(|handler| {
                let info = handler.info();
                let slot = Slot {
                    handler: handler.clone(),
                    name: Arc::from(info.name.as_ref()),
                    permits: Arc::new(Semaphore::new(
                        info.concurrency.unwrap_or(default_concurrency).get() as usize,
                    )),
                    timeout: info.timeout.unwrap_or(self.handler_timeout),
                    counters: Counters::default(),
                };
                (info.name.to_string(), Arc::new(slot))
            })
            .collect();
        Ok(Runtime {
            shared: Arc::new(Shared {
                publisher: Arc::new(store.clone()),
                store,
                registry,
                slots,
                retry: self
                    .retry
                    .max_deliveries(NonZeroU32::new(self.max_deliveries).expect("checked above")),
                shutdown_grace: self.shutdown_grace,
                max_payload_bytes: self.max_payload_bytes,
                handle_signals: self.handle_signals,
            }),
        })
    }
}

impl fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("max_deliveries", &self.max_deliveries)
            .field("retry", &self.retry)
            .field("handler_timeout", &self.handler_timeout)
            .field("concurrency", &self.concurrency)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .finish_non_exhaustive()
    }
}

/// A configured runtime; [`Runtime::run`] runs it. Clones share everything.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

struct Shared {
    store: InMemoryStore,
    publisher: Arc<dyn Publish>,
    registry: Registry,
    slots: HashMap<String, Arc<Slot>>,
    retry: RetryPolicy,
    shutdown_grace: Duration,
    max_payload_bytes: usize,
    handle_signals: bool,
}

/// One handler as the runtime runs it: its concurrency permits, timeout and counters.
struct Slot {
    handler: Arc<RegisteredHandler>,
    name: Arc<str>,
    permits: Arc<Semaphore>,
    timeout: Duration,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    handled: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
}

/// What one handler did since the runtime was built.
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

impl Runtime {
    /// A builder with the library defaults.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
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
        let mut stats: Vec<HandlerStats> = self
            .shared
            .slots
            .values()
            .map(|slot| HandlerStats {
                name: slot.name.to_string(),
                message_type: slot.handler.info().message_type,
                handled: slot.counters.handled.load(Ordering::Relaxed),
                retried: slot.counters.retried.load(Ordering::Relaxed),
                dead_lettered: slot.counters.dead_lettered.load(Ordering::Relaxed),
            })
            .collect();
        stats.sort_by(|a, b| a.name.cmp(&b.name));
        stats
    }

    /// Runs until `cancel` fires, then lets running handlers finish (up to the shutdown grace)
    /// and returns `Ok(())`. Messages not started, or waiting for a retry, stay in the store.
    ///
    /// One runtime runs on a store at a time (it fans messages out to its own handlers): a
    /// second `run` on the same store returns [`Error::StoreBusy`].
    pub async fn run(self, cancel: CancellationToken) -> Result<(), Error> {
        let _consumer = self.shared.store.claim_consumer().ok_or(Error::StoreBusy)?;
        let stop = cancel.child_token();
        if self.shared.handle_signals {
            tokio::spawn(stop_on_signal(stop.clone()));
        }
        let abort = CancellationToken::new();
        let tracker = TaskTracker::new();
        tracing::info!(
            handlers = self.shared.registry.len(),
            "hexeract runtime started (in-process store)"
        );
        for info in self.shared.registry.handlers() {
            tracing::debug!(handler = %info.name, message_type = info.message_type, "handler registered");
        }
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                pending = self.shared.store.next() => {
                    self.shared.accept(pending, &tracker, &stop, &abort);
                }
            }
            // A backlog is always ready: let the spawned handlers run on a single-threaded
            // executor too.
            tokio::task::consume_budget().await;
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
            abort.cancel();
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

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("handlers", &self.shared.registry)
            .field("retry", &self.shared.retry)
            .field("store", &self.shared.store)
            .finish_non_exhaustive()
    }
}

/// Where a delivery goes.
enum Target {
    /// A handler this runtime runs.
    Handler(Arc<Slot>),
    /// No handler to call: none knows the message type, or the handler the message is meant
    /// for (a put-back retry, a replayed dead letter) is not registered here.
    Missing { handler: Option<String> },
}

impl Target {
    fn slot(&self) -> Option<&Arc<Slot>> {
        match self {
            Target::Handler(slot) => Some(slot),
            Target::Missing { .. } => None,
        }
    }

    fn handler_name(&self) -> Option<&str> {
        match self {
            Target::Handler(slot) => Some(&slot.name),
            Target::Missing { handler } => handler.as_deref(),
        }
    }
}

impl Shared {
    fn accept(
        self: &Arc<Self>,
        pending: Pending,
        tracker: &TaskTracker,
        stop: &CancellationToken,
        abort: &CancellationToken,
    ) {
        let Pending { envelope, handler } = pending;
        if envelope.payload.len() > self.max_payload_bytes {
            let detail = format!(
                "payload is {} bytes, more than max_payload_bytes ({}); it was not decoded",
                envelope.payload.len(),
                self.max_payload_bytes
            );
            let target = match handler {
                Some(name) => self.named_target(name),
                None => Target::Missing { handler: None },
            };
            self.dead_letter(envelope, &target, Reason::PAYLOAD_TOO_LARGE, &detail);
            return;
        }
        let targets: Vec<Target> = match handler {
            Some(name) => vec![self.named_target(name)],
            None => {
                let handlers = self.registry.handlers_for(&envelope.message_type);
                if handlers.is_empty() {
                    vec![Target::Missing { handler: None }]
                } else {
                    handlers
                        .iter()
                        .map(|handler| self.named_target(handler.info().name.to_string()))
                        .collect()
                }
            }
        };
        self.store.fan_out(targets.len());
        for target in targets {
            let shared = self.clone();
            let envelope = envelope.clone();
            let (stop, abort) = (stop.clone(), abort.clone());
            tracker.spawn(async move { shared.deliver(envelope, target, stop, abort).await });
        }
    }

    fn named_target(&self, name: String) -> Target {
        match self.slots.get(&name) {
            Some(slot) => Target::Handler(slot.clone()),
            None => Target::Missing {
                handler: Some(name),
            },
        }
    }

    /// Calls the target handler until the message is acked or dead-lettered, or the runtime
    /// stops (then the message goes back to the store with the attempts it used).
    async fn deliver(
        self: Arc<Self>,
        mut envelope: Envelope,
        target: Target,
        stop: CancellationToken,
        abort: CancellationToken,
    ) {
        loop {
            let permit = match &target {
                Target::Handler(slot) => match acquire(slot, &stop).await {
                    Some(permit) => Some(permit),
                    None => return self.put_back(envelope, &target),
                },
                Target::Missing { .. } => None,
            };
            // Attempts are counted when a call starts, so a call that never finished (its
            // runtime was stopped past the grace) still uses one up.
            envelope.attempt += 1;
            if envelope.attempt > self.retry.max_deliveries_value() {
                envelope.attempt -= 1;
                let detail = "the last allowed call never finished: it was interrupted when a \
                              runtime stopped past its shutdown grace";
                return self.dead_letter(
                    envelope,
                    &target,
                    Reason::MAX_DELIVERIES_EXCEEDED,
                    detail,
                );
            }
            let outcome = match &target {
                Target::Handler(slot) => {
                    let ctx = Context::new(
                        envelope.clone(),
                        slot.name.clone(),
                        stop.child_token(),
                        self.publisher.clone(),
                    );
                    let span = tracing::info_span!(
                        "hexeract.handle",
                        message_id = %envelope.id,
                        message_type = %envelope.message_type,
                        handler = %slot.name,
                        attempt = envelope.attempt,
                        trace_id = envelope.trace_id().map(tracing::field::display),
                    );
                    let call = call_handler(slot.handler.clone(), ctx, slot.timeout, &abort);
                    match call.instrument(span).await {
                        Call::Finished(outcome) => outcome,
                        Call::Interrupted => return self.put_back(envelope, &target),
                    }
                }
                Target::Missing { handler: None } => HandlerOutcome::Retry {
                    reason: Reason::UNKNOWN_MESSAGE_TYPE,
                    detail: format!(
                        "no handler is registered for message type {:?}",
                        envelope.message_type
                    ),
                    after: None,
                },
                Target::Missing {
                    handler: Some(name),
                } => HandlerOutcome::Retry {
                    reason: Reason::UNKNOWN_MESSAGE_TYPE,
                    detail: format!(
                        "the message is meant for handler `{name}`, which is not registered \
                         (renamed or removed?)"
                    ),
                    after: None,
                },
            };
            drop(permit);

            match outcome {
                HandlerOutcome::Ack => {
                    if let Some(slot) = target.slot() {
                        slot.counters.handled.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(message_id = %envelope.id, handler = %slot.name, attempt = envelope.attempt, "handled");
                    }
                    self.store.settle();
                    return;
                }
                HandlerOutcome::DeadLetter { reason, detail } => {
                    return self.dead_letter(envelope, &target, reason, &detail);
                }
                HandlerOutcome::Retry {
                    reason,
                    detail,
                    after,
                } => {
                    if stop.is_cancelled() && target.slot().is_some() {
                        // The runtime is stopping, and a handler that watches
                        // `Context::cancellation` fails on purpose: that call does not count.
                        envelope.attempt -= 1;
                        return self.put_back(envelope, &target);
                    }
                    if self.retry.is_exhausted(envelope.attempt) {
                        return self.dead_letter(envelope, &target, reason, &detail);
                    }
                    let delay = self.retry.delay_after(envelope.attempt, after);
                    if let Some(slot) = target.slot() {
                        slot.counters.retried.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::warn!(
                        message_id = %envelope.id,
                        message_type = %envelope.message_type,
                        handler = target.handler_name(),
                        attempt = envelope.attempt,
                        max_deliveries = self.retry.max_deliveries_value(),
                        retry_in = ?delay,
                        detail,
                        "handler failed; will retry"
                    );
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => return self.put_back(envelope, &target),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    fn dead_letter(&self, envelope: Envelope, target: &Target, reason: Reason, detail: &str) {
        if let Some(slot) = target.slot() {
            slot.counters.dead_lettered.fetch_add(1, Ordering::Relaxed);
        }
        tracing::error!(
            message_id = %envelope.id,
            message_type = %envelope.message_type,
            handler = target.handler_name(),
            attempts = envelope.attempt,
            %reason,
            detail,
            "message dead-lettered"
        );
        let handler = target.handler_name().map(str::to_owned);
        self.store
            .record_dead_letter(DeadLetter::new(envelope, handler, reason, detail));
    }

    fn put_back(&self, envelope: Envelope, target: &Target) {
        self.store.requeue(Pending {
            envelope,
            handler: target.handler_name().map(str::to_owned),
        });
    }
}

/// A concurrency permit for `slot`, or `None` when the runtime stops first.
async fn acquire(slot: &Slot, stop: &CancellationToken) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        biased;
        () = stop.cancelled() => None,
        permit = slot.permits.clone().acquire_owned() => Some(permit.expect("the semaphore is never closed")),
    }
}

/// Cancels `stop` on SIGTERM or Ctrl-C; returns when `stop` is cancelled either way.
pub(crate) async fn stop_on_signal(stop: CancellationToken) {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    let interrupt = async {
        match tokio::signal::ctrl_c().await {
            Ok(()) => {}
            Err(error) => {
                tracing::warn!(%error, "cannot listen for Ctrl-C");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = stop.cancelled() => return,
        () = interrupt => tracing::info!("Ctrl-C received, shutting down"),
        () = terminate => tracing::info!("SIGTERM received, shutting down"),
    }
    stop.cancel();
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    fn settings(vars: &'static [(&'static str, &'static str)]) -> EnvSettings {
        EnvSettings::from_lookup(|name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        })
        .unwrap()
    }

    async fn store() -> Arc<crate::store::sqlite::SqliteStore> {
        Arc::new(
            crate::store::sqlite::SqliteStore::in_memory()
                .await
                .unwrap(),
        )
    }

    #[tokio::test]
    async fn the_scheduler_of_run_takes_its_variables() {
        let set = settings(&[
            ("SCHEDULER_POLL_INTERVAL_MS", "250"),
            ("SCHEDULER_BATCH_SIZE", "7"),
            ("SCHEDULER_DISPATCH_TIMEOUT_MS", "1234"),
            ("SCHEDULER_LEASE_MS", "4321"),
        ]);
        let scheduler = configure_scheduler(SchedulerWorker::builder_shared(store().await), &set);
        // The builder shows these four of its knobs.
        let shown = format!("{scheduler:?}");
        for knob in [
            "poll_interval: 250ms",
            "batch_size: 7",
            "lease: 4.321s",
            "dispatch_timeout: 1.234s",
        ] {
            assert!(shown.contains(knob), "{knob} not in {shown}");
        }
    }

    #[tokio::test]
    async fn unset_variables_leave_the_builders_defaults_under_run() {
        let unset = settings(&[]);
        let store = store().await;
        // All but the lease, which `run` gives 5 s of room above the dispatch timeout.
        assert_eq!(
            format!(
                "{:?}",
                configure_scheduler(SchedulerWorker::builder_shared(store.clone()), &unset)
            ),
            format!(
                "{:?}",
                SchedulerWorker::builder_shared(store.clone()).lease(Duration::from_secs(35))
            ),
        );
        let longer = settings(&[("SCHEDULER_DISPATCH_TIMEOUT_MS", "60000")]);
        let scheduler =
            configure_scheduler(SchedulerWorker::builder_shared(store.clone()), &longer);
        assert!(
            format!("{scheduler:?}").contains("lease: 65s"),
            "{scheduler:?}"
        );
        let worker = configure_outbox_worker(OutboxWorker::builder_shared(store), &unset);
        assert!(format!("{worker:?}").contains("lease: 30s"), "{worker:?}");
    }

    #[tokio::test]
    async fn the_outbox_worker_of_run_takes_the_delivery_lease() {
        let set = settings(&[("DELIVERY_LEASE_MS", "90000")]);
        let worker = configure_outbox_worker(OutboxWorker::builder_shared(store().await), &set);
        assert!(format!("{worker:?}").contains("lease: 90s"), "{worker:?}");
    }

    #[test]
    fn configure_from_reads_max_payload_bytes() {
        let builder = Runtime::builder()
            .configure_from(|name| (name == "MAX_PAYLOAD_BYTES").then(|| "2048".to_owned()))
            .unwrap();
        assert!(
            format!("{builder:?}").contains("max_payload_bytes: 2048"),
            "{builder:?}"
        );
    }
}
