//! The outbox on SQLite, the embedded default: migrations, enqueue in the caller's
//! transaction, claims under a lease, settling, dead letters, and workers sharing one file.
//! What one worker delivers, retries and dead-letters is the conformance suite's
//! (`conformance.rs`, its `on_sqlite` cells).
//!
//! Each test opens a database file in a directory of its own under the system's temp
//! directory, removed at the end, so tests run in parallel.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hexeract::outbox::OutboxWorker;
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::{DeadLetterStore, Housekeeping};
use hexeract::store::{DeliveryId, DeliveryStore, Routes, NO_HANDLER};
use hexeract::{
    CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Reason, Registry,
};
use uuid::Uuid;

/// A fresh directory with a migrated store in it; the directory is removed on drop.
struct TestDb {
    dir: PathBuf,
    store: SqliteStore,
}

impl TestDb {
    async fn new() -> TestDb {
        let dir = std::env::temp_dir().join(format!("hexeract-sqlite-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("create the test directory");
        let store = SqliteStore::open(dir.join("outbox.db"))
            .await
            .expect("open the database file");
        store.migrate().await.expect("migrate");
        TestDb { dir, store }
    }

    fn store(&self) -> SqliteStore {
        self.store.clone()
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM \"hexeract_{table}\""))
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }

