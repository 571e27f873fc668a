//! The outbox on a real PostgreSQL: migrations, enqueue in the caller's transaction, claims
//! under a lease, settling, dead letters, and workers end to end where PostgreSQL is what is
//! tested (workers sharing a schema, the NOTIFY wake-up, a batch's concurrency limit, the LISTEN
//! connection). What one worker delivers, retries and dead-letters is the conformance suite's
//! (`conformance.rs`, its `on_postgres` cells).
//!
//! Needs PostgreSQL at `TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! Each test works in a schema of its own, dropped at the end, so tests run in parallel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hexeract::outbox::OutboxWorker;
use hexeract::store::postgres::PgStore;
use hexeract::store::{DeadLetterStore, Housekeeping};
use hexeract::store::{DeliveryStore, Routes, NO_HANDLER};
use hexeract::{
    CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Reason, Registry,
};
use hexeract_tests::pg::TestSchema;
use uuid::Uuid;

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
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.store();
    let (a, b, c) = tokio::join!(store.migrate(), store.migrate(), store.migrate());
    a.unwrap();
    b.unwrap();
    c.unwrap();
    store.migrate().await.unwrap();
    assert_eq!(
        db.count("schema_versions").await,
        9,
        "versions 1 to 9, once each"
    );
    // Version 8: inserts leave half of each outbox page free, where a claim in place writes
    // the row's new version without a new index entry.
    let options: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE oid = $1::regclass")
            .bind(format!("\"{}\".outbox", db.schema))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        options
            .unwrap_or_default()
            .contains(&"fillfactor=50".to_owned()),
        "the outbox is created with fillfactor 50"
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn enqueue_joins_the_callers_transaction() {
    let db = TestSchema::new("hexeract-tests").await;
    db.migrated_store().await;

    let mut tx = db.pool.begin().await.unwrap();
    let envelope = Envelope::new(&OrderPlaced { order_id: 1 }).unwrap();
    hexeract::outbox::enqueue_envelopes(&mut tx, &db.schema, &[envelope])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(
        db.count("outbox").await,
        0,
        "a rollback leaves nothing behind"
    );

    let mut tx = db.pool.begin().await.unwrap();
    let batch: Vec<Envelope> = (0..3)
        .map(|n| {
            Envelope::new(&OrderPlaced { order_id: n })
                .unwrap()
                .with_header("traceparent", "00-abc-def-01")
        })
        .collect();
    hexeract::outbox::enqueue_envelopes(&mut tx, &db.schema, &batch)
        .await
        .unwrap();
    assert_eq!(db.count("outbox").await, 0, "not visible before commit");
    tx.commit().await.unwrap();
    assert_eq!(db.count("outbox").await, 3);
    db.drop_schema().await;
}

#[tokio::test]
async fn expansion_makes_one_delivery_per_handler_and_one_for_unknown_types() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let known = Envelope::new(&OrderPlaced { order_id: 1 }).unwrap();
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

    let created = store
        .expand(
            &routes(&[("test.OrderPlaced", "a"), ("test.OrderPlaced", "b")]),
            10,
        )
        .await
        .unwrap();
    assert_eq!(created, 2, "two outbox rows moved");
    assert_eq!(
        db.count("outbox").await,
        0,
        "expanded rows leave the outbox"
    );
    let oldest = store
        .oldest_pending()
        .await
        .unwrap()
        .expect("something is owed");
    assert!((oldest - known.created_at).num_milliseconds().abs() <= 1);

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
    db.drop_schema().await;
}

