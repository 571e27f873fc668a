//! The worlds the delivery contract runs in, behind one small trait: each makes a place of its
//! own (store, schema, broker prefix, topic prefix), starts its worker with a test's handlers
//! and knobs (its state and middleware among them), publishes, says when nothing is owed any
//! more, reads its dead letters and stops.

use std::fmt::Display;
use std::future::Future;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hexeract::kafka::{KafkaRelay, KafkaSource, KafkaWorker};
use hexeract::outbox::{OutboxSource, OutboxWorker};
use hexeract::rabbitmq::{
    RabbitMqConnection, RabbitMqPublisher, RabbitMqSource, RabbitMqWorkerBuilder, Topology,
};
use hexeract::schedule::ScheduleSource;
use hexeract::store::postgres::PgStore;
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::DeliveryStore;
use hexeract::store::Store;
use hexeract::worker::{MessageSource, Source};
use hexeract::{
    CancellationToken, Context, DeadLetter, Envelope, HandlerOutcome, InMemoryStore, MemorySource,
    MemoryWorker, Middleware, Next, Registry, WorkerBuilder,
};
use hexeract_tests::amqp::TestBroker;
use hexeract_tests::kafka::TestKafka;
use hexeract_tests::pg::TestSchema;
use lapin::BasicProperties;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::support::WITHIN;

/// The knobs a scenario sets; every world's builder gets the same.
#[derive(Clone, Debug)]
pub(crate) struct Knobs {
    /// Handler calls per message in all (RabbitMQ's `max_attempts`).
    pub(crate) max_deliveries: u32,
    /// First and longest retry delay (on RabbitMQ the wait tiers follow them: the builder's
    /// default tiers are these delays doubling).
    pub(crate) retry_delays: (Duration, Duration),
    pub(crate) handler_timeout: Duration,
    pub(crate) max_payload_bytes: usize,
    /// The state and middleware given to the builder (none unless the scenario gives some).
    pub(crate) equipment: Equipment,
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            max_deliveries: 3,
            retry_delays: (Duration::from_millis(20), Duration::from_millis(80)),
            handler_timeout: Duration::from_secs(10),
            max_payload_bytes: 1024 * 1024,
            equipment: Equipment::default(),
        }
    }
}

/// What a scenario gives a worker's builder besides its handlers and knobs: values with
/// `.state(value)`, middleware with `.middleware(m)` and `.middleware_for(handler, m)`, each
/// given in the order written to the one builder every world (and the scheduler) has, at every
/// start.
#[derive(Clone, Default)]
pub(crate) struct Equipment {
    steps: Vec<Arc<dyn Step>>,
}

/// One thing given to a builder, written once for the builder of any world: a generic method,
/// which a trait object cannot carry, so [`Step`] carries it for each source.
trait Give: Send + Sync + 'static {
    fn give<S: Source>(&self, builder: WorkerBuilder<S>) -> WorkerBuilder<S>;
}

/// [`Give`] as a trait object: its one generic method, at each source the suite builds.
pub(crate) trait Step: Send + Sync {
    fn memory(&self, builder: WorkerBuilder<MemorySource>) -> WorkerBuilder<MemorySource>;
    fn outbox(&self, builder: WorkerBuilder<OutboxSource>) -> WorkerBuilder<OutboxSource>;
    fn rabbitmq(&self, builder: WorkerBuilder<RabbitMqSource>) -> WorkerBuilder<RabbitMqSource>;
    fn kafka(&self, builder: WorkerBuilder<KafkaSource>) -> WorkerBuilder<KafkaSource>;
    fn schedule(&self, builder: WorkerBuilder<ScheduleSource>) -> WorkerBuilder<ScheduleSource>;
}

impl<G: Give> Step for G {
    fn memory(&self, builder: WorkerBuilder<MemorySource>) -> WorkerBuilder<MemorySource> {
        self.give(builder)
    }
    fn outbox(&self, builder: WorkerBuilder<OutboxSource>) -> WorkerBuilder<OutboxSource> {
        self.give(builder)
    }
    fn rabbitmq(&self, builder: WorkerBuilder<RabbitMqSource>) -> WorkerBuilder<RabbitMqSource> {
        self.give(builder)
    }
    fn kafka(&self, builder: WorkerBuilder<KafkaSource>) -> WorkerBuilder<KafkaSource> {
        self.give(builder)
    }
    fn schedule(&self, builder: WorkerBuilder<ScheduleSource>) -> WorkerBuilder<ScheduleSource> {
        self.give(builder)
    }
}

