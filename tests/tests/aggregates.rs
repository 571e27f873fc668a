//! A message's aggregate (`#[message(aggregate = "…")]` and its `#[message(key)]` field) kept
//! through every hop of both stores: enqueue in the caller's transaction and the store's
//! publish, expansion and claims, a handler's call, dead letters (the worker's and those
//! inserted as they are, as a broker worker parks them) and their replay, delayed messages once
//! due, and the relay to a broker. A message without an aggregate comes back without one.
//!
//! Each test runs on PostgreSQL (a schema of its own, at `TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`) and on SQLite (a file of its own).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures_util::future::BoxFuture;
use hexeract::outbox::OutboxWorker;
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::Store;
use hexeract::store::{Claimed, DeliveryStore, Due, RelaySink, Routes, Unpublishable, NO_HANDLER};
use hexeract::{
    CancellationToken, Context, DeadLetter, Envelope, Handler, HandlerOptions, Message, Reason,
    Registry,
};
use hexeract_tests::pg::TestSchema;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "agg.OrderPlaced", aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
    order_id: u64,
    total_cents: i64,
}

/// Of the same aggregate, and routed to no handler: its dead letter has none, so a replay puts
/// it back in the outbox rather than in the deliveries.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "agg.OrderCancelled", aggregate = "order")]
struct OrderCancelled {
    #[message(key)]
    order_id: u64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "agg.Ping")]
struct Ping {
    n: u32,
}

const NO_AGGREGATE: (Option<&str>, Option<&str>) = (None, None);

fn order(key: &str) -> (Option<&str>, Option<&str>) {
    (Some("order"), Some(key))
}

fn aggregate_of(envelope: &Envelope) -> (Option<&str>, Option<&str>) {
    (
        envelope.aggregate.as_deref(),
        envelope.aggregate_key.as_deref(),
    )
}

fn placed(order_id: u64) -> OrderPlaced {
    OrderPlaced {
        order_id,
        total_cents: 990,
    }
}

/// `OrderPlaced` goes to `ship`, `Ping` to `log`; `OrderCancelled` to no handler.
fn routes() -> Routes {
    Routes {
        pairs: vec![
            (OrderPlaced::MESSAGE_TYPE.to_owned(), "ship".to_owned()),
            (Ping::MESSAGE_TYPE.to_owned(), "log".to_owned()),
        ],
    }
}

/// The store under test, and what to clean up after it.
struct TestStore {
    store: Arc<dyn Store>,
    db: Db,
}

enum Db {
    Postgres(TestSchema),
    Sqlite { dir: PathBuf, store: SqliteStore },
}

impl TestStore {
    async fn postgres() -> TestStore {
        let schema = TestSchema::new("hexeract-tests-aggregates").await;
        let store = schema.migrated_store().await;
        TestStore {
            store: Arc::new(store),
            db: Db::Postgres(schema),
        }
    }

