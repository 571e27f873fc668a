//! The scheduler on real PostgreSQL (a schema per test) and SQLite (a file per test):
//! concurrent workers share due occurrences without running one twice at once, a worker whose
//! lease ran out cannot settle over the one that took over, timeouts retry and then
//! dead-letter (on PostgreSQL; the conformance suite runs the scheduler's part of the delivery
//! contract on SQLite), missed fire times are caught up once or skipped, delayed messages
//! arrive not before their time, and bad knobs are refused.
//!
//! Needs PostgreSQL at `TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! The ledger of job runs is a process-wide static: these tests rely on nextest's one process
//! per test (the README's test command).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use hexeract::schedule::{CatchUp, ScheduledJob, SchedulerWorker, Spec};
use hexeract::store::Store;
use hexeract::store::{DeliveryStore, ScheduleDefinition};
use hexeract::{CancellationToken, Context, HandlerOutcome, Reason};
use uuid::Uuid;

/// Every run of every job in this test process: occurrence id → (job, attempt) per run, and
/// the occurrences running right now.
#[derive(Default)]
struct Ledger {
    runs: HashMap<Uuid, Vec<(String, u32)>>,
    running: HashSet<Uuid>,
    /// The most runs at once.
    most_at_once: usize,
    overlaps: u32,
    fire_times: Vec<(String, Option<DateTime<Utc>>)>,
}

static LEDGER: Mutex<Option<Ledger>> = Mutex::new(None);

fn ledger<T>(f: impl FnOnce(&mut Ledger) -> T) -> T {
    f(LEDGER.lock().unwrap().get_or_insert_with(Ledger::default))
}

fn start_run(ctx: &Context) {
    ledger(|ledger| {
        ledger
            .runs
            .entry(ctx.message_id())
            .or_default()
            .push((ctx.handler_name().to_owned(), ctx.attempt()));
        ledger
            .fire_times
            .push((ctx.handler_name().to_owned(), ctx.scheduled_for()));
        if !ledger.running.insert(ctx.message_id()) {
            ledger.overlaps += 1;
        }
        ledger.most_at_once = ledger.most_at_once.max(ledger.running.len());
    });
}

fn end_run(ctx: &Context) {
    ledger(|ledger| ledger.running.remove(&ctx.message_id()));
}

/// Runs for a few milliseconds.
fn short_job(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        start_run(ctx);
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..4))).await;
        end_run(ctx);
        HandlerOutcome::Ack
    })
}

/// Never finishes in time.
fn stuck_job(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        start_run(ctx);
        tokio::time::sleep(Duration::from_secs(30)).await;
        HandlerOutcome::Ack
    })
}

/// The first run takes 1.5 s and fails; the second fails at once.
fn slow_then_fast(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        start_run(ctx);
        let outcome = if ctx.attempt() == 1 {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            HandlerOutcome::retry("the first run failed, late")
        } else {
            HandlerOutcome::retry("the second run failed")
        };
        end_run(ctx);
        outcome
    })
}

fn runs_of(job: &str) -> Vec<(Uuid, u32)> {
    ledger(|ledger| {
        let mut runs: Vec<(Uuid, u32)> = ledger
            .runs
            .iter()
            .flat_map(|(id, runs)| {
                runs.iter()
                    .filter(|(name, _)| name == job)
                    .map(|(_, attempt)| (*id, *attempt))
            })
            .collect();
        runs.sort_by_key(|(_, attempt)| *attempt);
        runs
    })
}

/// A daily job: its own next fire time does not come during a test; the test makes one due.
fn every_day(
    name: &str,
    run: for<'a> fn(&'a Context) -> BoxFuture<'a, HandlerOutcome>,
) -> ScheduledJob {
    ScheduledJob::new(name, Spec::Every(Duration::from_secs(86_400)), run)
}

