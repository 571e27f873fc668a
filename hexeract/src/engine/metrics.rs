//! What Hexeract measures, recorded through the [`metrics`] facade.
//!
//! Every series is recorded with `metrics::counter!`, `histogram!` or `gauge!`, so the
//! recorder the application installed gets them: a Prometheus exporter of its own, an OTLP or
//! Datadog bridge, or a test's recorder. When the process installed none,
//! [`run`](crate::run) (and [`App`](crate::App), [`health::router`](crate::health::router))
//! install [`metrics-exporter-prometheus`](metrics_exporter_prometheus)'s, and `GET /metrics`
//! renders it. Install your own recorder before the worker is built: handles are taken when a
//! worker builds its handlers, and a handle taken before a recorder exists records nothing.
//!
//! The series (their names are the constants of this module; docs/observability.md has the
//! table, with the alert rules and the Grafana dashboard built from them):
//!
//! | series | kind | labels |
//! |---|---|---|
//! | [`HANDLED`] | counter | `handler` |
//! | [`RETRIED`] | counter | `handler`, `reason` |
//! | [`DEAD_LETTERED`] | counter | `handler`, `reason` |
//! | [`HANDLER_DURATION`] | histogram (seconds) | `handler` |
//! | [`IN_FLIGHT`] | gauge | `handler` |
//! | [`HANDLER_PENDING`], [`HANDLER_OLDEST_PENDING`] | gauge | `handler` |
//! | [`OUTBOX_BACKLOG`], [`OUTBOX_OLDEST_PENDING`] | gauge | |
//! | [`QUEUE_DEPTH`] | gauge | `queue` (RabbitMQ) |
//! | [`CONSUMER_LAG`] | gauge | `handler`, `topic`, `partition` (Kafka) |
//! | [`RELAY_PUBLISHED`], [`RELAY_UNROUTED`] | counter | `transport` |
//! | [`RELAY_PUBLISH_DURATION`] | histogram (seconds) | `transport` |
//! | [`COMPONENT_READY`] | gauge | `component` |
//!
//! Labels stay bounded: `handler` is a registered handler's (or job's) name, `reason` one of
//! [`Reason::ALL`](crate::Reason::ALL) or `other` ([`reason_label`]); no message id, type or
//! payload is ever a label.
//!
//! Recording a call's outcome is a few atomic operations: the handles are taken once, when a
//! worker builds its handlers, and with no recorder installed they do nothing.
//!
//! ```
//! use std::time::Duration;
//! use hexeract::metrics::Metrics;
//! use hexeract::Reason;
//!
//! let metrics = Metrics::new();
//! let confirm = metrics.handler("shop::confirm");
//! confirm.handled(Duration::from_millis(3));
//! confirm.retried(&Reason::HANDLER_TIMEOUT, Some(Duration::from_millis(40)));
//! assert_eq!((confirm.handled_count(), confirm.retried_count()), (1, 1));
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::reason::Reason;

/// Calls that succeeded (the message was acked). Labels: `handler`.
pub const HANDLED: &str = "hexeract_messages_handled_total";
/// Calls that failed and were scheduled for another attempt. Labels: `handler`, `reason`
/// (`handler_failed`, `handler_timeout`, `handler_panicked`, `unknown_message_type` or `other`).
pub const RETRIED: &str = "hexeract_messages_retried_total";
/// Messages moved to the dead letters (or parked). Labels: `handler`, `reason` (see
/// [`reason_label`]).
pub const DEAD_LETTERED: &str = "hexeract_messages_dead_lettered_total";
/// How long handler calls took, whatever their outcome, in seconds. Labels: `handler`.
pub const HANDLER_DURATION: &str = "hexeract_handler_duration_seconds";
/// Calls running now. Labels: `handler`.
pub const IN_FLIGHT: &str = "hexeract_handler_in_flight";
/// Deliveries a handler still owes in the store (due, running or waiting for a retry). Labels:
/// `handler`.
pub const HANDLER_PENDING: &str = "hexeract_handler_pending";
/// How long ago the oldest delivery a handler still owes was published, in seconds (0 when it
/// owes none). Labels: `handler`.
pub const HANDLER_OLDEST_PENDING: &str = "hexeract_handler_oldest_pending_seconds";
/// Messages and deliveries of the store not settled yet.
pub const OUTBOX_BACKLOG: &str = "hexeract_outbox_backlog";
/// How long ago the oldest message still owed was published, in seconds (0 when none is).
pub const OUTBOX_OLDEST_PENDING: &str = "hexeract_outbox_oldest_pending_seconds";
/// Messages ready in a RabbitMQ queue a worker consumes (not counting those delivered and not
/// yet acked), read every 10 s with a passive declare. Labels: `queue`.
pub const QUEUE_DEPTH: &str = "hexeract_queue_depth";
/// Records of a partition not yet settled by the handler's consumer group (Kafka). Labels:
/// `handler`, `topic`, `partition`.
pub const CONSUMER_LAG: &str = "hexeract_consumer_lag";
/// Outbox rows a relay published and the broker confirmed. Labels: `transport`.
pub const RELAY_PUBLISHED: &str = "hexeract_relay_published_total";
/// Messages the broker could route to no queue whose type is allowed to have no subscribers
/// (`AMQP_ALLOW_UNROUTED`): deleted from the outbox and counted here, not dead-lettered.
/// Labels: `transport`.
pub const RELAY_UNROUTED: &str = "hexeract_relay_unrouted_total";
/// How long one relay publish took, from the first row sent to the last confirm, in seconds.
/// Labels: `transport`.
pub const RELAY_PUBLISH_DURATION: &str = "hexeract_relay_publish_duration_seconds";
/// 1 when a component's last pass worked (for the relay and the bus worker: connected to the
/// broker), else 0. Labels: `component`.
pub const COMPONENT_READY: &str = "hexeract_component_ready";