    async fn sqlite() -> TestStore {
        let dir = std::env::temp_dir().join(format!("hexeract-aggregates-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("create the test directory");
        let store = SqliteStore::open(dir.join("outbox.db"))
            .await
            .expect("open the database file");
        store.migrate().await.expect("migrate");
        TestStore {
            store: Arc::new(store.clone()),
            db: Db::Sqlite { dir, store },
        }
    }

    fn delivery_store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// Writes `message` to the outbox in a transaction of the application's, committed.
    async fn enqueue<M: Message>(&self, message: &M) -> Uuid {
        match &self.db {
            // `outbox::enqueue` writes to the default schema, and this test has one of its
            // own: the same two steps, with the schema named.
            Db::Postgres(schema) => {
                let envelope = Envelope::new(message).unwrap();
                let mut tx = schema.pool.begin().await.unwrap();
                hexeract::outbox::enqueue_envelopes(
                    &mut tx,
                    &schema.schema,
                    std::slice::from_ref(&envelope),
                )
                .await
                .unwrap();
                tx.commit().await.unwrap();
                envelope.id
            }
            Db::Sqlite { store, .. } => {
                let mut tx = store.pool().begin().await.unwrap();
                let id = hexeract::outbox::enqueue(&mut tx, message).await.unwrap();
                tx.commit().await.unwrap();
                id
            }
        }
    }

    /// Keeps `message` until `at`, in a transaction of the application's, committed.
    async fn schedule_at<M: Message>(&self, at: chrono::DateTime<Utc>, message: &M) -> Uuid {
        match &self.db {
            // As in `enqueue`: `outbox::schedule_at` with the test's schema named.
            Db::Postgres(schema) => {
                let envelope = Envelope::new(message).unwrap();
                let mut tx = schema.pool.begin().await.unwrap();
                hexeract::outbox::schedule_envelopes(
                    &mut tx,
                    &schema.schema,
                    std::slice::from_ref(&envelope),
                    Due::At(at),
                )
                .await
                .unwrap();
                tx.commit().await.unwrap();
                envelope.id
            }
            Db::Sqlite { store, .. } => {
                let mut tx = store.pool().begin().await.unwrap();
                let id = hexeract::outbox::schedule_at(&mut tx, at, message)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                id
            }
        }
    }

    /// Runs `sql` on the store's database, with `{table}` standing for the table's name there.
    async fn execute(&self, sql: &str, table: &str) {
        match &self.db {
            Db::Postgres(schema) => {
                let sql = sql.replace("{table}", &format!("\"{}\".{table}", schema.schema));
                sqlx::raw_sql(&sql).execute(&schema.pool).await.unwrap();
            }
            Db::Sqlite { store, .. } => {
                let sql = sql.replace("{table}", &format!("\"hexeract_{table}\""));
                sqlx::raw_sql(&sql).execute(store.pool()).await.unwrap();
            }
        }
    }

    /// The schema version a migrated store is at: 8 on PostgreSQL (its outbox pages kept
    /// half free), 7 on SQLite.
    fn latest_schema_version(&self) -> i64 {
        match &self.db {
            Db::Postgres(_) => 9,
            Db::Sqlite { .. } => 8,
        }
    }

    async fn schema_versions(&self) -> i64 {
        match &self.db {
            Db::Postgres(schema) => schema.count("schema_versions").await,
            Db::Sqlite { store, .. } => {
                sqlx::query_scalar("SELECT count(*) FROM \"hexeract_schema_versions\"")
                    .fetch_one(store.pool())
                    .await
                    .unwrap()
            }
        }
    }

    async fn finish(self) {
        drop(self.store);
        match self.db {
            Db::Postgres(schema) => schema.drop_schema().await,
            Db::Sqlite { dir, store } => {
                store.pool().close().await;
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// Expands the outbox and claims every delivery due, by message id.
async fn expand_and_claim(store: &dyn Store) -> HashMap<Uuid, Claimed> {
    store.expand(&routes(), 100).await.unwrap();
    store
        .claim(Uuid::now_v7(), 100, Duration::from_secs(30))
        .await
        .unwrap()
        .into_iter()
        .map(|claimed| (claimed.envelope.id, claimed))
        .collect()
}

async fn dead_letters_by_message(store: &dyn Store) -> HashMap<Uuid, DeadLetter> {
    store
        .dead_letters(100)
        .await
        .unwrap()
        .into_iter()
        .map(|letter| (letter.envelope.id, letter))
        .collect()
}

async fn claims_carry_the_aggregate_of_enqueued_and_published_messages(test: TestStore) {
    let store = test.delivery_store();
    assert_eq!(
        aggregate_of(&Envelope::new(&placed(42)).unwrap()),
        order("42")
    );
    let enqueued = test.enqueue(&placed(42)).await;
    let enqueued_ping = test.enqueue(&Ping { n: 1 }).await;
    // One batch with and without aggregates: on PostgreSQL one row per array element, so a
    // column out of step with the others shows here.
    let batch = vec![
        Envelope::new(&placed(7)).unwrap(),
        Envelope::new(&Ping { n: 2 }).unwrap(),
        Envelope::new(&placed(42)).unwrap(),
    ];
    let batch_ids: Vec<Uuid> = batch.iter().map(|envelope| envelope.id).collect();
    store.publish(batch).await.unwrap();

    let claimed = expand_and_claim(&*store).await;
    assert_eq!(claimed.len(), 5, "{claimed:?}");
    let seen = |id: &Uuid| aggregate_of(&claimed[id].envelope);
    assert_eq!(seen(&enqueued), order("42"), "enqueued");
    assert_eq!(seen(&enqueued_ping), NO_AGGREGATE, "enqueued without one");
    assert_eq!(seen(&batch_ids[0]), order("7"), "published");
    assert_eq!(seen(&batch_ids[1]), NO_AGGREGATE, "published without one");
    assert_eq!(seen(&batch_ids[2]), order("42"), "published");
    assert_eq!(claimed[&enqueued].handler, "ship");
    test.finish().await;
}

#[tokio::test]
async fn postgres_claims_carry_the_aggregate_of_enqueued_and_published_messages() {
    claims_carry_the_aggregate_of_enqueued_and_published_messages(TestStore::postgres().await)
        .await;
}

#[tokio::test]
async fn sqlite_claims_carry_the_aggregate_of_enqueued_and_published_messages() {
    claims_carry_the_aggregate_of_enqueued_and_published_messages(TestStore::sqlite().await).await;
}

/// An envelope's `aggregate` and `aggregate_key`, as a handler keeps them.
type Aggregate = (Option<String>, Option<String>);

/// Records the aggregate each call saw, by message id.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashMap<Uuid, Aggregate>>>);

impl Seen {
    fn record(&self, ctx: &Context) {
        let envelope = ctx.envelope();
        self.0.lock().unwrap().insert(
            envelope.id,
            (envelope.aggregate.clone(), envelope.aggregate_key.clone()),
        );
    }

    fn get(&self, id: Uuid) -> Option<Aggregate> {
        self.0.lock().unwrap().get(&id).cloned()
    }
}

impl Handler<OrderPlaced> for Seen {
    type Error = String;
    async fn handle(&self, _order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        self.record(ctx);
        Ok(())
    }
}

impl Handler<Ping> for Seen {
    type Error = String;
    async fn handle(&self, _ping: Ping, ctx: &Context) -> Result<(), Self::Error> {
        self.record(ctx);
        Ok(())
    }
}

fn owned((aggregate, key): (Option<&str>, Option<&str>)) -> Aggregate {
    (aggregate.map(str::to_owned), key.map(str::to_owned))
}

async fn a_handler_sees_the_aggregate(test: TestStore) {
    let store = test.delivery_store();
    let order_id = test.enqueue(&placed(42)).await;
    let ping = Envelope::new(&Ping { n: 1 }).unwrap();
    store.publish(vec![ping.clone()]).await.unwrap();

    let seen = Seen::default();
    let worker = OutboxWorker::builder_shared(store.clone())
        .registry(Registry::new())
        .register_handler_with::<OrderPlaced, _>(seen.clone(), HandlerOptions::new().name("ship"))
        .register_handler_with::<Ping, _>(seen.clone(), HandlerOptions::new().name("log"))
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while seen.get(order_id).is_none() || seen.get(ping.id).is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "both handled in time"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(seen.get(order_id), Some(owned(order("42"))));
    assert_eq!(seen.get(ping.id), Some(owned(NO_AGGREGATE)));
    test.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_handler_sees_the_aggregate() {
    a_handler_sees_the_aggregate(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_handler_sees_the_aggregate() {
    a_handler_sees_the_aggregate(TestStore::sqlite().await).await;
}

async fn dead_letters_and_their_replays_keep_the_aggregate(test: TestStore) {
    let store = test.delivery_store();
    let placed_id = test.enqueue(&placed(42)).await;
    let cancelled = Envelope::new(&OrderCancelled { order_id: 42 }).unwrap();
    let ping = Envelope::new(&Ping { n: 1 }).unwrap();
    store
        .publish(vec![cancelled.clone(), ping.clone()])
        .await
        .unwrap();

    let token = Uuid::now_v7();
    store.expand(&routes(), 100).await.unwrap();
    let claimed = store
        .claim(token, 100, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    for claim in &claimed {
        assert!(store
            .deliveries()
            .dead_letter(token, claim.id, &Reason::HANDLER_REJECTED, "no", 1)
            .await
            .unwrap());
    }
    let letters = dead_letters_by_message(&*store).await;
    assert_eq!(letters.len(), 3);
    assert_eq!(aggregate_of(&letters[&placed_id].envelope), order("42"));
    assert_eq!(aggregate_of(&letters[&cancelled.id].envelope), order("42"));
    assert_eq!(aggregate_of(&letters[&ping.id].envelope), NO_AGGREGATE);
    assert_eq!(letters[&placed_id].handler.as_deref(), Some("ship"));
    assert_eq!(
        letters[&cancelled.id].handler, None,
        "it had no handler: a replay puts it back in the outbox"
    );

    // A dead letter inserted as it is (what a broker worker does) reads back the same.
    for letter in letters.values() {
        assert!(store.delete_dead_letter(letter.id).await.unwrap());
        store.insert_dead_letter(letter).await.unwrap();
    }
    assert_eq!(dead_letters_by_message(&*store).await, letters);

    for letter in letters.values() {
        assert!(store.replay_dead_letter(letter.id).await.unwrap());
    }
    assert!(store.dead_letters(100).await.unwrap().is_empty());
    // `placed` and `ping` go back to their handlers' deliveries, `cancelled` to the outbox,
    // which the expansion turns into a delivery again.
    let again = expand_and_claim(&*store).await;
    assert_eq!(again.len(), 3, "{again:?}");
    assert_eq!(again[&placed_id].handler, "ship");
    assert_eq!(again[&cancelled.id].handler, NO_HANDLER);
    assert_eq!(aggregate_of(&again[&placed_id].envelope), order("42"));
    assert_eq!(aggregate_of(&again[&cancelled.id].envelope), order("42"));
    assert_eq!(aggregate_of(&again[&ping.id].envelope), NO_AGGREGATE);
    test.finish().await;
}

#[tokio::test]
async fn postgres_dead_letters_and_their_replays_keep_the_aggregate() {
    dead_letters_and_their_replays_keep_the_aggregate(TestStore::postgres().await).await;
}

#[tokio::test]
async fn sqlite_dead_letters_and_their_replays_keep_the_aggregate() {
    dead_letters_and_their_replays_keep_the_aggregate(TestStore::sqlite().await).await;
}

async fn delayed_messages_keep_the_aggregate(test: TestStore) {
    let a_second_ago = Utc::now() - chrono::Duration::seconds(1);
    let from_transaction = test.schedule_at(a_second_ago, &placed(42)).await;
    let ping_from_transaction = test.schedule_at(a_second_ago, &Ping { n: 1 }).await;
    let from_store = Envelope::new(&placed(7)).unwrap();
    let ping_from_store = Envelope::new(&Ping { n: 2 }).unwrap();
    test.store
        .schedule_messages(
            vec![from_store.clone(), ping_from_store.clone()],
            Due::After(Duration::ZERO),
        )
        .await
        .unwrap();
    let later = Envelope::new(&placed(9)).unwrap();
    test.store
        .schedule_messages(vec![later], Due::After(Duration::from_secs(3600)))
        .await
        .unwrap();

    assert_eq!(test.store.release_due_messages(100).await.unwrap(), 4);
    let claimed = expand_and_claim(&*test.delivery_store()).await;
    assert_eq!(claimed.len(), 4, "{claimed:?}");
    let seen = |id: &Uuid| aggregate_of(&claimed[id].envelope);
    assert_eq!(seen(&from_transaction), order("42"));
    assert_eq!(seen(&ping_from_transaction), NO_AGGREGATE);
    assert_eq!(seen(&from_store.id), order("7"));
    assert_eq!(seen(&ping_from_store.id), NO_AGGREGATE);
    test.finish().await;
}

#[tokio::test]
async fn postgres_delayed_messages_keep_the_aggregate() {
    delayed_messages_keep_the_aggregate(TestStore::postgres().await).await;
}

#[tokio::test]
async fn sqlite_delayed_messages_keep_the_aggregate() {
    delayed_messages_keep_the_aggregate(TestStore::sqlite().await).await;
}

/// Delayed messages gained their aggregate columns in schema version 5: a store migrated
/// before (simulated by taking them away again, with what the versions after it added) gets them
/// on its next migration.
async fn an_upgraded_store_keeps_the_aggregate_of_delayed_messages(test: TestStore) {
    assert_eq!(test.schema_versions().await, test.latest_schema_version());
    test.execute(
        "ALTER TABLE {table} DROP COLUMN aggregate;
         ALTER TABLE {table} DROP COLUMN aggregate_key;",
        "scheduled_messages",
    )
    .await;
    for index in ["dead_letters_by_handler", "dead_letters_by_reason"] {
        test.execute("DROP INDEX {table}", index).await;
    }
    test.execute("DROP TABLE {table}", "record_attempts").await;
    for column in [
        "handler",
        "attempts",
        "lease_owner",
        "leased_until",
        "recovered",
    ] {
        let drop = format!("ALTER TABLE {{table}} DROP COLUMN {column}");
        test.execute(&drop, "outbox").await;
    }
    test.execute("DELETE FROM {table} WHERE version >= 5", "schema_versions")
        .await;
    test.store.migrate().await.unwrap();
    assert_eq!(test.schema_versions().await, test.latest_schema_version());

    let id = test
        .schedule_at(Utc::now() - chrono::Duration::seconds(1), &placed(42))
        .await;
    assert_eq!(test.store.release_due_messages(100).await.unwrap(), 1);
    let claimed = expand_and_claim(&*test.delivery_store()).await;
    assert_eq!(aggregate_of(&claimed[&id].envelope), order("42"));
    test.finish().await;
}

#[tokio::test]
async fn postgres_an_upgraded_store_keeps_the_aggregate_of_delayed_messages() {
    an_upgraded_store_keeps_the_aggregate_of_delayed_messages(TestStore::postgres().await).await;
}

#[tokio::test]
async fn sqlite_an_upgraded_store_keeps_the_aggregate_of_delayed_messages() {
    an_upgraded_store_keeps_the_aggregate_of_delayed_messages(TestStore::sqlite().await).await;
}

/// A broker that confirms everything except the messages it is told to refuse for good, and
/// records what it was handed.
#[derive(Default)]
struct RecordingSink {
    handed: Mutex<Vec<Envelope>>,
    refuse: Mutex<Vec<Uuid>>,
}

impl RecordingSink {
    fn handed(&self) -> HashMap<Uuid, Envelope> {
        self.handed
            .lock()
            .unwrap()
            .drain(..)
            .map(|envelope| (envelope.id, envelope))
            .collect()
    }
}

impl RelaySink for RecordingSink {
    fn publish<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<Vec<Unpublishable>, String>> {
        Box::pin(async move {
            self.handed.lock().unwrap().extend_from_slice(envelopes);
            let refuse = self.refuse.lock().unwrap();
            Ok(envelopes
                .iter()
                .filter(|envelope| refuse.contains(&envelope.id))
                .map(|envelope| {
                    Unpublishable::new(
                        envelope.id,
                        hexeract::Reason::PAYLOAD_INVALID,
                        "refused for the test",
                    )
                })
                .collect())
        })
    }
}

async fn the_relay_hands_the_broker_the_aggregate(test: TestStore) {
    let store = test.delivery_store();
    let enqueued = test.enqueue(&placed(42)).await;
    let published = Envelope::new(&placed(7)).unwrap();
    let ping = Envelope::new(&Ping { n: 1 }).unwrap();
    let refused = Envelope::new(&OrderCancelled { order_id: 43 }).unwrap();
    store
        .publish(vec![published.clone(), ping.clone(), refused.clone()])
        .await
        .unwrap();

    let sink = RecordingSink::default();
    sink.refuse.lock().unwrap().push(refused.id);
    assert_eq!(store.relay(100, &sink).await.unwrap(), 4);
    let handed = sink.handed();
    assert_eq!(handed.len(), 4);
    assert_eq!(aggregate_of(&handed[&enqueued]), order("42"));
    assert_eq!(aggregate_of(&handed[&published.id]), order("7"));
    assert_eq!(aggregate_of(&handed[&ping.id]), NO_AGGREGATE);
    assert_eq!(aggregate_of(&handed[&refused.id]), order("43"));

    // The refused one is dead-lettered with its aggregate, and a replay relays it with it.
    let letters = dead_letters_by_message(&*store).await;
    assert_eq!(letters.len(), 1);
    let letter = &letters[&refused.id];
    assert_eq!(letter.reason, Reason::PAYLOAD_INVALID);
    assert_eq!(aggregate_of(&letter.envelope), order("43"));
    sink.refuse.lock().unwrap().clear();
    assert!(store.replay_dead_letter(letter.id).await.unwrap());
    assert_eq!(store.relay(100, &sink).await.unwrap(), 1);
    let handed = sink.handed();
    assert_eq!(aggregate_of(&handed[&refused.id]), order("43"));
    assert_eq!(store.backlog().await.unwrap(), 0);
    test.finish().await;
}

#[tokio::test]
async fn postgres_the_relay_hands_the_broker_the_aggregate() {
    the_relay_hands_the_broker_the_aggregate(TestStore::postgres().await).await;
}

#[tokio::test]
async fn sqlite_the_relay_hands_the_broker_the_aggregate() {
    the_relay_hands_the_broker_the_aggregate(TestStore::sqlite().await).await;
}

/// A registered handler tells the aggregate of its message type (what a Kafka transport checks
/// at startup), and `None` for a message without one.
#[test]
fn the_registry_knows_each_handlers_aggregate() {
    let mut registry = Registry::new();
    registry
        .register::<OrderPlaced, _>(Seen::default(), HandlerOptions::new().name("ship"))
        .unwrap();
    registry
        .register::<Ping, _>(Seen::default(), HandlerOptions::new().name("log"))
        .unwrap();
    let aggregate = |name: &str| registry.get(name).unwrap().handler().aggregate();
    assert_eq!(aggregate("ship"), Some("order"));
    assert_eq!(aggregate("log"), None);
}
