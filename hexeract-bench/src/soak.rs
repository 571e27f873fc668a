//! Soak: many messages through the whole pipeline, outbox (PostgreSQL) → relay → RabbitMQ →
//! handler, to show that the process's memory depends on what is in flight, not on how many
//! messages went through, and that none is lost on the way.
//!
//! ```text
//! cargo run --release -p hexeract-bench -- soak [--messages N]    # N defaults to 1 000 000
//! ```
//!
//! A producer task writes the messages into the outbox in transactions of 1 000 while the
//! relay and the bus worker run, keeping at most 10 000 written but not yet handled: memory is
//! measured under steady flow, with a short table, not while draining a filled one. Payloads
//! are JSON of 200 to 700 bytes, one in ten larger, up to 2 KiB. Each message carries a
//! sequence number, and the handler counts its calls per number (a byte per message,
//! allocated and touched before the first measure, so that it is not counted as growth):
//! calls beyond the first are duplicates, numbers never called are lost.
//!
//! One line at the start, at 25, 50 and 75 % and at the end (`soak at=…`: messages handled,
//! handler calls, throughput so far, resident set `VmRSS` and its peak `VmHWM`), the bound
//! assumed (`soak bound_kib=…`), then the result:
//!
//! ```text
//! soak messages=<N> seconds=<s> throughput=<msgs/s> rss_start_kib=<k> rss_mid_kib=<k> rss_end_kib=<k> rss_peak_kib=<k> duplicates=<d> lost=<l>
//! ```
//!
//! The exit code is 1 when a message is lost, or when the resident set at the end exceeds the
//! one at 50 % by more than 20 % + 16 MiB (2 for bad arguments). What the process holds of the
//! messages is bounded by the worker's prefetch, a relay batch and a producer batch, each of
//! at most the largest payload and counted twice (decoded and encoded): `bound_kib`. The
//! middle, not the start, is the reference: the first thousands of messages grow connection
//! buffers, statement caches and the allocator's arenas once. Duplicates are reported but do
//! not fail the run: delivery is at least once.
//!
//! The run has a PostgreSQL schema (`bench_soak_<uuid>`) and broker objects
//! (`bench.soak.<uuid>`) of its own, dropped at the end; the services are those of the other
//! scenarios: `BENCH_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and
//! `BENCH_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`).

use std::convert::Infallible;
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hexeract::rabbitmq::{BusError, RabbitMqRelay, RabbitMqWorkerBuilder};
use hexeract::store::postgres::PgStore;
use hexeract::store::DeliveryStore;
use hexeract::{CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Registry};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::rabbitmq::{self, Place, HANDLER};

const DEFAULT_MESSAGES: u64 = 1_000_000;
/// The per-message counts take a byte each.
const MAX_MESSAGES: u64 = 1_000_000_000;
/// Messages per producer transaction.
const PRODUCER_BATCH: u64 = 1_000;
/// Messages written but not yet handled at which the producer waits.
const AHEAD: u64 = 10_000;
/// Outbox rows per relay pass.
const RELAY_BATCH: u32 = 100;
/// The worker's default, written out because the bound depends on it.
const PREFETCH: u32 = 16;
/// The largest payload the producer writes, and the largest the worker hands to the handler
/// (a larger one would be parked, and counted lost).
const MAX_PAYLOAD: usize = 2 * 1024;
/// Nine payloads in ten are at least this long and shorter than `LARGE_PAYLOAD`.
const SMALL_PAYLOAD: usize = 200;
const LARGE_PAYLOAD: usize = 700;
/// How often progress is looked at.
const TICK: Duration = Duration::from_millis(20);
/// No message handled for this long ends the run as a failure.
const STALL: Duration = Duration::from_secs(60);
/// After the last message, for late duplicates to arrive before the worker stops.
const SETTLE: Duration = Duration::from_secs(1);
/// Growth from the middle to the end that fails the run: this share of the middle…
const GROWTH_PERCENT: u64 = 20;
/// …plus this.
const GROWTH_SLACK_KIB: u64 = 16 * 1024;
/// What the messages in flight may hold, at most: see the module docs.
const BOUND_KIB: u64 =
    2 * (PREFETCH as u64 + RELAY_BATCH as u64 + PRODUCER_BATCH) * MAX_PAYLOAD as u64 / 1024;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "bench.SoakOrder")]
