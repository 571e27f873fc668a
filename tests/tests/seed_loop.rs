//! The worker document's supervisor loop (`seeds/000…`, "Connection loss and supervised
//! recovery"), as close to its text as the API allows, on a topology the application declared
//! itself with `ensure_topology`: its exchange, its queue, a parking queue with an argument of
//! its own (a 7-day `x-message-ttl`, which a worker that declared the parking queue again as a
//! plain queue would fail on at every start), and the binding. A producer that omits the `type`
//! property, a handler failure retried through the wait tiers and parked with its reason and a
//! `dead_letters` row, and the loop's connection closed by name mid-run, which the loop
//! survives. Also: the errors that stop a worker whose queues are not what it needs.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`) and
//! `rabbitmqctl` (to close a connection as an operator would). The loop's connection is named
//! after this test's executable, so only one test here connects with `connect_with_retry`;
//! nextest runs each test in a process of its own, and the call records are statics.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hexeract::rabbitmq::{
    ensure_topology, headers, Binding, BusError, Exchange, ExchangeKind, Queue, QueueKind,
    RabbitMqConnection, RabbitMqPublisher, RabbitMqWorkerBuilder,
};
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::{DeadLetterStore, DeliveryStore};
use hexeract::{CancellationToken, Context, Envelope, Handler, Message, Reason};
use hexeract_tests::amqp::TestBroker;
use lapin::types::AMQPValue;
use lapin::BasicProperties;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
struct OrderPlaced {
    order_id: u64,
}

/// Every call: order id and attempt.
static CALLS: Mutex<Vec<(u64, u32)>> = Mutex::new(Vec::new());
/// How often the loop built and started a worker.
static STARTS: AtomicU32 = AtomicU32::new(0);
/// The name of the loop's current connection.
static CONNECTION: Mutex<Option<String>> = Mutex::new(None);

/// The document's handler; order 13 always fails.
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

    async fn handle(&self, message: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        CALLS
            .lock()
            .unwrap()
            .push((message.order_id, ctx.attempt()));
        if message.order_id == 13 {
            return Err(WarehouseDown(message.order_id));
        }
        Ok(())
    }
}

fn calls_of(order_id: u64) -> Vec<u32> {
    CALLS
        .lock()
        .unwrap()
        .iter()
        .filter(|(order, _)| *order == order_id)
        .map(|(_, attempt)| *attempt)
        .collect()
}

