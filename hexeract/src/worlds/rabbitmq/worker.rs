//! [`RabbitMqWorker`]: consumes handler queues, acks after the outcome, retries through the
//! wait queues and parks what cannot be handled.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{join_all, BoxFuture, FutureExt};
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::dead_letter::DeadLetter;
use crate::delivery::{spawn_grace_timer, Engine, Policy, Slot, Target, Verdict, World};
use crate::envelope::Envelope;
use crate::health::Probe;
use crate::knobs::{ConfigError, ConfigProblem};
use crate::metrics::Metrics;
use crate::publish::{Publish, PublishError};
use crate::rabbitmq::acks::{AckTracker, Acks};
use crate::rabbitmq::topology::{parking_queue, queue_exists, short, Queue};
use crate::rabbitmq::wire::{self, ParkedInfo};
use crate::rabbitmq::{
    ensure_topology, BusError, RabbitMqConnection, RabbitMqPublisher, Topology,
    DEFAULT_DELIVERY_LIMIT, DEFAULT_EXCHANGE, DEFAULT_PARKING_MAX_LENGTH, DEFAULT_PREFIX,
};
use crate::registry::RegisteredHandler;
use crate::retry::Backoff;
use crate::store::DeadLetterStore;
use crate::worker::{handler_slot, BuildError, MessageSource, Source, WorkerBuilder};

/// Builds a [`RabbitMqWorker`]. Defaults are the library's: `prefetch` 16, `max_attempts` 5,
/// `max_payload_bytes` 1 MiB, handler timeout 30 s, shutdown grace 8 s, confirm timeout 30 s.
///
/// ```no_run
/// # use hexeract::{Context, Handler, Message};
/// # #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// # #[message(type = "OrderPlaced")]
/// # struct OrderPlaced { order_id: u64 }
/// # struct MyHandler;
/// # impl Handler<OrderPlaced> for MyHandler {
/// #     type Error = std::io::Error;
/// #     async fn handle(&self, _: OrderPlaced, _: &Context) -> Result<(), Self::Error> { Ok(()) }
/// # }
/// # async fn example(store: std::sync::Arc<dyn hexeract::store::DeadLetterStore>) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use hexeract::rabbitmq::{RabbitMqConnection, RabbitMqWorkerBuilder};
/// use hexeract::CancellationToken;
///
/// let uri = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// let cancel = CancellationToken::new();
/// loop {
///     let connection =
///         RabbitMqConnection::connect_with_retry(uri, 5, Duration::from_millis(500)).await?;
///     let worker = RabbitMqWorkerBuilder::new(connection)
///         .register_handler::<OrderPlaced, _>(MyHandler)
///         .dead_letters(store.clone())
///         .build()?;
///     match worker.run(cancel.clone()).await {
///         Ok(()) => break,
///         Err(error) => {
///             tracing::error!(%error, "bus worker stopped, restarting");
///             tokio::time::sleep(Duration::from_secs(1)).await;
///         }
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub type RabbitMqWorkerBuilder = WorkerBuilder<RabbitMqSource>;

/// RabbitMQ's own half of a [`RabbitMqWorker`]: the connection, the names and the broker-side
/// knobs of its queues, where parked messages are recorded. Its setters are on
/// [`RabbitMqWorkerBuilder`].
pub struct RabbitMqSource {
    connection: RabbitMqConnection,
    exchange: String,
    prefix: String,
    wait_tiers: Option<Vec<Duration>>,
    queue: Option<String>,
    dead_letter_routing_key: Option<String>,
    confirm_timeout: Duration,
    delivery_limit: u32,
    parking_max_length: u64,
    ack_mode: AckMode,
    declare: bool,
    dead_letters: Option<Arc<dyn DeadLetterStore>>,
    park_without_rows: bool,
    publisher: Option<Arc<dyn Publish>>,
    health: Option<Probe>,
}

impl fmt::Debug for RabbitMqSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqSource")
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

impl crate::worker::sealed::Sealed for RabbitMqSource {}
impl MessageSource for RabbitMqSource {}

impl WorkerBuilder<RabbitMqSource> {
    /// A worker on `connection`, with no handlers yet.
    pub fn new(connection: RabbitMqConnection) -> RabbitMqWorkerBuilder {
        WorkerBuilder::from_source(
            RabbitMqSource {
                connection,
                exchange: DEFAULT_EXCHANGE.to_owned(),
                prefix: DEFAULT_PREFIX.to_owned(),
                wait_tiers: None,
                queue: None,
                dead_letter_routing_key: None,
                confirm_timeout: Duration::from_secs(30),
                delivery_limit: DEFAULT_DELIVERY_LIMIT,
                parking_max_length: DEFAULT_PARKING_MAX_LENGTH,
                ack_mode: AckMode::Manual,
                declare: true,
                dead_letters: None,
                park_without_rows: false,
                publisher: None,
                health: None,
            },
            Policy::library(),
        )
    }

    /// The message exchange (default `hexeract`).
    pub fn exchange(mut self, exchange: impl Into<String>) -> RabbitMqWorkerBuilder {
        self.source.exchange = exchange.into();
        self
    }

