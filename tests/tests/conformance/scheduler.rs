//! The scheduler's part of the contract: a job's run is a delivery too (the same engine, with
//! `transport="scheduler"`), so retries, dead letters, panics, timeouts, cancellation and the
//! record apply to it. Fan-out, payloads, message types and concurrency limits do not: a
//! schedule has one job, its payload is the scheduler's own, and each occurrence runs once.
//!
//! A job is a plain `fn`, so what it saw goes to a process-wide ledger keyed by job name (each
//! test's job names are its own). The one `#[scheduled]` job, [`stateful_job`], takes a
//! journal of the test's own as its state instead, and is taken from the inventory by name
//! (no scheduler of the suite uses `.from_inventory()`: it would need that state).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use hexeract::schedule::{jobs_from_inventory, ScheduledJob, SchedulerWorker, Spec};
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::{DeliveryStore, ScheduleDefinition, Store, SCHEDULE_MESSAGE_TYPE};
use hexeract::{
    scheduled, CancellationToken, Context, DeadLetter, HandlerOutcome, MissingState, Reason,
    RegistryError, State,
};
use tokio::task::JoinHandle;

use crate::support::{
    captured_log, counts, eventually, handler_field, log_lines, transport_field, unique, Journal,
    Recorded, WITHIN,
};
use crate::worlds::Equipment;

/// Job name → the attempt of each run, in order.
static RUNS: Mutex<BTreeMap<String, Vec<u32>>> = Mutex::new(BTreeMap::new());
/// Job name → runs that saw their context cancelled (given up on, not dropped).
static TOLD: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());
/// Jobs whose run went on to its end, and `<job> called` for jobs that ran once.
static FINISHED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn record(ctx: &Context) {
    RUNS.lock()
        .unwrap()
        .entry(ctx.handler_name().to_owned())
        .or_default()
        .push(ctx.attempt());
}

fn runs(job: &str) -> Vec<u32> {
    RUNS.lock().unwrap().get(job).cloned().unwrap_or_default()
}

fn finished(job: &str) -> bool {
    FINISHED.lock().unwrap().contains(job)
}

fn succeeds(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        record(ctx);
        HandlerOutcome::Ack
    })
}

fn fails_once(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        record(ctx);
        if ctx.attempt() == 1 {
            HandlerOutcome::retry("run 1 failed")
        } else {
            HandlerOutcome::Ack
        }
    })
}

fn always_fails(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        record(ctx);
        HandlerOutcome::retry(format!("run {} failed", ctx.attempt()))
    })
}

fn rejects(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        record(ctx);
        HandlerOutcome::dead_letter("my_reason", "detail")
    })
}

fn explode() -> HandlerOutcome {
    panic!("the job panicked on purpose")
}

fn panics(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        record(ctx);
        explode()
    })
}

/// Longer than the dispatch timeout; stops early when the engine gives up on it, counting
/// itself in [`TOLD`].
fn sleeps(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        record(ctx);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
            () = ctx.cancellation().cancelled() => {
                *TOLD
                    .lock()
                    .unwrap()
                    .entry(ctx.handler_name().to_owned())
                    .or_default() += 1;
            }
        }
        HandlerOutcome::Ack
    })
}

/// Its first run (attempt 1) never ends, whatever its context says (the process is to crash
/// under it); a later run acks.
fn hangs_first(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        record(ctx);
        if ctx.attempt() == 1 {
            std::future::pending::<()>().await;
        }
        HandlerOutcome::Ack
    })
}

/// Takes half a second, then counts itself finished.
fn lingers(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        record(ctx);
        tokio::time::sleep(Duration::from_millis(500)).await;
        FINISHED
            .lock()
            .unwrap()
            .insert(ctx.handler_name().to_owned());
        HandlerOutcome::Ack
    })
}

