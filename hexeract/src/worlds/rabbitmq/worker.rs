//! [`RabbitMqWorker`]: consumes handler queues, acks after the outcome, retries through the
//! wait queues and parks what cannot be handled.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::{join_all, try_join_all, BoxFuture, FutureExt};
use futures_util::stream::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::FieldTable;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::dead_letter::DeadLetter;
use crate::delivery::{Engine, Policy, Slot, Verdict};
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
use crate::reason::Reason;
use crate::registry::RegisteredHandler;
use crate::retry::Backoff;
use crate::store::DeadLetterStore;
use crate::worker::feed::{Arrival, Feed, Pace, Pass, Refill, Refusal, Row, Started, To, Worker};
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
        // Each queue's handlers, as its loop counts them (`To::Slot`).
        let consumers: Vec<(QueueConsumer, Vec<Slot>)> = match &source.queue {
            Some(queue) => {
                let mut by_type = HashMap::new();
                let mut slots = Vec::new();
                for info in registry.handlers() {
                    let handler = registry.get(&info.name).expect("listed");
                    if by_type
                        .insert(info.message_type.to_owned(), slots.len())
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
                    slots.push(runner(handler));
                }
                let consumer = QueueConsumer {
                    parking: source
                        .dead_letter_routing_key
                        .clone()
                        .unwrap_or_else(|| parking_queue(queue)),
                    queue: queue.clone(),
                    route: Route::ByType(by_type),
                };
                vec![(consumer, slots)]
            }
            None => topology
                .handler_queues()
                .into_iter()
                .map(|place| {
                    let handler = registry.get(&place.handler).expect("listed");
                    let consumer = QueueConsumer {
                        queue: place.queue,
                        parking: place.parking,
                        route: Route::One {
                            message_type: place.message_type,
                        },
                    };
                    (consumer, vec![runner(handler)])
                })
                .collect(),
        };
        for info in registry.handlers() {
            tracing::debug!(handler = %info.name, message_type = info.message_type, "bus handler");
        }
        let prefetch = u16::try_from(policy.prefetch).expect("checked above");
        let shared = Arc::new(Shared {
            connection: source.connection,
            topology,
            exchange: source.exchange,
            prefetch,
            max_payload_bytes: policy.max_payload_bytes,
            shutdown_grace: policy.shutdown_grace,
            confirm_timeout: source.confirm_timeout,
            delivery_limit: source.delivery_limit,
            ack_mode: source.ack_mode,
            declare: source.declare,
            dead_letters: source.dead_letters,
            store_timeout: policy.store_timeout,
            publisher: source.publisher,
            health: health.clone(),
        });
        let engine = Engine::new(policy.retry, policy.max_payload_bytes, "rabbitmq");
        // A push feed: a pass waits for the broker's next deliveries, and each call that ends
        // makes room for the next (the broker's prefetch bounds them first).
        // A pass with no room (every place taken) is followed by the next when a call ends:
        // the poll interval only bounds how long an idle loop sleeps.
        let pace = Pace {
            poll_interval: Duration::from_secs(1),
            busy_delay: Duration::ZERO,
            batch_size: u32::from(prefetch),
            shutdown_grace: policy.shutdown_grace,
            refill: Refill::WhenAnyEnds,
        };
        let queues = consumers
            .into_iter()
            .map(|(consumer, slots)| {
                let feed = QueueFeed::new(shared.clone(), consumer);
                Worker::new(feed, slots, engine.clone(), pace, health.clone())
            })
            .collect();
        Ok(RabbitMqWorker { shared, queues })
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
/// flight, and runs on the one loop every world shares. A delivery is acked only once its
/// outcome is settled: after the handler succeeded, after its retry was republished to a wait
/// queue and confirmed, or after it was parked and the park confirmed. Acks are coalesced with
/// `multiple`.
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
    /// One loop per queue.
    queues: Vec<Worker<QueueFeed>>,
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

/// What every queue of the worker shares.
struct Shared {
    connection: RabbitMqConnection,
    topology: Topology,
    exchange: String,
    prefetch: u16,
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
}

struct QueueConsumer {
    queue: String,
    parking: String,
    route: Route,
}

/// Which of a queue's handlers a delivery is for.
enum Route {
    /// A handler's own queue: its handler is the loop's only one.
    One { message_type: String },
    /// A queue of several types, each to its handler (by its place among the loop's).
    ByType(HashMap<String, usize>),
}