#[tokio::test]
async fn a_claim_hides_rows_until_its_lease_ends_and_settling_needs_the_claim() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let envelope = Envelope::new(&OrderPlaced { order_id: 9 })
        .unwrap()
        .with_header("k", "v");
    store.publish(vec![envelope.clone()]).await.unwrap();
    store
        .expand(&routes(&[("test.OrderPlaced", "h")]), 10)
        .await
        .unwrap();

    let first = Uuid::now_v7();
    let claimed = store
        .claim(first, 10, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let delivery = &claimed[0];
    assert_eq!(delivery.envelope.attempt, 1);
    assert_eq!(delivery.envelope.payload, envelope.payload);
    assert_eq!(delivery.envelope.header("k"), Some("v"));

    let second = Uuid::now_v7();
    assert!(store
        .claim(second, 10, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store
            .deliveries()
            .ack(second, &[delivery.id])
            .await
            .unwrap(),
        0,
        "not second's claim"
    );

    tokio::time::sleep(Duration::from_millis(400)).await;
    let reclaimed = store
        .claim(second, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        reclaimed.len(),
        1,
        "the lease ended: the delivery is due again"
    );
    assert_eq!(
        reclaimed[0].envelope.attempt, 2,
        "attempts are counted at claim"
    );

    // The first worker comes back too late: none of its settlements land.
    assert_eq!(
        store.deliveries().ack(first, &[delivery.id]).await.unwrap(),
        0
    );
    assert!(!store
        .deliveries()
        .retry(first, delivery.id, Duration::ZERO, "late")
        .await
        .unwrap());
    assert!(!store
        .deliveries()
        .dead_letter(first, delivery.id, &Reason::HANDLER_REJECTED, "late", 1)
        .await
        .unwrap());
    assert_eq!(
        store
            .deliveries()
            .ack(second, &[delivery.id])
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.count("deliveries").await, 0);
    db.drop_schema().await;
}

#[tokio::test]
async fn dead_letters_keep_the_message_and_can_be_replayed_and_purged() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let envelope = Envelope::from_raw("test.OrderPlaced", &b"not json"[..]).with_header("k", "v");
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
    let dead = store.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 2);
    let letter = dead.iter().find(|d| d.envelope.id == envelope.id).unwrap();
    assert_eq!(letter.reason, Reason::PAYLOAD_INVALID);
    assert_eq!(letter.handler.as_deref(), Some("h"));
    assert_eq!(letter.attempts, 1);
    assert_eq!(&letter.envelope.payload[..], b"not json");
    assert_eq!(letter.envelope.header("k"), Some("v"));
    assert!(letter.detail.len() < 5_000, "detail is truncated");
    let orphan = dead.iter().find(|d| d.envelope.id == unknown.id).unwrap();
    assert_eq!(orphan.handler, None);

    assert!(store.replay_dead_letter(letter.id).await.unwrap());
    assert!(
        !store.replay_dead_letter(letter.id).await.unwrap(),
        "replays once"
    );
    assert!(store.replay_dead_letter(orphan.id).await.unwrap());
    assert_eq!(db.count("deliveries").await, 1, "back to its handler");
    assert_eq!(
        db.count("outbox").await,
        1,
        "no handler: back to the outbox to be routed again"
    );
    let again = store
        .claim(token, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again[0].envelope.attempt, 1, "attempts start over");

    store
        .publish(vec![Envelope::from_raw("x", &b"{}"[..])])
        .await
        .unwrap();
    assert_eq!(store.purge_dead_letters().await.unwrap(), 0);
    db.drop_schema().await;
}

// --- workers end to end ---

