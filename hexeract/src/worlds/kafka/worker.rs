//! [`KafkaWorker`]: one consumer group per handler; records handled in order per partition,
//! offsets committed once settled, retries held in their partition.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError as ClientError, KafkaResult};

use rdkafka::message::OwnedMessage;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::Message as _;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::dead_letter::DeadLetter;
use crate::delivery::{Engine, Policy, Slot, Verdict};
use crate::envelope::Envelope;
use crate::health::{Health, Probe};
use crate::kafka::logged::Logged;
use crate::kafka::{wire, KafkaConfig, KafkaError};
use crate::metrics::Metrics;
use crate::outbox::StorePublisher;
use crate::publish::Publish;
use crate::reason::Reason;
use crate::retry::Backoff;
use crate::store::{PartitionCalls, PartitionOf, Store};
use crate::worker::feed::{Arrival, Feed, Pace, Pass, Refill, Refusal, Row, Started, To, Worker};
use crate::worker::{handler_slot, BuildError, MessageSource, Source, WorkerBuilder};

/// What one record counts for in a partition's queue besides its key and payload.
const RECORD_OVERHEAD: usize = 256;

/// Builds a [`KafkaWorker`]: the one [`WorkerBuilder`] over Kafka's [`KafkaSource`]. The
/// defaults are the library's: 5 deliveries, retries 1 s → 300 s, handler timeout 30 s,
/// shutdown grace 8 s, payloads up to 1 MiB.
pub type KafkaWorkerBuilder = WorkerBuilder<KafkaSource>;

/// Kafka's own half of a [`KafkaWorker`]: the brokers and names of its [`KafkaConfig`], the
/// store its dead letters and attempts go to, and its own knobs. Its setters are on
/// [`KafkaWorkerBuilder`].
pub struct KafkaSource {
    config: KafkaConfig,
    store: Arc<dyn Store>,
    publisher: Option<Arc<dyn Publish>>,
    check_interval: Duration,
    partition_queue_bytes: usize,
    health: Option<Health>,
}

impl fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl crate::worker::sealed::Sealed for KafkaSource {}
impl MessageSource for KafkaSource {}

impl Source for KafkaSource {
    type Worker = KafkaWorker;

    /// Checks the knobs, registers the handlers and checks that each handler's message type
    /// declares an aggregate (its topic).
    fn build(builder: KafkaWorkerBuilder) -> Result<KafkaWorker, BuildError> {
        let (handlers, policy, source) = builder.into_parts();
        policy
            .checks("max_deliveries")
            .not_zero("check_interval", source.check_interval)
            .at_least_one("partition_queue_bytes", source.partition_queue_bytes as u64)
            .finish()?;
        let registry = handlers.build(None)?;
        let health = source.health.unwrap_or_default();
        let mut groups = Vec::new();
        for info in registry.handlers() {
            let handler = registry.get(&info.name).expect("listed").clone();
            let Some(aggregate) = handler.handler().aggregate() else {
                return Err(BuildError::World(Box::new(KafkaError::MissingAggregate {
                    handler: info.name.to_string(),
                    message_type: info.message_type.to_owned(),
                })));
            };
            let group_id = source.config.group(&info.name);
            let probe = health.probe(format!("kafka consumer {}", info.name));
            // It passes at each check of the brokers (a metadata request of at most 2 s).
            probe.expect_progress_within(crate::health::stuck_after(
                Duration::from_secs(2),
                Duration::ZERO,
                source.check_interval,
            ));
            let slot = handler_slot(&policy, &handler, Metrics::global(), Some(&probe))
                .in_consumer_group(&group_id);
            groups.push(Group {
                name: Arc::from(&*info.name),
                message_type: info.message_type,
                aggregate,
                topic: source.config.topic(aggregate),
                slots: Arc::from([slot]),
                group_id,
                probe,
            });
        }
        Ok(KafkaWorker {
            groups,
            shared: Arc::new(Shared {
                config: source.config,
                store: source.store,
                publisher: source.publisher,
                engine: Engine::new(policy.retry.clone(), policy.max_payload_bytes, "kafka"),
                max_payload_bytes: policy.max_payload_bytes,
                check_interval: source.check_interval,
                partition_queue_bytes: source.partition_queue_bytes,
                store_timeout: policy.store_timeout,
                shutdown_grace: policy.shutdown_grace,
            }),
            shutdown_grace: policy.shutdown_grace,
        })
    }
}

impl WorkerBuilder<KafkaSource> {
    /// A worker on the brokers of `config` whose dead letters go to `store`, with no handlers
    /// yet.
    pub fn new(config: KafkaConfig, store: Arc<dyn Store>) -> KafkaWorkerBuilder {
        WorkerBuilder::from_source(
            KafkaSource {
                config,
                store,
                publisher: None,
                check_interval: Duration::from_secs(5),
                partition_queue_bytes: 8 * 1024 * 1024,
                health: None,
            },
            Policy::library(),
        )
    }

    /// Where `ctx.publish` in a handler writes (default: the store's outbox, which the relay
    /// takes to Kafka).
    pub fn publish_to(mut self, publisher: Arc<dyn Publish>) -> KafkaWorkerBuilder {
        self.source.publisher = Some(publisher);
        self
    }

    /// How often each consumer checks that the brokers answer and measures its partitions'
    /// lag (default 5 s).
    pub fn check_interval(mut self, interval: Duration) -> KafkaWorkerBuilder {
        self.source.check_interval = interval;
        self
    }

