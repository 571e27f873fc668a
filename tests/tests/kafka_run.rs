//! `hexeract::run` with `KAFKA_BROKERS` (and with `HEXERACT_TRANSPORT=kafka` alone): the topics
//! are created at startup, the outbox is relayed to them, every handler consumes as its own
//! group, `/health/ready` covers the relay and each consumer, `/metrics` shows each partition's
//! lag; a handler whose message declares no aggregate stops startup, naming it.
//!
//! Needs the Kafka broker at `TEST_KAFKA_BROKERS` (default `127.0.0.1:9092`, the tansu
//! `.ci/run` starts). The test uses its own topic prefix and an SQLite outbox of its own;
//! nextest runs it in a process of its own, so setting the environment is safe.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hexeract::{handler, CancellationToken, Context, Message};
use hexeract_tests::kafka::TestKafka;
use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "run.kafka.OrderPlaced", aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
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

/// Points `hexeract::run` at an SQLite outbox in a fresh directory, a relay polling every
/// 50 ms and a free `WORKER_PORT`, with `set` set and `removed` unset (and no database or
/// RabbitMQ URL). Returns the directory (remove it at the end) and the port.
fn run_env(set: &[(&str, &str)], removed: &[&str]) -> (std::path::PathBuf, u16) {
    let dir = std::env::temp_dir().join(format!("hexeract-run-kafka-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    for variable in ["DATABASE_URL", "AMQP_URL"].iter().chain(removed) {
        std::env::remove_var(variable);
    }
    for (variable, value) in set {
        std::env::set_var(variable, value);
    }
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("RELAY_POLL_INTERVAL_MS", "50");
    let port = hexeract_tests::http::free_port();
    std::env::set_var("WORKER_PORT", port.to_string());
    (dir, port)
}

/// Starts `hexeract::run`, waits until `components` are ready, publishes `orders` orders and
/// waits until both handlers handled each. Returns the token and the running task.
async fn run_until_handled(
    port: u16,
    components: &[&str],
    orders: u32,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), hexeract::Error>>,
) {
    let cancel = CancellationToken::new();
    let running = tokio::spawn(hexeract::run(cancel.clone()));
    let ready =
        hexeract_tests::http::wait_for_status(port, "/health/ready", 200, Duration::from_secs(30))
            .await;
    for component in components {
        assert!(ready.contains(&format!("{component}: ready")), "{ready}");
    }
    let envelopes = (0..orders)
        .map(|order_id| hexeract::Envelope::new(&OrderPlaced { order_id }).unwrap())
        .collect();
    hexeract::store::default_store()
        .await
        .unwrap()
        .publish(envelopes)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while distinct() < 2 * orders as usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {} (handler, order) pairs handled",
            distinct(),
            2 * orders
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (cancel, running)
}

/// Cancels `run` and checks that it returns `Ok` within 20 s.
async fn stop(
    cancel: CancellationToken,
    running: tokio::task::JoinHandle<Result<(), hexeract::Error>>,
) {
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("run stops")
        .unwrap()
        .expect("run returns Ok");
}

#[handler(message = "run.kafka.OrderPlaced", name = "billing::invoice")]
async fn invoice(order: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    record("invoice", order.order_id);
    Ok(())
}

#[handler(message = "run.kafka.OrderPlaced", name = "stock::reserve")]
async fn reserve(order: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    record("reserve", order.order_id);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_relays_the_outbox_to_kafka_and_each_handler_consumes_as_its_group() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "hexeract=info".into()))
        .try_init();
    let kafka = TestKafka::tansu();
    let (dir, port) = run_env(
        &[
            ("KAFKA_BROKERS", kafka.brokers()),
            ("KAFKA_TOPIC_PREFIX", &kafka.prefix),
            ("KAFKA_TOPIC_PARTITIONS", "2"),
            // tansu is a single broker.
            ("KAFKA_REPLICATION_FACTOR", "1"),
        ],
        &[],
    );
    let orders = 200u32;
    let (cancel, running) = run_until_handled(
        port,
        &[
            "kafka relay",
            "kafka consumer billing::invoice",
            "kafka consumer stock::reserve",
            "scheduler",
        ],
        orders,
    )
    .await;
    // The topic was created by `run` with KAFKA_TOPIC_PARTITIONS, the records keyed by order.
    let records = kafka.read_all(&kafka.topic("order"), orders as usize);
    assert_eq!(records.len(), orders as usize);
    let partitions: std::collections::HashSet<i32> =
        records.iter().map(|record| record.partition).collect();
    assert_eq!(partitions.len(), 2, "two partitions used");
    // The lag of each partition, per handler, once librdkafka's statistics came in (5 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let (_, metrics) = hexeract_tests::http::request(port, "GET", "/metrics", None)
            .await
            .unwrap_or_default();
        if metrics.contains("hexeract_consumer_lag{handler=\"stock::reserve\"")
            || tokio::time::Instant::now() > deadline
        {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let topic = kafka.topic("order");
    for partition in 0..2 {
        let line = format!(
            "hexeract_consumer_lag{{handler=\"stock::reserve\",topic=\"{topic}\",partition=\"{partition}\"}} 0"
        );
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    stop(cancel, running).await;
    let calls = CALLS.lock().unwrap().clone().unwrap();
    let duplicates: u32 = calls.values().map(|calls| calls - 1).sum();
    println!(
        "run on Kafka: {} pairs handled, {duplicates} duplicates",
        calls.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `HEXERACT_TRANSPORT=kafka` and no other Kafka variable but the replication factor of a
/// single local broker: `run` delivers through the broker at `localhost:9092`, its topics and
/// groups prefixed with the executable's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hexeract_transport_kafka_alone_runs_on_the_local_broker() {
    let kafka = TestKafka::tansu();
    assert!(
        matches!(kafka.brokers(), "127.0.0.1:9092" | "localhost:9092"),
        "this test runs `HEXERACT_TRANSPORT=kafka` alone, whose broker is localhost:9092; \
         TEST_KAFKA_BROKERS names {}: unset it, or run a broker there",
        kafka.brokers()
    );
    let (dir, port) = run_env(
        &[
            ("HEXERACT_TRANSPORT", "kafka"),
            ("KAFKA_REPLICATION_FACTOR", "1"),
        ],
        &[
            "KAFKA_BROKERS",
            "KAFKA_TOPIC_PREFIX",
            "KAFKA_TOPIC_PARTITIONS",
        ],
    );
    let orders = 20u32;
    let (cancel, running) = run_until_handled(
        port,
        &[
            "kafka relay",
            "kafka consumer billing::invoice",
            "kafka consumer stock::reserve",
        ],
        orders,
    )
    .await;
    // The topic is the aggregate's under the executable's name.
    let executable = std::env::current_exe().unwrap();
    let prefix = executable.file_stem().unwrap().to_string_lossy();
    let records = kafka.read_all(&format!("{prefix}.order"), orders as usize);
    assert!(
        records.len() >= orders as usize,
        "{} records",
        records.len()
    );
    stop(cancel, running).await;
    let _ = std::fs::remove_dir_all(&dir);
}
