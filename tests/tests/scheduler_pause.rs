//! A scheduler process paused with SIGSTOP past its lease (`scheduler_child`): another process
//! takes the occurrence over, the paused one, let go with SIGCONT, cannot settle over it, and
//! the fire time still runs to success: nothing missed.
//!
//! Needs PostgreSQL at `TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hexeract::schedule::Spec;
use hexeract::store::DeadLetterStore;
use hexeract::store::{DeliveryStore, ScheduleDefinition, ScheduleStore};
use hexeract_tests::pg::{database_url, TestSchema};
use uuid::Uuid;

/// A `scheduler_child` process; dropping it kills it, so a failing test leaves none behind.
struct ChildScheduler {
    child: Child,
}

impl ChildScheduler {
    async fn start(schema: &str, lease_ms: u64, retry_ms: u64) -> ChildScheduler {
        let mut child = Command::new(env!("CARGO_BIN_EXE_scheduler_child"))
            .args([
                schema.to_owned(),
                lease_ms.to_string(),
                retry_ms.to_string(),
            ])
            .env("SCHEDULER_CHILD_DATABASE_URL", database_url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start scheduler_child");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut started = ChildScheduler { child };
        let ready = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        });
        match tokio::time::timeout(Duration::from_secs(30), ready).await {
            Ok(Ok(Ok(line))) if line.trim() == "ready" => started,
            other => panic!(
                "scheduler_child did not start ({other:?}, status {:?}); is PostgreSQL \
                 reachable at TEST_DATABASE_URL?",
                started.child.try_wait()
            ),
        }
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("a pid")
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {}", self.pid());
    }

    /// Closes its standard input, which cancels its scheduler, and waits for it to end.
    async fn stop(mut self) {
        drop(self.child.stdin.take());
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().expect("poll the child") {
                assert!(status.success(), "scheduler_child ended with {status}");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("scheduler_child did not stop within 15 s of its cancellation");
    }
}

impl Drop for ChildScheduler {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// (attempt, pid) of every run so far, in the order they started.
async fn runs(schema: &TestSchema) -> Vec<(i32, i32)> {
    sqlx::query_as(&format!(
        "SELECT attempt, pid FROM {}.ledger ORDER BY at, attempt",
        schema.schema
    ))
    .fetch_all(&schema.pool)
    .await
    .unwrap()
}

async fn wait_for_runs(schema: &TestSchema, count: usize, limit: Duration) -> Vec<(i32, i32)> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let runs = runs(schema).await;
        if runs.len() >= count {
            return runs;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{count} runs within {limit:?}, found {runs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_paused_past_its_lease_is_taken_over_and_cannot_settle_when_it_resumes() {
    let schema = TestSchema::new("hexeract-tests-scheduler-pause").await;
    let store = schema.store();
    store.migrate().await.unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {}.ledger (message_id uuid NOT NULL, attempt integer NOT NULL,
                                 pid integer NOT NULL, ended boolean NOT NULL DEFAULT false,
                                 at timestamptz NOT NULL DEFAULT clock_timestamp())",
        schema.schema
    ))
    .execute(&schema.pool)
    .await
    .unwrap();
    // The child's job, daily, made due now.
    let definition = ScheduleDefinition {
        name: "pausable".to_owned(),
        spec: Spec::Every(Duration::from_secs(86_400)).stored_text(),
    };
    let a_second_ago =
        |_: &str, now: chrono::DateTime<chrono::Utc>| now - chrono::Duration::seconds(1);
    store
        .sync_schedules(std::slice::from_ref(&definition), &a_second_ago)
        .await
        .unwrap();

    // A: lease 3 s (2.25 s for a run, 0.75 s to settle it), retries after 10 ms. Its first run
    // sleeps 2 s; it is paused meanwhile.
    let first = ChildScheduler::start(&schema.schema, 3_000, 10).await;
    let started = wait_for_runs(&schema, 1, Duration::from_secs(20)).await;
    assert_eq!(started, [(1, first.pid())]);
    first.signal("-STOP");

    // B takes the occurrence over once A's lease ends; its run fails, due again in 5 s.
    let second = ChildScheduler::start(&schema.schema, 3_000, 5_000).await;
    let taken_over = wait_for_runs(&schema, 2, Duration::from_secs(20)).await;
    assert_eq!(taken_over[1], (2, second.pid()), "B ran the second attempt");

    // A goes on: its 2 s sleep is over, its run fails, and it tries to make the occurrence
    // due in 10 ms, over B's claim.
    first.signal("-CONT");
    // A's run ends (it says so in the ledger), and its settle follows at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ended: bool = sqlx::query_scalar(&format!(
            "SELECT ended FROM {}.ledger WHERE attempt = 1",
            schema.schema
        ))
        .fetch_one(&schema.pool)
        .await
        .unwrap();
        if ended {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "A's first run ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_resume = runs(&schema).await;
    assert_eq!(
        after_resume.len(),
        2,
        "A's stale failure did not make the occurrence due again: {after_resume:?}"
    );
    let last_errors: Vec<Option<String>> = sqlx::query_scalar(&format!(
        "SELECT last_error FROM {}.occurrences",
        schema.schema
    ))
    .fetch_all(&schema.pool)
    .await
    .unwrap();
    assert_eq!(
        last_errors,
        [Some("handler_failed: the second run failed".to_owned())],
        "the outcome on record is B's"
    );

    // Nothing missed: the third attempt, by either, succeeds.
    let all = wait_for_runs(&schema, 3, Duration::from_secs(20)).await;
    assert_eq!(all[2].0, 3);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.schedule_backlog().await.unwrap() > 0 {
        assert!(tokio::time::Instant::now() < deadline, "settled in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ids: Vec<Uuid> = sqlx::query_scalar(&format!(
        "SELECT DISTINCT message_id FROM {}.ledger",
        schema.schema
    ))
    .fetch_all(&schema.pool)
    .await
    .unwrap();
    assert_eq!(ids.len(), 1, "one occurrence, run three times");
    assert!(store.dead_letters(10).await.unwrap().is_empty());
    first.stop().await;
    second.stop().await;
    println!("runs (attempt, pid): {all:?}");
    schema.drop_schema().await;
}
