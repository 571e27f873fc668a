//! Benchmarks: each scenario runs Hexeract and a hand-written baseline doing the same work in
//! the same process, and prints one line per scenario:
//!
//! ```text
//! scenario=<name> hexeract=<msgs/s> baseline=<msgs/s> ratio=<hexeract/baseline>
//! ```
//!
//! `--quick` runs fewer messages (seconds, for CI); without it the runs are ten times longer.
//! Each figure is the median of five runs. `--scenario NAME` runs one scenario only, for a
//! profiler: `valgrind --tool=callgrind target/release/hexeract-bench --quick --scenario dispatch`
//! counts instructions, which stay the same from run to run where wall-clock figures on a shared
//! machine do not.
//!
//! `soak [--messages N]` runs no scenario but the soak (`soak.rs`): N messages (default
//! 1 000 000) through outbox → relay → RabbitMQ → handler while a producer writes them, with
//! the process's memory at each quarter, duplicates and lost messages counted, and a non-zero
//! exit code when a message is lost or memory grows with the message count. `--quick` does not
//! run it.

use std::convert::Infallible;
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

mod cpu;
mod e2e;
mod kafka;
mod outbox;
mod peers;
mod rabbitmq;
mod scheduler;
mod soak;

use hexeract::{
    handler, CancellationToken, Context, Envelope, HandlerOutcome, InMemoryStore, MemoryWorker,
    Message, Middleware, Next, Registry, State,
};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "bench.OrderPlaced")]
struct OrderPlaced {
    order_id: u64,
    customer: String,
    total_cents: i64,
    lines: Vec<Line>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Line {
    sku: String,
    quantity: u32,
}

fn order(order_id: u64) -> OrderPlaced {
    OrderPlaced {
        order_id,
        customer: "customer-0042".into(),
        total_cents: 12_990,
        lines: vec![
            Line {
                sku: "SKU-1".into(),
                quantity: 2,
            },
            Line {
                sku: "SKU-2".into(),
                quantity: 1,
            },
        ],
    }
}

/// The handler both sides call: the work a trivial handler does.
#[handler(message = "bench.OrderPlaced", name = "bench.record")]
async fn record(order: OrderPlaced, _ctx: &Context) -> Result<(), Infallible> {
    black_box(&order);
    Ok(())
}

/// The same handler taking state, as a service's handler takes its pool.
#[handler(message = "bench.OrderPlaced", name = "bench.record_with_state")]
async fn record_with_state(
    order: OrderPlaced,
    _ctx: &Context,
    State(ledger): State<Arc<Ledger>>,
) -> Result<(), Infallible> {
    black_box(&order);
    black_box(&ledger);
    Ok(())
}

/// The state: what a pool is to a handler, an `Arc` cloned per call.
#[derive(Debug, Default)]
struct Ledger {
    _name: String,
}

/// A middleware that does nothing but pass the call on.
struct PassOn;

impl Middleware for PassOn {
    async fn handle(&self, ctx: &Context, next: Next<'_>) -> HandlerOutcome {
        next.run(ctx).await
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|arg| arg == "soak") {
        return soak::main(&args[2..]);
    }
    let quick = args.iter().any(|arg| arg == "--quick");
    let scale = if quick { 1 } else { 10 };
    // `--scenario NAME` runs one scenario (for profilers).
    let only = args
        .iter()
        .position(|arg| arg == "--scenario")
        .and_then(|at| args.get(at + 1));
    let wanted = |name: &str| only.is_none_or(|only| only == name);
    // Dispatch is measured on one thread without an executor (the handler never waits, so its
    // future completes on the first poll), where scheduling noise cannot reach it; the runtime
    // scenario on the two worker threads it would have in a service here.
    if wanted("dispatch") {
        report("dispatch", dispatch(400_000 * scale));
    }
    if wanted("dispatch_state_middleware") {
        report(
            "dispatch_state_middleware",
            dispatch_state_middleware(400_000 * scale),
        );
    }
    let multi = runtime();
    if wanted("in_process") {
        report("in_process", multi.block_on(in_process(20_000 * scale)));
    }
    if wanted("outbox_drain") {
        multi.block_on(outbox::drain(10_000 * scale));
    }
    if wanted("outbox_latency") {
        multi.block_on(outbox::latency(if quick { 50 } else { 500 }));
    }
    if wanted("rabbitmq_consume") {
        multi.block_on(rabbitmq::consume(20_000 * scale));
    }
    if wanted("rabbitmq_publish") {
        multi.block_on(rabbitmq::publish(20_000 * scale));
    }
    if wanted("rabbitmq_retry_tiers") {
        multi.block_on(rabbitmq::retry_tiers(5_000 * scale));
    }
    if wanted("rabbitmq_relay") {
        multi.block_on(rabbitmq::relay(10_000 * scale));
    }
    if wanted("kafka_relay_consume") {
        multi.block_on(kafka::relay_consume(10_000 * scale));
    }
    if wanted("kafka_relay_consume_mock") {
        multi.block_on(kafka::relay_consume_mock(20_000 * scale));
    }
    // The sweeps are for docs/performance.md: not in `--quick`, and only when asked for.
    if !quick && only.is_some_and(|only| only == "sweeps") {
        multi.block_on(outbox::sweep(10_000));
    }
    if wanted("e2e_pg_rabbitmq") {
        multi.block_on(e2e::pg_rabbitmq(2_000 * scale, quick));
    }
    if wanted("e2e_pg_kafka") {
        // More events than the other pipelines: a consumer's fetch wait (up to 500 ms on the
        // mock cluster) is otherwise a large share of a run.
        multi.block_on(e2e::pg_kafka(6_000 * scale, quick, true));
    }
    // On tansu outside `--quick` (CI's bench phase has 8 minutes): a minute of group joins.
    if (!quick && wanted("e2e_pg_kafka_tansu"))
        || only.is_some_and(|only| only == "e2e_pg_kafka_tansu")
    {
        multi.block_on(e2e::pg_kafka(2_000 * scale, quick, false));
    }
    if wanted("e2e_sqlite") {
        multi.block_on(e2e::sqlite(2_000 * scale, quick));
    }
    if wanted("scheduler_dispatch") {
        multi.block_on(scheduler::dispatch(if quick { 20_000 } else { 50_000 }));
    }
    // Hexeract against other libraries (`peers.rs`).
    if only.is_none_or(|only| only.starts_with("peer_")) {
        multi.block_on(peers::run(quick, only.map(String::as_str)));
    }
    ExitCode::SUCCESS
}

/// The runtime the asynchronous scenarios run on: two worker threads, as a service would have
/// here.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Median msgs/s of five runs of each side.
struct Figures {
    hexeract: f64,
    baseline: f64,
}

fn report(scenario: &str, figures: Figures) {
    println!(
        "scenario={scenario} hexeract={:.0} baseline={:.0} ratio={:.3}",
        figures.hexeract,
        figures.baseline,
        figures.hexeract / figures.baseline
    );
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

pub(crate) fn rate(messages: u64, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64()
}

/// One message through registry lookup, erased dispatch and decode, against
/// `serde_json::from_slice` and a direct call of the same function.
fn dispatch(messages: u64) -> Figures {
    let mut registry = Registry::from_inventory().expect("registry");
    registry.retain(|info| info.name == "bench.record");
    let envelope = Envelope::new(&order(1)).expect("encode");
    let ctx = Context::new(
        envelope.clone(),
        "bench.record",
        CancellationToken::new(),
        Arc::new(InMemoryStore::new()),
    );
    five_pairs(
        messages,
        || dispatch_erased(&registry, &envelope, &ctx, messages),
        || dispatch_direct(&envelope, &ctx, messages),
    )
}

/// The medians of five runs of each side, taken in turns, on this thread.
fn five_pairs(messages: u64, mut hexeract: impl FnMut(), mut baseline: impl FnMut()) -> Figures {
    let mut hexeract_rates = Vec::new();
    let mut baseline_rates = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        hexeract();
        hexeract_rates.push(rate(messages, started.elapsed()));

        let started = Instant::now();
        baseline();
        baseline_rates.push(rate(messages, started.elapsed()));
    }
    Figures {
        hexeract: median(hexeract_rates),
        baseline: median(baseline_rates),
    }
}

// The two loops are separate functions that are never inlined, so that an instruction counter
// (`valgrind --tool=callgrind`) can attribute the cost of each side exactly.

#[inline(never)]
fn dispatch_erased(registry: &Registry, envelope: &Envelope, ctx: &Context, messages: u64) {
    for _ in 0..messages {
        for registered in registry.handlers_for(black_box(&envelope.message_type)) {
            let outcome = registered
                .handler()
                .handle(black_box(envelope), ctx)
                .now_or_never()
                .expect("the handler never waits");
            assert!(outcome.is_ack());
        }
    }
}

#[inline(never)]
fn dispatch_direct(envelope: &Envelope, ctx: &Context, messages: u64) {
    for _ in 0..messages {
        let order: OrderPlaced =
            serde_json::from_slice(black_box(&envelope.payload)).expect("decode");
        let result = record(order, ctx)
            .now_or_never()
            .expect("the handler never waits");
        assert!(result.is_ok());
    }
}

/// A handler taking `State<Arc<_>>`, behind two middlewares that pass the call on, against the
/// plain handler without state or middleware: both called as a worker calls them
/// (`RegisteredHandler::call`: the middleware chain, then decode and call), on one thread.
fn dispatch_state_middleware(messages: u64) -> Figures {
    let built = |name: &'static str| {
        let runtime = MemoryWorker::builder()
            .store(InMemoryStore::new())
            .handlers_where(move |info| info.name == name)
            .state(Arc::new(Ledger::default()))
            .middleware(PassOn)
            .middleware(PassOn)
            .build()
            .expect("runtime");
        runtime.registry().get(name).expect("the handler").clone()
    };
    let plain = {
        let runtime = MemoryWorker::builder()
            .store(InMemoryStore::new())
            .handlers_where(|info| info.name == "bench.record")
            .build()
            .expect("runtime");
        runtime
            .registry()
            .get("bench.record")
            .expect("the handler")
            .clone()
    };
    let with_both = built("bench.record_with_state");
    let envelope = Envelope::new(&order(1)).expect("encode");
    let ctx = Context::new(
        envelope,
        "bench.record",
        CancellationToken::new(),
        Arc::new(InMemoryStore::new()),
    );
    five_pairs(
        messages,
        || call_with_state_and_middleware(&with_both, &ctx, messages),
        || call_plain(&plain, &ctx, messages),
    )
}