/// On its first run (in any worker), waits for the worker to stop, then fails; later runs
/// ack.
fn fails_when_stopped(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        record(ctx);
        let first = FINISHED
            .lock()
            .unwrap()
            .insert(format!("{} called", ctx.handler_name()));
        if !first {
            return HandlerOutcome::Ack;
        }
        tokio::select! {
            () = ctx.cancellation().cancelled() => {}
            () = tokio::time::sleep(WITHIN) => {}
        }
        HandlerOutcome::retry("gave up: the worker is stopping")
    })
}

/// The name of [`stateful_job`].
const STATEFUL_JOB: &str = "conformance.stateful_job";

/// Where [`stateful_job`]'s name is (line, column): scenario 17's error names it.
const STATEFUL_JOB_AT: (u32, u32) = (line!() + 6, 10);

/// A `#[scheduled]` job that takes the test's journal as its state and writes
/// `call, attempt <n>` in it; daily, so that only [`Scheduler::due_now`] makes it due during a
/// test.
#[scheduled(every = "24h", name = "conformance.stateful_job")]
async fn stateful_job(ctx: &Context, State(journal): State<Journal>) -> Result<(), String> {
    journal.write(
        ctx.handler_name(),
        format!("call, attempt {}", ctx.attempt()),
    );
    Ok(())
}

/// [`stateful_job`], from the program's `#[scheduled]` jobs.
fn stateful_job_from_inventory() -> ScheduledJob {
    jobs_from_inventory()
        .expect("the program's jobs")
        .into_iter()
        .find(|job| job.name() == STATEFUL_JOB)
        .expect("`stateful_job` is in the inventory")
}

type JobFn = for<'a> fn(&'a Context) -> BoxFuture<'a, HandlerOutcome>;

/// A daily job named `role` and a unique suffix: its own next fire time does not come during
/// a test; [`Scheduler::due_now`] makes one due.
fn job(role: &str, run: JobFn) -> ScheduledJob {
    ScheduledJob::new(
        unique(&format!("job.{role}")),
        Spec::Every(Duration::from_secs(86_400)),
        run,
    )
}

/// A scheduler on an in-memory SQLite store of the test's own, with the suite's knobs: 3 runs,
/// retries after 20 to 80 ms (unless set otherwise), a lease of 15 s.
struct Scheduler {
    store: Arc<dyn Store>,
    /// First and longest retry delay.
    retry_delays: (Duration, Duration),
    /// The lease when a scenario needs a claim to end (default: 15 s, which none does).
    lease: Option<Duration>,
    running: Option<(CancellationToken, JoinHandle<Result<(), hexeract::Error>>)>,
}

impl Scheduler {
    async fn create() -> Scheduler {
        let store = SqliteStore::in_memory()
            .await
            .expect("an in-memory SQLite store");
        store.migrate().await.expect("migrate");
        Scheduler {
            store: Arc::new(store),
            retry_delays: (Duration::from_millis(20), Duration::from_millis(80)),
            lease: None,
            running: None,
        }
    }

    /// Writes the schedules of `jobs` (those not known yet) with a fire time a second ago.
    async fn due_now(&self, jobs: &[ScheduledJob]) {
        let definitions: Vec<ScheduleDefinition> = jobs
            .iter()
            .map(|job| ScheduleDefinition {
                name: job.name().to_owned(),
                // The worker's own text: its sync then leaves the schedule as written here.
                spec: job.spec().stored_text(),
            })
            .collect();
        let first = |_: &str, now: DateTime<Utc>| now - chrono::Duration::seconds(1);
        self.store
            .sync_schedules(&definitions, &first)
            .await
            .expect("schedules written");
    }

    /// Starts a worker running `jobs`, each run under `dispatch_timeout`.
    fn start(&mut self, jobs: &[ScheduledJob], dispatch_timeout: Duration) {
        self.try_start(jobs, dispatch_timeout, &Equipment::default())
            .expect("the scheduler builds");
    }

