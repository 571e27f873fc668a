//! `hexeract::run` with `AMQP_URL` passes `AMQP_PREFETCH` and `MAX_PAYLOAD_BYTES` to the
//! RabbitMQ worker: no more calls of a queue run at once than the prefetch, and a payload over
//! the limit is parked without being decoded.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). The test
//! uses its own exchange and queue prefix, and an SQLite outbox of its own; nextest runs it in a
//! process of its own, so setting the environment is safe.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use hexeract::rabbitmq::headers;
use hexeract::{handler, CancellationToken, Context, Message};
use hexeract_tests::amqp::TestBroker;
use lapin::types::AMQPValue;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "knobs.Held")]
struct Held {
    filler: String,
}

static RUNNING: AtomicU32 = AtomicU32::new(0);
static MOST_AT_ONCE: AtomicU32 = AtomicU32::new(0);
static HANDLED: AtomicU32 = AtomicU32::new(0);
static RELEASED: AtomicBool = AtomicBool::new(false);

/// Holds every call until the test releases them, counting how many run at once.
#[handler(message = "knobs.Held", name = "knobs::hold")]
async fn hold(_message: Held, _ctx: &Context) -> Result<(), String> {
    let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
    MOST_AT_ONCE.fetch_max(now, Ordering::SeqCst);
    while !RELEASED.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    RUNNING.fetch_sub(1, Ordering::SeqCst);
    HANDLED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_gives_the_rabbitmq_worker_its_prefetch_and_payload_limit() {
    let broker = TestBroker::new().await;
    let dir =
        std::env::temp_dir().join(format!("hexeract-run-amqp-knobs-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::remove_var("DATABASE_URL");
    std::env::remove_var("KAFKA_BROKERS");
    for (variable, value) in [
        (
            "HEXERACT_SQLITE_PATH",
            dir.join("outbox.db").to_str().unwrap(),
        ),
        ("AMQP_URL", &hexeract_tests::amqp::amqp_url()),
        ("HEXERACT_EXCHANGE", &broker.exchange),
        ("HEXERACT_QUEUE_PREFIX", &broker.prefix),
        ("RELAY_POLL_INTERVAL_MS", "50"),
        ("WORKER_PORT", "0"),
        // 1: at most one call at a time, where the default would allow 16.
        ("AMQP_PREFETCH", "1"),
        ("MAX_PAYLOAD_BYTES", "64"),
    ] {
        std::env::set_var(variable, value);
    }

    let cancel = CancellationToken::new();
    let running = tokio::spawn(hexeract::run(cancel.clone()));
    let envelopes = (0..6)
        .map(|_| {
            hexeract::Envelope::new(&Held {
                filler: String::new(),
            })
            .unwrap()
        })
        .collect();
    let store = hexeract::store::default_store().await.unwrap();
    store.publish(envelopes).await.unwrap();

    // AMQP_PREFETCH: one of the six at a time (the default, 16, would let all six in).
    wait_until("a call running", || RUNNING.load(Ordering::SeqCst) == 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        MOST_AT_ONCE.load(Ordering::SeqCst),
        1,
        "calls at once with AMQP_PREFETCH=1"
    );
    RELEASED.store(true, Ordering::SeqCst);
    wait_until("all six handled", || HANDLED.load(Ordering::SeqCst) == 6).await;

    // MAX_PAYLOAD_BYTES: `publish` refuses a payload over 64 bytes, writing nothing; one that
    // another program publishes to the exchange is parked, never handed to the handler.
    let large = Held {
        filler: "x".repeat(200),
    };
    let refused = hexeract::publish(&large).await.unwrap_err().to_string();
    assert!(refused.contains("MAX_PAYLOAD_BYTES (64)"), "{refused}");
    broker
        .publish_raw(
            "knobs.Held",
            &serde_json::to_vec(&large).unwrap(),
            lapin::BasicProperties::default()
                .with_message_id(uuid::Uuid::now_v7().to_string().into())
                .with_content_type("application/json".into())
                .with_type("knobs.Held".into()),
        )
        .await;
    let parking = format!("{}.knobs.hold.parked", broker.prefix);
    let parked = broker.wait_for(&parking, 1, Duration::from_secs(30)).await;
    let reason = parked[0]
        .delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|table| table.inner().get(headers::REASON).cloned());
    match reason {
        Some(AMQPValue::LongString(reason)) => {
            assert_eq!(
                String::from_utf8_lossy(reason.as_bytes()),
                "payload_too_large"
            );
        }
        other => panic!("reason header: {other:?}"),
    }
    assert_eq!(
        HANDLED.load(Ordering::SeqCst),
        6,
        "the large one was not handled"
    );

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("run returns after cancel")
        .unwrap()
        .expect("run returns Ok(()) on cancel");
    let registry = hexeract::Registry::from_inventory().unwrap();
    let topology = hexeract::rabbitmq::Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone());
    broker.delete(&topology).await;
    drop(store);
    std::fs::remove_dir_all(&dir).ok();
}
