//! The RabbitMQ worker's ack modes. `AckMode::Manual` (the default) acks a delivery once its
//! outcome is settled, so a call cut off by a lost connection is delivered again;
//! `AckMode::Automatic` acks it as a call takes it, so the same cut loses it (at most once),
//! while failures are still retried and parked with their `dead_letters` row, and no more than
//! `prefetch` calls of a queue run at once.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`) and
//! `rabbitmqctl` (to close a worker's connection by its name). Each test has its own exchange,
//! queues and connection names.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hexeract::rabbitmq::{AckMode, BusError, RabbitMqPublisher, RabbitMqWorkerBuilder};
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::{DeadLetterStore, DeliveryStore};
use hexeract::{CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Reason};
use hexeract_tests::amqp::{close_connections_named, TestBroker};
use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "acks.Tick")]
struct Tick {
    n: u32,
}

/// Records every call; the first call of `slow` sleeps, order 13 always fails.
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<(Uuid, u32)>>>,
    running: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
    first_call_takes: Option<Duration>,
    each_call_takes: Duration,
}

impl Recorder {
    fn calls(&self) -> Vec<(Uuid, u32)> {
        self.calls.lock().unwrap().clone()
    }
}

#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tick 13 is refused")
    }
}

impl std::error::Error for Refused {}

impl Handler<Tick> for Recorder {
    type Error = Refused;

    async fn handle(&self, tick: Tick, ctx: &Context) -> Result<(), Refused> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        let first = {
            let mut calls = self.calls.lock().unwrap();
            calls.push((ctx.message_id(), ctx.attempt()));
            calls.len() == 1
        };
        let takes = match self.first_call_takes {
            Some(takes) if first => takes,
            _ => self.each_call_takes,
        };
        tokio::time::sleep(takes).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        if tick.n == 13 {
            return Err(Refused);
        }
        Ok(())
    }
}

