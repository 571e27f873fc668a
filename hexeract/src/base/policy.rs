//! [`Policy`]: the knobs every worker's builder shares, with their defaults written once, as
//! two presets: the library's (`seeds/000…`: what a builder starts from) and the process's
//! (`seeds/003…`: what `hexeract::run` starts from).

use std::num::NonZeroU32;
use std::time::Duration;

use crate::knobs::KnobChecks;
use crate::retry::RetryPolicy;

/// What a loop has, after its shutdown grace, to settle the calls that finished and hand back
/// the ones it gave up on: store writes and broker acks, each a round trip when all is well.
/// When they cannot finish in it (a database that stopped answering, a broker under an alarm),
/// the loop stops anyway; what it still holds is handed out again when its lease ends (store
/// claims) or when its channel or consumer closes (brokers), as after a crash.
pub(crate) const SETTLE_AFTER_GRACE: Duration = Duration::from_secs(5);

/// Calls of one handler running at once in the in-memory world, where nothing else bounds
/// them (the other worlds are bounded by their claim batch, prefetch or partition).
pub(crate) const IN_MEMORY_CONCURRENCY: u32 = 16;

/// The longest call among handlers or jobs (`own`: each one's name and the timeout it sets,
/// if any), the others taking `default` (the knob `knob`): how long, and who sets it.
pub(crate) fn longest_call<'a>(
    default: Duration,
    knob: &str,
    own: impl Iterator<Item = (&'a str, Option<Duration>)>,
) -> (Duration, String) {
    let mut longest: Option<(Duration, &str)> = None;
    // With none at all, or one without a timeout of its own, the default is a call's length.
    let mut default_applies = false;
    for (name, timeout) in own {
        match timeout {
            Some(timeout) if longest.is_none_or(|(longest, _)| timeout > longest) => {
                longest = Some((timeout, name));
            }
            Some(_) => {}
            None => default_applies = true,
        }
    }
    match longest {
        Some((timeout, name)) if !default_applies || timeout > default => {
            (timeout, format!("the timeout of {name:?}"))
        }
        _ => (default, knob.to_owned()),
    }
}

/// The knobs around a handler call and a worker's loop, with their defaults written once. Each
/// builder keeps one and its setters write into it, so a knob has one home and one default
/// whatever the order of the calls; [`AppConfig`](crate::AppConfig) holds the one a
/// process runs with.
///
/// Two presets: [`Policy::library`] (what every worker's builder starts from) and
/// [`Policy::process`] (what [`hexeract::run`](crate::run) and [`App`](crate::App) start
/// from). In a configuration file every key is optional, durations are in milliseconds:
///
/// ```
/// let policy: hexeract::Policy = serde_json::from_str(
///     r#"{ "handler_timeout_ms": 5000, "retry": { "max_deliveries": 3 } }"#,
/// )?;
/// assert_eq!(policy.handler_timeout, std::time::Duration::from_secs(5));
/// assert_eq!(policy.retry.max_deliveries_value(), 3);
/// assert_eq!(policy.batch_size, hexeract::Policy::process().batch_size);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Calls in total (`MAX_DELIVERIES`; the seed's `max_attempts`), backoff (its longest
    /// delay is `RETRY_MAX_DELAY_MS`) and jitter.
    pub retry: RetryPolicy,
    /// Deadline of one call unless the handler sets its own (`HANDLER_TIMEOUT_MS`; the
    /// scheduler's is `SCHEDULER_DISPATCH_TIMEOUT_MS`).
    #[serde(rename = "handler_timeout_ms", with = "crate::knobs::millis")]
    pub handler_timeout: Duration,
    /// Largest payload handed to a handler; larger ones are dead-lettered undecoded
    /// (`MAX_PAYLOAD_BYTES`).
    pub max_payload_bytes: usize,
    /// Calls of one handler at once unless the handler sets its own; `None`: bounded by the
    /// world alone (its claim batch, prefetch or partition; 16 in the in-memory world).
    pub concurrency: Option<u32>,
    /// How long a cancelled worker lets running calls finish (`SHUTDOWN_GRACE_MS`).
    #[serde(rename = "shutdown_grace_ms", with = "crate::knobs::millis")]
    pub shutdown_grace: Duration,
    /// Sleep after a poll that found nothing (`CONSUMER_POLL_INTERVAL_MS`: the outbox
    /// worker's).
    #[serde(rename = "poll_interval_ms", with = "crate::knobs::millis")]
    pub poll_interval: Duration,
    /// Deliveries claimed, or rows relayed, per poll (`RELAY_BATCH_SIZE`).
    pub batch_size: u32,
    /// How long a claim of a delivery lasts (`DELIVERY_LEASE_MS`). `None`: the longest handler
    /// timeout and the room for the settle after it (35 s with the defaults); one set must be
    /// at least that long, or the worker does not build ([`Policy::lease_for`]).
    #[serde(rename = "lease_ms", with = "crate::knobs::millis_option")]
    pub lease: Option<Duration>,
    /// Deliveries a broker may have in flight per consumer (`AMQP_PREFETCH`).
    pub prefetch: u32,
    /// Wait between two poll cycles that found work.
    #[serde(rename = "min_cycle_delay_ms", with = "crate::knobs::millis")]
    pub min_cycle_delay: Duration,
    /// Deadline of one of the worker's own statements: claim, settle, relay pass, plan
    /// (`STORE_TIMEOUT_MS`).
    #[serde(rename = "store_timeout_ms", with = "crate::knobs::millis")]
    pub store_timeout: Duration,
}