/// The handler label of messages no registered handler owns (an unknown message type).
pub const UNKNOWN: &str = "(none)";

/// The `reason` label of a reason a handler made up.
pub const OTHER_REASON: &str = "other";

/// Upper bounds of the latency histograms' buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `reason` label of a dead letter: the reason itself when it is one of the framework's
/// ([`Reason::ALL`]), [`OTHER_REASON`] for one a handler made up, so the label's values stay
/// few whatever handlers write.
///
/// ```
/// use hexeract::metrics::reason_label;
/// use hexeract::Reason;
///
/// assert_eq!(reason_label(&Reason::PAYLOAD_INVALID), "payload_invalid");
/// assert_eq!(reason_label(&Reason::from("sku_unknown".to_owned())), "other");
/// ```
pub fn reason_label(reason: &Reason) -> &'static str {
    Reason::ALL
        .iter()
        .position(|known| known == reason)
        .and_then(|index| KNOWN_REASONS.get(index).copied())
        .unwrap_or(OTHER_REASON)
}

/// The labels of [`Reason::ALL`], in its order.
const KNOWN_REASONS: [&str; 11] = [
    "payload_invalid",
    "payload_too_large",
    "message_id_missing",
    "unknown_message_type",
    "max_deliveries_exceeded",
    "handler_rejected",
    "handler_panicked",
    "handler_timeout",
    "delivery_limit_reached",
    "unroutable",
    "message_unreadable",
];

/// The `reason` label of a retry: why the call failed. A failure (`Err` or
/// `HandlerOutcome::retry`) is `handler_failed`.
fn retry_label(reason: &Reason) -> &'static str {
    match reason.retry_cause() {
        "handler_failed" => "handler_failed",
        "handler_timeout" => "handler_timeout",
        "handler_panicked" => "handler_panicked",
        "unknown_message_type" => "unknown_message_type",
        _ => OTHER_REASON,
    }
}

/// The Prometheus recorder Hexeract installed, installing it first when the process has no
/// recorder yet; `None` when the application installed its own (its recorder then gets every
/// series, and `/metrics` answers `404`).
///
/// [`run`](crate::run) and [`App::new`](crate::App::new) call it; call it yourself
/// before you build a worker some other way if you want `/metrics` served. Histograms are
/// rendered as Prometheus histograms (buckets from 1 ms to 10 s); a thread of its own drains
/// them every 5 s, so samples never pile up between scrapes.
///
/// ```
/// let handle = hexeract::metrics::prometheus().expect("no other recorder in this process");
/// hexeract::metrics::Metrics::new()
///     .handler("shop.confirm")
///     .handled(std::time::Duration::from_millis(2));
/// assert!(handle
///     .render()
///     .contains("hexeract_messages_handled_total{handler=\"shop.confirm\"} 1"));
/// ```
pub fn prometheus() -> Option<&'static PrometheusHandle> {
    static INSTALLED: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &BUCKETS)
                .expect("the buckets are not empty")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::debug!(
                    "a metrics recorder is installed already: Hexeract's series go to it"
                );
                return None;
            }
            describe();
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new()
                .name("hexeract-metrics".to_owned())
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_secs(5));
                    upkeep.run_upkeep();
                });
            Some(handle)
        })
        .as_ref()
}

