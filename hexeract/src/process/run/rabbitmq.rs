//! `hexeract::run` on a broker: the outbox relay and the bus worker, each on a connection of its
//! own, each restarted after a connection loss with the seed's loop: reconnect with backoff,
//! declare the topology again, build a new worker.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::AppConfig;
use crate::error::{ConfigError, ConfigProblem, Error};
use crate::health::{Health, Probe};
use crate::outbox::StorePublisher;
use crate::publish::Publish;
use crate::rabbitmq::{
    BusError, RabbitMqConnection, RabbitMqRelay, RabbitMqWorkerBuilder, Topology,
};
use crate::registry::Registry;
use crate::retry::Backoff;
use crate::run::ownership;
use crate::store::Store;

/// The broker settings `hexeract::run` uses.
#[derive(Clone, Debug)]
pub(crate) struct BrokerSettings {
    pub(crate) url: String,
    pub(crate) exchange: String,
    pub(crate) prefix: String,
}

/// The topology `hexeract::run` declares: the worker's own wait tiers are the default
/// backoff's, up to `RETRY_MAX_DELAY_MS`.
pub(crate) fn run_topology(
    settings: &AppConfig,
    exchange: &str,
    prefix: &str,
    registry: &Registry,
) -> Topology {
    let longest = settings.policy.retry.delays().1;
    Topology::from_registry(registry)
        .exchange(exchange)
        .prefix(prefix)
        .wait_tiers(crate::rabbitmq::tiers_for(Duration::from_secs(1), longest))
}

/// Runs the relay and the bus worker until `cancel`, restarting either after a connection
/// loss. Returns `Ok(())` once both stopped after the cancellation; an error only when the
/// handlers or names are invalid, found before anything started.
pub(crate) async fn run_on_broker(
    broker: BrokerSettings,
    settings: &AppConfig,
    registry: &Registry,
    store: Arc<dyn Store>,
    health: &Health,
    startup: Probe,
    cancel: CancellationToken,
) -> Result<(), Error> {
    let relay_probe = health.probe("outbox relay");
    let worker_probe = health.probe("bus worker");
    startup.pass();
    let wake = crate::store::wake_signal(&*store).await;
    let ctx_publisher: Arc<dyn Publish> = Arc::new(StorePublisher::new(store.clone(), wake));
    let worker = |connection: RabbitMqConnection| {
        let policy = settings.policy.clone();
        let builder = RabbitMqWorkerBuilder::new(connection)
            .policy(policy)
            .registry(registry.clone())
            .exchange(broker.exchange.clone())
            .prefix(broker.prefix.clone());
        builder
            .dead_letters(store.clone())
            .publish_to(ctx_publisher.clone())
            .health(worker_probe.clone())
            .build()
    };
    // Invalid handlers or names stop startup before any connection is made.
    let topology = run_topology(settings, &broker.exchange, &broker.prefix, registry);
    topology.validate().map_err(|error| {
        Error::Config(ConfigError {
            problems: vec![ConfigProblem {
                setting: "queue and exchange names (HEXERACT_QUEUE_PREFIX, HEXERACT_EXCHANGE, \
                          handler names, message types)"
                    .to_owned(),
                value: format!("prefix {:?}, exchange {:?}", broker.prefix, broker.exchange),
                expected: error.to_string(),
            }],
        })
    })?;
    let queues = topology.queues().len();
    tracing::info!(
        broker = %crate::redact::redact_url(&broker.url),
        exchange = %broker.exchange,
        queues,
        "delivering through RabbitMQ"
    );

    // A topology the broker refuses (an object that exists with other arguments) stops both
    // loops and `run`: restarting would meet the same refusal for ever.
    let cancel = cancel.child_token();
    let batch_size = settings.policy.batch_size;
    let poll_interval = settings.relay_poll_interval;
    let ownership_checked = std::sync::atomic::AtomicBool::new(false);
    let relay = supervise(&relay_probe, &cancel, || async {
        let connection = connect(&broker, "relay", &relay_probe, &cancel).await?;
        // Before the first publish: a message published before its queues are bound is
        // routed nowhere, and the broker drops it.
        topology.declare(&connection).await?;
        // Once per process: remember this program's queues, and warn about queues an earlier
        // version declared for handlers it no longer has.
        if !ownership_checked.swap(true, std::sync::atomic::Ordering::Relaxed) {
            match ownership::record_and_find_unowned(&connection, &topology, &*store).await {
                Ok(unowned) => ownership::warn(&unowned),
                Err(error) => {
                    tracing::warn!(%error, "could not check for queues no handler owns");
                }
            }
        }
        let relay = RabbitMqRelay::new(store.clone(), &connection)
            .await?
            .exchange(broker.exchange.clone())
            .batch_size(batch_size)
            .poll_interval(poll_interval)
            .store_timeout(settings.policy.store_timeout)
            .health(relay_probe.clone());
        let relay = match &settings.amqp {
            Some(amqp) => relay
                .max_message_size(amqp.max_message_size)
                .allow_unrouted(amqp.allow_unrouted.iter().cloned()),
            None => relay,
        };
        relay.run(cancel.clone()).await
    });
    let consumers = supervise(&worker_probe, &cancel, || async {
        let connection = connect(&broker, "consumer", &worker_probe, &cancel).await?;
        // Checked above; a failure here is reported and retried like a connection loss.
        let worker =
            worker(connection).map_err(|error| BusError::InvalidName(error.to_string()))?;
        worker.run(cancel.clone()).await
    });
    let (relay, consumers) = tokio::join!(relay, consumers);
    match relay.and(consumers) {
        Ok(()) => Ok(()),
        Err(error) => Err(Error::Broker(error)),
    }
}