    /// The same, with `equipment` given to the builder; returns what `build()` returned when it
    /// fails (then no worker runs).
    fn try_start(
        &mut self,
        jobs: &[ScheduledJob],
        dispatch_timeout: Duration,
        equipment: &Equipment,
    ) -> Result<(), hexeract::Error> {
        let builder = jobs.iter().fold(
            SchedulerWorker::builder_shared(self.store.clone())
                .max_deliveries(3)
                .retry_delays(self.retry_delays.0, self.retry_delays.1)
                .dispatch_timeout(dispatch_timeout)
                // Long enough that no claim ends in a scenario; at least the run's timeout
                // and 5 s to settle, which the builder requires.
                .lease(self.lease.unwrap_or_else(|| {
                    Duration::from_secs(15).max(dispatch_timeout + Duration::from_secs(5))
                }))
                .poll_interval(Duration::from_millis(20)),
            |builder, job| builder.job(job.clone()),
        );
        let worker = equipment.give(builder).build()?;
        let cancel = CancellationToken::new();
        let run = worker.run(cancel.clone());
        let task = tokio::spawn(async move { Ok(run.await?) });
        self.running = Some((cancel, task));
        Ok(())
    }

    /// Drops the worker's `run` where it stands, as when its process dies: no cancellation,
    /// no grace, no settle; its claims stay in the store until their lease ends.
    async fn crash(&mut self) {
        let (_, task) = self.running.take().expect("started");
        task.abort();
        let dropped = tokio::time::timeout(WITHIN, task).await;
        assert!(
            matches!(dropped, Ok(Err(ref join)) if join.is_cancelled()),
            "the run was dropped where it stood: {dropped:?}"
        );
    }

    async fn stop(&mut self) -> Result<(), String> {
        let (cancel, task) = self.running.take().expect("started");
        cancel.cancel();
        match tokio::time::timeout(WITHIN, task).await {
            Err(_) => Err(format!(
                "run did not return within {WITHIN:?} of its cancel"
            )),
            Ok(Err(join)) => Err(format!("run panicked: {join}")),
            Ok(Ok(returned)) => returned.map_err(|error| error.to_string()),
        }
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.store
            .dead_letters(100)
            .await
            .expect("dead letters are readable")
    }

    /// Occurrences not settled yet.
    async fn backlog(&self) -> u64 {
        self.store
            .schedule_backlog()
            .await
            .expect("the backlog is readable")
    }