/// One handler call: order id, handler, attempt.
type Call = (u32, &'static str, u32);

/// Records every call.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

struct Confirm(Calls);

impl Handler<OrderPlaced> for Confirm {
    type Error = String;
    async fn handle(&self, order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        self.0
             .0
            .lock()
            .unwrap()
            .push((order.order_id, "confirm", ctx.attempt()));
        Ok(())
    }
}

/// Fails the first call of every even order.
struct Reserve(Calls);

impl Handler<OrderPlaced> for Reserve {
    type Error = String;
    async fn handle(&self, order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        self.0
             .0
            .lock()
            .unwrap()
            .push((order.order_id, "reserve", ctx.attempt()));
        if order.order_id.is_multiple_of(2) && ctx.attempt() == 1 {
            return Err("warehouse unavailable".into());
        }
        Ok(())
    }
}

fn worker(store: PgStore, calls: &Calls, max_deliveries: u32) -> OutboxWorker {
    OutboxWorker::builder(store)
        .registry(Registry::new())
        .register_handler_with::<OrderPlaced, _>(
            Confirm(calls.clone()),
            HandlerOptions::new().name("confirm"),
        )
        .register_handler_with::<OrderPlaced, _>(
            Reserve(calls.clone()),
            HandlerOptions::new().name("reserve"),
        )
        .retry_delays(Duration::from_millis(10), Duration::from_millis(50))
        .poll_interval(Duration::from_millis(20))
        .max_deliveries(max_deliveries)
        .batch_size(50)
        .build()
        .expect("worker builds")
}

/// Polls until the schema holds no delivery and no outbox row, or fails after 60 s.
async fn drained(db: &TestSchema) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if db.count("outbox").await == 0 && db.count("deliveries").await == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the outbox did not drain within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_deliver_every_message_to_every_handler_with_independent_retries() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let events = 2_000u32;
    for chunk in (0..events).collect::<Vec<_>>().chunks(500) {
        let batch = chunk
            .iter()
            .map(|n| Envelope::new(&OrderPlaced { order_id: *n }).unwrap())
            .collect();
        store.publish(batch).await.unwrap();
    }

    let calls = Calls::default();
    let cancel = CancellationToken::new();
    let workers: Vec<_> = (0..3)
        .map(|_| tokio::spawn(worker(store.clone(), &calls, 5).run(cancel.clone())))
        .collect();
    drained(&db).await;
    cancel.cancel();
    for worker in workers {
        worker.await.unwrap().expect("run returns Ok(()) on cancel");
    }

    let calls = calls.0.lock().unwrap().clone();
    let mut per_pair: HashMap<(u32, &str), Vec<u32>> = HashMap::new();
    for (order, handler, attempt) in &calls {
        per_pair
            .entry((*order, *handler))
            .or_default()
            .push(*attempt);
    }
    assert_eq!(
        per_pair.len(),
        2 * events as usize,
        "every (event, handler) handled, none lost"
    );
    for order in 0..events {
        let confirm = &per_pair[&(order, "confirm")];
        assert_eq!(confirm[0], 1);
        let reserve = &per_pair[&(order, "reserve")];
        if order % 2 == 0 {
            assert!(
                reserve.contains(&2),
                "order {order}: reserve retried: {reserve:?}"
            );
            assert_eq!(
                confirm.len(),
                1,
                "order {order}: a retry of reserve must not re-run confirm"
            );
        }
    }
    let duplicates = calls.len() - (2 * events as usize + events as usize / 2);
    println!("calls={} duplicates={duplicates}", calls.len());
    assert_eq!(db.count("dead_letters").await, 0);
    db.drop_schema().await;
}

struct Signal(Arc<tokio::sync::Notify>);

impl Handler<OrderPlaced> for Signal {
    type Error = String;
    async fn handle(&self, _order: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        self.0.notify_one();
        Ok(())
    }
}

#[tokio::test]
async fn a_commit_in_another_connection_wakes_an_idle_worker() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let handled = Arc::new(tokio::sync::Notify::new());
    // A poll interval far longer than the wait below: only the NOTIFY can wake the worker.
    let worker = OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<OrderPlaced, _>(
            Signal(handled.clone()),
            HandlerOptions::new().name("signal"),
        )
        .poll_interval(Duration::from_secs(600))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    // Let the worker find the outbox empty and go to sleep.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut tx = db.pool.begin().await.unwrap();
    let envelope = Envelope::new(&OrderPlaced { order_id: 5 }).unwrap();
    hexeract::outbox::enqueue_envelopes(&mut tx, &db.schema, &[envelope])
        .await
        .unwrap();
    tx.commit().await.unwrap();

    tokio::time::timeout(Duration::from_secs(30), handled.notified())
        .await
        .expect("the commit's NOTIFY woke the worker");
    cancel.cancel();
    running.await.unwrap().unwrap();
    db.drop_schema().await;
}