    /// Closes the pool so that the files are released before the directory goes.
    async fn finish(self) {
        self.store.pool().close().await;
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.OrderPlaced")]
struct OrderPlaced {
    order_id: u32,
}

fn routes(pairs: &[(&str, &str)]) -> Routes {
    Routes {
        pairs: pairs
            .iter()
            .map(|(t, h)| ((*t).to_owned(), (*h).to_owned()))
            .collect(),
    }
}

#[tokio::test]
async fn migrating_twice_and_concurrently_is_harmless() {
    let db = TestDb::new().await;
    let store = db.store();
    store.migrate().await.unwrap();
    let (a, b, c) = tokio::join!(store.migrate(), store.migrate(), store.migrate());
    a.unwrap();
    b.unwrap();
    c.unwrap();
    assert_eq!(
        db.count("schema_versions").await,
        8,
        "versions 1 to 8, once each"
    );

    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(journal, "wal");

    // Another prefix in the same file is another set of tables.
    let other = SqliteStore::new(store.pool().clone(), "other").unwrap();
    other.migrate().await.unwrap();
    other
        .publish(vec![Envelope::new(&OrderPlaced { order_id: 1 }).unwrap()])
        .await
        .unwrap();
    assert_eq!(db.count("outbox").await, 0);
    let theirs: i64 = sqlx::query_scalar("SELECT count(*) FROM \"other_outbox\"")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(theirs, 1);
    assert!(SqliteStore::new(store.pool().clone(), "bad\"name").is_err());
    db.finish().await;
}

#[tokio::test]
async fn enqueue_joins_the_callers_transaction() {
    let db = TestDb::new().await;
    let pool = db.store().pool().clone();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    hexeract::outbox::enqueue(&mut tx, &OrderPlaced { order_id: 1 })
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        db.count("outbox").await,
        0,
        "a rollback leaves nothing behind"
    );

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let id = hexeract::outbox::enqueue(&mut tx, &OrderPlaced { order_id: 2 })
        .await
        .unwrap();
    let batch: Vec<Envelope> = (3..6)
        .map(|n| {
            Envelope::new(&OrderPlaced { order_id: n })
                .unwrap()
                .with_header("traceparent", "00-abc-def-01")
        })
        .collect();
    hexeract::outbox::enqueue_envelopes(&mut tx, "hexeract", &batch)
        .await
        .unwrap();
    assert_eq!(db.count("outbox").await, 0, "not visible before commit");
    tx.commit().await.unwrap();
    assert_eq!(db.count("outbox").await, 4);

    let stored: String = sqlx::query_scalar("SELECT id FROM hexeract_outbox ORDER BY id LIMIT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        stored,
        id.hyphenated().to_string(),
        "ids are hyphenated text"
    );
    db.finish().await;
}

#[tokio::test]
async fn an_envelope_with_headers_is_enqueued_in_the_default_namespace() {
    let db = TestDb::new().await;
    let pool = db.store().pool().clone();
    let envelope = Envelope::new(&OrderPlaced { order_id: 7 })
        .unwrap()
        .with_header("tenant", "acme");
    let sent = envelope.id;

    let mut tx = pool.begin().await.unwrap();
    let id = hexeract::outbox::enqueue_envelope(&mut tx, envelope)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(id, sent);
    let headers: String = sqlx::query_scalar("SELECT headers FROM hexeract_outbox WHERE id = ?")
        .bind(id.hyphenated().to_string())
        .fetch_one(&pool)
        .await
        .expect("the row is in the outbox of `hexeract`");
    assert!(headers.contains(r#""tenant":"acme""#), "{headers}");
    db.finish().await;
}

#[tokio::test]
async fn the_sqlx_hexeract_re_exports_is_the_one_its_stores_use() {
    let db = TestDb::new().await;
    // The store's pool is a pool of `hexeract::sqlx`: one type, one version.
    let pool: &hexeract::sqlx::SqlitePool = db.store.pool();
    let mut tx: hexeract::sqlx::Transaction<'_, hexeract::sqlx::Sqlite> =
        pool.begin().await.unwrap();
    hexeract::sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        .execute(&mut *tx)
        .await
        .unwrap();
    hexeract::outbox::enqueue(&mut tx, &OrderPlaced { order_id: 8 })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.count("outbox").await, 1);
    db.finish().await;
}

#[tokio::test]
async fn expansion_makes_one_delivery_per_handler_and_one_for_unknown_types() {
    let db = TestDb::new().await;
    let store = db.store();
    let parent = Envelope::new(&OrderPlaced { order_id: 0 }).unwrap();
    let known = Envelope::new(&OrderPlaced { order_id: 1 })
        .unwrap()
        .with_header("k", "v")
        .caused_by(&parent);
    let unknown = Envelope::from_raw("test.Nobody", &b"{}"[..]);
    store
        .publish(vec![known.clone(), unknown.clone()])
        .await
        .unwrap();

    // The oldest message owed is the first published, in the outbox or (below) as deliveries.
    let oldest = store
        .oldest_pending()
        .await
        .unwrap()
        .expect("something is owed");
    assert!(
        (oldest - known.created_at).num_milliseconds().abs() <= 1,
        "{oldest} vs {}",
        known.created_at
    );

    let moved = store
        .expand(
            &routes(&[("test.OrderPlaced", "a"), ("test.OrderPlaced", "b")]),
            10,
        )
        .await
        .unwrap();
    assert_eq!(moved, 2, "two outbox rows moved");
    assert_eq!(
        db.count("outbox").await,
        0,
        "expanded rows leave the outbox"
    );
    assert_eq!(db.count("deliveries").await, 3);
    let oldest = store
        .oldest_pending()
        .await
        .unwrap()
        .expect("something is owed");
    assert!((oldest - known.created_at).num_milliseconds().abs() <= 1);
    assert_eq!(store.expand(&routes(&[]), 10).await.unwrap(), 0);

    let claimed = store
        .claim(Uuid::now_v7(), 10, Duration::from_secs(30))
        .await
        .unwrap();
    let mut seen: Vec<(String, Uuid)> = claimed
        .iter()
        .map(|c| (c.handler.clone(), c.envelope.id))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (NO_HANDLER.to_owned(), unknown.id),
            ("a".to_owned(), known.id),
            ("b".to_owned(), known.id)
        ]
    );
    assert!(claimed.iter().all(|c| c.envelope.attempt == 1));
    let delivered = claimed.iter().find(|c| c.handler == "a").unwrap();
    let mut expected = known.clone();
    expected.attempt = 1;
    assert_eq!(
        delivered.envelope, expected,
        "the message arrives as published"
    );
    db.finish().await;
}

