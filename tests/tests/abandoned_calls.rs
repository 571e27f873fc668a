//! Calls given up on (past their timeout) that do not stop: each keeps its handler's
//! concurrency permit until it ends, a handler has room for only so many of them (its
//! concurrency limit, or 16 without one), and at that cap it starts no new call and its worker
//! reads not ready, saying why, until one ends. Shown on the outbox worker over SQLite; the
//! conformance suite's scenario 18 shows the permit in every world.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hexeract::health::{Health, Status};
use hexeract::outbox::OutboxWorker;
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::DeliveryStore;
use hexeract::{CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Registry};
use tokio::sync::Semaphore;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.Stuck")]
struct Stuck {
    n: u32,
}

/// A handler whose calls wait for the test to let them go, whatever their context says.
struct Hangs {
    started: Arc<AtomicU32>,
    finished: Arc<AtomicU32>,
    gate: Arc<Semaphore>,
}

impl Handler<Stuck> for Hangs {
    type Error = std::convert::Infallible;

    async fn handle(&self, _: Stuck, _: &Context) -> Result<(), Self::Error> {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.gate.acquire().await.expect("open").forget();
        self.finished.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within 30 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `messages` messages, `batch_size` claimed at a time, to a handler with `options` whose calls
/// hang past their 50 ms timeout:
/// `cap` calls start, are given up on and run on; no more starts, and the worker is held not
/// ready naming the handler; once the calls are let go, it is ready again and the rest are
/// called.
async fn at_the_cap_no_new_call_starts_and_readiness_says_why(
    options: HandlerOptions,
    messages: u32,
    batch_size: u32,
    cap: u32,
) {
    let store = SqliteStore::in_memory().await.unwrap();
    store.migrate().await.unwrap();
    let started = Arc::new(AtomicU32::new(0));
    let finished = Arc::new(AtomicU32::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let handler = Hangs {
        started: started.clone(),
        finished: finished.clone(),
        gate: gate.clone(),
    };
    let health = Health::new();
    let worker = OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<Stuck, _>(handler, options.name("stuck"))
        .handler_timeout(Duration::from_millis(50))
        .retry_delays(Duration::from_millis(10), Duration::from_millis(10))
        .max_deliveries(100)
        .batch_size(batch_size)
        .poll_interval(Duration::from_millis(10))
        .health(health.probe("outbox worker"))
        .build()
        .unwrap();
    let envelopes = (0..messages)
        .map(|n| Envelope::new(&Stuck { n }).unwrap())
        .collect();
    store.publish(envelopes).await.unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));

    eventually("the cap reached", || started.load(Ordering::SeqCst) == cap).await;
    let held = || match &health.readiness().components[0].status {
        Status::Held { reason } => Some(reason.clone()),
        _ => None,
    };
    eventually("readiness held", || held().is_some()).await;
    let reason = held().expect("held");
    assert!(
        reason.contains(&format!("handler stuck: {cap} calls given up on")),
        "{reason}"
    );
    // Held long past the timeout and the retry delays: still no call beyond the cap.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        started.load(Ordering::SeqCst),
        cap,
        "no call beyond the cap"
    );

    // Let every call go as it comes: the worker is ready again and everything is handled.
    gate.add_permits(10_000);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while store.backlog().await.unwrap() > 0 || !health.readiness().ready {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within 30 s: everything handled, and ready again: {}",
            health.readiness()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    running.await.unwrap().unwrap();
    assert!(finished.load(Ordering::SeqCst) >= messages);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_handler_holds_its_permits_through_calls_given_up_on() {
    let one = HandlerOptions::new().concurrency(NonZeroU32::new(2).unwrap());
    at_the_cap_no_new_call_starts_and_readiness_says_why(one, 5, 5, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_without_a_limit_has_room_for_sixteen_calls_given_up_on() {
    // Four calls at a time: four given up on per cycle, until sixteen run.
    at_the_cap_no_new_call_starts_and_readiness_says_why(HandlerOptions::new(), 20, 4, 16).await;
}