impl Default for Policy {
    /// The process's: [`Policy::process`].
    fn default() -> Policy {
        Policy::process()
    }
}

impl Policy {
    /// The library's defaults, what every builder starts from (`seeds/000…`): 5 calls, 1 s →
    /// 300 s, 30 s per call, 1 MiB, 8 s of grace, `poll_interval` 100 ms, `batch_size` 10,
    /// `lease` derived (the longest handler timeout and 5 s: 35 s), `prefetch` 16,
    /// `min_cycle_delay` 5 ms, `store_timeout` 30 s.
    pub fn library() -> Policy {
        Policy {
            retry: RetryPolicy::default(),
            handler_timeout: Duration::from_secs(30),
            max_payload_bytes: 1024 * 1024,
            concurrency: None,
            shutdown_grace: Duration::from_secs(8),
            poll_interval: Duration::from_millis(100),
            batch_size: 10,
            lease: None,
            prefetch: 16,
            min_cycle_delay: Duration::from_millis(5),
            store_timeout: Duration::from_secs(30),
        }
    }

    /// The process's defaults, what `hexeract::run` starts from (`seeds/003…`): the library's
    /// with batches of 100 (`RELAY_BATCH_SIZE`) and 500 ms polls (`*_POLL_INTERVAL_MS`).
    pub fn process() -> Policy {
        Policy {
            batch_size: 100,
            poll_interval: Duration::from_millis(500),
            ..Policy::library()
        }
    }