#[tokio::test]
async fn expansion_takes_at_most_the_limit_in_publishing_order() {
    let db = TestDb::new().await;
    let store = db.store();
    let envelopes: Vec<Envelope> = (0..5)
        .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
        .collect();
    store.publish(envelopes.clone()).await.unwrap();
    let routes = routes(&[("test.OrderPlaced", "h")]);
    assert_eq!(store.expand(&routes, 2).await.unwrap(), 2);
    assert_eq!(db.count("outbox").await, 3);
    let claimed = store
        .claim(Uuid::now_v7(), 10, Duration::from_secs(30))
        .await
        .unwrap();
    let mut ids: Vec<Uuid> = claimed.iter().map(|c| c.envelope.id).collect();
    ids.sort();
    assert_eq!(ids, [envelopes[0].id, envelopes[1].id], "oldest first");
    assert_eq!(store.expand(&routes, 10).await.unwrap(), 3);
    assert_eq!(db.count("deliveries").await, 5);
    db.finish().await;
}

#[tokio::test]
async fn a_claim_counts_the_attempt_and_hides_the_row_until_its_lease_ends() {
    let db = TestDb::new().await;
    let store = db.store();
    store
        .publish(vec![Envelope::new(&OrderPlaced { order_id: 9 }).unwrap()])
        .await
        .unwrap();
    store
        .expand(&routes(&[("test.OrderPlaced", "h")]), 10)
        .await
        .unwrap();

    let first = Uuid::now_v7();
    let claimed = store
        .claim(first, 10, Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].envelope.attempt, 1);

    let second = Uuid::now_v7();
    assert!(
        store
            .claim(second, 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "claimed rows are hidden while the lease lasts"
    );

    tokio::time::sleep(Duration::from_millis(100)).await;
    let reclaimed = store
        .claim(second, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(reclaimed.len(), 1, "the lease ended: the row is due again");
    assert_eq!(reclaimed[0].id, claimed[0].id);
    assert_eq!(
        reclaimed[0].envelope.attempt, 2,
        "attempts are counted at claim"
    );

    // The first worker comes back too late: none of its settlements land.
    let id = claimed[0].id;
    assert_eq!(store.deliveries().ack(first, &[id]).await.unwrap(), 0);
    assert!(!store
        .deliveries()
        .retry(first, id, Duration::ZERO, "late")
        .await
        .unwrap());
    assert!(!store
        .deliveries()
        .dead_letter(first, id, &Reason::HANDLER_REJECTED, "late", 1)
        .await
        .unwrap());
    assert_eq!(db.count("dead_letters").await, 0);
    assert_eq!(store.deliveries().ack(second, &[id]).await.unwrap(), 1);
    assert_eq!(db.count("deliveries").await, 0);
    db.finish().await;
}

#[tokio::test]
async fn settling_needs_the_claim_token_and_retry_sets_the_next_due_time() {
    let db = TestDb::new().await;
    let store = db.store();
    store
        .publish(vec![Envelope::new(&OrderPlaced { order_id: 1 }).unwrap()])
        .await
        .unwrap();
    store
        .expand(&routes(&[("test.OrderPlaced", "h")]), 10)
        .await
        .unwrap();
    let token = Uuid::now_v7();
    let id = store
        .claim(token, 10, Duration::from_secs(30))
        .await
        .unwrap()[0]
        .id;
    let DeliveryId::Row(row) = id else {
        panic!("an expanded delivery has a row: {id:?}")
    };

    let stranger = Uuid::now_v7();
    assert_eq!(store.deliveries().ack(stranger, &[id]).await.unwrap(), 0);
    assert_eq!(store.deliveries().ack(token, &[]).await.unwrap(), 0);
    assert!(!store
        .deliveries()
        .retry(stranger, id, Duration::ZERO, "no")
        .await
        .unwrap());
    assert!(!store
        .deliveries()
        .dead_letter(stranger, id, &Reason::HANDLER_REJECTED, "no", 1)
        .await
        .unwrap());
    assert_eq!(db.count("deliveries").await, 1);
    assert_eq!(db.count("dead_letters").await, 0);

    assert!(store
        .deliveries()
        .retry(token, id, Duration::from_secs(60), "warehouse unavailable")
        .await
        .unwrap());
    assert!(
        store
            .claim(Uuid::now_v7(), 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "not due for a minute"
    );
    let last_error: Option<String> =
        sqlx::query_scalar("SELECT last_error FROM hexeract_deliveries WHERE id = ?1")
            .bind(row)
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(last_error.as_deref(), Some("warehouse unavailable"));
    assert!(
        !store
            .deliveries()
            .retry(token, id, Duration::ZERO, "again")
            .await
            .unwrap(),
        "a retry releases the claim"
    );

    // Retried at once, it is claimable again with the next attempt.
    sqlx::query("UPDATE hexeract_deliveries SET available_at = 0 WHERE id = ?1")
        .bind(row)
        .execute(store.pool())
        .await
        .unwrap();
    let again = store
        .claim(token, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again[0].envelope.attempt, 2);
    assert!(store
        .deliveries()
        .retry(token, id, Duration::ZERO, "now")
        .await
        .unwrap());
    let now = store
        .claim(token, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(now.len(), 1, "a zero delay is due at once");
    assert_eq!(now[0].envelope.attempt, 3);
    db.finish().await;
}

#[tokio::test]
async fn dead_letters_keep_the_message_and_can_be_replayed_and_purged() {
    let db = TestDb::new().await;
    let store = db.store();
    let bytes: &[u8] = b"not json \xff\x00";
    let envelope = Envelope::from_raw("test.OrderPlaced", bytes)
        .with_header("k", "v")
        .with_correlation_id(Uuid::now_v7());
    let unknown = Envelope::from_raw("test.Nobody", &b"{}"[..]);
    store
        .publish(vec![envelope.clone(), unknown.clone()])
        .await
        .unwrap();
    store
        .expand(&routes(&[("test.OrderPlaced", "h")]), 10)
        .await
        .unwrap();
    let token = Uuid::now_v7();
    let claimed = store
        .claim(token, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    for delivery in &claimed {
        assert!(store
            .deliveries()
            .dead_letter(
                token,
                delivery.id,
                &Reason::PAYLOAD_INVALID,
                &"x".repeat(10_000),
                1
            )
            .await
            .unwrap());
    }
    assert_eq!(db.count("deliveries").await, 0);
    assert!(
        !store
            .deliveries()
            .dead_letter(token, claimed[0].id, &Reason::PAYLOAD_INVALID, "twice", 1)
            .await
            .unwrap(),
        "already gone"
    );

    let dead = store.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 2);
    assert!(dead[0].dead_lettered_at <= dead[1].dead_lettered_at);
    assert_eq!(store.dead_letters(1).await.unwrap().len(), 1);
    let letter = dead.iter().find(|d| d.envelope.id == envelope.id).unwrap();
    assert_eq!(letter.reason, Reason::PAYLOAD_INVALID);
    assert_eq!(letter.handler.as_deref(), Some("h"));
    assert_eq!(letter.attempts, 1);
    assert_eq!(&letter.envelope.payload[..], bytes, "the original bytes");
    assert_eq!(letter.envelope.header("k"), Some("v"));
    assert_eq!(letter.envelope.correlation_id, envelope.correlation_id);
    assert_eq!(letter.envelope.created_at, envelope.created_at);
    assert!(letter.detail.len() < 5_000, "detail is truncated");
    assert!(letter.detail.starts_with("xxx"));
    let age = chrono::Utc::now() - letter.dead_lettered_at;
    assert!(age >= chrono::TimeDelta::zero() && age < chrono::TimeDelta::seconds(60));
    let orphan = dead.iter().find(|d| d.envelope.id == unknown.id).unwrap();
    assert_eq!(orphan.handler, None);

    assert!(store.replay_dead_letter(letter.id).await.unwrap());
    assert!(
        !store.replay_dead_letter(letter.id).await.unwrap(),
        "replays once"
    );
    assert!(!store.replay_dead_letter(Uuid::now_v7()).await.unwrap());
    let attempts: i64 = sqlx::query_scalar("SELECT attempts FROM hexeract_deliveries")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(attempts, 0, "back to its handler with attempts reset");
    assert!(store.replay_dead_letter(orphan.id).await.unwrap());
    assert_eq!(db.count("deliveries").await, 1);
    assert_eq!(
        db.count("outbox").await,
        1,
        "no handler: back to the outbox to be routed again"
    );
    let again = store
        .claim(token, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].handler, "h");
    assert_eq!(again[0].envelope.attempt, 1, "attempts start over");
    assert_eq!(&again[0].envelope.payload[..], bytes);
    assert_eq!(
        store
            .expand(&routes(&[("test.Nobody", "late")]), 10)
            .await
            .unwrap(),
        1,
        "the replayed orphan is routed again"
    );

    assert_eq!(store.purge_dead_letters().await.unwrap(), 0);
    assert!(store
        .deliveries()
        .dead_letter(token, again[0].id, &Reason::HANDLER_REJECTED, "no", 1)
        .await
        .unwrap());
    assert_eq!(store.purge_dead_letters().await.unwrap(), 1);
    assert!(store.dead_letters(10).await.unwrap().is_empty());
    db.finish().await;
}

#[tokio::test]
async fn an_in_memory_store_survives_its_pool_and_serves_concurrent_writers() {
    let store = SqliteStore::in_memory().await.unwrap();
    store.migrate().await.unwrap();
    let publishers: Vec<_> = (0..20)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .publish(vec![Envelope::new(&OrderPlaced { order_id: n }).unwrap()])
                    .await
            })
        })
        .collect();
    for publisher in publishers {
        publisher.await.unwrap().unwrap();
    }
    let mut tx = store.pool().begin().await.unwrap();
    hexeract::outbox::enqueue(&mut tx, &OrderPlaced { order_id: 99 })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        store
            .expand(&routes(&[("test.OrderPlaced", "h")]), 100)
            .await
            .unwrap(),
        21
    );

    let other = SqliteStore::in_memory().await.unwrap();
    other.migrate().await.unwrap();
    assert!(
        other
            .claim(Uuid::now_v7(), 100, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "each in-memory store is a database of its own"
    );
    let claimed = store
        .claim(Uuid::now_v7(), 100, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 21);
}

