//! What the scenarios share: the messages, a scripted handler that records its calls, unique
//! names, the middleware and the journal they write, waits, the handlers' metrics and the
//! captured log.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use hexeract::metrics::Metrics;
use hexeract::{
    Context, DeadLetter, Envelope, Handler, HandlerOptions, HandlerOutcome, Message, Middleware,
    Next, Registry,
};
use hexeract_tests::logs::Captured;
use uuid::Uuid;

use crate::worlds::World;

/// How long any wait of the suite may take before it fails.
pub(crate) const WITHIN: Duration = Duration::from_secs(30);

/// The message every handler of the suite handles. It declares an aggregate (with the id as
/// its key) because Kafka needs one to choose a topic and a partition; the other worlds
/// ignore it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "conformance.Order", aggregate = "order")]
pub(crate) struct Order {
    #[message(key)]
    pub(crate) id: String,
    pub(crate) n: u32,
}

/// A message type no handler of the suite handles, of the same aggregate (so, on Kafka, in
/// the same topic as [`Order`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "conformance.Nobody", aggregate = "order")]
pub(crate) struct Nobody {
    #[message(key)]
    pub(crate) id: String,
}

/// Order number `n` with the aggregate id `key` (on Kafka, one key is one partition, in
/// order).
pub(crate) fn order(key: &str, n: u32) -> Envelope {
    Envelope::new(&Order {
        id: key.to_owned(),
        n,
    })
    .expect("an order encodes")
}

/// An `Order` envelope around bytes of its own, with the aggregate and key a Kafka relay
/// needs to place it.
pub(crate) fn raw_order(key: &str, payload: impl Into<Vec<u8>>) -> Envelope {
    let mut envelope = Envelope::from_raw(Order::MESSAGE_TYPE, payload.into());
    envelope.aggregate = Some("order".to_owned());
    envelope.aggregate_key = Some(key.to_owned());
    envelope
}

/// A handler name of the test's own: nextest runs each test in a process of its own, but the
/// handlers' metrics are process-wide and queue and group names live on shared brokers, so no
/// name is ever used twice.
pub(crate) fn unique(role: &str) -> String {
    format!("conformance.{role}.{}", Uuid::now_v7().simple())
}

/// One handler call as the handler saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) handler: String,
    pub(crate) message: Uuid,
    /// The order's `n`.
    pub(crate) n: u32,
    pub(crate) attempt: u32,
}

/// Every call of every handler of a test, in the order they started.
#[derive(Clone, Debug, Default)]
pub(crate) struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn record(&self, order: &Order, ctx: &Context) {
        self.0.lock().unwrap().push(Call {
            handler: ctx.handler_name().to_owned(),
            message: ctx.message_id(),
            n: order.n,
            attempt: ctx.attempt(),
        });
    }

    /// The calls of `handler`.
    pub(crate) fn of(&self, handler: &str) -> Vec<Call> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|call| call.handler == handler)
            .cloned()
            .collect()
    }

    /// The attempt of each call of `handler`, in order.
    pub(crate) fn attempts(&self, handler: &str) -> Vec<u32> {
        self.of(handler).iter().map(|call| call.attempt).collect()
    }

    /// Order `n` → the attempt of each call of `handler` with it, in order.
    pub(crate) fn attempts_per_order(&self, handler: &str) -> BTreeMap<u32, Vec<u32>> {
        let mut per_order: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for call in self.of(handler) {
            per_order.entry(call.n).or_default().push(call.attempt);
        }
        per_order
    }

    /// The `n` of each order `handler` was called with, sorted.
    pub(crate) fn orders(&self, handler: &str) -> Vec<u32> {
        let mut orders: Vec<u32> = self.of(handler).iter().map(|call| call.n).collect();
        orders.sort_unstable();
        orders
    }
}

/// Calls in flight, and the most seen at once.
#[derive(Debug, Default)]
pub(crate) struct Gauge {
    in_flight: AtomicU32,
    most: AtomicU32,
}

impl Gauge {
    pub(crate) fn most(&self) -> u32 {
        self.most.load(Ordering::SeqCst)
    }