/// A source whose builder [`Equipment`] gives to: which of [`Step`]'s methods is its.
pub(crate) trait Equippable: Source + Sized {
    fn take(step: &dyn Step, builder: WorkerBuilder<Self>) -> WorkerBuilder<Self>;
}

macro_rules! equippable {
    ($source:ty, $method:ident) => {
        impl Equippable for $source {
            fn take(step: &dyn Step, builder: WorkerBuilder<$source>) -> WorkerBuilder<$source> {
                step.$method(builder)
            }
        }
    };
}

equippable!(MemorySource, memory);
equippable!(OutboxSource, outbox);
equippable!(RabbitMqSource, rabbitmq);
equippable!(KafkaSource, kafka);
equippable!(ScheduleSource, schedule);

/// `.state(value)`.
struct GiveState<T>(T);

impl<T: Clone + Send + Sync + 'static> Give for GiveState<T> {
    fn give<S: Source>(&self, builder: WorkerBuilder<S>) -> WorkerBuilder<S> {
        builder.state(self.0.clone())
    }
}

/// `.middleware(m)`, or `.middleware_for(handler, m)`.
struct GiveMiddleware<M> {
    handler: Option<String>,
    middleware: Arc<M>,
}

impl<M: Middleware> Give for GiveMiddleware<M> {
    fn give<S: Source>(&self, builder: WorkerBuilder<S>) -> WorkerBuilder<S> {
        let middleware = Shared(self.middleware.clone());
        match &self.handler {
            Some(handler) => builder.middleware_for(handler.clone(), middleware),
            None => builder.middleware(middleware),
        }
    }
}

impl Equipment {
    /// `.state(value)`: a clone of `value` at each start.
    pub(crate) fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Equipment {
        self.steps.push(Arc::new(GiveState(value)));
        self
    }

    /// `.middleware(middleware)`: around every handler, inside the middleware given before.
    pub(crate) fn middleware(mut self, middleware: impl Middleware) -> Equipment {
        self.steps.push(Arc::new(GiveMiddleware {
            handler: None,
            middleware: Arc::new(middleware),
        }));
        self
    }

    /// `.middleware_for(handler, middleware)`: around that handler (or job) alone, inside the
    /// worker's middleware.
    pub(crate) fn middleware_for(
        mut self,
        handler: &str,
        middleware: impl Middleware,
    ) -> Equipment {
        self.steps.push(Arc::new(GiveMiddleware {
            handler: Some(handler.to_owned()),
            middleware: Arc::new(middleware),
        }));
        self
    }

    /// `builder` with everything given to it, in order.
    pub(crate) fn give<S: Equippable>(&self, builder: WorkerBuilder<S>) -> WorkerBuilder<S> {
        self.steps
            .iter()
            .fold(builder, |builder, step| S::take(&**step, builder))
    }
}

impl std::fmt::Debug for Equipment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Equipment")
            .field("steps", &self.steps.len())
            .finish()
    }
}

/// A middleware given at every start of a world: each builder gets a handle on the one value.
struct Shared<M>(Arc<M>);

impl<M: Middleware> Middleware for Shared<M> {
    fn handle(&self, ctx: &Context, next: Next<'_>) -> impl Future<Output = HandlerOutcome> + Send {
        self.0.handle(ctx, next)
    }
}

/// The builder of a world that handles messages with a scenario's handlers and knobs, written
/// once: each world adds only what is its own.
pub(crate) fn equip<S: Equippable + MessageSource>(
    builder: WorkerBuilder<S>,
    handlers: Registry,
    knobs: &Knobs,
) -> WorkerBuilder<S> {
    let (initial, longest) = knobs.retry_delays;
    knobs.equipment.give(
        builder
            .registry(handlers)
            .max_deliveries(knobs.max_deliveries)
            .retry_delays(initial, longest)
            .handler_timeout(knobs.handler_timeout)
            .max_payload_bytes(knobs.max_payload_bytes),
    )
}

/// A world: its own place, a worker started on it with a test's handlers, and what a
/// scenario needs to see of it.
pub(crate) trait World: Sized {
    /// The world's name in the engine's log lines (`transport=…`).
    const TRANSPORT: &'static str;