// --- workers end to end ---

/// One handler call: (order id, handler, attempt).
type Call = (u32, &'static str, u32);

/// Records every call.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn record(&self, order: &OrderPlaced, handler: &'static str, ctx: &Context) {
        self.0
            .lock()
            .unwrap()
            .push((order.order_id, handler, ctx.attempt()));
    }
}

struct Confirm(Calls);

impl Handler<OrderPlaced> for Confirm {
    type Error = String;
    async fn handle(&self, order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        self.0.record(&order, "confirm", ctx);
        Ok(())
    }
}

/// Fails the first call of every order, then succeeds.
struct Reserve(Calls);

impl Handler<OrderPlaced> for Reserve {
    type Error = String;
    async fn handle(&self, order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        self.0.record(&order, "reserve", ctx);
        if ctx.attempt() == 1 {
            return Err("warehouse unavailable".into());
        }
        Ok(())
    }
}

/// Polls until the database holds no delivery and no outbox row, or fails after 30 s.
async fn drained(db: &TestDb) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if db.count("outbox").await == 0 && db.count("deliveries").await == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the outbox did not drain within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_one_file_without_losing_or_repeating_a_delivery() {
    let db = TestDb::new().await;
    let store = db.store();
    let orders = 300u32;
    store
        .publish(
            (0..orders)
                .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
                .collect(),
        )
        .await
        .unwrap();

    let calls = Calls::default();
    let cancel = CancellationToken::new();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let worker = OutboxWorker::builder(store.clone())
                .registry(Registry::new())
                .register_handler_with::<OrderPlaced, _>(
                    Confirm(calls.clone()),
                    HandlerOptions::new().name("confirm"),
                )
                .register_handler_with::<OrderPlaced, _>(
                    Reserve(calls.clone()),
                    HandlerOptions::new().name("reserve"),
                )
                .retry_delays(Duration::from_millis(5), Duration::from_millis(20))
                .poll_interval(Duration::from_millis(10))
                .batch_size(16)
                .build()
                .expect("worker builds");
            tokio::spawn(worker.run(cancel.clone()))
        })
        .collect();
    drained(&db).await;
    cancel.cancel();
    for worker in workers {
        worker.await.unwrap().expect("run returns Ok(()) on cancel");
    }

    let mut calls = calls.0.lock().unwrap().clone();
    calls.sort();
    let mut expected: Vec<Call> = (0..orders)
        .flat_map(|n| [(n, "confirm", 1), (n, "reserve", 1), (n, "reserve", 2)])
        .collect();
    expected.sort();
    assert_eq!(
        calls, expected,
        "one process, serialized claims: every call once, none repeated"
    );
    assert_eq!(db.count("dead_letters").await, 0);
    db.finish().await;
}