    /// Bytes of records one partition may have waiting in the worker (default 8 MiB, each
    /// record counted with its key, its payload and 256 bytes): above, the partition is paused
    /// (librdkafka stops fetching it) until half of it is handled. Memory is bounded by the
    /// partitions held times this, not by the backlog. Pausing and resuming cost fetch round
    /// trips, so keep it well above a few seconds of records.
    pub fn partition_queue_bytes(mut self, bytes: usize) -> KafkaWorkerBuilder {
        self.source.partition_queue_bytes = bytes;
        self
    }

    /// Reports readiness to `health`: one component per handler, `kafka consumer <handler>`,
    /// ready once the brokers answered and failing while they do not.
    pub fn health(mut self, health: &Health) -> KafkaWorkerBuilder {
        self.source.health = Some(health.clone());
        self
    }
}

/// Consumes Kafka for every handler: each handler is the consumer group
/// `<prefix>.<handler name>` on its aggregate's topic, so each sees every record once, and
/// several processes running the same handlers share the partitions.
///
/// In a partition, records are handled one at a time, in order; partitions run side by side.
/// A record's offset is stored once its outcome is settled (the handler acked it, or it is in
/// the store's `dead_letters`), and librdkafka commits stored offsets every second, when
/// partitions are revoked and when the worker stops: a crash redelivers what was not settled,
/// never skips it. A failed call is retried in place after the backoff, holding back its
/// partition's later records (and no other partition's); after `max_deliveries` calls the
/// record is dead-lettered and the partition moves on. Attempts are counted in memory: after
/// a restart or a rebalance they start over. Records of the topic's other message types are
/// passed over.
///
/// ```no_run
/// # async fn example(store: std::sync::Arc<dyn hexeract::store::Store>) -> Result<(), hexeract::Error> {
/// use hexeract::kafka::{KafkaConfig, KafkaWorker};
/// use hexeract::CancellationToken;
///
/// let worker = KafkaWorker::builder(KafkaConfig::new("localhost:9092", "shop"), store)
///     .from_registry()
///     .build()?;
/// worker.run(CancellationToken::new()).await?;
/// # Ok(())
/// # }
/// ```
pub struct KafkaWorker {
    groups: Vec<Group>,
    shared: Arc<Shared>,
    shutdown_grace: Duration,
}

impl fmt::Debug for KafkaWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaWorker")
            .field(
                "groups",
                &self.groups.iter().map(|g| &g.group_id).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

struct Shared {
    config: KafkaConfig,
    store: Arc<dyn Store>,
    publisher: Option<Arc<dyn Publish>>,
    engine: Engine,
    max_payload_bytes: usize,
    check_interval: Duration,
    partition_queue_bytes: usize,
    /// Deadline of each of the worker's statements: a call's count, a dead letter.
    store_timeout: Duration,
    /// How long a partition's call in flight gets once the worker stops or the partition is
    /// revoked.
    shutdown_grace: Duration,
}

/// One handler as a consumer group.
struct Group {
    name: Arc<str>,
    message_type: &'static str,
    aggregate: &'static str,
    topic: String,
    group_id: String,
    /// The handler as the engine calls it (its only slot: every partition's loop shares it).
    slots: Arc<[Slot]>,
    probe: Probe,
}

type GroupConsumer = StreamConsumer<GroupContext>;

/// The partitions a consumer holds, each with the queue of its task.
type Partitions = Arc<Mutex<HashMap<i32, PartitionQueue>>>;

struct PartitionQueue {
    records: mpsc::UnboundedSender<OwnedMessage>,
    state: Arc<PartitionState>,
}

struct PartitionState {
    /// Fired when the partition is revoked: its task takes no further record.
    revoked: CancellationToken,
    /// Bytes of the records sent to the task and not yet settled (key, payload and
    /// [`RECORD_OVERHEAD`] each).
    queued: AtomicUsize,
    /// Whether the partition is paused; held while pausing or resuming, so that a pause and a
    /// resume never cross (which would leave the partition paused with nobody to resume it).
    paused: Mutex<bool>,
    /// The offset of the oldest record handed to the task and not settled: where the partition
    /// is read again from if the task ends while the partition is still held.
    next_to_settle: AtomicI64,
}

impl PartitionState {
    fn paused_flag(&self) -> std::sync::MutexGuard<'_, bool> {
        self.paused
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn lock(partitions: &Partitions) -> std::sync::MutexGuard<'_, HashMap<i32, PartitionQueue>> {
    partitions
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl KafkaWorker {
    /// A builder on the brokers of `config`, dead-lettering into `store`.
    pub fn builder(config: KafkaConfig, store: Arc<dyn Store>) -> KafkaWorkerBuilder {
        KafkaWorkerBuilder::new(config, store)
    }

    /// The consumer groups, one per handler: `(handler, group, topic)`.
    pub fn groups(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.groups
            .iter()
            .map(|group| (&*group.name, group.group_id.as_str(), group.topic.as_str()))
    }

    /// The aggregates whose topics the handlers consume, each once.
    pub(crate) fn aggregates(&self) -> Vec<&'static str> {
        let mut aggregates: Vec<&'static str> =
            self.groups.iter().map(|group| group.aggregate).collect();
        aggregates.sort_unstable();
        aggregates.dedup();
        aggregates
    }

    /// Consumes until `cancel` fires, then lets the calls running finish (up to the shutdown
    /// grace), commits what was settled, leaves the groups and returns `Ok(())`. Fails at once
    /// only when librdkafka refuses a consumer's configuration; lost brokers are waited for
    /// (librdkafka reconnects) and shown on the probes.
    ///
    /// Stopping has one hard deadline: the grace and 5 s to settle. A worker whose commits
    /// cannot land by then stops anyway; the group hands out what it did not commit again.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), KafkaError> {
        let grace = self.shutdown_grace;
        crate::delivery::stop_by_deadline(
            "Kafka worker",
            &cancel,
            grace,
            self.serve(cancel.clone()),
        )
        .await
    }

    async fn serve(self, cancel: CancellationToken) -> Result<(), KafkaError> {
        let publisher: Arc<dyn Publish> = match &self.shared.publisher {
            Some(publisher) => publisher.clone(),
            None => Arc::new(StorePublisher::new(
                self.shared.store.clone(),
                crate::store::wake_signal(&*self.shared.store).await,
            )),
        };
        tracing::info!(groups = self.groups.len(), "Kafka worker started");
        let groups = self.groups.into_iter().map(|group| {
            let shared = self.shared.clone();
            let publisher = publisher.clone();
            let cancel = cancel.clone();
            async move { Arc::new(group).consume(shared, publisher, cancel).await }
        });
        let results = futures_util::future::join_all(groups).await;
        tracing::info!("Kafka worker stopped");
        results.into_iter().collect()
    }
}

