//! The whole process an [`App`](crate::App) (and so [`run`](crate::run)) runs: the store,
//! the scheduler, the outbox worker or a broker's relay and consumers, health and metrics on
//! `WORKER_PORT`, retention and SIGTERM.

#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "rabbitmq")]
pub(crate) mod ownership;
#[cfg(feature = "rabbitmq")]
pub(crate) mod rabbitmq;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{AppConfig, IfSet, SchedulerConfig};
use crate::error::Error;
use crate::outbox::OutboxWorkerBuilder;
use crate::registry::Registry;
use crate::schedule::{SchedulerBuilder, SchedulerWorker};
use crate::signals::stop_on_signal;

/// What an [`App`](crate::App) runs: its handlers, built with their state and middleware,
/// and what its scheduler's jobs take.
pub(crate) struct Application {
    pub(crate) registry: Registry,
    pub(crate) states: crate::state::States,
    pub(crate) job_middleware: crate::middleware::Middlewares,
    pub(crate) endpoints: Endpoints,
}

/// The health, readiness and metrics of one worker: what its router reads, and whether the
/// worker serves them on a listener of its own.
#[derive(Clone)]
pub(crate) struct Endpoints {
    pub(crate) health: crate::health::Health,
    pub(crate) store: crate::health::server::StoreSlot,
    pub(crate) listen: bool,
}

impl Endpoints {
    pub(crate) fn new() -> Endpoints {
        let health = crate::health::Health::new();
        // Not ready until the worker runs and every loop has added its component: with no
        // component at all, readiness would read as ready.
        let _ = health.probe("startup");
        Endpoints {
            health,
            store: Default::default(),
            listen: true,
        }
    }
}

/// What [`App::try_run`](crate::App::try_run) runs, once its settings and handlers are
/// checked.
pub(crate) async fn start(
    settings: AppConfig,
    application: Application,
    cancel: CancellationToken,
) -> Result<(), Error> {
    for (variable, (url, why)) in settings.insecure_connections() {
        tracing::warn!(
            variable,
            url = %crate::redact::redact_url(url),
            "{why}: accepted because HEXERACT_ALLOW_INSECURE_CONNECTIONS=1"
        );
    }
    let store = crate::store::process::store_for(&settings.database).await?;
    // Served on WORKER_PORT, or by the application's router; its changes (ready, not ready
    // and why) are logged too.
    let endpoints = application.endpoints.clone();
    let health = endpoints.health.clone();
    // One sampler for the scrapes and the timer below: they share its samples and its pool.
    let gauges = endpoints
        .store
        .get_or_init(|| Arc::new(crate::store::StoreGauges::new(store.clone())))
        .clone();
    // Not ready until every loop has added its component: served before they exist, an empty
    // list would read as ready.
    let startup = health.probe("startup");
    let stop = cancel.child_token();
    let http = if endpoints.listen {
        let listener = bind_worker_port(settings.worker_addr, settings.worker_port).await?;
        let app = crate::health::server::routes(health.clone(), endpoints.store.clone());
        let stopped = stop.clone();
        Some(tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await
        }))
    } else {
        None
    };
    warn_about_unowned(&*store, &application.registry).await;
    let hygiene = tokio::spawn(retention(
        store.clone(),
        settings.inbox_retention,
        settings.dead_letter_retention,
        stop.clone(),
    ));
    crate::metrics::owing_nothing(application.registry.handlers().map(|info| &*info.name));
    let gauges = tokio::spawn(sample_gauges(health.clone(), gauges, stop.clone()));
    let result = run_loops(&settings, &application, store, &health, startup, &stop).await;
    stop.cancel();
    let _ = hygiene.await;
    let _ = gauges.await;
    // A client holding a connection open would keep the server's graceful shutdown waiting.
    if let Some(mut http) = http {
        match tokio::time::timeout(Duration::from_secs(2), &mut http).await {
            Ok(Ok(Err(error))) => {
                tracing::warn!(%error, "the health endpoint stopped with an error");
            }
            Ok(_) => {}
            Err(_) => http.abort(),
        }
    }
    result
}

/// Pending deliveries no registered handler owns: `(handler, count)`; `""` stands for message
/// types no handler knew.
pub(crate) async fn unowned_deliveries(
    store: &dyn crate::store::Housekeeping,
    registry: &Registry,
) -> Result<Vec<(String, u64)>, Error> {
    Ok(store
        .pending_by_handler()
        .await?
        .into_iter()
        .filter(|pending| registry.get(&pending.handler).is_none())
        .map(|pending| (pending.handler, pending.count))
        .collect())
}

