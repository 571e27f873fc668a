//! [`RetryPolicy`]: how many calls a message gets and how long to wait between them.

use std::num::NonZeroU32;
use std::time::Duration;

/// Retry budget and backoff.
///
/// `max_deliveries` counts handler calls in total: with the default 5, the fifth failure
/// dead-letters. Between calls the delay doubles from `initial_delay` up to `max_delay`, and each
/// delay is shortened by a random part of up to `jitter` so that messages failing together do not
/// come back together.
///
/// ```
/// use std::time::Duration;
/// use hexeract::RetryPolicy;
///
/// let policy = RetryPolicy::default().jitter(0.0);
/// assert_eq!(policy.backoff(1), Duration::from_secs(1));
/// assert_eq!(policy.backoff(2), Duration::from_secs(2));
/// assert_eq!(policy.backoff(4), Duration::from_secs(8));
/// assert_eq!(policy.backoff(20), Duration::from_secs(300));
/// assert!(!policy.is_exhausted(4));
/// assert!(policy.is_exhausted(5));
/// ```
///
/// In a configuration file ([`AppConfig`](crate::AppConfig)) it reads
/// `{ "max_deliveries": 5, "initial_delay_ms": 1000, "max_delay_ms": 300000, "jitter": 0.2 }`,
/// every key optional.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(from = "RetryFile")]
pub struct RetryPolicy {
    /// At least 1 through the public API; a builder may hold 0 until its `build()` refuses it.
    max_deliveries: u32,
    #[serde(rename = "initial_delay_ms", with = "crate::knobs::millis")]
    initial_delay: Duration,
    #[serde(rename = "max_delay_ms", with = "crate::knobs::millis")]
    max_delay: Duration,
    jitter: f64,
}

/// A [`RetryPolicy`] as a settings file spells it, read through the setters (the jitter is kept
/// between 0 and 1); a zero delay or limit is left for the settings' check to name.
#[derive(serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RetryFile {
    max_deliveries: u32,
    #[serde(with = "crate::knobs::millis")]
    initial_delay_ms: Duration,
    #[serde(with = "crate::knobs::millis")]
    max_delay_ms: Duration,
    jitter: f64,
}

impl Default for RetryFile {
    fn default() -> RetryFile {
        let defaults = RetryPolicy::default();
        RetryFile {
            max_deliveries: defaults.max_deliveries,
            initial_delay_ms: defaults.initial_delay,
            max_delay_ms: defaults.max_delay,
            jitter: defaults.jitter,
        }
    }
}

impl From<RetryFile> for RetryPolicy {
    fn from(file: RetryFile) -> RetryPolicy {
        RetryPolicy::default()
            .max_deliveries_or_zero(file.max_deliveries)
            .initial_delay(file.initial_delay_ms)
            .max_delay(file.max_delay_ms)
            .jitter(file.jitter)
    }
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_deliveries: 5,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// Handler calls per message in total, the first included (default 5).
    pub fn max_deliveries(mut self, max_deliveries: NonZeroU32) -> RetryPolicy {
        self.max_deliveries = max_deliveries.get();
        self
    }

    /// [`max_deliveries`](RetryPolicy::max_deliveries) from a builder's setter, which takes a
    /// plain number and lets `build()` report a 0.
    pub(crate) fn max_deliveries_or_zero(mut self, max_deliveries: u32) -> RetryPolicy {
        self.max_deliveries = max_deliveries;
        self
    }

    /// Delay before the second call (default 1 s).
    pub fn initial_delay(mut self, delay: Duration) -> RetryPolicy {
        self.initial_delay = delay;
        self
    }

    /// Longest delay between two calls (default 300 s).
    pub fn max_delay(mut self, delay: Duration) -> RetryPolicy {
        self.max_delay = delay;
        self
    }

    /// Fraction of each delay that is randomised away, from 0.0 (exact delays) to 1.0
    /// (default 0.2: each delay is between 80 % and 100 % of the doubled value).
    pub fn jitter(mut self, jitter: f64) -> RetryPolicy {
        self.jitter = jitter.clamp(0.0, 1.0);
        self
    }

