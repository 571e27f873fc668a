//! Counters and latency histograms per handler, in the Prometheus text format.
//!
//! Every worker of the process (outbox worker, RabbitMQ worker, scheduler, in-memory runtime)
//! records each call's outcome and duration in [`Metrics::global`]; `GET /metrics` on
//! `WORKER_PORT` renders it with the process's gauges (outbox backlog, readiness per
//! component). Recording is a few atomic additions: no lock on the hot path once a handler's
//! entry exists.
//!
//! ```
//! use std::time::Duration;
//! use hexeract::metrics::Metrics;
//!
//! let metrics = Metrics::new();
//! let confirm = metrics.handler("shop::confirm");
//! confirm.handled(Duration::from_millis(3));
//! confirm.retried(Duration::from_millis(40));
//! let text = metrics.render();
//! assert!(text.contains("hexeract_messages_handled_total{handler=\"shop::confirm\"} 1"));
//! assert!(text.contains("hexeract_handler_duration_seconds_count{handler=\"shop::confirm\"} 2"));
//! ```

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

/// Picks one counter of a handler.
type Counter = fn(&HandlerMetrics) -> &AtomicU64;

/// The handler label of messages no registered handler owns (an unknown message type).
pub const UNKNOWN: &str = "(none)";

/// Upper bounds of the latency histogram's buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A partition a handler's consumer group holds: `(handler, topic, partition)`.
type PartitionOf = (String, String, i32);

/// The counters of every handler of a process.
#[derive(Clone, Default)]
pub struct Metrics {
    handlers: Arc<RwLock<BTreeMap<String, Arc<HandlerMetrics>>>>,
    /// Records behind each partition a consumer group holds: `(handler, topic, partition)`.
    lags: Arc<RwLock<BTreeMap<PartitionOf, i64>>>,
}

impl Metrics {
    /// An empty set, for tests; workers record in [`Metrics::global`].
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// The process's metrics, which every worker records in.
    pub fn global() -> &'static Metrics {
        static GLOBAL: OnceLock<Metrics> = OnceLock::new();
        GLOBAL.get_or_init(Metrics::new)
    }

    /// The counters of the handler (or scheduled job) `name`, created on first use. Keep the
    /// returned handle: recording through it takes no lock.
    pub fn handler(&self, name: &str) -> Arc<HandlerMetrics> {
        if let Some(existing) = self.read().get(name) {
            return existing.clone();
        }
        self.handlers
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    /// Sets the lag of the partitions `handler`'s consumer holds on `topic`: the records
    /// published and not yet settled, per partition. Partitions left out (revoked) are
    /// forgotten.
    ///
    /// ```
    /// use hexeract::metrics::Metrics;
    ///
    /// let metrics = Metrics::new();
    /// metrics.set_partition_lags("shop::reserve", "shop.order", &[(0, 12), (2, 0)]);
    /// let text = metrics.render();
    /// assert!(text.contains(
    ///     "hexeract_consumer_lag{handler=\"shop::reserve\",topic=\"shop.order\",partition=\"0\"} 12"
    /// ));
    /// metrics.set_partition_lags("shop::reserve", "shop.order", &[(2, 0)]);
    /// assert!(!metrics.render().contains("partition=\"0\""));
    /// ```
    pub fn set_partition_lags(&self, handler: &str, topic: &str, lags: &[(i32, i64)]) {
        let mut all = self
            .lags
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        all.retain(|(h, t, _), _| h != handler || t != topic);
        for (partition, lag) in lags {
            all.insert((handler.to_owned(), topic.to_owned(), *partition), *lag);
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<HandlerMetrics>>> {
        self.handlers
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every handler's counters and histogram in the Prometheus text format (0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_into(&mut out);
        out
    }

    /// [`render`](Metrics::render), appended to `out`.
    pub fn render_into(&self, out: &mut String) {
        let handlers = self.read();
        let counters: [(&str, &str, Counter); 3] = [
            (
                "hexeract_messages_handled_total",
                "Calls that succeeded (the message was acked).",
                |m| &m.handled,
            ),
            (
                "hexeract_messages_retried_total",
                "Calls that failed and were scheduled for another attempt.",
                |m| &m.retried,
            ),
            (
                "hexeract_messages_dead_lettered_total",
                "Messages moved to the dead letters (or parked), with any reason.",
                |m| &m.dead_lettered,
            ),
        ];
        for (name, help, counter) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (handler, metrics) in handlers.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{handler=\"{}\"}} {}",
                    escape(handler),
                    counter(metrics).load(Ordering::Relaxed)
                );
            }
        }
        let lags = self
            .lags
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !lags.is_empty() {
            let name = "hexeract_consumer_lag";
            let _ = writeln!(
                out,
                "# HELP {name} Records of a partition not yet settled by the handler's consumer group (Kafka).\n# TYPE {name} gauge"
            );
            for ((handler, topic, partition), lag) in lags.iter() {
                let _ = writeln!(
                    out,
                    "{name}{{handler=\"{}\",topic=\"{}\",partition=\"{partition}\"}} {lag}",
                    escape(handler),
                    escape(topic)
                );
            }
        }
        drop(lags);
        let name = "hexeract_handler_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} How long handler calls took, whatever their outcome.\n# TYPE {name} histogram"
        );
        for (handler, metrics) in handlers.iter() {
            let handler = escape(handler);
            let mut cumulative = 0;
            for (bound, count) in BUCKETS.iter().zip(&metrics.buckets) {
                cumulative += count.load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "{name}_bucket{{handler=\"{handler}\",le=\"{bound}\"}} {cumulative}"
                );
            }
            // Read one counter at a time while calls are counted: `+Inf` is never below a
            // finite bucket.
            let count = metrics.count.load(Ordering::Relaxed).max(cumulative);
            let sum = metrics.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(
                out,
                "{name}_bucket{{handler=\"{handler}\",le=\"+Inf\"}} {count}\n\
                 {name}_sum{{handler=\"{handler}\"}} {sum}\n\
                 {name}_count{{handler=\"{handler}\"}} {count}"
            );
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("handlers", &self.read().len())
            .finish()
    }
}

