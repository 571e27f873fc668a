//! Crash safety of the outbox worker on a real PostgreSQL: a worker process killed with SIGKILL
//! in the middle of its batches, a message that aborts the process every time it is handled,
//! and a worker cancelled at random moments.
//!
//! The worker processes are `outbox_child` (`tests/src/bin/outbox_child.rs`). Their handlers
//! record every call (message id, handler, attempt, pid) in a `ledger` table of the test's
//! schema, each in a short transaction of its own, so a call's effect survives the process.
//!
//! Needs PostgreSQL at `TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! Each test works in a schema of its own, dropped at the end, kills only the processes it
//! started and names its connections, so these tests run beside any others. The random moments
//! come from a seed that each test prints; `CRASH_TEST_SEED=<n>` replays one.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hexeract::outbox::{OutboxWorker, OutboxWorkerBuilder};
use hexeract::store::postgres::PgStore;
use hexeract::store::{DeadLetterStore, RelayStore};
use hexeract::store::{DeliveryStore, RelaySink, Unpublishable};
use hexeract::{
    CancellationToken, Context, DeadLetter, Envelope, Handler, HandlerOptions, Message, Reason,
    Registry,
};
use hexeract_tests::ledger;
use hexeract_tests::pg::{connect, connect_through, database_addr, database_url, TestSchema};
use hexeract_tests::proxy::FaultProxy;
use sqlx::PgPool;
use uuid::Uuid;

/// The handlers `outbox_child` registers for `crash.Job`.
const HANDLERS: [&str; 2] = ["first", "second"];

/// SIGABRT, what `std::process::abort` ends a process with.
const SIGABRT: i32 = 6;

/// The crash tests' message, as `outbox_child` knows it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "crash.Job")]
struct Job {
    n: u32,
    /// `outbox_child`'s `first` handler aborts the process on this job.
    abort: bool,
}

/// A pool on the test database and a fresh schema, migrated, with a `ledger` table; the
/// schema is dropped by `drop_schema`.
struct TestDb {
    db: TestSchema,
}

impl std::ops::Deref for TestDb {
    type Target = TestSchema;

    fn deref(&self) -> &TestSchema {
        &self.db
    }
}

impl TestDb {
    async fn new() -> TestDb {
        let db = TestSchema::on(connect("hexeract-tests-crash", 4).await);
        db.migrated_store().await;
        ledger::create(&db.pool, &db.schema).await;
        TestDb { db }
    }

    /// Outbox rows plus deliveries: what is still owed to a handler.
    async fn backlog(&self) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT (SELECT count(*) FROM \"{s}\".outbox) + (SELECT count(*) FROM \"{s}\".deliveries)",
            s = self.schema
        ))
        .fetch_one(&self.pool)
        .await
        .expect("count the backlog")
    }

    /// Every recorded call, in the order recorded.
    async fn ledger(&self) -> Vec<LedgerRow> {
        let rows: Vec<(Uuid, String, i32)> = sqlx::query_as(&format!(
            "SELECT message_id, handler, attempt FROM \"{}\".ledger ORDER BY id",
            self.schema
        ))
        .fetch_all(&self.pool)
        .await
        .expect("read the ledger");
        rows.into_iter()
            .map(|(message_id, handler, attempt)| LedgerRow {
                message_id,
                handler,
                attempt,
            })
            .collect()
    }

    /// Writes one job per `n` in `0..events` to the outbox; `abort` marks the job at that
    /// index. Returns the message ids in order.
    async fn publish_jobs(&self, events: u32, abort: Option<u32>) -> Vec<Uuid> {
        let store = self.store();
        let mut ids = Vec::with_capacity(events as usize);
        let all: Vec<u32> = (0..events).collect();
        for chunk in all.chunks(500) {
            let batch: Vec<Envelope> = chunk
                .iter()
                .map(|&n| {
                    Envelope::new(&Job {
                        n,
                        abort: abort == Some(n),
                    })
                    .expect("encode")
                })
                .collect();
            ids.extend(batch.iter().map(|envelope| envelope.id));
            store.publish(batch).await.expect("publish");
        }
        ids
    }

    /// Waits until nothing is owed (outbox and deliveries), failing after `limit`.
    async fn drain_within(&self, limit: Duration) {
        let started = Instant::now();
        while self.backlog().await > 0 {
            assert!(
                started.elapsed() < limit,
                "the outbox did not drain within {limit:?} ({} rows owed)",
                self.backlog().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every (id, handler) pair's terminal state, from the ledger and the dead letters.
    async fn verdict(&self, ids: &[Uuid]) -> ledger::Verdict {
        let calls = ledger::calls(&self.pool, &self.schema).await;
        let dead = ledger::dead_letters(&self.pool, &self.schema).await;
        ledger::classify(ids, &HANDLERS, &calls, &dead)
    }

    /// The database's clock.
    async fn clock(&self) -> chrono::DateTime<chrono::Utc> {
        sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&self.pool)
            .await
            .expect("read the clock")
    }

    /// How long after `since` (the database's clock) process `pid` recorded its first call;
    /// waits for that call for up to 30 s.
    async fn first_call_by(&self, pid: u32, since: chrono::DateTime<chrono::Utc>) -> Duration {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let first: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(&format!(
                "SELECT min(at) FROM {} WHERE pid = $1",
                ledger::table(&self.schema)
            ))
            .bind(i32::try_from(pid).expect("a pid fits an i32"))
            .fetch_one(&self.pool)
            .await
            .expect("read the ledger");
            if let Some(first) = first {
                return (first - since).to_std().unwrap_or_default();
            }
            assert!(
                Instant::now() < deadline,
                "process {pid} made no call within 30 s of its start"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn drop_schema(self) {
        self.db.drop_schema().await;
    }
}

/// One handler call as the ledger recorded it.
#[derive(Debug, Clone)]
struct LedgerRow {
    message_id: Uuid,
    handler: String,
    attempt: i32,
}

/// Calls per (message, handler) pair, from the ledger.
fn calls_per_pair(ledger: &[LedgerRow]) -> HashMap<(Uuid, &str), Vec<i32>> {
    let mut pairs: HashMap<(Uuid, &str), Vec<i32>> = HashMap::new();
    for row in ledger {
        pairs
            .entry((row.message_id, row.handler.as_str()))
            .or_default()
            .push(row.attempt);
    }
    pairs
}

/// The pairs of `ids` × `HANDLERS` (less `except`) that the ledger never recorded.
fn lost_pairs(
    ids: &[Uuid],
    pairs: &HashMap<(Uuid, &str), Vec<i32>>,
    except: Option<(Uuid, &str)>,
) -> Vec<(Uuid, &'static str)> {
    ids.iter()
        .flat_map(|&id| HANDLERS.iter().map(move |&handler| (id, handler)))
        .filter(|&pair| Some(pair) != except && !pairs.contains_key(&pair))
        .collect()
}

/// A small, seeded source of random delays (xorshift64*), so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn seeded(test: &str) -> Rng {
        let seed = match std::env::var("CRASH_TEST_SEED") {
            Ok(seed) => seed.parse().expect("CRASH_TEST_SEED is a whole number"),
            Err(_) => {
                let mut hasher = RandomState::new().build_hasher();
                hasher.write_u128(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_nanos(),
                );
                hasher.finish()
            }
        };
        println!("{test}: seed={seed} (CRASH_TEST_SEED={seed} replays it)");
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A whole number of milliseconds in `low..=high`.
    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.next() % (high - low + 1))
    }
}

