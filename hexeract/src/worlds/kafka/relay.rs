//! [`KafkaRelay`]: moves outbox rows to the aggregates' topics, deleting each only once the
//! brokers acknowledged it.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rdkafka::error::KafkaError as ClientError;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::delivery::Policy;
use crate::envelope::Envelope;
use crate::health::Probe;
use crate::kafka::logged::{Logged, ProbeSlot};
use crate::kafka::{wire, KafkaConfig, KafkaError};
use crate::reason::Reason;
use crate::store::{self, RelaySink, RelayStore, Unpublishable};

/// The longest a pass waits for the brokers to acknowledge its records (`message.timeout.ms`):
/// past it the pass fails and is tried again (librdkafka's default is 300 s).
const ACKNOWLEDGEMENT_WAIT: Duration = Duration::from_secs(30);

/// Relays the transactional outbox to Kafka: takes the oldest rows, publishes each to its
/// aggregate's topic (`<prefix>.<aggregate>`) keyed by the aggregate id, waits until the brokers
/// acknowledged every record (`acks=all`, idempotent producer: librdkafka's own retries neither
/// duplicate nor reorder a partition's records), and deletes the rows in the same transaction.
/// A crash or a failed publish leaves the rows for the next pass, so a message may be published
/// twice, never lost.
///
/// Order: the rows of a pass are sent in outbox order (UUID v7 ids: the order the messages were
/// created), and the passes of every Kafka relay on one store exclude each other (a PostgreSQL
/// advisory lock held for the pass; SQLite's write lock), so a second relay can never publish
/// an aggregate's later message while an earlier one is still in flight. A row whose message
/// declares no aggregate cannot be placed and goes to the dead letters (reason
/// `payload_invalid`, with why).
///
/// ```no_run
/// # async fn example(store: std::sync::Arc<dyn hexeract::store::RelayStore>) -> Result<(), hexeract::kafka::KafkaError> {
/// use hexeract::kafka::{KafkaConfig, KafkaRelay};
/// use hexeract::CancellationToken;
///
/// let relay = KafkaRelay::new(store, &KafkaConfig::new("localhost:9092", "shop"))?.batch_size(100);
/// relay.run(CancellationToken::new()).await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a relay does nothing until `.run(cancel).await`"]
pub struct KafkaRelay {
    store: Arc<dyn RelayStore>,
    producer: FutureProducer<Logged>,
    config: KafkaConfig,
    source: String,
    probe_slot: ProbeSlot,
    batch_size: u32,
    poll_interval: Duration,
    store_timeout: Duration,
    health: Probe,
}

impl KafkaRelay {
    /// A relay from `store` to the brokers of `config`; `batch_size` 10 and `poll_interval`
    /// 100 ms (the outbox worker's library defaults). Fails only when librdkafka refuses the
    /// configuration: the brokers are first contacted by [`run`](KafkaRelay::run).
    pub fn new(store: Arc<dyn RelayStore>, config: &KafkaConfig) -> Result<KafkaRelay, KafkaError> {
        let health = Probe::detached("kafka relay");
        let probe_slot = Logged::new("kafka relay", Some(health.clone())).probe_slot();
        let producer = producer(config, &probe_slot)?;
        Ok(KafkaRelay {
            store,
            producer,
            config: config.clone(),
            source: config.source(),
            probe_slot,
            batch_size: Policy::library().batch_size,
            poll_interval: Policy::library().poll_interval,
            store_timeout: Policy::library().store_timeout,
            health,
        })
    }

    /// Rows per pass (default 10, at least 1).
    pub fn batch_size(mut self, batch_size: u32) -> KafkaRelay {
        self.batch_size = batch_size.max(1);
        self
    }

    /// Wait after a pass that found nothing (default 100 ms); a publish in this process, or
    /// on PostgreSQL a commit of `outbox::enqueue` anywhere, wakes the relay sooner.
    pub fn poll_interval(mut self, interval: Duration) -> KafkaRelay {
        self.poll_interval = interval;
        self
    }

    /// How long the store may take over its part of a pass, beyond the brokers'
    /// acknowledgements (default 30 s). A pass that has not ended by then and the 30 s the
    /// producer waits for acknowledgements is reported as failed (readiness too) and left to
    /// finish in its own task, never cut in the middle of its transaction; no other pass starts
    /// while it runs, and `run` returns on cancel without waiting for it.
    pub fn store_timeout(mut self, timeout: Duration) -> KafkaRelay {
        self.store_timeout = timeout;
        self
    }

    /// Reports readiness to `probe`: ready after each pass that worked, failing after one that
    /// did not (the store or the brokers are down) and when librdkafka reports every broker
    /// down.
    pub fn health(mut self, probe: Probe) -> KafkaRelay {
        *self
            .probe_slot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(probe.clone());
        self.health = probe;
        self
    }

