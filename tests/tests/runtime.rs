//! The in-process runtime end to end, in what the conformance suite (`conformance.rs`, which
//! runs the delivery contract on this runtime too, with handlers registered in code) does not
//! cover: the `#[handler]` macro's `timeout` and `concurrency` attributes, publishing from
//! handlers, replay, the shutdown grace and calls interrupted by it, `retry_after`, invalid
//! settings and one runtime per store.
//!
//! Each test runs its own runtime over its own `InMemoryStore`, with only the handlers whose
//! names start with the test's prefix, so tests run in parallel without seeing each other.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hexeract::{
    handler, CancellationToken, Context, HandlerOutcome, InMemoryStore, MemoryWorker,
    MemoryWorkerBuilder, Message, Reason,
};
use tokio::task::JoinHandle;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.Ping")]
struct Ping {
    n: u32,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.Pong")]
struct Pong {
    n: u32,
}

/// A runtime over a store of its own, running the handlers named `<prefix>.*`, with retry
/// delays short enough for tests.
fn runtime(prefix: &'static str) -> MemoryWorkerBuilder {
    MemoryWorker::builder()
        .store(InMemoryStore::new())
        .handlers_where(move |info| info.name.starts_with(&format!("{prefix}.")))
        .retry_delays(Duration::from_millis(1), Duration::from_millis(5))
}

struct Running {
    store: InMemoryStore,
    runtime: MemoryWorker,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), hexeract::StoreBusy>>,
}

fn start(builder: MemoryWorkerBuilder) -> Running {
    let runtime = builder.build().expect("runtime builds");
    let cancel = CancellationToken::new();
    Running {
        store: runtime.store().clone(),
        task: tokio::spawn(runtime.clone().run(cancel.clone())),
        runtime,
        cancel,
    }
}

impl Running {
    async fn settle(&self) {
        tokio::time::timeout(Duration::from_secs(20), self.store.wait_idle())
            .await
            .expect("every message should be settled within 20 s");
    }

    async fn stop(self) -> InMemoryStore {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("run returns after cancel")
            .expect("run task does not panic")
            .expect("run returns Ok(()) on cancel");
        self.store
    }

    fn stats(&self, handler: &str) -> hexeract::HandlerStats {
        self.runtime
            .stats()
            .into_iter()
            .find(|stats| stats.name == handler)
            .unwrap_or_else(|| panic!("no handler {handler}"))
    }
}

/// Runs a new runtime on `store` with one handler named `name` that records the id and attempt
/// of every call, until the store is idle; returns what it recorded.
async fn resume_as(
    name: &'static str,
    store: InMemoryStore,
    max_deliveries: u32,
) -> Vec<(String, u32)> {
    struct Recorder(std::sync::Arc<Mutex<Vec<(String, u32)>>>);
    impl hexeract::Handler<Ping> for Recorder {
        type Error = String;
        async fn handle(&self, _ping: Ping, ctx: &Context) -> Result<(), Self::Error> {
            self.0
                .lock()
                .unwrap()
                .push((ctx.message_id().to_string(), ctx.attempt()));
            Ok(())
        }
    }
    let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
    let resumed = start(
        MemoryWorker::builder()
            .store(store)
            .registry(hexeract::Registry::new())
            .max_deliveries(max_deliveries)
            .register_handler_with::<Ping, _>(
                Recorder(seen.clone()),
                hexeract::HandlerOptions::new().name(name),
            ),
    );
    resumed.settle().await;
    resumed.stop().await;
    let seen = seen.lock().unwrap().clone();
    seen
}

// --- the macro's timeout: a slower call is a failed attempt ---

#[handler(message = "test.Ping", name = "slow.sleeper", timeout = "50ms")]
async fn sleeper(_ping: Ping, _ctx: &Context) -> Result<(), String> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

#[tokio::test]
async fn a_handler_slower_than_its_timeout_fails_the_attempt() {
    let running = start(runtime("slow").max_deliveries(2));
    running.store.publish(&Ping { n: 1 }).await.unwrap();
    running.settle().await;
    let dead = running.stop().await.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, Reason::HANDLER_TIMEOUT);
    assert_eq!(dead[0].attempts, 2);
    assert!(
        dead[0].detail.contains("50ms"),
        "detail: {}",
        dead[0].detail
    );
}

// --- concurrency limits ---

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static MOST_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