async fn until(what: &str, limit: Duration, check: impl Fn() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < limit,
            "{what}: not within {limit:?} (calls {:?}, starts {})",
            CALLS.lock().unwrap(),
            STARTS.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn subscribed(broker: &TestBroker, queue: &str, limit: Duration) {
    let started = Instant::now();
    while broker.consumers(queue).await != Some(1) {
        assert!(
            started.elapsed() < limit,
            "no consumer on {queue} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a producer not written with Hexeract sends: no `type` property, only the routing key.
fn untyped(order_id: u64) -> (Vec<u8>, BasicProperties) {
    let payload = serde_json::to_vec(&serde_json::json!({ "order_id": order_id })).unwrap();
    let properties = BasicProperties::default()
        .with_message_id(uuid::Uuid::now_v7().to_string().into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    (payload, properties)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_loop_runs_on_the_application_s_topology_and_survives_a_closed_connection() {
    let broker = TestBroker::new().await;
    let uri = hexeract_tests::amqp::amqp_url();
    // The application's topology, declared by the application.
    let exchange = format!("{}.orders", broker.prefix);
    let received = format!("{}.orders.received", broker.prefix);
    let parked = format!("{}.orders.parked", broker.prefix);
    let exchanges = vec![Exchange {
        name: exchange.clone(),
        kind: ExchangeKind::Topic,
    }];
    let queues = vec![
        Queue {
            kind: QueueKind::Quorum,
            ..Queue::classic(received.clone())
        },
        // Parked messages are kept a week: an argument of the application's own.
        Queue {
            message_ttl: Some(Duration::from_secs(7 * 24 * 3600)),
            ..Queue::classic(parked.clone())
        },
    ];
    let bindings = vec![Binding {
        queue: received.clone(),
        exchange: exchange.clone(),
        routing_key: "OrderPlaced".to_owned(),
    }];
    let dir = std::env::temp_dir().join(format!("hexeract-seed-loop-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(dir.join("dead-letters.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let dead_letters: Arc<dyn DeadLetterStore> = Arc::new(store.clone());

    let cancel = CancellationToken::new();
    let supervisor = {
        let cancel = cancel.clone();
        let (exchange, received, parked, prefix) = (
            exchange.clone(),
            received.clone(),
            parked.clone(),
            broker.prefix.clone(),
        );
        tokio::spawn(async move {
            // The document's loop. Beside its text: the worker is told the application's
            // exchange (a message without `type` takes its type from the routing key only on
            // the worker's exchange), a prefix for its wait queues, short retries, and the
            // store for dead letters.
            loop {
                let connection =
                    RabbitMqConnection::connect_with_retry(&uri, 5, Duration::from_millis(500))
                        .await?;
                ensure_topology(&connection, &exchanges, &queues, &bindings).await?;
                *CONNECTION.lock().unwrap() = Some(connection.name().to_owned());
                let worker = RabbitMqWorkerBuilder::new(connection)
                    .queue(received.clone())
                    .dead_letter_routing_key(parked.clone())
                    .register_handler::<OrderPlaced, _>(MyHandler)
                    .exchange(exchange.clone())
                    .prefix(prefix.clone())
                    .max_attempts(3)
                    .retry_delays(Duration::from_millis(100), Duration::from_millis(200))
                    .dead_letters(dead_letters.clone())
                    .build()?;
                STARTS.fetch_add(1, Ordering::SeqCst);
                match worker.run(cancel.clone()).await {
                    Ok(()) => break,
                    Err(err) => {
                        tracing::error!(error = %err, "bus worker stopped, restarting");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
    };
    subscribed(&broker, &received, Duration::from_secs(30)).await;
    let name = CONNECTION.lock().unwrap().clone().expect("connected");
    assert!(
        name.starts_with("seed_loop"),
        "connect_with_retry names the connection after the executable: {name}"
    );

    // A producer that omits `type`, and one that fails for good.
    let (payload, properties) = untyped(1);
    broker
        .publish_to(&exchange, "OrderPlaced", &payload, properties)
        .await;
    let publisher = RabbitMqPublisher::new(&broker.connection)
        .await
        .unwrap()
        .exchange(exchange.clone());
    let doomed = Envelope::new(&OrderPlaced { order_id: 13 }).unwrap();
    publisher.publish(&doomed).await.unwrap();
    until("order 1 handled", Duration::from_secs(30), || {
        calls_of(1) == [1]
    })
    .await;
    let parked_messages = broker.wait_for(&parked, 1, Duration::from_secs(30)).await;
    assert_eq!(calls_of(13), [1, 2, 3], "three attempts, then parked");
    let parked_headers = parked_messages[0]
        .properties
        .headers()
        .clone()
        .expect("parking headers");
    let header = |name: &str| match parked_headers.inner().get(name) {
        Some(AMQPValue::LongString(text)) => text.to_string(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(
        header(headers::REASON),
        Reason::MAX_DELIVERIES_EXCEEDED.as_str()
    );
    assert!(
        header(headers::DETAIL).contains("the warehouse is down (order 13)"),
        "{}",
        header(headers::DETAIL)
    );
    let rows = store.dead_letters(10).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].envelope.id, doomed.id);
    assert_eq!(rows[0].reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert!(
        rows[0].detail.contains("the warehouse is down (order 13)"),
        "{}",
        rows[0].detail
    );

    // An operator closes the loop's connection: the worker returns its error, the loop
    // connects again, applies the topology again, and consumes on.
    assert_eq!(STARTS.load(Ordering::SeqCst), 1);
    assert!(hexeract_tests::amqp::close_connections_named(&name) >= 1);
    until(
        "the loop started a second worker",
        Duration::from_secs(30),
        || STARTS.load(Ordering::SeqCst) == 2,
    )
    .await;
    subscribed(&broker, &received, Duration::from_secs(30)).await;
    let (payload, properties) = untyped(2);
    broker
        .publish_to(&exchange, "OrderPlaced", &payload, properties)
        .await;
    until(
        "order 2 handled after the reconnect",
        Duration::from_secs(30),
        || calls_of(2) == [1],
    )
    .await;

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(30), supervisor)
        .await
        .expect("the loop ends on cancel")
        .expect("no panic")
        .expect("the loop ends with Ok");
    assert_eq!(calls_of(1), [1], "handled once");
    assert_eq!(calls_of(13), [1, 2, 3], "no call after it was parked");
    assert_eq!(broker.ready(&received).await, 0);
    assert_eq!(broker.ready(&parked).await, 0, "taken above");
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// An exchange of the worker's that exists with other arguments stops `run` with an error
/// naming it and the argument (retrying would not help; a queue of the worker's that exists
/// with another layout is moved to its own instead: `queue_layout.rs`); with `queue(…)`, a
/// queue the application has not declared stops it with an error naming the queue.
#[tokio::test]
async fn objects_that_are_not_what_the_worker_needs_stop_it_with_their_names() {
    let broker = TestBroker::new().await;
    let connection = broker.connect(&format!("{}.mismatch", broker.prefix)).await;
    let worker = RabbitMqWorkerBuilder::new(connection.clone())
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .register_handler::<OrderPlaced, _>(MyHandler)
        .park_without_rows()
        .build()
        .unwrap();
    // Someone declared the worker's exchange by hand, as a fanout exchange.
    ensure_topology(
        &broker.connection,
        &[Exchange {
            name: broker.exchange.clone(),
            kind: ExchangeKind::Fanout,
        }],
        &[],
        &[],
    )
    .await
    .unwrap();
    let stopped = worker.run(CancellationToken::new()).await;
    match &stopped {
        Err(BusError::Mismatch {
            object, argument, ..
        }) => {
            assert_eq!(object, &format!("exchange {:?}", broker.exchange));
            assert_eq!(argument, "type");
        }
        other => panic!("{other:?}"),
    }
    let text = stopped.unwrap_err().to_string();
    assert!(
        text.contains(&format!(
            "exchange {:?} exists on the broker with another type",
            broker.exchange
        )) && text.contains("delete it"),
        "{text}"
    );

    let missing = format!("{}.never.declared", broker.prefix);
    let stopped = RabbitMqWorkerBuilder::new(connection)
        .queue(missing.clone())
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .register_handler::<OrderPlaced, _>(MyHandler)
        .park_without_rows()
        .build()
        .unwrap()
        .run(CancellationToken::new())
        .await;
    let text = stopped.expect_err("no queue to consume").to_string();
    assert!(
        text.contains(&missing) && text.contains("does not exist"),
        "{text}"
    );
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
}