struct SoakOrder {
    seq: u64,
    customer: String,
    lines: Vec<SoakLine>,
    /// Padding to the payload's size.
    note: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SoakLine {
    sku: String,
    quantity: u32,
    cents: i64,
}

/// splitmix64: well-spread bits from a sequence number, the same in every run.
fn spread(seq: u64) -> u64 {
    let mut z = seq.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Message `seq`, padded so that its JSON is as long as its bits say.
fn order(seq: u64) -> SoakOrder {
    let bits = spread(seq);
    let pick = (bits >> 8) as usize;
    let length = if bits.is_multiple_of(10) {
        LARGE_PAYLOAD + pick % (MAX_PAYLOAD - LARGE_PAYLOAD + 1)
    } else {
        SMALL_PAYLOAD + pick % (LARGE_PAYLOAD - SMALL_PAYLOAD)
    };
    let lines = (0..1 + (bits >> 40) % 4)
        .map(|line| SoakLine {
            sku: format!("SKU-{:05}", (bits >> (line * 8)) & 0xffff),
            quantity: 1 + line as u32,
            cents: 100 + ((bits >> (line * 4)) & 0xfff) as i64,
        })
        .collect();
    let mut order = SoakOrder {
        seq,
        customer: format!("customer-{:04}", bits % 10_000),
        lines,
        note: String::new(),
    };
    let bare = serde_json::to_vec(&order).expect("encode").len();
    order.note = "x".repeat(length.saturating_sub(bare));
    order
}

/// Handler calls per message.
#[derive(Debug)]
struct Tally {
    /// Calls per sequence number, saturating at 255.
    calls: Box<[AtomicU8]>,
    /// Messages called at least once.
    handled: AtomicU64,
    /// Calls in all.
    total: AtomicU64,
    /// Calls for a sequence number out of range (another run's message).
    strays: AtomicU64,
}

impl Tally {
    fn new(messages: u64) -> Tally {
        let calls: Box<[AtomicU8]> = (0..messages).map(|_| AtomicU8::new(0)).collect();
        // Fault every page in now: a zeroed allocation may be mapped lazily, and would then
        // grow the resident set as messages are counted.
        for count in calls.iter().step_by(4096) {
            count.store(0, Ordering::Relaxed);
        }
        Tally {
            calls,
            handled: AtomicU64::new(0),
            total: AtomicU64::new(0),
            strays: AtomicU64::new(0),
        }
    }

    fn record(&self, seq: u64) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let Some(count) = usize::try_from(seq).ok().and_then(|at| self.calls.get(at)) else {
            self.strays.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let before = count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |calls| {
                calls.checked_add(1)
            })
            .unwrap_or(u8::MAX);
        if before == 0 {
            self.handled.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn handled(&self) -> u64 {
        self.handled.load(Ordering::Relaxed)
    }

    fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Calls beyond each message's first.
    fn duplicates(&self) -> u64 {
        self.calls
            .iter()
            .map(|count| u64::from(count.load(Ordering::Relaxed).saturating_sub(1)))
            .sum()
    }

    /// Messages never called.
    fn lost(&self) -> u64 {
        self.calls
            .iter()
            .filter(|count| count.load(Ordering::Relaxed) == 0)
            .count() as u64
    }
}

/// The handler: counts the call.
struct Record(Arc<Tally>);

impl Handler<SoakOrder> for Record {
    type Error = Infallible;
    async fn handle(&self, order: SoakOrder, _ctx: &Context) -> Result<(), Self::Error> {
        self.0.record(order.seq);
        black_box(&order);
        Ok(())
    }
}

/// The process's resident set and its peak, from `/proc/self/status`.
#[derive(Clone, Copy, Debug)]
struct Memory {
    rss_kib: u64,
    peak_kib: u64,
}

fn memory() -> Memory {
    let status =
        std::fs::read_to_string("/proc/self/status").expect("/proc/self/status (soak needs Linux)");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/self/status"))
    };
    Memory {
        rss_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
    }
}

fn progress(at: &str, tally: &Tally, elapsed: Duration, memory: Memory) {
    let handled = tally.handled();
    let throughput = if handled == 0 {
        0.0
    } else {
        crate::rate(handled, elapsed)
    };
    println!(
        "soak at={at} handled={handled} calls={} seconds={:.1} throughput={throughput:.0} \
         rss_kib={} peak_kib={}",
        tally.total(),
        elapsed.as_secs_f64(),
        memory.rss_kib,
        memory.peak_kib,
    );
}

/// `soak`'s arguments (those after `soak`).
#[derive(Debug, PartialEq, Eq)]
struct Options {
    messages: u64,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut messages = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let value = if arg == "--messages" {
            args.next().map(String::as_str)
        } else if let Some(value) = arg.strip_prefix("--messages=") {
            Some(value)
        } else {
            return Err(format!(
                "unknown argument `{arg}`; soak takes only --messages N"
            ));
        };
        if messages.is_some() {
            return Err("--messages given twice".to_owned());
        }
        let value = value.ok_or("--messages needs a number of messages, e.g. --messages 100000")?;
        messages = Some(messages_from(value)?);
    }
    Ok(Options {
        messages: messages.unwrap_or(DEFAULT_MESSAGES),
    })
}

fn messages_from(value: &str) -> Result<u64, String> {
    let digits = value.replace('_', "");
    match digits.parse::<u64>() {
        Ok(messages @ 1..=MAX_MESSAGES) => Ok(messages),
        Ok(_) => Err(format!(
            "--messages {value}: give between 1 and {MAX_MESSAGES} (the counts take a byte per message)"
        )),
        Err(_) => Err(format!(
            "--messages {value}: not a whole number of messages (e.g. 100000 or 1_000_000)"
        )),
    }
}

/// `hexeract-bench soak [--messages N]`: runs the soak, returns its verdict.
pub(crate) fn main(args: &[String]) -> ExitCode {
    let options = match parse(args) {
        Ok(options) => options,
        Err(problem) => {
            eprintln!("hexeract-bench soak: {problem}");
            eprintln!("usage: hexeract-bench soak [--messages N]   (default {DEFAULT_MESSAGES})");
            return ExitCode::from(2);
        }
    };
    let runtime = crate::runtime();
    // On a runtime worker, as the relay's and the worker's tasks are.
    let passed = runtime
        .block_on(async { tokio::spawn(run(options.messages)).await })
        .expect("join");
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How the run ended, when the last message was handled or it stopped short.
struct Ending {
    elapsed: Duration,
    mid: Option<Memory>,
    end: Memory,
    failure: Option<String>,
}

async fn run(messages: u64) -> bool {
    let tally = Arc::new(Tally::new(messages));
    let pool = crate::outbox::connect().await;
    let store = PgStore::new(
        pool.clone(),
        &format!("bench_soak_{}", Uuid::now_v7().simple()),
    )
    .expect("schema name");
    store.migrate().await.expect("migrate");
    let setup = rabbitmq::connect("soak-setup").await;
    let worker_connection = rabbitmq::connect("soak-worker").await;
    let relay_connection = rabbitmq::connect("soak-relay").await;
    let prefix = format!("bench.soak.{}", Uuid::now_v7().simple());
    let worker = RabbitMqWorkerBuilder::new(worker_connection.clone())
        .registry(Registry::new())
        .register_handler_with::<SoakOrder, _>(
            Record(tally.clone()),
            HandlerOptions::new().name(HANDLER),
        )
        .exchange(&prefix)
        .prefix(&prefix)
        .prefetch(PREFETCH)
        .max_payload_bytes(MAX_PAYLOAD)
        .park_without_rows()
        .build()
        .expect("worker");
    // Declared before the relay starts, so that no message reaches the exchange before its
    // queue is bound; the worker declares the same again.
    let place = Place::whole(worker.topology());
    place.declare(&setup).await;
    let relay = RabbitMqRelay::new(Arc::new(store.clone()), &relay_connection)
        .await
        .expect("relay")
        .exchange(&prefix)
        .batch_size(RELAY_BATCH);
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(worker.run(cancel.child_token()));
    let relay = tokio::spawn(relay.run(cancel.child_token()));

    println!(
        "soak bound_kib={BOUND_KIB} prefetch={PREFETCH} relay_batch={RELAY_BATCH} \
         producer_batch={PRODUCER_BATCH} max_payload_bytes={MAX_PAYLOAD} ahead={AHEAD} \
         tolerance=\"rss_end_kib <= rss_mid_kib + {GROWTH_PERCENT} % + {GROWTH_SLACK_KIB}\""
    );
    let start = memory();
    progress("start", &tally, Duration::ZERO, start);
    let started = Instant::now();
    let mut producer = Some(tokio::spawn(produce(
        pool.clone(),
        store.schema().as_str().to_owned(),
        messages,
        tally.clone(),
        cancel.child_token(),
    )));

    let ending = watch(
        &tally,
        messages,
        started,
        [("worker", &worker), ("relay", &relay)],
        &mut producer,
    )
    .await;
    if ending.failure.is_none() {
        drained(&store).await;
        tokio::time::sleep(SETTLE).await;
    }
    cancel.cancel();
    let worker = worker.await.expect("join");
    let relay = relay.await.expect("join");
    let producer = match producer {
        Some(producer) => producer.await,
        None => Ok(()),
    };

    let duplicates = tally.duplicates();
    let lost = tally.lost();
    let strays = tally.strays.load(Ordering::Relaxed);
    let mid = ending.mid.unwrap_or(ending.end);
    println!(
        "soak messages={messages} seconds={:.1} throughput={:.0} rss_start_kib={} \
         rss_mid_kib={} rss_end_kib={} rss_peak_kib={} duplicates={duplicates} lost={lost}",
        ending.elapsed.as_secs_f64(),
        crate::rate(tally.handled(), ending.elapsed),
        start.rss_kib,
        mid.rss_kib,
        ending.end.rss_kib,
        memory().peak_kib,
    );

    let mut failures: Vec<String> = ending.failure.into_iter().collect();
    if let Err(error) = worker {
        failures.push(format!("the worker failed: {error}"));
    }
    if let Err(error) = relay {
        failures.push(format!("the relay failed: {error}"));
    }
    if let Err(error) = producer {
        failures.push(format!("the producer failed: {error}"));
    }
    if lost > 0 {
        failures.push(format!("{lost} of {messages} messages were never handled"));
    }
    if strays > 0 {
        failures.push(format!(
            "{strays} handler calls for messages this run did not write"
        ));
    }
    let allowed = mid.rss_kib + mid.rss_kib * GROWTH_PERCENT / 100 + GROWTH_SLACK_KIB;
    if ending.end.rss_kib > allowed {
        failures.push(format!(
            "the resident set grew from {} KiB at 50 % to {} KiB at the end, more than the \
             {allowed} KiB allowed ({GROWTH_PERCENT} % + {GROWTH_SLACK_KIB} KiB)",
            mid.rss_kib, ending.end.rss_kib
        ));
    }
    for failure in &failures {
        eprintln!("soak failed: {failure}");
    }

    place.delete(&setup).await;
    crate::outbox::drop_schema(&pool, &store).await;
    let _ = relay_connection.close().await;
    let _ = worker_connection.close().await;
    let _ = setup.close().await;
    pool.close().await;
    failures.is_empty()
}

/// Waits (up to `STALL`) for the relay to delete the last rows it published: messages may be
/// handled before the relay's pass commits.
async fn drained(store: &PgStore) {
    let since = Instant::now();
    loop {
        match store.backlog().await.expect("backlog") {
            0 => return,
            left if since.elapsed() >= STALL => {
                eprintln!(
                    "soak: {left} outbox rows still there {} s after the last message",
                    STALL.as_secs()
                );
                return;
            }
            _ => tokio::time::sleep(TICK).await,
        }
    }
}

/// Writes `messages` into the outbox, `PRODUCER_BATCH` per transaction, waiting while `AHEAD`
/// are written but not handled.
async fn produce(
    pool: PgPool,
    schema: String,
    messages: u64,
    tally: Arc<Tally>,
    cancel: CancellationToken,
) {
    let mut batch = Vec::with_capacity(PRODUCER_BATCH as usize);
    let mut written = 0;
    while written < messages {
        while written - tally.handled() >= AHEAD {
            if cancel.is_cancelled() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let upto = messages.min(written + PRODUCER_BATCH);
        batch.clear();
        batch.extend((written..upto).map(|seq| Envelope::new(&order(seq)).expect("encode")));
        let mut tx = pool.begin().await.expect("begin");
        hexeract::outbox::enqueue_envelopes(&mut tx, &schema, &batch)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        written = upto;
    }
}

/// Prints progress at each quarter until every message was handled, or until the run cannot
/// end: nothing handled for `STALL`, the worker or the relay stopped (they stop only on error),
/// or the producer failed. A producer that ended is taken out of `producer` and awaited.
async fn watch(
    tally: &Tally,
    messages: u64,
    started: Instant,
    loops: [(&str, &JoinHandle<Result<(), BusError>>); 2],
    producer: &mut Option<JoinHandle<()>>,
) -> Ending {
    let quarter = |n: usize| (messages * n as u64).div_ceil(4);
    let mut next = 1;
    let mut mid = None;
    let mut last_progress = (0, Instant::now());
    let mut tick = tokio::time::interval(TICK);
    loop {
        tick.tick().await;
        let handled = tally.handled();
        while next <= 4 && handled >= quarter(next) {
            let elapsed = started.elapsed();
            let now = memory();
            progress(["25%", "50%", "75%", "end"][next - 1], tally, elapsed, now);
            if next == 2 {
                mid = Some(now);
            }
            if next == 4 {
                return Ending {
                    elapsed,
                    mid,
                    end: now,
                    failure: None,
                };
            }
            next += 1;
        }
        let mut failure = None;
        if handled > last_progress.0 {
            last_progress = (handled, Instant::now());
        } else if last_progress.1.elapsed() >= STALL {
            failure = Some(format!("no message handled for {} s", STALL.as_secs()));
        }
        if let Some((name, _)) = loops.iter().find(|(_, task)| task.is_finished()) {
            failure = Some(format!("the {name} stopped with messages still owed"));
        }
        if producer.as_ref().is_some_and(JoinHandle::is_finished) {
            if let Err(error) = producer.take().expect("checked").await {
                failure = Some(format!("the producer failed: {error}"));
            }
        }
        if let Some(failure) = failure {
            let elapsed = started.elapsed();
            let now = memory();
            progress("stopped", tally, elapsed, now);
            return Ending {
                elapsed,
                mid,
                end: now,
                failure: Some(failure),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn messages_default_and_given() {
        assert_eq!(
            parse(&[]),
            Ok(Options {
                messages: DEFAULT_MESSAGES
            })
        );
        assert_eq!(
            parse(&args("--messages 100000")),
            Ok(Options { messages: 100_000 })
        );
        assert_eq!(
            parse(&args("--messages=1_000")),
            Ok(Options { messages: 1_000 })
        );
    }

    #[test]
    fn bad_arguments_are_refused_with_the_fix() {
        for (line, says) in [
            ("--messages", "needs a number"),
            ("--messages 0", "between 1 and"),
            ("--messages -5", "not a whole number"),
            ("--messages lots", "not a whole number"),
            ("--messages 2000000000", "between 1 and"),
            ("--messages 1 --messages 2", "given twice"),
            ("--quick", "unknown argument `--quick`"),
            ("--messagesx", "unknown argument"),
        ] {
            let problem = parse(&args(line)).expect_err(line);
            assert!(problem.contains(says), "{line}: {problem}");
        }
    }

    #[test]
    fn payloads_vary_up_to_the_largest() {
        let lengths: Vec<usize> = (0..20_000)
            .map(|seq| Envelope::new(&order(seq)).expect("encode").payload.len())
            .collect();
        assert!(lengths
            .iter()
            .all(|&length| (SMALL_PAYLOAD..=MAX_PAYLOAD).contains(&length)));
        let large = lengths
            .iter()
            .filter(|&&length| length >= LARGE_PAYLOAD)
            .count();
        assert!(
            (1_500..2_500).contains(&large),
            "{large} large payloads in 20 000"
        );
        assert!(lengths.iter().any(|&length| length > MAX_PAYLOAD - 100));
        let seq = u64::MAX - 1;
        assert!(Envelope::new(&order(seq)).expect("encode").payload.len() <= MAX_PAYLOAD);
    }

    #[test]
    fn tally_counts_duplicates_lost_and_strays() {
        let tally = Tally::new(4);
        for seq in [0, 1, 1, 3, 3, 3, 9] {
            tally.record(seq);
        }
        assert_eq!(tally.handled(), 3);
        assert_eq!(tally.total(), 7);
        assert_eq!(tally.duplicates(), 3);
        assert_eq!(tally.lost(), 1);
        assert_eq!(tally.strays.load(Ordering::Relaxed), 1);
    }
}