/// An `outbox_child` process this test started. Dropping it kills it (it is ours), so a
/// failing test leaves no worker behind.
struct ChildWorker {
    child: Child,
}

impl ChildWorker {
    /// Starts a child on `db`'s schema and waits until its worker is built.
    async fn start(
        db: &TestDb,
        batch_size: u32,
        max_deliveries: u32,
        delay_ms: u32,
    ) -> ChildWorker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_outbox_child"))
            .args([
                db.schema.clone(),
                batch_size.to_string(),
                max_deliveries.to_string(),
                delay_ms.to_string(),
            ])
            .env("OUTBOX_CHILD_DATABASE_URL", database_url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start outbox_child");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut worker = ChildWorker { child };
        let ready = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        });
        match tokio::time::timeout(Duration::from_secs(30), ready).await {
            Ok(Ok(Ok(line))) if line.trim() == "ready" => worker,
            other => panic!(
                "outbox_child did not start ({other:?}, status {:?}); is PostgreSQL reachable \
                 at TEST_DATABASE_URL?",
                worker.child.try_wait()
            ),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the child ended, if it did.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("poll the child")
    }

    /// SIGKILL, which the child cannot catch, then reaps it. Fails if the child had already
    /// ended on its own.
    fn kill(mut self) {
        if let Some(status) = self.exited() {
            panic!("outbox_child ended before the test killed it: {status}");
        }
        self.child.kill().expect("SIGKILL our own child");
        self.child.wait().expect("reap the child");
    }

    /// Closes the child's standard input, which cancels its worker, and waits for it to end.
    async fn stop(mut self) -> ExitStatus {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "outbox_child did not stop within 30 s of its input closing"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until `db` owes nothing, failing if `child` ends meanwhile or after `limit`.
async fn drain_with(db: &TestDb, child: &mut ChildWorker, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if db.backlog().await == 0 {
            return;
        }
        if let Some(status) = child.exited() {
            panic!("outbox_child ended before the outbox drained: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "the outbox did not drain within {limit:?} ({} rows owed)",
            db.backlog().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// --- 1. SIGKILL in the middle of batches ---

/// Scenario (a) of the chaos suite: 10 000 events, the worker process SIGKILLed at 5 random
/// moments while it works through them, a fresh process started after each kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_batch_loses_nothing_and_repeats_only_what_was_in_flight() {
    const EVENTS: u32 = 10_000;
    const BATCH: u32 = 50;
    const KILLS: usize = 5;
    // Each call sleeps this long, so that a batch is in flight most of the time.
    const DELAY_MS: u32 = 5;

    let db = TestDb::new().await;
    let ids = db.publish_jobs(EVENTS, None).await;
    let mut rng = Rng::seeded("kill");

    let mut recoveries = Vec::new();
    let mut child = ChildWorker::start(&db, BATCH, 5, DELAY_MS).await;
    for kill in 1..=KILLS {
        let pid = child.pid();
        let after = rng.millis(200, 1200);
        tokio::time::sleep(after).await;
        child.kill();
        let killed_at = db.clock().await;
        println!(
            "kill {kill}: SIGKILL to pid {pid} after {after:?}; calls so far {}, owed {}",
            db.count("ledger").await,
            db.backlog().await
        );
        assert!(
            db.backlog().await > 0,
            "kill {kill} came after the outbox drained: the scenario needs more events"
        );
        child = ChildWorker::start(&db, BATCH, 5, DELAY_MS).await;
        recoveries.push(db.first_call_by(child.pid(), killed_at).await);
    }
    drain_with(&db, &mut child, Duration::from_secs(120)).await;
    let status = child.stop().await;
    assert!(status.success(), "the last child stops cleanly: {status}");

    let verdict = db.verdict(&ids).await;
    let recovery_ms: Vec<u128> = recoveries.iter().map(Duration::as_millis).collect();
    println!(
        "outbox_sigkill: kills={KILLS} recovery_ms={recovery_ms:?} (SIGKILL to the next \
         process's first call, lease 1 s; includes the process start)"
    );
    verdict.assert_pass("outbox_sigkill");
    assert_eq!(verdict.dead_lettered_total(), 0, "nothing dead-lettered");
    let bound = KILLS * BATCH as usize * HANDLERS.len();
    assert!(
        verdict.duplicates <= bound,
        "{} repeated calls after {KILLS} kills: more than a batch ({BATCH}) × handlers ({}) \
         per kill = {bound}",
        verdict.duplicates,
        HANDLERS.len()
    );
    db.drop_schema().await;
}

// --- 2. A message that crashes the process every time ---

/// What a crash loop left behind.
struct CrashLoop {
    db: TestDb,
    ids: Vec<Uuid>,
    poison: Uuid,
    starts: u32,
    aborts: u32,
    ledger: Vec<LedgerRow>,
    dead: Vec<DeadLetter>,
}

impl CrashLoop {
    const EVENTS: u32 = 200;
    const POISON: u32 = 100;
    const MAX_DELIVERIES: u32 = 3;
    const MAX_STARTS: u32 = 20;

    /// Publishes `EVENTS` jobs, the one at `POISON` aborting `first`, and starts `outbox_child`
    /// (claiming `batch` deliveries at a time) again each time it dies, until nothing is owed.
    async fn run(batch: u32) -> CrashLoop {
        let db = TestDb::new().await;
        let ids = db.publish_jobs(Self::EVENTS, Some(Self::POISON)).await;
        let poison = ids[Self::POISON as usize];

        let deadline = Instant::now() + Duration::from_secs(50);
        let mut starts = 0;
        let mut aborts = 0;
        'restart: loop {
            assert!(
                starts < Self::MAX_STARTS,
                "still not drained after {starts} starts of the worker ({aborts} aborts)"
            );
            let mut child = ChildWorker::start(&db, batch, Self::MAX_DELIVERIES, 1).await;
            starts += 1;
            loop {
                if let Some(status) = child.exited() {
                    assert_eq!(
                        status.signal(),
                        Some(SIGABRT),
                        "the child may only die by the poison message's abort: {status}"
                    );
                    aborts += 1;
                    continue 'restart;
                }
                if db.backlog().await == 0 {
                    let status = child.stop().await;
                    assert!(status.success(), "the last child stops cleanly: {status}");
                    break 'restart;
                }
                assert!(
                    Instant::now() < deadline,
                    "the outbox did not drain within 50 s ({starts} starts, {aborts} aborts, {} \
                     rows owed)",
                    db.backlog().await
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let ledger = db.ledger().await;
        let dead = db
            .store()
            .dead_letters(1_000)
            .await
            .expect("list dead letters");
        CrashLoop {
            db,
            ids,
            poison,
            starts,
            aborts,
            ledger,
            dead,
        }
    }

    /// The calls of the poison message's aborting handler, by attempt.
    fn poison_calls(&self) -> Vec<i32> {
        calls_per_pair(&self.ledger)
            .remove(&(self.poison, "first"))
            .unwrap_or_default()
    }

    /// Dead letters other than the poison message's aborting handler, as `(n, handler, calls)`.
    fn collateral(&self) -> Vec<(String, Option<String>, Vec<i32>)> {
        let pairs = calls_per_pair(&self.ledger);
        self.dead
            .iter()
            .filter(|d| !(d.envelope.id == self.poison && d.handler.as_deref() == Some("first")))
            .map(|d| {
                let calls = d
                    .handler
                    .as_deref()
                    .and_then(|handler| pairs.get(&(d.envelope.id, handler)))
                    .cloned()
                    .unwrap_or_default();
                (
                    String::from_utf8_lossy(&d.envelope.payload).into_owned(),
                    d.handler.clone(),
                    calls,
                )
            })
            .collect()
    }

    fn report(&self, test: &str) {
        let pairs = calls_per_pair(&self.ledger);
        println!(
            "{test}: starts={} restarts={} aborts={} poison_calls={:?} calls={} duplicates={} \
             dead_letters={} dead_letter_attempts={:?}",
            self.starts,
            self.starts - 1,
            self.aborts,
            self.poison_calls(),
            self.ledger.len(),
            self.ledger.len() - pairs.len(),
            self.dead.len(),
            self.dead.iter().map(|d| d.attempts).collect::<Vec<_>>(),
        );
        for (payload, handler, calls) in self.collateral() {
            println!("{test}: also dead-lettered: {payload} handler={handler:?} calls={calls:?}");
        }
    }

    /// Asserts what holds at any batch size: the poison message is dead-lettered as
    /// `max_deliveries_exceeded` after exactly `MAX_DELIVERIES` calls, each of which crashed
    /// one process, and nothing is dropped silently: every other (event, handler) pair was
    /// handled or is in the dead letters.
    fn assert_poison_dead_lettered_and_nothing_dropped(&self) {
        let letter = self
            .dead
            .iter()
            .find(|d| d.envelope.id == self.poison && d.handler.as_deref() == Some("first"))
            .unwrap_or_else(|| panic!("the poison message is dead-lettered: {:?}", self.dead));
        assert_eq!(letter.reason, Reason::MAX_DELIVERIES_EXCEEDED);
        assert_eq!(
            self.poison_calls(),
            (1..=Self::MAX_DELIVERIES as i32).collect::<Vec<_>>(),
            "the aborting handler is called exactly MAX_DELIVERIES times: attempts are counted \
             at claim"
        );
        assert_eq!(
            self.aborts,
            Self::MAX_DELIVERIES,
            "each call of the poison message crashed one process"
        );
        let pairs = calls_per_pair(&self.ledger);
        let dropped: Vec<_> = lost_pairs(&self.ids, &pairs, None)
            .into_iter()
            .filter(|&(id, handler)| {
                !self
                    .dead
                    .iter()
                    .any(|d| d.envelope.id == id && d.handler.as_deref() == Some(handler))
            })
            .collect();
        assert!(
            dropped.is_empty(),
            "{} pairs neither handled nor dead-lettered, e.g. {:?}",
            dropped.len(),
            &dropped[..dropped.len().min(5)]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_aborts_the_process_is_dead_lettered_after_max_deliveries() {
    const BATCH: u32 = 10;
    let run = CrashLoop::run(BATCH).await;
    run.report("crash_loop");
    run.assert_poison_dead_lettered_and_nothing_dropped();
    // What a_crashing_message_leaves_its_batch_mates_alone shows: the deliveries claimed with
    // the poison message may share its fate, but never more than one batch of them.
    let collateral = run.collateral();
    assert!(
        collateral.len() < BATCH as usize,
        "{} other deliveries dead-lettered with the poison message, more than its batch: \
         {collateral:?}",
        collateral.len()
    );
    run.db.drop_schema().await;
}

/// The deliveries claimed in the same batch as a message that crashes the process are never
/// acked (acks are written after the whole batch), expire together with it (one `available_at`
/// for the batch) and so are claimed together with it again, crash after crash, until they are
/// dead-lettered as `max_deliveries_exceeded` beside it, though they were handled or never got
/// the chance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_message_leaves_its_batch_mates_alone() {
    let run = CrashLoop::run(10).await;
    run.report("batch_mates");
    run.assert_poison_dead_lettered_and_nothing_dropped();
    let collateral = run.collateral();
    assert!(
        collateral.is_empty(),
        "{} deliveries dead-lettered beside the poison message (payload, handler, calls): \
         {collateral:?}",
        collateral.len()
    );
    let pairs = calls_per_pair(&run.ledger);
    let lost = lost_pairs(&run.ids, &pairs, Some((run.poison, "first")));
    assert!(
        lost.is_empty(),
        "{} pairs never handled, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    run.db.drop_schema().await;
}

/// `DeadLetter::attempts` is documented as the handler calls made, but a message dead-lettered
/// at the claim after its last allowed call records the claims: `MAX_DELIVERIES + 1`. One
/// delivery per batch here, so that the batch-mates bug above stays out of the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_messages_dead_letter_counts_the_calls_made() {
    let run = CrashLoop::run(1).await;
    run.report("dead_letter_attempts");
    run.assert_poison_dead_lettered_and_nothing_dropped();
    assert_eq!(run.dead.len(), 1, "{:?}", run.dead);
    assert_eq!(
        run.dead[0].attempts,
        CrashLoop::MAX_DELIVERIES,
        "DeadLetter::attempts is the handler calls made ({:?})",
        run.poison_calls()
    );
    run.db.drop_schema().await;
}

// --- 3. Cancellation at random moments ---

/// Records each call in the ledger in a short transaction of its own, after a short sleep.
struct InProcessLedger {
    pool: PgPool,
    insert: String,
    name: &'static str,
}

impl Handler<Job> for InProcessLedger {
    type Error = String;

    async fn handle(&self, _job: Job, ctx: &Context) -> Result<(), Self::Error> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let mut tx = self.pool.begin().await.map_err(|e| e.to_string())?;
        sqlx::query(&self.insert)
            .bind(ctx.message_id())
            .bind(self.name)
            .bind(i32::try_from(ctx.attempt()).unwrap_or(i32::MAX))
            .bind(0_i32)
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// A worker on `pool` (whose connections carry the test's application name), its handlers
/// writing the ledger through the same pool, as `PgStore::pool` invites them to.
fn in_process_worker(
    db: &TestDb,
    pool: &PgPool,
    store: &PgStore,
    shutdown_grace: Duration,
    max_deliveries: u32,
) -> OutboxWorker {
    let insert = format!(
        "INSERT INTO \"{}\".ledger (message_id, handler, attempt, pid) VALUES ($1, $2, $3, $4)",
        db.schema
    );
    let ledger = |name: &'static str| InProcessLedger {
        pool: pool.clone(),
        insert: insert.clone(),
        name,
    };
    OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<Job, _>(ledger("first"), HandlerOptions::new().name("first"))
        .register_handler_with::<Job, _>(ledger("second"), HandlerOptions::new().name("second"))
        .batch_size(20)
        // The call's timeout and the room to settle it (the store timeout) fit in the lease.
        .lease(Duration::from_secs(1))
        .handler_timeout(Duration::from_millis(500))
        .store_timeout(Duration::from_millis(500))
        .retry_delays(Duration::from_millis(10), Duration::from_millis(100))
        .poll_interval(Duration::from_millis(10))
        .shutdown_grace(shutdown_grace)
        .max_deliveries(max_deliveries)
        .build()
        .expect("worker builds")
}

/// Connections named `application_name` that sit in a transaction, as `(pid, state, query)`.
async fn open_transactions(db: &TestDb, application_name: &str) -> Vec<(i32, String, String)> {
    sqlx::query_as(
        "SELECT pid, state, query FROM pg_stat_activity
         WHERE application_name = $1 AND datname = current_database()
           AND state LIKE 'idle in transaction%'",
    )
    .bind(application_name)
    .fetch_all(&db.pool)
    .await
    .expect("read pg_stat_activity")
}

/// Starts and cancels a worker `rounds` times at random moments while events keep coming,
/// checking after each round that none of the test's connections sits in a transaction; then
/// lets one last worker deliver everything and checks that nothing was lost or left behind.
async fn cancel_at_random(
    test: &str,
    rounds: usize,
    shutdown_grace: Duration,
    max_deliveries: u32,
) {
    let db = TestDb::new().await;
    // A name of its own, so that pg_stat_activity shows this test's connections only.
    let application_name = format!("hxc-cancel-{}", &db.schema[2..]);
    let pool = connect(&application_name, 6).await;
    let store = db.store_on(pool.clone());
    let mut rng = Rng::seeded(test);

    let published = Arc::new(Mutex::new(Vec::<Uuid>::new()));
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let publisher = tokio::spawn({
        let store = store.clone();
        let published = published.clone();
        let stop = stop_publishing.clone();
        async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<Envelope> = (n..n + 10)
                    .map(|n| Envelope::new(&Job { n, abort: false }).expect("encode"))
                    .collect();
                n += 10;
                let ids: Vec<Uuid> = batch.iter().map(|envelope| envelope.id).collect();
                store.publish(batch).await.expect("publish");
                published.lock().unwrap().extend(ids);
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        }
    });

    let mut rounds_with_calls = 0;
    for round in 1..=rounds {
        let calls_before = db.count("ledger").await;
        let cancel = CancellationToken::new();
        let worker = in_process_worker(&db, &pool, &store, shutdown_grace, max_deliveries);
        let running = tokio::spawn(worker.run(cancel.clone()));
        tokio::time::sleep(rng.millis(0, 20)).await;
        cancel.cancel();
        let returned = tokio::time::timeout(Duration::from_secs(30), running)
            .await
            .unwrap_or_else(|_| panic!("round {round}: run did not return within 30 s of cancel"))
            .expect("the worker task does not panic");
        assert!(
            returned.is_ok(),
            "round {round}: run returns Ok(()) on cancel: {returned:?}"
        );
        // Calls given up on are abandoned, not dropped: they may still be finishing their own
        // transactions. What must not happen is a connection that stays in one.
        let settled_by = Instant::now() + Duration::from_secs(10);
        let mut open = open_transactions(&db, &application_name).await;
        while !open.is_empty() && Instant::now() < settled_by {
            tokio::time::sleep(Duration::from_millis(20)).await;
            open = open_transactions(&db, &application_name).await;
        }
        assert!(
            open.is_empty(),
            "round {round}: connections still in a transaction 10 s after the worker returned \
             (pid, state, last query): {open:?}"
        );
        if db.count("ledger").await > calls_before {
            rounds_with_calls += 1;
        }
    }
    stop_publishing.store(true, Ordering::Relaxed);
    publisher.await.expect("the publisher does not panic");
    let calls_in_rounds = db.count("ledger").await;

    // A last, uninterrupted run delivers the rest.
    let cancel = CancellationToken::new();
    let worker = in_process_worker(&db, &pool, &store, Duration::from_secs(8), max_deliveries);
    let running = tokio::spawn(worker.run(cancel.clone()));
    // A guard against a hang, not a speed check: CI runs other suites beside this one.
    let deadline = Instant::now() + Duration::from_secs(180);
    while db.backlog().await > 0 {
        assert!(
            Instant::now() < deadline,
            "the outbox did not drain within 180 s after the rounds ({} rows owed, connections \
             in a transaction: {:?})",
            db.backlog().await,
            open_transactions(&db, &application_name).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancel.cancel();
    running
        .await
        .expect("the worker task does not panic")
        .expect("run returns Ok(()) on cancel");

    let open = open_transactions(&db, &application_name).await;
    let ids = published.lock().unwrap().clone();
    let ledger = db.ledger().await;
    let pairs = calls_per_pair(&ledger);
    let lost = lost_pairs(&ids, &pairs, None);
    let stuck = db.count("deliveries").await;
    println!(
        "{test}: rounds={rounds} rounds_with_calls={rounds_with_calls} events={} \
         calls_in_rounds={calls_in_rounds} calls={} duplicates={} lost={} stuck={stuck} \
         open_transactions={}",
        ids.len(),
        ledger.len(),
        ledger.len() - pairs.len(),
        lost.len(),
        open.len()
    );
    assert!(
        open.is_empty(),
        "connections left in a transaction: {open:?}"
    );
    assert_eq!(stuck, 0, "no delivery stuck");
    assert!(
        lost.is_empty(),
        "{} pairs never handled, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert_eq!(db.count("dead_letters").await, 0, "nothing dead-lettered");
    pool.close().await;
    db.drop_schema().await;
}

/// Cancellation waits for the cycle in progress: the worker's own statements are never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_worker_at_random_moments_leaves_no_transaction_open_and_nothing_stuck() {
    cancel_at_random("cancel", 200, Duration::from_secs(8), 5).await;
}

/// With no shutdown grace, cancellation interrupts running handlers in the middle of their own
/// transactions on the shared pool. Were their futures dropped, one dropped while its `BEGIN`
/// is in flight would return its connection to the pool still in the transaction (sqlx 0.8.6,
/// transact-rs/sqlx#4393), and the store's own statements would then run inside it. The worker
/// abandons such calls instead of dropping them, so they end their transactions themselves.
///
/// Every cancel abandons the calls in flight, and an abandoned call counts as a delivery even
/// when it goes on to finish (it may be what crashes a process). A worker starts its calls one
/// statement after it starts, so a delivery due at the start of several rounds can be in
/// flight at five of the 200 cancels: the budget is 50 here, so that the test stays about
/// transactions and lost rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_with_no_grace_interrupts_handlers_but_leaves_no_transaction_open() {
    cancel_at_random("cancel_no_grace", 200, Duration::ZERO, 50).await;
}

// --- 4. The poll future dropped at random points ---

/// Records each call in the ledger, on a pool of its own, in one autocommit statement: a
/// handler future dropped mid-call leaves no transaction behind.
struct DroppableLedger {
    pool: PgPool,
    schema: String,
    name: &'static str,
}

impl Handler<Job> for DroppableLedger {
    type Error = String;

    async fn handle(&self, _job: Job, ctx: &Context) -> Result<(), Self::Error> {
        ledger::record(
            &self.pool,
            &self.schema,
            ctx.message_id(),
            self.name,
            ctx.attempt(),
            true,
        )
        .await
        .map_err(|e| e.to_string())
    }
}

/// A worker on `store`, its handlers writing the ledger on `ledger_pool`.
fn droppable_worker(
    db: &TestDb,
    store: &PgStore,
    ledger_pool: &PgPool,
    batch_size: u32,
) -> OutboxWorkerBuilder {
    let handler = |name: &'static str| DroppableLedger {
        pool: ledger_pool.clone(),
        schema: db.schema.clone(),
        name,
    };
    OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<Job, _>(handler("first"), HandlerOptions::new().name("first"))
        .register_handler_with::<Job, _>(handler("second"), HandlerOptions::new().name("second"))
        .batch_size(batch_size)
        // The call's timeout and the room to settle it (the store timeout) fit in the lease.
        .lease(Duration::from_secs(1))
        .handler_timeout(Duration::from_millis(500))
        .store_timeout(Duration::from_millis(500))
        .retry_delays(Duration::from_millis(10), Duration::from_millis(100))
        .poll_interval(Duration::from_millis(5))
}

/// Waits (up to 10 s) until no connection named `application_name` sits in a transaction;
/// returns whether one was seen at first, failing if one stays.
async fn no_open_transaction(db: &TestDb, application_name: &str, round: usize) -> bool {
    let mut open = open_transactions(db, application_name).await;
    let seen = !open.is_empty();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !open.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
        open = open_transactions(db, application_name).await;
    }
    assert!(
        open.is_empty(),
        "round {round}: connections still in a transaction 10 s after the future was dropped \
         (pid, state, last query): {open:?}"
    );
    seen
}

/// Scenario (c) of the chaos suite: the worker's `run` future dropped where it stands (no
/// cancellation token, no grace: what a `select!` or a timeout does to it) at a random moment,
/// 10 000 times, while events keep coming. After each drop no connection of the worker's pool
/// may stay in a transaction; at the end one uninterrupted worker delivers everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_poll_future_10k_times_leaves_no_transaction_open_and_no_row_stuck() {
    const ROUNDS: usize = 10_000;
    let db = TestDb::new().await;
    let application_name = format!("hxc-drop-{}", &db.schema[2..]);
    let pool = connect(&application_name, 4).await;
    let ledger_pool = connect("hexeract-tests-drop-ledger", 4).await;
    let store = db.store_on(pool.clone());
    let mut rng = Rng::seeded("drop");

    let mut ids = Vec::new();
    let mut transient = 0;
    let mut budgets = Duration::ZERO;
    for round in 1..=ROUNDS {
        // 1 000 events in all: every delivery a dropped round claimed is suspected of having
        // crashed a process and runs alone afterwards, so many more would only slow the drain.
        if round % 100 == 1 {
            let batch: Vec<Envelope> = (0..10)
                .map(|n| Envelope::new(&Job { n, abort: false }).expect("encode"))
                .collect();
            ids.extend(batch.iter().map(|envelope| envelope.id));
            store.publish(batch).await.expect("publish");
        }
        // Polling only: a worker that listens opens a connection of its own per run.
        // Each claim counts an attempt (a dropped claim looks like a crash), and each delivery
        // is claimed by many dropped rounds: with the default of 5, hundreds would be
        // dead-lettered as `max_deliveries_exceeded`, some after a call that succeeded.
        let worker = droppable_worker(&db, &store, &ledger_pool, 10)
            .max_deliveries(10_000)
            .polling_only()
            .build()
            .expect("worker builds");
        let budget = Duration::from_micros(rng.next() % 3_000);
        budgets += budget;
        let ended = tokio::time::timeout(budget, worker.run(CancellationToken::new())).await;
        assert!(
            ended.is_err(),
            "round {round}: run returned without a cancel"
        );
        if no_open_transaction(&db, &application_name, round).await {
            transient += 1;
        }
    }
    let calls_in_rounds = db.count("ledger").await;
    let suspects: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM \"{}\".deliveries WHERE recovered",
        db.schema
    ))
    .fetch_one(&db.pool)
    .await
    .expect("count the suspects");

    // One uninterrupted worker delivers the rest (claims of dropped rounds come back after
    // their 1 s lease).
    let cancel = CancellationToken::new();
    let worker = droppable_worker(&db, &store, &ledger_pool, 50)
        .max_deliveries(10_000)
        .build()
        .expect("worker builds");
    let running = tokio::spawn(worker.run(cancel.clone()));
    let started = Instant::now();
    db.drain_within(Duration::from_secs(180)).await;
    let drained_in = started.elapsed();
    cancel.cancel();
    running
        .await
        .expect("the worker task does not panic")
        .expect("run returns Ok(()) on cancel");

    let verdict = db.verdict(&ids).await;
    println!(
        "poll_future_dropped: rounds={ROUNDS} mean_budget_us={} calls_in_rounds={calls_in_rounds} \
         rounds_with_a_transaction_seen_open={transient} suspects_left={suspects} \
         drained_after_ms={} open_transactions={}",
        budgets.as_micros() / ROUNDS as u128,
        drained_in.as_millis(),
        open_transactions(&db, &application_name).await.len()
    );
    verdict.assert_pass("poll_future_dropped");
    assert_eq!(db.count("deliveries").await, 0, "no delivery stuck");
    assert_eq!(db.count("outbox").await, 0, "no outbox row stuck");
    pool.close().await;
    ledger_pool.close().await;
    db.drop_schema().await;
}

/// Takes every batch, records its ids, sometimes slowly: the relay's transaction is open the
/// whole time a batch is being "published".
struct RecordingSink {
    published: Mutex<Vec<Uuid>>,
    delay_us: std::sync::atomic::AtomicU64,
}

impl RelaySink for RecordingSink {
    fn publish<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<Unpublishable>, String>> {
        Box::pin(async move {
            let delay = self.delay_us.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(Duration::from_micros(delay)).await;
            }
            self.published
                .lock()
                .unwrap()
                .extend(envelopes.iter().map(|envelope| envelope.id));
            Ok(Vec::new())
        })
    }
}

/// Scenario (c) for the relay, whose pass holds a transaction (rows locked, deleted only after
/// the sink confirmed them): a relay pass dropped at a random moment 10 000 times. No
/// connection stays in a transaction, and every row is relayed at least once in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_relay_pass_10k_times_leaves_no_transaction_open_and_every_row_relayed() {
    const ROUNDS: usize = 10_000;
    let db = TestDb::new().await;
    let application_name = format!("hxc-relaydrop-{}", &db.schema[2..]);
    let pool = connect(&application_name, 4).await;
    let store = db.store_on(pool.clone());
    let sink = RecordingSink {
        published: Mutex::new(Vec::new()),
        delay_us: std::sync::atomic::AtomicU64::new(0),
    };
    let mut rng = Rng::seeded("relay_drop");
    let mut ids = Vec::new();
    let mut transient = 0;
    let mut completed = 0;
    for round in 1..=ROUNDS {
        if round % 10 == 1 {
            let batch: Vec<Envelope> = (0..10)
                .map(|n| Envelope::new(&Job { n, abort: false }).expect("encode"))
                .collect();
            ids.extend(batch.iter().map(|envelope| envelope.id));
            store.publish(batch).await.expect("publish");
        }
        sink.delay_us.store(rng.next() % 1_000, Ordering::Relaxed);
        let budget = Duration::from_micros(rng.next() % 2_500);
        if tokio::time::timeout(budget, store.relay(20, &sink))
            .await
            .is_ok_and(|pass| pass.is_ok())
        {
            completed += 1;
        }
        if no_open_transaction(&db, &application_name, round).await {
            transient += 1;
        }
    }
    sink.delay_us.store(0, Ordering::Relaxed);
    let started = Instant::now();
    while db.count("outbox").await > 0 {
        store.relay(500, &sink).await.expect("a relay pass");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the outbox did not empty within 60 s"
        );
    }
    let published = sink.published.lock().unwrap().clone();
    let relayed: std::collections::HashSet<Uuid> = published.iter().copied().collect();
    let lost: Vec<&Uuid> = ids.iter().filter(|id| !relayed.contains(id)).collect();
    let unexpected = relayed.len() - (ids.len() - lost.len());
    println!(
        "scenario=relay_pass_dropped rounds={ROUNDS} passes_completed={completed} sent={} \
         relayed={} lost={} unexpected={unexpected} duplicates={} \
         rounds_with_a_transaction_seen_open={transient}",
        ids.len(),
        relayed.len(),
        lost.len(),
        published.len() - relayed.len()
    );
    assert!(
        lost.is_empty(),
        "{} rows never relayed, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(3)]
    );
    assert_eq!(unexpected, 0, "the sink saw only the published rows");
    assert!(
        open_transactions(&db, &application_name).await.is_empty(),
        "no connection left in a transaction"
    );
    pool.close().await;
    db.drop_schema().await;
}