impl Group {
    async fn consume(
        self: Arc<Group>,
        shared: Arc<Shared>,
        publisher: Arc<dyn Publish>,
        cancel: CancellationToken,
    ) -> Result<(), KafkaError> {
        let partitions: Partitions = Arc::default();
        let context = GroupContext {
            logged: Logged::new(
                format!("kafka consumer {}", self.name),
                Some(self.probe.clone()),
            ),
            partitions: partitions.clone(),
            topic: self.topic.clone(),
            handler: self.name.clone(),
        };
        let consumer: Arc<GroupConsumer> = Arc::new(
            shared
                .config
                .consumer()
                .set("group.id", &self.group_id)
                // Offsets are stored by hand once a record is settled; librdkafka commits what
                // is stored every second, on revocation and on close.
                .set("enable.auto.commit", "true")
                .set("enable.auto.offset.store", "false")
                .set("auto.commit.interval.ms", "1000")
                // A new group starts at the oldest record kept: the topics are created before
                // the relay publishes, so nothing published is passed over.
                .set("auto.offset.reset", "earliest")
                .set("enable.partition.eof", "false")
                // The lag of each partition (`hexeract_consumer_lag`) comes from these.
                .set(
                    "statistics.interval.ms",
                    shared.check_interval.as_millis().to_string(),
                )
                .create_with_context(context)
                .map_err(|error| KafkaError::client("creating a consumer", error))?,
        );
        consumer
            .subscribe(&[&self.topic])
            .map_err(|error| KafkaError::client(format!("subscribing to {}", self.topic), error))?;
        tracing::info!(handler = %self.name, group = %self.group_id, topic = %self.topic, "Kafka consumer started");
        let mut tasks = JoinSet::new();
        let mut task_partitions = HashMap::new();
        let mut checks = tokio::time::interval(shared.check_interval);
        checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                record = consumer.recv() => match record {
                    Ok(record) => {
                        let record = record.detach();
                        self.route(record, &consumer, &partitions, &mut tasks, &mut task_partitions, &shared, &publisher, &cancel);
                    }
                    Err(error) => {
                        tracing::warn!(handler = %self.name, %error, "Kafka consumer error");
                        self.probe.fail(format!("consumer error: {error}"));
                    }
                },
                _ = checks.tick() => self.check(&consumer).await,
                Some(ended) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    let (id, panicked) = match ended {
                        Ok((id, ())) => (id, false),
                        Err(error) => (error.id(), error.is_panic()),
                    };
                    if let Some((partition, state)) = task_partitions.remove(&id) {
                        if panicked {
                            let mut held = lock(&partitions);
                            let ours = held.get(&partition).is_some_and(|slot| Arc::ptr_eq(&slot.state, &state));
                            if ours {
                                held.remove(&partition);
                                drop(held);
                                self.read_again(&consumer, partition, &state);
                            }
                        }
                    }
                }
            }
        }
        // Each task finishes the record it is on (the calls get the shutdown grace) and takes
        // no other.
        while tasks.join_next().await.is_some() {}
        // librdkafka's synchronous commit blocks its thread until the coordinator answers: on a
        // blocking thread of its own, with a deadline, so that a lost coordinator holds neither
        // an async thread nor the stop.
        let committing = {
            let consumer = consumer.clone();
            tokio::task::spawn_blocking(move || consumer.commit_consumer_state(CommitMode::Sync))
        };
        match tokio::time::timeout(crate::policy::SETTLE_AFTER_GRACE, committing).await {
            Ok(Ok(
                Ok(())
                | Err(ClientError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)),
            )) => {}
            Ok(Ok(Err(error))) => {
                tracing::warn!(handler = %self.name, %error, "could not commit the settled offsets at shutdown; the records after the last commit will be handled again")
            }
            Ok(Err(error)) => {
                tracing::warn!(handler = %self.name, %error, "the commit at shutdown did not finish; the records after the last commit will be handled again")
            }
            Err(_) => {
                tracing::warn!(handler = %self.name, deadline = ?crate::policy::SETTLE_AFTER_GRACE, "the commit at shutdown got no answer in time; the records after the last commit will be handled again")
            }
        }
        consumer.unsubscribe();
        Metrics::global().set_partition_lags(&self.name, &self.topic, &[]);
        tracing::info!(handler = %self.name, "Kafka consumer stopped");
        Ok(())
    }

    /// Hands `record` to its partition's task (started if the partition has none), pausing
    /// the partition when its task falls far behind.
    #[allow(clippy::too_many_arguments)]
    fn route(
        self: &Arc<Group>,
        record: OwnedMessage,
        consumer: &Arc<GroupConsumer>,
        partitions: &Partitions,
        tasks: &mut JoinSet<()>,
        task_partitions: &mut HashMap<tokio::task::Id, (i32, Arc<PartitionState>)>,
        shared: &Arc<Shared>,
        publisher: &Arc<dyn Publish>,
        cancel: &CancellationToken,
    ) {
        let partition = record.partition();
        let mut held = lock(partitions);
        let slot = held.entry(partition).or_insert_with(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            let state = Arc::new(PartitionState {
                // Fires on a revocation, and when the worker stops.
                revoked: cancel.child_token(),
                queued: AtomicUsize::new(0),
                paused: Mutex::new(false),
                next_to_settle: AtomicI64::new(record.offset()),
            });
            let feed = PartitionFeed {
                group: self.clone(),
                shared: shared.clone(),
                publisher: publisher.clone(),
                consumer: consumer.clone(),
                partition,
                state: state.clone(),
                calls: std::sync::Mutex::default(),
                records: std::sync::Mutex::new(Some(receiver)),
                again: std::sync::Mutex::new(None),
                current: std::sync::Mutex::new(None),
            };
            // One call at a time: the next record waits for the one before to settle.
            // A pass with no room (a call in progress) is followed by the next when the call
            // ends: the poll interval only bounds how long an idle loop sleeps.
            let pace = Pace {
                poll_interval: Duration::from_secs(1),
                busy_delay: Duration::ZERO,
                batch_size: 1,
                shutdown_grace: shared.shutdown_grace,
                refill: Refill::WhenAnyEnds,
            };
            let worker = Worker::new(
                feed,
                self.slots.clone(),
                shared.engine.clone(),
                pace,
                // The group's probe is the consumer's (its checks of the brokers, the store's
                // failures): a partition's passes do not mark it passing over those.
                Probe::detached("kafka partition"),
            );
            let stop = state.revoked.clone();
            let handle = tasks.spawn(async move {
                // A partition's loop fails only to start, which it does not.
                let _ = worker.run(stop).await;
            });
            task_partitions.insert(handle.id(), (partition, state.clone()));
            PartitionQueue {
                records: sender,
                state,
            }
        });
        let size = record_size(&record);
        let queued = slot.state.queued.fetch_add(size, Ordering::AcqRel) + size;
        let limit = shared.partition_queue_bytes;
        if queued > limit {
            let mut paused = slot.state.paused_flag();
            if !*paused && slot.state.queued.load(Ordering::Acquire) > limit {
                let _ = consumer.pause(&one_partition(&self.topic, partition, Offset::Invalid));
                *paused = true;
            }
        }
        if slot.records.send(record).is_err() {
            // The task ended while the partition is still held (it panicked): the records it
            // had are gone with it, so the partition is read again from the oldest of them.
            if let Some(slot) = held.remove(&partition) {
                self.read_again(consumer, partition, &slot.state);
            }
        }
    }

    /// Sets the partition's fetch position back to the oldest record its ended task had not
    /// settled, and resumes it: nothing it held is skipped.
    fn read_again(&self, consumer: &GroupConsumer, partition: i32, state: &PartitionState) {
        if state.revoked.is_cancelled() {
            return;
        }
        let from = state.next_to_settle.load(Ordering::Acquire);
        tracing::error!(
            handler = %self.name,
            partition,
            from,
            "a partition's task ended unexpectedly; reading the partition again from its oldest unsettled record"
        );
        if let Err(error) =
            consumer.seek(&self.topic, partition, Offset::Offset(from), Duration::ZERO)
        {
            tracing::error!(handler = %self.name, partition, %error, "could not seek back: the consumer stops so that a restart reads from the last commit");
            self.probe.fail(format!(
                "partition {partition} could not be read again: {error}"
            ));
        }
        let _ = consumer.resume(&one_partition(&self.topic, partition, Offset::Invalid));
    }

    /// Checks that the brokers answer (readiness). The lag is measured by librdkafka's
    /// statistics ([`GroupContext::stats`]).
    async fn check(&self, consumer: &Arc<GroupConsumer>) {
        let consumer = consumer.clone();
        let topic = self.topic.clone();
        let answered = tokio::task::spawn_blocking(move || {
            consumer
                .fetch_metadata(Some(&topic), Duration::from_secs(2))
                .map(|_| ())
        })
        .await;
        match answered {
            Ok(Ok(())) => self.probe.pass(),
            Ok(Err(error)) => self
                .probe
                .fail(format!("the brokers do not answer: {error}")),
            Err(_) => {}
        }
    }
}