/// Asks for its retry an hour later, every time.
struct Later(Arc<Mutex<Vec<std::time::Instant>>>);

impl Handler<OrderPlaced> for Later {
    type Error = hexeract::HandlerOutcome;
    async fn handle(&self, _order: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        self.0.lock().unwrap().push(std::time::Instant::now());
        Err(hexeract::HandlerOutcome::retry_after(
            Duration::from_secs(3600),
            "come back in an hour",
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_longer_than_the_longest_delay_is_capped_by_it() {
    let db = TestDb::new().await;
    let store = db.store();
    store
        .publish(vec![Envelope::new(&OrderPlaced { order_id: 1 }).unwrap()])
        .await
        .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    // RETRY_MAX_DELAY_MS's knob: 50 ms. Without the cap the second call would come an hour
    // later and the outbox would not drain.
    let worker = OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<OrderPlaced, _>(
            Later(calls.clone()),
            HandlerOptions::new().name("later"),
        )
        .retry_delays(Duration::from_millis(5), Duration::from_millis(50))
        .poll_interval(Duration::from_millis(10))
        .max_deliveries(2)
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    drained(&db).await;
    cancel.cancel();
    running.await.unwrap().unwrap();

    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "called twice, then dead-lettered");
    let waited = calls[1] - calls[0];
    assert!(waited >= Duration::from_millis(40), "{waited:?}");
    let dead = store.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 2);
    db.finish().await;
}

/// A worker and its producers often start together on one new file. Switching a file to WAL
/// needs a lock that SQLite's busy timeout does not wait for; before `open` retried it, one
/// of them failed now and then with `database is locked`. Eight stores open, migrate and
/// publish at once, each closes while the others still work, and a store opened right after
/// reads everything; repeated, so that the moments overlap in many ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_opening_one_new_file_at_once_all_open() {
    for round in 0..10 {
        let dir = std::env::temp_dir().join(format!("hexeract-sqlite-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("create the test directory");
        let path = dir.join("outbox.db");
        let opened = futures_util::future::join_all((0..8).map(|n| {
            let path = path.clone();
            tokio::spawn(async move {
                let store = SqliteStore::open(&path).await?;
                store.migrate().await?;
                store
                    .publish(vec![Envelope::new(&OrderPlaced { order_id: n }).unwrap()])
                    .await?;
                store.pool().close().await;
                Ok::<_, hexeract::store::StoreError>(())
            })
        }))
        .await;
        for (n, result) in opened.into_iter().enumerate() {
            result
                .expect("no panic")
                .unwrap_or_else(|error| panic!("round {round}, store {n}: {error}"));
        }
        let store = SqliteStore::open(&path)
            .await
            .expect("open after the others");
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(journal, "wal", "round {round}");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM \"hexeract_outbox\"")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(rows, 8, "round {round}: every publish is in the file");
        store.pool().close().await;
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[tokio::test]
async fn ack_and_take_deletes_only_its_claims_acks_and_takes_the_next_batch_at_once() {
    let db = TestDb::new().await;
    let store = db.store();
    let envelopes: Vec<Envelope> = (0..4)
        .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
        .collect();
    store.publish(envelopes.clone()).await.unwrap();
    let routes = routes(&[("test.OrderPlaced", "h")]);

    let first = Uuid::now_v7();
    let taken = store
        .take(&routes, first, 2, Duration::from_secs(30))
        .await
        .unwrap();
    let mut ids: Vec<Uuid> = taken.iter().map(|c| c.envelope.id).collect();
    ids.sort();
    assert_eq!(ids, [envelopes[0].id, envelopes[1].id], "oldest first");
    let acked: Vec<_> = taken.iter().map(|c| c.id).collect();

    // Under another token the acks land nowhere, and the take still happens.
    let (landed, next) = store
        .ack_and_take(
            (Uuid::now_v7(), &acked),
            &routes,
            Uuid::now_v7(),
            1,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(landed, 0, "not that claim's token");
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].envelope.id, envelopes[2].id);

    let (landed, last) = store
        .ack_and_take(
            (first, &acked),
            &routes,
            Uuid::now_v7(),
            10,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(landed, 2);
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].envelope.id, envelopes[3].id);
    assert_eq!(last[0].envelope.attempt, 1);
    // Claimed in place (the type has one handler): the outbox rows carry the claims.
    assert_eq!(
        db.count("outbox").await + db.count("deliveries").await,
        2,
        "the two still claimed"
    );
    assert_eq!(store.backlog().await.unwrap(), 2);
    db.finish().await;
}

/// Where every type has one handler, a take is one round trip of four statements: the claim
/// in place takes what the claim of due deliveries left of the limit, and the acks sent with
/// it land in the same transaction.
#[tokio::test]
async fn a_take_claims_due_retries_first_and_new_messages_in_place_up_to_the_limit() {
    let db = TestDb::new().await;
    let store = db.store();
    let routes = routes(&[("test.OrderPlaced", "h")]);
    let lease = Duration::from_secs(30);
    let first: Vec<Envelope> = (0..2)
        .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
        .collect();
    store.publish(first.clone()).await.unwrap();
    let token = Uuid::now_v7();
    let taken = store.take(&routes, token, 10, lease).await.unwrap();
    assert_eq!(taken.len(), 2);
    // The first message's call failed: it moves to deliveries, due at once.
    let failed = taken.iter().find(|c| c.envelope.id == first[0].id).unwrap();
    assert!(store
        .deliveries()
        .retry(token, failed.id, Duration::ZERO, "boom")
        .await
        .unwrap());
    let succeeded: Vec<_> = taken
        .iter()
        .filter(|c| c.envelope.id == first[1].id)
        .map(|c| c.id)
        .collect();

    let later: Vec<Envelope> = (2..5)
        .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
        .collect();
    store.publish(later.clone()).await.unwrap();
    let (landed, next) = store
        .ack_and_take((token, &succeeded), &routes, Uuid::now_v7(), 3, lease)
        .await
        .unwrap();
    assert_eq!(landed, 1, "the second message's ack");
    let got: Vec<(Uuid, u32)> = next
        .iter()
        .map(|c| (c.envelope.id, c.envelope.attempt))
        .collect();
    assert_eq!(
        got,
        [(first[0].id, 2), (later[0].id, 1), (later[1].id, 1)],
        "the due retry, then the two oldest new messages: three in all"
    );
    let rest = store.take(&routes, Uuid::now_v7(), 3, lease).await.unwrap();
    assert_eq!(
        rest.iter().map(|c| c.envelope.id).collect::<Vec<_>>(),
        [later[2].id]
    );
    db.finish().await;
}

#[tokio::test]
async fn a_message_of_a_type_with_one_handler_is_claimed_and_settled_in_place() {
    let db = TestDb::new().await;
    let store = db.store();
    hexeract_tests::in_place::claimed_in_place_and_settled_there(&store, |table| db.count(table))
        .await;
    db.finish().await;
}

#[tokio::test]
async fn a_message_claimed_in_place_before_a_deploy_added_a_handler_is_expanded_recovered() {
    let db = TestDb::new().await;
    let store = db.store();
    hexeract_tests::in_place::claimed_in_place_then_expanded_after_a_deploy(&store).await;
    db.finish().await;
}

#[tokio::test]
async fn a_message_published_again_after_a_retry_is_not_run_beside_its_delivery() {
    let db = TestDb::new().await;
    let store = db.store();
    hexeract_tests::in_place::published_again_after_a_retry_runs_once(&store, |table| {
        db.count(table)
    })
    .await;
    db.finish().await;
}

#[tokio::test]
async fn the_relay_leaves_messages_an_outbox_worker_holds_in_place() {
    let db = TestDb::new().await;
    let store = db.store();
    hexeract_tests::in_place::the_relay_leaves_messages_claimed_in_place(&store).await;
    db.finish().await;
}

/// A relay sink whose publish waits until the test lets it go, as one waits out a broker's
/// memory alarm.
struct HeldSink {
    entered: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

impl hexeract::store::RelaySink for HeldSink {
    fn publish<'a>(
        &'a self,
        _envelopes: &'a [Envelope],
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<hexeract::store::Unpublishable>, String>>
    {
        Box::pin(async move {
            self.entered.notify_one();
            self.release.notified().await;
            Ok(Vec::new())
        })
    }
}

/// While a relay pass waits for its broker (an alarm can hold publishing for minutes), the
/// application's writes go on: the pass holds no write lock then. Before, the pass held
/// SQLite's write lock across the publish, and a publish beside it failed with `database is
/// locked` once the busy timeout (5 s) ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_on_while_a_relay_pass_waits_for_its_broker() {
    use hexeract::store::RelayStore;

    let db = TestDb::new().await;
    let store = Arc::new(db.store());
    store
        .publish(vec![Envelope::new(&OrderPlaced { order_id: 1 }).unwrap()])
        .await
        .unwrap();
    let sink = Arc::new(HeldSink {
        entered: Arc::new(tokio::sync::Notify::new()),
        release: Arc::new(tokio::sync::Notify::new()),
    });
    let pass = tokio::spawn({
        let (store, sink) = (store.clone(), sink.clone());
        async move { store.relay(10, &*sink).await }
    });
    sink.entered.notified().await;
    // The application writes, alone and in a transaction of its own, while the pass waits.
    store
        .publish(vec![Envelope::new(&OrderPlaced { order_id: 2 }).unwrap()])
        .await
        .expect("a publish beside a waiting relay pass");
    let mut tx = store.pool().begin().await.unwrap();
    hexeract::outbox::enqueue(&mut tx, &OrderPlaced { order_id: 3 })
        .await
        .expect("an enqueue beside a waiting relay pass");
    tx.commit().await.unwrap();
    sink.release.notify_one();
    assert_eq!(pass.await.unwrap().unwrap(), 1, "the pass relayed its row");
    assert_eq!(
        store.backlog().await.unwrap(),
        2,
        "the two written meanwhile wait"
    );
    drop(store);
}

/// A handler that does nothing, with a timeout of its own when registered so.
struct Idle;

impl Handler<OrderPlaced> for Idle {
    type Error = std::convert::Infallible;
    async fn handle(&self, _: OrderPlaced, _: &Context) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// The lease covers the longest call and 5 s to settle it: unset, it is derived from them; set
/// shorter (the seed's 30 s lease beside its 30 s timeout), the worker does not build, and the
/// error names the lease, the least it may be and the call that needs it.
#[tokio::test]
async fn the_lease_covers_the_longest_call_and_its_settle_or_the_worker_does_not_build() {
    let db = TestDb::new().await;
    let builder = || {
        OutboxWorker::builder(db.store())
            .registry(Registry::new())
            .register_handler_with::<OrderPlaced, _>(Idle, HandlerOptions::new().name("quick"))
            .register_handler_with::<OrderPlaced, _>(
                Idle,
                HandlerOptions::new()
                    .name("slow")
                    .timeout(Duration::from_secs(60)),
            )
    };
    let derived = builder().build().unwrap();
    assert!(format!("{derived:?}").contains("lease: 65s"), "{derived:?}");
    let refused = builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap_err()
        .to_string();
    for part in [
        "lease",
        "\"30s\"",
        "at least 65s",
        "the timeout of \"slow\"",
    ] {
        assert!(refused.contains(part), "{part:?} not in: {refused}");
    }
    let seeds = OutboxWorker::builder(db.store())
        .registry(Registry::new())
        .register_handler::<OrderPlaced, _>(Idle)
        .lease(Duration::from_secs(30))
        .handler_timeout(Duration::from_secs(30))
        .build()
        .unwrap_err()
        .to_string();
    assert!(seeds.contains("at least 35s"), "{seeds}");
    assert!(seeds.contains("handler_timeout"), "{seeds}");
    // Exactly the call and its room is enough.
    OutboxWorker::builder(db.store())
        .registry(Registry::new())
        .register_handler::<OrderPlaced, _>(Idle)
        .lease(Duration::from_secs(35))
        .build()
        .unwrap();
    db.finish().await;
}