    /// Whether a message of a type no handler knows can only arrive in a handler's own queue
    /// (RabbitMQ), so that its dead letter names that handler; elsewhere it names none.
    const UNKNOWN_TYPE_NAMES_A_HANDLER: bool = false;

    /// A fresh place of the test's own; no worker yet.
    async fn create() -> Self;

    /// Starts a worker with these handlers and knobs (again after [`stop`](World::stop): the
    /// next start, on the same place); fails the test if the worker does not build.
    async fn start(&mut self, handlers: Registry, knobs: &Knobs) {
        if let Err(error) = self.try_start(handlers, knobs).await {
            panic!("on {}: the worker does not build: {error}", Self::TRANSPORT);
        }
    }

    /// The same, returning what the builder's `build()` returned when it fails (then no worker
    /// runs, and the world may be started again).
    async fn try_start(&mut self, handlers: Registry, knobs: &Knobs)
        -> Result<(), hexeract::Error>;

    /// Publishes `envelope` as a producer of this world does.
    async fn publish(&self, envelope: Envelope);

    /// Waits (up to 30 s) until the world's source owes nothing, where the world can tell.
    async fn settled(&self);

    /// The dead letters so far.
    async fn dead_letters(&self) -> Vec<DeadLetter>;

    /// Cancels the worker and waits for its `run`: what it returned (`Err` also when it did
    /// not return within 30 s, or panicked).
    async fn stop(&mut self) -> Result<(), String>;

    /// Crashes the worker: its `run` is dropped where it stands, with no cancellation, no
    /// grace and no settle, as when the process dies (a call in flight is left running on its
    /// own, holding nothing of the place), and what the process held is let go as the
    /// operating system lets it go (a broker connection closes, a consumer leaves its group).
    /// Nothing in memory survives a crash: the in-memory world has none.
    async fn crash(&mut self);

    /// Removes the place (schema, queues) once the test passed.
    async fn remove(self);
}

/// A worker's `run` in a task of its own, and its cancellation.
struct Running {
    cancel: CancellationToken,
    task: JoinHandle<Result<(), String>>,
}

impl Running {
    fn spawn<F, E>(run: impl FnOnce(CancellationToken) -> F) -> Running
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Display,
    {
        let cancel = CancellationToken::new();
        let run = run(cancel.clone());
        Running {
            cancel,
            task: tokio::spawn(async move { run.await.map_err(|error| error.to_string()) }),
        }
    }

    async fn stop(self) -> Result<(), String> {
        self.cancel.cancel();
        match tokio::time::timeout(WITHIN, self.task).await {
            Err(_) => Err(format!(
                "run did not return within {WITHIN:?} of its cancel"
            )),
            Ok(Err(join)) => Err(format!("run panicked: {join}")),
            Ok(Ok(returned)) => returned,
        }
    }
}

impl Running {
    /// Drops the `run` where it stands (the crash of [`World::crash`]), and waits until it is
    /// dropped.
    async fn crash(self) {
        self.task.abort();
        let dropped = tokio::time::timeout(WITHIN, self.task).await;
        assert!(
            matches!(dropped, Ok(Err(ref join)) if join.is_cancelled()),
            "the run was dropped where it stood: {dropped:?}"
        );
    }
}

/// Crashes the started worker ([`World::crash`]).
async fn crash_started(running: &mut Option<Running>) {
    running
        .take()
        .expect("the world's worker was started")
        .crash()
        .await;
}

fn stop_started(running: &mut Option<Running>) -> impl Future<Output = Result<(), String>> {
    let running = running.take().expect("the world's worker was started");
    running.stop()
}