    /// The prefix of queue names (default `hexeract`): each handler consumes
    /// `<prefix>.<handler name>`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> RabbitMqWorkerBuilder {
        self.source.prefix = prefix.into();
        self
    }

    /// The wait queues' delays. A retry waits in the shortest tier at least as long as its
    /// backoff. Default: the retry delays doubling from the first to the longest
    /// ([`tiers_for`](crate::rabbitmq::tiers_for); 1 s, 2 s, 4 s … 256 s, 300 s by default).
    pub fn wait_tiers(
        mut self,
        tiers: impl IntoIterator<Item = Duration>,
    ) -> RabbitMqWorkerBuilder {
        self.source.wait_tiers = Some(tiers.into_iter().collect());
        self
    }

    /// Consumes this one queue, managed by you, instead of a queue per handler; each message
    /// goes to the handler of its type (so each type may have only one handler here). The
    /// queue must exist; retries come back to it.
    pub fn queue(mut self, queue: impl Into<String>) -> RabbitMqWorkerBuilder {
        self.source.queue = Some(queue.into());
        self
    }

    /// With [`queue`](RabbitMqWorkerBuilder::queue): the parking queue (default
    /// `<queue>.parked`), where messages that cannot be handled are published through the
    /// default exchange.
    pub fn dead_letter_routing_key(mut self, key: impl Into<String>) -> RabbitMqWorkerBuilder {
        self.source.dead_letter_routing_key = Some(key.into());
        self
    }

    /// Deliveries the broker may have in flight per queue at once (default 16, at most
    /// 65 535): the most handler calls of one queue running together.
    pub fn prefetch(mut self, prefetch: u32) -> RabbitMqWorkerBuilder {
        self.policy.prefetch = prefetch;
        self
    }

    /// Handler calls per message in total (default 5); then the message is parked.
    pub fn max_attempts(mut self, max_attempts: u32) -> RabbitMqWorkerBuilder {
        self.policy.max_deliveries(max_attempts);
        self
    }

    /// How long a retry or parking publish waits for the broker's confirm (default 30 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> RabbitMqWorkerBuilder {
        self.source.confirm_timeout = timeout;
        self
    }

    /// The handler queues' `x-delivery-limit` (default [`DEFAULT_DELIVERY_LIMIT`], at least
    /// 1): the queues are declared with it, and a delivery the broker has returned that often
    /// (the consumer crashed or lost its connection each time) is parked by the worker, with
    /// its `dead_letters` row and the reason `delivery_limit_reached`, before one more return
    /// would have the broker park it without either. With [`queue`](Self::queue) or
    /// [`skip_declare`](Self::skip_declare), set it to the limit the queues were declared with.
    pub fn delivery_limit(mut self, limit: u32) -> RabbitMqWorkerBuilder {
        self.source.delivery_limit = limit;
        self
    }

    /// The parking queues' `x-max-length` (default [`DEFAULT_PARKING_MAX_LENGTH`], at least
    /// 1): a full parking queue refuses a park (`basic.nack`), and the delivery goes back to
    /// its queue instead of being acked, to be parked once there is room. The queues are
    /// declared with it: changing it migrates them ([`migrate_queue`](crate::rabbitmq::migrate_queue)).
    pub fn parking_max_length(mut self, length: u64) -> RabbitMqWorkerBuilder {
        self.source.parking_max_length = length;
        self
    }

    /// When a delivery is acked (default [`AckMode::Manual`]: once its outcome is settled, so
    /// that nothing is lost). [`AckMode::Automatic`] acks it as a call takes it, before the
    /// handler runs: at most once, the one exception to at-least-once.
    pub fn ack_mode(mut self, mode: AckMode) -> RabbitMqWorkerBuilder {
        self.source.ack_mode = mode;
        self
    }

    /// Declare nothing: the topology exists already (default: declare it at start).
    pub fn skip_declare(mut self) -> RabbitMqWorkerBuilder {
        self.source.declare = false;
        self
    }

    /// Records every parked message in this store's `dead_letters` table, with its reason,
    /// before the park: where operators list, replay and purge them. Required, unless
    /// [`park_without_rows`](RabbitMqWorkerBuilder::park_without_rows) says otherwise.
    pub fn dead_letters(mut self, store: Arc<dyn DeadLetterStore>) -> RabbitMqWorkerBuilder {
        self.source.dead_letters = Some(store);
        self
    }

    /// Parks messages in the parking queues only, with their reason in the headers but no
    /// `dead_letters` row: for a program whose operators read the parking queues themselves.
    /// Without this or [`dead_letters`](RabbitMqWorkerBuilder::dead_letters), `build` fails,
    /// so that no message is parked without the row a person looks for.
    pub fn park_without_rows(mut self) -> RabbitMqWorkerBuilder {
        self.source.park_without_rows = true;
        self
    }

    /// Where `ctx.publish` sends follow-up messages (default: straight to the exchange, with
    /// confirms; `hexeract::run` gives the outbox).
    pub fn publish_to(mut self, publisher: Arc<dyn Publish>) -> RabbitMqWorkerBuilder {
        self.source.publisher = Some(publisher);
        self
    }

    /// Reports readiness to `probe`: ready once every queue's consumer is subscribed, failing
    /// when the worker lost its connection, held while the broker blocks the connection
    /// (`connection.blocked`: retries and parking cannot publish).
    ///
    /// ```no_run
    /// # async fn example(connection: hexeract::rabbitmq::RabbitMqConnection, store: std::sync::Arc<dyn hexeract::store::DeadLetterStore>) -> Result<(), Box<dyn std::error::Error>> {
    /// use hexeract::health::Health;
    /// use hexeract::rabbitmq::RabbitMqWorkerBuilder;
    ///
    /// let health = Health::new();
    /// let worker = RabbitMqWorkerBuilder::new(connection)
    ///     .from_registry()
    ///     .dead_letters(store)
    ///     .health(health.probe("bus worker"))
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn health(mut self, probe: Probe) -> RabbitMqWorkerBuilder {
        self.source.health = Some(probe);
        self
    }
}

impl Source for RabbitMqSource {
    type Worker = RabbitMqWorker;

