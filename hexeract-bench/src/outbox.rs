//! Outbox drain on PostgreSQL: the worker against a raw sqlx loop running the same statements
//! with the same batch size, in alternating pairs, beside the single-statement drain rate that
//! bounds both.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hexeract::outbox::OutboxWorker;
use hexeract::store::postgres::PgStore;
use hexeract::store::DeliveryStore;
use hexeract::{CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Registry};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool, Row};
use tokio::sync::Notify;
use uuid::Uuid;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub(crate) const BATCH: u32 = 100;
const PAIRS: usize = 7;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "bench.ItemShipped")]
struct ItemShipped {
    order_id: u64,
    sku: String,
    quantity: u32,
    /// Padding, in the payload-size sweep only.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    note: String,
}

/// An event whose JSON is `payload` bytes long (0: the bare event, 60 bytes).
fn item(order_id: u64, payload: usize) -> ItemShipped {
    let mut item = ItemShipped {
        order_id,
        sku: "SKU-0042".into(),
        quantity: 3,
        note: String::new(),
    };
    if payload > 0 {
        let bare = serde_json::to_vec(&item).expect("encode").len() + r#","note":"""#.len();
        item.note = "x".repeat(payload.saturating_sub(bare).max(1));
    }
    item
}

/// The no-op handler: counts, and says when the last expected message arrived.
struct Count {
    seen: Arc<AtomicU64>,
    expected: u64,
    done: Arc<Notify>,
}

impl Handler<ItemShipped> for Count {
    type Error = std::convert::Infallible;
    async fn handle(&self, item: ItemShipped, _ctx: &Context) -> Result<(), Self::Error> {
        black_box(&item);
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.expected {
            self.done.notify_one();
        }
        Ok(())
    }
}

pub(crate) async fn connect() -> PgPool {
    let url = std::env::var("BENCH_DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    let options: PgConnectOptions = url
        .parse()
        .expect("BENCH_DATABASE_URL is a postgres:// URL");
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(
            options
                .application_name("hexeract-bench")
                .disable_statement_logging(),
        )
        .await
        .unwrap_or_else(|error| {
            panic!("cannot reach PostgreSQL ({error}); start it or set BENCH_DATABASE_URL")
        })
}

/// A migrated schema of its own holding `events` outbox rows.
pub(crate) async fn filled(pool: &PgPool, events: u64) -> PgStore {
    filled_with(pool, events, 0).await
}

/// [`filled`] with payloads of `payload` bytes (0: the bare event, 60 bytes).
async fn filled_with(pool: &PgPool, events: u64, payload: usize) -> PgStore {
    let schema = format!("bench_{}", Uuid::now_v7().simple());
    let store = PgStore::new(pool.clone(), &schema).expect("schema name");
    store.migrate().await.expect("migrate");
    let mut next = 0;
    while next < events {
        let batch: Vec<Envelope> = (next..events.min(next + 1_000))
            .map(|order_id| Envelope::new(&item(order_id, payload)).expect("encode"))
            .collect();
        next += batch.len() as u64;
        store.publish(batch).await.expect("fill");
    }
    // Fresh statistics, as a table that has been in use would have.
    sqlx::query(&format!("ANALYZE \"{schema}\".outbox"))
        .execute(pool)
        .await
        .expect("analyze");
    store
}

pub(crate) async fn drop_schema(pool: &PgPool, store: &PgStore) {
    sqlx::query(&format!("DROP SCHEMA \"{}\" CASCADE", store.schema()))
        .execute(pool)
        .await
        .expect("drop schema");
}

pub(crate) async fn run_worker(store: PgStore, events: u64) -> Duration {
    run_worker_with(store, events, 1).await
}

/// The handler names of the handlers-per-type sweep: `bench.count`, then `bench.count.1`….
fn handler_names(handlers: usize) -> Vec<String> {
    (0..handlers)
        .map(|n| match n {
            0 => "bench.count".to_owned(),
            n => format!("bench.count.{n}"),
        })
        .collect()
}

/// [`run_worker`] with `handlers` handlers of the type: until every one saw every event.
async fn run_worker_with(store: PgStore, events: u64, handlers: usize) -> Duration {
    let seen = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());
    let mut builder = OutboxWorker::builder(store).registry(Registry::new());
    for name in handler_names(handlers) {
        builder = builder.register_handler_with::<ItemShipped, _>(
            Count {
                seen: seen.clone(),
                expected: events * handlers as u64,
                done: done.clone(),
            },
            HandlerOptions::new().name(name),
        );
    }
    let worker = builder.batch_size(BATCH).build().expect("worker");
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(cancel.clone()));
    done.notified().await;
    let elapsed = started.elapsed();
    cancel.cancel();
    running.await.expect("join").expect("run");
    elapsed
}

