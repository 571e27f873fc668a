//! RabbitMQ: the bus worker, the confirmed publisher and the outbox relay against raw lapin
//! (and sqlx) loops doing the same work on queues of the same shape, in alternating pairs.
//!
//! Every run declares broker objects of its own (`bench.<uuid>`) and deletes them afterwards;
//! what a run needs in place beforehand (a filled queue, a filled outbox) is made before its
//! clock starts.

use std::collections::{BTreeMap, VecDeque};
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::StreamExt;
use hexeract::rabbitmq::{
    ensure_topology, headers, redact_url, Binding, Exchange, Queue, RabbitMqConnection,
    RabbitMqPublisher, RabbitMqRelay, RabbitMqWorker, RabbitMqWorkerBuilder, Topology,
};
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::DeliveryStore;
use hexeract::{CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Registry};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, PublisherConfirm};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection as _, Row};
use tokio::sync::Notify;
use uuid::Uuid;

const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// The worker's default prefetch (`AMQP_PREFETCH`): `rabbitmq_consume` runs at it, and at
/// [`RAISED_PREFETCHES`].
pub(crate) const PREFETCH: u16 = 16;
/// Prefetches a user raising `AMQP_PREFETCH` would set: `rabbitmq_consume_prefetch<N>`.
pub(crate) const RAISED_PREFETCHES: [u16; 2] = [128, 512];
/// Publishes waiting for their confirms at once, on both sides.
pub(crate) const CONFIRM_WINDOW: usize = 128;
/// Envelopes per `publish_all` call.
pub(crate) const PUBLISH_BATCH: usize = 1_000;
/// Outbox rows per relay pass.
const RELAY_BATCH: u32 = 100;
/// (hexeract, baseline) pairs of the publish and relay scenarios.
const PAIRS: usize = 7;
/// Rounds of the consume scenario, each draining three queues (hexeract and both baselines).
const CONSUME_ROUNDS: usize = 3;
/// A pause after filling queues, for the broker's background work on them to end.
pub(crate) const SETTLE: Duration = Duration::from_millis(300);
pub(crate) const HANDLER: &str = "bench.count";

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "bench.StockReserved")]
struct StockReserved {
    order_id: u64,
    sku: String,
    quantity: u32,
}

pub(crate) fn envelopes(messages: u64) -> Vec<Envelope> {
    (0..messages)
        .map(|order_id| {
            Envelope::new(&StockReserved {
                order_id,
                sku: "SKU-0042".into(),
                quantity: 3,
            })
            .expect("encode")
        })
        .collect()
}

/// The no-op handler: counts, and says when the last expected message arrived.
struct Count {
    seen: Arc<AtomicU64>,
    expected: u64,
    done: Arc<Notify>,
}

impl Count {
    fn new(expected: u64) -> Count {
        Count {
            seen: Arc::new(AtomicU64::new(0)),
            expected,
            done: Arc::new(Notify::new()),
        }
    }
}

impl Handler<StockReserved> for Count {
    type Error = std::convert::Infallible;
    async fn handle(&self, item: StockReserved, _ctx: &Context) -> Result<(), Self::Error> {
        black_box(&item);
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.expected {
            self.done.notify_one();
        }
        Ok(())
    }
}