    fn build(builder: RabbitMqWorkerBuilder) -> Result<RabbitMqWorker, BuildError> {
        let (handlers, policy, source) = builder.into_parts();
        let mut checks = policy
            .checks("max_attempts")
            .at_least_one("prefetch", policy.prefetch.into())
            .not_zero("confirm_timeout", source.confirm_timeout)
            .at_least_one("delivery_limit", source.delivery_limit.into())
            .at_least_one("parking_max_length", source.parking_max_length);
        if policy.prefetch > u32::from(u16::MAX) {
            checks = checks.problem(
                "prefetch",
                policy.prefetch.to_string(),
                "at most 65535 (AMQP's limit)",
            );
        }
        let (initial, longest) = policy.retry.delays();
        let wait_tiers = source
            .wait_tiers
            .clone()
            .unwrap_or_else(|| crate::rabbitmq::tiers_for(initial, longest));
        if wait_tiers.is_empty() || wait_tiers.iter().any(Duration::is_zero) {
            checks = checks.problem(
                "wait_tiers",
                format!("{wait_tiers:?}"),
                "at least one delay, each longer than zero",
            );
        }
        if source.connection.is_recovering() {
            checks = checks.problem(
                "connection",
                format!(
                    "{:?} with lapin's automatic recovery on",
                    source.connection.name()
                ),
                "a connection from connect_named or connect_named_with_retry: a recovered \
                 channel starts its delivery tags again, and acks would reach the wrong \
                 deliveries",
            );
        }
        if source.dead_letters.is_none() && !source.park_without_rows {
            checks = checks.problem(
                "dead_letters",
                "not set".to_owned(),
                "a store for the rows of parked messages, .dead_letters(store) (as \
                 hexeract::run gives it), or .park_without_rows() to keep them in the parking \
                 queues alone",
            );
        }
        if source.dead_letter_routing_key.is_some() && source.queue.is_none() {
            checks = checks.problem(
                "dead_letter_routing_key",
                source.dead_letter_routing_key.clone().unwrap_or_default(),
                "only with queue(…): handler queues park in <queue>.parked",
            );
        }
        checks.finish()?;
        let registry = handlers.build(None)?;
        let topology = Topology::from_registry(&registry)
            .exchange(source.exchange.clone())
            .prefix(source.prefix)
            .wait_tiers(wait_tiers)
            .delivery_limit(source.delivery_limit)
            .parking_max_length(source.parking_max_length);
        topology.validate().map_err(|error| {
            config_problem(
                "queue and exchange names",
                "(see below)",
                &error.to_string(),
            )
        })?;
        let health = source
            .health
            .clone()
            .unwrap_or_else(|| Probe::detached("bus worker"));
        let runner = |handler: &Arc<RegisteredHandler>| {
            handler_slot(&policy, handler, Metrics::global(), Some(&health))
        };
        let consumers = match &source.queue {
            Some(queue) => {
                let mut by_type = HashMap::new();
                for info in registry.handlers() {
                    let handler = registry.get(&info.name).expect("listed");
                    if by_type
                        .insert(info.message_type.to_owned(), runner(handler))
                        .is_some()
                    {
                        return Err(config_problem(
                            "queue",
                            queue,
                            &format!(
                                "one handler per message type: {:?} has several, and one queue \
                                 delivers each message once; leave queue(…) unset to give each \
                                 handler a queue of its own",
                                info.message_type
                            ),
                        ));
                    }
                }
                vec![QueueConsumer {
                    parking: source
                        .dead_letter_routing_key
                        .clone()
                        .unwrap_or_else(|| parking_queue(queue)),
                    queue: queue.clone(),
                    route: Route::ByType(by_type),
                }]
            }
            None => topology
                .handler_queues()
                .into_iter()
                .map(|place| {
                    let handler = registry.get(&place.handler).expect("listed");
                    QueueConsumer {
                        queue: place.queue,
                        parking: place.parking,
                        route: Route::One {
                            message_type: place.message_type,
                            runner: runner(handler),
                        },
                    }
                })
                .collect(),
        };
        for info in registry.handlers() {
            tracing::debug!(handler = %info.name, message_type = info.message_type, "bus handler");
        }
        Ok(RabbitMqWorker {
            shared: Arc::new(Shared {
                connection: source.connection,
                topology,
                exchange: source.exchange,
                consumers,
                prefetch: u16::try_from(policy.prefetch).expect("checked above"),
                engine: Engine::new(policy.retry, policy.max_payload_bytes, "rabbitmq"),
                max_payload_bytes: policy.max_payload_bytes,
                shutdown_grace: policy.shutdown_grace,
                confirm_timeout: source.confirm_timeout,
                delivery_limit: source.delivery_limit,
                ack_mode: source.ack_mode,
                declare: source.declare,
                dead_letters: source.dead_letters,
                store_timeout: policy.store_timeout,
                publisher: source.publisher,
                health,
                subscribed: AtomicUsize::new(0),
            }),
        })
    }
}

fn config_problem(setting: &str, value: &str, expected: &str) -> BuildError {
    BuildError::Config(ConfigError {
        problems: vec![ConfigProblem {
            setting: setting.to_owned(),
            value: value.to_owned(),
            expected: expected.to_owned(),
        }],
    })
}

/// Consumes RabbitMQ queues and calls their handlers, until cancelled or until the connection is
/// lost.
///
/// Each handler queue gets a channel and a consumer of its own, with `prefetch` deliveries in
/// flight. A delivery is acked only once its outcome is settled: after the handler succeeded,
/// after its retry was republished to a wait queue and confirmed, or after it was parked and the
/// park confirmed. Acks are coalesced with `multiple`.
///
/// Acks go through the channel by delivery tag, on a connection without lapin's automatic
/// recovery: a channel that is gone shows as an error and the end of the consumer stream, never
/// as an ack that silently did nothing (lapin's `Acker::ack` answers `Ok(false)` on a channel
/// reset by recovery). Unacked deliveries then come back from the broker.
///
/// The worker never reconnects on its own: [`run`](RabbitMqWorker::run) returns
/// [`BusError::Connection`] when a consumer stream ends without a cancellation, and the caller
/// (the runtime's supervisor) reconnects and builds a new worker.
pub struct RabbitMqWorker {
    shared: Arc<Shared>,
}

/// When the worker acks a delivery.
///
/// ```no_run
/// # async fn example(connection: hexeract::rabbitmq::RabbitMqConnection) -> Result<(), hexeract::Error> {
/// use hexeract::rabbitmq::{AckMode, RabbitMqWorkerBuilder};
///
/// // Price ticks: a newer one comes every second, and one lost in a crash does not matter.
/// let worker = RabbitMqWorkerBuilder::new(connection)
///     .from_registry()
///     .ack_mode(AckMode::Automatic)
///     .park_without_rows()
///     .build()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AckMode {
    /// Acked once its outcome is settled: after the handler succeeded, after its retry or
    /// park was confirmed by the broker. A crash or a lost connection before that brings the
    /// delivery back: at least once.
    #[default]
    Manual,
    /// Acked as a call takes it, before the handler runs: at most once. A failure is still
    /// retried through the wait queues and, in the end, parked with its `dead_letters` row;
    /// but a crash, a lost connection, a shutdown that gives up on a running call, or a retry
    /// that cannot be published loses the message (logged as lost). Prefetch still bounds
    /// what the broker sends, and the worker runs at most `prefetch` calls of a queue at once.
    Automatic,
}

