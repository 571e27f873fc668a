//! `hexeract::run` on SQLite passes the worker knobs of the environment to its workers:
//! `MAX_PAYLOAD_BYTES` and `DELIVERY_LEASE_MS` to the outbox worker, `SCHEDULER_LEASE_MS`,
//! `SCHEDULER_DISPATCH_TIMEOUT_MS` and `SHUTDOWN_GRACE_MS` to the scheduler. Each is set to a
//! value the library default would not show; the leases show by being refused when they do
//! not cover the longest call and the room to settle it.
//!
//! In a test binary of its own: `run` reads the process environment and runs every handler and
//! job of the binary; nextest runs each test in a process of its own.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use hexeract::{handler, scheduled, CancellationToken, Context, DeadLetter, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "knobs.Bulky")]
struct Bulky {
    filler: String,
}

static BULKY_CALLS: AtomicU32 = AtomicU32::new(0);

#[handler(message = "knobs.Bulky", name = "knobs::bulky")]
async fn bulky(_message: Bulky, _ctx: &Context) -> Result<(), String> {
    BULKY_CALLS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Takes longer than `SCHEDULER_DISPATCH_TIMEOUT_MS`, far less than the 30 s default.
#[scheduled(every = "1s", name = "knobs.overrun", catch_up = "none")]
async fn overrun(_ctx: &Context) -> Result<(), String> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

static STUCK_STARTED: AtomicBool = AtomicBool::new(false);

/// Its first run never ends on its own and ignores the cancellation: only the end of the
/// shutdown grace stops it. Its own timeout is the longest of the jobs': the scheduler's lease
/// must cover it.
#[scheduled(every = "1s", name = "knobs.stuck", catch_up = "none", timeout = "50s")]
async fn stuck(_ctx: &Context) -> Result<(), String> {
    if STUCK_STARTED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    tokio::time::sleep(Duration::from_secs(600)).await;
    Ok(())
}

async fn wait_for_dead_letter(
    store: &dyn hexeract::store::Store,
    found: impl Fn(&DeadLetter) -> bool,
    what: &str,
) -> DeadLetter {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let letters = store.dead_letters(100).await.unwrap();
        if let Some(letter) = letters.into_iter().find(|letter| found(letter)) {
            return letter;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dead letter {what} within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_gives_the_outbox_worker_and_the_scheduler_their_variables() {
    let logs = hexeract_tests::logs::Captured::install("hexeract=warn");
    let dir = std::env::temp_dir().join(format!("hexeract-run-knobs-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    // Other suites export these for their own services; with them `run` would use PostgreSQL
    // or refuse to start.
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    for (variable, value) in [
        (
            "HEXERACT_SQLITE_PATH",
            dir.join("outbox.db").to_str().unwrap(),
        ),
        ("WORKER_PORT", "0"),
        ("RELAY_POLL_INTERVAL_MS", "50"),
        ("CONSUMER_POLL_INTERVAL_MS", "50"),
        ("MAX_DELIVERIES", "1"),
        ("MAX_PAYLOAD_BYTES", "64"),
        ("DELIVERY_LEASE_MS", "40000"),
        ("SCHEDULER_POLL_INTERVAL_MS", "50"),
        ("SCHEDULER_DISPATCH_TIMEOUT_MS", "100"),
        ("SCHEDULER_LEASE_MS", "55000"),
        ("SHUTDOWN_GRACE_MS", "0"),
    ] {
        std::env::set_var(variable, value);
    }

    let cancel = CancellationToken::new();
    let running = tokio::spawn(hexeract::run(cancel.clone()));
    // MAX_PAYLOAD_BYTES: `publish` refuses a payload over 64 bytes, writing nothing.
    let bulky = Bulky {
        filler: "x".repeat(200),
    };
    let refused = hexeract::publish(&bulky).await.unwrap_err().to_string();
    assert!(refused.contains("MAX_PAYLOAD_BYTES (64)"), "{refused}");
    let store = hexeract::store::default_store().await.unwrap();
    // Such a row, written by another program, is still not handed to a handler.
    let pool = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new().filename(dir.join("outbox.db")),
    )
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO hexeract_outbox (id, message_type, payload, headers) \
         VALUES (?1, 'knobs.Bulky', ?2, '{}')",
    )
    .bind(uuid::Uuid::now_v7().hyphenated().to_string())
    .bind(serde_json::to_vec(&bulky).unwrap())
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    // MAX_PAYLOAD_BYTES: the outbox worker does not decode a payload over 64 bytes.
    let too_large = wait_for_dead_letter(
        &*store,
        |letter| letter.envelope.message_type == "knobs.Bulky",
        "of knobs.Bulky",
    )
    .await;
    assert_eq!(too_large.reason.as_str(), "payload_too_large");
    assert_eq!(BULKY_CALLS.load(Ordering::SeqCst), 0, "never handed over");

    // SCHEDULER_DISPATCH_TIMEOUT_MS: a run of 2 s is over its 100 ms (with MAX_DELIVERIES, one
    // failed run is a dead letter).
    let overran = wait_for_dead_letter(
        &*store,
        |letter| letter.handler.as_deref() == Some("knobs.overrun"),
        "of knobs.overrun",
    )
    .await;
    assert_eq!(overran.reason.as_str(), "handler_timeout");

    // The leases cover the longest calls (30 s and 50 s) and 5 s to settle: nothing warns.
    let text = logs.text();
    assert!(!text.contains("lease"), "{text}");

    // SHUTDOWN_GRACE_MS: a job that ignores the cancellation is interrupted at once, not
    // after the default 8 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !STUCK_STARTED.load(Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "knobs.stuck did not start within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopping = tokio::time::Instant::now();
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("run returns after the cancel")
        .unwrap()
        .unwrap();
    let took = stopping.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "run took {took:?} to stop: the scheduler waited for its job"
    );
    drop(store);
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs `run` with the outbox on a fresh SQLite file and `variables` set; returns its error.
async fn run_refused(variables: &[(&str, &str)]) -> String {
    let dir = std::env::temp_dir().join(format!("hexeract-run-knobs-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("WORKER_PORT", "0");
    for (variable, value) in variables {
        std::env::set_var(variable, value);
    }
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        hexeract::run(CancellationToken::new()),
    )
    .await
    .expect("run returns at once")
    .expect_err("run refuses to start");
    std::fs::remove_dir_all(&dir).ok();
    refused.to_string()
}

/// `DELIVERY_LEASE_MS` under the handler timeout and 5 s to settle: nothing starts, and the
/// error names the variable, the lease given and the least it may be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_a_delivery_lease_that_does_not_cover_a_call_and_its_settle() {
    let refused = run_refused(&[("DELIVERY_LEASE_MS", "1500")]).await;
    for part in [
        "DELIVERY_LEASE_MS",
        "\"1.5s\"",
        "at least 35s",
        "handler_timeout",
    ] {
        assert!(refused.contains(part), "{part:?} not in: {refused}");
    }
}

/// `SCHEDULER_LEASE_MS` under the longest job's own timeout (50 s) and 5 s to settle: the
/// error names that job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_a_scheduler_lease_under_a_jobs_own_timeout() {
    let refused = run_refused(&[("SCHEDULER_LEASE_MS", "45000")]).await;
    for part in [
        "SCHEDULER_LEASE_MS",
        "\"45s\"",
        "at least 55s",
        "the timeout of \"knobs.stuck\"",
    ] {
        assert!(refused.contains(part), "{part:?} not in: {refused}");
    }
}
