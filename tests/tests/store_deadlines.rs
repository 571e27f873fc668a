//! Deadlines on the store statements of the relay and the scheduler: a PostgreSQL path that goes
//! silent (the fault proxy's blackhole: sockets open, nothing forwarded) must neither hold a
//! loop for good nor leave a connection idle in a transaction once the path is back.
//!
//! Each test reaches PostgreSQL through its own proxy, with its own schema and
//! `application_name` (RabbitMQ directly, with the test's own exchange and queue), and cancels
//! while the path is still silent: before the deadlines, `run` did not return until the path
//! came back.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use hexeract::health::{Health, Status};
use hexeract::rabbitmq::RabbitMqRelay;
use hexeract::schedule::{ScheduledJob, SchedulerWorker, Spec};
use hexeract::store::{DeliveryStore, RelayStore};
use hexeract::{CancellationToken, Context, Envelope, HandlerOutcome, Message};
use hexeract_tests::amqp::TestBroker;
use hexeract_tests::pg::{connect_through, database_addr, TestSchema};
use hexeract_tests::proxy::FaultProxy;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "deadline.Relayed")]
struct Relayed {
    n: u32,
}

/// How long the store may take over its part of a pass or cycle in these tests.
const STORE_TIMEOUT: Duration = Duration::from_secs(1);
/// The relay's confirm timeout: with [`STORE_TIMEOUT`], how long a relay pass is waited for.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits until `probe` of `health` is failing, up to `limit`; returns how long that took.
async fn failing_within(health: &Health, probe: &str, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let readiness = health.readiness();
        let status = readiness
            .components
            .iter()
            .find(|component| component.name == probe)
            .map(|component| component.status.clone());
        if matches!(status, Some(Status::Failing { .. })) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "{probe} not failing within {limit:?} of the path going silent: {readiness}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Connections named `application_name` idle in a transaction.
async fn idle_in_transaction(schema: &TestSchema, application_name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
    )
    .bind(application_name)
    .fetch_one(&schema.pool)
    .await
    .expect("read pg_stat_activity")
}

