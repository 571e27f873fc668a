//! The testing toolkit's fault mode (`Harness::fault_check`): a handler that is not idempotent
//! under at-least-once delivery is caught, with the fault and the difference named, and one
//! that is passes; scheduled jobs run through the harness; `TestDatabase` gives a test a
//! PostgreSQL database of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hexeract::outbox::inbox::mark_processed;
use hexeract::store::postgres::PgStore;
use hexeract::store::DeliveryStore;
use hexeract::testing::{Fault, Harness, JobError, TestDatabase};
use hexeract::{
    handler, scheduled, Context, HandlerOutcome, Message, Middleware, Next, Reason, State,
};
use sqlx::PgPool;
use uuid::Uuid;

/// Points booked per message id, shared by the in-memory handlers below.
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<Vec<(Uuid, u32)>>>);

impl Ledger {
    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    fn total(&self) -> u32 {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, points)| points)
            .sum()
    }

    fn has(&self, id: Uuid) -> bool {
        self.0
            .lock()
            .unwrap()
            .iter()
            .any(|(booked, _)| *booked == id)
    }

    fn book(&self, id: Uuid, points: u32) {
        self.0.lock().unwrap().push((id, points));
    }
}

macro_rules! points_message {
    ($name:ident, $wire:literal) => {
        #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
        #[message(type = $wire)]
        struct $name {
            points: u32,
        }
    };
}

points_message!(Appended, "fault.Appended");
points_message!(Deduplicated, "fault.Deduplicated");
points_message!(Racy, "fault.Racy");
points_message!(Strict, "fault.Strict");

/// Not idempotent: books the points again on every delivery.
#[handler(message = "fault.Appended", name = "ledger.append")]
async fn append(event: Appended, ctx: &Context, State(ledger): State<Ledger>) -> HandlerOutcome {
    ledger.book(ctx.message_id(), event.points);
    HandlerOutcome::Ack
}

/// Idempotent: one line per message id, checked and written without a pause between.
#[handler(message = "fault.Deduplicated", name = "ledger.deduplicate")]
async fn deduplicate(
    event: Deduplicated,
    ctx: &Context,
    State(ledger): State<Ledger>,
) -> HandlerOutcome {
    let mut lines = ledger.0.lock().unwrap();
    if !lines.iter().any(|(id, _)| *id == ctx.message_id()) {
        lines.push((ctx.message_id(), event.points));
    }
    HandlerOutcome::Ack
}

/// Checks, waits (a query's round trip), then writes: right one delivery after another, wrong
/// when two run at once.
#[handler(message = "fault.Racy", name = "ledger.check_then_book")]
async fn check_then_book(
    event: Racy,
    ctx: &Context,
    State(ledger): State<Ledger>,
) -> HandlerOutcome {
    let booked = ledger.has(ctx.message_id());
    tokio::time::sleep(Duration::from_millis(20)).await;
    if !booked {
        ledger.book(ctx.message_id(), event.points);
    }
    HandlerOutcome::Ack
}

/// Leaves the right state, but rejects the duplicate: its copy ends as a dead letter that an
/// operator would have to look at.
#[handler(message = "fault.Strict", name = "ledger.strict")]
async fn strict(event: Strict, ctx: &Context, State(ledger): State<Ledger>) -> HandlerOutcome {
    let mut lines = ledger.0.lock().unwrap();
    if lines.iter().any(|(id, _)| *id == ctx.message_id()) {
        return HandlerOutcome::reject("this message was booked already");
    }
    lines.push((ctx.message_id(), event.points));
    HandlerOutcome::Ack
}

async fn check<M: Message>(message: &M) -> hexeract::testing::FaultReport<u32> {
    let ledger = Ledger::default();
    let harness = Harness::new().unwrap().state(ledger.clone());
    harness
        .fault_check(message)
        .unwrap()
        .reset(|| async { ledger.clear() })
        .probe(|| async { ledger.total() })
        .run()
        .await
}

#[tokio::test]
async fn a_handler_that_books_again_on_each_delivery_is_caught_under_each_fault() {
    let report = check(&Appended { points: 10 }).await;
    assert_eq!(report.clean.probe, 10, "one clean delivery books once");
    let read: Vec<(Fault, u32)> = report
        .faulted
        .iter()
        .map(|run| (run.fault, run.probe))
        .collect();
    assert_eq!(
        read,
        [
            (Fault::DeliveredTwice, 20),
            (Fault::RedeliveredAfterCommit, 20),
            (Fault::Concurrent, 20)
        ]
    );
    assert!(!report.is_idempotent());
    let differences = report.differences();
    assert_eq!(differences.len(), 3, "{differences:#?}");
    assert_eq!(
        differences[0],
        "delivered twice: the probe read 20; after one clean delivery it read 10"
    );
    // The redelivery is the second attempt, as a worker counts it.
    let redelivered = &report.faulted[1];
    assert_eq!(
        redelivered
            .endings
            .iter()
            .map(|ending| (ending.delivery, ending.calls))
            .collect::<Vec<_>>(),
        [(1, 1), (2, 1)]
    );
}

