//! `hexeract::cli`: the operations commands on a service's own store (SQLite here): handlers,
//! migrate, and dead letters listed, shown, replayed (one, or those filters match; then
//! handled), a scheduled job's run replayed (and run again), and purged by filter.
//!
//! Each test sets the environment of its process and shares statics with nobody: these tests
//! rely on nextest's one process per test (the README's test command).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hexeract::cli::{execute, CliError};
use hexeract::store::{DeadLetterStore, ScheduleDefinition, SCHEDULE_MESSAGE_TYPE};
use hexeract::{handler, scheduled, CancellationToken, Context, HandlerOutcome, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "cli.Invoice")]
struct Invoice {
    number: u32,
}

/// Refuses invoices until the test "fixes the bug".
static FIXED: AtomicBool = AtomicBool::new(false);
static HANDLED: AtomicU32 = AtomicU32::new(0);

#[handler(message = "cli.Invoice", name = "billing::book")]
async fn book(invoice: Invoice, _ctx: &Context) -> HandlerOutcome {
    if !FIXED.load(Ordering::SeqCst) {
        return HandlerOutcome::dead_letter(
            "ledger_closed",
            format_args!("invoice {}: the ledger is closed", invoice.number),
        );
    }
    HANDLED.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::Ack
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "cli.Receipt")]
struct Receipt {
    number: u32,
}

static RECEIPT_CALLS: AtomicU32 = AtomicU32::new(0);

/// Never manages.
#[handler(message = "cli.Receipt", name = "archive::file")]
async fn file_receipt(_receipt: Receipt, _ctx: &Context) -> HandlerOutcome {
    RECEIPT_CALLS.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::dead_letter("archive_full", "no room in the archive")
}

/// Refuses to run until the test "fixes" it.
static JOB_FIXED: AtomicBool = AtomicBool::new(false);
/// A run of the job: message id, attempt, fire time, fixed by then.
type JobRun = (uuid::Uuid, u32, Option<DateTime<Utc>>, bool);

static JOB_RUNS: Mutex<Vec<JobRun>> = Mutex::new(Vec::new());

/// Daily: its own fire times do not come during a test (one is made due where needed).
#[scheduled(every = "24h", name = "books::close_day")]
async fn close_day(ctx: &Context) -> HandlerOutcome {
    let fixed = JOB_FIXED.load(Ordering::SeqCst);
    JOB_RUNS
        .lock()
        .unwrap()
        .push((ctx.message_id(), ctx.attempt(), ctx.scheduled_for(), fixed));
    if fixed {
        HandlerOutcome::Ack
    } else {
        HandlerOutcome::dead_letter("books_locked", "the books are locked")
    }
}

/// A fresh SQLite store for this test process, through the environment `run` reads.
fn fresh_environment() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hexeract-cli-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("WORKER_PORT", "0");
    dir
}