/// One partition's records in order, one call at a time: the feed of the partition's loop.
struct PartitionFeed {
    group: Arc<Group>,
    shared: Arc<Shared>,
    publisher: Arc<dyn Publish>,
    consumer: Arc<GroupConsumer>,
    partition: i32,
    state: Arc<PartitionState>,
    /// What the store remembers of this partition's calls, as this task last wrote it (or
    /// found it), and whether the window in it is this task's own.
    calls: std::sync::Mutex<Remembered>,
    /// The records the group's consumer routed here, held by the pass that waits for them.
    records: std::sync::Mutex<Option<mpsc::UnboundedReceiver<OwnedMessage>>>,
    /// A record whose retry wait is over: called again before the next.
    again: std::sync::Mutex<Option<(Held, Arc<Envelope>)>>,
    /// The record of the call in progress, until it is settled: still here at the next pass,
    /// its call's task failed (a panic outside the handler) and it is called again, never
    /// passed over.
    current: std::sync::Mutex<Option<(Held, Arc<Envelope>)>>,
}

/// [`PartitionFeed::calls`].
#[derive(Default)]
struct Remembered {
    /// As last written (or found).
    calls: PartitionCalls,
    /// The window is this task's own (else its predecessor's, never closed: a crash).
    own_window: bool,
    /// A call of this task was given up on and may still run.
    in_flight: bool,
    /// `calls` was read from the store (a loop stopped before it was writes nothing).
    read: bool,
}

