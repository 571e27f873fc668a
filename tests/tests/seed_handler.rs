//! The worker document's typed handler (`seeds/000…`: `impl Handler<OrderPlaced> for MyHandler`
//! with `type Error` and `handle(&self, message, &ctx) -> Result<(), Self::Error>`), registered
//! as the document does, `register_handler::<OrderPlaced, _>(MyHandler)`, with an
//! `OutboxWorker` (SQLite) and a `RabbitMqWorker`: its `Err` is retried, then dead-lettered with
//! the error's text; an error that is a `HandlerOutcome` dead-letters at once with its reason.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). The
//! call counters are statics: these tests rely on nextest's one process per test.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hexeract::outbox::OutboxWorker;
use hexeract::rabbitmq::{RabbitMqPublisher, RabbitMqWorkerBuilder};
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::{DeadLetterStore, DeliveryStore};
use hexeract::{
    CancellationToken, Context, DeadLetter, Envelope, Handler, HandlerOutcome, Message, Reason,
    Registry,
};
use hexeract_tests::amqp::TestBroker;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
struct OrderPlaced {
    order_id: u64,
}

static CALLS: AtomicU32 = AtomicU32::new(0);

/// The document's handler: an error of its own type, which says nothing about the outcome.
struct MyHandler;

#[derive(Debug)]
struct WarehouseDown(u64);

impl std::fmt::Display for WarehouseDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the warehouse is down (order {})", self.0)
    }
}

impl std::error::Error for WarehouseDown {}

impl Handler<OrderPlaced> for MyHandler {
    type Error = WarehouseDown;

    async fn handle(&self, message: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        CALLS.fetch_add(1, Ordering::SeqCst);
        Err(WarehouseDown(message.order_id))
    }
}

/// A handler whose error is a `HandlerOutcome`: it says itself what to do.
struct UnknownSku;

impl Handler<OrderPlaced> for UnknownSku {
    type Error = HandlerOutcome;

    async fn handle(&self, message: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        CALLS.fetch_add(1, Ordering::SeqCst);
        Err(HandlerOutcome::dead_letter(
            "sku_unknown",
            format_args!("order {} names no SKU we sell", message.order_id),
        ))
    }
}

/// Waits up to 20 s for `store` to hold a dead letter; returns it.
async fn dead_letter_in(store: &dyn DeadLetterStore) -> DeadLetter {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(letter) = store.dead_letters(10).await.unwrap().pop() {
            return letter;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dead letter within 20 s ({} calls)",
            CALLS.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn sqlite() -> (std::path::PathBuf, Arc<SqliteStore>) {
    let dir = std::env::temp_dir().join(format!("hexeract-seed-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(dir.join("outbox.db")).await.unwrap();
    store.migrate().await.unwrap();
    (dir, Arc::new(store))
}

/// Runs `handler` in an `OutboxWorker` on a SQLite store (3 calls at most, retries 20–50 ms
/// apart), publishes the order `order_id`, and returns its dead letter once there is one.
async fn dead_letter_from_an_outbox_worker<H: Handler<OrderPlaced>>(
    handler: H,
    order_id: u64,
) -> DeadLetter {
    let (dir, store) = sqlite().await;
    let worker = OutboxWorker::builder_shared(store.clone())
        .registry(Registry::new())
        .register_handler::<OrderPlaced, _>(handler)
        .max_deliveries(3)
        .retry_delays(Duration::from_millis(20), Duration::from_millis(50))
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    store
        .publish(vec![Envelope::new(&OrderPlaced { order_id }).unwrap()])
        .await
        .unwrap();
    let letter = dead_letter_in(&*store).await;
    cancel.cancel();
    running.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(dir);
    letter
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documents_handler_is_retried_then_dead_lettered_by_an_outbox_worker() {
    let letter = dead_letter_from_an_outbox_worker(MyHandler, 7).await;
    assert_eq!(
        CALLS.load(Ordering::SeqCst),
        3,
        "called max_deliveries times"
    );
    assert_eq!(letter.reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert_eq!(letter.attempts, 3);
    assert!(
        letter.detail.contains("the warehouse is down (order 7)"),
        "{}",
        letter.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documents_handler_is_retried_then_parked_by_a_rabbitmq_worker() {
    let broker = TestBroker::new().await;
    let (dir, store) = sqlite().await;
    let worker = RabbitMqWorkerBuilder::new(broker.connect("hexeract-tests-seed").await)
        .registry(Registry::new())
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .wait_tiers([Duration::from_millis(50), Duration::from_millis(100)])
        .retry_delays(Duration::from_millis(50), Duration::from_millis(100))
        .register_handler::<OrderPlaced, _>(MyHandler)
        .max_attempts(3)
        .dead_letters(store.clone())
        .build()
        .unwrap();
    let topology = worker.topology().clone();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    // The queues exist once the worker consumes; publishing before would route nowhere.
    let queue = topology
        .queues()
        .into_iter()
        .find(|queue| queue.delivery_limit.is_some())
        .unwrap()
        .name;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while broker.consumers(&queue).await != Some(1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker consumes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    RabbitMqPublisher::new(&broker.connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone())
        .publish(&Envelope::new(&OrderPlaced { order_id: 8 }).unwrap())
        .await
        .unwrap();
    let letter = dead_letter_in(&*store).await;
    cancel.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(CALLS.load(Ordering::SeqCst), 3, "called max_attempts times");
    assert_eq!(letter.reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert!(
        letter.detail.contains("the warehouse is down (order 8)"),
        "{}",
        letter.detail
    );
    broker.delete(&topology).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_that_is_an_outcome_dead_letters_at_once_with_its_reason() {
    let letter = dead_letter_from_an_outbox_worker(UnknownSku, 9).await;
    assert_eq!(CALLS.load(Ordering::SeqCst), 1, "no retry");
    assert_eq!(letter.reason.as_str(), "sku_unknown");
    assert_eq!(letter.detail, "order 9 names no SKU we sell");
}