#[handler(message = "test.Ping", name = "limited.two_at_a_time", concurrency = 2)]
async fn two_at_a_time(_ping: Ping, _ctx: &Context) -> Result<(), String> {
    let now = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    MOST_IN_FLIGHT.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_never_runs_more_calls_at_once_than_its_concurrency() {
    let running = start(runtime("limited"));
    for n in 0..12 {
        running.store.publish(&Ping { n }).await.unwrap();
    }
    running.settle().await;
    assert_eq!(running.stats("limited.two_at_a_time").handled, 12);
    assert_eq!(
        MOST_IN_FLIGHT.load(Ordering::SeqCst),
        2,
        "the limit is reached, never passed"
    );
    running.stop().await;
}

// --- publishing from a handler keeps the conversation ---

/// Each pong seen: its number, correlation id and causation id.
type PongRecord = (u32, Option<String>, Option<String>);

static PONGS: Mutex<Vec<PongRecord>> = Mutex::new(Vec::new());

#[handler(message = "test.Ping", name = "conversation.answer")]
async fn answer(ping: Ping, ctx: &Context) -> Result<(), hexeract::PublishError> {
    ctx.publish(&Pong { n: ping.n + 1 }).await?;
    Ok(())
}

#[handler(message = "test.Pong", name = "conversation.record")]
async fn record(pong: Pong, ctx: &Context) -> Result<(), String> {
    PONGS.lock().unwrap().push((
        pong.n,
        ctx.correlation_id().map(|id| id.to_string()),
        ctx.causation_id().map(|id| id.to_string()),
    ));
    Ok(())
}

#[tokio::test]
async fn messages_published_by_a_handler_carry_correlation_and_causation() {
    let running = start(runtime("conversation"));
    let ping_id = running.store.publish(&Ping { n: 41 }).await.unwrap();
    running.settle().await;
    running.stop().await;
    let pongs = PONGS.lock().unwrap().clone();
    let expected = Some(ping_id.to_string());
    assert_eq!(pongs, [(42, expected.clone(), expected)]);
}

// --- replay ---

static REPLAY_ACCEPTS: AtomicBool = AtomicBool::new(false);

#[handler(message = "test.Ping", name = "replay.picky")]
async fn picky(_ping: Ping, _ctx: &Context) -> HandlerOutcome {
    if REPLAY_ACCEPTS.load(Ordering::SeqCst) {
        HandlerOutcome::Ack
    } else {
        HandlerOutcome::reject("not today")
    }
}

#[tokio::test]
async fn a_replayed_dead_letter_goes_back_to_its_handler() {
    let running = start(runtime("replay"));
    running.store.publish(&Ping { n: 5 }).await.unwrap();
    running.settle().await;
    let dead = running.store.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, Reason::HANDLER_REJECTED);

    REPLAY_ACCEPTS.store(true, Ordering::SeqCst);
    assert!(running.store.replay_dead_letter(dead[0].id));
    assert!(
        !running.store.replay_dead_letter(dead[0].id),
        "a dead letter replays once"
    );
    running.settle().await;
    assert_eq!(running.stats("replay.picky").handled, 1);
    assert!(running.stop().await.dead_letters().is_empty());
}

// --- shutdown ---

static STUCK_STARTED: tokio::sync::Notify = tokio::sync::Notify::const_new();

