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
use hexeract::store::{DeadLetterFilter, Page, Store};
use hexeract::store::{DeliveryStore, ScheduleDefinition, SCHEDULE_MESSAGE_TYPE};
use hexeract::{CancellationToken, Context, Envelope, HandlerOutcome, Registry};
use uuid::Uuid;

async fn pg_store() -> (hexeract_tests::pg::TestSchema, Arc<dyn Store>) {
    let schema = hexeract_tests::pg::TestSchema::new("hexeract-tests-dead-letters").await;
    let store = schema.migrated_store().await;
    (schema, Arc::new(store))
}

async fn sqlite_store() -> (std::path::PathBuf, Arc<dyn Store>) {
    let (dir, store) = sqlite_file().await;
    (dir, Arc::new(store))
}

/// A migrated SQLite store in a directory of its own.
async fn sqlite_file() -> (std::path::PathBuf, hexeract::store::sqlite::SqliteStore) {
    let dir = std::env::temp_dir().join(format!("hexeract-dead-letters-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = hexeract::store::sqlite::SqliteStore::open(dir.join("outbox.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    (dir, store)
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

/// A relay's sink that acknowledges what it takes, or refuses it all.
#[derive(Default)]
struct Sink {
    refuse: bool,
    taken: Mutex<Vec<Envelope>>,
}

impl hexeract::store::RelaySink for Sink {
    fn publish<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<Vec<hexeract::store::Unpublishable>, String>> {
        Box::pin(async move {
            if self.refuse {
                return Err("the broker did not acknowledge it".to_owned());
            }
            self.taken.lock().unwrap().extend_from_slice(envelopes);
            Ok(Vec::new())
        })
    }
}

/// `dead-letters replay` through a relay (Kafka): the letter leaves in the transaction that
/// puts its message (changed for its way back) in the outbox, and the outbox row leaves only
/// once the broker acknowledged it. Never both gone, never both there.
async fn a_letter_replayed_through_the_outbox_leaves_with_its_message_there(store: Arc<dyn Store>) {
    let letters = dead_messages(store.clone(), 2).await;
    assert_eq!(store.backlog().await.unwrap(), 0);
    let mut envelope = letters[0].envelope.clone();
    envelope.attempt = 0;
    envelope
        .headers
        .insert("hexeract-replay-for".to_owned(), "billing::book".to_owned());

    assert!(
        !store
            .replay_dead_letter_as(Uuid::now_v7(), &envelope)
            .await
            .unwrap(),
        "no such dead letter"
    );
    assert_eq!(store.backlog().await.unwrap(), 0, "nothing written for it");
    assert!(store
        .replay_dead_letter_as(letters[0].id, &envelope)
        .await
        .unwrap());
    assert_eq!(store.backlog().await.unwrap(), 1);
    assert!(
        !store
            .replay_dead_letter_as(letters[0].id, &envelope)
            .await
            .unwrap(),
        "a second replay of the same letter finds it gone and writes nothing"
    );
    assert_eq!(store.backlog().await.unwrap(), 1);
    let left: Vec<Uuid> = store
        .dead_letters(100)
        .await
        .unwrap()
        .iter()
        .map(|letter| letter.id)
        .collect();
    assert_eq!(left, [letters[1].id]);

    let refusing = Sink {
        refuse: true,
        ..Sink::default()
    };
    let _ = store.relay(10, &refusing).await;
    assert_eq!(
        store.backlog().await.unwrap(),
        1,
        "not acknowledged: the message stays"
    );
    let sink = Sink::default();
    assert_eq!(store.relay(10, &sink).await.unwrap(), 1);
    assert_eq!(store.backlog().await.unwrap(), 0);
    let taken = sink.taken.lock().unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].id, letters[0].envelope.id);
    assert_eq!(taken[0].payload, letters[0].envelope.payload);
    assert_eq!(
        taken[0]
            .headers
            .get("hexeract-replay-for")
            .map(String::as_str),
        Some("billing::book")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_letter_replayed_through_the_outbox_leaves_with_its_message_there() {
    let (schema, store) = pg_store().await;
    a_letter_replayed_through_the_outbox_leaves_with_its_message_there(store).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_letter_replayed_through_the_outbox_leaves_with_its_message_there() {
    let (dir, store) = sqlite_store().await;
    a_letter_replayed_through_the_outbox_leaves_with_its_message_there(store).await;
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

/// How a test sends a dead-lettered run back.
#[derive(Clone, Copy)]
enum Replay {
    /// `ScheduleStore::replay_occurrence`, which knows it is a run.
    Occurrence,
    /// `DeadLetterStore::replay_dead_letter`, the one call for any dead letter.
    DeadLetter,
}

/// A dead-lettered run comes back through `replay_occurrence` (or `replay_dead_letter`, which
/// sends a run to the scheduler too) while the scheduler runs: it runs once more, attempts
/// from 1, with the id and fire time of the run that failed, and the dead letter is gone. Dead
/// letters of messages, and ids of none, are left alone.
async fn a_dead_lettered_run_replayed_runs_again_with_its_fire_time(
    store: Arc<dyn Store>,
    through: Replay,
) {
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
    let replayed = match through {
        Replay::Occurrence => store.replay_occurrence(run.id).await,
        Replay::DeadLetter => store.replay_dead_letter(run.id).await,
    };
    assert!(replayed.unwrap());
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
    a_dead_lettered_run_replayed_runs_again_with_its_fire_time(store, Replay::Occurrence).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_dead_lettered_run_replayed_as_any_dead_letter_runs_again_as_its_job() {
    let (schema, store) = pg_store().await;
    a_dead_lettered_run_replayed_runs_again_with_its_fire_time(store, Replay::DeadLetter).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_dead_lettered_run_replayed_runs_again_with_its_fire_time() {
    let (dir, store) = sqlite_store().await;
    a_dead_lettered_run_replayed_runs_again_with_its_fire_time(store, Replay::Occurrence).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_dead_lettered_run_replayed_as_any_dead_letter_runs_again_as_its_job() {
    let (dir, store) = sqlite_store().await;
    a_dead_lettered_run_replayed_runs_again_with_its_fire_time(store, Replay::DeadLetter).await;
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

/// 30 letters, one second apart from 2020-01-01: handlers `a` and `b` in turn, reason
/// `first` on every third and `second` on the rest. Returns them oldest first.
async fn thirty_letters(store: &dyn Store) -> Vec<hexeract::DeadLetter> {
    let start = DateTime::parse_from_rfc3339("2020-01-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    let mut letters = Vec::new();
    for n in 0..30_i64 {
        let envelope =
            Envelope::from_raw("deadletters.Paged", format!("{{\"n\":{n}}}").into_bytes());
        let reason = if n % 3 == 0 { "first" } else { "second" };
        let mut letter = hexeract::DeadLetter::new(
            envelope,
            Some(if n % 2 == 0 { "a" } else { "b" }.to_owned()),
            hexeract::Reason::from(reason.to_owned()),
            &format!("letter {n}"),
        );
        letter.dead_lettered_at = start + chrono::Duration::seconds(n);
        store.insert_dead_letter(&letter).await.unwrap();
        letters.push(letter);
    }
    letters
}

/// Every page of `filter`, `size` letters at a time, in the pages' order.
async fn all_pages(
    store: &dyn Store,
    filter: &DeadLetterFilter,
    first: Page,
) -> (Vec<Uuid>, usize) {
    let size = first.limit as usize;
    let (mut ids, mut pages, mut page) = (Vec::new(), 0, first);
    loop {
        let letters = store.dead_letters_matching(filter, &page).await.unwrap();
        pages += 1;
        assert!(letters.len() <= size, "a page holds at most its limit");
        ids.extend(letters.iter().map(|letter| letter.id));
        match letters.last() {
            Some(last) if letters.len() == size => page = page.after(last),
            _ => return (ids, pages),
        }
    }
}

async fn dead_letters_are_filtered_counted_paged_and_purged_by_the_database(store: &dyn Store) {
    let letters = thirty_letters(store).await;
    let middle = letters[15].dead_lettered_at;
    let filters = [
        DeadLetterFilter::default(),
        DeadLetterFilter::default().handler("a"),
        DeadLetterFilter::default().reason("first"),
        DeadLetterFilter::default().before(middle),
        DeadLetterFilter::default()
            .handler("b")
            .reason("second")
            .before(middle),
        DeadLetterFilter::default().handler("nobody"),
    ];
    for filter in &filters {
        let expected: Vec<Uuid> = letters
            .iter()
            .filter(|letter| filter.matches(letter))
            .map(|letter| letter.id)
            .collect();
        assert_eq!(
            store.count_dead_letters(filter).await.unwrap(),
            expected.len() as u64,
            "{filter:?}"
        );
        let (oldest_first, pages) = all_pages(store, filter, Page::oldest_first(4)).await;
        assert_eq!(
            oldest_first, expected,
            "oldest first, pages of 4: {filter:?}"
        );
        assert_eq!(pages, expected.len() / 4 + 1, "{filter:?}");
        let (newest_first, _) = all_pages(store, filter, Page::newest_first(4)).await;
        let mut reversed = expected.clone();
        reversed.reverse();
        assert_eq!(
            newest_first, reversed,
            "newest first, pages of 4: {filter:?}"
        );
    }
    // The counts the filters imply, so that the oracle above is not the only judge.
    assert_eq!(
        store
            .count_dead_letters(&DeadLetterFilter::default().handler("a"))
            .await
            .unwrap(),
        15
    );
    assert_eq!(
        store
            .count_dead_letters(&DeadLetterFilter::default().reason("first"))
            .await
            .unwrap(),
        10
    );
    assert_eq!(
        store
            .count_dead_letters(&DeadLetterFilter::default().before(middle))
            .await
            .unwrap(),
        15
    );

    let found = store
        .find_dead_letter(letters[29].id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.detail, "letter 29");
    assert_eq!(found.handler.as_deref(), Some("b"));
    assert!(store
        .find_dead_letter(Uuid::now_v7())
        .await
        .unwrap()
        .is_none());

    // b's `second` letters before the middle: n = 1, 5, 7, 11, 13.
    let purge = DeadLetterFilter::default()
        .handler("b")
        .reason("second")
        .before(middle);
    assert_eq!(store.purge_dead_letters_matching(&purge).await.unwrap(), 5);
    assert_eq!(store.count_dead_letters(&purge).await.unwrap(), 0);
    assert_eq!(
        store
            .count_dead_letters(&DeadLetterFilter::default())
            .await
            .unwrap(),
        25
    );
    assert_eq!(store.purge_dead_letters().await.unwrap(), 25);
}

#[tokio::test]
async fn postgres_dead_letters_are_filtered_counted_paged_and_purged_by_the_database() {
    let (schema, store) = pg_store().await;
    dead_letters_are_filtered_counted_paged_and_purged_by_the_database(&*store).await;
    schema.drop_schema().await;
}

#[tokio::test]
async fn sqlite_dead_letters_are_filtered_counted_paged_and_purged_by_the_database() {
    let (dir, store) = sqlite_store().await;
    dead_letters_are_filtered_counted_paged_and_purged_by_the_database(&*store).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The filters each have an index: PostgreSQL takes it for a query by handler or by reason
/// once a sequential scan is ruled out (on a small table it would rather scan), and SQLite
/// takes it outright.
#[tokio::test]
async fn a_filter_by_handler_or_by_reason_has_an_index_on_both_stores() {
    let (schema, _store) = pg_store().await;
    let mut conn = schema.pool.acquire().await.unwrap();
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut *conn)
        .await
        .unwrap();
    for (column, index) in [
        ("handler", "dead_letters_by_handler"),
        ("reason", "dead_letters_by_reason"),
    ] {
        let plan: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN SELECT * FROM \"{}\".dead_letters WHERE {column} = $1
             ORDER BY dead_lettered_at, id LIMIT 1000",
            schema.schema
        ))
        .bind("x")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        assert!(
            plan.iter().any(|line| line.contains(index)),
            "{column}: {plan:#?}"
        );
    }
    drop(conn);
    schema.drop_schema().await;

    let (dir, store) = sqlite_file().await;
    for (column, index) in [
        ("handler", "hexeract_dead_letters_by_handler"),
        ("reason", "hexeract_dead_letters_by_reason"),
    ] {
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(&format!(
            "EXPLAIN QUERY PLAN SELECT * FROM \"hexeract_dead_letters\" WHERE {column} = ?1
             ORDER BY dead_lettered_at, id LIMIT 1000"
        ))
        .bind("x")
        .fetch_all(store.pool())
        .await
        .unwrap();
        assert!(
            plan.iter().any(|(.., detail)| detail.contains(index)),
            "{column}: {plan:?}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
