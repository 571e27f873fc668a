//! The testing toolkit on tokio's paused clock (`#[tokio::test(start_paused = true)]`), as
//! docs/testing.md ("Time") says: a handler's timeout, a job's timeout and the retry backoff of
//! the in-memory world elapse on the test's clock, not the wall's, so a test of a 30-second
//! deadline or of a retry a minute later takes no time.
//!
//! Each test reads both clocks: tokio's (paused, advanced by the runtime when nothing else can
//! run) must show the whole wait, and the wall clock less than that wait, which it could not
//! be if the toolkit slept on a clock of its own.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hexeract::testing::Harness;
use hexeract::{
    handler, scheduled, CancellationToken, Context, HandlerOutcome, InMemoryStore, MemoryWorker,
    Message, Reason,
};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "paused.ReportRequested")]
struct ReportRequested {
    report_id: u64,
}

/// Waits for an hour, far past its 30-second timeout.
#[handler(
    message = "paused.ReportRequested",
    name = "paused.render",
    timeout = "30s"
)]
async fn render(_request: ReportRequested, ctx: &Context) -> Result<(), String> {
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(3_600)) => Ok(()),
        () = ctx.cancellation().cancelled() => Err("given up".to_owned()),
    }
}

/// A job that waits for an hour, past its 2-minute timeout.
#[scheduled(every = "1h", name = "paused.nightly_export", timeout = "2m")]
async fn nightly_export(_ctx: &Context) -> Result<(), String> {
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_handler_timeout_elapses_on_the_paused_clock() {
    let harness = Harness::new().unwrap();
    let (paused, wall) = (tokio::time::Instant::now(), std::time::Instant::now());
    let deliveries = harness
        .deliver(&ReportRequested { report_id: 7 })
        .await
        .unwrap();
    assert!(
        matches!(
            deliveries.outcome("paused.render"),
            Some(HandlerOutcome::Retry { reason, .. }) if *reason == Reason::HANDLER_TIMEOUT
        ),
        "{:?}",
        deliveries.outcome("paused.render")
    );
    let waited = paused.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "the paused clock moved {waited:?}, not the handler's 30 s timeout"
    );
    assert!(
        wall.elapsed() < Duration::from_secs(30),
        "the wall clock moved {:?}: the timeout did not run on the paused clock",
        wall.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_timeout_elapses_on_the_paused_clock() {
    let harness = Harness::new().unwrap();
    let (paused, wall) = (tokio::time::Instant::now(), std::time::Instant::now());
    let outcome = harness.run_job("paused.nightly_export").await.unwrap();
    assert!(
        matches!(&outcome, HandlerOutcome::Retry { reason, .. } if *reason == Reason::HANDLER_TIMEOUT),
        "{outcome:?}"
    );
    let waited = paused.elapsed();
    assert!(
        waited >= Duration::from_secs(120) && waited < Duration::from_secs(121),
        "the paused clock moved {waited:?}, not the job's 2 min timeout"
    );
    assert!(
        wall.elapsed() < Duration::from_secs(120),
        "{:?}",
        wall.elapsed()
    );
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "paused.InvoiceDue")]
struct InvoiceDue {
    invoice_id: u64,
}

static INVOICE_CALLS: AtomicU32 = AtomicU32::new(0);

/// Fails its first two calls, as a flaky payment provider would.
#[handler(message = "paused.InvoiceDue", name = "paused.charge")]
async fn charge(_invoice: InvoiceDue, ctx: &Context) -> Result<(), String> {
    INVOICE_CALLS.fetch_add(1, Ordering::SeqCst);
    if ctx.attempt() < 3 {
        return Err(format!("provider unavailable (call {})", ctx.attempt()));
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_in_memory_worlds_retry_backoff_elapses_on_the_paused_clock() {
    // Waits of 60 s, then 120 s, each shortened at random by at most a fifth.
    let runtime = MemoryWorker::builder()
        .store(InMemoryStore::new())
        .max_deliveries(5)
        .retry_delays(Duration::from_secs(60), Duration::from_secs(600))
        .build()
        .unwrap();
    let store = runtime.store().clone();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(runtime.clone().run(cancel.clone()));
    let (paused, wall) = (tokio::time::Instant::now(), std::time::Instant::now());

    store.publish(&InvoiceDue { invoice_id: 1 }).await.unwrap();
    store.wait_idle().await;

    let charged = runtime
        .stats()
        .into_iter()
        .find(|stats| stats.name == "paused.charge")
        .expect("the charge handler runs in this world");
    assert_eq!((charged.handled, charged.retried), (1, 2), "{charged:?}");
    assert_eq!(INVOICE_CALLS.load(Ordering::SeqCst), 3);
    assert!(store.dead_letters().is_empty());
    let waited = paused.elapsed();
    assert!(
        waited >= Duration::from_secs(144),
        "the paused clock moved {waited:?}: less than the two backoffs (at least 48 s + 96 s)"
    );
    assert!(
        wall.elapsed() < Duration::from_secs(144),
        "the wall clock moved {:?}: the backoff did not run on the paused clock",
        wall.elapsed()
    );

    cancel.cancel();
    running.await.unwrap().unwrap();
}