/// Describes every series (help text and unit) to the installed recorder. The recorder
/// [`prometheus`] installs is described already; call it once after installing a recorder of
/// your own if it shows descriptions.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(HANDLED, "Calls that succeeded (the message was acked).");
    describe_counter!(
        RETRIED,
        "Calls that failed and were scheduled for another attempt, by why they failed."
    );
    describe_counter!(
        DEAD_LETTERED,
        "Messages moved to the dead letters (or parked), by reason."
    );
    describe_histogram!(
        HANDLER_DURATION,
        Unit::Seconds,
        "How long handler calls took, whatever their outcome."
    );
    describe_gauge!(IN_FLIGHT, "Handler calls running now.");
    describe_gauge!(
        HANDLER_PENDING,
        "Deliveries a handler still owes in the store (due, running or waiting for a retry)."
    );
    describe_gauge!(
        HANDLER_OLDEST_PENDING,
        Unit::Seconds,
        "How long ago the oldest delivery a handler still owes was published (0 when none)."
    );
    describe_gauge!(OUTBOX_BACKLOG, "Messages and deliveries not settled yet.");
    describe_gauge!(
        OUTBOX_OLDEST_PENDING,
        Unit::Seconds,
        "How long ago the oldest message still owed was published (0 when none is)."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Messages ready in a RabbitMQ queue a worker consumes (read every 10 s)."
    );
    describe_gauge!(
        CONSUMER_LAG,
        "Records of a partition not yet settled by the handler's consumer group (Kafka)."
    );
    describe_counter!(
        RELAY_PUBLISHED,
        "Outbox rows a relay published and the broker confirmed."
    );
    describe_histogram!(
        RELAY_PUBLISH_DURATION,
        Unit::Seconds,
        "How long one relay publish took, from the first row sent to the last confirm."
    );
    describe_gauge!(
        COMPONENT_READY,
        "1 when the component's last pass worked (for the relay and the bus worker: connected to the broker), else 0."
    );
}

/// The counts of every handler of a process, for [`MemoryWorker::stats`](crate::MemoryWorker::stats)
/// and tests; the series themselves go to the installed recorder.
#[derive(Clone, Default)]
pub struct Metrics {
    handlers: Arc<RwLock<BTreeMap<String, Arc<Counts>>>>,
}

impl Metrics {
    /// An empty set, for a runtime whose counts stay apart from the others'; workers count in
    /// [`Metrics::global`].
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// The process's counts, which every worker counts in.
    pub fn global() -> &'static Metrics {
        static GLOBAL: OnceLock<Metrics> = OnceLock::new();
        GLOBAL.get_or_init(Metrics::new)
    }

    /// What the handler (or scheduled job) `name` records through: its counts here, shared by
    /// every handle of that name, and its series' handles from the recorder installed now.
    /// Keep the returned handle: recording through it takes no lock.
    pub fn handler(&self, name: &str) -> Arc<HandlerMetrics> {
        let existing = self
            .handlers
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(name)
            .cloned();
        let counts = existing.unwrap_or_else(|| {
            self.handlers
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .entry(name.to_owned())
                .or_default()
                .clone()
        });
        Arc::new(HandlerMetrics::new(name, counts))
    }

    /// Sets the lag of the partitions `handler`'s consumer holds on `topic`: the records
    /// published and not yet settled, per partition. Partitions it held before and left out
    /// now (revoked) read 0.
    pub fn set_partition_lags(&self, handler: &str, topic: &str, lags: &[(i32, i64)]) {
        static HELD: Mutex<BTreeSet<(String, String, i32)>> = Mutex::new(BTreeSet::new());
        let mut held = HELD.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let revoked: Vec<i32> = held
            .iter()
            .filter(|(h, t, partition)| {
                h == handler && t == topic && !lags.iter().any(|(p, _)| p == partition)
            })
            .map(|(_, _, partition)| *partition)
            .collect();
        for partition in revoked {
            held.remove(&(handler.to_owned(), topic.to_owned(), partition));
            lag_gauge(handler, topic, partition).set(0.0);
        }
        for (partition, lag) in lags {
            held.insert((handler.to_owned(), topic.to_owned(), *partition));
            lag_gauge(handler, topic, *partition).set(*lag as f64);
        }
    }
}

