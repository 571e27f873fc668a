//! `hexeract::run` with `AMQP_URL`: the outbox is relayed to the broker and every handler
//! consumes its own queue; when the worker's connection is closed from outside, the supervisor
//! reconnects and nothing is lost.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`) and
//! `rabbitmqctl` on the PATH. The test uses its own exchange and queue prefix, and an SQLite
//! outbox of its own; nextest runs it in a process of its own, so setting the environment is
//! safe.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hexeract::{handler, CancellationToken, Context, Message};
use hexeract_tests::amqp::{close_connections_named, TestBroker};
use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "run.OrderPlaced")]
struct OrderPlaced {
    order_id: u32,
}

/// Calls per (handler, order).
static CALLS: Mutex<Option<HashMap<(&'static str, u32), u32>>> = Mutex::new(None);

fn record(handler: &'static str, order_id: u32) {
    *CALLS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry((handler, order_id))
        .or_default() += 1;
}

fn distinct() -> usize {
    CALLS.lock().unwrap().as_ref().map_or(0, HashMap::len)
}

fn reserved() -> usize {
    CALLS.lock().unwrap().as_ref().map_or(0, |calls| {
        calls
            .keys()
            .filter(|(handler, _)| *handler == "reserve")
            .count()
    })
}

#[handler(message = "run.OrderPlaced", name = "billing::invoice")]
async fn invoice(order: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    record("invoice", order.order_id);
    Ok(())
}

#[handler(message = "run.OrderPlaced", name = "stock::reserve")]
async fn reserve(order: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    // Slow enough (about 12 s for all, 16 at a time) that the connection is cut while
    // deliveries are in flight: rabbitmqctl takes seconds to find and close it.
    tokio::time::sleep(Duration::from_millis(40)).await;
    record("reserve", order.order_id);
    Ok(())
}

async fn wait_for(count: usize, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while distinct() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {count} (handler, message) pairs handled within {limit:?}",
            distinct()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_relays_the_outbox_and_survives_its_consumer_connection_being_closed() {
    // What the supervisor says about the connection loss shows in the test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "hexeract=info".into()))
        .try_init();
    let broker = TestBroker::new().await;
    let dir = std::env::temp_dir().join(format!("hexeract-run-amqp-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::remove_var("DATABASE_URL");
    std::env::remove_var("KAFKA_BROKERS");
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("AMQP_URL", hexeract_tests::amqp::amqp_url());
    std::env::set_var("HEXERACT_EXCHANGE", &broker.exchange);
    std::env::set_var("HEXERACT_QUEUE_PREFIX", &broker.prefix);
    std::env::set_var("RELAY_POLL_INTERVAL_MS", "50");
    let port = hexeract_tests::http::free_port();
    std::env::set_var("WORKER_PORT", port.to_string());

    let cancel = CancellationToken::new();
    let running = tokio::spawn(hexeract::run(cancel.clone()));
    // Ready once the relay, the bus worker and the scheduler each finished a pass.
    let ready =
        hexeract_tests::http::wait_for_status(port, "/health/ready", 200, Duration::from_secs(30))
            .await;
    for component in ["outbox relay", "bus worker", "scheduler"] {
        assert!(ready.contains(&format!("{component}: ready")), "{ready}");
    }
    let orders = 5_000u32;
    // One `hexeract::publish`, then the rest in one transaction (5 000 single commits to
    // SQLite would take longer than handling them).
    hexeract::publish(&OrderPlaced { order_id: 0 })
        .await
        .unwrap();
    let envelopes = (1..orders)
        .map(|order_id| hexeract::Envelope::new(&OrderPlaced { order_id }).unwrap())
        .collect();
    hexeract::store::default_store()
        .await
        .unwrap()
        .publish(envelopes)
        .await
        .unwrap();
    // Cut the consumers' connection once a tenth of the slow handler's messages went through.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while reserved() < orders as usize / 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} reserved within 60 s",
            reserved()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let consumer = format!("{}.consumer", broker.prefix);
    let closed = tokio::task::spawn_blocking(move || close_connections_named(&consumer))
        .await
        .unwrap();
    assert_eq!(closed, 1, "the worker's connection, found by its name");
    // Not ready while the bus worker is down, alive all the same; ready again once it is back.
    let down =
        hexeract_tests::http::wait_for_status(port, "/health/ready", 503, Duration::from_secs(5))
            .await;
    assert!(down.contains("bus worker: failing"), "{down}");
    assert!(
        !down.contains("guest:guest"),
        "no connection string in: {down}"
    );
    assert_eq!(
        hexeract_tests::http::get(port, "/health")
            .await
            .map(|(status, _)| status),
        Some(200)
    );
    hexeract_tests::http::wait_for_status(port, "/health/ready", 200, Duration::from_secs(30))
        .await;
    let reserved_at_cut = reserved();
    assert!(
        reserved_at_cut < orders as usize,
        "the connection was closed while deliveries were still owed"
    );
    wait_for(2 * orders as usize, Duration::from_secs(90)).await;

    let store = hexeract::store::default_store().await.unwrap();
    hexeract::store::wait_until_drained(&*store, Duration::from_millis(20))
        .await
        .unwrap();
    // Every call was counted, under its handler's name.
    let (status, metrics) = hexeract_tests::http::get(port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    for handler in ["billing::invoice", "stock::reserve"] {
        let line = metrics
            .lines()
            .find(|line| {
                line.starts_with(&format!(
                    "hexeract_messages_handled_total{{handler=\"{handler}\"}}"
                ))
            })
            .unwrap_or_else(|| panic!("no counter for {handler} in:\n{metrics}"));
        let handled: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(handled >= u64::from(orders), "{line}");
    }
    assert!(metrics.contains("hexeract_component_ready{component=\"bus worker\"} 1"));
    assert!(metrics.contains("hexeract_outbox_backlog 0"), "{metrics}");
    assert!(
        metrics.contains("hexeract_outbox_oldest_pending_seconds 0\n"),
        "{metrics}"
    );
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("run returns after cancel")
        .unwrap()
        .expect("run returns Ok(()) on cancel");

    let calls = CALLS.lock().unwrap().clone().unwrap_or_default();
    let duplicates: u32 = calls.values().map(|count| count - 1).sum();
    println!(
        "{} messages x 2 handlers: 0 lost, {duplicates} duplicates after the connection was closed",
        orders
    );
    for handler in ["invoice", "reserve"] {
        for order_id in 0..orders {
            assert!(
                calls.contains_key(&(handler, order_id)),
                "{handler} never got order {order_id}"
            );
        }
        let queue = format!(
            "{}.{}",
            broker.prefix,
            if handler == "invoice" {
                "billing.invoice"
            } else {
                "stock.reserve"
            }
        );
        assert_eq!(broker.ready(&queue).await, 0, "{queue} is empty");
    }
    assert!(store.dead_letters(10).await.unwrap().is_empty());

    let registry = hexeract::Registry::from_inventory().unwrap();
    let topology = hexeract::rabbitmq::Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone());
    broker.delete(&topology).await;
    drop(store);
    std::fs::remove_dir_all(&dir).ok();
}

/// An exchange that exists with other arguments (declared by hand as a fanout exchange) stops
/// `run` with an error naming it and the argument, rather than restarting for ever against the
/// same refusal. (A queue of another layout is moved to the current one instead:
/// `queue_layout.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exchange_declared_with_other_arguments_stops_run_with_its_name() {
    let broker = TestBroker::new().await;
    let (dir, _port) =
        hexeract_tests::amqp::run_env(&broker, &hexeract_tests::amqp::amqp_url(), 50);
    hexeract::rabbitmq::ensure_topology(
        &broker.connection,
        &[hexeract::rabbitmq::Exchange {
            name: broker.exchange.clone(),
            kind: hexeract::rabbitmq::ExchangeKind::Fanout,
        }],
        &[],
        &[],
    )
    .await
    .unwrap();
    let stopped = tokio::time::timeout(
        Duration::from_secs(30),
        hexeract::run(CancellationToken::new()),
    )
    .await
    .expect("run stops by itself");
    let text = stopped
        .expect_err("an exchange it cannot declare")
        .to_string();
    assert!(
        text.contains(&format!(
            "exchange {:?} exists on the broker with another type",
            broker.exchange
        )),
        "{text}"
    );
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
    let _ = std::fs::remove_dir_all(dir);
}