    /// The first and the longest delay.
    pub fn delays(&self) -> (Duration, Duration) {
        (self.initial_delay, self.max_delay)
    }

    /// The configured number of calls.
    pub fn max_deliveries_value(&self) -> u32 {
        self.max_deliveries
    }

    /// How long to wait after the failed call number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        let base = self
            .initial_delay
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max_delay);
        if self.jitter == 0.0 {
            return base;
        }
        base.mul_f64(1.0 - self.jitter * fastrand::f64())
    }

    /// The delay after failed call number `attempt`: the one the handler asked for
    /// ([`HandlerOutcome::retry_after`](crate::HandlerOutcome::retry_after)) or else the
    /// backoff, never longer than `max_delay` (`RETRY_MAX_DELAY_MS`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use hexeract::RetryPolicy;
    ///
    /// let policy = RetryPolicy::default().max_delay(Duration::from_secs(60)).jitter(0.0);
    /// assert_eq!(policy.delay_after(1, None), Duration::from_secs(1));
    /// assert_eq!(policy.delay_after(1, Some(Duration::from_secs(5))), Duration::from_secs(5));
    /// assert_eq!(policy.delay_after(1, Some(Duration::from_secs(3600))), Duration::from_secs(60));
    /// ```
    pub fn delay_after(&self, attempt: u32, requested: Option<Duration>) -> Duration {
        match requested {
            Some(delay) => delay.min(self.max_delay),
            None => self.backoff(attempt),
        }
    }

    /// `true` when call number `attempt` was the last one allowed.
    pub fn is_exhausted(&self, attempt: u32) -> bool {
        attempt >= self.max_deliveries
    }
}

/// The delays of a loop that tries an operation again until it succeeds (connecting,
/// declaring, writing a dead letter): from `first`, doubling up to `longest`, each shortened at
/// random by up to a fifth, as [`RetryPolicy::backoff`] does, so that the processes that lost a
/// broker together do not all knock again at the same instant.
#[derive(Clone, Debug)]
#[cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]
pub(crate) struct Backoff {
    policy: RetryPolicy,
    tries: u32,
}

#[cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]
impl Backoff {
    pub(crate) fn new(first: Duration, longest: Duration) -> Backoff {
        Backoff {
            policy: RetryPolicy::default()
                .initial_delay(first)
                .max_delay(longest),
            tries: 0,
        }
    }

    /// The wait before the next try.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.tries = self.tries.saturating_add(1);
        self.policy.backoff(self.tries)
    }

    /// Starts over from the first delay.
    #[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
    pub(crate) fn reset(&mut self) {
        self.tries = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jittered_delays_stay_within_the_band_and_under_the_cap() {
        let policy = RetryPolicy::default().max_delay(Duration::from_secs(10));
        for attempt in 1..40 {
            let exact = RetryPolicy::default()
                .max_delay(Duration::from_secs(10))
                .jitter(0.0)
                .backoff(attempt);
            let delay = policy.backoff(attempt);
            assert!(delay <= exact, "attempt {attempt}: {delay:?} > {exact:?}");
            assert!(
                delay >= exact.mul_f64(0.8),
                "attempt {attempt}: {delay:?} < 80% of {exact:?}"
            );
        }
        assert_eq!(
            policy.clone().jitter(0.0).backoff(40),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn a_backoff_doubles_with_jitter_up_to_its_longest_and_starts_over() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next_delay()).collect();
        for (n, (delay, exact)) in delays
            .iter()
            .zip([100u64, 200, 400, 800, 1_000, 1_000])
            .enumerate()
        {
            let exact = Duration::from_millis(exact);
            assert!(
                *delay <= exact && *delay >= exact.mul_f64(0.8),
                "delay {n}: {delay:?} against {exact:?}"
            );
        }
        assert!(delays.iter().all(|delay| *delay <= Duration::from_secs(1)));
        backoff.reset();
        assert!(backoff.next_delay() <= Duration::from_millis(100));
    }
}