fn lag_gauge(handler: &str, topic: &str, partition: i32) -> Gauge {
    metrics::gauge!(
        CONSUMER_LAG,
        "handler" => handler.to_owned(),
        "topic" => topic.to_owned(),
        "partition" => partition.to_string()
    )
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field(
                "handlers",
                &self
                    .handlers
                    .read()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .len(),
            )
            .finish()
    }
}

/// A handler's outcomes counted in a [`Metrics`], whatever recorder is installed.
#[derive(Debug, Default)]
struct Counts {
    handled: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
}

/// What one handler records through: its counts and its series' handles.
pub struct HandlerMetrics {
    name: Arc<str>,
    counts: Arc<Counts>,
    handled: Counter,
    duration: Histogram,
    in_flight: Gauge,
    /// One per label of [`retry_label`], taken on first use.
    retried: [OnceLock<Counter>; 5],
    /// One per [`KNOWN_REASONS`], then `other`: taken up front, so an alert on their increase
    /// sees the first dead letter too.
    dead_lettered: [Counter; 12],
}

impl HandlerMetrics {
    fn new(name: &str, counts: Arc<Counts>) -> HandlerMetrics {
        let label = name.to_owned();
        HandlerMetrics {
            handled: metrics::counter!(HANDLED, "handler" => label.clone()),
            duration: metrics::histogram!(HANDLER_DURATION, "handler" => label.clone()),
            in_flight: metrics::gauge!(IN_FLIGHT, "handler" => label.clone()),
            retried: Default::default(),
            dead_lettered: std::array::from_fn(|index| {
                let reason = KNOWN_REASONS.get(index).copied().unwrap_or(OTHER_REASON);
                metrics::counter!(DEAD_LETTERED, "handler" => label.clone(), "reason" => reason)
            }),
            name: Arc::from(name),
            counts,
        }
    }

    /// A call that succeeded after `took`.
    pub fn handled(&self, took: Duration) {
        self.counts.handled.fetch_add(1, Ordering::Relaxed);
        self.handled.increment(1);
        self.duration.record(took.as_secs_f64());
    }

    /// A message that will be retried because of `reason`, after a call that took `took`
    /// (`None`: no call was made, as when no handler could take it).
    pub fn retried(&self, reason: &Reason, took: Option<Duration>) {
        self.counts.retried.fetch_add(1, Ordering::Relaxed);
        let label = retry_label(reason);
        let index = RETRY_LABELS
            .iter()
            .position(|known| *known == label)
            .unwrap_or(RETRY_LABELS.len() - 1);
        self.retried[index]
            .get_or_init(|| {
                metrics::counter!(RETRIED, "handler" => self.name.to_string(), "reason" => label)
            })
            .increment(1);
        if let Some(took) = took {
            self.duration.record(took.as_secs_f64());
        }
    }

    /// A message dead-lettered because of `reason`, after a call that took `took` (`None`:
    /// no call was made, as for an undecodable or oversize message).
    pub fn dead_lettered(&self, reason: &Reason, took: Option<Duration>) {
        self.counts.dead_lettered.fetch_add(1, Ordering::Relaxed);
        let index = Reason::ALL
            .iter()
            .position(|known| known == reason)
            .map_or(KNOWN_REASONS.len(), |index| index.min(KNOWN_REASONS.len()));
        self.dead_lettered[index].increment(1);
        if let Some(took) = took {
            self.duration.record(took.as_secs_f64());
        }
    }

    /// A call starts; the returned guard counts it in [`IN_FLIGHT`] until it is dropped. It
    /// owns its handle, so that the call's future can keep it wherever it runs.
    pub(crate) fn call_started(&self) -> InFlight {
        self.in_flight.increment(1.0);
        InFlight(self.in_flight.clone())
    }

    /// Calls that succeeded so far.
    pub fn handled_count(&self) -> u64 {
        self.counts.handled.load(Ordering::Relaxed)
    }

    /// Calls that failed and were retried so far.
    pub fn retried_count(&self) -> u64 {
        self.counts.retried.load(Ordering::Relaxed)
    }