// --- 5. The worker's backends terminated during the claim and during the commit ---

/// Makes the two windows wide enough to hit: each claim (the `UPDATE … attempts + 1` of
/// deliveries) sleeps 20 ms inside its statement, and each transaction that deletes deliveries
/// (an ack: the take that carries the last batch's acks, or the worker's last ack) sleeps
/// 20 ms at its commit, in a deferred constraint trigger, with `-committing` added to its
/// backend's `application_name` until the transaction ends, so that the chaos loop finds it
/// there.
async fn widen_claim_and_commit(db: &TestDb) {
    let s = &db.schema;
    for statement in [
        format!(
            "CREATE FUNCTION \"{s}\".hx_slow_statement() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(0.02); RETURN NULL; END $$"
        ),
        format!(
            "CREATE TRIGGER hx_slow_claim BEFORE UPDATE ON \"{s}\".deliveries
             FOR EACH STATEMENT EXECUTE FUNCTION \"{s}\".hx_slow_statement()"
        ),
        // Once per transaction, though the trigger fires for each row deleted.
        format!(
            "CREATE FUNCTION \"{s}\".hx_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF current_setting('hx.slept', true) IS DISTINCT FROM 'yes' THEN
                     PERFORM set_config('hx.slept', 'yes', true);
                     PERFORM set_config('application_name',
                                        current_setting('application_name') || '-committing',
                                        true);
                     PERFORM pg_sleep(0.02);
                 END IF;
                 RETURN NULL;
             END $$"
        ),
        format!(
            "CREATE CONSTRAINT TRIGGER hx_slow_ack AFTER DELETE ON \"{s}\".deliveries
             DEFERRABLE INITIALLY DEFERRED
             FOR EACH ROW EXECUTE FUNCTION \"{s}\".hx_slow_commit()"
        ),
    ] {
        sqlx::query(&statement)
            .execute(&db.pool)
            .await
            .expect("create a slowing trigger");
    }
}