impl Route {
    fn to(&self, message_type: &str) -> To {
        match self {
            Route::One { message_type: own } if own == message_type => To::Slot(0),
            Route::One { .. } => To::QueueOf(0),
            Route::ByType(slots) => slots
                .get(message_type)
                .map_or(To::Nobody, |&slot| To::Slot(slot)),
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
            .field("queues", &self.queues())
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
        self.queues
            .iter()
            .map(|worker| worker.feed().consumer.queue.as_str())
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
        let shared = self.shared.clone();
        let result = crate::delivery::stop_by_deadline(
            "RabbitMQ worker",
            &cancel,
            shared.shutdown_grace,
            self.serve(cancel.clone()),
        )
        .await;
        if let Err(error) = &result {
            shared.health.fail(error);
        }
        result
    }

    async fn serve(self, cancel: CancellationToken) -> Result<(), BusError> {
        let shared = &*self.shared;
        let connection = shared.connection.clone();
        shared.health.watch("connection.blocked", move || {
            connection.is_blocked().then(|| {
                "the broker blocked the connection (connection.blocked: a memory or disk \
                 alarm); retries and parking wait"
                    .to_owned()
            })
        });
        if self.queues.is_empty() {
            tracing::info!("RabbitMQ worker has no handlers; idle until cancelled");
            shared.health.pass();
            cancel.cancelled().await;
            return Ok(());
        }
        if shared.declare {
            self.declare().await?;
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
        // Ready once every queue's consumer is subscribed.
        let subscribed = try_join_all(self.queues.iter().map(|worker| {
            worker
                .feed()
                .subscribe(publisher.clone(), ctx_publisher.clone())
        }))
        .await;
        if let Err(error) = subscribed {
            // The queues subscribed already give back what the broker sent them, uncharged.
            join_all(
                self.queues
                    .iter()
                    .map(|worker| worker.feed().close(Vec::new())),
            )
            .await;
            return Err(error);
        }
        shared.health.pass();
        tracing::info!(
            queues = self.queues.len(),
            connection = shared.connection.name(),
            "RabbitMQ worker started"
        );
        // One queue's loss (or the publisher's) stops the others: the worker is rebuilt as a
        // whole. The shutdown grace runs from either stop.
        let stop = cancel.child_token();
        let depths = tokio::spawn(sample_queue_depths(
            shared.connection.clone(),
            self.queues().into_iter().map(str::to_owned).collect(),
            stop.clone(),
        ));
        join_all(
            self.queues
                .iter()
                .map(|worker| worker.clone().run(stop.clone())),
        )
        .await;
        depths.abort();
        if cancel.is_cancelled() {
            tracing::info!("RabbitMQ worker stopped");
            return Ok(());
        }
        let error = self
            .queues
            .iter()
            .find_map(|worker| worker.feed().lost_to())
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
        let shared = &*self.shared;
        let consumer = &self.queues[0].feed().consumer;
        match consumer.route {
            Route::ByType(_) => {
                // The queue is the application's, and so is the parking queue when it exists
                // already: both are only checked, passively, never declared again with
                // arguments of ours. The wait tiers are the worker's.
                if !queue_exists(&shared.connection, &consumer.queue).await? {
                    return Err(BusError::Transport {
                        operation: format!("consuming queue {:?}", consumer.queue),
                        detail: "it does not exist: with queue(…) the application declares \
                                 its queue (ensure_topology) before the worker runs"
                            .to_owned(),
                    });
                }
                if !queue_exists(&shared.connection, &consumer.parking).await? {
                    let parking = shared.topology.parking_queue_layout(&consumer.parking);
                    match ensure_topology(&shared.connection, &[], &[parking], &[]).await {
                        // Declared meanwhile, with arguments of its own (the application, or
                        // another replica): it is theirs, and it is there.
                        Err(BusError::Mismatch { .. })
                            if queue_exists(&shared.connection, &consumer.parking).await? => {}
                        declared => declared?,
                    }
                }
                let exchanges = shared.topology.exchanges();
                let wait_tier = |queue: &Queue| queue.message_ttl.is_some();
                let queues: Vec<Queue> = shared
                    .topology
                    .queues()
                    .into_iter()
                    .filter(wait_tier)
                    .collect();
                let bindings: Vec<_> = shared
                    .topology
                    .bindings()
                    .into_iter()
                    .filter(|binding| binding.exchange != shared.exchange)
                    .collect();
                ensure_topology(&shared.connection, &exchanges, &[], &[]).await?;
                shared
                    .topology
                    .upgrade(&shared.connection, wait_tier)
                    .await?;
                ensure_topology(&shared.connection, &exchanges, &queues, &bindings).await
            }
            Route::One { .. } => shared.topology.declare(&shared.connection).await,
        }
    }
}

/// One queue's half of the worker: its consumer's deliveries in, verdicts out as acks,
/// wait-queue republishes, parks and hand-backs.
struct QueueFeed {
    shared: Arc<Shared>,
    consumer: QueueConsumer,
    /// This run's channel and publishers, once subscribed.
    consuming: OnceLock<Consuming>,
    /// The consumer's deliveries, held by the pass that waits for them; `None` once the
    /// consumer is cancelled.
    deliveries: Mutex<Option<lapin::Consumer>>,
    /// Which deliveries are settled, and the fewest acks that say so.
    tracker: Mutex<AckTracker>,
    /// A delivery was settled: the pass under way acks it within a millisecond.
    settled: Notify,
    /// The consumer's stream ended: its acks can no longer reach the broker, so nothing more
    /// is started, retried or parked (the broker delivers every unacked delivery again).
    lost: AtomicBool,
    /// Why the stream ended.
    lost_to: Mutex<Option<BusError>>,
    /// The consumer is cancelled: the broker sends it nothing more.
    cancelled: tokio::sync::OnceCell<()>,
}

/// A queue's run: its channel and consumer tag, and where retries, parks and `ctx.publish` go.
struct Consuming {
    channel: lapin::Channel,
    tag: String,
    publisher: Arc<RabbitMqPublisher>,
    ctx_publisher: Arc<dyn Publish>,
}

/// A delivery as the loop holds it (its body moved into the envelope).
struct Taken {
    delivery: Delivery,
    /// Acked already, as it was taken ([`AckMode::Automatic`]).
    acked: bool,
}

impl QueueFeed {
    fn new(shared: Arc<Shared>, consumer: QueueConsumer) -> QueueFeed {
        QueueFeed {
            shared,
            consumer,
            consuming: OnceLock::new(),
            deliveries: Mutex::new(None),
            tracker: Mutex::new(AckTracker::default()),
            settled: Notify::new(),
            lost: AtomicBool::new(false),
            lost_to: Mutex::new(None),
            cancelled: tokio::sync::OnceCell::new(),
        }
    }

    /// Opens the queue's channel and subscribes its consumer.
    async fn subscribe(
        &self,
        publisher: Arc<RabbitMqPublisher>,
        ctx_publisher: Arc<dyn Publish>,
    ) -> Result<(), BusError> {
        let shared = &*self.shared;
        let queue = &self.consumer.queue;
        let channel = shared.connection.channel().await?;
        channel
            .basic_qos(shared.prefetch, BasicQosOptions { global: false })
            .await
            .map_err(|error| BusError::transport("basic.qos", error))?;
        let tag = format!("{}:{}", shared.connection.name(), Uuid::now_v7().simple());
        let deliveries = channel
            .basic_consume(
                short(queue)?,
                short(&tag)?,
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|error| BusError::transport(format!("consuming {queue:?}"), error))?;
        *lock(&self.deliveries) = Some(deliveries);
        let consuming = Consuming {
            channel,
            tag,
            publisher,
            ctx_publisher,
        };
        if self.consuming.set(consuming).is_err() {
            unreachable!("a worker runs once: run takes it by value");
        }
        Ok(())
    }

    fn consuming(&self) -> &Consuming {
        self.consuming
            .get()
            .expect("subscribed before the loop runs")
    }

    fn publisher(&self) -> &RabbitMqPublisher {
        &self.consuming().publisher
    }

    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Why the consumer's stream ended, when it did.
    fn lost_to(&self) -> Option<BusError> {
        lock(&self.lost_to).take()
    }

    /// The stream ended without a cancellation: the worker stops (every queue of it).
    fn lose(&self, error: BusError, stop: &CancellationToken) {
        self.lost.store(true, Ordering::SeqCst);
        *lock(&self.lost_to) = Some(error);
        stop.cancel();
    }

    /// The bytes of properties a copy this queue republishes may take (see
    /// [`wire::property_budget`]).
    fn property_budget(&self) -> usize {
        wire::property_budget(self.shared.connection.lapin().configuration().frame_max())
    }

    /// Sends the acks the tracker holds. With `now` false, settled deliveries wait for half a
    /// window or the pass's next millisecond; those behind a call still running wait for it.
    fn flush(&self, tracker: &mut AckTracker, now: bool) {
        let acks = AckSender {
            channel: &self.consuming().channel,
            queue: &self.consumer.queue,
        };
        if now {
            acks.send(tracker.take(true));
            return;
        }
        let batch = usize::from(self.shared.prefetch).div_ceil(2);
        if tracker.settled() >= batch {
            acks.send(tracker.take(false));
            if tracker.settled() >= batch {
                // Half a window settled behind a call still running: ack those singly now.
                // Waiting would shrink the window.
                acks.send(tracker.take(true));
            }
        } else if tracker.settled() == 1 {
            // The first one since the last ack: the pass under way (or the next) acks it
            // within a millisecond, with whatever settles meanwhile.
            self.settled.notify_one();
        }
    }

    /// Records how a delivery ended: acked with others of its window, or given back at once
    /// (`now`: a copy of it is in the queue already, and the original must not come back
    /// too). One acked as it was taken ([`AckMode::Automatic`]) that should go back is lost
    /// instead, and said so.
    fn record(&self, taken: &Taken, end: DeliveryEnd, now: bool) {
        let tag = taken.delivery.delivery_tag;
        if taken.acked {
            if !matches!(end, DeliveryEnd::Ack) {
                tracing::error!(
                    queue = %self.consumer.queue,
                    delivery_tag = tag,
                    "a delivery acked when taken (AckMode::Automatic) could not be settled and \
                     is lost (unless its ack never reached the broker, which then delivers it \
                     again): the worker stopped or lost its connection, or its retry or park \
                     could not be published"
                );
            }
            return;
        }
        let mut tracker = lock(&self.tracker);
        let now = match end {
            DeliveryEnd::Ack => {
                tracker.settle(tag);
                now
            }
            DeliveryEnd::Requeue => {
                tracker.requeue(tag);
                true
            }
            DeliveryEnd::GiveBack => {
                tracker.give_back(tag);
                true
            }
        };
        self.flush(&mut tracker, now);
    }

    /// Deliveries as the loop takes them: counted as received (and, under
    /// [`AckMode::Automatic`], acked now, `ack_now`), their bodies read.
    fn arrivals(&self, taken: Vec<Delivery>, ack_now: bool) -> Vec<Arrival<Taken>> {
        {
            let mut tracker = lock(&self.tracker);
            for delivery in &taken {
                tracker.received(delivery.delivery_tag);
                if ack_now {
                    tracker.settle(delivery.delivery_tag);
                }
            }
            if ack_now {
                // Acked before the calls start: the frames are queued now.
                self.flush(&mut tracker, true);
            }
        }
        taken
            .into_iter()
            .map(|delivery| self.arrival(delivery, ack_now))
            .collect()
    }

    fn arrival(&self, mut delivery: Delivery, acked: bool) -> Arrival<Taken> {
        let shared = &*self.shared;
        // The body moves into the envelope, uncopied; from here on, a republish (retry, park,
        // hand-back) takes it from there.
        let payload = Bytes::from(std::mem::take(&mut delivery.data));
        let read = wire::read_payload(
            &delivery,
            payload.clone(),
            &shared.exchange,
            shared.max_payload_bytes,
        );
        let (envelope, to, refused) = match read {
            Ok(envelope) => {
                let to = self.consumer.route.to(&envelope.message_type);
                if !matches!(to, To::Slot(_)) {
                    let missing = BusError::MissingHandler {
                        message_type: envelope.message_type.clone(),
                    };
                    tracing::warn!(
                        error = %missing,
                        message_id = %envelope.id,
                        queue = %self.consumer.queue,
                        "a delivery no handler of this worker takes"
                    );
                }
                let redeliveries = wire::redeliveries_of(&delivery);
                // One more return (a crash, a lost connection) and the broker would park it
                // itself, with no reason and no row.
                let refused = (redeliveries >= u64::from(shared.delivery_limit)).then(|| Refusal {
                    reason: Reason::DELIVERY_LIMIT_REACHED,
                    detail: format!(
                        "the broker delivered it {} times without an outcome settled (the \
                         queue's x-delivery-limit is {}): its consumer crashed or lost its \
                         connection each time; no call was made",
                        redeliveries.saturating_add(1),
                        shared.delivery_limit
                    ),
                    calls: envelope.attempt.saturating_sub(1),
                });
                (envelope, to, refused)
            }
            Err(unreadable) => {
                let salvaged = wire::salvage_payload(&delivery, payload, &shared.exchange);
                let refused = Refusal {
                    reason: unreadable.reason,
                    detail: unreadable.detail,
                    calls: salvaged.attempt,
                };
                // Its dead letter names the handler of the type it claims, if any.
                let to = self.consumer.route.to(&salvaged.message_type);
                (salvaged, to, Some(refused))
            }
        };
        Arrival {
            claim: Taken { delivery, acked },
            to,
            envelope: Arc::new(envelope),
            recovered: false,
            refused,
        }
    }

    /// Takes the deliveries the consumer holds already, up to `room`, without waiting; the
    /// stream's end or failure, if that is what it holds.
    fn take_ready(
        &self,
        deliveries: &mut lapin::Consumer,
        room: usize,
        taken: &mut Vec<Delivery>,
    ) -> Option<BusError> {
        while taken.len() < room {
            match deliveries.next().now_or_never() {
                Some(Some(Ok(delivery))) => taken.push(delivery),
                None => return None,
                Some(Some(Err(error))) => return Some(self.ended(Some(error))),
                Some(None) => return Some(self.ended(None)),
            }
        }
        None
    }

    /// The consumer's stream failed (`error`) or ended: it does only when the channel or the
    /// connection is gone.
    fn ended(&self, error: Option<lapin::Error>) -> BusError {
        let queue = &self.consumer.queue;
        BusError::Connection(match error {
            Some(error) => format!("the consumer of {queue:?} failed: {error}"),
            None => format!("the consumer of {queue:?} ended (connection or channel closed)"),
        })
    }

    /// Takes the deliveries there are, up to `room`, waiting for the first when there are none;
    /// meanwhile sends the acks of deliveries settled, a millisecond after the first (a steady
    /// stream is acked once per half window by the settles themselves). On `stop`, cancels
    /// the consumer and takes what the broker had sent already, to be given back.
    async fn receive(
        &self,
        deliveries: &mut lapin::Consumer,
        room: usize,
        stop: &CancellationToken,
    ) -> Received {
        let mut taken = Vec::with_capacity(room.min(8));
        // Under load the consumer holds deliveries already, and most passes end here: no
        // timer armed, no waiter registered.
        if !stop.is_cancelled() {
            let lost = self.take_ready(deliveries, room, &mut taken);
            match lost {
                Some(lost) => return Received::Lost(taken, lost),
                None if !taken.is_empty() => return Received::Taken(taken),
                None => {}
            }
        }
        let mut flush = None;
        // Settled before this pass began: their notice may have gone to an earlier pass.
        let mut check = true;
        loop {
            if flush.is_none() && std::mem::take(&mut check) && lock(&self.tracker).settled() > 0 {
                flush = Some(Box::pin(tokio::time::sleep(Duration::from_millis(1))));
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => {
                    // Boxed: a pass's future need not carry the cancel's (rare) state.
                    Box::pin(self.cancel_consumer(deliveries, &mut taken)).await;
                    return Received::Stopped(taken);
                }
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => {
                        taken.push(delivery);
                        return match self.take_ready(deliveries, room, &mut taken) {
                            None => Received::Taken(taken),
                            Some(lost) => Received::Lost(taken, lost),
                        };
                    }
                    Some(Err(error)) => return Received::Lost(taken, self.ended(Some(error))),
                    None => return Received::Lost(taken, self.ended(None)),
                },
                () = async { flush.as_mut().expect("armed").await }, if flush.is_some() => {
                    self.flush(&mut lock(&self.tracker), true);
                    flush = None;
                }
                () = self.settled.notified(), if flush.is_none() => check = true,
            }
        }
    }

    /// Cancels the consumer, once: the broker sends it nothing more. Done before any copy of
    /// a delivery is handed back to the queue, which would otherwise come back to this very
    /// consumer.
    async fn cancel(&self) {
        self.cancelled
            .get_or_init(|| async {
                let consuming = self.consuming();
                if let Ok(tag) = short(&consuming.tag) {
                    let _ = consuming
                        .channel
                        .basic_cancel(tag, BasicCancelOptions::default())
                        .await;
                }
            })
            .await;
    }

    /// Stops taking deliveries, and takes those the broker already sent that no call has
    /// started on (to be given back uncharged).
    async fn cancel_consumer(&self, deliveries: &mut lapin::Consumer, taken: &mut Vec<Delivery>) {
        self.cancel().await;
        while let Ok(Some(Ok(delivery))) =
            tokio::time::timeout(Duration::from_millis(20), deliveries.next()).await
        {
            taken.push(delivery);
        }
    }

    /// After a republish the broker refused: a second before the delivery goes back, so that a
    /// lasting refusal does not spin through the queue's delivery limit in milliseconds.
    async fn pause_before_requeue(stop: &CancellationToken) {
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }

    /// A publish failed and its channel is gone (the broker closes a channel after some
    /// refusals, such as a missing exchange): no retry or park can succeed any more, so the
    /// worker stops and is rebuilt, with a new channel, by its supervisor.
    fn stop_if_publisher_lost(&self, stop: &CancellationToken) {
        if !self.publisher().is_connected() {
            tracing::error!("the channel for retries and parking is closed; stopping the worker");
            stop.cancel();
        }
    }

    /// Republishes to the wait tier of `delay`; acked once the broker confirmed it.
    async fn retry(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        delay: Duration,
        detail: &str,
        stop: &CancellationToken,
    ) -> DeliveryEnd {
        if self.is_lost() {
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
            self.publisher().publish_raw(
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
                self.stop_if_publisher_lost(stop);
                Self::pause_before_requeue(stop).await;
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
    async fn hand_back_one(&self, delivery: &Delivery, payload: &[u8]) -> DeliveryEnd {
        // Lost, the broker returns it anyway; blocked, each publish would wait for its
        // confirm timeout.
        if self.is_lost() || self.shared.connection.is_blocked() || !self.publisher().is_connected()
        {
            return DeliveryEnd::GiveBack;
        }
        self.cancel().await;
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
            .publisher()
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
        stop: &CancellationToken,
    ) -> DeliveryEnd {
        let shared = &*self.shared;
        if self.is_lost() {
            return DeliveryEnd::Requeue;
        }
        let message_id = envelope.id;
        let payload = envelope.payload.clone();
        // The row first: a delivery leaves its queue only once its reason is in
        // `dead_letters`. While the store cannot take it, the delivery waits, unacked.
        if let Some(store) = &shared.dead_letters {
            let letter = info.dead_letter(envelope, &delivery.properties);
            if !self.write_dead_letter(&**store, &letter, stop).await {
                return DeliveryEnd::Requeue;
            }
        }
        let publish = || {
            self.publisher().publish_raw(
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
            self.stop_if_publisher_lost(stop);
            Self::pause_before_requeue(stop).await;
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
    async fn write_dead_letter(
        &self,
        store: &dyn DeadLetterStore,
        letter: &DeadLetter,
        stop: &CancellationToken,
    ) -> bool {
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
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

/// What a pass's wait for deliveries ended with.
enum Received {
    Taken(Vec<Delivery>),
    /// The worker was told to stop: the consumer is cancelled, and these were sent before.
    Stopped(Vec<Delivery>),
    /// The stream ended or failed, after these.
    Lost(Vec<Delivery>, BusError),
}

impl Feed for QueueFeed {
    type Claim = Taken;
    type Error = BusError;
    const NAME: &'static str = "RabbitMQ worker";
    // The worker logs its own start and stop, once for every queue.
    const ANNOUNCED: bool = false;

    async fn start(&self) -> Result<Started, BusError> {
        Ok(Started {
            wake: None,
            publisher: self.consuming().ctx_publisher.clone(),
        })
    }

    /// Acks go out with the settles themselves (`acks` is always empty): a pass may wait for
    /// a delivery as long as the queue is empty.
    async fn pass(
        &self,
        _acks: Vec<Taken>,
        room: u32,
        stop: &CancellationToken,
    ) -> Result<Pass<Taken>, BusError> {
        let room = usize::try_from(room).unwrap_or(usize::MAX);
        let taken = lock(&self.deliveries).take();
        let Some(mut deliveries) = taken else {
            // Cancelled already: the worker is stopping.
            return Ok(Pass::of(Vec::new()));
        };
        if room == 0 {
            // Every place is taken: what is settled goes out now, and the next call to end
            // starts the next pass.
            self.flush(&mut lock(&self.tracker), true);
            *lock(&self.deliveries) = Some(deliveries);
            return Ok(Pass::of(Vec::new()));
        }
        let received = self.receive(&mut deliveries, room, stop).await;
        let automatic = self.shared.ack_mode == AckMode::Automatic;
        let arrivals = match received {
            Received::Taken(taken) => {
                *lock(&self.deliveries) = Some(deliveries);
                self.arrivals(taken, automatic)
            }
            // The loop gives these back: a copy of each goes to the end of the queue.
            Received::Stopped(taken) => self.arrivals(taken, false),
            Received::Lost(taken, error) => {
                self.lose(error, stop);
                self.arrivals(taken, false)
            }
        };
        Ok(Pass::of(arrivals))
    }

    async fn settle(
        &self,
        taken: &Taken,
        handler: Option<&str>,
        envelope: Arc<Envelope>,
        verdict: Verdict,
        stop: &CancellationToken,
    ) -> Result<Row, BusError> {
        // Every call's future holds its settle's: the republishes of the rarer verdicts are
        // boxed, so that a call that acks neither carries nor allocates them.
        if stop.is_cancelled() {
            // Stopping with no pass under way to cancel the consumer: the broker would refill
            // each place this call frees, only for the delivery to be handed back.
            Box::pin(self.cancel()).await;
        }
        let delivery = &taken.delivery;
        let end = match verdict {
            Verdict::Ack => DeliveryEnd::Ack,
            Verdict::Retry { delay, detail, .. } => {
                Box::pin(self.retry(delivery, &envelope, delay, &detail, stop)).await
            }
            Verdict::DeadLetter {
                reason,
                detail,
                calls,
            } => {
                let info = ParkedInfo {
                    reason: &reason,
                    detail: &detail,
                    handler,
                    queue: &self.consumer.queue,
                    attempts: calls,
                };
                let envelope = Arc::unwrap_or_clone(envelope);
                Box::pin(self.park(delivery, envelope, &info, stop)).await
            }
            // The broker delivers it again, counting the delivery.
            Verdict::Abandoned => DeliveryEnd::Requeue,
            // No call (or a call the stop made fail): back with the count it came with.
            Verdict::Release => Box::pin(self.hand_back_one(delivery, &envelope.payload)).await,
        };
        self.record(taken, end, false);
        Ok(Row::Settled)
    }

    async fn hand_back(&self, arrivals: Vec<Arrival<Taken>>) -> Result<(), BusError> {
        for arrival in arrivals {
            let end = self
                .hand_back_one(&arrival.claim.delivery, &arrival.envelope.payload)
                .await;
            self.record(&arrival.claim, end, true);
        }
        Ok(())
    }

    /// Cancels the consumer if no pass did (the stop came while none was waiting), gives back
    /// what the broker had sent, acks what is settled, and closes the channel.
    async fn close(&self, _acks: Vec<Taken>) -> Result<(), BusError> {
        if self.consuming.get().is_none() {
            // Never subscribed.
            return Ok(());
        }
        let deliveries = lock(&self.deliveries).take();
        if let Some(mut deliveries) = deliveries {
            if !self.is_lost() {
                let mut taken = Vec::new();
                self.cancel_consumer(&mut deliveries, &mut taken).await;
                let arrivals = self.arrivals(taken, false);
                self.hand_back(arrivals).await?;
            }
        }
        // Queued ahead of the channel's close, so every ack is written before it.
        self.flush(&mut lock(&self.tracker), true);
        if !self.is_lost() {
            let _ = self
                .consuming()
                .channel
                .close(200, "worker stopped".into())
                .await;
        }
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `true` when the broker returned the message: nothing is bound where it was sent.
fn is_unroutable(published: &Result<(), BusError>) -> bool {
    matches!(published, Err(BusError::NotConfirmed { detail, .. }) if detail.contains("unroutable"))
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
                .map_err(|error| PublishError::Transport(error.into()))?;
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