struct OneAtATime {
    in_flight: Arc<AtomicU32>,
    most: Arc<AtomicU32>,
}

impl Handler<OrderPlaced> for OneAtATime {
    type Error = String;
    async fn handle(&self, _order: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_concurrency_limit_holds_within_a_batch() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let batch: Vec<Envelope> = (0..40)
        .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
        .collect();
    store.publish(batch).await.unwrap();
    let most = Arc::new(AtomicU32::new(0));
    let worker = OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<OrderPlaced, _>(
            OneAtATime {
                in_flight: Arc::new(AtomicU32::new(0)),
                most: most.clone(),
            },
            HandlerOptions::new()
                .name("one_at_a_time")
                .concurrency(std::num::NonZeroU32::new(1).unwrap()),
        )
        .batch_size(20)
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    drained(&db).await;
    cancel.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(most.load(Ordering::SeqCst), 1, "never two calls at once");
    db.drop_schema().await;
}

#[tokio::test]
async fn dropping_the_last_store_clone_gives_the_listen_connection_back() {
    // One connection in the pool: while LISTEN holds it, nothing else can run.
    let pool = hexeract_tests::pg::connect("hexeract-tests-listen", 1).await;
    let db = TestSchema::on(pool.clone());
    let store = db.store();
    store.migrate().await.unwrap();
    let wake = store.wakeups().await.unwrap();
    assert!(wake.is_some(), "PostgreSQL stores can be woken");
    drop(store);
    let connection = tokio::time::timeout(Duration::from_secs(10), pool.acquire())
        .await
        .expect("the LISTEN task gave its connection back once the store was gone")
        .unwrap();
    drop(connection);
    db.drop_schema().await;
}

#[tokio::test]
async fn take_claims_what_is_due_then_expands_as_many_rows_as_are_left() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let first = Envelope::new(&OrderPlaced { order_id: 1 }).unwrap();
    let second = Envelope::new(&OrderPlaced { order_id: 2 }).unwrap();
    let unknown = Envelope::from_raw("test.Nobody", &b"{}"[..]);
    store
        .publish(vec![first.clone(), second.clone(), unknown.clone()])
        .await
        .unwrap();
    let two_handlers = routes(&[("test.OrderPlaced", "a"), ("test.OrderPlaced", "b")]);