/// One handler's counters and latency histogram.
#[derive(Debug, Default)]
pub struct HandlerMetrics {
    handled: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    /// Calls per bucket (not cumulative); calls above the last bound are only in `count`.
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl HandlerMetrics {
    /// A call that succeeded after `took`.
    pub fn handled(&self, took: Duration) {
        self.handled.fetch_add(1, Ordering::Relaxed);
        self.observe(took);
    }

    /// A call that failed after `took` and will be retried.
    pub fn retried(&self, took: Duration) {
        self.retried.fetch_add(1, Ordering::Relaxed);
        self.observe(took);
    }

    /// A message that will be retried without a call (no handler could take it): counted, not
    /// timed.
    pub fn retried_without_call(&self) {
        self.retried.fetch_add(1, Ordering::Relaxed);
    }

    /// A message dead-lettered after a call that took `took` (`None`: no call was made, as for
    /// an undecodable or oversize message).
    pub fn dead_lettered(&self, took: Option<Duration>) {
        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
        if let Some(took) = took {
            self.observe(took);
        }
    }

    fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some(index) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[index].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Calls that succeeded so far.
    pub fn handled_count(&self) -> u64 {
        self.handled.load(Ordering::Relaxed)
    }

    /// Calls that failed and were retried so far.
    pub fn retried_count(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }

    /// Messages dead-lettered so far.
    pub fn dead_lettered_count(&self) -> u64 {
        self.dead_lettered.load(Ordering::Relaxed)
    }
}

/// A label value as the text format wants it: `\`, `"` and newlines escaped.
pub(crate) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_cumulative_and_counts_every_call() {
        let metrics = Metrics::new();
        let handler = metrics.handler("a\"b");
        handler.handled(Duration::from_micros(500));
        handler.handled(Duration::from_millis(30));
        handler.retried(Duration::from_secs(60));
        handler.dead_lettered(None);
        let text = metrics.render();
        let line = |needle: &str| {
            text.lines()
                .find(|line| line.starts_with(needle))
                .unwrap_or_else(|| panic!("{needle} missing from:\n{text}"))
                .to_owned()
        };
        assert_eq!(
            line("hexeract_handler_duration_seconds_bucket{handler=\"a\\\"b\",le=\"0.001\"}"),
            "hexeract_handler_duration_seconds_bucket{handler=\"a\\\"b\",le=\"0.001\"} 1"
        );
        assert!(
            line("hexeract_handler_duration_seconds_bucket{handler=\"a\\\"b\",le=\"0.05\"}")
                .ends_with(" 2")
        );
        assert!(
            line("hexeract_handler_duration_seconds_bucket{handler=\"a\\\"b\",le=\"10\"}")
                .ends_with(" 2")
        );
        assert!(
            line("hexeract_handler_duration_seconds_bucket{handler=\"a\\\"b\",le=\"+Inf\"}")
                .ends_with(" 3")
        );
        assert!(line("hexeract_messages_dead_lettered_total").ends_with(" 1"));
        assert!(line("hexeract_messages_retried_total").ends_with(" 1"));
        assert!(line("hexeract_handler_duration_seconds_sum").ends_with(" 60.0305"));

        // A retry without a call is counted, not timed.
        handler.retried_without_call();
        let text = metrics.render();
        assert!(
            text.contains("hexeract_messages_retried_total{handler=\"a\\\"b\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("hexeract_handler_duration_seconds_count{handler=\"a\\\"b\"} 3"),
            "{text}"
        );
    }
}
