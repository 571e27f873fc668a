//! [`Policy`]: the knobs every worker's builder shares, with their defaults written once, as
//! two presets: the library's (`seeds/000…`: what a builder starts from) and the process's
//! (`seeds/003…`: what `hexeract::run` starts from).

use std::num::NonZeroU32;
use std::time::Duration;

use crate::config::EnvSettings;
use crate::config::KnobChecks;
use crate::retry::RetryPolicy;

/// Calls of one handler running at once in the in-memory world, where nothing else bounds
/// them (the other worlds are bounded by their claim batch, prefetch or partition).
pub(crate) const IN_MEMORY_CONCURRENCY: u32 = 16;

/// The knobs around a handler call and a worker's loop. Each builder keeps one and its setters
/// write into it, so a knob has one home and one default whatever the order of the calls.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Policy {
    /// Calls in total (`max_deliveries` / `max_attempts`, its limit included), backoff and
    /// jitter.
    pub(crate) retry: RetryPolicy,
    /// Deadline of one call unless the handler sets its own (the scheduler's
    /// `dispatch_timeout`).
    pub(crate) handler_timeout: Duration,
    /// Largest payload handed to a handler; larger ones are dead-lettered undecoded.
    pub(crate) max_payload_bytes: usize,
    /// Calls of one handler at once unless the handler sets its own; `None`: bounded by the
    /// world alone (or [`IN_MEMORY_CONCURRENCY`] in the in-memory world).
    pub(crate) concurrency: Option<u32>,
    /// How long a cancelled worker lets running calls finish.
    pub(crate) shutdown_grace: Duration,
    /// Sleep after a poll that found nothing.
    pub(crate) poll_interval: Duration,
    /// Deliveries claimed (occurrences, rows relayed) per poll.
    pub(crate) batch_size: u32,
    /// How long a claim lasts.
    pub(crate) lease: Duration,
    /// Deliveries a broker may have in flight per consumer.
    pub(crate) prefetch: u32,
    /// Wait between two poll cycles that found work.
    pub(crate) min_cycle_delay: Duration,
    /// Deadline of one of the worker's own statements (claim, settle, relay pass, plan).
    pub(crate) store_timeout: Duration,
}

impl Policy {
    /// The library's defaults, what every builder starts from (`seeds/000…`): 5 calls, 1 s →
    /// 300 s, 30 s per call, 1 MiB, 8 s of grace, `poll_interval` 100 ms, `batch_size` 10,
    /// `lease` 30 s, `prefetch` 16, `min_cycle_delay` 5 ms, `store_timeout` 30 s.
    pub(crate) fn library() -> Policy {
        Policy {
            retry: RetryPolicy::default(),
            handler_timeout: Duration::from_secs(30),
            max_payload_bytes: 1024 * 1024,
            concurrency: None,
            shutdown_grace: Duration::from_secs(8),
            poll_interval: Duration::from_millis(100),
            batch_size: 10,
            lease: Duration::from_secs(30),
            prefetch: 16,
            min_cycle_delay: Duration::from_millis(5),
            store_timeout: Duration::from_secs(30),
        }
    }

    /// The process's defaults, what `hexeract::run` starts from (`seeds/003…`): the library's
    /// with batches of 100 (`RELAY_BATCH_SIZE`) and 500 ms polls (`*_POLL_INTERVAL_MS`).
    pub(crate) fn process() -> Policy {
        Policy {
            batch_size: 100,
            poll_interval: Duration::from_millis(500),
            ..Policy::library()
        }
    }

    /// The variables every world reads where they are set: `MAX_DELIVERIES`,
    /// `RETRY_MAX_DELAY_MS`, `HANDLER_TIMEOUT_MS`, `SHUTDOWN_GRACE_MS`, `MAX_PAYLOAD_BYTES`,
    /// `STORE_TIMEOUT_MS`.
    pub(crate) fn with_env(mut self, settings: &EnvSettings) -> Policy {
        if let Some(max) = settings.max_deliveries {
            self.retry = self.retry.max_deliveries(max);
        }
        if let Some(delay) = settings.retry_max_delay {
            self.retry = self.retry.max_delay(delay);
        }
        if let Some(timeout) = settings.handler_timeout {
            self.handler_timeout = timeout;
        }
        if let Some(grace) = settings.shutdown_grace {
            self.shutdown_grace = grace;
        }
        if let Some(max) = settings.max_payload_bytes {
            self.max_payload_bytes = max;
        }
        if let Some(timeout) = settings.store_timeout {
            self.store_timeout = timeout;
        }
        self
    }

    /// Sets the number of calls; 0 is kept so that `build()` can say what is wrong with it.
    pub(crate) fn max_deliveries(&mut self, max: u32) {
        self.retry = self.retry.clone().max_deliveries_or_zero(max);
    }

    /// The checks of the knobs every world has, `limit` naming the builder's retry-limit knob
    /// (`max_deliveries`, or the seed's `max_attempts`).
    pub(crate) fn checks(&self, limit: &str) -> KnobChecks {
        let checks = KnobChecks::default()
            .at_least_one(limit, self.retry.max_deliveries_value().into())
            .not_zero("handler_timeout", self.handler_timeout)
            .at_least_one("max_payload_bytes", self.max_payload_bytes as u64);
        match self.concurrency {
            Some(limit) => checks.at_least_one("concurrency", limit.into()),
            None => checks,
        }
    }

    /// The default concurrency limit of a handler, once [`checks`](Policy::checks) passed.
    pub(crate) fn concurrency_limit(&self) -> Option<NonZeroU32> {
        self.concurrency.and_then(NonZeroU32::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_presets_are_the_seeds_defaults() {
        let library = Policy::library();
        assert_eq!(library.retry.max_deliveries_value(), 5);
        assert_eq!(
            library.retry.delays(),
            (Duration::from_secs(1), Duration::from_secs(300))
        );
        assert_eq!(
            (library.poll_interval, library.batch_size),
            (Duration::from_millis(100), 10)
        );
        assert_eq!(
            (library.prefetch, library.lease),
            (16, Duration::from_secs(30))
        );
        let process = Policy::process();
        assert_eq!(
            (process.poll_interval, process.batch_size),
            (Duration::from_millis(500), 100)
        );
        assert_eq!(
            Policy {
                batch_size: 10,
                poll_interval: Duration::from_millis(100),
                ..process
            },
            library,
            "the presets differ in batch size and poll interval only"
        );
    }

    #[test]
    fn a_zero_retry_limit_is_kept_for_the_check_to_name() {
        let mut policy = Policy::library();
        policy.max_deliveries(0);
        let problems = policy.checks("max_attempts").finish().unwrap_err();
        assert!(problems.to_string().contains("max_attempts"), "{problems}");
        policy.max_deliveries(3);
        assert!(policy.checks("max_attempts").finish().is_ok());
        assert_eq!(policy.retry.max_deliveries_value(), 3);
    }
}