impl Remembered {
    /// The number of the call about to be made of the record at `offset` (`made` calls of it
    /// made so far by this task), and what to write to the store first, if anything
    /// ([`PartitionFeed::count_call`]).
    fn count(&mut self, offset: i64, made: u32) -> (u32, Option<PartitionCalls>) {
        let before = self.calls;
        let counted = before.calls_of(offset);
        let call = (made + 1).max(counted.map_or(0, |calls| calls + 1));
        let in_window = before.in_window(offset);
        if made > 0 || counted.is_some() || (in_window && !self.own_window) {
            self.calls.counted = Some((offset, call));
        } else if !in_window {
            self.calls = PartitionCalls {
                counted: None,
                window: (offset, offset + CALL_WINDOW - 1),
            };
            self.own_window = true;
        }
        (call, (self.calls != before).then_some(self.calls))
    }
}

/// Records a partition's holder may call per window it writes to the store: one write per this
/// many records, where a call counted one at a time would cost a statement each.
const CALL_WINDOW: i64 = 256;

/// A record as the partition's loop holds it.
type Held = Arc<OwnedMessage>;

/// What a pass found of the partition's next record.
enum Next {
    /// A record to call its handler with (or to dead-letter without a call).
    Call(Arrival<Held>),
    /// Settled without a call: another handler's, or a copy of one settled here.
    Passed(OwnedMessage),
    /// The worker stops, or the partition was revoked.
    Stop,
}

impl PartitionFeed {
    /// The partition's next record: the one a retry waits to call again first, else the next
    /// that came, once its call is counted in the store.
    async fn next(&self, stop: &CancellationToken) -> Next {
        let again = self.lock_again().take();
        let (record, envelope, made) = match again {
            Some((record, envelope)) => {
                let made = envelope.attempt;
                (record, envelope, made)
            }
            None => {
                let taken = self.lock_records().take();
                let Some(mut records) = taken else {
                    return Next::Stop;
                };
                let record = tokio::select! {
                    biased;
                    () = stop.cancelled() => None,
                    record = records.recv() => record,
                };
                *self.lock_records() = Some(records);
                let Some(record) = record else {
                    return Next::Stop;
                };
                match self.read(record).await {
                    Ok(read) => read,
                    Err(next) => return next,
                }
            }
        };
        // Calls are remembered in the store before they are made (`RecordAttempts`), so that
        // the count goes on after a restart: a record whose call never finished (it killed the
        // process) is dead-lettered once the count passes the limit, without a call.
        let Some(call) = self.count_call(record.offset(), made, stop).await else {
            return Next::Stop;
        };
        let mut envelope = envelope;
        Arc::make_mut(&mut envelope).attempt = call;
        Next::Call(Arrival {
            claim: record,
            to: To::Slot(0),
            envelope,
            recovered: false,
            refused: None,
        })
    }

    /// A record that came: read, or passed over, or dead-lettered unread.
    async fn read(&self, record: OwnedMessage) -> Result<(Held, Arc<Envelope>, u32), Next> {
        let group = &*self.group;
        if wire::message_type(&record).is_some_and(|kind| kind != group.message_type) {
            // Another message type of the same aggregate: another handler's, even when it
            // cannot be read (that handler's group dead-letters it).
            return Err(Next::Passed(record));
        }
        let envelope = match wire::read(&record, group.aggregate, self.shared.max_payload_bytes) {
            Ok(envelope) => envelope,
            Err(unreadable) => {
                let envelope = wire::salvage(&record, group.aggregate);
                tracing::debug!(
                    handler = %group.name,
                    topic = %group.topic,
                    partition = record.partition(),
                    offset = record.offset(),
                    "record unreadable"
                );
                // Dead-lettered without a call (and none counted).
                return Err(Next::Call(Arrival {
                    claim: Arc::new(record),
                    to: To::Slot(0),
                    envelope: Arc::new(envelope),
                    recovered: false,
                    refused: Some(Refusal {
                        reason: unreadable.reason,
                        detail: unreadable.detail,
                        calls: 0,
                    }),
                }));
            }
        };
        if envelope.message_type != group.message_type {
            // Another message type of the same aggregate: another handler's.
            return Err(Next::Passed(record));
        }
        if let Some(target) = envelope
            .headers
            .get(wire::headers::REPLAY_FOR)
            .filter(|target| **target != *group.name)
        {
            // A dead letter of another handler, sent back for that handler alone: passed over
            // only when it copies a record this group has settled; anyone can write the header.
            if self.copies_a_settled_record(&record, &envelope).await {
                return Err(Next::Passed(record));
            }
            tracing::warn!(
                handler = %group.name,
                addressed_to = %target,
                message_id = %envelope.id,
                topic = %group.topic,
                partition = record.partition(),
                offset = record.offset(),
                "a record addressed to another handler is not a copy of one this handler has \
                 had: handled here too"
            );
        }
        // Shared with each call's context (and copied only if an abandoned call still holds it).
        Ok((Arc::new(record), Arc::new(envelope), 0))
    }

    /// A record is settled: its offset is stored (librdkafka commits it), and its bytes leave
    /// the partition's queue (resuming the partition when it had paused for them).
    fn done(&self, record: &OwnedMessage) {
        let next = record.offset() + 1;
        let stored = self.consumer.store_offsets(&one_partition(
            &self.group.topic,
            self.partition,
            Offset::Offset(next),
        ));
        if let Err(error) = stored {
            // Revoked meanwhile: the new holder handles the record again.
            tracing::debug!(partition = self.partition, %error, "offset not stored");
        }
        self.state.next_to_settle.store(next, Ordering::Release);
        let size = record_size(record);
        let left = self.state.queued.fetch_sub(size, Ordering::AcqRel) - size;
        if left < self.shared.partition_queue_bytes / 2 {
            let mut paused = self.state.paused_flag();
            if *paused {
                let _ = self.consumer.resume(&one_partition(
                    &self.group.topic,
                    self.partition,
                    Offset::Invalid,
                ));
                *paused = false;
            }
        }
    }