/// Waits until `list` with `filters` counts `count` dead letters; returns its output.
async fn listed(filters: &[&str], count: usize) -> String {
    let mut args = vec!["dead-letters", "list"];
    args.extend_from_slice(filters);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listed = run(&args).await.unwrap();
        if listed.ends_with(&format!("\n{count} dead letter(s)\n"))
            || listed == format!("{count} dead letter(s)\n")
        {
            return listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{count} dead letter(s) for {filters:?}: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ids at the start of `list`'s lines.
fn ids(listed: &str) -> Vec<String> {
    listed
        .lines()
        .filter(|line| !line.ends_with("dead letter(s)"))
        .map(|line| line.split_whitespace().next().unwrap().to_owned())
        .collect()
}

async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what} in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run(args: &[&str]) -> Result<String, CliError> {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let mut out = String::new();
    execute(&args, &mut out).await.map(|()| out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_list_handlers_and_list_show_replay_and_purge_dead_letters() {
    let dir = std::env::temp_dir().join(format!("hexeract-cli-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("WORKER_PORT", "0");

    assert!(run(&["migrate"]).await.unwrap().contains("up to date"));
    let handlers = run(&["handlers"]).await.unwrap();
    assert!(
        handlers.contains("billing::book  message cli.Invoice  at tests/tests/cli.rs:"),
        "{handlers}"
    );
    assert!(handlers.contains("scheduled jobs (1)"), "{handlers}");
    assert!(
        handlers.contains("books::close_day  every 86400s  catch-up once  at tests/tests/cli.rs:"),
        "{handlers}"
    );

    let cancel = CancellationToken::new();
    let service = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract::publish(&Invoice { number: 42 }).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let listed = run(&["dead-letters", "list", "--reason", "ledger_closed"])
            .await
            .unwrap();
        if listed.contains("1 dead letter(s)") {
            break listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead-lettered: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(listed.contains("billing::book  ledger_closed"), "{listed}");
    assert!(run(&["dead-letters", "list", "--handler", "someone::else"])
        .await
        .unwrap()
        .contains("0 dead letter(s)"));
    assert!(run(&["dead-letters", "list", "--older-than", "1h"])
        .await
        .unwrap()
        .contains("0 dead letter(s)"));
    let id = listed.split_whitespace().next().unwrap().to_owned();
    let shown = run(&["dead-letters", "show", &id]).await.unwrap();
    assert!(shown.contains("reason:          ledger_closed"), "{shown}");
    assert!(
        shown.contains("invoice 42: the ledger is closed"),
        "{shown}"
    );
    assert!(shown.contains(r#"{"number":42}"#), "payload shown: {shown}");

    FIXED.store(true, Ordering::SeqCst);
    let replayed = run(&["dead-letters", "replay", &id]).await.unwrap();
    assert!(replayed.contains("replayed"), "{replayed}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while HANDLED.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replay was handled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        run(&["dead-letters", "list"])
            .await
            .unwrap()
            .contains("0 dead letter(s)"),
        "a replayed dead letter leaves the list"
    );
    assert!(run(&["dead-letters", "purge", "--all"])
        .await
        .unwrap()
        .contains("purged 0"));

    for bad in [
        &["dead-letters", "show", "not-an-id"][..],
        &["dead-letters", "purge"][..],
        &["dead-letters", "replay"][..],
        &["dead-letters", "list", "--older-than", "soon"][..],
        &["frobnicate"][..],
    ] {
        assert!(matches!(run(bad).await, Err(CliError::Usage(_))), "{bad:?}");
    }
    cancel.cancel();
    service.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// A delivery waiting for a handler that is gone (renamed, say) is listed by `handlers`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_lists_pending_deliveries_that_no_handler_owns() {
    let dir = std::env::temp_dir().join(format!("hexeract-cli-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    let store = hexeract::store::default_store().await.unwrap();
    store
        .publish(vec![
            hexeract::Envelope::new(&Invoice { number: 1 }).unwrap()
        ])
        .await
        .unwrap();
    // Expanded by an older version, whose handler had another name; and by a program that
    // wrote a name with a terminal escape in it, which reaches the operator's terminal only as
    // text.
    let routes = hexeract::store::Routes {
        pairs: vec![
            ("cli.Invoice".to_owned(), "billing::book_v1".to_owned()),
            (
                "cli.Invoice".to_owned(),
                "billing::\u{1b}[2Jbook".to_owned(),
            ),
        ],
    };
    assert_eq!(store.expand(&routes, 10).await.unwrap(), 1);
    let listed = run(&["handlers"]).await.unwrap();
    let (_, pending) = listed
        .split_once("pending deliveries no handler here owns:\n")
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        pending.contains("  billing::book_v1 (renamed or removed?): 1\n"),
        "{listed}"
    );
    assert!(
        pending.contains(r"  billing::\u{1b}[2Jbook (renamed or removed?): 1"),
        "{listed}"
    );
    assert!(!listed.contains("billing::book (renamed"), "{listed}");
    assert!(!listed.contains('\u{1b}'), "{listed:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_only_what_its_filters_match_and_nothing_without_one() {
    let dir = fresh_environment();
    let cancel = CancellationToken::new();
    let service = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract::publish(&Invoice { number: 1 }).await.unwrap();
    hexeract::publish(&Invoice { number: 2 }).await.unwrap();
    hexeract::publish(&Receipt { number: 3 }).await.unwrap();
    let all = ids(&listed(&[], 3).await);

    for refused in [
        &["dead-letters", "purge"][..],
        &["dead-letters", "purge", "--all", "--reason", "archive_full"][..],
        &[
            "dead-letters",
            "purge",
            "--reason",
            "archive_full",
            "--limit",
            "1",
        ][..],
        &["dead-letters", "purge", "--reason"][..],
        // A zero age filters nothing: it would have purged every dead letter.
        &["dead-letters", "purge", "--older-than", "0s"][..],
        &["dead-letters", "purge", "--older-than", "0d"][..],
        &["dead-letters", "replay", "--older-than", "0s"][..],
    ] {
        assert!(
            matches!(run(refused).await, Err(CliError::Usage(_))),
            "{refused:?}"
        );
    }
    assert_eq!(
        ids(&listed(&[], 3).await),
        all,
        "a refused purge deletes nothing"
    );

    let purged = run(&["dead-letters", "purge", "--reason", "archive_full"])
        .await
        .unwrap();
    assert_eq!(purged, "purged 1 dead letter(s)\n");
    let invoices = listed(&[], 2).await;
    assert_eq!(
        invoices.matches("billing::book  ledger_closed").count(),
        2,
        "{invoices}"
    );
    assert_eq!(
        ids(&invoices),
        all[..2],
        "the receipt's dead letter went, the others stayed"
    );

    let purged = run(&[
        "dead-letters",
        "purge",
        "--handler",
        "billing::book",
        "--older-than",
        "1h",
    ])
    .await
    .unwrap();
    assert_eq!(purged, "purged 0 dead letter(s)\n", "too new");
    let purged = run(&["dead-letters", "purge", "--handler", "billing::book"])
        .await
        .unwrap();
    assert_eq!(purged, "purged 2 dead letter(s)\n");
    listed(&[], 0).await;
    assert_eq!(HANDLED.load(Ordering::SeqCst), 0, "purged, not replayed");
    assert_eq!(RECEIPT_CALLS.load(Ordering::SeqCst), 1);

    cancel.cancel();
    service.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_with_a_filter_sends_back_exactly_the_dead_letters_it_matches() {
    let dir = fresh_environment();
    let cancel = CancellationToken::new();
    let service = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract::publish(&Invoice { number: 1 }).await.unwrap();
    hexeract::publish(&Receipt { number: 2 }).await.unwrap();
    hexeract::publish(&Invoice { number: 3 }).await.unwrap();
    let all = ids(&listed(&[], 3).await);
    let invoices = ids(&listed(&["--handler", "billing::book"], 2).await);

    FIXED.store(true, Ordering::SeqCst);
    let none = run(&["dead-letters", "replay", "--reason", "no_such_reason"])
        .await
        .unwrap();
    assert_eq!(none, "replayed 0 dead letter(s)\n");
    let replayed = run(&["dead-letters", "replay", "--handler", "billing::book"])
        .await
        .unwrap();
    let lines: Vec<&str> = replayed.lines().collect();
    assert_eq!(lines.len(), 3, "{replayed}");
    for (line, id) in lines.iter().zip(&invoices) {
        assert!(
            line.starts_with(&format!("replayed {id} (cli.Invoice for billing::book)")),
            "{replayed}"
        );
    }
    assert_eq!(lines[2], "replayed 2 dead letter(s)");
    wait_for("both invoices handled", || {
        HANDLED.load(Ordering::SeqCst) == 2
    })
    .await;
    let left = listed(&[], 1).await;
    assert_eq!(
        ids(&left),
        [all[1].clone()],
        "the receipt's dead letter stayed: {left}"
    );
    // Time for a stray call, were the receipt replayed too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        RECEIPT_CALLS.load(Ordering::SeqCst),
        1,
        "the receipt was not replayed"
    );
    assert_eq!(
        HANDLED.load(Ordering::SeqCst),
        2,
        "each invoice handled once"
    );

    cancel.cancel();
    service.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_run_of_a_scheduled_job_is_replayed_and_the_job_runs_again() {
    let dir = fresh_environment();
    // The job is due a second ago; the scheduler finds its schedule as written here.
    let store = hexeract::store::default_store().await.unwrap();
    let job = hexeract::schedule::jobs_from_inventory()
        .unwrap()
        .into_iter()
        .find(|job| job.name() == "books::close_day")
        .unwrap();
    let definition = ScheduleDefinition {
        name: job.name().to_owned(),
        spec: job.spec().stored_text(),
    };
    let a_second_ago = |_: &str, now: DateTime<Utc>| now - chrono::Duration::seconds(1);
    store
        .sync_schedules(std::slice::from_ref(&definition), &a_second_ago)
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let service = tokio::spawn(hexeract::run(cancel.clone()));
    let listed_run = listed(&["--handler", "books::close_day"], 1).await;
    assert!(listed_run.contains("books_locked"), "{listed_run}");
    let run_id = ids(&listed_run).remove(0);
    let letter = store
        .dead_letters(10)
        .await
        .unwrap()
        .into_iter()
        .find(|letter| letter.id.to_string() == run_id)
        .unwrap();
    assert_eq!(letter.envelope.message_type, SCHEDULE_MESSAGE_TYPE);

    // A run of a job this program does not have (renamed since): refused, by id or in a batch.
    let gone = uuid::Uuid::now_v7();
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", dir.join("outbox.db").display()))
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO hexeract_dead_letters
             (id, message_id, handler, reason, detail, attempts, dead_lettered_at, message_type,
              payload, headers, created_at)
         VALUES (?1, ?2, 'books::close_month', 'books_locked', 'locked', 1, ?3, ?4, X'7B7D', '{}',
                 '2026-01-31T00:00:00.000Z')",
    )
    .bind(gone.to_string())
    .bind(uuid::Uuid::now_v7().to_string())
    .bind(Utc::now().timestamp_millis())
    .bind(SCHEDULE_MESSAGE_TYPE)
    .execute(&pool)
    .await
    .unwrap();
    // And a message for a handler that is gone: replayed, it would wait for nobody.
    let orphan = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO hexeract_dead_letters
             (id, message_id, handler, reason, detail, attempts, dead_lettered_at, message_type,
              payload, headers, created_at)
         VALUES (?1, ?2, 'billing::gone', 'orphaned', 'x', 1, ?3, 'cli.Gone', X'7B7D', '{}',
                 '2026-01-31T00:00:00.000Z')",
    )
    .bind(orphan.to_string())
    .bind(uuid::Uuid::now_v7().to_string())
    .bind(Utc::now().timestamp_millis())
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    match run(&["dead-letters", "replay", &orphan.to_string()]).await {
        Err(CliError::Failed(error)) => {
            let problem = error.to_string();
            assert!(
                problem.contains("\"billing::gone\"") && problem.contains("does not have"),
                "{problem}"
            );
        }
        other => panic!("replaying a letter of a handler that is gone: {other:?}"),
    }
    run(&["dead-letters", "purge", "--reason", "orphaned"])
        .await
        .unwrap();
    for refused in [
        vec!["dead-letters", "replay", &gone.to_string()],
        vec!["dead-letters", "replay", "--all"],
        vec!["dead-letters", "replay", "--reason", "books_locked"],
    ] {
        let args: Vec<&str> = refused.iter().map(|arg| &**arg).collect();
        match run(&args).await {
            Err(CliError::Failed(error)) => {
                let problem = error.to_string();
                assert!(problem.contains("\"books::close_month\""), "{problem}");
                assert!(problem.contains("does not have"), "{problem}");
            }
            other => panic!("{refused:?}: {other:?}"),
        }
    }
    listed(&["--reason", "books_locked"], 2).await;
    assert_eq!(
        JOB_RUNS.lock().unwrap().len(),
        1,
        "a refused batch replays nothing"
    );

    JOB_FIXED.store(true, Ordering::SeqCst);
    let replayed = run(&["dead-letters", "replay", &run_id]).await.unwrap();
    assert!(
        replayed.starts_with(&format!(
            "replayed {run_id} (the run of the scheduled job books::close_day for "
        )),
        "{replayed}"
    );
    wait_for("the job ran again", || JOB_RUNS.lock().unwrap().len() == 2).await;
    let runs = JOB_RUNS.lock().unwrap().clone();
    assert_eq!(
        runs[0].0, letter.envelope.id,
        "the run that was dead-lettered"
    );
    assert_eq!(
        runs[1],
        (letter.envelope.id, 1, runs[0].2, true),
        "the same occurrence and fire time again, attempts from 1"
    );
    assert_eq!(runs[1].2, Some(letter.envelope.created_at));
    listed(&["--handler", "books::close_day"], 0).await;
    let purged = run(&["dead-letters", "purge", "--handler", "books::close_month"])
        .await
        .unwrap();
    assert_eq!(purged, "purged 1 dead letter(s)\n");
    listed(&[], 0).await;

    cancel.cancel();
    service.await.unwrap().unwrap();
    assert_eq!(
        JOB_RUNS.lock().unwrap().len(),
        2,
        "ran once after the replay"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Filters and pages are the database's: letters past the first 100 000 are found by `show`,
/// matched by `list`'s filters and purged (the commands used to read the oldest 100 000 and
/// filter them in memory, so these were out of their sight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn letters_past_the_first_hundred_thousand_are_shown_listed_and_purged() {
    let dir = fresh_environment();
    // Migrates the file the commands open.
    run(&["migrate"]).await.unwrap();
    let store = hexeract::store::sqlite::SqliteStore::open(dir.join("outbox.db"))
        .await
        .unwrap();
    // 100 000 old letters of `billing::book`, written in one statement.
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
         INSERT INTO hexeract_dead_letters
             (id, message_id, handler, reason, detail, attempts, dead_lettered_at,
              message_type, payload, headers, created_at)
         SELECT printf('00000000-0000-7000-8000-%012d', i),
                printf('00000000-0000-7000-9000-%012d', i),
                'billing::book', 'ledger_closed', 'old', 1, 1000000 + i,
                'cli.Invoice', X'7B7D', '{}', '2020-01-01T00:00:00+00:00'
         FROM n",
    )
    .execute(store.pool())
    .await
    .unwrap();
    // Two newer ones of `archive::file`.
    let mut newest = Vec::new();
    for number in [1, 2] {
        let envelope = hexeract::Envelope::new(&Receipt { number }).unwrap();
        let letter = hexeract::DeadLetter::new(
            envelope,
            Some("archive::file".to_owned()),
            hexeract::Reason::from("archive_full"),
            &format!("receipt {number}: no room in the archive"),
        );
        store.insert_dead_letter(&letter).await.unwrap();
        newest.push(letter.id.to_string());
    }

    let shown = run(&["dead-letters", "show", &newest[1]]).await.unwrap();
    assert!(
        shown.contains("receipt 2: no room in the archive"),
        "{shown}"
    );
    let listed = run(&["dead-letters", "list", "--handler", "archive::file"])
        .await
        .unwrap();
    assert_eq!(ids(&listed), newest, "{listed}");
    assert!(listed.ends_with("\n2 dead letter(s)\n"), "{listed}");
    let latest = run(&["dead-letters", "list", "--limit", "1"])
        .await
        .unwrap();
    assert_eq!(ids(&latest), [newest[1].clone()], "{latest}");
    assert!(latest.ends_with("\n100002 dead letter(s)\n"), "{latest}");
    let purged = run(&["dead-letters", "purge", "--handler", "archive::file"])
        .await
        .unwrap();
    assert_eq!(purged, "purged 2 dead letter(s)\n");
    let purged = run(&["dead-letters", "purge", "--reason", "ledger_closed"])
        .await
        .unwrap();
    assert_eq!(purged, "purged 100000 dead letter(s)\n");
    assert!(store.dead_letters(10).await.unwrap().is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

/// What a dead letter carries (message type, handler, reason, detail, headers, payload) reaches
/// the operator's terminal escaped: no raw escape sequence or bidirectional override, the text
/// itself readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_print_control_characters_as_escapes() {
    let dir = fresh_environment();
    let store = hexeract::store::default_store().await.unwrap();
    let mut envelope = hexeract::Envelope::from_raw(
        "cli.Invoice\x1b[2J",
        "{\"number\":42}\x1b[2J\x1b]0;owned\x07\n\u{202e}txt.exe"
            .as_bytes()
            .to_vec(),
    );
    envelope.headers.insert(
        "x-note\x1b[2J".to_owned(),
        "hello\x1b[2J\u{202e}".to_owned(),
    );
    let letter = hexeract::DeadLetter::new(
        envelope,
        Some("billing::book\x1b[2J".to_owned()),
        hexeract::Reason::from("ledger_closed\x1b[2J".to_owned()),
        "the ledger\x1b[2J is closed\r\nfor good",
    );
    store.insert_dead_letter(&letter).await.unwrap();
    let id = letter.id.to_string();

    let listed = listed(&[], 1).await;
    let shown = run(&["dead-letters", "show", &id]).await.unwrap();
    for out in [&listed, &shown] {
        assert!(!out.contains('\x1b'), "a raw ESC: {out:?}");
        assert!(!out.contains('\x07'), "a raw BEL: {out:?}");
        assert!(!out.contains('\r'), "a raw carriage return: {out:?}");
        assert!(!out.contains('\u{202e}'), "a raw bidi override: {out:?}");
        assert!(out.contains(r"cli.Invoice\u{1b}[2J"), "{out}");
        assert!(out.contains(r"billing::book\u{1b}[2J"), "{out}");
        assert!(out.contains(r"ledger_closed\u{1b}[2J"), "{out}");
        assert!(out.contains(r"the ledger\u{1b}[2J is closed"), "{out}");
    }
    assert!(
        shown.contains(r"header x-note\u{1b}[2J: hello\u{1b}[2J\u{202e}"),
        "{shown}"
    );
    assert!(
        shown.contains(r"the ledger\u{1b}[2J is closed\r\nfor good"),
        "{shown}"
    );
    assert!(
        shown.contains("{\"number\":42}\\u{1b}[2J\\u{1b}]0;owned\\u{7}\n\\u{202e}txt.exe"),
        "the payload keeps its lines: {shown}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Without `AMQP_URL` or `KAFKA_BROKERS`, `replay` puts messages in the store's deliveries. A
/// service on a broker never reads those: its dead letters are refused (naming the variable to
/// set) and stay, unless the operator says `--to-store`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_without_a_broker_refuses_the_dead_letters_of_a_service_on_one() {
    use hexeract::store::DeclaredQueue;

    let dir = fresh_environment();
    let store = hexeract::store::default_store().await.unwrap();
    let dead = |number: u32| {
        hexeract::DeadLetter::new(
            hexeract::Envelope::new(&Invoice { number }).unwrap(),
            Some("billing::book".to_owned()),
            hexeract::Reason::from("ledger_closed"),
            "closed",
        )
    };
    let failed = |result: Result<String, CliError>| match result {
        Err(CliError::Failed(error)) => error.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    };
    // Parked by a RabbitMQ or Kafka consumer: a name-based id.
    let mut parked = dead(1);
    parked.id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, b"dead-letter/shop.billing.book");
    store.insert_dead_letter(&parked).await.unwrap();
    let parked_id = parked.id.to_string();
    for args in [
        &["dead-letters", "replay", &parked_id][..],
        &["dead-letters", "replay", "--all"][..],
        &["dead-letters", "replay", "--handler", "billing::book"][..],
    ] {
        let refused = failed(run(args).await);
        for named in ["AMQP_URL", "KAFKA_BROKERS", "--to-store"] {
            assert!(refused.contains(named), "{args:?}: {refused}");
        }
    }
    listed(&[], 1).await;
    assert_eq!(
        store.backlog().await.unwrap(),
        0,
        "nothing went to the store"
    );

    // The store remembers queues its service declared on RabbitMQ: its own letters too.
    store
        .record_declared_queues(&[DeclaredQueue {
            queue: "shop.billing.book".to_owned(),
            handler: "billing::book".to_owned(),
            message_type: "cli.Invoice".to_owned(),
            declared_at: Utc::now(),
        }])
        .await
        .unwrap();
    let ours = dead(2);
    store.insert_dead_letter(&ours).await.unwrap();
    let refused = failed(run(&["dead-letters", "replay", &ours.id.to_string()]).await);
    assert!(
        refused.contains("AMQP_URL") && refused.contains("RabbitMQ"),
        "{refused}"
    );
    listed(&[], 2).await;
    assert_eq!(store.backlog().await.unwrap(), 0);

    // The operator's word.
    let replayed = run(&["dead-letters", "replay", "--all", "--to-store"])
        .await
        .unwrap();
    assert!(
        replayed.ends_with("replayed 2 dead letter(s)\n"),
        "{replayed}"
    );
    listed(&[], 0).await;
    assert_eq!(store.backlog().await.unwrap(), 2);
    let _ = std::fs::remove_dir_all(dir);
}

/// Under `KAFKA_BROKERS` a letter goes back through the outbox, for its handler alone: it
/// leaves the dead letters in the transaction that writes its outbox row (which the service's
/// relay publishes), so nothing is contacted here and nothing is lost between the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_under_kafka_moves_the_letter_into_the_outbox_in_one_step() {
    let dir = fresh_environment();
    // Nothing listens there: the replay writes to the store only.
    std::env::set_var("KAFKA_BROKERS", "127.0.0.1:1");
    let store = hexeract::store::default_store().await.unwrap();
    let mut parked = hexeract::DeadLetter::new(
        hexeract::Envelope::new(&Invoice { number: 9 }).unwrap(),
        Some("billing::book".to_owned()),
        hexeract::Reason::from("ledger_closed"),
        "closed",
    );
    // As a Kafka consumer names its letters.
    parked.id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, b"dead-letter/billing/0/7");
    store.insert_dead_letter(&parked).await.unwrap();

    let replayed = run(&["dead-letters", "replay", &parked.id.to_string()])
        .await
        .unwrap();
    assert!(
        replayed.contains("through the outbox to its Kafka topic, for billing::book"),
        "{replayed}"
    );
    listed(&[], 0).await;
    assert_eq!(store.backlog().await.unwrap(), 1, "its outbox row");
    let again = run(&["dead-letters", "replay", &parked.id.to_string()]).await;
    assert!(
        matches!(again, Err(CliError::Usage(_))),
        "replayed once: {again:?}"
    );
    assert_eq!(store.backlog().await.unwrap(), 1, "not written twice");
    let _ = std::fs::remove_dir_all(dir);
}