pub(crate) fn url() -> String {
    std::env::var("BENCH_AMQP_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

fn unreachable(url: &str, error: &dyn std::fmt::Display) -> ! {
    panic!(
        "cannot reach RabbitMQ at {} ({error}); start it or set BENCH_AMQP_URL",
        redact_url(url)
    )
}

/// A Hexeract connection named `hexeract-bench-<name>`.
pub(crate) async fn connect(name: &str) -> RabbitMqConnection {
    let url = url();
    RabbitMqConnection::connect_named(&url, &format!("hexeract-bench-{name}"))
        .await
        .unwrap_or_else(|error| unreachable(&url, &error))
}

/// A plain lapin connection named `hexeract-bench-<name>`, for the baselines.
pub(crate) async fn connect_raw(name: &str) -> Connection {
    let url = url();
    let properties = ConnectionProperties::default()
        .with_connection_name(format!("hexeract-bench-{name}").into());
    Connection::connect(&url, properties)
        .await
        .unwrap_or_else(|error| unreachable(&url, &error))
}

/// The topology of the one no-op handler under `prefix`, with `prefix` as the exchange too.
pub(crate) fn topology(prefix: &str) -> Topology {
    let mut registry = Registry::new();
    registry
        .register::<StockReserved, _>(Count::new(0), HandlerOptions::new().name(HANDLER))
        .expect("register");
    Topology::from_registry(&registry)
        .exchange(prefix)
        .prefix(prefix)
}

pub(crate) fn fresh_prefix() -> String {
    format!("bench.{}", Uuid::now_v7().simple())
}

/// One run's broker objects.
pub(crate) struct Place {
    exchanges: Vec<Exchange>,
    queues: Vec<Queue>,
    bindings: Vec<Binding>,
    /// The message exchange.
    pub(crate) exchange: String,
    /// The handler's queue.
    pub(crate) queue: String,
}

impl Place {
    /// Everything the worker would declare: exchanges, handler and parking queue, wait tiers.
    pub(crate) fn whole(topology: &Topology) -> Place {
        Place {
            exchanges: topology.exchanges(),
            queues: topology.queues(),
            bindings: topology.bindings(),
            exchange: topology.exchange_name().to_owned(),
            queue: topology.queue_for(HANDLER),
        }
    }

    /// The message exchange and the handler's queue (a quorum queue, as the worker declares
    /// it) bound to it by message type, and nothing else.
    pub(crate) fn handler_queue(topology: &Topology) -> Place {
        Place::handler_queue_of(topology, HANDLER)
    }

    /// [`handler_queue`](Place::handler_queue) of `handler`.
    pub(crate) fn handler_queue_of(topology: &Topology, handler: &str) -> Place {
        let exchange = topology.exchange_name().to_owned();
        let queue = topology.queue_for(handler);
        Place {
            exchanges: topology
                .exchanges()
                .into_iter()
                .filter(|candidate| candidate.name == exchange)
                .collect(),
            queues: topology
                .queues()
                .into_iter()
                .filter(|candidate| candidate.name == queue)
                .collect(),
            bindings: topology
                .bindings()
                .into_iter()
                .filter(|candidate| candidate.queue == queue && candidate.exchange == exchange)
                .collect(),
            exchange,
            queue,
        }
    }

    pub(crate) async fn declare(&self, setup: &RabbitMqConnection) {
        ensure_topology(setup, &self.exchanges, &self.queues, &self.bindings)
            .await
            .expect("declare");
    }

    pub(crate) async fn delete(&self, setup: &RabbitMqConnection) {
        let channel = setup.lapin().create_channel().await.expect("channel");
        for queue in &self.queues {
            channel
                .queue_delete(queue.name.as_str().into(), QueueDeleteOptions::default())
                .await
                .expect("delete queue");
        }
        for exchange in &self.exchanges {
            channel
                .exchange_delete(
                    exchange.name.as_str().into(),
                    ExchangeDeleteOptions::default(),
                )
                .await
                .expect("delete exchange");
        }
        let _ = channel.close(200, "bench run cleaned up".into()).await;
    }
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes()))
}

/// What Hexeract puts on the wire for an envelope (`docs/wire-format.md`), written out by
/// hand, so that the raw publishers send properties of the same size.
pub(crate) fn properties(
    id: &str,
    message_type: &str,
    created_at: DateTime<Utc>,
    extra: &BTreeMap<String, String>,
) -> BasicProperties {
    let mut table = FieldTable::default();
    for (name, value) in extra {
        table.insert(name.as_str().into(), text(value));
    }
    table.insert(
        headers::CREATED_AT.into(),
        text(&created_at.to_rfc3339_opts(SecondsFormat::Millis, true)),
    );
    BasicProperties::default()
        .with_message_id(id.into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(created_at.timestamp()).unwrap_or(0))
        .with_headers(table)
        .with_type(message_type.into())
}