    // Nothing due yet: the two rows of the type with two handlers expand into four
    // deliveries, and the row of the type no handler knows would be claimed in place. Three
    // are claimed, oldest message first: the expanded delivery past the limit stays due, the
    // unknown message stays in the outbox, unclaimed.
    let token = Uuid::now_v7();
    let taken = store
        .take(&two_handlers, token, 3, Duration::from_secs(30))
        .await
        .unwrap();
    let mut seen: Vec<(Uuid, String, u32, bool)> = taken
        .iter()
        .map(|c| {
            (
                c.envelope.id,
                c.handler.clone(),
                c.envelope.attempt,
                c.recovered,
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (first.id, "a".to_owned(), 1, false),
            (first.id, "b".to_owned(), 1, false),
            (second.id, "a".to_owned(), 1, false),
        ]
    );
    assert_eq!(taken[0].envelope.payload, first.payload);
    assert_eq!(
        db.count("outbox").await,
        1,
        "every row expanded left the outbox; the unknown message waits there"
    );
    assert_eq!(db.count("deliveries").await, 4);

    // The next take claims the due delivery and the unknown message, with their first
    // attempt.
    let next = store
        .take(&two_handlers, Uuid::now_v7(), 10, Duration::from_secs(30))
        .await
        .unwrap();
    let mut rest: Vec<(Uuid, String, u32)> = next
        .iter()
        .map(|c| (c.envelope.id, c.handler.clone(), c.envelope.attempt))
        .collect();
    rest.sort();
    let mut expected = vec![
        (second.id, "b".to_owned(), 1),
        (unknown.id, NO_HANDLER.to_owned(), 1),
    ];
    expected.sort();
    assert_eq!(rest, expected);
    assert!(store
        .take(&two_handlers, Uuid::now_v7(), 10, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());

    // Settled under the first token: acks land only for the claim that holds them.
    let ids: Vec<_> = taken.iter().map(|c| c.id).collect();
    assert_eq!(
        store.deliveries().ack(Uuid::now_v7(), &ids).await.unwrap(),
        0
    );
    assert_eq!(store.deliveries().ack(token, &ids).await.unwrap(), 3);
    assert_eq!(db.count("deliveries").await, 1);
    assert_eq!(db.count("outbox").await, 1, "the unknown message, claimed");
    assert_eq!(
        store.backlog().await.unwrap(),
        2,
        "the two of the second take"
    );
    db.drop_schema().await;
}

/// The acks of one cycle are deleted by the statement that takes the next batch: only under
/// their claim's token, deliveries rows and messages claimed in place alike, and counted even
/// when that take finds nothing.
#[tokio::test]
async fn ack_and_take_deletes_only_its_claims_acks_in_the_statement_that_takes_the_next_batch() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let singles: Vec<Envelope> = (0..3)
        .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
        .collect();
    let shared = Envelope::from_raw("test.Shared", &b"{}"[..]);
    store.publish(singles.clone()).await.unwrap();
    store.publish(vec![shared.clone()]).await.unwrap();
    let routes = routes(&[
        ("test.OrderPlaced", "h"),
        ("test.Shared", "a"),
        ("test.Shared", "b"),
    ]);
    let lease = Duration::from_secs(30);

    // The three messages of the type with one handler, claimed in place.
    let first = Uuid::now_v7();
    let taken = store.take(&routes, first, 3, lease).await.unwrap();
    let mut ids: Vec<Uuid> = taken.iter().map(|c| c.envelope.id).collect();
    ids.sort();
    assert_eq!(ids, singles.iter().map(|e| e.id).collect::<Vec<_>>());
    let in_place: Vec<_> = taken.iter().map(|c| c.id).collect();

    // Under another token the acks land nowhere, and the take still happens: the message of
    // the type with two handlers becomes two deliveries rows, both claimed.
    let second = Uuid::now_v7();
    let (landed, next) = store
        .ack_and_take((Uuid::now_v7(), &in_place), &routes, second, 10, lease)
        .await
        .unwrap();
    assert_eq!(landed, 0, "not that claim's token");
    let mut handlers: Vec<(Uuid, String)> = next
        .iter()
        .map(|c| (c.envelope.id, c.handler.clone()))
        .collect();
    handlers.sort();
    assert_eq!(
        handlers,
        [(shared.id, "a".to_owned()), (shared.id, "b".to_owned())]
    );
    assert_eq!(db.count("outbox").await, 3, "the three claimed in place");
    assert_eq!(db.count("deliveries").await, 2);

    // Under their token they land, though the take finds nothing left.
    let (landed, nothing) = store
        .ack_and_take((first, &in_place), &routes, Uuid::now_v7(), 10, lease)
        .await
        .unwrap();
    assert_eq!(landed, 3);
    assert!(nothing.is_empty(), "everything is claimed: {nothing:?}");
    assert_eq!(db.count("outbox").await, 0);

    let rows: Vec<_> = next.iter().map(|c| c.id).collect();
    let (landed, nothing) = store
        .ack_and_take((second, &rows), &routes, Uuid::now_v7(), 10, lease)
        .await
        .unwrap();
    assert_eq!(landed, 2, "the deliveries rows");
    assert!(nothing.is_empty());
    assert_eq!(store.backlog().await.unwrap(), 0);
    db.drop_schema().await;
}

#[tokio::test]
async fn a_taken_delivery_never_settled_comes_back_recovered_with_its_attempt_counted() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let envelope = Envelope::new(&OrderPlaced { order_id: 7 }).unwrap();
    store.publish(vec![envelope.clone()]).await.unwrap();
    let one = routes(&[("test.OrderPlaced", "h")]);