    fn lock_records(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<mpsc::UnboundedReceiver<OwnedMessage>>> {
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_current(&self) -> std::sync::MutexGuard<'_, Option<(Held, Arc<Envelope>)>> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_again(&self) -> std::sync::MutexGuard<'_, Option<(Held, Arc<Envelope>)>> {
        self.again
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One partition's records, in order, one call at a time: verdicts become stored offsets,
/// waits in the partition and dead-letter rows.
impl Feed for PartitionFeed {
    type Claim = Held;
    type Error = KafkaError;
    const NAME: &'static str = "Kafka partition";
    // One loop per partition held, started at each assignment: the group's consumer logs the
    // assignments.
    const ANNOUNCED: bool = false;

    async fn start(&self) -> Result<Started, KafkaError> {
        // Stopped or revoked before the store answered: the loop takes nothing, and writes
        // nothing over what the store remembers.
        if let Some(calls) = self.remembered_calls(&self.state.revoked).await {
            let mut remembered = self.lock_calls();
            remembered.calls = calls;
            remembered.read = true;
        }
        Ok(Started {
            wake: None,
            publisher: self.publisher.clone(),
        })
    }

    /// Waits for the partition's next record that needs a call (passing over, and settling,
    /// those that do not); nothing while the record before is still being called (`room` 0).
    async fn pass(
        &self,
        _acks: Vec<Held>,
        room: u32,
        stop: &CancellationToken,
    ) -> Result<Pass<Held>, KafkaError> {
        if room == 0 {
            return Ok(Pass::of(Vec::new()));
        }
        if let Some(unsettled) = self.lock_current().take() {
            tracing::error!(
                handler = %self.group.name,
                partition = self.partition,
                offset = unsettled.0.offset(),
                "a call's task failed before its record was settled; calling the record again"
            );
            *self.lock_again() = Some(unsettled);
        }
        loop {
            match self.next(stop).await {
                Next::Call(arrival) => {
                    *self.lock_current() = Some((arrival.claim.clone(), arrival.envelope.clone()));
                    return Ok(Pass::of(vec![arrival]));
                }
                Next::Passed(record) => self.done(&record),
                Next::Stop => return Ok(Pass::of(Vec::new())),
            }
        }
    }

    async fn settle(
        &self,
        record: &Held,
        _handler: Option<&str>,
        envelope: Arc<Envelope>,
        verdict: Verdict,
        stop: &CancellationToken,
    ) -> Result<Row, KafkaError> {
        let offset = record.offset();
        let attempt = envelope.attempt;
        let settled = match verdict {
            Verdict::Ack => true,
            Verdict::DeadLetter {
                reason,
                detail,
                calls,
            } => {
                let envelope = Arc::unwrap_or_clone(envelope);
                self.dead_letter(record, envelope, reason, &detail, calls, stop)
                    .await
            }
            // The records behind it in its partition wait with it; its count holds if the
            // process stops meanwhile.
            Verdict::Retry { delay, .. } => {
                self.remember_calls(offset, attempt).await;
                tokio::select! {
                    () = tokio::time::sleep(delay) => {
                        *self.lock_again() = Some((record.clone(), envelope));
                    }
                    () = stop.cancelled() => {}
                }
                false
            }
            // Not made, or a failure while stopping: not a call that counts. Whoever holds the
            // partition next handles it again.
            Verdict::Release => {
                self.remember_calls(offset, attempt.saturating_sub(1)).await;
                false
            }
            // Still running past the grace: the next holder goes on from its count.
            Verdict::Abandoned => {
                self.lock_calls().in_flight = true;
                self.remember_calls(offset, attempt).await;
                false
            }
        };
        if settled {
            self.done(record);
        }
        self.lock_current().take();
        Ok(Row::Settled)
    }

    /// A record not started is left for whoever holds the partition next (its offset is not
    /// stored); the call counted for it was not made.
    async fn hand_back(&self, arrivals: Vec<Arrival<Held>>) -> Result<(), KafkaError> {
        for arrival in arrivals {
            self.lock_current().take();
            if arrival.refused.is_none() {
                let attempt = arrival.envelope.attempt;
                self.remember_calls(arrival.claim.offset(), attempt.saturating_sub(1))
                    .await;
            }
        }
        Ok(())
    }

    /// Stopped with no call left running: nothing of this holder is in flight, so whoever
    /// holds the partition next calls the records as they come (a window left open tells it
    /// that this process died mid-window). A record counted exactly keeps its count.
    async fn close(&self, _acks: Vec<Held>) -> Result<(), KafkaError> {
        let closing = {
            let remembered = self.lock_calls();
            (remembered.read
                && !remembered.in_flight
                && remembered.calls.window != PartitionCalls::CLOSED)
                .then(|| PartitionCalls {
                    window: PartitionCalls::CLOSED,
                    ..remembered.calls
                })
        };
        if let Some(closed) = closing {
            // Not closed: the next holder calls its records one at a time.
            self.write_calls(closed).await;
        }
        Ok(())
    }
}

impl PartitionFeed {
    /// Whether `record` (read as `envelope`) names, in [`wire::headers::REPLAY_OF`], an
    /// earlier record of this partition, which this task has therefore settled, and is an
    /// exact copy of it (the same message id, type and payload): only then may this group pass
    /// over a replay addressed to another handler. When the original cannot be read (gone
    /// with the topic's retention, the brokers not answering within 10 s), the answer is no:
    /// a duplicate is safe, a skip is not.
    async fn copies_a_settled_record(&self, record: &OwnedMessage, envelope: &Envelope) -> bool {
        let group = &*self.group;
        let Some((topic, partition, offset)) = envelope
            .headers
            .get(wire::headers::REPLAY_OF)
            .and_then(|position| wire::parse_position(position))
        else {
            return false;
        };
        if topic != record.topic() || partition != record.partition() || offset >= record.offset() {
            return false;
        }
        let mut config = self.shared.config.consumer();
        config
            .set("group.id", format!("{}.replay-check", group.group_id))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true");
        let topic = topic.to_owned();
        let aggregate = group.aggregate;
        let max_payload_bytes = self.shared.max_payload_bytes;
        let replay = envelope.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let original = read_one(&config, &topic, partition, offset)?;
            let original = wire::read(&original, aggregate, max_payload_bytes).ok()?;
            Some(
                original.id == replay.id
                    && original.message_type == replay.message_type
                    && original.payload == replay.payload,
            )
        })
        .await;
        matches!(checked, Ok(Some(true)))
    }

    fn lock_calls(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.calls
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn partition_of(&self) -> PartitionOf<'_> {
        PartitionOf {
            group: &self.group.group_id,
            topic: &self.group.topic,
            partition: self.partition,
        }
    }

    /// What the store remembers of this partition's calls, trying again while it does not
    /// answer; `None` once the worker stops or loses the partition.
    async fn remembered_calls(&self, cancel: &CancellationToken) -> Option<PartitionCalls> {
        self.with_store(cancel, "read the partition's calls", || {
            self.shared.store.partition_calls(self.partition_of())
        })
        .await
        .map(Option::unwrap_or_default)
    }

    /// The number of the call about to be made of the record at `offset`, `made` calls of it
    /// made so far in this task, once the store remembers it where it must: the record's
    /// exact count, when the store counts it exactly (a record retried or stopped with a call
    /// running) or it lies in a window a predecessor never closed (its process died while
    /// calling one of them, perhaps this one: one at a time, until the window is passed), else
    /// a window of the next [`CALL_WINDOW`] offsets, written once for all of them. `None` once
    /// the worker stops or loses the partition.
    async fn count_call(&self, offset: i64, made: u32, cancel: &CancellationToken) -> Option<u32> {
        let (call, write) = self.lock_calls().count(offset, made);
        if let Some(calls) = write {
            self.with_store(cancel, "count a call", || {
                self.shared
                    .store
                    .remember_partition_calls(self.partition_of(), calls)
            })
            .await?;
        }
        Some(call)
    }

    /// Remembers that `calls` calls of the record at `offset` were made (a retry's count, a
    /// call taken back, one still running at a stop). A store that fails here is logged: the
    /// count of the next call is written before it is made anyway.
    async fn remember_calls(&self, offset: i64, calls: u32) {
        let changed = {
            let mut remembered = self.lock_calls();
            let before = remembered.calls;
            remembered.calls.counted = Some((offset, calls));
            (remembered.calls != before).then_some(remembered.calls)
        };
        if let Some(changed) = changed {
            self.write_calls(changed).await;
        }
    }

    /// Writes `calls` for this partition once, with the store timeout; a failure is logged,
    /// not retried (what it leaves is at worst a count one lower, or a window left open).
    async fn write_calls(&self, calls: PartitionCalls) {
        let written = crate::store::within(
            "partition's calls",
            self.shared.store_timeout,
            self.shared
                .store
                .remember_partition_calls(self.partition_of(), calls),
        )
        .await;
        if let Err(error) = written {
            tracing::warn!(handler = %self.group.name, partition = self.partition, %error, "could not remember the partition's calls");
        }
    }

    /// `statement` on the store, with the store timeout, tried again (the partition waiting,
    /// readiness failing) while it fails; `None` once the worker stops or loses the partition.
    async fn with_store<T, F>(
        &self,
        cancel: &CancellationToken,
        what: &'static str,
        statement: impl Fn() -> F,
    ) -> Option<T>
    where
        F: std::future::Future<Output = Result<T, crate::store::StoreError>>,
    {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            match crate::store::within(what, self.shared.store_timeout, statement()).await {
                Ok(value) => return Some(value),
                Err(error) => {
                    tracing::warn!(handler = %self.group.name, %error, "could not {what}; the partition waits and tries again");
                    self.group
                        .probe
                        .fail(format!("cannot {what} in the store: {error}"));
                }
            }
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = cancel.cancelled() => return None,
                () = self.state.revoked.cancelled() => return None,
            }
        }
    }

