//! Nothing lost at the edges of the outbox: a row another program wrote (a header that is not a
//! string), a row the broker would never take (a payload over its size limit, headers over a
//! frame) and a message no queue is bound for are each dead-lettered alone, with their reason, or
//! published as well as they can be, and the rows behind them go on: on the outbox worker's take
//! and on the RabbitMQ relay, over SQLite and PostgreSQL.
//!
//! Needs PostgreSQL at `TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and
//! RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). Each test has a
//! schema, an SQLite file and a queue prefix of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hexeract::health::Health;
use hexeract::outbox::OutboxWorker;
use hexeract::rabbitmq::{headers, RabbitMqRelay, Topology};
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::{DeliveryStore, RelayStore};
use hexeract::{
    CancellationToken, Context, DeadLetter, Envelope, Handler, HandlerOptions, Message, Reason,
    Registry,
};
use hexeract_tests::amqp::TestBroker;
use hexeract_tests::pg::TestSchema;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.OrderPlaced")]
struct OrderPlaced {
    order_id: u32,
}

/// The orders each handler saw, by handler.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(&'static str, u32)>>>);

impl Seen {
    fn of(&self, handler: &str) -> Vec<u32> {
        let mut orders: Vec<u32> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| *name == handler)
            .map(|(_, order)| *order)
            .collect();
        orders.sort_unstable();
        orders
    }
}

