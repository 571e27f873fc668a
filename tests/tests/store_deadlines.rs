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
use hexeract::rabbitmq::OutboxRelay;
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
    let relay = OutboxRelay::new(relay_store.clone(), &connection)
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
    let rest = OutboxRelay::new(Arc::new(schema.store()), &connection)
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