struct Shared {
    connection: RabbitMqConnection,
    topology: Topology,
    exchange: String,
    consumers: Vec<QueueConsumer>,
    prefetch: u16,
    engine: Engine,
    max_payload_bytes: usize,
    shutdown_grace: Duration,
    confirm_timeout: Duration,
    delivery_limit: u32,
    ack_mode: AckMode,
    declare: bool,
    dead_letters: Option<Arc<dyn DeadLetterStore>>,
    /// Deadline of each dead-letter row written when parking.
    store_timeout: Duration,
    publisher: Option<Arc<dyn Publish>>,
    health: Probe,
    /// Consumers subscribed so far in this run.
    subscribed: AtomicUsize,
}

struct QueueConsumer {
    queue: String,
    parking: String,
    route: Route,
}

enum Route {
    /// A handler's own queue.
    One { message_type: String, runner: Slot },
    /// A queue of several types, each to its handler.
    ByType(HashMap<String, Slot>),
}

impl Route {
    fn runner(&self, message_type: &str) -> Option<&Slot> {
        match self {
            Route::One {
                message_type: own,
                runner,
            } => (own == message_type).then_some(runner),
            Route::ByType(runners) => runners.get(message_type),
        }
    }

    fn handler_name(&self) -> Option<&str> {
        match self {
            Route::One { runner, .. } => Some(runner.name()),
            Route::ByType(_) => None,
        }
    }
}

/// How a delivery ended, for its ack.
enum DeliveryEnd {
    /// Handled, retried or parked: ack it.
    Ack,
    /// Give it back to the queue after a call (given up on at shutdown, or its republish
    /// failed): the broker delivers it again, counting the delivery.
    Requeue,
    /// Give it back to the queue without a call (the worker stopped before it started).
    GiveBack,
}

impl fmt::Debug for RabbitMqWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqWorker")
            .field(
                "queues",
                &self
                    .shared
                    .consumers
                    .iter()
                    .map(|consumer| &consumer.queue)
                    .collect::<Vec<_>>(),
            )
            .field("prefetch", &self.shared.prefetch)
            .finish_non_exhaustive()
    }
}

impl RabbitMqWorker {
    /// A builder on `connection`.
    pub fn builder(connection: RabbitMqConnection) -> RabbitMqWorkerBuilder {
        RabbitMqWorkerBuilder::new(connection)
    }

    /// The queues this worker consumes.
    pub fn queues(&self) -> Vec<&str> {
        self.shared
            .consumers
            .iter()
            .map(|consumer| consumer.queue.as_str())
            .collect()
    }

    /// The topology the worker declares (unless told not to).
    pub fn topology(&self) -> &Topology {
        &self.shared.topology
    }

    /// Declares the topology, then consumes until `cancel` fires: stops taking deliveries, lets
    /// running calls finish (up to the shutdown grace), acks what is settled and returns
    /// `Ok(())`. Returns [`BusError::Connection`] when a consumer stream ends without a
    /// cancellation (the connection or a channel is gone).
    ///
    /// Stopping has one hard deadline: the grace and 5 s to settle. A worker whose acks or
    /// parkings cannot land by then (a broker alarm) stops anyway; the broker hands its
    /// unacknowledged deliveries out again when its channels close.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), BusError> {
        let shared = self.shared;
        let result = crate::delivery::stop_by_deadline(
            "RabbitMQ worker",
            &cancel,
            shared.shutdown_grace,
            shared.run(cancel.clone()),
        )
        .await;
        if let Err(error) = &result {
            shared.health.fail(error);
        }
        result
    }
}

impl Shared {
    async fn run(&self, cancel: CancellationToken) -> Result<(), BusError> {
        let shared = self;
        let connection = shared.connection.clone();
        shared.health.watch("connection.blocked", move || {
            connection.is_blocked().then(|| {
                "the broker blocked the connection (connection.blocked: a memory or disk \
                 alarm); retries and parking wait"
                    .to_owned()
            })
        });
        shared.subscribed.store(0, Ordering::SeqCst);
        if shared.consumers.is_empty() {
            tracing::info!("RabbitMQ worker has no handlers; idle until cancelled");
            shared.health.pass();
            cancel.cancelled().await;
            return Ok(());
        }
        if shared.declare {
            shared.declare().await?;
        }
        let publisher = Arc::new(
            RabbitMqPublisher::new(&shared.connection)
                .await?
                .exchange(shared.exchange.clone())
                .confirm_timeout(shared.confirm_timeout),
        );
        let ctx_publisher: Arc<dyn Publish> = match &shared.publisher {
            Some(publisher) => publisher.clone(),
            None => Arc::new(DirectPublisher(publisher.clone())),
        };
        // One consumer's loss (or the publisher's) stops the others: the worker is rebuilt as a
        // whole. The shutdown grace runs from either stop.
        let stop = cancel.child_token();
        let interrupt = CancellationToken::new();
        let _grace = spawn_grace_timer(stop.clone(), interrupt.clone(), shared.shutdown_grace);
        tracing::info!(
            queues = shared.consumers.len(),
            connection = shared.connection.name(),
            "RabbitMQ worker started"
        );
        let depths = tokio::spawn(sample_queue_depths(
            shared.connection.clone(),
            shared
                .consumers
                .iter()
                .map(|consumer| consumer.queue.clone())
                .collect(),
            stop.clone(),
        ));
        let results = join_all(shared.consumers.iter().map(|consumer| {
            let consume = ConsumeLoop {
                shared,
                consumer,
                publisher: &publisher,
                ctx_publisher: &ctx_publisher,
                stop: &stop,
                interrupt: &interrupt,
                lost: AtomicBool::new(false),
            };
            async move {
                let result = consume.run().await;
                if result.is_err() {
                    consume.stop.cancel();
                }
                result
            }
        }))
        .await;
        depths.abort();
        if cancel.is_cancelled() {
            tracing::info!("RabbitMQ worker stopped");
            return Ok(());
        }
        let error = results
            .into_iter()
            .find_map(Result::err)
            .unwrap_or_else(|| {
                BusError::Connection(
                    "the channel for retries and parking closed (a publish the broker refused, a \
                     lost connection, or publisher confirms that stopped coming)"
                        .to_owned(),
                )
            });
        tracing::warn!(%error, "RabbitMQ worker lost its connection");
        Err(error)
    }

