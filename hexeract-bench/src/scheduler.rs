//! Scheduler dispatch on PostgreSQL: the `SchedulerWorker` running a no-op job over due
//! occurrences against a raw sqlx loop running the worker's own claim and ack statements with
//! the same batch size, in alternating pairs.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use hexeract::schedule::{ScheduledJob, SchedulerWorker, Spec};
use hexeract::store::postgres::PgStore;
use hexeract::store::{DeliveryStore, ScheduleDefinition, ScheduleStore};
use hexeract::{CancellationToken, Context, HandlerOutcome};
use sqlx::{PgPool, Row};
use uuid::Uuid;

const BATCH: u32 = 100;
const PAIRS: usize = 5;
const JOB: &str = "bench.tick";

/// Runs of the no-op job so far (one process, one scenario at a time).
static RUNS: AtomicU64 = AtomicU64::new(0);

fn tick(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    black_box(ctx.message_id());
    RUNS.fetch_add(1, Ordering::Relaxed);
    Box::pin(std::future::ready(HandlerOutcome::Ack))
}

fn job() -> ScheduledJob {
    // Daily: its own fire times do not come due during a run; the occurrences are written
    // by the benchmark.
    ScheduledJob::new(JOB, Spec::Every(Duration::from_secs(86_400)), tick)
}

/// A migrated schema of its own holding `occurrences` due occurrences of the job.
async fn filled(pool: &PgPool, occurrences: u64) -> PgStore {
    let schema = format!("bench_{}", Uuid::now_v7().simple());
    let store = PgStore::new(pool.clone(), &schema).expect("schema name");
    store.migrate().await.expect("migrate");
    // The worker's own spec text, so its startup sync leaves the schedule alone.
    let definition = ScheduleDefinition {
        name: JOB.to_owned(),
        spec: job().spec().stored_text(),
    };
    let later = |_: &str, now: chrono::DateTime<chrono::Utc>| now + chrono::Duration::days(1);
    store
        .sync_schedules(std::slice::from_ref(&definition), &later)
        .await
        .expect("schedule");
    sqlx::query(&format!(
        "INSERT INTO {s}.occurrences (id, schedule, fire_at, available_at)
         SELECT gen_random_uuid(), $1, t, t
         FROM generate_series(1, $2::bigint) AS n,
              LATERAL (SELECT now() - interval '1 day' + n * interval '1 millisecond') AS f(t)",
        s = store.schema().quoted()
    ))
    .bind(JOB)
    .bind(i64::try_from(occurrences).expect("count"))
    .execute(pool)
    .await
    .expect("fill");
    sqlx::query(&format!("ANALYZE {}.occurrences", store.schema().quoted()))
        .execute(pool)
        .await
        .expect("analyze");
    store
}

async fn drop_schema(pool: &PgPool, store: &PgStore) {
    sqlx::query(&format!("DROP SCHEMA {} CASCADE", store.schema().quoted()))
        .execute(pool)
        .await
        .expect("drop schema");
}

async fn run_worker(store: PgStore, occurrences: u64) -> Duration {
    RUNS.store(0, Ordering::SeqCst);
    let worker = SchedulerWorker::builder(store)
        .job(job())
        .batch_size(BATCH)
        // The baseline loops without a pause; so does the worker here.
        .min_cycle_delay(Duration::ZERO)
        .without_delayed_messages()
        .build()
        .expect("scheduler");
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(cancel.clone()));
    while RUNS.load(Ordering::SeqCst) < occurrences {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let elapsed = started.elapsed();
    cancel.cancel();
    running.await.expect("join").expect("run");
    elapsed
}

/// The worker's cycle by hand: claim a batch, call the job for each, ack the batch.
async fn run_baseline(pool: &PgPool, store: &PgStore, occurrences: u64) -> Duration {
    let [claim, ack] = store.schedule_statements_for_benchmarks();
    let names = vec![JOB.to_owned()];
    let mut handled = 0u64;
    let started = Instant::now();
    while handled < occurrences {
        let token = Uuid::now_v7();
        let rows = sqlx::query(claim)
            .bind(token)
            .bind(30_000_i64)
            .bind(i64::from(BATCH))
            .bind(&names)
            .fetch_all(pool)
            .await
            .expect("claim");
        let mut ids = Vec::with_capacity(rows.len());
        for row in rows {
            let id: Uuid = row.get("id");
            black_box(row.get::<String, _>("schedule"));
            black_box(id);
            ids.push(id);
        }
        handled += ids.len() as u64;
        sqlx::query(ack)
            .bind(&ids)
            .bind(token)
            .execute(pool)
            .await
            .expect("ack");
    }
    started.elapsed()
}

fn rate(occurrences: u64, elapsed: Duration) -> f64 {
    occurrences as f64 / elapsed.as_secs_f64()
}

/// Prints the `scheduler_dispatch` lines.
pub(crate) async fn dispatch(occurrences: u64) {
    let pool = crate::outbox::connect().await;
    let mut hexeract = Vec::new();
    let mut baseline = Vec::new();
    for _ in 0..PAIRS {
        let store = filled(&pool, occurrences).await;
        hexeract.push(rate(
            occurrences,
            run_worker(store.clone(), occurrences).await,
        ));
        drop_schema(&pool, &store).await;

        let store = filled(&pool, occurrences).await;
        baseline.push(rate(
            occurrences,
            run_baseline(&pool, &store, occurrences).await,
        ));
        drop_schema(&pool, &store).await;
    }
    let mut ratios: Vec<f64> = hexeract.iter().zip(&baseline).map(|(h, b)| h / b).collect();
    ratios.sort_by(f64::total_cmp);
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    println!(
        "scenario=scheduler_dispatch hexeract={:.0} baseline={:.0} ratio={:.3}",
        median(hexeract),
        median(baseline),
        ratios[ratios.len() / 2]
    );
    println!(
        "scenario=scheduler_dispatch ratio_min={:.3} ratio_max={:.3} pairs={PAIRS} occurrences={occurrences} batch={BATCH} min_cycle_delay_ms=0",
        ratios[0],
        ratios[ratios.len() - 1],
    );
}