#[tokio::test]
#[should_panic(
    expected = "the handlers of \"fault.Appended\" are not idempotent under at-least-once delivery: 3 differences"
)]
async fn assert_idempotent_fails_the_test_naming_the_message_and_the_differences() {
    check(&Appended { points: 1 }).await.assert_idempotent();
}

#[tokio::test]
async fn a_handler_that_deduplicates_on_the_message_id_passes() {
    let report = check(&Deduplicated { points: 7 }).await;
    assert_eq!(report.clean.probe, 7);
    assert!(report.faulted.iter().all(|run| run.probe == 7));
    report.assert_idempotent();
    assert!(report
        .to_string()
        .contains("left what one clean delivery leaves"));
}

#[tokio::test]
async fn a_check_then_write_race_shows_only_when_two_deliveries_run_at_once() {
    let report = check(&Racy { points: 5 }).await;
    let differences = report.differences();
    assert_eq!(
        differences,
        ["two deliveries at once: the probe read 10; after one clean delivery it read 5"]
    );
}

#[tokio::test]
async fn a_duplicate_dead_lettered_is_a_difference_even_when_the_state_is_right() {
    let report = check(&Strict { points: 3 }).await;
    assert!(report.faulted.iter().all(|run| run.probe == 3));
    let differences = report.differences();
    assert!(
        differences.iter().any(|difference| difference.starts_with(
            "delivered twice: delivery 2 to `ledger.strict` was dead-lettered (handler_rejected: \
             this message was booked already); one clean delivery was acked"
        )),
        "{differences:#?}"
    );
    assert!(!report.is_idempotent());
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "fault.Flaky")]
struct Flaky {
    fail_first: u32,
}

/// Fails its first calls, then succeeds: each delivery of a fault check runs to its end.
#[handler(message = "fault.Flaky", name = "ledger.flaky")]
async fn flaky(event: Flaky, ctx: &Context) -> Result<(), String> {
    if ctx.attempt() <= event.fail_first {
        return Err(format!("attempt {} fails", ctx.attempt()));
    }
    Ok(())
}

#[tokio::test]
async fn each_delivery_is_called_again_after_a_retry_up_to_max_deliveries() {
    let harness = Harness::new().unwrap();
    let report = harness
        .fault_check(&Flaky { fail_first: 2 })
        .unwrap()
        .run()
        .await;
    assert_eq!(report.clean.endings[0].calls, 3);
    assert_eq!(report.clean.endings[0].outcome, HandlerOutcome::Ack);
    report.assert_idempotent();

    let report = harness
        .clone()
        .max_deliveries(2)
        .fault_check(&Flaky { fail_first: 2 })
        .unwrap()
        .run()
        .await;
    let ending = &report.clean.endings[0];
    assert_eq!(ending.calls, 2);
    assert!(
        matches!(&ending.outcome, HandlerOutcome::DeadLetter { reason, detail }
            if *reason == Reason::MAX_DELIVERIES_EXCEEDED && detail == "attempt 2 fails"),
        "{ending:?}"
    );
}

// Scheduled jobs through the harness.

#[derive(Clone)]
struct Quota(u32);

/// Counts the jobs' runs a middleware saw.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Middleware for Seen {
    async fn handle(&self, ctx: &Context, next: Next<'_>) -> HandlerOutcome {
        let fire = ctx.scheduled_for().map(|at| at.to_rfc3339());
        self.0.lock().unwrap().push(format!(
            "{} {}",
            ctx.handler_name(),
            fire.unwrap_or_default()
        ));
        next.run(ctx).await
    }
}

#[scheduled(every = "1h", name = "jobs.check_quota")]
async fn check_quota(ctx: &Context, State(quota): State<Quota>) -> HandlerOutcome {
    match (quota.0, ctx.attempt()) {
        (0, _) => HandlerOutcome::reject("the quota is zero"),
        (_, 1) => HandlerOutcome::Ack,
        (_, attempt) => HandlerOutcome::retry(format!("attempt {attempt}")),
    }
}

#[tokio::test]
async fn a_scheduled_job_runs_with_its_state_middleware_and_fire_time() {
    let seen = Seen::default();
    let harness = Harness::new()
        .unwrap()
        .state(Quota(3))
        .middleware(seen.clone());
    let fire_at = chrono::DateTime::parse_from_rfc3339("2026-12-07T10:00:00Z")
        .unwrap()
        .to_utc();
    assert_eq!(
        harness.run_job_at("jobs.check_quota", fire_at).await,
        Ok(HandlerOutcome::Ack)
    );
    assert_eq!(
        *seen.0.lock().unwrap(),
        ["jobs.check_quota 2026-12-07T10:00:00+00:00"]
    );
    assert!(matches!(
        harness.clone().attempt(2).run_job("jobs.check_quota").await,
        Ok(HandlerOutcome::Retry { detail, .. }) if detail == "attempt 2"
    ));
    assert!(matches!(
        harness.clone().state(Quota(0)).run_job("jobs.check_quota").await,
        Ok(HandlerOutcome::DeadLetter { reason, .. }) if reason == Reason::HANDLER_REJECTED
    ));
}