    let taken = store
        .take(&one, Uuid::now_v7(), 10, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert!(
        store
            .take(&one, Uuid::now_v7(), 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "leased: hidden from other takes"
    );
    // The worker that took it dies: the lease ends.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = store
        .take(&one, Uuid::now_v7(), 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, taken[0].id);
    assert_eq!(again[0].envelope.attempt, 2);
    assert!(again[0].recovered, "its first claim was never settled");
    db.drop_schema().await;
}

#[tokio::test]
async fn a_message_published_again_after_it_was_taken_is_not_delivered_twice() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let envelope = Envelope::new(&OrderPlaced { order_id: 3 }).unwrap();
    let one = routes(&[("test.OrderPlaced", "h")]);
    store.publish(vec![envelope.clone()]).await.unwrap();
    let taken = store
        .take(&one, Uuid::now_v7(), 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);

    // The same message id again (a producer retrying its publish) while its delivery runs:
    // the one copy stands (claimed in place in the outbox, the type having one handler).
    store.publish(vec![envelope]).await.unwrap();
    assert!(store
        .take(&one, Uuid::now_v7(), 10, Duration::from_secs(30))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        db.count("outbox").await + db.count("deliveries").await,
        1,
        "one copy of the message is owed"
    );
    assert_eq!(store.backlog().await.unwrap(), 1);
    db.drop_schema().await;
}

/// Stops the worker from inside its handler once it has seen `after` messages.
struct StopAfter {
    seen: Arc<AtomicU32>,
    after: u32,
    cancel: CancellationToken,
}

impl Handler<OrderPlaced> for StopAfter {
    type Error = std::convert::Infallible;
    async fn handle(&self, _order: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.after {
            self.cancel.cancel();
        }
        Ok(())
    }
}

/// A batch's acks are written while the next batch is taken, or when the worker stops: a worker
/// stopped while its last batch runs deletes that batch's deliveries before `run` returns.
#[tokio::test]
async fn a_worker_stopped_during_its_last_batch_acks_it_before_it_returns() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    let batch: Vec<Envelope> = (0..30)
        .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
        .collect();
    store.publish(batch).await.unwrap();
    let cancel = CancellationToken::new();
    let seen = Arc::new(AtomicU32::new(0));
    let worker = OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<OrderPlaced, _>(
            StopAfter {
                seen: seen.clone(),
                after: 30,
                cancel: cancel.clone(),
            },
            HandlerOptions::new().name("stop_after"),
        )
        .batch_size(50)
        .build()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), worker.run(cancel))
        .await
        .expect("run returns once cancelled")
        .unwrap();
    assert_eq!(
        seen.load(Ordering::SeqCst),
        30,
        "one batch, every message once"
    );
    assert_eq!(db.count("outbox").await, 0);
    assert_eq!(
        db.count("deliveries").await,
        0,
        "the last batch's acks were written before run returned"
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn a_message_of_a_type_with_one_handler_is_claimed_and_settled_in_place() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    hexeract_tests::in_place::claimed_in_place_and_settled_there(&store, |table| db.count(table))
        .await;
    db.drop_schema().await;
}

#[tokio::test]
async fn a_message_claimed_in_place_before_a_deploy_added_a_handler_is_expanded_recovered() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    hexeract_tests::in_place::claimed_in_place_then_expanded_after_a_deploy(&store).await;
    db.drop_schema().await;
}

#[tokio::test]
async fn a_message_published_again_after_a_retry_is_not_run_beside_its_delivery() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    hexeract_tests::in_place::published_again_after_a_retry_runs_once(&store, |table| {
        db.count(table)
    })
    .await;
    db.drop_schema().await;
}

#[tokio::test]
async fn the_relay_leaves_messages_an_outbox_worker_holds_in_place() {
    let db = TestSchema::new("hexeract-tests").await;
    let store = db.migrated_store().await;
    hexeract_tests::in_place::the_relay_leaves_messages_claimed_in_place(&store).await;
    db.drop_schema().await;
}