async fn until(what: &str, limit: Duration, check: impl Fn() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn subscribed(broker: &TestBroker, queue: &str) {
    let started = Instant::now();
    while broker.consumers(queue).await != Some(1) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no consumer on {queue} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker for `recorder` on a connection named `name`, in `mode`.
async fn worker(
    broker: &TestBroker,
    name: &str,
    mode: AckMode,
    recorder: &Recorder,
) -> hexeract::rabbitmq::RabbitMqWorker {
    RabbitMqWorkerBuilder::new(broker.connect(name).await)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .ack_mode(mode)
        .shutdown_grace(Duration::from_secs(5))
        .register_handler_with::<Tick, _>(recorder.clone(), HandlerOptions::new().name("acks.tick"))
        .park_without_rows()
        .build()
        .expect("the worker builds")
}

/// The worker's connection is closed while its one call runs; a second worker starts.
/// Returns the calls of the one message.
async fn a_call_cut_by_a_closed_connection(mode: AckMode) -> (Vec<(Uuid, u32)>, u32) {
    let broker = TestBroker::new().await;
    let recorder = Recorder {
        // Longer than rabbitmqctl takes to find and close the connection (seconds).
        first_call_takes: Some(Duration::from_secs(8)),
        ..Recorder::default()
    };
    let first_name = format!("{}.first", broker.prefix);
    let first = worker(&broker, &first_name, mode, &recorder).await;
    let queue = first.queues()[0].to_owned();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(first.run(cancel.clone()));
    subscribed(&broker, &queue).await;
    let publisher = RabbitMqPublisher::new(&broker.connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone());
    let tick = Envelope::new(&Tick { n: 1 }).unwrap();
    publisher.publish(&tick).await.unwrap();
    until("the first call started", Duration::from_secs(30), || {
        recorder.calls().len() == 1
    })
    .await;
    // Acks of an automatic worker go out within a millisecond of the take: let them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(close_connections_named(&first_name) >= 1);
    assert_eq!(
        recorder.calls().len(),
        1,
        "the connection closed during the first call"
    );
    let stopped = running.await.expect("no panic");
    assert!(
        matches!(stopped, Err(BusError::Connection(_))),
        "{stopped:?}"
    );

    let second = worker(
        &broker,
        &format!("{}.second", broker.prefix),
        mode,
        &recorder,
    )
    .await;
    let running = tokio::spawn(second.run(cancel.clone()));
    subscribed(&broker, &queue).await;
    if mode == AckMode::Manual {
        until("the message came again", Duration::from_secs(30), || {
            recorder.calls().len() == 2
        })
        .await;
    } else {
        // Nothing comes: give a redelivery every chance to show.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    cancel.cancel();
    running.await.unwrap().unwrap();
    let ready = broker.ready(&queue).await;
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
    let calls = recorder.calls();
    assert!(calls.iter().all(|(id, _)| *id == tick.id), "{calls:?}");
    (calls, ready)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_acks_deliver_a_call_cut_by_a_lost_connection_again() {
    let (calls, ready) = a_call_cut_by_a_closed_connection(AckMode::Manual).await;
    assert_eq!(calls.len(), 2, "called again after the cut: {calls:?}");
    assert_eq!(ready, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_acks_lose_a_call_cut_by_a_lost_connection() {
    let (calls, ready) = a_call_cut_by_a_closed_connection(AckMode::Automatic).await;
    assert_eq!(
        calls.len(),
        1,
        "acked when taken: the broker has nothing to deliver again: {calls:?}"
    );
    assert_eq!(ready, 0, "and nothing waits in the queue");
}

/// Automatic acks change when a delivery is acked, not what a failure becomes: retried, then
/// parked with its reason and `dead_letters` row. And the worker keeps to `prefetch` calls at
/// once, although the broker no longer counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_acks_still_retry_park_and_keep_to_prefetch() {
    let broker = TestBroker::new().await;
    let dir = std::env::temp_dir().join(format!("hexeract-acks-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(dir.join("dead-letters.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let recorder = Recorder {
        each_call_takes: Duration::from_millis(50),
        ..Recorder::default()
    };
    let worker = RabbitMqWorkerBuilder::new(broker.connect(&broker.prefix).await)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .ack_mode(AckMode::Automatic)
        .prefetch(2)
        .max_attempts(2)
        .retry_delays(Duration::from_millis(100), Duration::from_millis(100))
        .wait_tiers([Duration::from_millis(100)])
        .dead_letters(Arc::new(store.clone()) as Arc<dyn DeadLetterStore>)
        .register_handler_with::<Tick, _>(recorder.clone(), HandlerOptions::new().name("acks.tick"))
        .build()
        .unwrap();
    let queue = worker.queues()[0].to_owned();
    let parking = format!("{queue}.parked");
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    subscribed(&broker, &queue).await;
    let publisher = RabbitMqPublisher::new(&broker.connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone());
    let ticks: Vec<Envelope> = (0..20)
        .map(|n| {
            Envelope::new(&Tick {
                n: if n == 7 { 13 } else { 100 + n },
            })
            .unwrap()
        })
        .collect();
    publisher.publish_all(&ticks).await.unwrap();
    let parked = broker.wait_for(&parking, 1, Duration::from_secs(30)).await;
    until("every tick called", Duration::from_secs(30), || {
        recorder.calls().len() >= 21
    })
    .await;
    cancel.cancel();
    running.await.unwrap().unwrap();

    let refused = ticks[7].id;
    let calls = recorder.calls();
    let attempts: Vec<u32> = calls
        .iter()
        .filter(|(id, _)| *id == refused)
        .map(|(_, attempt)| *attempt)
        .collect();
    assert_eq!(attempts, [1, 2], "retried once, then parked");
    assert_eq!(calls.len(), 21, "each other tick once: {calls:?}");
    assert_eq!(parked.len(), 1);
    let rows = store.dead_letters(10).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].envelope.id, refused);
    assert_eq!(rows[0].reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert!(
        rows[0].detail.contains("tick 13 is refused"),
        "{}",
        rows[0].detail
    );
    let most = recorder.most_at_once.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&most),
        "at most prefetch (2) calls at once, saw {most}"
    );
    assert_eq!(broker.ready(&queue).await, 0);
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
    let _ = std::fs::remove_dir_all(dir);
}