async fn unwiden(db: &TestDb) {
    let s = &db.schema;
    for statement in [
        format!("DROP TRIGGER hx_slow_claim ON \"{s}\".deliveries"),
        format!("DROP TRIGGER hx_slow_ack ON \"{s}\".deliveries"),
    ] {
        sqlx::query(&statement)
            .execute(&db.pool)
            .await
            .expect("drop a slowing trigger");
    }
}

/// Terminates the backends of `application_name` running a statement like `pattern`; returns
/// how many.
async fn terminate_running(db: &TestDb, application_name: &str, pattern: &str) -> usize {
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = $1 AND datname = current_database()
           AND state = 'active' AND query LIKE $2",
    )
    .bind(application_name)
    .bind(pattern)
    .fetch_all(&db.pool)
    .await
    .expect("terminate backends");
    terminated.into_iter().filter(|done| *done).count()
}

/// Scenario (b) of the chaos suite: while a worker delivers 2 000 events to two handlers, its
/// PostgreSQL backends are terminated (`pg_terminate_backend`, what a failover or an admin
/// does) in the middle of claims and in the middle of the commits of acks, 20 times each.
/// The worker carries on over fresh connections; nothing is lost, nothing stays claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_terminated_during_claim_and_commit_lose_nothing() {
    const EVENTS: u32 = 2_000;
    const EACH: usize = 20;
    let db = TestDb::new().await;
    let application_name = format!("hxc-term-{}", &db.schema[2..]);
    let pool = connect(&application_name, 4).await;
    let ledger_pool = connect("hexeract-tests-term-ledger", 4).await;
    let store = db.store_on(pool.clone());
    widen_claim_and_commit(&db).await;
    let ids = db.publish_jobs(EVENTS, None).await;
    let mut rng = Rng::seeded("terminate");

    let cancel = CancellationToken::new();
    let worker = droppable_worker(&db, &store, &ledger_pool, 20)
        .max_deliveries(50)
        .build()
        .expect("worker builds");
    let running = tokio::spawn(worker.run(cancel.clone()));
    let claim = "%SET attempts = attempts + 1%";
    // Acks are deleted in the statement that takes the next batch: the backend is in an ack's
    // commit while its trigger has marked it.
    let committing = format!("{application_name}-committing");
    let (mut in_claim, mut in_commit) = (0, 0);
    let started = Instant::now();
    while in_claim < EACH || in_commit < EACH {
        assert!(
            db.backlog().await > 0,
            "the outbox drained after {in_claim} terminations in claims and {in_commit} in \
             commits: the scenario needs more events"
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "only {in_claim} terminations in claims and {in_commit} in commits within 120 s"
        );
        tokio::time::sleep(rng.millis(1, 15)).await;
        if in_claim < EACH {
            in_claim += terminate_running(&db, &application_name, claim).await;
        }
        if in_commit < EACH {
            in_commit += terminate_running(&db, &committing, "%DELETE FROM %deliveries%").await;
        }
    }
    let chaos_for = started.elapsed();
    unwiden(&db).await;
    let drain_started = Instant::now();
    db.drain_within(Duration::from_secs(120)).await;
    let drained_in = drain_started.elapsed();
    cancel.cancel();
    running
        .await
        .expect("the worker task does not panic")
        .expect("run returns Ok(()) on cancel");

    let verdict = db.verdict(&ids).await;
    println!(
        "pg_terminate_backend: terminated_in_claim={in_claim} terminated_in_commit={in_commit} \
         chaos_ms={} drained_after_ms={}",
        chaos_for.as_millis(),
        drained_in.as_millis()
    );
    verdict.assert_pass("pg_terminate_backend");
    assert_eq!(verdict.dead_lettered_total(), 0, "nothing dead-lettered");
    assert_eq!(db.count("deliveries").await, 0, "no delivery stuck");
    assert!(
        open_transactions(&db, &application_name).await.is_empty(),
        "no connection left in a transaction"
    );
    pool.close().await;
    ledger_pool.close().await;
    db.drop_schema().await;
}