    /// Takes from `set` the knobs every world reads whose variable `lookup` finds set
    /// (`MAX_DELIVERIES`, `RETRY_MAX_DELAY_MS`, `HANDLER_TIMEOUT_MS`, `SHUTDOWN_GRACE_MS`,
    /// `MAX_PAYLOAD_BYTES`, `STORE_TIMEOUT_MS`); the others keep this policy's values.
    pub(crate) fn take_set_variables(
        &mut self,
        set: &Policy,
        lookup: impl Fn(&str) -> Option<String>,
    ) {
        let is_set = |name: &str| lookup(name).is_some();
        if is_set("MAX_DELIVERIES") {
            self.retry = self
                .retry
                .clone()
                .max_deliveries_or_zero(set.retry.max_deliveries_value());
        }
        if is_set("RETRY_MAX_DELAY_MS") {
            self.retry = self.retry.clone().max_delay(set.retry.delays().1);
        }
        if is_set("HANDLER_TIMEOUT_MS") {
            self.handler_timeout = set.handler_timeout;
        }
        if is_set("SHUTDOWN_GRACE_MS") {
            self.shutdown_grace = set.shutdown_grace;
        }
        if is_set("MAX_PAYLOAD_BYTES") {
            self.max_payload_bytes = set.max_payload_bytes;
        }
        if is_set("STORE_TIMEOUT_MS") {
            self.store_timeout = set.store_timeout;
        }
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

    /// The room a lease keeps above the longest call for the settle that follows it: the store
    /// timeout (what bounds that write), at most 5 s (the settle after the shutdown grace has
    /// as long; a write that takes longer is refused by the claim check, and the delivery only
    /// runs again).
    pub fn settle_room(&self) -> Duration {
        self.store_timeout.min(SETTLE_AFTER_GRACE)
    }

    /// The lease claims are taken for when the longest call a claim may run is `longest_call`
    /// (the handler timeout, or the longest one a handler sets, with `who` naming it): the
    /// lease set, or `longest_call` and the [`settle_room`](Policy::settle_room) when none is.
    /// A lease set shorter than that is refused: a call that takes its whole timeout would
    /// outlive its claim, and another worker could run the same delivery beside it.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let mut policy = hexeract::Policy::library();
    /// let timeout = policy.handler_timeout;
    /// assert_eq!(policy.lease_for(timeout, "handler_timeout"), Ok(Duration::from_secs(35)));
    /// policy.lease = Some(Duration::from_secs(30));
    /// let refused = policy.lease_for(timeout, "handler_timeout").unwrap_err();
    /// assert!(refused.contains("at least 35s"), "{refused}");
    /// ```
    pub fn lease_for(&self, longest_call: Duration, who: &str) -> Result<Duration, String> {
        let needed = longest_call.saturating_add(self.settle_room());
        match self.lease {
            None => Ok(needed),
            Some(lease) if lease >= needed => Ok(lease),
            Some(_) => Err(format!(
                "at least {needed:?}: the longest call a claim may run ({longest_call:?}, \
                 {who}) and {:?} for its settle (the store timeout, at most 5 s); a shorter \
                 lease lets another worker claim a delivery while its call still runs. Raise \
                 the lease, lower that timeout, or leave the lease unset",
                self.settle_room()
            )),
        }
    }

    /// The lease to claim with (see [`lease_for`](Policy::lease_for)), or the configuration
    /// error that names the lease as `knob` (`lease (DELIVERY_LEASE_MS)`) and says why.
    pub(crate) fn checked_lease(
        &self,
        knob: &str,
        (longest, who): (Duration, String),
    ) -> Result<Duration, crate::knobs::ConfigError> {
        self.lease_for(longest, &who)
            .map_err(|expected| crate::knobs::ConfigError {
                problems: vec![crate::knobs::ConfigProblem {
                    setting: knob.to_owned(),
                    value: format!("{:?}", self.lease.unwrap_or_default()),
                    expected,
                }],
            })
    }

    /// The default concurrency limit of a handler, once [`checks`](Policy::checks) passed.
    pub(crate) fn concurrency_limit(&self) -> Option<NonZeroU32> {
        self.concurrency.and_then(NonZeroU32::new)
    }
}

/// The largest payload this process writes into the outbox (checked by `store::limit`), as the
/// workers see it.
mod outbox_limit {
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The limit unless `MAX_PAYLOAD_BYTES` says otherwise: the workers' default,
    /// [`Policy::library`](crate::Policy::library)'s `max_payload_bytes`.
    const DEFAULT: usize = 1024 * 1024;

    /// The largest `MAX_PAYLOAD_BYTES` the configuration accepts.
    const MOST: usize = 1 << 30;