    /// Writes the record's dead letter, trying again (the partition waiting) while the store
    /// is down: a record leaves its partition only with a row in `dead_letters`.
    async fn dead_letter(
        &self,
        record: &OwnedMessage,
        envelope: Envelope,
        reason: Reason,
        detail: &str,
        calls: u32,
        cancel: &CancellationToken,
    ) -> bool {
        let group = &*self.group;
        let mut letter = DeadLetter::new(envelope, Some(group.name.to_string()), reason, detail);
        letter.id = wire::dead_letter_id(
            record.topic(),
            record.partition(),
            record.offset(),
            &group.name,
            letter.envelope.id,
        );
        letter.attempts = calls;
        // What a replay of the letter names as the record it copies.
        letter.envelope.headers.insert(
            wire::headers::RECORD.to_owned(),
            wire::position(record.topic(), record.partition(), record.offset()),
        );
        let written = self
            .with_store(cancel, "write a dead letter", || {
                self.shared.store.insert_dead_letter(&letter)
            })
            .await;
        written.is_some()
    }
}

/// The record at `topic`/`partition`/`offset`, read by a consumer of its own (no group joined,
/// nothing committed); `None` when it is not there (before the partition's start, compacted)
/// or the brokers do not answer within 10 s.
fn read_one(
    config: &rdkafka::ClientConfig,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Option<OwnedMessage> {
    let consumer: BaseConsumer = config.create().ok()?;
    consumer
        .assign(&one_partition(topic, partition, Offset::Offset(offset)))
        .ok()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) if message.offset() == offset => return Some(message.detach()),
            // Past it: the record is gone.
            Some(Ok(_)) | Some(Err(ClientError::PartitionEOF(_))) => return None,
            Some(Err(_)) | None => {}
        }
    }
    None
}