    /// Messages dead-lettered so far.
    pub fn dead_lettered_count(&self) -> u64 {
        self.counts.dead_lettered.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for HandlerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerMetrics")
            .field("name", &self.name)
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

/// The labels [`retry_label`] gives, `other` last.
const RETRY_LABELS: [&str; 5] = [
    "handler_failed",
    "handler_timeout",
    "handler_panicked",
    "unknown_message_type",
    OTHER_REASON,
];

/// A call counted in [`IN_FLIGHT`] until dropped.
pub(crate) struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// A relay of `transport` starts: its series exist from now on, at 0.
#[cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]
pub(crate) fn relay_started(transport: &'static str) {
    metrics::counter!(RELAY_PUBLISHED, "transport" => transport).increment(0);
    let _ = metrics::histogram!(RELAY_PUBLISH_DURATION, "transport" => transport);
}

/// Every handler's [`HANDLER_PENDING`] and [`HANDLER_OLDEST_PENDING`] at 0 until a
/// [`sample`] finds deliveries it owes: a dashboard then reads 0, not "no data".
pub(crate) fn owing_nothing<'a>(handlers: impl IntoIterator<Item = &'a str>) {
    for handler in handlers {
        metrics::gauge!(HANDLER_PENDING, "handler" => handler.to_owned()).set(0.0);
        metrics::gauge!(HANDLER_OLDEST_PENDING, "handler" => handler.to_owned()).set(0.0);
    }
}

/// An outbox row a relay dead-lettered instead of publishing (no handler, no call made).
pub(crate) fn dead_lettered_by_relay(reason: &Reason) {
    dead_lettered_at_take("", reason);
}

/// An outbox row of `handler` (empty: none) a store dead-lettered at its take, where the
/// worker could not be handed it (no call made).
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn dead_lettered_at_take(handler: &str, reason: &Reason) {
    let handler = if handler.is_empty() { UNKNOWN } else { handler };
    metrics::counter!(DEAD_LETTERED, "handler" => handler.to_owned(), "reason" => reason_label(reason))
        .increment(1);
}

/// A message of `message_type` the broker could route to no queue, deleted from the outbox as
/// allowed (`AMQP_ALLOW_UNROUTED`) rather than dead-lettered.
#[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
pub(crate) fn relay_unrouted(transport: &'static str) {
    metrics::counter!(RELAY_UNROUTED, "transport" => transport).increment(1);
}

/// One relay publish of `rows` rows to `transport`, confirmed after `took`.
#[cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]
pub(crate) fn relay_published(transport: &'static str, rows: usize, took: Duration) {
    metrics::counter!(RELAY_PUBLISHED, "transport" => transport).increment(rows as u64);
    metrics::histogram!(RELAY_PUBLISH_DURATION, "transport" => transport)
        .record(took.as_secs_f64());
}

/// Sets [`COMPONENT_READY`] of each component of `health`: no I/O, done at every scrape.
pub(crate) fn sample_health(health: &crate::health::Health) {
    for component in health.readiness().components {
        let ready = component.status == crate::health::Status::Ready;
        metrics::gauge!(COMPONENT_READY, "component" => component.name)
            .set(f64::from(u8::from(ready)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_framework_reason_is_its_own_label_and_the_rest_are_other() {
        assert_eq!(
            KNOWN_REASONS.len(),
            Reason::ALL.len(),
            "a label for each reason"
        );
        for (reason, label) in Reason::ALL.iter().zip(KNOWN_REASONS) {
            assert_eq!(reason.as_str(), label);
            assert_eq!(reason_label(reason), label);
        }
        assert_eq!(reason_label(&Reason::from("sku_unknown")), OTHER_REASON);
        assert_eq!(
            retry_label(&Reason::MAX_DELIVERIES_EXCEEDED),
            "handler_failed"
        );
        assert_eq!(retry_label(&Reason::HANDLER_TIMEOUT), "handler_timeout");
        assert_eq!(retry_label(&Reason::from("flaky_upstream")), OTHER_REASON);
        for label in RETRY_LABELS {
            assert!(
                label == OTHER_REASON
                    || KNOWN_REASONS.contains(&label)
                    || label == "handler_failed"
            );
        }
    }

    #[test]
    fn counts_are_shared_by_every_handle_of_a_name() {
        let metrics = Metrics::new();
        let first = metrics.handler("a");
        let second = metrics.handler("a");
        first.handled(Duration::from_millis(1));
        second.retried(&Reason::HANDLER_PANICKED, None);
        second.dead_lettered(&Reason::from("mine"), Some(Duration::from_millis(2)));
        assert_eq!(
            (
                first.handled_count(),
                first.retried_count(),
                first.dead_lettered_count()
            ),
            (1, 1, 1)
        );
        assert_eq!(metrics.handler("b").handled_count(), 0);
    }
}