/// The worker's cycle by hand: take (claim in place, or expand and claim, and delete the last
/// batch's acks, in one statement), decode and call: same statement, same batch.
async fn run_baseline(pool: &PgPool, store: &PgStore, events: u64, handlers: usize) -> Duration {
    let take = store.take_statement_for_benchmarks();
    let handlers = handler_names(handlers);
    let types = vec!["bench.ItemShipped"; handlers.len()];
    // A type with one handler is claimed in place; with several, expanded.
    let (single, several): (&[_], &[_]) = if handlers.len() == 1 {
        (&handlers, &[])
    } else {
        (&[], &handlers)
    };
    let (single_types, several_types) = (&types[..single.len()], &types[..several.len()]);
    let deliveries = events * handlers.len() as u64;
    let mut handled = 0u64;
    // The last batch's acks: its token, its deliveries rows and its messages claimed in place.
    let mut acks: (Uuid, Vec<i64>, Vec<Uuid>) = (Uuid::nil(), Vec::new(), Vec::new());
    let started = Instant::now();
    while handled < deliveries {
        let token = Uuid::now_v7();
        let rows = sqlx::query(take)
            .bind(token)
            .bind(30_000_i64)
            .bind(i64::from(BATCH))
            .bind(several_types)
            .bind(several)
            .bind(single_types)
            .bind(single)
            .bind(&acks.1)
            .bind(&acks.2)
            .bind(acks.0)
            .fetch_all(pool)
            .await
            .expect("take");
        let mut ids = Vec::with_capacity(rows.len());
        let mut messages = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(message) = row.get::<Option<Uuid>, _>("message_id") else {
                continue;
            };
            let payload: Vec<u8> = row.get("payload");
            let item: ItemShipped = serde_json::from_slice(&payload).expect("decode");
            black_box(item);
            match row.get::<Option<i64>, _>("id") {
                Some(id) => ids.push(id),
                None => messages.push(message),
            }
        }
        handled += (ids.len() + messages.len()) as u64;
        acks = (token, ids, messages);
    }
    started.elapsed()
}

/// The fastest a queue table drains: one `DELETE … SKIP LOCKED … RETURNING` per batch.
async fn run_physical_limit(pool: &PgPool, store: &PgStore, events: u64) -> Duration {
    let sql = format!(
        "DELETE FROM {s}.outbox WHERE id = ANY(ARRAY(
             SELECT id FROM {s}.outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED))
         RETURNING payload",
        s = store.schema().quoted()
    );
    let mut handled = 0u64;
    let started = Instant::now();
    while handled < events {
        let rows = sqlx::query(&sql)
            .bind(i64::from(BATCH))
            .fetch_all(pool)
            .await
            .expect("drain");
        for row in &rows {
            let payload: Vec<u8> = row.get("payload");
            black_box(serde_json::from_slice::<ItemShipped>(&payload).expect("decode"));
        }
        handled += rows.len() as u64;
    }
    started.elapsed()
}

fn rate(events: u64, elapsed: Duration) -> f64 {
    events as f64 / elapsed.as_secs_f64()
}

/// Prints the `outbox_drain` lines.
pub(crate) async fn drain(events: u64) {
    let pool = connect().await;
    let mut hexeract = Vec::new();
    let mut baseline = Vec::new();
    for _ in 0..PAIRS {
        let store = filled(&pool, events).await;
        hexeract.push(rate(events, run_worker(store.clone(), events).await));
        drop_schema(&pool, &store).await;

        let store = filled(&pool, events).await;
        baseline.push(rate(events, run_baseline(&pool, &store, events, 1).await));
        drop_schema(&pool, &store).await;
    }
    let store = filled(&pool, events).await;
    let limit = rate(events, run_physical_limit(&pool, &store, events).await);
    drop_schema(&pool, &store).await;

    let mut ratios: Vec<f64> = hexeract.iter().zip(&baseline).map(|(h, b)| h / b).collect();
    ratios.sort_by(f64::total_cmp);
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    println!(
        "scenario=outbox_drain hexeract={:.0} baseline={:.0} ratio={:.3}",
        median(hexeract),
        median(baseline),
        ratios[ratios.len() / 2]
    );
    println!(
        "scenario=outbox_drain ratio_min={:.3} ratio_max={:.3} pairs={PAIRS} events={events} batch={BATCH} physical_limit={limit:.0}",
        ratios[0],
        ratios[ratios.len() - 1],
    );
}