/// Waits up to `limit` for no connection named `application_name` to be idle in a transaction.
async fn none_idle_in_transaction(schema: &TestSchema, application_name: &str, limit: Duration) {
    let started = Instant::now();
    loop {
        let idle = idle_in_transaction(schema, application_name).await;
        if idle == 0 {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "{idle} connection(s) of {application_name} still idle in a transaction {limit:?} \
             after the path came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_on_a_silent_postgres_path_gives_up_on_its_pass_stops_on_cancel_and_loses_nothing()
{
    const MESSAGES: u32 = 3_000;
    let schema = TestSchema::new("hexeract-tests-deadlines").await;
    let store = schema.migrated_store().await;
    let broker = TestBroker::new().await;
    // Every relayed message lands in one queue of the test's own.
    let queue = format!("{}.all", broker.prefix);
    let channel = broker.connection.lapin().create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let envelopes: Vec<Envelope> = (0..MESSAGES)
        .map(|n| Envelope::new(&Relayed { n }).unwrap())
        .collect();
    let ids: Vec<Uuid> = envelopes.iter().map(|envelope| envelope.id).collect();
    store.publish(envelopes).await.unwrap();

    let proxy = FaultProxy::start(database_addr()).await;
    let application_name = format!("hxd-relay-{}", &schema.schema[2..14]);
    let relay_store: Arc<dyn RelayStore> =
        Arc::new(schema.store_on(connect_through(&proxy, &application_name).await));
    let connection = broker.connect(&format!("{}.relay", broker.prefix)).await;
    let health = Health::new();
    let relay = RabbitMqRelay::new(relay_store.clone(), &connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone())
        .batch_size(20)
        .confirm_timeout(CONFIRM_TIMEOUT)
        .store_timeout(STORE_TIMEOUT)
        .health(health.probe("outbox relay"));
    channel
        .exchange_declare(
            broker.exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            broker.exchange.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(relay.run(cancel.clone()));
    // Some passes through, then the path goes silent in the middle of the stream of passes.
    while schema.count("outbox").await > i64::from(MESSAGES) * 2 / 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.blackhole(true);
    let noticed = failing_within(
        &health,
        "outbox relay",
        STORE_TIMEOUT + CONFIRM_TIMEOUT + Duration::from_secs(3),
    )
    .await;
    let cancelled = Instant::now();
    cancel.cancel();
    tokio::time::timeout(
        STORE_TIMEOUT + CONFIRM_TIMEOUT + Duration::from_secs(5),
        running,
    )
    .await
    .expect("the relay returns on cancel while its path is silent")
    .expect("the relay task does not panic")
    .expect("run returns Ok(()) on cancel");
    let stopped_after = cancelled.elapsed();
    proxy.blackhole(false);

    // The pass given up on ends by itself once the path is back: nothing is left idle in a
    // transaction, holding rows.
    none_idle_in_transaction(
        &schema,
        &application_name,
        CONFIRM_TIMEOUT * 2 + Duration::from_secs(10),
    )
    .await;

    // A relay on a healthy path takes the rest; every message reaches the queue.
    let cancel = CancellationToken::new();
    let rest = RabbitMqRelay::new(Arc::new(schema.store()), &connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone())
        .batch_size(100);
    let running = tokio::spawn(rest.run(cancel.clone()));
    let messages = broker
        .wait_for(&queue, MESSAGES as usize, Duration::from_secs(60))
        .await;
    cancel.cancel();
    running.await.unwrap().unwrap();
    let mut seen: Vec<Uuid> = messages
        .iter()
        .map(|message| {
            let id = message
                .properties
                .message_id()
                .as_ref()
                .expect("a message id");
            id.as_str().parse().expect("a UUID")
        })
        .collect();
    let duplicates = seen.len() - {
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    };
    let lost: Vec<&Uuid> = ids
        .iter()
        .filter(|id| seen.binary_search(id).is_err())
        .collect();
    println!(
        "relay_blackhole: messages={MESSAGES} lost={} duplicates={duplicates} \
         noticed_after_ms={} stopped_after_cancel_ms={}",
        lost.len(),
        noticed.as_millis(),
        stopped_after.as_millis()
    );
    assert!(lost.is_empty(), "{} messages lost: {lost:?}", lost.len());
    assert_eq!(
        schema.count("outbox").await,
        0,
        "nothing left in the outbox"
    );
    let _ = channel
        .queue_delete(queue.as_str().into(), Default::default())
        .await;
    drop(relay_store);
    schema.drop_schema().await;
}

fn ticking(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    let _ = ctx;
    Box::pin(async {
        TICKS.fetch_add(1, Ordering::SeqCst);
        HandlerOutcome::Ack
    })
}

static TICKS: AtomicU32 = AtomicU32::new(0);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_on_a_silent_postgres_path_reports_it_and_stops_on_cancel() {
    let schema = TestSchema::new("hexeract-tests-deadlines").await;
    schema.migrated_store().await;
    let proxy = FaultProxy::start(database_addr()).await;
    let application_name = format!("hxd-sched-{}", &schema.schema[2..14]);
    let store = schema.store_on(connect_through(&proxy, &application_name).await);
    let health = Health::new();
    let job = ScheduledJob::new(
        "deadline.tick",
        Spec::Every(Duration::from_millis(100)),
        ticking,
    );
    let scheduler = SchedulerWorker::builder(store)
        .job(job)
        .poll_interval(Duration::from_millis(20))
        .store_timeout(STORE_TIMEOUT)
        .health(health.probe("scheduler"))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(scheduler.run(cancel.clone()));
    let started = Instant::now();
    while TICKS.load(Ordering::SeqCst) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the job ran {} times within 30 s",
            TICKS.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.blackhole(true);
    // Before the deadline, a cycle stuck on the silent path was only noticed when the pool gave
    // up acquiring a connection for another statement (5 s in these tests, 30 s by default).
    let noticed =
        failing_within(&health, "scheduler", STORE_TIMEOUT + Duration::from_secs(3)).await;
    let cancelled = Instant::now();
    cancel.cancel();
    tokio::time::timeout(STORE_TIMEOUT + Duration::from_secs(10), running)
        .await
        .expect("the scheduler returns on cancel while its path is silent")
        .expect("the scheduler task does not panic")
        .expect("run returns Ok(()) on cancel");
    let stopped_after = cancelled.elapsed();
    proxy.blackhole(false);
    none_idle_in_transaction(&schema, &application_name, Duration::from_secs(30)).await;
    println!(
        "scheduler_blackhole: noticed_after_ms={} stopped_after_cancel_ms={}",
        noticed.as_millis(),
        stopped_after.as_millis()
    );
    schema.drop_schema().await;
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "deadline.Slow")]
struct Slow;

/// A handler whose call waits for the test, whatever its context says.
struct WaitsForGate {
    started: Arc<tokio::sync::Notify>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl hexeract::Handler<Slow> for WaitsForGate {
    type Error = std::convert::Infallible;

    async fn handle(&self, _: Slow, _: &Context) -> Result<(), Self::Error> {
        self.started.notify_one();
        let _ = self.gate.acquire().await;
        Ok(())
    }
}

/// Stopping has one hard deadline, the shutdown grace and 5 s to settle: an outbox worker whose
/// call ignores its cancellation, and whose database path goes silent as it stops, returns by
/// then, although its store statements may each wait their whole `store_timeout` (a minute
/// here; before the deadline, `run` waited that long for the hand-back). Nothing is lost: the
/// delivery stays in the store, and no connection is left in a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_worker_stops_by_its_hard_deadline_when_its_last_writes_cannot_land() {
    const GRACE: Duration = Duration::from_millis(300);
    const SLOW_STORE: Duration = Duration::from_secs(60);
    let schema = TestSchema::new("hexeract-tests-deadlines").await;
    let direct = schema.migrated_store().await;
    let proxy = FaultProxy::start(database_addr()).await;
    let application_name = format!("hxd-stop-{}", &schema.schema[2..14]);
    // The pool waits as long as the statements may: only the deadline can end the stop early.
    let store = schema.store_on(
        hexeract_tests::pg::connect_through_waiting(&proxy, &application_name, SLOW_STORE).await,
    );
    let started = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let worker = hexeract::outbox::OutboxWorker::builder(store)
        .registry(hexeract::Registry::new())
        .register_handler_with::<Slow, _>(
            WaitsForGate {
                started: started.clone(),
                gate: gate.clone(),
            },
            hexeract::HandlerOptions::new().name("deadline.slow"),
        )
        .poll_interval(Duration::from_millis(20))
        .store_timeout(SLOW_STORE)
        .shutdown_grace(GRACE)
        .build()
        .unwrap();
    direct
        .publish(vec![Envelope::new(&Slow).unwrap()])
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    tokio::time::timeout(Duration::from_secs(30), started.notified())
        .await
        .expect("the call starts within 30 s");
    proxy.blackhole(true);
    let cancelled = Instant::now();
    cancel.cancel();
    let deadline = GRACE + Duration::from_secs(5);
    tokio::time::timeout(deadline + Duration::from_secs(10), running)
        .await
        .expect("run returns by its hard deadline, not after its store timeout")
        .expect("the worker task does not panic")
        .expect("run returns Ok(()) on cancel");
    let stopped_after = cancelled.elapsed();
    println!(
        "outbox_stop_deadline: grace_ms={} stopped_after_cancel_ms={}",
        GRACE.as_millis(),
        stopped_after.as_millis()
    );
    assert!(
        stopped_after >= GRACE,
        "stopped {stopped_after:?} after the cancel: the call had its grace of {GRACE:?}"
    );
    assert!(
        stopped_after < SLOW_STORE / 2,
        "stopped {stopped_after:?} after the cancel: the hand-back was waited for"
    );
    gate.add_permits(1);
    proxy.blackhole(false);
    none_idle_in_transaction(&schema, &application_name, Duration::from_secs(30)).await;
    // The abandoned call's settle (a retry: out of the outbox, into the deliveries) may land
    // only now that the database answers again: both tables in one snapshot.
    assert_eq!(
        schema.count_together(&["deliveries", "outbox"]).await,
        1,
        "the message given up on at the deadline is still in the store"
    );
    schema.drop_schema().await;
}