#[handler(message = "test.Ping", name = "grace.stuck")]
async fn stuck(_ping: Ping, _ctx: &Context) -> Result<(), String> {
    STUCK_STARTED.notify_one();
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

#[tokio::test]
async fn a_handler_still_running_after_the_grace_is_interrupted_and_its_message_kept() {
    let running = start(runtime("grace").shutdown_grace(Duration::from_millis(100)));
    let id = running.store.publish(&Ping { n: 1 }).await.unwrap();
    running.store.publish(&Ping { n: 2 }).await.unwrap();
    STUCK_STARTED.notified().await;
    let store = running.stop().await;
    assert!(!store.is_idle(), "the interrupted messages are still owed");
    assert_eq!(store.pending(), 2, "both messages are back in the store");
    assert!(store.dead_letters().is_empty());

    // A new runtime on the same store picks them up, with the attempts already used.
    let seen = resume_as("grace.stuck", store, 5).await;
    assert_eq!(seen.len(), 2);
    assert!(
        seen.contains(&(id.to_string(), 2)),
        "the interrupted call counted: {seen:?}"
    );
}

#[test]
fn invalid_settings_are_all_reported_and_nothing_starts() {
    let error = MemoryWorker::builder()
        .configure_from(|name| match name {
            "MAX_DELIVERIES" => Some("zero".into()),
            "HANDLER_TIMEOUT_MS" => Some("-5".into()),
            _ => None,
        })
        .expect_err("invalid settings accepted");
    let text = error.to_string();
    assert!(text.contains("MAX_DELIVERIES = \"zero\""), "{text}");
    assert!(text.contains("HANDLER_TIMEOUT_MS = \"-5\""), "{text}");

    let error = MemoryWorker::builder()
        .store(InMemoryStore::new())
        .max_deliveries(0)
        .concurrency(0)
        .build()
        .expect_err("invalid knobs accepted");
    let text = error.to_string();
    assert!(
        text.contains("max_deliveries = \"0\": at least 1"),
        "{text}"
    );
    assert!(text.contains("concurrency = \"0\": at least 1"), "{text}");
}

// --- a message meant for a handler that no longer exists ---

#[handler(message = "test.Ping", name = "renamed.old")]
async fn old_name(_ping: Ping, _ctx: &Context) -> HandlerOutcome {
    HandlerOutcome::reject("always")
}

#[tokio::test]
async fn a_message_for_a_handler_that_is_gone_is_dead_lettered_naming_it() {
    let first = start(runtime("renamed"));
    first.store.publish(&Ping { n: 1 }).await.unwrap();
    first.settle().await;
    let store = first.stop().await;
    let dead = store.dead_letters();
    assert_eq!(dead.len(), 1);

    // The next deployment renamed the handler; replaying the old dead letter must not lose it.
    let second = start(
        MemoryWorker::builder()
            .store(store)
            .registry(hexeract::Registry::new())
            .max_deliveries(2)
            .retry_delays(Duration::from_millis(1), Duration::from_millis(5)),
    );
    assert!(second.store.replay_dead_letter(dead[0].id));
    second.settle().await;
    let dead = second.stop().await.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, Reason::UNKNOWN_MESSAGE_TYPE);
    assert_eq!(dead[0].handler.as_deref(), Some("renamed.old"));
    assert_eq!(dead[0].attempts, 2);
    assert!(
        dead[0].detail.contains("`renamed.old`"),
        "detail: {}",
        dead[0].detail
    );
}

// --- attempts are counted when a call starts: interrupted calls use them up ---

static HANGS_CALLS: AtomicU32 = AtomicU32::new(0);
static HANGS_STARTED: tokio::sync::Notify = tokio::sync::Notify::const_new();

#[handler(message = "test.Ping", name = "hangs.forever")]
async fn hangs_forever(_ping: Ping, _ctx: &Context) -> Result<(), String> {
    HANGS_CALLS.fetch_add(1, Ordering::SeqCst);
    HANGS_STARTED.notify_one();
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test]
async fn a_message_whose_calls_never_finish_still_runs_out_of_attempts() {
    let store = InMemoryStore::new();
    let builder = || {
        runtime("hangs")
            .store(store.clone())
            .max_deliveries(2)
            .shutdown_grace(Duration::from_millis(20))
    };
    for run in 1..=2 {
        let running = start(builder());
        if run == 1 {
            running.store.publish(&Ping { n: 1 }).await.unwrap();
        }
        HANGS_STARTED.notified().await;
        running.stop().await;
        assert_eq!(
            store.pending(),
            1,
            "run {run}: the interrupted message is kept"
        );
    }
    let last = start(builder());
    last.settle().await;
    last.stop().await;
    assert_eq!(HANGS_CALLS.load(Ordering::SeqCst), 2, "no third call");
    let dead = store.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert_eq!(dead[0].attempts, 2);
    assert!(
        dead[0].detail.contains("interrupted"),
        "detail: {}",
        dead[0].detail
    );
}

// --- one runtime per store ---

#[tokio::test]
async fn a_second_runtime_on_the_same_store_is_refused() {
    let first = start(runtime("busy"));
    // Give the first runtime the moment it needs to take the store.
    tokio::task::yield_now().await;
    let second = runtime("busy").store(first.store.clone()).build().unwrap();
    let error = tokio::time::timeout(Duration::from_secs(5), second.run(CancellationToken::new()))
        .await
        .expect("a refused run returns at once")
        .expect_err("two runtimes on one store");
    // The worker's own error, which `?` gives back as the program's.
    assert_eq!(error, hexeract::StoreBusy);
    let error = hexeract::Error::from(error);
    assert!(matches!(error, hexeract::Error::StoreBusy), "{error}");
    let store = first.stop().await;

    // Once the first has stopped, the store can be run again.
    let again = start(runtime("busy").store(store));
    again.stop().await;
}