/// Pairs per point of a sweep.
const SWEEP_PAIRS: usize = 3;

/// Prints `outbox_drain_handlers<N>` (N = 1, 4, 16 handlers of the one type; rates in handler
/// calls per second) and `outbox_drain_payload<B>` (B = 200, 2 048 and 65 536 bytes of JSON,
/// one handler) lines: the worker against the raw take-and-ack loop, as `outbox_drain`.
pub(crate) async fn sweep(events: u64) {
    let pool = connect().await;
    let points = [(1, 200), (4, 200), (16, 200), (1, 2_048), (1, 65_536)];
    for (at, (handlers, payload)) in points.into_iter().enumerate() {
        // Fewer events where each is heavier, so that every point takes about as long.
        let events = (events / handlers as u64 / (payload as u64 / 2_048).max(1)).max(200);
        let mut hexeract = Vec::new();
        let mut baseline = Vec::new();
        for _ in 0..SWEEP_PAIRS {
            let store = filled_with(&pool, events, payload).await;
            let elapsed = run_worker_with(store.clone(), events, handlers).await;
            hexeract.push(rate(events * handlers as u64, elapsed));
            drop_schema(&pool, &store).await;

            let store = filled_with(&pool, events, payload).await;
            let elapsed = run_baseline(&pool, &store, events, handlers).await;
            baseline.push(rate(events * handlers as u64, elapsed));
            drop_schema(&pool, &store).await;
        }
        let scenario = if at < 3 {
            format!("outbox_drain_handlers{handlers}")
        } else {
            format!("outbox_drain_payload{payload}")
        };
        crate::rabbitmq::report(
            &scenario,
            &hexeract,
            &baseline,
            events,
            &format!(
                " handlers={handlers} payload_bytes={payload} batch={BATCH} unit=handler_calls"
            ),
        );
    }
}

/// Commit-to-handler latency of single events enqueued in a transaction of their own on a
/// separate connection (as another process would), with the worker woken by NOTIFY and with
/// polling only (the library's default 100 ms interval).
pub(crate) async fn latency(samples: usize) {
    let pool = connect().await;
    for (scenario, polling_only) in [
        ("outbox_latency_woken", false),
        ("outbox_latency_polling", true),
    ] {
        let mut latencies = probe_latencies(&pool, samples, polling_only).await;
        latencies.sort();
        let at = |quantile: f64| {
            let index =
                ((latencies.len() as f64 * quantile).ceil() as usize).clamp(1, latencies.len()) - 1;
            latencies[index].as_secs_f64() * 1_000.0
        };
        println!(
            "scenario={scenario} p50_ms={:.2} p99_ms={:.2} samples={samples}",
            at(0.50),
            at(0.99)
        );
    }
}

/// `samples` commit-to-handler latencies, in the order taken, of probes enqueued one at a time
/// in transactions of their own on `pool`, through a worker (with a second, idle handler)
/// woken by NOTIFY, or by polling alone with `polling_only`. Each probe waits for the worker to
/// go idle again.
pub(crate) async fn probe_latencies(
    pool: &PgPool,
    samples: usize,
    polling_only: bool,
) -> Vec<Duration> {
    let store = filled(pool, 0).await;
    let handled = Arc::new(Notify::new());
    let mut builder = OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<ItemShipped, _>(
            Count {
                seen: Arc::new(AtomicU64::new(0)),
                expected: 0,
                done: Arc::new(Notify::new()),
            },
            HandlerOptions::new().name("bench.count"),
        )
        .register_handler_with::<Probe, _>(
            Stopwatch(handled.clone()),
            HandlerOptions::new().name("bench.probe"),
        );
    if polling_only {
        builder = builder.polling_only();
    }
    let worker = builder.build().expect("worker");
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    // Let the worker subscribe and go idle.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let mut tx = pool.begin().await.expect("begin");
        let envelope = Envelope::new(&Probe {}).expect("encode");
        hexeract::outbox::enqueue_envelopes(&mut tx, store.schema().as_str(), &[envelope])
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        let committed = Instant::now();
        handled.notified().await;
        latencies.push(committed.elapsed());
        // Let the worker settle and go idle again, as between real events.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel.cancel();
    running.await.expect("join").expect("run");
    drop_schema(pool, &store).await;
    latencies
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "bench.Probe")]
struct Probe {}

/// Says when a probe arrived.
struct Stopwatch(Arc<Notify>);

impl Handler<Probe> for Stopwatch {
    type Error = std::convert::Infallible;
    async fn handle(&self, _probe: Probe, _ctx: &Context) -> Result<(), Self::Error> {
        self.0.notify_one();
        Ok(())
    }
}