/// Says at startup which pending deliveries nobody will handle (a handler renamed or removed).
async fn warn_about_unowned(store: &dyn crate::store::Housekeeping, registry: &Registry) {
    match unowned_deliveries(store, registry).await {
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

/// Sets the gauges of [`metrics`](crate::metrics) every 10 s, so a recorder that pushes (OTLP,
/// StatsD) sees them move without a scrape.
async fn sample_gauges(
    health: crate::health::Health,
    store: Arc<crate::store::StoreGauges>,
    stop: CancellationToken,
) {
    loop {
        crate::metrics::sample_health(&health);
        // A sample is reads only: stopping drops one in flight rather than waiting for it.
        tokio::select! {
            () = stop.cancelled() => return,
            () = store.sample() => {}
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
}

/// Deletes expired inbox marks and dead letters: a minute after startup, then every hour.
/// Stopping does not wait for a purge: each is one `DELETE` outside any transaction, so one
/// dropped in flight either lands or deletes nothing, and the next start purges again.
async fn retention(
    store: Arc<dyn crate::store::Store>,
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
        tokio::select! {
            () = stop.cancelled() => return,
            () = purge_expired(&*store, inbox, dead_letters) => {}
        }
    }
}

/// One retention pass: the inbox marks older than `inbox`, then the dead letters older than
/// `dead_letters` (each when set).
async fn purge_expired(
    store: &dyn crate::store::Store,
    inbox: Option<Duration>,
    dead_letters: Option<Duration>,
) {
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

/// Binds the health and metrics endpoints, or says which variable to change.
async fn bind_worker_port(
    address: std::net::IpAddr,
    port: u16,
) -> Result<tokio::net::TcpListener, Error> {
    let listener = tokio::net::TcpListener::bind((address, port))
        .await
        .map_err(|error| {
            Error::Config(crate::error::ConfigError {
                problems: vec![crate::error::ConfigProblem {
                    setting: "WORKER_ADDR and WORKER_PORT".to_owned(),
                    value: std::net::SocketAddr::new(address, port).to_string(),
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
    settings: &AppConfig,
    application: &Application,
    store: Arc<dyn crate::store::Store>,
    health: &crate::health::Health,
    startup: crate::health::Probe,
    stop: &CancellationToken,
) -> Result<(), Error> {
    let stop = stop.clone();
    // Scheduled jobs and delayed messages, beside whatever delivers the messages.
    let scheduler = configure_scheduler(
        SchedulerWorker::builder_shared(store.clone())
            .from_inventory()
            .with_shared(&application.states, application.job_middleware.clone()),
        settings,
    )
    .health(health.probe("scheduler"))
    .build()?;
    #[cfg(feature = "rabbitmq")]
    if let Some(amqp) = &settings.amqp {
        let broker = rabbitmq::BrokerSettings {
            url: amqp.url.clone(),
            exchange: amqp.exchange.clone(),
            prefix: amqp.queue_prefix.clone(),
        };
        let delivering = rabbitmq::run_on_broker(
            broker,
            settings,
            &application.registry,
            store,
            health,
            startup,
            stop.clone(),
        );
        return beside_the_scheduler(delivering, scheduler, &stop).await;
    }
    #[cfg(feature = "kafka")]
    if let Some(kafka) = &settings.kafka {
        let delivering = kafka::run_on_kafka(
            kafka,
            settings,
            &application.registry,
            store,
            health,
            startup,
            stop.clone(),
        );
        return beside_the_scheduler(delivering, scheduler, &stop).await;
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
    let worker = outbox_worker_of_run(store, settings)
        .registry(application.registry.clone())
        .health(health.probe("outbox worker"))
        .build()?;
    startup.pass();
    beside_the_scheduler(
        async { Ok(worker.run(stop.clone()).await?) },
        scheduler,
        &stop,
    )
    .await
}

/// Runs what delivers the messages beside the scheduler until `stop` (or SIGTERM, Ctrl-C);
/// if either fails, stops the other too.
async fn beside_the_scheduler(
    delivering: impl std::future::Future<Output = Result<(), Error>>,
    scheduler: SchedulerWorker,
    stop: &CancellationToken,
) -> Result<(), Error> {
    tokio::spawn(stop_on_signal(stop.clone()));
    let (delivered, scheduled) = tokio::join!(
        stop_all_on_error(delivering, stop),
        scheduler.run(stop.clone()),
    );
    delivered.and(scheduled.map_err(Error::from))
}

/// The scheduler's knobs under `hexeract::run`: every variable that is set; the others keep
/// the builder's defaults.
fn configure_scheduler(builder: SchedulerBuilder, settings: &AppConfig) -> SchedulerBuilder {
    // Every field named: a knob added to the settings does not compile until it is named here,
    // and warns as unused until it is applied.
    let SchedulerConfig {
        poll_interval,
        batch_size,
        min_cycle_delay,
        dispatch_timeout,
        lease,
    } = settings.scheduler;
    // MAX_DELIVERIES, RETRY_MAX_DELAY_MS and STORE_TIMEOUT_MS; HANDLER_TIMEOUT_MS is not a
    // job's: SCHEDULER_DISPATCH_TIMEOUT_MS is.
    builder
        .retry_policy(settings.policy.retry.clone())
        .store_timeout(settings.policy.store_timeout)
        .if_set(poll_interval, SchedulerBuilder::poll_interval)
        .if_set(batch_size, SchedulerBuilder::batch_size)
        .if_set(min_cycle_delay, SchedulerBuilder::min_cycle_delay)
        .if_set(dispatch_timeout, SchedulerBuilder::dispatch_timeout)
        // Unset, the builder's: the longest dispatch timeout and 5 s to settle.
        .if_set(lease, SchedulerBuilder::lease)
        .shutdown_grace(settings.policy.shutdown_grace)
}

/// The outbox worker of `hexeract::run`: the process's defaults, the variables every world
/// reads, then `RELAY_BATCH_SIZE`, `CONSUMER_POLL_INTERVAL_MS` (its idle poll: it is the
/// consumer when no broker is; `RELAY_POLL_INTERVAL_MS` is the broker relays' alone) and
/// `DELIVERY_LEASE_MS` where set.
fn outbox_worker_of_run(
    store: Arc<dyn crate::store::DeliveryStore>,
    settings: &AppConfig,
) -> OutboxWorkerBuilder {
    OutboxWorkerBuilder::shared(store).policy(settings.policy.clone())
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

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    fn settings(vars: &'static [(&'static str, &'static str)]) -> AppConfig {
        AppConfig::from_lookup(|name| {
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

    /// Asserts that `value`'s `Debug` output shows `knob`.
    #[track_caller]
    fn assert_shows(value: &impl std::fmt::Debug, knob: &str) {
        let shown = format!("{value:?}");
        assert!(shown.contains(knob), "{knob} not in {shown}");
    }

    /// The scheduler's builder on `store` as `run` configures it from `settings`.
    fn scheduler_of_run(
        store: Arc<crate::store::sqlite::SqliteStore>,
        settings: &AppConfig,
    ) -> SchedulerBuilder {
        configure_scheduler(SchedulerWorker::builder_shared(store), settings)
    }

    #[tokio::test]
    async fn the_scheduler_of_run_takes_its_variables() {
        let set = settings(&[
            ("SCHEDULER_POLL_INTERVAL_MS", "250"),
            ("SCHEDULER_BATCH_SIZE", "7"),
            ("SCHEDULER_DISPATCH_TIMEOUT_MS", "1234"),
            ("SCHEDULER_LEASE_MS", "4321"),
        ]);
        let scheduler = scheduler_of_run(store().await, &set);
        // The builder shows these four of its knobs.
        for knob in [
            "poll_interval: 250ms",
            "batch_size: 7",
            "lease: Some(4.321s)",
            "dispatch_timeout: 1.234s",
        ] {
            assert_shows(&scheduler, knob);
        }
    }

    #[tokio::test]
    async fn unset_variables_leave_the_builders_defaults_under_run() {
        let unset = settings(&[]);
        let store = store().await;
        assert_eq!(
            format!("{:?}", scheduler_of_run(store.clone(), &unset)),
            format!("{:?}", SchedulerWorker::builder_shared(store.clone())),
        );
        // The lease is derived when built: the dispatch timeout and 5 s to settle.
        let scheduler = scheduler_of_run(store.clone(), &unset).build().unwrap();
        assert_shows(&scheduler, "lease: 35s");
        let longer = settings(&[("SCHEDULER_DISPATCH_TIMEOUT_MS", "60000")]);
        let scheduler = scheduler_of_run(store.clone(), &longer).build().unwrap();
        assert_shows(&scheduler, "lease: 65s");
        let worker = outbox_worker_of_run(store, &unset).build().unwrap();
        assert_shows(&worker, "lease: 35s");
    }

    #[tokio::test]
    async fn the_outbox_worker_polls_at_the_consumer_interval_and_the_relay_interval_is_not_its() {
        let consumer = settings(&[("CONSUMER_POLL_INTERVAL_MS", "250")]);
        let worker = outbox_worker_of_run(store().await, &consumer);
        assert_shows(&worker, "poll_interval: 250ms");
        let relay = settings(&[("RELAY_POLL_INTERVAL_MS", "300")]);
        let worker = outbox_worker_of_run(store().await, &relay);
        // The process default, not the relays' interval.
        assert_shows(&worker, "poll_interval: 500ms");
    }

    #[tokio::test]
    async fn store_timeout_ms_reaches_the_outbox_worker_and_the_scheduler() {
        let set = settings(&[("STORE_TIMEOUT_MS", "4500")]);
        let worker = outbox_worker_of_run(store().await, &set);
        assert_shows(&worker, "store_timeout: 4.5s");
        let scheduler = scheduler_of_run(store().await, &set);
        assert_shows(&scheduler, "store_timeout: 4.5s");
        let unset = outbox_worker_of_run(store().await, &settings(&[]));
        assert_shows(&unset, "store_timeout: 30s");
    }

    #[tokio::test]
    async fn the_outbox_worker_of_run_takes_the_delivery_lease() {
        let set = settings(&[("DELIVERY_LEASE_MS", "90000")]);
        let worker = outbox_worker_of_run(store().await, &set);
        assert_shows(&worker, "lease: Some(90s)");
    }
}