struct Record(Seen, &'static str);

impl Handler<OrderPlaced> for Record {
    type Error = std::convert::Infallible;

    async fn handle(&self, message: OrderPlaced, _: &Context) -> Result<(), Self::Error> {
        self.0 .0.lock().unwrap().push((self.1, message.order_id));
        Ok(())
    }
}

/// The order id of the row another program wrote: never handled, only dead-lettered.
const POISON_ORDER: u32 = 999;

/// Where the test's rows live: a store and a way to write a row around Hexeract's back.
enum Backend {
    Sqlite(SqliteStore, std::path::PathBuf),
    Postgres(TestSchema),
}

impl Backend {
    async fn sqlite() -> Backend {
        let dir = std::env::temp_dir().join(format!("hexeract-poison-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(dir.join("outbox.db")).await.unwrap();
        store.migrate().await.unwrap();
        Backend::Sqlite(store, dir)
    }

    async fn postgres() -> Backend {
        let schema = TestSchema::new("hexeract-tests-poison-rows").await;
        schema.migrated_store().await;
        Backend::Postgres(schema)
    }

    fn store(&self) -> Arc<dyn hexeract::store::Store> {
        match self {
            Backend::Sqlite(store, _) => Arc::new(store.clone()),
            Backend::Postgres(schema) => Arc::new(schema.store()),
        }
    }

    fn relay_store(&self) -> Arc<dyn RelayStore> {
        self.store()
    }

    /// Writes an outbox row as another program might on SQLite, which checks no column's type:
    /// an `OrderPlaced` whose id, `raw`, is not a UUID.
    async fn write_row_with_id(&self, raw: &str) {
        let Backend::Sqlite(store, _) = self else {
            panic!("PostgreSQL keeps only UUIDs in outbox.id")
        };
        let payload = serde_json::to_vec(&OrderPlaced {
            order_id: POISON_ORDER,
        })
        .unwrap();
        sqlx::query(&format!(
            "INSERT INTO \"{}_outbox\" (id, message_type, payload, headers) \
             VALUES (?1, 'test.OrderPlaced', ?2, '{{\"tenant\": \"acme\"}}')",
            store.prefix()
        ))
        .bind(raw)
        .bind(payload)
        .execute(store.pool())
        .await
        .unwrap();
    }

    /// Writes an outbox row as another program might: an `OrderPlaced` whose headers hold a
    /// number where Hexeract writes only strings. Returns its id.
    async fn write_poison_row(&self) -> Uuid {
        let id = Uuid::now_v7();
        let payload = serde_json::to_vec(&OrderPlaced {
            order_id: POISON_ORDER,
        })
        .unwrap();
        match self {
            Backend::Sqlite(store, _) => {
                sqlx::query(&format!(
                    "INSERT INTO \"{}_outbox\" (id, message_type, payload, headers) \
                     VALUES (?1, 'test.OrderPlaced', ?2, '{{\"retries\": 3, \"tenant\": \"acme\"}}')",
                    store.prefix()
                ))
                .bind(id.hyphenated().to_string())
                .bind(payload)
                .execute(store.pool())
                .await
                .unwrap();
            }
            Backend::Postgres(schema) => {
                sqlx::query(&format!(
                    "INSERT INTO \"{}\".outbox (id, message_type, payload, headers) \
                     VALUES ($1, 'test.OrderPlaced', $2, '{{\"retries\": 3, \"tenant\": \"acme\"}}'::jsonb)",
                    schema.schema
                ))
                .bind(id)
                .bind(payload)
                .execute(&schema.pool)
                .await
                .unwrap();
            }
        }
        id
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite(..) => "sqlite",
            Backend::Postgres(_) => "postgresql",
        }
    }

    async fn finish(self) {
        match self {
            Backend::Sqlite(_, dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Backend::Postgres(schema) => schema.drop_schema().await,
        }
    }
}

/// Waits until `store` owes nothing (outbox and deliveries empty), up to 20 s.
async fn drained(store: &dyn hexeract::store::Store) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let owed = store.backlog().await.unwrap();
        if owed == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{owed} messages still owed after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Twenty good messages behind a row the take cannot read, for one handler (claimed in place)
/// or two (expanded into deliveries): every good one handled by every handler, the poison row
/// dead-lettered alone as `message_unreadable`, for each handler, with no call made and with
/// what could be read of it.
async fn the_take_dead_letters_a_poison_row_alone(backend: Backend, handlers: &[&'static str]) {
    let poison = backend.write_poison_row().await;
    let letters = the_take_goes_past_a_poison_row(&backend, handlers).await;
    for letter in &letters {
        assert_unreadable(letter, poison);
    }
    backend.finish().await;
}

/// Runs an outbox worker with `handlers` for `test.OrderPlaced` over the poison row `backend`
/// holds and twenty good messages written after it, until the store owes nothing: every good
/// one handled by every handler, the poison row dead-lettered once for each handler with no
/// call made. Returns those dead letters.
async fn the_take_goes_past_a_poison_row(
    backend: &Backend,
    handlers: &[&'static str],
) -> Vec<DeadLetter> {
    let store = backend.store();
    let good: Vec<Envelope> = (0..20)
        .map(|order_id| Envelope::new(&OrderPlaced { order_id }).unwrap())
        .collect();
    store.publish(good).await.unwrap();

    let seen = Seen::default();
    let mut builder = OutboxWorker::builder_shared(store.clone()).registry(Registry::new());
    for name in handlers {
        builder = builder.register_handler_with::<OrderPlaced, _>(
            Record(seen.clone(), name),
            HandlerOptions::new().name(*name),
        );
    }
    let health = Health::new();
    let worker = builder
        .poll_interval(Duration::from_millis(10))
        .health(health.probe("outbox worker"))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    drained(&*store).await;
    assert!(health.readiness().ready, "{}", health.readiness());
    cancel.cancel();
    running.await.unwrap().unwrap();

    for name in handlers {
        assert_eq!(seen.of(name), (0..20).collect::<Vec<_>>(), "{name}");
    }
    let letters = store.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), handlers.len(), "{letters:?}");
    for letter in &letters {
        assert_eq!(letter.reason, Reason::MESSAGE_UNREADABLE, "{letter:?}");
        assert_eq!(letter.attempts, 0, "no call was made");
    }
    let handled: usize = handlers.iter().map(|name| seen.of(name).len()).sum();
    let lost = 21 * handlers.len() - handled - letters.len();
    println!(
        "scenario=poison_row_take backend={} handlers={} sent={} handled={handled} \
         dead_lettered={} lost={lost}",
        backend.name(),
        handlers.len(),
        21 * handlers.len(),
        letters.len()
    );
    assert_eq!(lost, 0);
    let mut dead_handlers: Vec<Option<String>> = letters
        .iter()
        .map(|letter| letter.handler.clone())
        .collect();
    dead_handlers.sort();
    let mut expected: Vec<Option<String>> =
        handlers.iter().map(|name| Some(name.to_string())).collect();
    expected.sort();
    assert_eq!(dead_handlers, expected);
    letters
}

/// A dead letter of the row [`Backend::write_poison_row`] wrote.
fn assert_unreadable(letter: &DeadLetter, poison: Uuid) {
    assert_eq!(letter.envelope.id, poison);
    assert_eq!(letter.reason, Reason::MESSAGE_UNREADABLE);
    assert!(
        letter.detail.contains("header \"retries\" is not a string"),
        "{}",
        letter.detail
    );
    // What could be read is kept: the payload byte for byte, the string header as it was, the
    // number as its JSON text.
    let order: OrderPlaced = serde_json::from_slice(&letter.envelope.payload).unwrap();
    assert_eq!(order.order_id, POISON_ORDER);
    assert_eq!(letter.envelope.headers["tenant"], "acme");
    assert_eq!(letter.envelope.headers["retries"], "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_take_dead_letters_a_poison_row_claimed_in_place_on_sqlite() {
    the_take_dead_letters_a_poison_row_alone(Backend::sqlite().await, &["only"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_take_dead_letters_a_poison_row_claimed_in_place_on_postgres() {
    the_take_dead_letters_a_poison_row_alone(Backend::postgres().await, &["only"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_take_dead_letters_a_poison_row_expanded_on_sqlite() {
    the_take_dead_letters_a_poison_row_alone(Backend::sqlite().await, &["first", "second"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_take_dead_letters_a_poison_row_expanded_on_postgres() {
    the_take_dead_letters_a_poison_row_alone(Backend::postgres().await, &["first", "second"]).await;
}

/// A row whose id is not a UUID (SQLite keeps whatever text it is given): it cannot be settled by
/// id once claimed, so the take dead-letters it at once, and the rows claimed with it are handled.
/// Before, its claim in place failed the whole take, every cycle.
async fn the_take_dead_letters_a_row_whose_id_is_not_a_uuid(handlers: &[&'static str]) {
    let backend = Backend::sqlite().await;
    backend.write_row_with_id("legacy-42").await;
    let letters = the_take_goes_past_a_poison_row(&backend, handlers).await;
    for letter in &letters {
        assert!(
            letter.detail.contains("message_id \"legacy-42\""),
            "{}",
            letter.detail
        );
        let order: OrderPlaced = serde_json::from_slice(&letter.envelope.payload).unwrap();
        assert_eq!(order.order_id, POISON_ORDER);
        assert_eq!(letter.envelope.headers["tenant"], "acme");
    }
    // The row is gone from the outbox: nothing left to claim again.
    assert_eq!(backend.store().backlog().await.unwrap(), 0);
    backend.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_take_dead_letters_a_row_whose_id_is_not_a_uuid_claimed_in_place() {
    the_take_dead_letters_a_row_whose_id_is_not_a_uuid(&["only"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_take_dead_letters_a_row_whose_id_is_not_a_uuid_expanded() {
    the_take_dead_letters_a_row_whose_id_is_not_a_uuid(&["first", "second"]).await;
}

/// The test broker's topology with the handler queue `relayed` for `test.OrderPlaced`
/// declared, and that queue's name.
async fn relay_setup(broker: &TestBroker) -> (Topology, String) {
    let mut registry = Registry::new();
    registry
        .register::<OrderPlaced, _>(
            Record(Seen::default(), "relayed"),
            HandlerOptions::new().name("relayed"),
        )
        .unwrap();
    let topology = Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone());
    topology.declare(&broker.connection).await.unwrap();
    let queue = topology.queue_for("relayed");
    (topology, queue)
}

/// Runs `relay` until `store` owes nothing, and checks it stayed ready.
async fn relay_until_drained(
    relay: RabbitMqRelay,
    health: &Health,
    store: &dyn hexeract::store::Store,
) {
    let cancel = CancellationToken::new();
    let running = tokio::spawn(relay.run(cancel.clone()));
    drained(store).await;
    // The relay reports a pass once it has ended, which is just after its last delete
    // committed: give that report a moment, and fail if the relay never reads ready.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let readiness = loop {
        let readiness = health.readiness();
        if readiness.ready || tokio::time::Instant::now() >= deadline {
            break readiness;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(readiness.ready, "{readiness}");
    cancel.cancel();
    running.await.unwrap().unwrap();
}

async fn relay(store: Arc<dyn RelayStore>, broker: &TestBroker, health: &Health) -> RabbitMqRelay {
    RabbitMqRelay::new(store, &broker.connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone())
        .batch_size(100)
        .poll_interval(Duration::from_millis(10))
        .health(health.probe("outbox relay"))
}

/// The relay meets, in its oldest rows: a row it cannot read, a payload over the broker's limit,
/// a message of a type no queue is bound for, one of a type allowed to have no subscriber, and
/// one whose headers would not fit in a frame. Behind them, twenty good messages. Each good one
/// reaches the queue once; the row with headers over a frame reaches it without its largest
/// header; the unreadable, oversize and unroutable rows are dead-lettered with their reasons;
/// the allowed one is deleted without a dead letter; the relay stays ready throughout.
async fn the_relay_dead_letters_what_the_broker_will_not_take(backend: Backend) {
    let broker = TestBroker::new().await;
    let (topology, queue) = relay_setup(&broker).await;
    let poison = backend.write_poison_row().await;
    let store = backend.store();
    let oversize = Envelope::new(&OrderPlaced { order_id: 1000 }).unwrap();
    let mut oversize = oversize;
    oversize.payload = format!("{{\"order_id\": 1000, \"pad\": \"{}\"}}", "x".repeat(4096))
        .into_bytes()
        .into();
    let unroutable = Envelope::from_raw("test.NobodySubscribes", &b"{}"[..]);
    let allowed = Envelope::from_raw("test.AuditRecorded", &b"{}"[..]);
    let mut wide = Envelope::new(&OrderPlaced { order_id: 1001 }).unwrap();
    wide.headers
        .insert("x-app-blob".to_owned(), "y".repeat(200 * 1024));
    wide.headers
        .insert("x-app-small".to_owned(), "kept".to_owned());
    // Named like Hexeract's own headers, which trimming keeps: it can never fit a frame.
    let mut unfit = Envelope::new(&OrderPlaced { order_id: 1002 }).unwrap();
    unfit
        .headers
        .insert("x-hexeract-trace".to_owned(), "z".repeat(200 * 1024));
    let mut rows = vec![
        oversize.clone(),
        unroutable.clone(),
        allowed.clone(),
        wide.clone(),
        unfit.clone(),
    ];
    rows.extend((0..20).map(|order_id| Envelope::new(&OrderPlaced { order_id }).unwrap()));
    store.publish(rows).await.unwrap();

    let health = Health::new();
    let relay = relay(backend.relay_store(), &broker, &health)
        .await
        .max_message_size(1024)
        .allow_unrouted(["test.AuditRecorded"]);
    relay_until_drained(relay, &health, &*store).await;

    let arrived = broker.wait_for(&queue, 21, Duration::from_secs(10)).await;
    let mut orders: Vec<u32> = arrived
        .iter()
        .map(|message| {
            serde_json::from_slice::<OrderPlaced>(&message.delivery.data)
                .unwrap()
                .order_id
        })
        .collect();
    orders.sort_unstable();
    let mut expected: Vec<u32> = (0..20).collect();
    expected.push(1001);
    assert_eq!(orders, expected, "every good row once, the wide one too");
    let wide_copy = arrived
        .iter()
        .find(|message| {
            message
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str())
                == Some(wide.id.to_string().as_str())
        })
        .expect("the row with wide headers was published");
    let table = wide_copy.delivery.properties.headers().as_ref().unwrap();
    assert!(
        !table.inner().contains_key("x-app-blob"),
        "the blob was left out"
    );
    assert!(
        table.inner().contains_key("x-app-small"),
        "the small header stayed"
    );
    let dropped = match table.inner().get(headers::DROPPED_HEADERS) {
        Some(lapin::types::AMQPValue::LongString(names)) => names.to_string(),
        other => panic!("no list of dropped headers: {other:?}"),
    };
    assert_eq!(dropped, "x-app-blob");

    let letters = store.dead_letters(10).await.unwrap();
    let reason_of = |id: Uuid| {
        letters
            .iter()
            .find(|letter| letter.envelope.id == id)
            .map(|letter| (letter.reason.clone(), letter.detail.clone()))
    };
    assert_eq!(letters.len(), 4, "{letters:?}");
    let (reason, detail) = reason_of(unfit.id).expect("the row whose headers never fit");
    assert_eq!(reason, Reason::PAYLOAD_INVALID);
    assert!(detail.contains("one AMQP frame"), "{detail}");
    let unreadable = letters
        .iter()
        .find(|letter| letter.envelope.id == poison)
        .unwrap();
    assert_unreadable(unreadable, poison);
    let (reason, detail) = reason_of(oversize.id).expect("the oversize row was dead-lettered");
    assert_eq!(reason, Reason::PAYLOAD_TOO_LARGE);
    assert!(detail.contains("AMQP_MAX_MESSAGE_SIZE"), "{detail}");
    let (reason, detail) = reason_of(unroutable.id).expect("the unroutable row was dead-lettered");
    assert_eq!(reason, Reason::UNROUTABLE);
    assert!(detail.contains("test.NobodySubscribes"), "{detail}");
    assert_eq!(
        reason_of(allowed.id),
        None,
        "an allowed type is not dead-lettered"
    );
    assert!(letters.iter().all(|letter| letter.handler.is_none()));
    // Sent: the poison row, the oversize, unroutable, allowed, wide and unfit rows, and 20
    // good ones.
    println!(
        "scenario=relay_edges backend={} sent=26 published={} dead_lettered={} \
         allowed_unrouted=1 lost={}",
        backend.name(),
        arrived.len(),
        letters.len(),
        26 - arrived.len() - letters.len() - 1
    );
    broker.delete(&topology).await;
    backend.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_dead_letters_what_the_broker_will_not_take_on_sqlite() {
    the_relay_dead_letters_what_the_broker_will_not_take(Backend::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_dead_letters_what_the_broker_will_not_take_on_postgres() {
    the_relay_dead_letters_what_the_broker_will_not_take(Backend::postgres().await).await;
}

/// `*` allows every type to reach no queue: the relay then deletes an unroutable message
/// without a dead letter, as it did before it asked the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_may_be_allowed_to_have_no_subscriber() {
    let broker = TestBroker::new().await;
    let (topology, _) = relay_setup(&broker).await;
    let backend = Backend::sqlite().await;
    let store = backend.store();
    store
        .publish(vec![Envelope::from_raw(
            "test.NobodySubscribes",
            &b"{}"[..],
        )])
        .await
        .unwrap();
    let health = Health::new();
    let relay = relay(backend.relay_store(), &broker, &health)
        .await
        .allow_unrouted(["*"]);
    relay_until_drained(relay, &health, &*store).await;
    assert!(store.dead_letters(10).await.unwrap().is_empty());
    broker.delete(&topology).await;
    backend.finish().await;
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.Note")]
struct Note {
    text: String,
}

/// A `Note` whose JSON payload is exactly `bytes` long.
fn note_of(bytes: usize) -> Note {
    // `{"text":"…"}` is 11 bytes around the text.
    Note {
        text: "x".repeat(bytes - 11),
    }
}

/// Enqueues `note` and schedules it for later in one transaction of `backend`, then commits:
/// the enqueue's result, the schedule's, and the outbox's rows after.
async fn enqueue_and_schedule(
    backend: &Backend,
    note: &Note,
) -> (
    Result<Uuid, hexeract::outbox::EnqueueError>,
    Result<Uuid, hexeract::outbox::EnqueueError>,
    u64,
) {
    use hexeract::outbox::{enqueue, schedule_after};
    let later = Duration::from_secs(3600);
    let (enqueued, scheduled) = match backend {
        Backend::Sqlite(store, _) => {
            let mut tx = store.pool().begin().await.unwrap();
            let results = (
                enqueue(&mut tx, note).await,
                schedule_after(&mut tx, later, note).await,
            );
            tx.commit().await.unwrap();
            results
        }
        Backend::Postgres(schema) => {
            // Into the test's own schema, which `enqueue_envelopes` names.
            let mut tx = schema.pool.begin().await.unwrap();
            let envelope = Envelope::new(note).unwrap();
            let id = envelope.id;
            let enqueued = hexeract::outbox::enqueue_envelopes(
                &mut tx,
                &schema.schema,
                std::slice::from_ref(&envelope),
            )
            .await
            .map(|()| id);
            let scheduled = hexeract::outbox::schedule_envelopes(
                &mut tx,
                &schema.schema,
                std::slice::from_ref(&envelope),
                hexeract::store::Due::After(later),
            )
            .await
            .map(|()| id);
            tx.commit().await.unwrap();
            (enqueued, scheduled)
        }
    };
    let owed = backend.store().backlog().await.unwrap();
    (enqueued, scheduled, owed)
}

/// A payload larger than the workers take (`MAX_PAYLOAD_BYTES`, 1 MiB here) is refused when it
/// is written, naming the variable, and nothing of it is: before, it was written, loaded with a
/// whole batch by the take, and only then dead-lettered. One of exactly the limit is written.
async fn an_oversize_payload_is_refused_at_enqueue(backend: Backend) {
    const LIMIT: usize = 1024 * 1024;
    let (enqueued, scheduled, owed) = enqueue_and_schedule(&backend, &note_of(LIMIT + 1)).await;
    for refused in [enqueued, scheduled] {
        let error = refused.unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("test.Note") && text.contains(&format!("{} bytes", LIMIT + 1)),
            "{text}"
        );
        assert!(text.contains("MAX_PAYLOAD_BYTES (1048576)"), "{text}");
    }
    assert_eq!(owed, 0, "nothing of the refused message was written");

    let (enqueued, scheduled, owed) = enqueue_and_schedule(&backend, &note_of(LIMIT)).await;
    enqueued.unwrap();
    scheduled.unwrap();
    assert_eq!(owed, 1, "the message at the limit is in the outbox");
    backend.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_payload_is_refused_at_enqueue_on_sqlite() {
    an_oversize_payload_is_refused_at_enqueue(Backend::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_payload_is_refused_at_enqueue_on_postgres() {
    an_oversize_payload_is_refused_at_enqueue(Backend::postgres().await).await;
}