fn envelope_properties(envelope: &Envelope) -> BasicProperties {
    properties(
        &envelope.id.to_string(),
        &envelope.message_type,
        envelope.created_at,
        &envelope.headers,
    )
}

/// Raw confirmed publishing with at most `CONFIRM_WINDOW` confirms outstanding: when the
/// window is full, waits for the oldest.
pub(crate) struct Window<'a> {
    channel: &'a Channel,
    pending: VecDeque<PublisherConfirm>,
}

impl<'a> Window<'a> {
    pub(crate) fn new(channel: &'a Channel) -> Window<'a> {
        Window {
            channel,
            pending: VecDeque::with_capacity(CONFIRM_WINDOW),
        }
    }

    pub(crate) async fn publish(
        &mut self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) {
        if self.pending.len() >= CONFIRM_WINDOW {
            let oldest = self.pending.pop_front().expect("a full window");
            assert!(oldest.await.expect("confirm").is_ack(), "nacked");
        }
        let confirm = self
            .channel
            .basic_publish(
                ShortString::from(exchange),
                ShortString::from(routing_key),
                BasicPublishOptions::default(),
                payload,
                properties,
            )
            .await
            .expect("publish");
        self.pending.push_back(confirm);
    }

    /// Waits for every outstanding confirm.
    pub(crate) async fn settle(&mut self) {
        while let Some(confirm) = self.pending.pop_front() {
            assert!(confirm.await.expect("confirm").is_ack(), "nacked");
        }
    }
}

pub(crate) async fn confirm_channel(connection: &Connection) -> Channel {
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    channel
}

/// Fills `queue` through the default exchange, confirmed, before a run's clock starts.
pub(crate) async fn preload(setup: &RabbitMqConnection, queue: &str, messages: &[Envelope]) {
    let channel = confirm_channel(setup.lapin()).await;
    let mut window = Window::new(&channel);
    for envelope in messages {
        window
            .publish("", queue, &envelope.payload, envelope_properties(envelope))
            .await;
    }
    window.settle().await;
    let _ = channel.close(200, "preloaded".into()).await;
}

fn rate(messages: u64, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The two lines of a scenario: medians, the median of the pairs' ratios, their spread.
pub(crate) fn report(
    scenario: &str,
    hexeract: &[f64],
    baseline: &[f64],
    messages: u64,
    extra: &str,
) {
    let mut ratios: Vec<f64> = hexeract.iter().zip(baseline).map(|(h, b)| h / b).collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "scenario={scenario} hexeract={:.0} baseline={:.0} ratio={:.3}",
        median(hexeract.to_vec()),
        median(baseline.to_vec()),
        ratios[ratios.len() / 2]
    );
    println!(
        "scenario={scenario} ratio_min={:.3} ratio_max={:.3} pairs={} messages={messages}{extra}",
        ratios[0],
        ratios[ratios.len() - 1],
        ratios.len(),
    );
}

// ---------------------------------------------------------------------------------------------
// rabbitmq_consume

/// How a run drains its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drain {
    /// The worker with the no-op handler.
    Hexeract,
    /// Raw lapin, acks coalesced with `multiple` every half window of deliveries.
    Coalesced,
    /// Raw lapin, every ack awaited on its own.
    Awaited,
}

/// A worker with the no-op handler on its handler queue under `prefix`, and the signal that the
/// handler saw `expected` messages.
pub(crate) fn consume_worker(
    connection: &RabbitMqConnection,
    prefix: &str,
    expected: u64,
    prefetch: u16,
) -> (RabbitMqWorker, Arc<Notify>) {
    let count = Count::new(expected);
    let done = count.done.clone();
    let worker = RabbitMqWorkerBuilder::new(connection.clone())
        .registry(Registry::new())
        .register_handler_with::<StockReserved, _>(count, HandlerOptions::new().name(HANDLER))
        .exchange(prefix)
        .prefix(prefix)
        .prefetch(u32::from(prefetch))
        // Declared before the clock starts, to fill the queue.
        .skip_declare()
        .park_without_rows()
        .build()
        .expect("worker");
    (worker, done)
}