/// Polls `owed` until it says nothing is owed, failing after 30 s.
async fn drained<F: Future<Output = u64>>(world: &str, mut owed: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let left = owed().await;
        if left == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "on {world}: {left} still owed after {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// --- in-memory ---

/// The in-memory [`MemoryWorker`] on an [`InMemoryStore`] of its own.
pub(crate) struct Memory {
    store: InMemoryStore,
    running: Option<Running>,
}

impl World for Memory {
    async fn crash(&mut self) {
        unreachable!("nothing in memory survives a crash: no scenario crashes the in-memory world")
    }

    const TRANSPORT: &'static str = "memory";

    async fn create() -> Memory {
        Memory {
            store: InMemoryStore::new(),
            running: None,
        }
    }

    async fn try_start(
        &mut self,
        handlers: Registry,
        knobs: &Knobs,
    ) -> Result<(), hexeract::Error> {
        let runtime = equip(
            MemoryWorker::builder().store(self.store.clone()),
            handlers,
            knobs,
        )
        .build()?;
        self.running = Some(Running::spawn(|cancel| runtime.run(cancel)));
        Ok(())
    }

    async fn publish(&self, envelope: Envelope) {
        self.store.publish_envelope(envelope);
    }

    async fn settled(&self) {
        tokio::time::timeout(WITHIN, self.store.wait_idle())
            .await
            .unwrap_or_else(|_| panic!("on memory: the store was not idle within {WITHIN:?}"));
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.store.dead_letters()
    }

    async fn stop(&mut self) -> Result<(), String> {
        stop_started(&mut self.running).await
    }

    async fn remove(self) {}
}

// --- the outbox on SQLite and PostgreSQL ---

/// A database of the test's own for the outbox worker.
pub(crate) trait Database: Sized {
    const TRANSPORT: &'static str;
    async fn open() -> (Self, Arc<dyn Store>);
    async fn remove(self);
}

/// An SQLite file in a directory of its own (the embedded default, WAL and a pool).
pub(crate) struct SqliteFile(PathBuf);

impl Database for SqliteFile {
    const TRANSPORT: &'static str = "sqlite";

    async fn open() -> (SqliteFile, Arc<dyn Store>) {
        let dir = std::env::temp_dir().join(format!("hexeract-conformance-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("create the test's directory");
        let store = SqliteStore::open(dir.join("outbox.db"))
            .await
            .expect("open the test's database file");
        store.migrate().await.expect("migrate");
        (SqliteFile(dir), Arc::new(store))
    }

    async fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A PostgreSQL schema of the test's own.
pub(crate) struct PgSchema(TestSchema);

impl Database for PgSchema {
    const TRANSPORT: &'static str = "postgresql";

    async fn open() -> (PgSchema, Arc<dyn Store>) {
        let schema = TestSchema::new("hexeract-conformance").await;
        let store: PgStore = schema.migrated_store().await;
        (PgSchema(schema), Arc::new(store))
    }

    async fn remove(self) {
        self.0.drop_schema().await;
    }
}

/// The [`OutboxWorker`] on a database of the test's own.
pub(crate) struct Outbox<D> {
    database: D,
    store: Arc<dyn Store>,
    running: Option<Running>,
}

pub(crate) type Sqlite = Outbox<SqliteFile>;
pub(crate) type Postgres = Outbox<PgSchema>;

impl<D: Database> World for Outbox<D> {
    const TRANSPORT: &'static str = D::TRANSPORT;

    async fn create() -> Outbox<D> {
        let (database, store) = D::open().await;
        Outbox {
            database,
            store,
            running: None,
        }
    }

    async fn try_start(
        &mut self,
        handlers: Registry,
        knobs: &Knobs,
    ) -> Result<(), hexeract::Error> {
        let worker = equip(
            OutboxWorker::builder_shared(self.store.clone())
                .poll_interval(Duration::from_millis(10)),
            handlers,
            knobs,
        )
        .build()?;
        self.running = Some(Running::spawn(|cancel| worker.run(cancel)));
        Ok(())
    }

    async fn publish(&self, envelope: Envelope) {
        self.store
            .publish(vec![envelope])
            .await
            .expect("the outbox takes the message");
    }

    async fn settled(&self) {
        drained(D::TRANSPORT, || async {
            self.store.backlog().await.expect("the backlog is readable")
        })
        .await;
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.store
            .dead_letters(100)
            .await
            .expect("dead letters are readable")
    }

    async fn stop(&mut self) -> Result<(), String> {
        stop_started(&mut self.running).await
    }

    async fn crash(&mut self) {
        // The claims stay in the store, each until its lease ends.
        crash_started(&mut self.running).await;
    }

    async fn remove(self) {
        self.database.remove().await;
    }
}

// --- RabbitMQ ---

/// The RabbitMQ worker on an exchange and queue prefix of the test's own, its dead letters
/// also written to an in-memory SQLite store; messages published with publisher confirms.
pub(crate) struct RabbitMq {
    broker: TestBroker,
    publisher: RabbitMqPublisher,
    dead_letters: Arc<dyn Store>,
    /// The topology of the last start, and the queue of its first handler.
    topology: Option<(Topology, String)>,
    known_types: Vec<&'static str>,
    starts: u32,
    running: Option<Running>,
    /// The connection of the last start, to close when the worker crashes.
    connection: Option<RabbitMqConnection>,
}

impl RabbitMq {
    /// The handler queues and wait queues: where messages wait for a call (parking queues
    /// hold the dead letters).
    fn delivery_queues(&self) -> Vec<String> {
        let Some((topology, _)) = &self.topology else {
            return Vec::new();
        };
        topology
            .queues()
            .into_iter()
            .filter(|queue| queue.delivery_limit.is_some() || queue.message_ttl.is_some())
            .map(|queue| queue.name)
            .collect()
    }
}

impl World for RabbitMq {
    const TRANSPORT: &'static str = "rabbitmq";
    const UNKNOWN_TYPE_NAMES_A_HANDLER: bool = true;

    async fn create() -> RabbitMq {
        let broker = TestBroker::new().await;
        let publisher = RabbitMqPublisher::new(&broker.connection)
            .await
            .expect("a publisher channel")
            .exchange(broker.exchange.clone());
        let store = SqliteStore::in_memory()
            .await
            .expect("an in-memory SQLite store");
        store.migrate().await.expect("migrate");
        RabbitMq {
            broker,
            publisher,
            dead_letters: Arc::new(store),
            topology: None,
            known_types: Vec::new(),
            starts: 0,
            running: None,
            connection: None,
        }
    }

    async fn try_start(
        &mut self,
        handlers: Registry,
        knobs: &Knobs,
    ) -> Result<(), hexeract::Error> {
        self.starts += 1;
        self.known_types = handlers.handlers().map(|info| info.message_type).collect();
        let first = handlers
            .handlers()
            .next()
            .map(|info| info.name.to_string())
            .expect("at least one handler");
        let connection = self
            .broker
            .connect(&format!("{}.worker-{}", self.broker.prefix, self.starts))
            .await;
        self.connection = Some(connection.clone());
        // No wait tiers given: the builder's default tiers are the retry delays, doubling.
        let worker = equip(
            RabbitMqWorkerBuilder::new(connection)
                .exchange(self.broker.exchange.clone())
                .prefix(self.broker.prefix.clone())
                .dead_letters(self.dead_letters.clone()),
            handlers,
            knobs,
        )
        .build()?;
        let topology = worker.topology().clone();
        let queue = topology.queue_for(&first);
        self.topology = Some((topology, queue));
        self.running = Some(Running::spawn(|cancel| worker.run(cancel)));
        // Messages published before the queues are declared and bound would be lost (an event
        // nobody subscribes to yet): wait until the worker consumes every handler queue.
        let handler_queues: Vec<String> = self
            .topology
            .as_ref()
            .map(|(topology, _)| {
                topology
                    .queues()
                    .into_iter()
                    .filter(|queue| queue.delivery_limit.is_some())
                    .map(|queue| queue.name)
                    .collect()
            })
            .unwrap_or_default();
        let deadline = tokio::time::Instant::now() + WITHIN;
        loop {
            let mut consumed = 0;
            for queue in &handler_queues {
                if self.broker.consumers(queue).await.unwrap_or(0) > 0 {
                    consumed += 1;
                }
            }
            if consumed == handler_queues.len() {
                return Ok(());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the RabbitMQ worker did not consume {handler_queues:?} within {WITHIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn publish(&self, envelope: Envelope) {
        if self.known_types.contains(&envelope.message_type.as_str()) {
            self.publisher
                .publish(&envelope)
                .await
                .expect("the broker confirms the publish");
            return;
        }
        // No queue is bound for a type no handler has: the exchange would drop it. The only
        // way such a message reaches a worker is straight into a handler's queue (a producer
        // that got the queue wrong, or a handler removed from a shared queue).
        let (_, queue) = self.topology.as_ref().expect("started");
        let properties = BasicProperties::default()
            .with_message_id(envelope.id.to_string().as_str().into())
            .with_type(envelope.message_type.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        self.broker
            .publish_to("", queue, &envelope.payload, properties)
            .await;
    }

    async fn settled(&self) {
        let queues = self.delivery_queues();
        drained("rabbitmq", || async {
            let mut ready = 0;
            for queue in &queues {
                ready += u64::from(self.broker.ready(queue).await);
            }
            ready
        })
        .await;
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.dead_letters
            .dead_letters(100)
            .await
            .expect("dead letters are readable")
    }

    async fn stop(&mut self) -> Result<(), String> {
        stop_started(&mut self.running).await
    }

    async fn crash(&mut self) {
        crash_started(&mut self.running).await;
        // The broker takes back what the connection held unacked, counted as delivered.
        let connection = self.connection.take().expect("the worker's connection");
        connection
            .close()
            .await
            .expect("the worker's connection closes");
    }

    async fn remove(self) {
        if let Some((topology, _)) = &self.topology {
            self.broker.delete(topology).await;
        }
    }
}

// --- Kafka ---

/// Where a Kafka world's brokers are.
pub(crate) trait Brokers {
    fn connect() -> TestKafka;
}

/// tansu at `TEST_KAFKA_BROKERS` (what `.ci/run` starts).
pub(crate) struct Tansu;

impl Brokers for Tansu {
    fn connect() -> TestKafka {
        TestKafka::tansu()
    }
}

/// A librdkafka mock cluster of the test's own.
pub(crate) struct MockCluster;

impl Brokers for MockCluster {
    fn connect() -> TestKafka {
        TestKafka::mock()
    }
}

/// Partitions of the test's topic.
const PARTITIONS: i32 = 3;

/// The Kafka worker on a topic prefix of the test's own (topic `<prefix>.order`, 3
/// partitions), with an in-memory SQLite store for its dead letters and the outbox the relay
/// publishes from.
pub(crate) struct Kafka<B> {
    kafka: TestKafka,
    store: Arc<dyn Store>,
    relay: Option<Running>,
    running: Option<Running>,
    brokers: PhantomData<B>,
}

pub(crate) type KafkaTansu = Kafka<Tansu>;
pub(crate) type KafkaMock = Kafka<MockCluster>;

impl<B: Brokers> World for Kafka<B> {
    const TRANSPORT: &'static str = "kafka";

    async fn create() -> Kafka<B> {
        let kafka = B::connect();
        kafka.create_topic("order", PARTITIONS).await;
        let store = SqliteStore::in_memory()
            .await
            .expect("an in-memory SQLite store");
        store.migrate().await.expect("migrate");
        let store: Arc<dyn Store> = Arc::new(store);
        let relay = KafkaRelay::new(store.clone(), &kafka.config(PARTITIONS))
            .expect("a relay")
            .batch_size(50)
            .poll_interval(Duration::from_millis(20));
        Kafka {
            relay: Some(Running::spawn(|cancel| relay.run(cancel))),
            kafka,
            store,
            running: None,
            brokers: PhantomData,
        }
    }

    async fn try_start(
        &mut self,
        handlers: Registry,
        knobs: &Knobs,
    ) -> Result<(), hexeract::Error> {
        let worker = equip(
            KafkaWorker::builder(self.kafka.config(PARTITIONS), self.store.clone())
                .check_interval(Duration::from_millis(500)),
            handlers,
            knobs,
        )
        .build()?;
        self.running = Some(Running::spawn(|cancel| worker.run(cancel)));
        Ok(())
    }

    async fn publish(&self, envelope: Envelope) {
        assert!(
            envelope.aggregate.is_some() && envelope.aggregate_key.is_some(),
            "a Kafka record needs an aggregate and a key: {envelope:?}"
        );
        self.store
            .publish(vec![envelope])
            .await
            .expect("the outbox takes the message");
    }

    /// Only the relay's side: the outbox is empty. How far the consumer groups are is not
    /// readable on tansu (it answers 1 as every partition's end), so the scenarios wait for
    /// the outcomes they expect instead.
    async fn settled(&self) {
        drained("kafka", || async {
            self.store.backlog().await.expect("the backlog is readable")
        })
        .await;
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.store
            .dead_letters(100)
            .await
            .expect("dead letters are readable")
    }

    async fn stop(&mut self) -> Result<(), String> {
        stop_started(&mut self.running).await
    }

    async fn crash(&mut self) {
        // The consumers go with the run: each leaves its group, nothing committed since.
        crash_started(&mut self.running).await;
    }

    async fn remove(mut self) {
        if let Some(relay) = self.relay.take() {
            relay.stop().await.expect("the relay stops with Ok(())");
        }
    }
}