fn record_size(record: &OwnedMessage) -> usize {
    record.payload().map_or(0, <[u8]>::len) + record.key().map_or(0, <[u8]>::len) + RECORD_OVERHEAD
}

fn one_partition(topic: &str, partition: i32, offset: Offset) -> TopicPartitionList {
    let mut list = TopicPartitionList::with_capacity(1);
    let _ = list.add_partition_offset(topic, partition, offset);
    list
}

/// The consumer's callbacks: librdkafka's logs and errors, and revocations, which stop the
/// revoked partitions' tasks before the partitions go to another consumer.
struct GroupContext {
    logged: Logged,
    partitions: Partitions,
    topic: String,
    handler: Arc<str>,
}

impl ClientContext for GroupContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.logged.log(level, facility, message);
    }

    fn error(&self, error: ClientError, reason: &str) {
        self.logged.error(error, reason);
    }

    /// The lag of each partition held: the records up to the end of the partition (the high
    /// watermark librdkafka saw in its last fetch) after the last one settled here, or
    /// committed by the group before.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let Some(topic) = statistics.topics.get(&self.topic) else {
            return;
        };
        let lags: Vec<(i32, i64)> = topic
            .partitions
            .values()
            .filter(|partition| partition.partition >= 0 && partition.desired)
            .filter(|partition| partition.hi_offset >= 0)
            .map(|partition| {
                let settled = partition.stored_offset.max(partition.committed_offset);
                let from = if settled >= 0 {
                    settled
                } else {
                    partition.lo_offset.max(0)
                };
                (partition.partition, (partition.hi_offset - from).max(0))
            })
            .collect();
        Metrics::global().set_partition_lags(&self.handler, &self.topic, &lags);
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(list) => {
                let mut held = lock(&self.partitions);
                let mut revoked = Vec::new();
                for element in list.elements() {
                    if element.topic() != self.topic {
                        continue;
                    }
                    if let Some(slot) = held.remove(&element.partition()) {
                        slot.state.revoked.cancel();
                    }
                    revoked.push(element.partition());
                }
                tracing::info!(
                    component = self.logged.component(),
                    ?revoked,
                    "partitions revoked"
                );
            }
            Rebalance::Assign(list) => {
                let assigned: Vec<i32> = list.elements().iter().map(|e| e.partition()).collect();
                tracing::info!(
                    component = self.logged.component(),
                    ?assigned,
                    "partitions assigned"
                );
            }
            Rebalance::Error(error) => {
                // rdkafka unassigns everything after a failed rebalance.
                for (_, slot) in lock(&self.partitions).drain() {
                    slot.state.revoked.cancel();
                }
                tracing::warn!(component = self.logged.component(), %error, "rebalance failed");
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        // librdkafka keeps a partition paused across a revocation and a new assignment; a
        // partition assigned again starts with a new task and an empty queue.
        if let Rebalance::Assign(list) = rebalance {
            let _ = consumer.resume(list);
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        match result {
            Ok(())
            | Err(ClientError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => {
                tracing::warn!(component = self.logged.component(), %error, "offset commit failed; it is tried again with the next")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_written_once_for_its_records_and_a_crash_in_it_makes_them_counted_one_by_one() {
        // A fresh partition: the first record opens a window, the next ones in it write nothing.
        let mut task = Remembered::default();
        let (call, write) = task.count(10, 0);
        assert_eq!(call, 1);
        assert_eq!(write.unwrap().window, (10, 10 + CALL_WINDOW - 1));
        assert_eq!(task.count(11, 0), (1, None));
        // A retry is counted exactly before its call.
        let (call, write) = task.count(11, 1);
        assert_eq!((call, write.unwrap().counted), (2, Some((11, 2))));
        // Past the window: a new one.
        let (_, write) = task.count(10 + CALL_WINDOW, 0);
        assert_eq!(write.unwrap().window.0, 10 + CALL_WINDOW);

        // The process died in the window (never closed): its successor counts each record in
        // it exactly, one at a time, and opens a window of its own past it.
        let mut successor = Remembered {
            calls: PartitionCalls {
                counted: None,
                window: (10, 10 + CALL_WINDOW - 1),
            },
            ..Remembered::default()
        };
        let (call, write) = successor.count(12, 0);
        assert_eq!((call, write.unwrap().counted), (1, Some((12, 1))));
        // It died again on 12: the next holder goes on with its count.
        let mut third = Remembered {
            calls: write.unwrap(),
            ..Remembered::default()
        };
        let (call, write) = third.count(12, 0);
        assert_eq!((call, write.unwrap().counted), (2, Some((12, 2))));
        let (_, write) = third.count(10 + CALL_WINDOW, 0);
        assert_eq!(
            write.unwrap(),
            PartitionCalls {
                counted: None,
                window: (10 + CALL_WINDOW, 10 + 2 * CALL_WINDOW - 1),
            }
        );

        // A clean stop closed the window and kept a retried record's count.
        let mut after_stop = Remembered {
            calls: PartitionCalls {
                counted: Some((11, 2)),
                window: PartitionCalls::CLOSED,
            },
            ..Remembered::default()
        };
        assert_eq!(after_stop.count(11, 0).0, 3);
    }
}