    /// Waits until `done` holds of the dead letters (and the ledger); returns them.
    async fn until(&self, what: &str, done: impl Fn(&[DeadLetter]) -> bool) -> Vec<DeadLetter> {
        let deadline = tokio::time::Instant::now() + WITHIN;
        loop {
            let letters = self.dead_letters().await;
            if done(&letters) {
                return letters;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "on scheduler: not within {WITHIN:?}: {what} (dead letters: {letters:?})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every occurrence is settled.
    async fn settled(&self) {
        let deadline = tokio::time::Instant::now() + WITHIN;
        while self.backlog().await > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "on scheduler: occurrences still owed after {WITHIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The dispatch timeout of every scenario but the timeout's.
const DISPATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `job` alone (each run under `dispatch_timeout`) until `done` holds; returns the dead
/// letters, every occurrence settled and the worker stopped.
async fn run_alone(
    job: &ScheduledJob,
    dispatch_timeout: Duration,
    what: &str,
    done: impl Fn(&[DeadLetter]) -> bool,
) -> Vec<DeadLetter> {
    let mut scheduler = Scheduler::create().await;
    scheduler.due_now(std::slice::from_ref(job)).await;
    scheduler.start(std::slice::from_ref(job), dispatch_timeout);
    let letters = scheduler.until(what, done).await;
    scheduler.settled().await;
    scheduler
        .stop()
        .await
        .expect("run returns Ok(()) on cancel");
    letters
}

/// The retry half of scenario 1 (a schedule has one job: no fan-out): a run that fails once
/// runs again, at attempt 2, and nothing is dead-lettered.
pub(crate) async fn a_failure_is_retried() {
    let job = job("fails_once", fails_once);
    let name = job.name().to_owned();
    let letters = run_alone(&job, DISPATCH_TIMEOUT, "the second run", |_| {
        runs(&name).len() == 2
    })
    .await;
    assert_eq!(runs(&name), [1, 2], "failed once, then acked on attempt 2");
    assert!(letters.is_empty(), "nothing dead-lettered: {letters:?}");
}

/// Scenario 2: a job that always fails runs 3 times, then is dead-lettered.
pub(crate) async fn max_deliveries_exceeded() {
    let job = job("always_fails", always_fails);
    let name = job.name().to_owned();
    let letters = run_alone(&job, DISPATCH_TIMEOUT, "a dead letter", |letters| {
        !letters.is_empty()
    })
    .await;
    assert_eq!(runs(&name), [1, 2, 3]);
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.handler.as_deref(), Some(name.as_str()));
    assert_eq!(letter.detail, "run 3 failed", "the last run's failure");
}

/// Scenario 3: `HandlerOutcome::dead_letter` from a job: one run, dead-lettered at once.
pub(crate) async fn dead_letter_outcome() {
    let job = job("rejects", rejects);
    let name = job.name().to_owned();
    let letters = run_alone(&job, DISPATCH_TIMEOUT, "a dead letter", |letters| {
        !letters.is_empty()
    })
    .await;
    assert_eq!(runs(&name), [1], "one run");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason.as_str(), "my_reason");
    assert_eq!(letter.detail, "detail");
    assert_eq!(letter.attempts, 1);
    assert_eq!(letter.handler.as_deref(), Some(name.as_str()));
}

/// Scenario 4: a job that panics is retried, then dead-lettered as `handler_panicked`.
pub(crate) async fn handler_panicked() {
    let job = job("panics", panics);
    let name = job.name().to_owned();
    let letters = run_alone(&job, DISPATCH_TIMEOUT, "a dead letter", |letters| {
        !letters.is_empty()
    })
    .await;
    assert_eq!(runs(&name), [1, 2, 3], "each panic was a failed run");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason, Reason::HANDLER_PANICKED);
    assert_eq!(letter.attempts, 3);
    assert!(
        letter.detail.contains("the job panicked on purpose"),
        "{}",
        letter.detail
    );
}

/// Scenario 5: a job slower than the 200 ms dispatch timeout is retried, then dead-lettered
/// as `handler_timeout`, with the scheduler's own message (its type, the schedule's name).
pub(crate) async fn handler_timeout() {
    let job = job("sleeps", sleeps);
    let name = job.name().to_owned();
    let letters = run_alone(
        &job,
        Duration::from_millis(200),
        "a dead letter",
        |letters| !letters.is_empty(),
    )
    .await;
    assert_eq!(runs(&name), [1, 2, 3], "each timeout was a failed run");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason, Reason::HANDLER_TIMEOUT);
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.handler.as_deref(), Some(name.as_str()));
    // The scheduler's own message: its type, and a payload naming the schedule.
    assert_eq!(letter.envelope.message_type, SCHEDULE_MESSAGE_TYPE);
    let payload: serde_json::Value =
        serde_json::from_slice(&letter.envelope.payload).expect("the payload is JSON");
    assert_eq!(payload["schedule"], name.as_str());
    eventually("the three runs told that they were given up on", || {
        TOLD.lock().unwrap().get(&name).copied() == Some(3)
    })
    .await;
}