/// The worker draining its preloaded handler queue: from its start until the handler saw every
/// message.
/// How long one run may take before it counts as stalled.
const RUN_DEADLINE: Duration = Duration::from_secs(300);

pub(crate) async fn run_worker(worker: RabbitMqWorker, done: Arc<Notify>) -> Duration {
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(cancel.clone()));
    // A run that loses a message would wait here for good (CI's bench phase once did, in
    // `rabbitmq_retry_tiers`): a deadline far above any run's length turns it into a failure
    // that says where it stopped.
    if tokio::time::timeout(RUN_DEADLINE, done.notified())
        .await
        .is_err()
    {
        cancel.cancel();
        let stopped = running.await;
        panic!(
            "the worker did not handle every message within {RUN_DEADLINE:?} (a message lost \
             or stuck on the broker); the worker stopped with {stopped:?}"
        );
    }
    let elapsed = started.elapsed();
    cancel.cancel();
    running.await.expect("join").expect("run");
    elapsed
}

/// A raw consumer on a queue of the same shape: the worker's prefetch, manual acks, each payload
/// decoded. With `coalesce`, acks with `multiple` every half window of deliveries (as the
/// worker does) and at the end; without, awaits every ack on its own.
async fn consume_raw(
    connection: &Connection,
    queue: &str,
    expected: u64,
    coalesce: bool,
    prefetch: u16,
) -> Duration {
    let ack_every = u64::from(prefetch / 2).max(1);
    let started = Instant::now();
    let channel = connection.create_channel().await.expect("channel");
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await
        .expect("basic.qos");
    let mut deliveries = channel
        .basic_consume(
            queue.into(),
            format!("hexeract-bench:{}", Uuid::now_v7().simple()).into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("basic.consume");
    let mut seen = 0u64;
    while seen < expected {
        let delivery = deliveries
            .next()
            .await
            .expect("the consumer ended")
            .expect("delivery");
        let item: StockReserved = serde_json::from_slice(&delivery.data).expect("decode");
        black_box(item);
        seen += 1;
        if !coalesce {
            channel
                .basic_ack(delivery.delivery_tag, BasicAckOptions { multiple: false })
                .await
                .expect("ack");
        } else if seen.is_multiple_of(ack_every) || seen == expected {
            channel
                .basic_ack(delivery.delivery_tag, BasicAckOptions { multiple: true })
                .await
                .expect("ack");
        }
    }
    let elapsed = started.elapsed();
    let _ = channel.close(200, "drained".into()).await;
    elapsed
}

/// Prints the `rabbitmq_consume` lines (against coalesced acks) and the
/// `rabbitmq_consume_vs_awaited_acks` lines at the worker's default prefetch, then
/// `rabbitmq_consume_prefetch<N>` (against coalesced acks) at each raised prefetch.
///
/// Each round fills fresh queues at once (the worker's whole topology, and one quorum queue of
/// the same shape per raw consumer), then drains them one after the other, starting with a
/// different side each round.
pub(crate) async fn consume(messages: u64) {
    // On a runtime worker, as the worker's and the relay's tasks are, not on the thread blocked
    // in `block_on`: both sides then wake and are woken the same way.
    tokio::spawn(run_consume(
        messages,
        PREFETCH,
        &[Drain::Hexeract, Drain::Coalesced, Drain::Awaited],
    ))
    .await
    .expect("join");
    // Three times the messages: drained three to four times faster, the runs would otherwise
    // last a quarter of a second, too short to measure steadily.
    for prefetch in RAISED_PREFETCHES {
        tokio::spawn(run_consume(
            3 * messages,
            prefetch,
            &[Drain::Hexeract, Drain::Coalesced],
        ))
        .await
        .expect("join");
    }
}

/// RabbitMQ's process (the Erlang VM), whose processor time the consume lines give when it
/// runs on this machine.
const BROKER_PROCESS: &str = "beam.smp";

async fn run_consume(messages: u64, prefetch: u16, sides: &'static [Drain]) {
    let setup = connect("setup").await;
    let connection = connect("consume-hexeract").await;
    let raw = connect_raw("consume-baseline").await;
    let batch = envelopes(messages);
    let mut hexeract = Vec::new();
    let mut coalesced = Vec::new();
    let mut awaited = Vec::new();
    // Per side (in `sides`' order), processor time spent draining: this process's (the
    // consumer's side) and the local broker's.
    let mut client = vec![Duration::ZERO; sides.len()];
    let mut broker = vec![Duration::ZERO; sides.len()];
    for round in 0..CONSUME_ROUNDS {
        let mut worker = Some(consume_worker(
            &connection,
            &fresh_prefix(),
            messages,
            prefetch,
        ));
        let places: Vec<Place> = sides
            .iter()
            .map(|side| match side {
                Drain::Hexeract => Place::whole(worker.as_ref().expect("not run yet").0.topology()),
                Drain::Coalesced | Drain::Awaited => {
                    Place::handler_queue(&topology(&fresh_prefix()))
                }
            })
            .collect();
        for place in &places {
            place.declare(&setup).await;
        }
        futures_util::future::join_all(
            places
                .iter()
                .map(|place| preload(&setup, &place.queue, &batch)),
        )
        .await;
        tokio::time::sleep(SETTLE).await;
        for at in 0..sides.len() {
            let at = (at + round) % sides.len();
            let queue = &places[at].queue;
            let (client_before, broker_before) = (
                crate::cpu::this_process(),
                crate::cpu::processes_named(BROKER_PROCESS),
            );
            match sides[at] {
                Drain::Hexeract => {
                    let (worker, done) = worker.take().expect("run once");
                    hexeract.push(rate(messages, run_worker(worker, done).await));
                }
                Drain::Coalesced => {
                    coalesced.push(rate(
                        messages,
                        consume_raw(&raw, queue, messages, true, prefetch).await,
                    ));
                }
                Drain::Awaited => {
                    awaited.push(rate(
                        messages,
                        consume_raw(&raw, queue, messages, false, prefetch).await,
                    ));
                }
            }
            client[at] += crate::cpu::this_process().saturating_sub(client_before);
            broker[at] += crate::cpu::processes_named(BROKER_PROCESS).saturating_sub(broker_before);
        }
        for place in &places {
            place.delete(&setup).await;
        }
    }
    let drained = messages * CONSUME_ROUNDS as u64;
    // Each side's processor time per message, against the baseline `against`: the consumer's
    // (this process) and, where it runs on this machine, the broker's.
    let cpu = |against: Drain| {
        let side = |drain: Drain| sides.iter().position(|&s| s == drain).expect("a side");
        let (h, b) = (side(Drain::Hexeract), side(against));
        let per_message = |used: Duration| crate::cpu::per_message(used, drained);
        let mut line = format!(
            " hexeract_cpu_us_per_msg={:.2} baseline_cpu_us_per_msg={:.2}",
            per_message(client[h]),
            per_message(client[b])
        );
        if !broker[h].is_zero() {
            line.push_str(&format!(
                " hexeract_broker_cpu_us_per_msg={:.2} baseline_broker_cpu_us_per_msg={:.2}",
                per_message(broker[h]),
                per_message(broker[b])
            ));
        }
        line
    };
    let extra = format!(" prefetch={prefetch}");
    if prefetch == PREFETCH {
        let vs_coalesced = format!("{extra}{}", cpu(Drain::Coalesced));
        report(
            "rabbitmq_consume",
            &hexeract,
            &coalesced,
            messages,
            &vs_coalesced,
        );
        let vs_awaited = format!("{extra}{}", cpu(Drain::Awaited));
        report(
            "rabbitmq_consume_vs_awaited_acks",
            &hexeract,
            &awaited,
            messages,
            &vs_awaited,
        );
    } else {
        let scenario = format!("rabbitmq_consume_prefetch{prefetch}");
        let vs_coalesced = format!("{extra}{}", cpu(Drain::Coalesced));
        report(&scenario, &hexeract, &coalesced, messages, &vs_coalesced);
    }
    let _ = raw.close(200, "bench done".into()).await;
    let _ = connection.close().await;
    let _ = setup.close().await;
}

// ---------------------------------------------------------------------------------------------
// rabbitmq_publish

pub(crate) async fn publish_hexeract(
    setup: &RabbitMqConnection,
    connection: &RabbitMqConnection,
    messages: &[Envelope],
) -> Duration {
    publish_hexeract_within(setup, connection, messages, CONFIRM_WINDOW).await
}

/// [`publish_hexeract`] with at most `window` confirms outstanding.
pub(crate) async fn publish_hexeract_within(
    setup: &RabbitMqConnection,
    connection: &RabbitMqConnection,
    messages: &[Envelope],
    window: usize,
) -> Duration {
    let place = Place::handler_queue(&topology(&fresh_prefix()));
    place.declare(setup).await;
    let publisher = RabbitMqPublisher::new(connection)
        .await
        .expect("publisher")
        .exchange(place.exchange.clone())
        .confirm_window(window);
    let started = Instant::now();
    for batch in messages.chunks(PUBLISH_BATCH) {
        publisher.publish_all(batch).await.expect("publish_all");
    }
    let elapsed = started.elapsed();
    drop(publisher);
    place.delete(setup).await;
    elapsed
}

async fn publish_raw(
    setup: &RabbitMqConnection,
    connection: &Connection,
    messages: &[Envelope],
) -> Duration {
    let place = Place::handler_queue(&topology(&fresh_prefix()));
    place.declare(setup).await;
    let channel = confirm_channel(connection).await;
    let started = Instant::now();
    let mut window = Window::new(&channel);
    for envelope in messages {
        window
            .publish(
                &place.exchange,
                &envelope.message_type,
                &envelope.payload,
                envelope_properties(envelope),
            )
            .await;
    }
    window.settle().await;
    let elapsed = started.elapsed();
    let _ = channel.close(200, "published".into()).await;
    place.delete(setup).await;
    elapsed
}

/// Prints the `rabbitmq_publish` lines.
pub(crate) async fn publish(messages: u64) {
    // On a runtime worker, as the worker's and the relay's tasks are, not on the thread blocked
    // in `block_on`: both sides then wake and are woken the same way.
    tokio::spawn(run_publish(messages)).await.expect("join");
}

async fn run_publish(messages: u64) {
    let setup = connect("setup").await;
    let connection = connect("publish-hexeract").await;
    let raw = connect_raw("publish-baseline").await;
    let batch = envelopes(messages);
    let mut hexeract = Vec::new();
    let mut baseline = Vec::new();
    for pair in 0..PAIRS {
        // Which side goes first alternates, so that neither always follows the other's cleanup.
        for side in [pair % 2, 1 - pair % 2] {
            if side == 0 {
                let elapsed = publish_hexeract(&setup, &connection, &batch).await;
                hexeract.push(rate(messages, elapsed));
            } else {
                baseline.push(rate(messages, publish_raw(&setup, &raw, &batch).await));
            }
        }
    }
    report(
        "rabbitmq_publish",
        &hexeract,
        &baseline,
        messages,
        &format!(" batch={PUBLISH_BATCH} window={CONFIRM_WINDOW}"),
    );
    let _ = raw.close(200, "bench done".into()).await;
    let _ = connection.close().await;
    let _ = setup.close().await;
}

// ---------------------------------------------------------------------------------------------
// rabbitmq_relay

/// A temporary directory holding one run's SQLite outbox, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new() -> TempDir {
        let path = std::env::temp_dir().join(format!("hexeract-bench-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub(crate) fn database(&self) -> PathBuf {
        self.0.join("outbox.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A migrated SQLite outbox holding `messages`.
pub(crate) async fn filled_outbox(dir: &TempDir, messages: &[Envelope]) -> SqliteStore {
    let store = SqliteStore::open(dir.database()).await.expect("open");
    store.migrate().await.expect("migrate");
    for chunk in messages.chunks(1_000) {
        store.publish(chunk.to_vec()).await.expect("fill");
    }
    store
}

async fn relay_hexeract(
    setup: &RabbitMqConnection,
    connection: &RabbitMqConnection,
    messages: &[Envelope],
) -> Duration {
    let dir = TempDir::new();
    let store = filled_outbox(&dir, messages).await;
    let place = Place::handler_queue(&topology(&fresh_prefix()));
    place.declare(setup).await;
    let relay = RabbitMqRelay::new(Arc::new(store.clone()), connection)
        .await
        .expect("relay")
        .exchange(place.exchange.clone())
        .batch_size(RELAY_BATCH);
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(relay.run(cancel.clone()));
    while store.backlog().await.expect("backlog") > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    cancel.cancel();
    running.await.expect("join").expect("relay");
    store.pool().close().await;
    place.delete(setup).await;
    elapsed
}

/// The relay's pass by hand: in a `BEGIN IMMEDIATE` transaction, take the oldest rows, publish
/// them with confirms, delete them, commit; until a pass finds nothing.
async fn relay_raw(
    setup: &RabbitMqConnection,
    connection: &Connection,
    messages: &[Envelope],
) -> Duration {
    let dir = TempDir::new();
    let store = filled_outbox(&dir, messages).await;
    store.pool().close().await;
    let place = Place::handler_queue(&topology(&fresh_prefix()));
    place.declare(setup).await;
    let mut db = SqliteConnectOptions::new()
        .filename(dir.database())
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5))
        .disable_statement_logging()
        .connect()
        .await
        .expect("open");
    let channel = confirm_channel(connection).await;
    let take = "SELECT id, message_type, payload, headers, correlation_id, causation_id, \
                created_at FROM hexeract_outbox ORDER BY id LIMIT ?1";
    let delete = "DELETE FROM hexeract_outbox WHERE id IN (SELECT value FROM json_each(?1))";
    let started = Instant::now();
    let mut relayed = 0usize;
    loop {
        let mut tx = db.begin_with("BEGIN IMMEDIATE").await.expect("begin");
        let rows = sqlx::query(take)
            .bind(i64::from(RELAY_BATCH))
            .fetch_all(&mut *tx)
            .await
            .expect("take");
        if rows.is_empty() {
            tx.rollback().await.expect("rollback");
            break;
        }
        let mut window = Window::new(&channel);
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: String = row.get("id");
            let message_type: String = row.get("message_type");
            let payload: Vec<u8> = row.get("payload");
            let extra: BTreeMap<String, String> =
                serde_json::from_str(row.get::<&str, _>("headers")).expect("headers");
            let created_at: DateTime<Utc> = row.get("created_at");
            window
                .publish(
                    &place.exchange,
                    &message_type,
                    &payload,
                    properties(&id, &message_type, created_at, &extra),
                )
                .await;
            ids.push(id);
        }
        window.settle().await;
        sqlx::query(delete)
            .bind(serde_json::to_string(&ids).expect("ids"))
            .execute(&mut *tx)
            .await
            .expect("delete");
        tx.commit().await.expect("commit");
        relayed += ids.len();
    }
    let elapsed = started.elapsed();
    assert_eq!(relayed, messages.len());
    let _ = channel.close(200, "relayed".into()).await;
    db.close().await.expect("close");
    place.delete(setup).await;
    elapsed
}

/// Prints the `rabbitmq_relay` lines.
pub(crate) async fn relay(messages: u64) {
    // On a runtime worker, as the worker's and the relay's tasks are, not on the thread blocked
    // in `block_on`: both sides then wake and are woken the same way.
    tokio::spawn(run_relay(messages)).await.expect("join");
}

async fn run_relay(messages: u64) {
    let setup = connect("setup").await;
    let connection = connect("relay-hexeract").await;
    let raw = connect_raw("relay-baseline").await;
    let batch = envelopes(messages);
    let mut hexeract = Vec::new();
    let mut baseline = Vec::new();
    for pair in 0..PAIRS {
        // Which side goes first alternates, so that neither always follows the other's cleanup.
        for side in [pair % 2, 1 - pair % 2] {
            if side == 0 {
                let elapsed = relay_hexeract(&setup, &connection, &batch).await;
                hexeract.push(rate(messages, elapsed));
            } else {
                baseline.push(rate(messages, relay_raw(&setup, &raw, &batch).await));
            }
        }
    }
    report(
        "rabbitmq_relay",
        &hexeract,
        &baseline,
        messages,
        &format!(" batch={RELAY_BATCH} window={CONFIRM_WINDOW}"),
    );
    let _ = raw.close(200, "bench done".into()).await;
    let _ = connection.close().await;
    let _ = setup.close().await;
}

// ---------------------------------------------------------------------------------------------
// rabbitmq_retry_tiers

/// The one wait tier of `rabbitmq_retry_tiers`: short, so that a run measures the broker's
/// work on the retry path rather than the delay.
const RETRY_TIER: Duration = Duration::from_millis(50);
/// (quorum, classic) pairs of the retry scenario.
const RETRY_PAIRS: usize = 3;

/// Fails each message's first call and counts the second.
struct FailFirst(Count);

impl Handler<StockReserved> for FailFirst {
    type Error = String;
    async fn handle(&self, item: StockReserved, ctx: &Context) -> Result<(), Self::Error> {
        if ctx.attempt() == 1 {
            return Err("first call".to_owned());
        }
        let _ = self.0.handle(item, ctx).await;
        Ok(())
    }
}

/// The retry path through quorum wait tiers (at-least-once dead-lettering, what the worker
/// declares) against classic ones (what it declared before): the same worker, each message
/// failing once, republished to the tier, dead-lettered back by the broker after 50 ms and
/// handled again; msgs/s of messages handled twice.
pub(crate) async fn retry_tiers(messages: u64) {
    tokio::spawn(run_retry_tiers(messages)).await.expect("join");
}

async fn run_retry_tiers(messages: u64) {
    let setup = connect("retry-setup").await;
    let payloads = envelopes(messages);
    let (mut quorum, mut classic) = (Vec::new(), Vec::new());
    for pair in 0..RETRY_PAIRS {
        // Alternate which side goes first: the broker's state after a run favours neither.
        let sides = if pair % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for quorum_tiers in sides {
            let rate = retry_run(&setup, &payloads, quorum_tiers).await;
            if quorum_tiers {
                quorum.push(rate);
            } else {
                classic.push(rate);
            }
        }
    }
    report(
        "rabbitmq_retry_tiers",
        &quorum,
        &classic,
        messages,
        " hexeract=quorum_wait_tiers baseline=classic_wait_tiers",
    );
    let _ = setup.close().await;
}

/// One run: the handler queue preloaded, then the worker until every message was handled a
/// second time; msgs/s.
async fn retry_run(setup: &RabbitMqConnection, payloads: &[Envelope], quorum_tiers: bool) -> f64 {
    let prefix = fresh_prefix();
    let topology = topology(&prefix).wait_tiers([RETRY_TIER]);
    let mut place = Place::whole(&topology);
    if !quorum_tiers {
        // The wait tier as Hexeract declared it before: classic, dead-lettering at most once.
        for queue in &mut place.queues {
            if queue.message_ttl.is_some() {
                *queue = Queue {
                    message_ttl: queue.message_ttl,
                    dead_letter_exchange: Some(String::new()),
                    ..Queue::classic(queue.name.clone())
                };
            }
        }
    }
    place.declare(setup).await;
    preload(setup, &place.queue, payloads).await;
    tokio::time::sleep(SETTLE).await;
    let connection = connect(if quorum_tiers {
        "retry-quorum"
    } else {
        "retry-classic"
    })
    .await;
    let count = Count::new(payloads.len() as u64);
    let done = count.done.clone();
    let worker = RabbitMqWorkerBuilder::new(connection.clone())
        .registry(Registry::new())
        .register_handler_with::<StockReserved, _>(
            FailFirst(count),
            HandlerOptions::new().name(HANDLER),
        )
        .exchange(prefix.as_str())
        .prefix(prefix.as_str())
        .wait_tiers([RETRY_TIER])
        .skip_declare()
        .park_without_rows()
        .build()
        .expect("worker");
    let elapsed = run_worker(worker, done).await;
    let _ = connection.close().await;
    place.delete(setup).await;
    rate(payloads.len() as u64, elapsed)
}