/// Connects to `broker` for `role` (the connection is named `<prefix>.<role>`), retrying with
/// backoff until it succeeds or `cancel` fires.
async fn connect(
    broker: &BrokerSettings,
    role: &str,
    probe: &Probe,
    cancel: &CancellationToken,
) -> Result<RabbitMqConnection, BusError> {
    let name = format!("{}.{role}", broker.prefix);
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        let connecting = tokio::select! {
            () = cancel.cancelled() => {
                return Err(BusError::Connection(
                    "stopped while connecting to RabbitMQ".to_owned(),
                ))
            }
            connecting = RabbitMqConnection::connect_named(&broker.url, &name) => connecting,
        };
        match connecting {
            Ok(connection) => return Ok(connection),
            Err(error) => {
                let delay = backoff.next_delay();
                tracing::warn!(%error, connection = name.as_str(), retry_in = ?delay, "cannot reach RabbitMQ");
                probe.fail(&error);
                tokio::select! {
                    () = cancel.cancelled() => return Err(error),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Runs `start` again whenever it fails, with backoff, until it returns `Ok(())` (after a
/// cancellation) or `cancel` fires. The component is failing from a failure until the
/// restarted loop passes again. A [`BusError::Mismatch`] is not retried: it cancels `cancel`
/// (stopping the other loop too) and is returned.
async fn supervise<F, Fut>(
    probe: &Probe,
    cancel: &CancellationToken,
    start: F,
) -> Result<(), BusError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), BusError>>,
{
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
    loop {
        let started = tokio::time::Instant::now();
        match start().await {
            Ok(()) => return Ok(()),
            Err(_) if cancel.is_cancelled() => return Ok(()),
            Err(error @ BusError::Mismatch { .. }) => {
                let name = probe.name();
                tracing::error!(%error, "{name} cannot start on this broker; stopping");
                probe.fail(&error);
                cancel.cancel();
                return Err(error);
            }
            Err(error) => {
                // A loop that ran a while before failing starts its backoff over: an outage
                // days after the last one is not met with the longest delay.
                if started.elapsed() > Duration::from_secs(30) {
                    backoff.reset();
                }
                let delay = backoff.next_delay();
                let name = probe.name();
                tracing::error!(%error, retry_in = ?delay, "{name} stopped; restarting");
                probe.fail(format_args!("{error}; restarting"));
                tokio::select! {
                    () = cancel.cancelled() => return Ok(()),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// `dead-letters replay` under `AMQP_URL`: one connection and confirmed publisher for every
/// dead letter a command sends back.
pub(crate) struct BrokerReplay {
    connection: RabbitMqConnection,
    publisher: crate::rabbitmq::RabbitMqPublisher,
    exchange: String,
    queue_prefix: String,
}

impl BrokerReplay {
    pub(crate) async fn connect(amqp: &crate::config::Amqp) -> Result<BrokerReplay, Error> {
        let connection =
            RabbitMqConnection::connect_named(&amqp.url, &format!("{}.cli", amqp.queue_prefix))
                .await?;
        let publisher = crate::rabbitmq::RabbitMqPublisher::new(&connection)
            .await?
            .exchange(amqp.exchange.clone());
        Ok(BrokerReplay {
            connection,
            publisher,
            exchange: amqp.exchange.clone(),
            queue_prefix: amqp.queue_prefix.clone(),
        })
    }

    /// Sends a dead letter back to its handler's queue on the broker (or, without a handler,
    /// to the exchange under its type): attempts start over. Deletes the dead letter once the
    /// broker confirmed the publish. Returns where it went.
    pub(crate) async fn replay(
        &self,
        letter: &crate::dead_letter::DeadLetter,
        store: &dyn Store,
    ) -> Result<String, Error> {
        let properties = crate::rabbitmq::wire::replay_properties(&letter.envelope, letter.id);
        let (exchange, routing_key, place) = match &letter.handler {
            Some(handler) => {
                let queue = crate::rabbitmq::topology::queue_name(&self.queue_prefix, handler);
                (String::new(), queue.clone(), format!("queue {queue}"))
            }
            None => (
                self.exchange.clone(),
                letter.envelope.message_type.clone(),
                format!("exchange {} (every handler of its type)", self.exchange),
            ),
        };
        // Mandatory: a queue that is not there (a renamed handler) is an error, not a loss.
        self.publisher
            .publish_raw(
                &exchange,
                &routing_key,
                &letter.envelope.payload,
                properties,
                true,
            )
            .await?;
        // The message is on the broker now: a failure to delete the letter must say so, or an
        // operator would replay it again and the handler would get it twice.
        match store.delete_dead_letter(letter.id).await {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                dead_letter = %letter.id,
                "the dead letter was removed by someone else while it was replayed (another \
                 replay or a purge): its message may have been sent twice"
            ),
            Err(error) => {
                return Err(Error::Unsupported(format!(
                    "dead letter {} was sent to {place}, but deleting it failed ({error}): \
                     delete it (`dead-letters purge` with filters matching it) instead of \
                     replaying it again, or its handler gets it twice",
                    letter.id
                )))
            }
        }
        Ok(place)
    }

    pub(crate) async fn close(self) {
        let _ = self.connection.close().await;
    }
}