/// Scenario 10: cancel while a run is in flight: the run finishes, its occurrence is settled
/// (the next start does not run it again), `run` returns `Ok(())`.
pub(crate) async fn cancel_with_a_call_in_flight() {
    let slow = job("lingers", lingers);
    let name = slow.name().to_owned();
    let mut scheduler = Scheduler::create().await;
    scheduler.due_now(std::slice::from_ref(&slow)).await;
    scheduler.start(std::slice::from_ref(&slow), DISPATCH_TIMEOUT);
    scheduler
        .until("the run started", |_| runs(&name).len() == 1)
        .await;
    let stopped = scheduler.stop().await;
    assert_eq!(stopped, Ok(()), "run returns Ok(()) on cancel");
    assert!(finished(&name), "the run in flight went on to its end");
    assert_eq!(scheduler.backlog().await, 0, "its occurrence was settled");

    // The next start, with a job due now as a marker: once it ran, the first occurrence
    // would have run again too, had it been left owed.
    let marker = job("marker", succeeds);
    let marker_name = marker.name().to_owned();
    scheduler.due_now(std::slice::from_ref(&marker)).await;
    scheduler.start(&[slow, marker], DISPATCH_TIMEOUT);
    scheduler
        .until("the marker ran", |_| runs(&marker_name).len() == 1)
        .await;
    scheduler.settled().await;
    scheduler
        .stop()
        .await
        .expect("run returns Ok(()) on cancel");
    assert_eq!(runs(&name), [1], "the settled occurrence did not run again");
    assert!(scheduler.dead_letters().await.is_empty());
}

/// Scenario 11: the record of each outcome of a run: the same log lines and counters as a
/// handler's, with `transport="scheduler"`.
pub(crate) async fn record_of_each_outcome() {
    captured_log();
    let (ok, flaky, reject) = (
        job("ok", succeeds),
        job("flaky", fails_once),
        job("reject", rejects),
    );
    let names: Vec<String> = [&ok, &flaky, &reject]
        .iter()
        .map(|job| job.name().to_owned())
        .collect();
    let (ok_name, flaky_name, reject_name) = (&names[0], &names[1], &names[2]);
    let transport = transport_field("scheduler");
    let dead_lettered = || {
        log_lines(&[
            "message dead-lettered",
            &handler_field(reject_name),
            &transport,
        ])
    };
    let retried = || {
        log_lines(&[
            "handler failed; will retry",
            &handler_field(flaky_name),
            &transport,
        ])
    };
    let handled = |name: &str| log_lines(&["message handled", &handler_field(name), &transport]);
    let mut scheduler = Scheduler::create().await;
    let jobs = [ok, flaky, reject];
    scheduler.due_now(&jobs).await;
    scheduler.start(&jobs, DISPATCH_TIMEOUT);
    scheduler
        .until("every outcome logged", |letters| {
            letters.len() == 1
                && !dead_lettered().is_empty()
                && !retried().is_empty()
                && !handled(ok_name).is_empty()
                && !handled(flaky_name).is_empty()
        })
        .await;
    scheduler.settled().await;
    scheduler
        .stop()
        .await
        .expect("run returns Ok(()) on cancel");

    let dead = dead_lettered();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    for field in [
        "ERROR",
        "reason=my_reason",
        "detail=\"detail\"",
        "attempts=1",
    ] {
        assert!(dead[0].contains(field), "{field} missing from: {}", dead[0]);
    }
    let retry = retried();
    assert_eq!(retry.len(), 1, "{retry:#?}");
    for field in ["WARN", "attempt=1", "retry_in=", "detail=\"run 1 failed\""] {
        assert!(
            retry[0].contains(field),
            "{field} missing from: {}",
            retry[0]
        );
    }
    assert_eq!(
        counts(ok_name),
        (1, 0, 0),
        "{ok_name}: handled, retried, dead-lettered"
    );
    assert_eq!(
        counts(flaky_name),
        (1, 1, 0),
        "{flaky_name}: handled, retried, dead-lettered"
    );
    assert_eq!(
        counts(reject_name),
        (0, 0, 1),
        "{reject_name}: handled, retried, dead-lettered"
    );
}