    /// Calls in flight now.
    pub(crate) fn now(&self) -> u32 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// A call starts: counted, and the most seen at once kept.
    fn enter(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a scripted handler does with each call (after recording it).
#[derive(Clone, Debug)]
pub(crate) enum Act {
    /// Acks.
    Succeed,
    /// Fails the first `n` calls of each message with `Err("call <attempt> failed")`, then
    /// acks.
    FailFirst(u32),
    /// `HandlerOutcome::dead_letter(reason, detail)`.
    DeadLetter(&'static str, &'static str),
    /// Panics with "the handler panicked on purpose" on the first `n` calls of each message,
    /// then acks.
    PanicFirst(u32),
    /// Sleeps this long (longer than the timeout), stopping early when its context is
    /// cancelled (the engine gave up on it: then it counts itself in the counter), then acks.
    Sleep(Duration, Arc<AtomicU32>),
    /// Takes 100 ms, counted in the gauge meanwhile, then acks.
    Overlap(Arc<Gauge>),
    /// Takes this long (longer than the timeout), counted in the gauge meanwhile, and does not
    /// stop when its context is cancelled (the engine gave up on it); then acks, too late.
    Stubborn(Arc<Gauge>, Duration),
    /// Takes this long, then counts itself finished and acks.
    Linger(Duration, Arc<AtomicU32>),
    /// On its first call (of any message, in any worker: the flag), waits for the worker to
    /// stop (its context's cancellation) and then fails, as a cooperative handler does; acks
    /// every later call.
    FailWhenStopped(Arc<AtomicBool>),
    /// Writes `call` in the journal (between the entries of the middleware around it), then
    /// acks.
    Note(Journal),
    /// On its first call (of any message, in any worker: the flag), never ends, whatever its
    /// context says (the process is to crash under it); acks every later call.
    HangFirst(Arc<AtomicBool>),
}

/// A handler of [`Order`] that records each call in [`Calls`] and then does its [`Act`].
#[derive(Debug)]
struct Scripted {
    calls: Calls,
    act: Act,
}

impl Handler<Order> for Scripted {
    type Error = HandlerOutcome;

    async fn handle(&self, order: Order, ctx: &Context) -> Result<(), Self::Error> {
        self.calls.record(&order, ctx);
        hexeract::IntoOutcome::into_outcome(self.act(ctx).await).into_result()
    }
}

impl Scripted {
    /// What this call does, as a `#[handler]` fn returning `Result<HandlerOutcome, String>`
    /// would say it.
    async fn act(&self, ctx: &Context) -> Result<HandlerOutcome, String> {
        match &self.act {
            Act::Succeed => Ok(HandlerOutcome::Ack),
            Act::FailFirst(failures) if ctx.attempt() <= *failures => {
                Err(format!("call {} failed", ctx.attempt()))
            }
            Act::FailFirst(_) => Ok(HandlerOutcome::Ack),
            Act::DeadLetter(reason, detail) => Ok(HandlerOutcome::dead_letter(*reason, detail)),
            Act::PanicFirst(panics) if ctx.attempt() <= *panics => {
                panic!("the handler panicked on purpose")
            }
            Act::PanicFirst(_) => Ok(HandlerOutcome::Ack),
            Act::Sleep(pause, told) => {
                tokio::select! {
                    () = tokio::time::sleep(*pause) => {}
                    () = ctx.cancellation().cancelled() => {
                        told.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok(HandlerOutcome::Ack)
            }
            Act::Overlap(gauge) => {
                gauge.enter();
                tokio::time::sleep(Duration::from_millis(100)).await;
                gauge.leave();
                Ok(HandlerOutcome::Ack)
            }
            Act::Stubborn(gauge, pause) => {
                gauge.enter();
                tokio::time::sleep(*pause).await;
                gauge.leave();
                Ok(HandlerOutcome::Ack)
            }
            Act::Linger(pause, finished) => {
                tokio::time::sleep(*pause).await;
                finished.fetch_add(1, Ordering::SeqCst);
                Ok(HandlerOutcome::Ack)
            }
            Act::FailWhenStopped(called) if !called.swap(true, Ordering::SeqCst) => {
                tokio::select! {
                    () = ctx.cancellation().cancelled() => {}
                    () = tokio::time::sleep(WITHIN) => {}
                }
                Err("gave up: the worker is stopping".to_owned())
            }
            Act::FailWhenStopped(_) => Ok(HandlerOutcome::Ack),
            Act::HangFirst(called) if !called.swap(true, Ordering::SeqCst) => {
                std::future::pending::<()>().await;
                unreachable!("a pending future never ends")
            }
            Act::HangFirst(_) => Ok(HandlerOutcome::Ack),
            Act::Note(journal) => {
                journal.write(ctx.handler_name(), "call");
                Ok(HandlerOutcome::Ack)
            }
        }
    }
}

/// The handlers of one test, registered in code, each recording into the same [`Calls`].
#[derive(Clone)]
pub(crate) struct Handlers {
    calls: Calls,
    registry: Registry,
}

impl Handlers {
    pub(crate) fn new(calls: &Calls) -> Handlers {
        Handlers {
            calls: calls.clone(),
            registry: Registry::new(),
        }
    }

    /// Adds a handler of [`Order`] named `name` doing `act`.
    pub(crate) fn with(self, name: &str, act: Act) -> Handlers {
        self.with_options(name, act, HandlerOptions::new())
    }

    /// The same, with its own options (`name` replaces theirs).
    pub(crate) fn with_options(
        mut self,
        name: &str,
        act: Act,
        options: HandlerOptions,
    ) -> Handlers {
        let handler = Scripted {
            calls: self.calls.clone(),
            act,
        };
        self.registry
            .register::<Order, _>(handler, options.name(name.to_owned()))
            .expect("a valid, unique handler name");
        self
    }

    pub(crate) fn registry(&self) -> Registry {
        self.registry.clone()
    }
}

/// What the middleware of a test (and the handlers or jobs inside it) did, in order, each entry
/// under the name of the handler (or job) of its call.
#[derive(Clone, Debug, Default)]
pub(crate) struct Journal(Arc<Mutex<Vec<(String, String)>>>);

impl Journal {
    pub(crate) fn write(&self, handler: &str, entry: impl Into<String>) {
        self.0
            .lock()
            .unwrap()
            .push((handler.to_owned(), entry.into()));
    }

    /// The entries of `handler`'s calls, in order.
    pub(crate) fn of(&self, handler: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(name, _)| name == handler)
            .map(|(_, entry)| entry.clone())
            .collect()
    }
}

/// The reason [`RequireTenant`] dead-letters with.
pub(crate) const TENANT_MISSING: &str = "tenant_missing";
/// Its detail.
pub(crate) const NO_TENANT: &str = "the message has no `tenant` header";

/// Dead-letters a message without a `tenant` header as [`TENANT_MISSING`], without calling the
/// rest of the chain (nor the handler); lets the others through.
pub(crate) struct RequireTenant;

impl Middleware for RequireTenant {
    async fn handle(&self, ctx: &Context, next: Next<'_>) -> HandlerOutcome {
        match ctx.header("tenant") {
            Some(_) => next.run(ctx).await,
            None => HandlerOutcome::dead_letter(TENANT_MISSING, NO_TENANT),
        }
    }
}

/// Writes `enter <layer>` in the journal, calls the rest of the chain, then writes
/// `exit <layer>: <the outcome it returned>` and returns that outcome.
pub(crate) struct Recorded {
    layer: &'static str,
    journal: Journal,
}

impl Recorded {
    pub(crate) fn new(layer: &'static str, journal: &Journal) -> Recorded {
        Recorded {
            layer,
            journal: journal.clone(),
        }
    }
}

impl Middleware for Recorded {
    async fn handle(&self, ctx: &Context, next: Next<'_>) -> HandlerOutcome {
        let handler = ctx.handler_name().to_owned();
        self.journal
            .write(&handler, format!("enter {}", self.layer));
        let outcome = next.run(ctx).await;
        self.journal.write(
            &handler,
            format!("exit {}: {}", self.layer, verdict(&outcome)),
        );
        outcome
    }
}

/// An outcome in a word: `ack`, `retry`, `dead_letter(<reason>)`.
fn verdict(outcome: &HandlerOutcome) -> String {
    match outcome {
        HandlerOutcome::Ack => "ack".to_owned(),
        HandlerOutcome::Retry { .. } => "retry".to_owned(),
        HandlerOutcome::DeadLetter { reason, .. } => format!("dead_letter({})", reason.as_str()),
        other => format!("{other:?}"),
    }
}

/// A handler's counters in [`Metrics::global`]: (handled, retried, dead-lettered).
pub(crate) fn counts(handler: &str) -> (u64, u64, u64) {
    let metrics = Metrics::global().handler(handler);
    (
        metrics.handled_count(),
        metrics.retried_count(),
        metrics.dead_lettered_count(),
    )
}

/// The deliveries of `handler` that reached a final verdict (acked or dead-lettered), as the
/// engine records them before the world carries the verdict out.
pub(crate) fn finished(handler: &str) -> u64 {
    let (handled, _, dead_lettered) = counts(handler);
    handled + dead_lettered
}

/// Waits (up to [`WITHIN`]) until `done` holds of the world's dead letters (and whatever else
/// it looks at); returns those dead letters.
pub(crate) async fn until<W: World>(
    world: &W,
    what: &str,
    done: impl Fn(&[DeadLetter]) -> bool,
) -> Vec<DeadLetter> {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let letters = world.dead_letters().await;
        if done(&letters) {
            return letters;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "on {}: not within {WITHIN:?}: {what} (dead letters: {letters:?})",
            W::TRANSPORT
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to [`WITHIN`]) until `done` holds.
pub(crate) async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WITHIN;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {WITHIN:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The process's log, captured at `debug` for Hexeract from the first call on. Installed
/// once per process (nextest runs each test in one of its own; under `cargo test` the tests of
/// one process share it, and each looks only for its own handlers' lines).
pub(crate) fn captured_log() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        tracing_subscriber::fmt()
            .with_env_filter("hexeract=debug")
            .with_writer(captured.clone())
            .with_ansi(false)
            .try_init()
            .expect("no other global subscriber in this test process");
        captured
    })
}

/// The captured lines that contain every one of `needles`.
pub(crate) fn log_lines(needles: &[&str]) -> Vec<String> {
    captured_log()
        .text()
        .lines()
        .filter(|line| needles.iter().all(|needle| line.contains(needle)))
        .map(str::to_owned)
        .collect()
}

/// `handler="<name>"`, as the log shows the field.
pub(crate) fn handler_field(name: &str) -> String {
    format!("handler=\"{name}\"")
}

/// `transport="<name>"`, as the log shows the field.
pub(crate) fn transport_field(transport: &str) -> String {
    format!("transport=\"{transport}\"")
}