    async fn declare(&self) -> Result<(), BusError> {
        match self.consumers.first().map(|consumer| &consumer.route) {
            Some(Route::ByType(_)) => {
                // The queue is the application's, and so is the parking queue when it exists
                // already: both are only checked, passively, never declared again with
                // arguments of ours. The wait tiers are the worker's.
                let consumer = &self.consumers[0];
                if !queue_exists(&self.connection, &consumer.queue).await? {
                    return Err(BusError::Transport {
                        operation: format!("consuming queue {:?}", consumer.queue),
                        detail: "it does not exist: with queue(…) the application declares \
                                 its queue (ensure_topology) before the worker runs"
                            .to_owned(),
                    });
                }
                if !queue_exists(&self.connection, &consumer.parking).await? {
                    let parking = self.topology.parking_queue_layout(&consumer.parking);
                    match ensure_topology(&self.connection, &[], &[parking], &[]).await {
                        // Declared meanwhile, with arguments of its own (the application, or
                        // another replica): it is theirs, and it is there.
                        Err(BusError::Mismatch { .. })
                            if queue_exists(&self.connection, &consumer.parking).await? => {}
                        declared => declared?,
                    }
                }
                let exchanges = self.topology.exchanges();
                let wait_tier = |queue: &Queue| queue.message_ttl.is_some();
                let queues: Vec<Queue> = self
                    .topology
                    .queues()
                    .into_iter()
                    .filter(wait_tier)
                    .collect();
                let bindings: Vec<_> = self
                    .topology
                    .bindings()
                    .into_iter()
                    .filter(|binding| binding.exchange != self.exchange)
                    .collect();
                ensure_topology(&self.connection, &exchanges, &[], &[]).await?;
                self.topology.upgrade(&self.connection, wait_tier).await?;
                ensure_topology(&self.connection, &exchanges, &queues, &bindings).await
            }
            _ => self.topology.declare(&self.connection).await,
        }
    }
}

/// One queue's consumer: deliveries in, handler calls, acks out.
struct ConsumeLoop<'a> {
    shared: &'a Shared,
    consumer: &'a QueueConsumer,
    publisher: &'a Arc<RabbitMqPublisher>,
    ctx_publisher: &'a Arc<dyn Publish>,
    /// Fires on cancellation and when any part of the worker lost its connection.
    stop: &'a CancellationToken,
    interrupt: &'a CancellationToken,
    /// This consumer's stream ended: its acks can no longer reach the broker, so nothing more
    /// is started (the broker delivers every unacked delivery again).
    lost: AtomicBool,
}