/// Scenario 12: a run that fails because the scheduler is stopping costs no attempt: its
/// occurrence goes back uncharged and the next start runs it at attempt 1 again.
pub(crate) async fn failure_while_stopping_is_released_uncharged() {
    captured_log();
    let job = job("fails_when_stopped", fails_when_stopped);
    let name = job.name().to_owned();
    let mut scheduler = Scheduler::create().await;
    scheduler.due_now(std::slice::from_ref(&job)).await;
    scheduler.start(std::slice::from_ref(&job), DISPATCH_TIMEOUT);
    scheduler
        .until("the run started", |_| runs(&name).len() == 1)
        .await;
    assert_eq!(
        scheduler.stop().await,
        Ok(()),
        "run returns Ok(()) on cancel"
    );
    scheduler.start(std::slice::from_ref(&job), DISPATCH_TIMEOUT);
    scheduler
        .until("the run after the restart", |_| counts(&name).0 == 1)
        .await;
    scheduler.settled().await;
    scheduler
        .stop()
        .await
        .expect("run returns Ok(()) on cancel");
    assert_eq!(
        runs(&name),
        [1, 1],
        "run again at attempt 1: the failure at shutdown cost no attempt"
    );
    assert!(scheduler.dead_letters().await.is_empty());
    assert_eq!(counts(&name), (1, 0, 0), "not counted as a retry");
    let given_back = log_lines(&[
        "message given back uncharged",
        &handler_field(&name),
        &transport_field("scheduler"),
    ]);
    assert_eq!(given_back.len(), 1, "{given_back:#?}");
}

/// Scenario 13: stopped while a retry waits and started again, the scheduler goes on at
/// attempt 2: the occurrence is dead-lettered after 3 runs in all.
pub(crate) async fn attempt_count_survives_a_restart() {
    let job = job("fails_across_restart", always_fails);
    let name = job.name().to_owned();
    let mut scheduler = Scheduler::create().await;
    scheduler.retry_delays = (Duration::from_secs(1), Duration::from_secs(1));
    scheduler.due_now(std::slice::from_ref(&job)).await;
    scheduler.start(std::slice::from_ref(&job), DISPATCH_TIMEOUT);
    // Stopped once the first run's failure is a retry on record, not as soon as the run has
    // begun: a failure the stop overtakes is released uncharged (scenario 12).
    scheduler
        .until("the first run's failure recorded as a retry", |_| {
            counts(&name).1 == 1
        })
        .await;
    assert_eq!(
        scheduler.stop().await,
        Ok(()),
        "run returns Ok(()) on cancel"
    );
    assert_eq!(runs(&name), [1], "stopped while the retry waits");
    scheduler.start(std::slice::from_ref(&job), DISPATCH_TIMEOUT);
    let letters = scheduler
        .until("a dead letter", |letters| !letters.is_empty())
        .await;
    scheduler.settled().await;
    scheduler
        .stop()
        .await
        .expect("run returns Ok(()) on cancel");
    assert_eq!(
        runs(&name),
        [1, 2, 3],
        "the count went on across the restart"
    );
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert_eq!(letters[0].attempts, 3);
}

/// Scenario 19 on the scheduler: the process dies during a run. The run was an attempt (the
/// claim counted it): once the claim's lease ends, the next scheduler runs the occurrence as
/// attempt 2, which acks, so a run that kills its process every time ends as a dead letter
/// after `max_deliveries` runs instead of looping.
pub(crate) async fn a_crash_during_a_run_counts_as_an_attempt() {
    let job = job("crashes_under", hangs_first);
    let name = job.name().to_owned();
    let mut scheduler = Scheduler::create().await;
    // The shortest lease a 1 s run allows (the run's timeout and 5 s to settle): the crash
    // comes well inside the run's timeout, and the lease is what hands the occurrence on.
    let dispatch_timeout = Duration::from_secs(1);
    scheduler.lease = Some(dispatch_timeout + Duration::from_secs(5));
    scheduler.due_now(std::slice::from_ref(&job)).await;
    scheduler.start(std::slice::from_ref(&job), dispatch_timeout);
    eventually("the first run began", || runs(&name) == [1]).await;
    scheduler.crash().await;

    scheduler.start(std::slice::from_ref(&job), dispatch_timeout);
    eventually("a second run after the crash", || runs(&name).len() == 2).await;
    scheduler.settled().await;
    let letters = scheduler.dead_letters().await;
    scheduler
        .stop()
        .await
        .expect("run returns Ok(()) on cancel");
    assert_eq!(
        runs(&name),
        [1, 2],
        "the run the crash cut off counted: the next one is attempt 2"
    );
    assert!(letters.is_empty(), "acked on its second run: {letters:?}");
}