// --- 6. PostgreSQL through the fault proxy ---

/// Waits until the ledger holds more than `count` calls; returns how long that took.
async fn ledger_beyond(db: &TestDb, count: i64, limit: Duration) -> Duration {
    let started = Instant::now();
    while db.count("ledger").await <= count {
        assert!(
            started.elapsed() < limit,
            "no new call within {limit:?} ({count} so far)"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

/// Chaos scenario: the outbox worker reaches PostgreSQL through the fault proxy, which resets
/// every connection (RST) twice while 2 000 events go to two handlers. The pool opens new
/// connections; nothing is lost, nothing stays claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connections_reset_mid_batch_lose_nothing() {
    const EVENTS: u32 = 2_000;
    let db = TestDb::new().await;
    let proxy = FaultProxy::start(database_addr()).await;
    let application_name = format!("hxc-pgproxy-{}", &db.schema[2..]);
    let pool = connect_through(&proxy, &application_name).await;
    let ledger_pool = connect("hexeract-tests-pgproxy-ledger", 4).await;
    let store = db.store_on(pool.clone());
    let ids = db.publish_jobs(EVENTS, None).await;

    let cancel = CancellationToken::new();
    let worker = droppable_worker(&db, &store, &ledger_pool, 20)
        .max_deliveries(50)
        .polling_only()
        .build()
        .expect("worker builds");
    let running = tokio::spawn(worker.run(cancel.clone()));
    let mut resumed = Vec::new();
    for cut in 1..=2 {
        ledger_beyond(&db, i64::from(EVENTS) * cut / 3, Duration::from_secs(60)).await;
        let at_cut = db.count("ledger").await;
        let accepted = proxy.accepted();
        proxy.reset_all();
        resumed.push(ledger_beyond(&db, at_cut + 20, Duration::from_secs(60)).await);
        assert!(
            proxy.accepted() > accepted,
            "cut {cut}: the pool connected again through the proxy"
        );
    }
    db.drain_within(Duration::from_secs(120)).await;
    cancel.cancel();
    running
        .await
        .expect("the worker task does not panic")
        .expect("run returns Ok(()) on cancel");

    let verdict = db.verdict(&ids).await;
    let resumed_ms: Vec<u128> = resumed.iter().map(Duration::as_millis).collect();
    println!(
        "postgres_proxy_reset: cuts=2 calls_again_after_ms={resumed_ms:?} connections_opened={}",
        proxy.accepted()
    );
    verdict.assert_pass("postgres_proxy_reset");
    assert_eq!(verdict.dead_lettered_total(), 0, "nothing dead-lettered");
    assert_eq!(db.count("deliveries").await, 0, "no delivery stuck");
    pool.close().await;
    ledger_pool.close().await;
    db.drop_schema().await;
}

/// Chaos scenario: the worker's network path to PostgreSQL goes silent (blackhole: sockets
/// open, nothing forwarded) in the middle of a claim, for 3 s. PostgreSQL has no heartbeat, so
/// only the worker's store timeout (2 s here) gets it out of the claim that will never be
/// answered; the pool's other connections carry on once the path is back. Before the timeout
/// existed the worker never made another call (and did not stop on cancel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_path_blackholed_during_a_claim_is_given_up_on_after_the_store_timeout() {
    const EVENTS: u32 = 2_000;
    let db = TestDb::new().await;
    let proxy = FaultProxy::start(database_addr()).await;
    let application_name = format!("hxc-pgbh-{}", &db.schema[2..]);
    let pool = connect_through(&proxy, &application_name).await;
    let ledger_pool = connect("hexeract-tests-pgbh-ledger", 4).await;
    let store = db.store_on(pool.clone());
    let ids = db.publish_jobs(EVENTS, None).await;
    let cancel = CancellationToken::new();
    let worker = droppable_worker(&db, &store, &ledger_pool, 20)
        .max_deliveries(50)
        .store_timeout(Duration::from_secs(2))
        // The call's timeout and 2 s to settle it.
        .lease(Duration::from_millis(2_500))
        .polling_only()
        .build()
        .expect("worker builds");
    let running = tokio::spawn(worker.run(cancel.clone()));
    ledger_beyond(&db, i64::from(EVENTS) / 2, Duration::from_secs(60)).await;

    // Claims take 20 ms while the trigger is there: wait for one to be running, then cut.
    widen_claim_and_commit(&db).await;
    let started = Instant::now();
    loop {
        let claiming: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND state = 'active'
               AND query LIKE '%SET attempts = attempts + 1%'",
        )
        .bind(&application_name)
        .fetch_one(&db.pool)
        .await
        .expect("read pg_stat_activity");
        if claiming > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no claim seen running within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    proxy.blackhole(true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.blackhole(false);
    let lifted = Instant::now();
    unwiden(&db).await;
    let at_lift = db.count("ledger").await;
    let resumed = ledger_beyond(&db, at_lift, Duration::from_secs(30)).await;

    db.drain_within(Duration::from_secs(120)).await;
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the worker stops within 30 s of cancel")
        .expect("the worker task does not panic")
        .expect("run returns Ok(()) on cancel");

    let verdict = db.verdict(&ids).await;
    println!(
        "postgres_proxy_blackhole: blackhole_ms=3000 store_timeout_ms=2000 \
         calls_again_after_lift_ms={} drained_after_lift_ms={}",
        resumed.as_millis(),
        lifted.elapsed().as_millis()
    );
    verdict.assert_pass("postgres_proxy_blackhole");
    assert_eq!(verdict.dead_lettered_total(), 0, "nothing dead-lettered");
    assert_eq!(db.count("deliveries").await, 0, "no delivery stuck");
    // Not `pool.close()`: the connection given up on never answers, and close waits for it.
    drop(pool);
    ledger_pool.close().await;
    db.drop_schema().await;
}