    /// Relays until `cancel` fires (between passes: a pass waiting for acknowledgements always
    /// finishes), then returns `Ok(())`. Store and broker errors are logged, reported to the
    /// probe and retried after the poll interval: librdkafka reconnects by itself.
    pub async fn run(mut self, cancel: CancellationToken) -> Result<(), KafkaError> {
        crate::metrics::relay_started("kafka");
        let wake = store::wake_signal(&*self.store).await;
        let topics = Arc::new(Mutex::new(HashSet::new()));
        self.health
            .expect_progress_within(crate::health::stuck_after(
                ACKNOWLEDGEMENT_WAIT,
                self.store_timeout,
                self.poll_interval,
            ));
        let mut passes =
            store::Passes::new(self.store.clone(), self.batch_size, self.store_timeout);
        tracing::info!(batch_size = self.batch_size, "Kafka relay started");
        while !cancel.is_cancelled() {
            let pass = passes
                .next(|| {
                    Arc::new(Sink {
                        producer: self.producer.clone(),
                        config: self.config.clone(),
                        source: self.source.clone(),
                        topics: topics.clone(),
                    }) as Arc<dyn RelaySink>
                })
                .await;
            if let Some((code, reason)) = self.producer.client().fatal_error() {
                // An idempotent producer that lost track of its sequence numbers can send no
                // more; the rows of the failed pass are still in the outbox.
                tracing::error!(%code, reason, "the Kafka producer failed for good; creating a new one");
                match producer(&self.config, &self.probe_slot) {
                    Ok(fresh) => self.producer = fresh,
                    Err(error) => tracing::error!(%error, "could not create a new Kafka producer"),
                }
            }
            match pass {
                Ok(0) => {
                    self.health.pass();
                    store::idle(&cancel, &wake, self.poll_interval).await;
                }
                Ok(relayed) => {
                    self.health.pass();
                    tracing::trace!(relayed, "outbox rows relayed to Kafka");
                }
                Err(error) => {
                    self.health.fail(format!("a relay pass failed: {error}"));
                    tracing::warn!(%error, "Kafka relay pass failed; retrying after the poll interval");
                    store::idle(&cancel, &wake, self.poll_interval).await;
                }
            }
        }
        // Nothing should be in flight (each pass waits for its acknowledgements); flush anyway.
        let _ = self.producer.flush(Duration::from_secs(5));
        tracing::info!("Kafka relay stopped");
        Ok(())
    }
}

/// The relay's producer: idempotent, `acks=all`, reporting to `probe_slot`.
fn producer(
    config: &KafkaConfig,
    probe_slot: &ProbeSlot,
) -> Result<FutureProducer<Logged>, KafkaError> {
    config
        .client()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // A topic is created only by `ensure_topics`, as configured, never by a metadata
        // request with the broker's defaults (often a single replica).
        .set("allow.auto.create.topics", "false")
        // Small batches, sent soon: the relay waits for each pass's acknowledgements.
        .set("linger.ms", "2")
        // A pass whose records the brokers never acknowledge fails after this and is tried
        // again (librdkafka's default is 300 s).
        .set(
            "message.timeout.ms",
            ACKNOWLEDGEMENT_WAIT.as_millis().to_string(),
        )
        .create_with_context(Logged::with_slot("kafka relay", probe_slot.clone()))
        .map_err(|error| KafkaError::client("creating the producer", error))
}

struct Sink {
    producer: FutureProducer<Logged>,
    config: KafkaConfig,
    source: String,
    /// Aggregates whose topics are known to exist: created by this relay, or found.
    topics: Arc<Mutex<HashSet<String>>>,
}

impl Sink {
    /// Creates the topics of aggregates this relay has not published to yet (an aggregate no
    /// handler of this process consumes has no topic yet, and brokers that do not create
    /// topics on first use would refuse its records).
    async fn ensure_topics(&self, envelopes: &[&Envelope]) -> Result<(), String> {
        let new: Vec<&str> = {
            let known = self
                .topics
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut new: Vec<&str> = envelopes
                .iter()
                .filter_map(|envelope| envelope.aggregate.as_deref())
                .filter(|aggregate| !known.contains(*aggregate))
                .collect();
            new.sort_unstable();
            new.dedup();
            new
        };
        if new.is_empty() {
            return Ok(());
        }
        crate::kafka::ensure_topics(&self.config, &new)
            .await
            .map_err(|error| error.to_string())?;
        let mut known = self
            .topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        known.extend(new.into_iter().map(str::to_owned));
        Ok(())
    }