/// Scenario 16: a `#[scheduled]` job that takes state (`State<Journal>`), given it with
/// `SchedulerBuilder::state`, runs with that value (it writes `call` in the test's journal);
/// the scheduler's middleware (`.middleware`) and the job's own (`.middleware_for`, inside it)
/// run around the run and see its outcome.
pub(crate) async fn stateful_job_with_middleware() {
    let journal = Journal::default();
    let job = stateful_job_from_inventory();
    let equipment = Equipment::default()
        .state(journal.clone())
        .middleware(Recorded::new("outer", &journal))
        .middleware_for(STATEFUL_JOB, Recorded::new("by_name", &journal));
    let mut scheduler = Scheduler::create().await;
    scheduler.due_now(std::slice::from_ref(&job)).await;
    scheduler
        .try_start(std::slice::from_ref(&job), DISPATCH_TIMEOUT, &equipment)
        .expect("the scheduler builds with the job's state");
    let letters = scheduler
        .until("the run and its middleware done", |_| {
            journal.of(STATEFUL_JOB).len() == 5
        })
        .await;
    scheduler.settled().await;
    scheduler
        .stop()
        .await
        .expect("run returns Ok(()) on cancel");
    assert_eq!(
        journal.of(STATEFUL_JOB),
        [
            "enter outer",
            "enter by_name",
            "call, attempt 1",
            "exit by_name: ack",
            "exit outer: ack"
        ],
        "one run, with the journal given as its state, inside the scheduler's middleware, \
         inside the job's own"
    );
    assert!(letters.is_empty(), "{letters:?}");
}

/// Scenario 17 on the scheduler: a scheduler whose `#[scheduled]` job takes state it was not
/// given does not build, with an error naming the job, where it is and the type; nothing ran:
/// the occurrence due before is run by the next scheduler, given the state, at attempt 1.
pub(crate) async fn missing_state_stops_the_build() {
    let journal = Journal::default();
    let job = stateful_job_from_inventory();
    let mut scheduler = Scheduler::create().await;
    scheduler.due_now(std::slice::from_ref(&job)).await;
    let error = scheduler
        .try_start(
            std::slice::from_ref(&job),
            DISPATCH_TIMEOUT,
            &Equipment::default(),
        )
        .expect_err("a scheduler without the job's state does not build");
    let (line, column) = STATEFUL_JOB_AT;
    let location = format!("tests/tests/conformance/scheduler.rs:{line}:{column}");
    assert_eq!(
        error.to_string(),
        format!(
            "handlers take state that was not given to the worker; give each value with \
             `.state(value)` on `hexeract::App` (or on the worker's builder) before it runs:\n  \
             `conformance.stateful_job` ({location}) takes `State<Journal>`"
        )
    );
    let hexeract::Error::Registry(RegistryError::MissingState(missing)) = &error else {
        panic!("not a missing state: {error:?}");
    };
    assert_eq!(
        missing,
        &[MissingState {
            handler: STATEFUL_JOB.to_owned(),
            location,
            type_name: "State<Journal>",
        }]
    );

    // Given the state, the next scheduler runs the occurrence the failed one left.
    let equipment = Equipment::default()
        .state(journal.clone())
        .middleware(Recorded::new("outer", &journal));
    scheduler
        .try_start(std::slice::from_ref(&job), DISPATCH_TIMEOUT, &equipment)
        .expect("the scheduler builds with the job's state");
    let letters = scheduler
        .until("the run done", |_| journal.of(STATEFUL_JOB).len() == 3)
        .await;
    scheduler.settled().await;
    scheduler
        .stop()
        .await
        .expect("run returns Ok(()) on cancel");
    assert_eq!(
        journal.of(STATEFUL_JOB),
        ["enter outer", "call, attempt 1", "exit outer: ack"],
        "one run, at attempt 1, by the scheduler given the state: the failed build ran nothing"
    );
    assert!(letters.is_empty(), "{letters:?}");
}