#[tokio::test]
async fn a_job_whose_state_is_missing_or_whose_name_is_unknown_says_so() {
    let harness = Harness::new().unwrap();
    match harness.run_job("jobs.check_quota").await {
        Ok(HandlerOutcome::DeadLetter { reason, detail }) => {
            assert_eq!(reason, Reason::STATE_MISSING);
            assert!(detail.contains("State<Quota>"), "{detail}");
            assert!(detail.contains("`.state(value)`"), "{detail}");
        }
        other => panic!("expected state_missing, got {other:?}"),
    }
    let unknown = harness.run_job("jobs.nope").await.unwrap_err();
    assert!(matches!(&unknown, JobError::Unknown { known, .. } if known == &["jobs.check_quota"]));
    assert_eq!(
        unknown.to_string(),
        "no scheduled job is named \"jobs.nope\"; the jobs are: jobs.check_quota"
    );
}

// Handlers on a real PostgreSQL database, one database per test.

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "fault.Visited")]
struct Visited {
    page: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "fault.VisitedOnce")]
struct VisitedOnce {
    page: String,
}

/// Not idempotent: counts the visit on every delivery.
#[handler(message = "fault.Visited", name = "pages.count_visit")]
async fn count_visit(
    event: Visited,
    _ctx: &Context,
    State(pool): State<PgPool>,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO visits (page) VALUES ($1)")
        .bind(&event.page)
        .execute(&pool)
        .await?;
    Ok(())
}

/// Idempotent: the visit and the inbox mark in one transaction.
#[handler(message = "fault.VisitedOnce", name = "pages.count_visit_once")]
async fn count_visit_once(
    event: VisitedOnce,
    ctx: &Context,
    State(pool): State<PgPool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut tx = pool.begin().await?;
    if !mark_processed(&mut tx, ctx).await? {
        return Ok(());
    }
    sqlx::query("INSERT INTO visits (page) VALUES ($1)")
        .bind(&event.page)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

async fn visits_database() -> TestDatabase {
    let database = TestDatabase::create(&hexeract_tests::pg::database_url())
        .await
        .unwrap_or_else(|error| {
            panic!("cannot create a test database ({error}); set TEST_DATABASE_URL")
        });
    // Hexeract's tables (the inbox mark_processed writes), and the handlers' own.
    PgStore::new(database.pool().clone(), "hexeract")
        .unwrap()
        .migrate()
        .await
        .unwrap();
    sqlx::query("CREATE TABLE visits (page text NOT NULL)")
        .execute(database.pool())
        .await
        .unwrap();
    database
}

async fn check_visits<M: Message>(database: &TestDatabase, message: &M) -> Vec<String> {
    let pool = database.pool();
    let harness = Harness::new().unwrap().state(pool.clone());
    harness
        .fault_check(message)
        .unwrap()
        .reset(|| async {
            sqlx::query("TRUNCATE visits, hexeract.inbox")
                .execute(pool)
                .await
                .unwrap();
        })
        .probe(|| async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM visits")
                .fetch_one(pool)
                .await
                .unwrap()
        })
        .run()
        .await
        .differences()
}

#[tokio::test]
async fn on_postgres_an_insert_per_delivery_is_caught_and_an_inbox_mark_passes() {
    let database = visits_database().await;
    let differences = check_visits(
        &database,
        &Visited {
            page: "/".to_owned(),
        },
    )
    .await;
    assert_eq!(
        differences,
        [
            "delivered twice: the probe read 2; after one clean delivery it read 1",
            "redelivered after the handler committed, before the ack: the probe read 2; after one clean delivery it read 1",
            "two deliveries at once: the probe read 2; after one clean delivery it read 1",
        ]
    );
    let differences = check_visits(
        &database,
        &VisitedOnce {
            page: "/".to_owned(),
        },
    )
    .await;
    assert!(differences.is_empty(), "{differences:#?}");
    database.drop_database().await.unwrap();
}

#[tokio::test]
async fn a_test_database_is_the_tests_alone_and_is_dropped_at_the_end() {
    let first = TestDatabase::create(&hexeract_tests::pg::database_url())
        .await
        .unwrap();
    let second = TestDatabase::create(&hexeract_tests::pg::database_url())
        .await
        .unwrap();
    assert_ne!(first.name(), second.name());
    sqlx::query("CREATE SCHEMA shop")
        .execute(first.pool())
        .await
        .unwrap();
    // The same schema name in the other database: no clash.
    sqlx::query("CREATE SCHEMA shop")
        .execute(second.pool())
        .await
        .unwrap();
    let through_url = PgPool::connect(&first.url()).await.unwrap();
    let current: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&through_url)
        .await
        .unwrap();
    assert_eq!(current, first.name());
    // Dropped although a connection is still open to it.
    let name = first.name().to_owned();
    first.drop_database().await.unwrap();
    second.drop_database().await.unwrap();
    let admin = hexeract_tests::pg::connect("fault_mode", 1).await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(&name)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(left, 0);
}