// Two functions (kept apart by their labels), so that an instruction counter tells the sides
// apart.
#[inline(never)]
fn call_with_state_and_middleware(
    handler: &hexeract::__private::RegisteredHandler,
    ctx: &Context,
    messages: u64,
) {
    black_box("with state and middleware");
    call_registered(handler, ctx, messages);
}

#[inline(never)]
fn call_plain(handler: &hexeract::__private::RegisteredHandler, ctx: &Context, messages: u64) {
    black_box("plain");
    call_registered(handler, ctx, messages);
}

#[inline(always)]
fn call_registered(handler: &hexeract::__private::RegisteredHandler, ctx: &Context, messages: u64) {
    for _ in 0..messages {
        let outcome = handler
            .call(black_box(ctx))
            .now_or_never()
            .expect("the handler never waits");
        assert!(outcome.is_ack());
    }
}

/// Publish → runtime → handler, until every message is settled, against a hand-rolled loop:
/// serialize, send over a tokio channel, receive, decode, call.
async fn in_process(messages: u64) -> Figures {
    let mut hexeract = Vec::new();
    let mut baseline = Vec::new();
    for _ in 0..5 {
        let runtime = MemoryWorker::builder()
            .store(InMemoryStore::new())
            .handlers_where(|info| info.name == "bench.record")
            .build()
            .expect("runtime");
        let store = runtime.store().clone();
        let cancel = CancellationToken::new();
        let running = tokio::spawn(runtime.run(cancel.clone()));
        let started = Instant::now();
        for n in 0..messages {
            store.publish(&order(n)).await.expect("publish");
        }
        store.wait_idle().await;
        hexeract.push(rate(messages, started.elapsed()));
        cancel.cancel();
        running.await.expect("join").expect("run");

        let ctx = Context::new(
            Envelope::new(&order(0)).expect("encode"),
            "baseline",
            CancellationToken::new(),
            Arc::new(InMemoryStore::new()),
        );
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let started = Instant::now();
        let consumer = tokio::spawn(async move {
            let mut handled = 0u64;
            while let Some(payload) = receiver.recv().await {
                let order: OrderPlaced = serde_json::from_slice(&payload).expect("decode");
                record(order, &ctx).await.expect("infallible");
                handled += 1;
            }
            handled
        });
        for n in 0..messages {
            sender
                .send(serde_json::to_vec(&order(n)).expect("encode"))
                .expect("send");
        }
        drop(sender);
        assert_eq!(consumer.await.expect("join"), messages);
        baseline.push(rate(messages, started.elapsed()));
    }
    Figures {
        hexeract: median(hexeract),
        baseline: median(baseline),
    }
}