impl ConsumeLoop<'_> {
    /// The bytes of properties a copy this loop republishes may take (see
    /// [`wire::property_budget`]).
    fn property_budget(&self) -> usize {
        wire::property_budget(self.shared.connection.lapin().configuration().frame_max())
    }

    async fn run(&self) -> Result<(), BusError> {
        let stop = self.stop;
        let shared = self.shared;
        let channel = shared.connection.channel().await?;
        channel
            .basic_qos(shared.prefetch, BasicQosOptions { global: false })
            .await
            .map_err(|error| BusError::transport("basic.qos", error))?;
        let tag = format!("{}:{}", shared.connection.name(), Uuid::now_v7().simple());
        let mut deliveries = channel
            .basic_consume(
                short(&self.consumer.queue)?,
                short(&tag)?,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|error| {
                BusError::transport(format!("consuming {:?}", self.consumer.queue), error)
            })?;
        if shared.subscribed.fetch_add(1, Ordering::SeqCst) + 1 == shared.consumers.len() {
            shared.health.pass();
        }
        let acks = AckSender {
            channel: &channel,
            queue: &self.consumer.queue,
        };
        let mut tracker = AckTracker::default();
        let mut running: FuturesUnordered<BoxFuture<'_, (u64, DeliveryEnd)>> =
            FuturesUnordered::new();
        // Ack when half the window is settled, or 1 ms after the loop first found nothing else
        // to do: a steady stream is acked once per half window, a lull at most 1 ms late.
        let batch = usize::from(shared.prefetch).div_ceil(2);
        let idle_flush = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(idle_flush);
        let mut flush_armed = false;
        let automatic = shared.ack_mode == AckMode::Automatic;
        // One wait for the stop across the loop: a new one per delivery would register and
        // unregister a waiter on the token, a lock each way.
        let mut stopped = std::pin::pin!(stop.cancelled());
        let lost = loop {
            if tracker.settled() >= batch {
                acks.send(tracker.take(false));
                if tracker.settled() >= batch {
                    // Half a window settled behind a call still running: ack those singly now.
                    // Waiting would shrink the window, and leaving them counted would bring
                    // this check back at once, round and round without ever awaiting.
                    acks.send(tracker.take(true));
                }
                flush_armed = false;
            }
            tokio::select! {
                biased;
                () = &mut stopped => break None,
                Some((tag, settled)) = running.next(), if !running.is_empty() => {
                    if self.settle_after_call(&mut tracker, tag, settled) {
                        // A delivery to give back is sent at once: nothing else might flush it.
                        acks.send(tracker.take(false));
                    }
                }
                // Acked as taken, a delivery no longer holds its prefetch slot: the worker
                // itself keeps to `prefetch` calls at once.
                next = deliveries.next(), if !automatic || running.len() < usize::from(shared.prefetch) => match next {
                    Some(Ok(delivery)) => {
                        tracker.received(delivery.delivery_tag);
                        if automatic {
                            // Acked before the call starts: its frame is queued now.
                            tracker.settle(delivery.delivery_tag);
                            acks.send(tracker.take(true));
                        }
                        running.push(Box::pin(self.process(delivery)));
                    }
                    // The stream fails only when the channel or connection is gone.
                    Some(Err(error)) => break Some(BusError::Connection(format!(
                        "the consumer of {:?} failed: {error}", self.consumer.queue))),
                    None => break Some(BusError::Connection(format!(
                        "the consumer of {:?} ended (connection or channel closed)",
                        self.consumer.queue
                    ))),
                },
                () = &mut idle_flush, if flush_armed => {
                    acks.send(tracker.take(true));
                    flush_armed = false;
                }
                () = std::future::ready(()), if !flush_armed && tracker.settled() > 0 => {
                    idle_flush
                        .as_mut()
                        .reset(tokio::time::Instant::now() + Duration::from_millis(1));
                    flush_armed = true;
                }
            }
        };
        if lost.is_none() {
            // Stop taking deliveries, and hand back those the broker already sent that no call
            // has started on, uncharged.
            let _ = channel
                .basic_cancel(short(&tag)?, BasicCancelOptions::default())
                .await;
            while let Ok(Some(Ok(delivery))) =
                tokio::time::timeout(Duration::from_millis(20), deliveries.next()).await
            {
                tracker.received(delivery.delivery_tag);
                let settled = self.hand_back(&delivery, &delivery.data).await;
                settle(&mut tracker, delivery.delivery_tag, settled);
                // At once: a copy is in the queue now, and the original must not come back too.
                acks.send(tracker.take(true));
            }
        }
        // Calls already running finish (up to the grace; then they are given back) and are
        // settled, even after a connection loss: their outcome is logged, and their deliveries
        // come back anyway.
        if lost.is_some() {
            self.lost.store(true, Ordering::SeqCst);
        }
        while let Some((tag, settled)) = running.next().await {
            self.settle_after_call(&mut tracker, tag, settled);
            // Singles too: a delivery handed back uncharged has a copy in the queue already.
            acks.send(tracker.take(true));
        }
        // Queued ahead of the channel's close, so every ack is written before it.
        acks.send(tracker.take(true));
        if let Some(error) = lost {
            return Err(error);
        }
        let _ = channel.close(200, "worker stopped".into()).await;
        Ok(())
    }

    /// Records how a call's delivery is settled; `true` when it is to be given back at once.
    /// Under [`AckMode::Automatic`] the delivery was acked when it was taken: one that should
    /// go back to its queue is lost instead, and said so.
    fn settle_after_call(&self, tracker: &mut AckTracker, tag: u64, settled: DeliveryEnd) -> bool {
        if self.shared.ack_mode == AckMode::Manual {
            return settle(tracker, tag, settled);
        }
        if !matches!(settled, DeliveryEnd::Ack) {
            tracing::error!(
                queue = %self.consumer.queue,
                delivery_tag = tag,
                "a delivery acked when taken (AckMode::Automatic) could not be settled and is \
                 lost (unless its ack never reached the broker, which then delivers it again): \
                 the worker stopped or lost its connection, or its retry or park could not be \
                 published"
            );
        }
        false
    }

    /// Handles one delivery to its end: called, then acked, retried or parked.
    async fn process(&self, mut delivery: Delivery) -> (u64, DeliveryEnd) {
        let tag = delivery.delivery_tag;
        let shared = self.shared;
        if self.lost.load(Ordering::SeqCst) {
            return (tag, DeliveryEnd::GiveBack);
        }
        let queue_handler = self.consumer.route.handler_name();
        // The body moves into the envelope, uncopied; from here on, a republish (retry, park,
        // hand-back) takes it from there.
        let payload = Bytes::from(std::mem::take(&mut delivery.data));
        let (envelope, verdict) = match wire::read_payload(
            &delivery,
            payload.clone(),
            &shared.exchange,
            shared.max_payload_bytes,
        ) {
            Ok(envelope) => {
                let target = match self.consumer.route.runner(&envelope.message_type) {
                    Some(slot) => Target::Slot(slot),
                    None => {
                        let missing = BusError::MissingHandler {
                            message_type: envelope.message_type.clone(),
                        };
                        tracing::warn!(
                            error = %missing,
                            message_id = %envelope.id,
                            queue = %self.consumer.queue,
                            "a delivery no handler of this worker takes"
                        );
                        Target::NoHandlerForType(queue_handler)
                    }
                };
                let redeliveries = wire::redeliveries_of(&delivery);
                if redeliveries >= u64::from(shared.delivery_limit) {
                    // One more return (a crash, a lost connection) and the broker would
                    // park it itself, with no reason and no row.
                    let verdict = shared.engine.reject(
                        target,
                        &envelope,
                        crate::reason::Reason::DELIVERY_LIMIT_REACHED,
                        format!(
                            "the broker delivered it {} times without an outcome settled \
                                 (the queue's x-delivery-limit is {}): its consumer crashed or \
                                 lost its connection each time; no call was made",
                            redeliveries.saturating_add(1),
                            shared.delivery_limit
                        ),
                        envelope.attempt.saturating_sub(1),
                    );
                    (envelope, verdict)
                } else {
                    shared
                        .engine
                        .deliver_owned(
                            target,
                            envelope,
                            self.stop,
                            self.interrupt,
                            self.ctx_publisher,
                        )
                        .await
                }
            }
            Err(unreadable) => {
                let salvaged = wire::salvage_payload(&delivery, payload, &shared.exchange);
                let attempts = salvaged.attempt;
                let verdict = shared.engine.reject(
                    Target::NoHandlerForType(queue_handler),
                    &salvaged,
                    unreadable.reason,
                    unreadable.detail,
                    attempts,
                );
                (salvaged, verdict)
            }
        };
        (tag, self.settle((delivery, envelope), verdict).await)
    }

    /// After a republish the broker refused: a second before the delivery goes back, so that a
    /// lasting refusal does not spin through the queue's delivery limit in milliseconds.
    async fn pause_before_requeue(&self) {
        tokio::select! {
            () = self.stop.cancelled() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }

    /// A publish failed and its channel is gone (the broker closes a channel after some
    /// refusals, such as a missing exchange): no retry or park can succeed any more, so the
    /// worker stops and is rebuilt, with a new channel, by its supervisor.
    fn stop_if_publisher_lost(&self) {
        if !self.publisher.is_connected() {
            tracing::error!("the channel for retries and parking is closed; stopping the worker");
            self.stop.cancel();
        }
    }

    /// Republishes to the wait tier of `delay`; acked once the broker confirmed it.
    async fn retry(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        delay: Duration,
        detail: &str,
    ) -> DeliveryEnd {
        if self.lost.load(Ordering::SeqCst) {
            // The broker delivers it again anyway: a copy in the wait tier would be a second.
            return DeliveryEnd::Requeue;
        }
        let topology = &self.shared.topology;
        let tier = topology.tier_for(delay).expect("wait tiers are not empty");
        let wait = topology.wait_queue(tier);
        let properties = wire::retry_properties(
            &delivery.properties,
            &envelope.message_type,
            envelope.attempt,
            self.property_budget(),
        );
        let publish = || {
            self.publisher.publish_raw(
                &wait,
                &self.consumer.queue,
                &envelope.payload,
                properties.clone(),
                true,
            )
        };
        let mut published = publish().await;
        if is_unroutable(&published) {
            // The wait tier is gone (deleted by hand?): declare it again and retry once.
            let exchanges: Vec<_> = topology
                .exchanges()
                .into_iter()
                .filter(|exchange| exchange.name == wait)
                .collect();
            let queues: Vec<_> = topology
                .queues()
                .into_iter()
                .filter(|queue| queue.name == wait)
                .collect();
            let bindings: Vec<_> = topology
                .bindings()
                .into_iter()
                .filter(|binding| binding.queue == wait)
                .collect();
            if ensure_topology(&self.shared.connection, &exchanges, &queues, &bindings)
                .await
                .is_ok()
            {
                published = publish().await;
            }
        }
        match published {
            Ok(()) => {
                tracing::debug!(
                    message_id = %envelope.id,
                    queue = %self.consumer.queue,
                    wait_queue = %wait,
                    retry_in = ?tier,
                    detail,
                    "retry waiting"
                );
                DeliveryEnd::Ack
            }
            Err(error) => {
                tracing::error!(
                    message_id = %envelope.id,
                    %error,
                    "could not republish a retry; the delivery goes back to its queue"
                );
                self.stop_if_publisher_lost();
                self.pause_before_requeue().await;
                DeliveryEnd::Requeue
            }
        }
    }

    /// Gives back a delivery no call started on, without charging it an attempt: a copy with
    /// the attempts made so far goes to the end of its queue (confirmed), and the delivery is
    /// acked. A plain `nack` would do on RabbitMQ 4.3 and later, but older brokers count every
    /// returned delivery in `x-delivery-count`, so each graceful shutdown would cost the
    /// messages in flight an attempt. If the copy cannot be published, the delivery is
    /// returned with `nack` (and counted there).
    async fn hand_back(&self, delivery: &Delivery, payload: &[u8]) -> DeliveryEnd {
        // Lost, the broker returns it anyway; blocked, each publish would wait for its
        // confirm timeout.
        if self.lost.load(Ordering::SeqCst)
            || self.shared.connection.is_blocked()
            || !self.publisher.is_connected()
        {
            return DeliveryEnd::GiveBack;
        }
        // The copy goes through the default exchange: a type that only its routing key gave
        // (no `type` property) would be lost on the way.
        let message_type = wire::message_type_of(delivery, &self.shared.exchange);
        // Every call made so far, the broker's redeliveries included: this delivery's own
        // attempt has not happened.
        let properties = wire::retry_properties(
            &delivery.properties,
            &message_type,
            wire::attempt_of(delivery).saturating_sub(1),
            self.property_budget(),
        );
        match self
            .publisher
            .publish_raw("", &self.consumer.queue, payload, properties, true)
            .await
        {
            Ok(()) => DeliveryEnd::Ack,
            Err(error) => {
                tracing::warn!(
                    queue = %self.consumer.queue,
                    %error,
                    "could not hand a delivery back uncharged; returning it to the broker"
                );
                DeliveryEnd::GiveBack
            }
        }
    }

    /// Publishes the message unchanged, with its reason, to the parking queue, and records it
    /// in `dead_letters` when a store is configured; acked once the park is confirmed.
    async fn park(
        &self,
        delivery: &Delivery,
        envelope: Envelope,
        info: &ParkedInfo<'_>,
    ) -> DeliveryEnd {
        let shared = self.shared;
        if self.lost.load(Ordering::SeqCst) {
            return DeliveryEnd::Requeue;
        }
        let message_id = envelope.id;
        let payload = envelope.payload.clone();
        // The row first: a delivery leaves its queue only once its reason is in
        // `dead_letters`. While the store cannot take it, the delivery waits, unacked.
        if let Some(store) = &shared.dead_letters {
            let letter = info.dead_letter(envelope, &delivery.properties);
            if !self.write_dead_letter(&**store, &letter).await {
                return DeliveryEnd::Requeue;
            }
        }
        let publish = || {
            self.publisher.publish_raw(
                "",
                &self.consumer.parking,
                &payload,
                wire::parked_properties(&delivery.properties, info, self.property_budget()),
                true,
            )
        };
        let mut published = publish().await;
        if is_unroutable(&published) {
            // The parking queue is gone (deleted by hand?): declare it again and retry once.
            let parking = shared.topology.parking_queue_layout(&self.consumer.parking);
            if ensure_topology(&shared.connection, &[], &[parking], &[])
                .await
                .is_ok()
            {
                published = publish().await;
            }
        }
        if let Err(error) = published {
            tracing::error!(
                %message_id,
                parking = %self.consumer.parking,
                %error,
                "could not park a message; the delivery goes back to its queue"
            );
            self.stop_if_publisher_lost();
            self.pause_before_requeue().await;
            return DeliveryEnd::Requeue;
        }
        tracing::debug!(
            %message_id,
            queue = %self.consumer.queue,
            parking = %self.consumer.parking,
            "message parked"
        );
        DeliveryEnd::Ack
    }

    /// Writes `letter`, trying again with backoff while the store refuses it; `false` when the
    /// worker stopped first (the delivery then goes back to its queue, and comes again).
    async fn write_dead_letter(&self, store: &dyn DeadLetterStore, letter: &DeadLetter) -> bool {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            let written = crate::store::within(
                "dead letter",
                self.shared.store_timeout,
                store.insert_dead_letter(letter),
            );
            match written.await {
                Ok(()) => return true,
                Err(error) => tracing::warn!(
                    message_id = %letter.envelope.id,
                    queue = %self.consumer.queue,
                    %error,
                    "could not write a dead letter; the delivery waits, unacked, and tries again"
                ),
            }
            tokio::select! {
                () = self.stop.cancelled() => return false,
                () = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

/// One queue's deliveries: verdicts become acks, wait-queue republishes, parks and
/// hand-backs.
impl World for ConsumeLoop<'_> {
    type Delivery = (Delivery, Envelope);
    type Settled = DeliveryEnd;

    async fn settle(
        &self,
        (delivery, envelope): (Delivery, Envelope),
        verdict: Verdict,
    ) -> DeliveryEnd {
        match verdict {
            Verdict::Ack => DeliveryEnd::Ack,
            Verdict::Retry { delay, detail, .. } => {
                self.retry(&delivery, &envelope, delay, &detail).await
            }
            Verdict::DeadLetter {
                reason,
                detail,
                calls,
            } => {
                let handler = self
                    .consumer
                    .route
                    .runner(&envelope.message_type)
                    .map(|slot| &**slot.name())
                    .or_else(|| self.consumer.route.handler_name());
                let info = ParkedInfo {
                    reason: &reason,
                    detail: &detail,
                    handler,
                    queue: &self.consumer.queue,
                    attempts: calls,
                };
                self.park(&delivery, envelope, &info).await
            }
            // The broker delivers it again, counting the delivery.
            Verdict::Abandoned => DeliveryEnd::Requeue,
            // No call (or a call the stop made fail): back with the count it came with.
            Verdict::Release => self.hand_back(&delivery, &envelope.payload).await,
        }
    }
}

/// `true` when the broker returned the message: nothing is bound where it was sent.
fn is_unroutable(published: &Result<(), BusError>) -> bool {
    matches!(published, Err(BusError::NotConfirmed { detail, .. }) if detail.contains("unroutable"))
}

/// Records how a delivery ended; `true` when it is to be given back.
fn settle(tracker: &mut AckTracker, tag: u64, settled: DeliveryEnd) -> bool {
    match settled {
        DeliveryEnd::Ack => {
            tracker.settle(tag);
            false
        }
        DeliveryEnd::Requeue => {
            tracker.requeue(tag);
            true
        }
        DeliveryEnd::GiveBack => {
            tracker.give_back(tag);
            true
        }
    }
}

/// Sends a channel's acks in the order they were decided (a `multiple` ack must never overtake
/// the one before it) without waiting for them: lapin queues a method's frame when its future
/// is first polled, and writes queued frames in order; the promise, which only says the frame
/// reached the socket, is dropped. A write that fails means the channel is gone: its unacked
/// deliveries come back, and the consumer stream ends, which stops the worker.
struct AckSender<'a> {
    channel: &'a lapin::Channel,
    queue: &'a str,
}

impl AckSender<'_> {
    fn send(&self, acks: Acks) {
        if acks.is_empty() {
            return;
        }
        let channel = self.channel;
        // `reject`, not `nack`: since RabbitMQ 4.3 a requeue by `nack` no longer increments a
        // quorum queue's `x-delivery-count`, and the attempt would not be counted.
        for tag in acks.requeue {
            self.queued(channel.basic_reject(tag, BasicRejectOptions { requeue: true }));
        }
        for tag in acks.give_back {
            let options = BasicNackOptions {
                multiple: false,
                requeue: true,
            };
            self.queued(channel.basic_nack(tag, options));
        }
        if let Some(tag) = acks.up_to {
            self.queued(channel.basic_ack(tag, BasicAckOptions { multiple: true }));
        }
        for tag in acks.singles {
            self.queued(channel.basic_ack(tag, BasicAckOptions { multiple: false }));
        }
    }

    /// Polls `method` once, which queues its frame, and lets the promise go.
    fn queued(&self, method: impl std::future::Future<Output = Result<(), lapin::Error>>) {
        if let Some(Err(error)) = method.now_or_never() {
            tracing::warn!(
                queue = %self.queue,
                %error,
                "ack not sent; the delivery will be redelivered"
            );
        }
    }
}