/// Writes the schedules of `jobs` with their first fire time `ago` in the past, so each has an
/// occurrence due at once.
async fn due_now(store: &dyn Store, jobs: &[ScheduledJob], ago: Duration) {
    let definitions: Vec<ScheduleDefinition> = jobs
        .iter()
        .map(|job| ScheduleDefinition {
            name: job.name().to_owned(),
            // The worker's own text: its sync then leaves the schedule as written here.
            spec: job.spec().stored_text(),
        })
        .collect();
    let first = move |_: &str, now: DateTime<Utc>| now - chrono::Duration::from_std(ago).unwrap();
    store.sync_schedules(&definitions, &first).await.unwrap();
}

async fn wait_until(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pg_store() -> (hexeract_tests::pg::TestSchema, Arc<dyn Store>) {
    let schema = hexeract_tests::pg::TestSchema::new("hexeract-tests-scheduler").await;
    let store = schema.store();
    store.migrate().await.unwrap();
    (schema, Arc::new(store))
}

async fn sqlite_store() -> (std::path::PathBuf, Arc<dyn Store>) {
    let dir = std::env::temp_dir().join(format!("hexeract-scheduler-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = hexeract::store::sqlite::SqliteStore::open(dir.join("schedules.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (dir, Arc::new(store))
}

/// 3 workers, 1000 jobs due at once: each occurrence runs exactly once, never twice at once.
async fn three_workers_share_1000_due_occurrences(store: Arc<dyn Store>) {
    let jobs: Vec<ScheduledJob> = (0..1000)
        .map(|n| every_day(&format!("job-{n:04}"), short_job))
        .collect();
    due_now(&*store, &jobs, Duration::from_secs(1)).await;
    let cancel = CancellationToken::new();
    let runs: Vec<_> = (0..3)
        .map(|_| {
            let worker = jobs
                .iter()
                .fold(
                    SchedulerWorker::builder_shared(store.clone())
                        .poll_interval(Duration::from_millis(20))
                        .min_cycle_delay(Duration::from_millis(1)),
                    |builder, job| builder.job(job.clone()),
                )
                .build()
                .unwrap();
            tokio::spawn(worker.run(cancel.clone()))
        })
        .collect();
    wait_until("1000 runs", Duration::from_secs(60), || {
        ledger(|ledger| ledger.runs.len() >= 1000 && ledger.running.is_empty())
    })
    .await;
    // Time for a duplicate to show up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    ledger(|ledger| {
        assert_eq!(ledger.runs.len(), 1000, "every occurrence ran");
        let twice: Vec<_> = ledger
            .runs
            .iter()
            .filter(|(_, runs)| runs.len() > 1)
            .collect();
        assert!(twice.is_empty(), "ran more than once: {twice:?}");
        assert_eq!(ledger.overlaps, 0, "no occurrence ran twice at once");
        assert!(
            ledger
                .fire_times
                .iter()
                .all(|(_, fire_time)| fire_time.is_some()),
            "each run knew its fire time"
        );
    });
    assert_eq!(store.schedule_backlog().await.unwrap(), 0, "all settled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_three_workers_share_1000_due_occurrences_each_once() {
    let (schema, store) = pg_store().await;
    three_workers_share_1000_due_occurrences(store).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_three_workers_share_1000_due_occurrences_each_once() {
    let (dir, store) = sqlite_store().await;
    three_workers_share_1000_due_occurrences(store).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Where a test's store keeps its occurrences, for reading what the store API does not show.
enum Tables<'a> {
    Postgres(&'a hexeract_tests::pg::TestSchema),
    Sqlite(&'a std::path::Path),
}

impl Tables<'_> {
    async fn last_errors(&self) -> Vec<Option<String>> {
        match self {
            Tables::Postgres(schema) => sqlx::query_scalar(&format!(
                "SELECT last_error FROM {}.occurrences",
                schema.schema
            ))
            .fetch_all(&schema.pool)
            .await
            .unwrap(),
            Tables::Sqlite(dir) => {
                let url = format!("sqlite://{}", dir.join("schedules.db").display());
                let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
                sqlx::query_scalar("SELECT last_error FROM hexeract_occurrences")
                    .fetch_all(&pool)
                    .await
                    .unwrap()
            }
        }
    }
}

/// A claim whose holder stalls past its lease (a process paused, a VM frozen: a worker's own
/// calls cannot outlive it, since the builder refuses a lease shorter than the dispatch timeout
/// and the room to settle): a new claim takes the occurrence over and fails it, due again in
/// 5 s; the stalled holder's late failure is refused: the outcome on record is the second
/// run's, and nothing runs a third time meanwhile. The stalled holder is a claim made through
/// the store, as its worker would have made it; `scheduler_pause.rs` pauses a real scheduler
/// process with SIGSTOP instead.
async fn a_run_past_its_lease_is_taken_over_and_the_old_worker_cannot_settle(
    store: Arc<dyn Store>,
    tables: Tables<'_>,
) {
    let job = every_day("slow", slow_then_fast);
    due_now(&*store, std::slice::from_ref(&job), Duration::from_secs(1)).await;
    let names = vec![job.name().to_owned()];
    assert_eq!(
        worker_plan_once(&store, &names).await,
        1,
        "one occurrence due"
    );
    let stalled = Uuid::now_v7();
    let claimed = store
        .claim_occurrences(stalled, &names, 10, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let worker = SchedulerWorker::builder_shared(store.clone())
        .job(job.clone())
        .dispatch_timeout(Duration::from_secs(5))
        .retry_delays(Duration::from_secs(5), Duration::from_secs(5))
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let second = tokio::spawn(worker.run(cancel.clone()));
    wait_until("the takeover", Duration::from_secs(10), || {
        runs_of("slow").len() == 1
    })
    .await;
    // The second run has failed and settled; the stalled holder now settles its own, late.
    wait_until("the second run's end", Duration::from_secs(10), || {
        ledger(|ledger| ledger.running.is_empty())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let settled_late = store
        .occurrences()
        .retry(
            stalled,
            claimed[0].id,
            Duration::from_millis(10),
            "the first run failed, late",
        )
        .await
        .unwrap();
    assert!(
        !settled_late,
        "the stalled holder's claim was lost: its failure is refused"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    cancel.cancel();
    second.await.unwrap().unwrap();
    let runs = runs_of("slow");
    assert_eq!(
        runs.iter().map(|(_, attempt)| *attempt).collect::<Vec<_>>(),
        [2],
        "run once, by the worker that took over, charged the stalled claim; the stale failure \
         did not make it due again"
    );
    assert_eq!(runs[0].0, claimed[0].id, "the same occurrence");
    assert_eq!(
        tables.last_errors().await,
        [Some("handler_failed: the second run failed".to_owned())],
        "the outcome recorded is the second worker's"
    );
    assert!(store.dead_letters(10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_run_past_its_lease_is_taken_over_and_the_old_worker_cannot_settle() {
    let (schema, store) = pg_store().await;
    a_run_past_its_lease_is_taken_over_and_the_old_worker_cannot_settle(
        store,
        Tables::Postgres(&schema),
    )
    .await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_run_past_its_lease_is_taken_over_and_the_old_worker_cannot_settle() {
    let (dir, store) = sqlite_store().await;
    a_run_past_its_lease_is_taken_over_and_the_old_worker_cannot_settle(
        store,
        Tables::Sqlite(&dir),
    )
    .await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A run slower than the dispatch timeout fails, retries, and is dead-lettered after
/// `max_deliveries` runs. On PostgreSQL only: the conformance suite's scheduler cells
/// (`conformance.rs`, `handler_timeout::on_scheduler`) run on SQLite.
async fn a_timed_out_run_retries_then_is_dead_lettered(store: Arc<dyn Store>) {
    let job = every_day("stuck", stuck_job);
    due_now(&*store, std::slice::from_ref(&job), Duration::from_secs(1)).await;
    let cancel = CancellationToken::new();
    let worker = SchedulerWorker::builder_shared(store.clone())
        .job(job)
        .dispatch_timeout(Duration::from_millis(100))
        .store_timeout(Duration::from_secs(1))
        .lease(Duration::from_secs(2))
        .max_deliveries(3)
        .retry_delays(Duration::from_millis(10), Duration::from_millis(20))
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::ZERO)
        .build()
        .unwrap();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let letters = loop {
        let letters = store.dead_letters(10).await.unwrap();
        if !letters.is_empty() {
            break letters;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead-lettered in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    cancel.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.reason, Reason::HANDLER_TIMEOUT);
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.handler.as_deref(), Some("stuck"));
    assert_eq!(
        letter.envelope.message_type,
        hexeract::store::SCHEDULE_MESSAGE_TYPE
    );
    let payload: serde_json::Value = serde_json::from_slice(&letter.envelope.payload).unwrap();
    assert_eq!(payload["schedule"], "stuck");
    assert_eq!(
        runs_of("stuck")
            .iter()
            .map(|(_, attempt)| *attempt)
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(store.schedule_backlog().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_timed_out_run_retries_then_is_dead_lettered() {
    let (schema, store) = pg_store().await;
    a_timed_out_run_retries_then_is_dead_lettered(store).await;
    schema.drop_schema().await;
}

/// Down for ten minutes with a job every 30 s: `once` runs one catch-up, `none` runs nothing;
/// both go on at the next fire time after now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_fire_times_run_once_with_catch_up_once_and_are_skipped_with_none() {
    let (schema, store) = pg_store().await;
    // Every 10 minutes, down for two hours: twelve fire times missed (a period whose end the
    // test's second of running is unlikely to cross).
    let spec = Spec::Every(Duration::from_secs(600));
    let once = ScheduledJob::new("catch-up-once", spec.clone(), short_job);
    let none = ScheduledJob::new("catch-up-none", spec, short_job).catch_up(CatchUp::None);
    due_now(
        &*store,
        &[once.clone(), none.clone()],
        Duration::from_secs(7_200),
    )
    .await;
    let cancel = CancellationToken::new();
    let worker = SchedulerWorker::builder_shared(store.clone())
        .job(once)
        .job(none)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let running = tokio::spawn(worker.run(cancel.clone()));
    wait_until("the catch-up run", Duration::from_secs(10), || {
        runs_of("catch-up-once").len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(
        runs_of("catch-up-once").len(),
        1,
        "one run for twelve missed"
    );
    assert!(runs_of("catch-up-none").is_empty(), "skipped");
    let next: Vec<(String, DateTime<Utc>)> = sqlx::query_as(&format!(
        "SELECT name, next_fire_at FROM {}.schedules ORDER BY name",
        schema.schema
    ))
    .fetch_all(&schema.pool)
    .await
    .unwrap();
    let now = Utc::now();
    for (name, next_fire_at) in next {
        assert!(
            next_fire_at > now - chrono::Duration::seconds(1),
            "{name}: {next_fire_at}"
        );
        assert!(
            next_fire_at <= now + chrono::Duration::seconds(600),
            "{name}: {next_fire_at}"
        );
        assert_eq!(
            next_fire_at.timestamp() % 600,
            0,
            "{name}: on the epoch grid"
        );
    }
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_rejects_a_zero_lease_or_dispatch_timeout_with_every_problem_named() {
    let (dir, store) = sqlite_store().await;
    let error = SchedulerWorker::builder_shared(store.clone())
        .lease(Duration::ZERO)
        .dispatch_timeout(Duration::ZERO)
        .batch_size(0)
        .build()
        .unwrap_err()
        .to_string();
    for knob in ["lease", "dispatch_timeout", "batch_size"] {
        assert!(error.contains(knob), "{knob} missing from: {error}");
    }
    let error = SchedulerWorker::builder_shared(store)
        .job(every_day("twice", short_job))
        .job(every_day("twice", short_job))
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("\"twice\""), "{error}");
    let _ = std::fs::remove_dir_all(dir);
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, hexeract::Message)]
#[message(type = "test.Reminder")]
struct Reminder {
    n: u32,
}

/// Records when each reminder arrived.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<(u32, std::time::Instant)>>>);

impl hexeract::Handler<Reminder> for Arrivals {
    type Error = String;
    async fn handle(&self, reminder: Reminder, _ctx: &Context) -> Result<(), Self::Error> {
        self.0
            .lock()
            .unwrap()
            .push((reminder.n, std::time::Instant::now()));
        Ok(())
    }
}

/// Delayed messages from the caller's transaction and from the store reach their handler, not
/// before their time; one whose transaction rolled back never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_messages_arrive_not_before_their_time_and_a_rolled_back_one_never() {
    let (schema, store) = pg_store().await;
    let arrivals = Arrivals::default();
    let cancel = CancellationToken::new();
    let deliveries = hexeract::outbox::OutboxWorker::builder_shared(store.clone())
        .register_handler::<Reminder, _>(arrivals.clone())
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let scheduler = SchedulerWorker::builder_shared(store.clone())
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let delivering = tokio::spawn(deliveries.run(cancel.clone()));
    let scheduling = tokio::spawn(scheduler.run(cancel.clone()));

    let sent = std::time::Instant::now();
    let envelope = |n| hexeract::Envelope::new(&Reminder { n }).unwrap();
    let mut tx = schema.pool.begin().await.unwrap();
    hexeract::outbox::schedule_envelopes(
        &mut tx,
        &schema.schema,
        &[envelope(1)],
        hexeract::store::Due::After(Duration::from_millis(400)),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let mut rolled_back = schema.pool.begin().await.unwrap();
    hexeract::outbox::schedule_envelopes(
        &mut rolled_back,
        &schema.schema,
        &[envelope(2)],
        hexeract::store::Due::After(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    rolled_back.rollback().await.unwrap();
    let at = Utc::now() + chrono::Duration::milliseconds(700);
    store
        .schedule_messages(vec![envelope(3)], hexeract::store::Due::At(at))
        .await
        .unwrap();

    wait_until("both reminders", Duration::from_secs(10), || {
        arrivals.0.lock().unwrap().len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel.cancel();
    delivering.await.unwrap().unwrap();
    scheduling.await.unwrap().unwrap();
    let arrived = arrivals.0.lock().unwrap().clone();
    let order: Vec<u32> = arrived.iter().map(|(n, _)| *n).collect();
    assert_eq!(order, [1, 3], "the rolled-back reminder never came");
    assert!(
        arrived[0].1 - sent >= Duration::from_millis(400),
        "not before its time: {:?}",
        arrived[0].1 - sent
    );
    assert!(
        arrived[1].1 - sent >= Duration::from_millis(690),
        "not before its time: {:?}",
        arrived[1].1 - sent
    );
    assert_eq!(store.schedule_backlog().await.unwrap(), 0);
    schema.drop_schema().await;
}

/// Sleeps 2.5 s.
fn slow_job(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        start_run(ctx);
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        end_run(ctx);
        HandlerOutcome::Ack
    })
}

/// A fast run claimed with a slow one is acked when it ends, not when the slow one does: its
/// claim is gone while the slow run still runs (were it held until then, a worker stalled
/// past its lease in the slow run would let another take the fast one over and run it again),
/// and a second worker never runs it. Nor does the slow run hold up the next cycles (a delayed
/// message is released meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_run_holds_up_neither_the_ack_of_a_fast_one_nor_the_next_cycles() {
    let (schema, store) = pg_store().await;
    let slow = every_day("slow", slow_job);
    let fast = every_day("fast", short_job);
    due_now(
        &*store,
        &[slow.clone(), fast.clone()],
        Duration::from_secs(1),
    )
    .await;
    let cancel = CancellationToken::new();
    let worker = || {
        SchedulerWorker::builder_shared(store.clone())
            .job(slow.clone())
            .job(fast.clone())
            .dispatch_timeout(Duration::from_secs(5))
            .poll_interval(Duration::from_millis(20))
            .build()
            .unwrap()
    };
    let first = tokio::spawn(worker().run(cancel.clone()));
    wait_until("both runs", Duration::from_secs(10), || {
        !runs_of("slow").is_empty() && !runs_of("fast").is_empty()
    })
    .await;
    let second = tokio::spawn(worker().run(cancel.clone()));
    store
        .schedule_messages(
            vec![hexeract::Envelope::new(&Reminder { n: 9 }).unwrap()],
            hexeract::store::Due::After(Duration::ZERO),
        )
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while store.backlog().await.unwrap() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the delayed message was released while the slow run went on"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The fast run's claim is settled while the slow run goes on.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let held: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.occurrences WHERE schedule = 'fast' AND lease_owner IS NOT NULL",
            schema.schema
        ))
        .fetch_one(&schema.pool)
        .await
        .unwrap();
        if held == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fast run's claim is still held a second after it ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        ledger(|ledger| !ledger.running.is_empty()),
        "the slow run was still running"
    );
    // Past the slow run's end.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    cancel.cancel();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    assert_eq!(
        runs_of("fast").len(),
        1,
        "the fast run was acked before its lease ended: it ran once"
    );
    schema.drop_schema().await;
}

/// Sleeps 50 ms, long enough for runs started together to overlap.
fn napping_job(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        start_run(ctx);
        tokio::time::sleep(Duration::from_millis(50)).await;
        end_run(ctx);
        HandlerOutcome::Ack
    })
}

/// A worker that claimed a batch and died (its claims never settled): each occurrence of that
/// batch may be the one that crashed it, so each runs alone, charged the dead worker's attempt
/// only; the rest wait uncharged.
async fn the_batch_of_a_dead_worker_runs_one_occurrence_at_a_time(store: Arc<dyn Store>) {
    let jobs: Vec<ScheduledJob> = (0..5)
        .map(|n| every_day(&format!("crashed-{n}"), napping_job))
        .collect();
    due_now(&*store, &jobs, Duration::from_secs(1)).await;
    let names: Vec<String> = jobs.iter().map(|job| job.name().to_owned()).collect();
    let cancel = CancellationToken::new();
    let worker = jobs
        .iter()
        .fold(
            SchedulerWorker::builder_shared(store.clone()).poll_interval(Duration::from_millis(20)),
            |builder, job| builder.job(job.clone()),
        )
        .build()
        .unwrap();
    // The dead worker: it planned (as this one would), claimed everything, and was gone.
    let planner = worker_plan_once(&store, &names).await;
    assert_eq!(planner, 5, "five occurrences due");
    let dead = store
        .claim_occurrences(Uuid::now_v7(), &names, 10, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(dead.len(), 5);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let running = tokio::spawn(worker.run(cancel.clone()));
    wait_until("five runs", Duration::from_secs(20), || {
        ledger(|ledger| ledger.runs.len() == 5 && ledger.running.is_empty())
    })
    .await;
    cancel.cancel();
    running.await.unwrap().unwrap();
    ledger(|ledger| {
        assert_eq!(ledger.most_at_once, 1, "one at a time");
        for runs in ledger.runs.values() {
            assert_eq!(
                runs.iter().map(|(_, attempt)| *attempt).collect::<Vec<_>>(),
                [2],
                "charged the dead worker's claim, and only that"
            );
        }
    });
    assert_eq!(store.schedule_backlog().await.unwrap(), 0);
}

/// Plans the due schedules of `names` as a worker's cycle does; returns how many occurrences
/// it wrote.
async fn worker_plan_once(store: &Arc<dyn Store>, names: &[String]) -> u64 {
    let planner = |_: &str, due, _now| hexeract::store::Plan {
        fire_at: Some(due),
        next_fire_at: due + chrono::Duration::days(1),
    };
    store.plan(names, 10, &planner).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_batch_of_a_dead_worker_runs_one_occurrence_at_a_time() {
    let (schema, store) = pg_store().await;
    the_batch_of_a_dead_worker_runs_one_occurrence_at_a_time(store).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_batch_of_a_dead_worker_runs_one_occurrence_at_a_time() {
    let (dir, store) = sqlite_store().await;
    the_batch_of_a_dead_worker_runs_one_occurrence_at_a_time(store).await;
    let _ = std::fs::remove_dir_all(dir);
}