// --- retry_after and messages waiting at shutdown ---

static DEFERRED_CALLS: Mutex<Vec<std::time::Instant>> = Mutex::new(Vec::new());

#[handler(message = "test.Ping", name = "deferred.later")]
async fn later(_ping: Ping, ctx: &Context) -> HandlerOutcome {
    DEFERRED_CALLS
        .lock()
        .unwrap()
        .push(std::time::Instant::now());
    if ctx.attempt() == 1 {
        HandlerOutcome::retry_after(Duration::from_millis(200), "not yet")
    } else {
        HandlerOutcome::Ack
    }
}

#[tokio::test]
async fn retry_after_replaces_the_policy_delay() {
    // The policy's first delay is 1 ms: only retry_after can make the second call wait 200 ms
    // (within the longest delay, 1 s, which caps it).
    let running =
        start(runtime("deferred").retry_delays(Duration::from_millis(1), Duration::from_secs(1)));
    running.store.publish(&Ping { n: 1 }).await.unwrap();
    running.settle().await;
    running.stop().await;
    let calls = DEFERRED_CALLS.lock().unwrap().clone();
    assert_eq!(calls.len(), 2);
    assert!(
        calls[1] - calls[0] >= Duration::from_millis(200),
        "{:?}",
        calls[1] - calls[0]
    );
}

static ONE_AT_A_TIME_STARTED: tokio::sync::Notify = tokio::sync::Notify::const_new();

#[handler(message = "test.Ping", name = "queued.one_at_a_time", concurrency = 1)]
async fn one_at_a_time(_ping: Ping, _ctx: &Context) -> Result<(), String> {
    ONE_AT_A_TIME_STARTED.notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}

#[tokio::test]
async fn messages_waiting_for_a_permit_at_shutdown_stay_in_the_store_unused() {
    let running = start(runtime("queued"));
    for n in 0..3 {
        running.store.publish(&Ping { n }).await.unwrap();
    }
    ONE_AT_A_TIME_STARTED.notified().await;
    let runtime = running.runtime.clone();
    let store = running.stop().await;
    assert_eq!(runtime.stats()[0].handled, 1, "the running call finished");
    assert_eq!(store.pending(), 2, "the two waiting messages are back");
    assert!(store.dead_letters().is_empty());
}

// --- a stop in the middle of a taken batch: the rest goes back unused ---

#[tokio::test]
async fn messages_taken_but_not_started_when_the_runtime_stops_go_back_unused() {
    /// Stops its runtime during the first call.
    struct StopsItsRuntime(CancellationToken);
    impl hexeract::Handler<Ping> for StopsItsRuntime {
        type Error = String;
        async fn handle(&self, _ping: Ping, _ctx: &Context) -> Result<(), Self::Error> {
            self.0.cancel();
            Ok(())
        }
    }
    let cancel = CancellationToken::new();
    let runtime = MemoryWorker::builder()
        .store(InMemoryStore::new())
        .registry(hexeract::Registry::new())
        .register_handler_with::<Ping, _>(
            StopsItsRuntime(cancel.clone()),
            hexeract::HandlerOptions::new().name("batch.stopper"),
        )
        .build()
        .expect("runtime builds");
    let store = runtime.store().clone();
    // Published before the runtime starts: it takes all ten in one batch.
    for n in 0..10 {
        store.publish(&Ping { n }).await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(20), runtime.clone().run(cancel))
        .await
        .expect("run returns after its handler stopped it")
        .expect("run returns Ok(())");
    assert_eq!(runtime.stats()[0].handled, 1, "one call, then the stop");
    assert_eq!(
        store.pending(),
        9,
        "the nine not started are back in the store"
    );
    assert!(!store.is_idle(), "and still owed");

    let seen = resume_as("batch.resumed", store.clone(), 5).await;
    assert_eq!(seen.len(), 9, "each of the nine is handled once: {seen:?}");
    let ids: std::collections::BTreeSet<&String> = seen.iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), 9, "nine distinct messages");
    assert!(
        seen.iter().all(|(_, attempt)| *attempt == 1),
        "no attempt was charged for a message never started: {seen:?}"
    );
    assert!(store.is_idle() && store.dead_letters().is_empty());
}