    /// This process's limit; 0 until first read.
    static LIMIT: AtomicUsize = AtomicUsize::new(0);

    /// The largest payload this process writes into the outbox: `MAX_PAYLOAD_BYTES` (the variable
    /// the workers read; its default, 1 MiB, when it is unset or invalid, which the workers report),
    /// or more where a worker of this process was built to take larger ones.
    pub(crate) fn payload_limit() -> usize {
        match LIMIT.load(Ordering::Relaxed) {
            0 => {
                let configured = std::env::var("MAX_PAYLOAD_BYTES")
                    .ok()
                    .and_then(|value| value.trim().parse::<usize>().ok())
                    .filter(|max| (1..=MOST).contains(max))
                    .unwrap_or(DEFAULT);
                // A worker built meanwhile may have raised it: keep the larger.
                LIMIT
                    .fetch_max(configured, Ordering::Relaxed)
                    .max(configured)
            }
            limit => limit,
        }
    }

    /// A worker of this process takes payloads of up to `max` bytes: this process may write them.
    /// A `max` over the largest `MAX_PAYLOAD_BYTES` accepts (the scheduler's "no cap" on its own
    /// small payloads) is no limit on what others write, and changes nothing.
    pub(crate) fn accept_payloads_up_to(max: usize) {
        let current = payload_limit();
        if max > current && max <= MOST {
            LIMIT.fetch_max(max, Ordering::Relaxed);
        }
    }
}
pub(crate) use outbox_limit::{accept_payloads_up_to, payload_limit};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_covers_the_longest_call_and_the_room_to_settle_it() {
        let secs = Duration::from_secs;
        let derived = Policy::library();
        assert_eq!(derived.lease_for(secs(30), "handler_timeout"), Ok(secs(35)));
        // The room is the store timeout when it is shorter than 5 s.
        let quick_store = Policy {
            store_timeout: Duration::from_millis(200),
            lease: Some(Duration::from_millis(1_200)),
            ..Policy::library()
        };
        assert_eq!(
            quick_store.lease_for(secs(1), "handler_timeout"),
            Ok(Duration::from_millis(1_200))
        );
        assert!(quick_store
            .lease_for(Duration::from_millis(1_001), "handler_timeout")
            .is_err());
        // A lease equal to the timeout (the seed's 30 s and 30 s) is refused, naming both.
        let equal = Policy {
            lease: Some(secs(30)),
            ..Policy::library()
        };
        let refused = equal
            .lease_for(secs(30), "the timeout of \"orders\"")
            .unwrap_err();
        assert!(refused.contains("at least 35s"), "{refused}");
        assert!(refused.contains("the timeout of \"orders\""), "{refused}");
    }

    #[test]
    fn the_longest_call_is_the_default_only_where_some_handler_takes_it() {
        let secs = Duration::from_secs;
        let knob = || "handler_timeout".to_owned();
        assert_eq!(
            longest_call(secs(30), "handler_timeout", std::iter::empty()),
            (secs(30), knob())
        );
        assert_eq!(
            longest_call(
                secs(30),
                "handler_timeout",
                [("a", Some(secs(60))), ("b", None)].into_iter()
            ),
            (secs(60), "the timeout of \"a\"".to_owned())
        );
        // Every handler sets a shorter one of its own: the default is nobody's.
        assert_eq!(
            longest_call(
                secs(30),
                "handler_timeout",
                [("a", Some(secs(1))), ("b", Some(secs(2)))].into_iter()
            ),
            (secs(2), "the timeout of \"b\"".to_owned())
        );
        assert_eq!(
            longest_call(
                secs(30),
                "handler_timeout",
                [("a", Some(secs(1))), ("b", None)].into_iter()
            ),
            (secs(30), knob())
        );
    }

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
        assert_eq!((library.prefetch, library.lease), (16, None));
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