    /// Sends every envelope and waits for every acknowledgement, even after a failure: the
    /// pass's lock is held until no record of it is still on its way, so that a relay taking
    /// over cannot be overtaken by one. Records the brokers can never take (too large, or
    /// refused as invalid) are returned to be dead-lettered; any other failure fails the pass.
    async fn send_all(&self, envelopes: &[&Envelope]) -> Result<Vec<Unpublishable>, String> {
        self.ensure_topics(envelopes).await?;
        let mut pending: VecDeque<(&Envelope, DeliveryFuture)> =
            VecDeque::with_capacity(envelopes.len());
        let mut never = Vec::new();
        let mut failure = None;
        for envelope in envelopes {
            let aggregate = envelope.aggregate.as_deref().unwrap_or_default();
            let topic = self.config.topic(aggregate);
            let key = envelope.aggregate_key.as_deref().unwrap_or_default();
            let mut record = FutureRecord::to(&topic)
                .key(key)
                .payload(&envelope.payload[..])
                .headers(wire::record_headers(envelope, &self.source))
                .timestamp(envelope.created_at.timestamp_millis());
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push_back((envelope, delivery));
                        break;
                    }
                    Err((ClientError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        // librdkafka's queue is full: wait for the oldest record of this pass.
                        record = back;
                        match pending.pop_front() {
                            Some((sent, oldest)) => {
                                settle(sent, oldest.await, &mut never, &mut failure);
                            }
                            None => tokio::time::sleep(Duration::from_millis(10)).await,
                        }
                    }
                    Err((error, _)) => {
                        judge(envelope, &topic, &error, &mut never, &mut failure);
                        break;
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        for (envelope, delivery) in pending {
            settle(envelope, delivery.await, &mut never, &mut failure);
        }
        match failure {
            Some(failure) => Err(failure),
            None => Ok(never),
        }
    }
}

type Acknowledgement = <DeliveryFuture as std::future::Future>::Output;

fn settle(
    envelope: &Envelope,
    acknowledgement: Acknowledgement,
    never: &mut Vec<Unpublishable>,
    failure: &mut Option<String>,
) {
    match acknowledgement {
        Ok(Ok(_)) => {}
        Ok(Err((error, record))) => judge(
            envelope,
            rdkafka::Message::topic(&record),
            &error,
            never,
            failure,
        ),
        Err(_) => {
            failure.get_or_insert_with(|| {
                "the producer was dropped before the brokers answered".to_owned()
            });
        }
    }
}

/// Sorts a record the brokers did not take: never (dead-letter it) or not now (fail the pass).
fn judge(
    envelope: &Envelope,
    topic: &str,
    error: &ClientError,
    never: &mut Vec<Unpublishable>,
    failure: &mut Option<String>,
) {
    let permanent = matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
        )
    );
    if permanent {
        let too_large = matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize)
        );
        never.push(Unpublishable {
            id: envelope.id,
            reason: if too_large {
                Reason::PAYLOAD_TOO_LARGE
            } else {
                Reason::PAYLOAD_INVALID
            },
            detail: format!(
                "{topic} refused the record ({} bytes of payload): {error}",
                envelope.payload.len()
            ),
        });
    } else {
        failure.get_or_insert_with(|| {
            format!(
                "the brokers did not acknowledge {} for {topic}: {error}",
                envelope.id
            )
        });
    }
}

impl RelaySink for Sink {
    fn publish<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<Vec<Unpublishable>, String>> {
        Box::pin(async move {
            // A message without an aggregate has no topic and no key, and never will.
            let (good, bad): (Vec<&Envelope>, Vec<&Envelope>) =
                envelopes.iter().partition(|envelope| {
                    envelope.aggregate.as_deref().is_some_and(|a| !a.is_empty())
                        && envelope.aggregate_key.is_some()
                });
            let started = std::time::Instant::now();
            let span = crate::trace::relay("kafka", &good);
            let mut never = self.send_all(&good).instrument(span).await?;
            crate::metrics::relay_published("kafka", good.len() - never.len(), started.elapsed());
            never.extend(bad.into_iter().map(|envelope| Unpublishable {
                id: envelope.id,
                reason: Reason::PAYLOAD_INVALID,
                detail: format!(
                    "message type {:?} declares no aggregate, so it has no Kafka topic: \
                         declare #[message(aggregate = \"…\")] with a #[message(key)] field",
                    envelope.message_type
                ),
            }));
            Ok(never)
        })
    }

    fn exclusive(&self) -> bool {
        true
    }
}

impl fmt::Debug for KafkaRelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaRelay")
            .field("prefix", &self.config.prefix())
            .field("batch_size", &self.batch_size)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}