/// `ctx.publish` without an outbox: straight to the exchange, confirmed.
struct DirectPublisher(Arc<RabbitMqPublisher>);

impl Publish for DirectPublisher {
    fn publish_envelope(&self, envelope: Envelope) -> BoxFuture<'_, Result<Uuid, PublishError>> {
        Box::pin(async move {
            let id = envelope.id;
            self.0
                .publish(&envelope)
                .await
                .map_err(|error| PublishError::Transport(error.to_string()))?;
            Ok(id)
        })
    }
}

/// Sets [`QUEUE_DEPTH`] of each of `queues` every 10 s until `stop` fires, with a passive
/// declare on a channel of its own each time. A queue it cannot read keeps its last value.
async fn sample_queue_depths(
    connection: RabbitMqConnection,
    queues: Vec<String>,
    stop: tokio_util::sync::CancellationToken,
) {
    let gauges: Vec<(&str, metrics::Gauge)> = queues
        .iter()
        .map(|queue| {
            (
                queue.as_str(),
                metrics::gauge!(crate::metrics::QUEUE_DEPTH, "queue" => queue.clone()),
            )
        })
        .collect();
    loop {
        for (queue, gauge) in &gauges {
            match crate::rabbitmq::topology::inspect_queue(&connection, queue).await {
                Ok(Some((messages, _))) => gauge.set(f64::from(messages)),
                Ok(None) => {}
                Err(error) => tracing::debug!(%error, queue, "could not read the queue's depth"),
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
}
