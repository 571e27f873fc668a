//! What `dead-letters purge` and `replay` ask of the stores, on PostgreSQL (a schema per test)
//! and SQLite (a file per test): deleting a list of dead letters in one statement, and a
//! dead-lettered scheduled job run coming back as an occurrence that the scheduler runs again;
//! and the broker queues a worker declared, remembered for the unowned-queue warning.
//!
//! Needs PostgreSQL at `TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! The record of job runs is a process-wide static: these tests rely on nextest's one process
//! per test (the README's test command).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use hexeract::outbox::OutboxWorker;
use hexeract::schedule::{ScheduledJob, SchedulerWorker, Spec};
use hexeract::store::Store;
use hexeract::store::{DeliveryStore, ScheduleDefinition, SCHEDULE_MESSAGE_TYPE};
use hexeract::{CancellationToken, Context, Envelope, HandlerOutcome, Registry};
use uuid::Uuid;

async fn pg_store() -> (hexeract_tests::pg::TestSchema, Arc<dyn Store>) {
    let schema = hexeract_tests::pg::TestSchema::new("hexeract-tests-dead-letters").await;
    let store = schema.migrated_store().await;
    (schema, Arc::new(store))
}

async fn sqlite_store() -> (std::path::PathBuf, Arc<dyn Store>) {
    let dir = std::env::temp_dir().join(format!("hexeract-dead-letters-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = hexeract::store::sqlite::SqliteStore::open(dir.join("outbox.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (dir, Arc::new(store))
}

async fn wait_until<F: std::future::Future<Output = bool>>(what: &str, done: impl Fn() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "{what} in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Dead-letters `count` messages of a type no handler knows (one delivery allowed) and
/// returns the dead letters, oldest first.
async fn dead_messages(store: Arc<dyn Store>, count: usize) -> Vec<hexeract::DeadLetter> {
    let store: Arc<dyn Store> = store;
    let before = store.dead_letters(100).await.unwrap().len();
    let envelopes = (0..count)
        .map(|n| Envelope::from_raw("deadletters.Nobody", format!("{{\"n\":{n}}}").into_bytes()))
        .collect();
    store.publish(envelopes).await.unwrap();
    let worker = OutboxWorker::builder_shared(store.clone())
        .registry(Registry::new())
        .max_deliveries(1)
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    wait_until("the messages dead-lettered", || async {
        store.dead_letters(100).await.unwrap().len() == before + count
    })
    .await;
    cancel.cancel();
    running.await.unwrap().unwrap();
    store.dead_letters(100).await.unwrap()
}

async fn deletes_exactly_the_dead_letters_listed(store: Arc<dyn Store>) {
    let letters = dead_messages(store.clone(), 4).await;
    assert_eq!(letters.len(), 4);
    assert_eq!(store.delete_dead_letters(&[]).await.unwrap(), 0);
    let doomed = [letters[0].id, letters[2].id, Uuid::now_v7()];
    assert_eq!(
        store.delete_dead_letters(&doomed).await.unwrap(),
        2,
        "an id with no dead letter is skipped"
    );
    let left: Vec<Uuid> = store
        .dead_letters(100)
        .await
        .unwrap()
        .iter()
        .map(|letter| letter.id)
        .collect();
    assert_eq!(left, [letters[1].id, letters[3].id]);
    assert_eq!(store.delete_dead_letters(&doomed).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deletes_exactly_the_dead_letters_listed() {
    let (schema, store) = pg_store().await;
    deletes_exactly_the_dead_letters_listed(store).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_deletes_exactly_the_dead_letters_listed() {
    let (dir, store) = sqlite_store().await;
    deletes_exactly_the_dead_letters_listed(store).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The job fails (dead letter at once) until the test fixes it.
static FIXED: AtomicBool = AtomicBool::new(false);

/// A run of the job: message id, attempt, fire time, fixed by then.
type Run = (Uuid, u32, Option<DateTime<Utc>>, bool);

static RUNS: Mutex<Vec<Run>> = Mutex::new(Vec::new());

fn runs() -> Vec<Run> {
    RUNS.lock().unwrap().clone()
}

fn nightly_export(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        let fixed = FIXED.load(Ordering::SeqCst);
        RUNS.lock()
            .unwrap()
            .push((ctx.message_id(), ctx.attempt(), ctx.scheduled_for(), fixed));
        if fixed {
            HandlerOutcome::Ack
        } else {
            HandlerOutcome::dead_letter("export_target_down", "the export target is down")
        }
    })
}

/// A dead-lettered run comes back through `replay_occurrence` while the scheduler runs: it
/// runs once more, attempts from 1, with the id and fire time of the run that failed, and the
/// dead letter is gone. Dead letters of messages, and ids of none, are left alone.
async fn a_dead_lettered_run_replayed_runs_again_with_its_fire_time(store: Arc<dyn Store>) {
    let message = dead_messages(store.clone(), 1).await.remove(0);
    // Daily: its own next fire time does not come during the test; one is due now.
    let job = ScheduledJob::new(
        "exports::nightly",
        Spec::Every(Duration::from_secs(86_400)),
        nightly_export,
    );
    let definition = ScheduleDefinition {
        name: job.name().to_owned(),
        spec: job.spec().stored_text(),
    };
    let a_second_ago = |_: &str, now: DateTime<Utc>| now - chrono::Duration::seconds(1);
    store
        .sync_schedules(std::slice::from_ref(&definition), &a_second_ago)
        .await
        .unwrap();
    let worker = SchedulerWorker::builder_shared(store.clone())
        .job(job)
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    wait_until("the run dead-lettered", || async {
        store.dead_letters(100).await.unwrap().len() == 2
    })
    .await;
    let run = store
        .dead_letters(100)
        .await
        .unwrap()
        .into_iter()
        .find(|letter| letter.envelope.message_type == SCHEDULE_MESSAGE_TYPE)
        .expect("the run's dead letter");
    assert_eq!(run.handler.as_deref(), Some("exports::nightly"));
    assert_eq!(
        store.schedule_backlog().await.unwrap(),
        0,
        "nothing pending"
    );
    let failed = runs();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (failed_id, _, failed_fire_time, _) = failed[0];
    assert_eq!(failed_id, run.envelope.id);

    assert!(
        !store.replay_occurrence(message.id).await.unwrap(),
        "a message's dead letter is not a job run"
    );
    assert!(!store.replay_occurrence(Uuid::now_v7()).await.unwrap());
    assert_eq!(store.dead_letters(100).await.unwrap().len(), 2);

    FIXED.store(true, Ordering::SeqCst);
    assert!(store.replay_occurrence(run.id).await.unwrap());
    let left: Vec<Uuid> = store
        .dead_letters(100)
        .await
        .unwrap()
        .iter()
        .map(|letter| letter.id)
        .collect();
    assert_eq!(
        left,
        [message.id],
        "the run left the dead letters, the message stayed"
    );
    assert!(
        !store.replay_occurrence(run.id).await.unwrap(),
        "replayed once"
    );
    wait_until("the replayed run", || async { runs().len() == 2 }).await;
    wait_until("the replayed run settled", || async {
        store.schedule_backlog().await.unwrap() == 0
    })
    .await;
    // Time for a second run to show up, were there one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel.cancel();
    running.await.unwrap().unwrap();
    let runs = runs();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(
        runs[1],
        (run.envelope.id, 1, failed_fire_time, true),
        "the same occurrence and fire time, attempts from 1"
    );
    assert_eq!(failed_fire_time, Some(run.envelope.created_at));
    assert_eq!(store.dead_letters(100).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_dead_lettered_run_replayed_runs_again_with_its_fire_time() {
    let (schema, store) = pg_store().await;
    a_dead_lettered_run_replayed_runs_again_with_its_fire_time(store).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_dead_lettered_run_replayed_runs_again_with_its_fire_time() {
    let (dir, store) = sqlite_store().await;
    a_dead_lettered_run_replayed_runs_again_with_its_fire_time(store).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The queues a broker worker declared, as both stores remember them: recorded, replaced
/// under the same name, listed by name, forgotten.
async fn remembers_declared_queues(store: Arc<dyn Store>) {
    let queue = |name: &str, handler: &str| hexeract::store::DeclaredQueue {
        queue: name.to_owned(),
        handler: handler.to_owned(),
        message_type: "shop.OrderPlaced".to_owned(),
        declared_at: Utc::now(),
    };
    assert!(store.declared_queues().await.unwrap().is_empty());
    store
        .record_declared_queues(&[queue("p.b", "old::b"), queue("p.a", "shop::a")])
        .await
        .unwrap();
    store
        .record_declared_queues(&[queue("p.b", "shop::b")])
        .await
        .unwrap();
    let listed: Vec<(String, String)> = store
        .declared_queues()
        .await
        .unwrap()
        .into_iter()
        .map(|declared| (declared.queue, declared.handler))
        .collect();
    assert_eq!(
        listed,
        [
            ("p.a".to_owned(), "shop::a".to_owned()),
            ("p.b".to_owned(), "shop::b".to_owned())
        ]
    );
    let declared_at = store.declared_queues().await.unwrap()[0].declared_at;
    assert!(
        (Utc::now() - declared_at).num_seconds().abs() < 60,
        "{declared_at}"
    );
    assert!(store.forget_declared_queue("p.a").await.unwrap());
    assert!(!store.forget_declared_queue("p.a").await.unwrap());
    assert_eq!(store.declared_queues().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_remembers_declared_queues() {
    let (schema, store) = pg_store().await;
    remembers_declared_queues(store).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_remembers_declared_queues() {
    let (dir, store) = sqlite_store().await;
    remembers_declared_queues(store).await;
    let _ = std::fs::remove_dir_all(dir);
}
