//! Readiness of the loops a process runs: each loop (the outbox worker, the relay, the bus
//! worker) reports through a [`Probe`] whether its last pass worked, and may register live
//! conditions (a broker that blocked the connection); [`Health::readiness`] sums them up.
//!
//! A component is *ready* once it finished a pass that did not fail, and stays ready until a
//! pass fails; it is ready again after the next pass that works. A live condition that holds
//! (say `connection.blocked`) makes its component not ready for as long as it holds. The
//! process is ready when every component is.
//!
//! ```
//! use hexeract::health::{Health, Status};
//!
//! let health = Health::new();
//! let relay = health.probe("outbox relay");
//! let consumer = health.probe("bus worker");
//! assert!(!health.readiness().ready, "nothing has passed yet");
//!
//! relay.pass();
//! consumer.pass();
//! assert!(health.readiness().ready);
//!
//! relay.fail("the broker connection is gone");
//! let readiness = health.readiness();
//! assert!(!readiness.ready);
//! assert!(matches!(&readiness.components[0].status, Status::Failing { reason, .. } if reason.contains("gone")));
//!
//! relay.pass();
//! assert!(health.readiness().ready);
//! ```
//!
//! The reasons are the loops' own error texts, as anyone who reaches the health port may read
//! them: a URL in them is shown as the kind of server it names (`rabbitmq`, `postgresql`), an
//! address as `(address)`; no credentials, user, host, vhost or database.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

// The process layer's: in its folder, under this module's path.
#[path = "../process/health_server.rs"]
pub(crate) mod server;
pub use server::{router, serve};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A live condition: `Some(reason)` while it keeps its component from being ready.
type Condition = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// The readiness of every component of a process. Cheap to clone: clones share the state.
#[derive(Clone, Default)]
pub struct Health {
    components: Arc<Mutex<Vec<Component>>>,
}

struct Component {
    name: String,
    state: State,
    conditions: BTreeMap<Cow<'static, str>, Condition>,
    /// When the component last made progress, shared with its probes.
    progress: Arc<Progress>,
}

/// When a component last made progress (a pass, passed or failed, or a call ended), and how
/// long it may go without: past that, it reads not ready.
#[derive(Default)]
struct Progress {
    /// Milliseconds from [`epoch`] to the last progress.
    last: AtomicU64,
    /// The bound in milliseconds; 0: not watched.
    within: AtomicU64,
}

impl Progress {
    fn made(&self) {
        self.last.store(since_epoch(), Ordering::Relaxed);
    }

    /// Why the component is stuck, if it went without progress for longer than its bound.
    fn stuck(&self) -> Option<String> {
        let within = self.within.load(Ordering::Relaxed);
        if within == 0 {
            return None;
        }
        let quiet = since_epoch().saturating_sub(self.last.load(Ordering::Relaxed));
        (quiet > within).then(|| {
            format!(
                "no pass completed and no call ended for {:?} (one is expected within {:?}): \
                 the loop may be stuck",
                Duration::from_millis(quiet),
                Duration::from_millis(within)
            )
        })
    }
}

/// How long one of Hexeract's loops may go without progress before it reads stuck: its longest
/// step (a handler timeout, a publish timeout), plus two store timeouts (its claim and its
/// settle), plus three polls.
pub(crate) fn stuck_after(
    longest_step: Duration,
    store_timeout: Duration,
    poll: Duration,
) -> Duration {
    longest_step
        .saturating_add(store_timeout.saturating_mul(2))
        .saturating_add(poll.saturating_mul(3))
}

/// The instant progress is measured from: the first use in this process.
fn since_epoch() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[derive(Clone)]
enum State {
    Starting,
    Passing,
    Failing {
        reason: String,
        since: Instant,
        failures: u64,
    },
}

impl Health {
    /// No components yet: ready (nothing to wait for) until a probe is added.
    pub fn new() -> Health {
        Health::default()
    }

    /// Adds a component named `name`, not ready until its first [`Probe::pass`]. A second
    /// probe with the same name reports on the same component.
    pub fn probe(&self, name: impl Into<String>) -> Probe {
        let name = name.into();
        let mut components = self.lock();
        let index = match components
            .iter()
            .position(|component| component.name == name)
        {
            Some(index) => index,
            None => {
                components.push(Component {
                    name,
                    state: State::Starting,
                    conditions: BTreeMap::new(),
                    progress: Arc::default(),
                });
                components.len() - 1
            }
        };
        Probe {
            health: self.clone(),
            index,
            progress: components[index].progress.clone(),
        }
    }

    /// Every component's status now (live conditions evaluated), in the order they were
    /// added, and whether all are ready.
    pub fn readiness(&self) -> Readiness {
        // Conditions run outside the lock: they may take locks of their own.
        let snapshot: Vec<(String, State, Vec<Condition>, Arc<Progress>)> = self
            .lock()
            .iter()
            .map(|component| {
                (
                    component.name.clone(),
                    component.state.clone(),
                    component.conditions.values().cloned().collect(),
                    component.progress.clone(),
                )
            })
            .collect();
        let components: Vec<ComponentStatus> = snapshot
            .into_iter()
            .map(|(name, state, conditions, progress)| {
                let held = conditions
                    .iter()
                    .find_map(|condition| condition())
                    .or_else(|| match state {
                        // One that never finished its first pass is not ready anyway.
                        State::Starting => None,
                        _ => progress.stuck(),
                    });
                let status = match (state, held) {
                    (
                        State::Failing {
                            reason,
                            since,
                            failures,
                        },
                        _,
                    ) => Status::Failing {
                        reason,
                        failing_for: since.elapsed(),
                        failures,
                    },
                    (_, Some(reason)) => Status::Held {
                        reason: scrub(&reason),
                    },
                    (State::Starting, None) => Status::Starting,
                    (State::Passing, None) => Status::Ready,
                };
                ComponentStatus { name, status }
            })
            .collect();
        Readiness {
            ready: components
                .iter()
                .all(|component| component.status == Status::Ready),
            components,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Component>> {
        // A panic elsewhere while holding the lock leaves plain data behind: keep serving it.
        self.components
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn update(&self, index: usize, apply: impl FnOnce(&mut Component)) {
        apply(&mut self.lock()[index]);
    }
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Health").field(&self.readiness()).finish()
    }
}

/// How one component reports: cheap to clone, shared by the loop and its supervisor.
#[derive(Clone)]
pub struct Probe {
    health: Health,
    index: usize,
    progress: Arc<Progress>,
}

impl Probe {
    /// A probe on a [`Health`] of its own, for a loop whose readiness nobody reads.
    pub fn detached(name: impl Into<String>) -> Probe {
        Health::new().probe(name)
    }

    /// The component's name.
    pub fn name(&self) -> String {
        self.health.lock()[self.index].name.clone()
    }

    /// A pass finished without failing: the component is ready (unless a condition holds).
    pub fn pass(&self) {
        self.progress.made();
        self.health.update(self.index, |component| {
            if let State::Failing { failures, .. } = &component.state {
                tracing::info!(
                    component = %component.name,
                    failures,
                    "ready again"
                );
            }
            component.state = State::Passing;
        });
    }

    /// A pass failed (or the loop is down and restarting): not ready until the next
    /// [`pass`](Probe::pass). `reason` is shown on `/health/ready`, to anyone who reaches the
    /// port: only its first line is kept, at most 300 characters, with every URL in it
    /// replaced by the kind of server it names (`rabbitmq`, `postgresql`) and every network
    /// address by `(address)`, so an error that quotes a connection string or a backtrace
    /// shows no credentials, user, host, vhost or database. The log line of the failure keeps
    /// the URL, its password shown as `***`.
    pub fn fail(&self, reason: impl fmt::Display) {
        let reason = reason.to_string();
        let logged = crate::redact::redact_text(first_line(&reason));
        let reason = scrub(&reason);
        self.progress.made();
        self.health.update(self.index, |component| {
            component.state = match &component.state {
                State::Failing {
                    since, failures, ..
                } => State::Failing {
                    reason,
                    since: *since,
                    failures: failures + 1,
                },
                _ => {
                    tracing::warn!(component = %component.name, reason = %logged, "not ready");
                    State::Failing {
                        reason,
                        since: Instant::now(),
                        failures: 1,
                    }
                }
            };
        });
    }

    /// Progress short of a pass: a call of the loop ended. Cheap (one atomic store), for the
    /// hot path.
    pub fn progress(&self) {
        self.progress.made();
    }

    /// Watches the loop for being stuck: once it finished its first pass, it reads not ready
    /// ([`Status::Held`], saying so) whenever `within` goes by with no pass completed (passed
    /// or failed) and no [`progress`](Probe::progress). Give it the longest a pass may
    /// rightly take, with room to spare: each of Hexeract's loops sets its own (its
    /// longest handler timeout or publish timeout, plus two store timeouts, plus three polls).
    ///
    /// ```
    /// use std::time::Duration;
    /// use hexeract::health::{Health, Status};
    ///
    /// let health = Health::new();
    /// let lane = health.probe("import lane");
    /// lane.expect_progress_within(Duration::from_millis(20));
    /// lane.pass();
    /// assert!(health.readiness().ready);
    /// std::thread::sleep(Duration::from_millis(50));
    /// assert!(matches!(
    ///     &health.readiness().components[0].status,
    ///     Status::Held { reason } if reason.contains("may be stuck")
    /// ));
    /// lane.pass();
    /// assert!(health.readiness().ready);
    /// ```
    pub fn expect_progress_within(&self, within: Duration) {
        self.progress.made();
        let millis = u64::try_from(within.as_millis()).unwrap_or(u64::MAX).max(1);
        self.progress.within.store(millis, Ordering::Relaxed);
    }

    /// Adds (or, under the same `key`, replaces) a live condition: while it returns
    /// `Some(reason)`, the component is not ready. Evaluated at each
    /// [`Health::readiness`], so it should be cheap.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    /// use hexeract::health::{Health, Status};
    ///
    /// let health = Health::new();
    /// let relay = health.probe("outbox relay");
    /// relay.pass();
    /// let blocked = Arc::new(AtomicBool::new(true));
    /// let flag = blocked.clone();
    /// relay.watch("connection.blocked", move || {
    ///     flag.load(Ordering::Relaxed).then(|| "the broker blocked publishing".to_owned())
    /// });
    /// assert!(matches!(health.readiness().components[0].status, Status::Held { .. }));
    /// blocked.store(false, Ordering::Relaxed);
    /// assert!(health.readiness().ready);
    /// ```
    pub fn watch(
        &self,
        key: impl Into<Cow<'static, str>>,
        condition: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) {
        let key = key.into();
        self.health.update(self.index, |component| {
            component.conditions.insert(key, Arc::new(condition));
        });
    }
}

/// A reason as anyone who reaches the health port may see it: the first line, at most
/// [`MAX_REASON`] characters, with URLs and addresses anonymized
/// ([`anonymize_text`](crate::redact::anonymize_text): the server's kind, no user, host or
/// vhost).
fn scrub(reason: &str) -> String {
    let mut out = crate::redact::anonymize_text(first_line(reason));
    if out.chars().count() > MAX_REASON {
        out = out.chars().take(MAX_REASON).collect::<String>() + "…";
    }
    out
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("").trim_end()
}

/// The longest reason `/health/ready` shows, in characters.
const MAX_REASON: usize = 300;

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probe")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

/// What [`Health::readiness`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// `true` when every component is [`Status::Ready`].
    pub ready: bool,
    /// Each component, in the order its probe was added.
    pub components: Vec<ComponentStatus>,
}

/// One component's name and status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComponentStatus {
    /// The name given to [`Health::probe`].
    pub name: String,
    /// Where it stands.
    pub status: Status,
}

/// Where a component stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// No pass has finished yet.
    Starting,
    /// The last pass worked and no condition holds.
    Ready,
    /// The last pass failed, or the loop is restarting.
    Failing {
        /// The last failure's text.
        reason: String,
        /// Since the first of the failures in a row.
        failing_for: Duration,
        /// Failures in a row.
        failures: u64,
    },
    /// A live condition holds (for example the broker blocked the connection).
    Held {
        /// What the condition said.
        reason: String,
    },
}

impl fmt::Display for Readiness {
    /// One line per component: `outbox relay: ready`, `bus worker: failing for 3s (2 in a row):
    /// …`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for component in &self.components {
            write!(f, "{}: ", component.name)?;
            match &component.status {
                Status::Starting => writeln!(f, "starting")?,
                Status::Ready => writeln!(f, "ready")?,
                Status::Failing {
                    reason,
                    failing_for,
                    failures,
                } => writeln!(
                    f,
                    "failing for {}s ({failures} in a row): {reason}",
                    failing_for.as_secs()
                )?,
                Status::Held { reason } => writeln!(f, "held: {reason}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(health: &Health) -> Status {
        health.readiness().components[0].status.clone()
    }

    #[test]
    fn a_loop_without_progress_for_longer_than_its_bound_reads_stuck() {
        let health = Health::new();
        let probe = health.probe("loop");
        probe.expect_progress_within(Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(60));
        // Not started yet: not ready as starting, not as stuck.
        assert_eq!(status(&health), Status::Starting);
        probe.pass();
        assert_eq!(status(&health), Status::Ready);
        std::thread::sleep(Duration::from_millis(60));
        match status(&health) {
            Status::Held { reason } => {
                assert!(
                    reason.starts_with("no pass completed and no call ended for"),
                    "{reason}"
                );
                assert!(reason.contains("(one is expected within 30ms)"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        // A call that ended is progress.
        probe.progress();
        assert_eq!(status(&health), Status::Ready);
        // A failing loop says why it fails, stuck or not.
        probe.fail("the store is down");
        std::thread::sleep(Duration::from_millis(60));
        assert!(
            matches!(status(&health), Status::Failing { reason, .. } if reason == "the store is down")
        );
    }

    #[test]
    fn a_loop_not_watched_is_never_stuck() {
        let health = Health::new();
        let probe = health.probe("loop");
        probe.pass();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(status(&health), Status::Ready);
    }

    #[test]
    fn the_bound_is_the_longest_step_two_store_timeouts_and_three_polls() {
        assert_eq!(
            stuck_after(
                Duration::from_secs(30),
                Duration::from_secs(30),
                Duration::from_millis(500)
            ),
            Duration::from_millis(91_500)
        );
    }

    #[test]
    fn reasons_lose_passwords_extra_lines_and_length() {
        assert_eq!(
            scrub("cannot reach amqp://app:s3cr:et@broker:5672/%2f: refused\n   at frame 1"),
            "cannot reach rabbitmq: refused"
        );
        assert_eq!(scrub("postgres://app@db/x down"), "postgresql down");
        assert_eq!(scrub("plain reason"), "plain reason");
        // A password in a query string is a password too.
        let queried = scrub("connect failed: postgres://db/app?user=u&password=hunter2: refused");
        assert!(!queried.contains("hunter2"), "{queried}");
        let long = scrub(&"x".repeat(1000));
        assert_eq!(long.chars().count(), MAX_REASON + 1);
        let health = Health::new();
        let probe = health.probe("relay");
        probe.fail("error: postgres://u:hunter2@db/app\nstack backtrace: …");
        let shown = health.readiness().to_string();
        assert!(
            !shown.contains("hunter2") && !shown.contains("backtrace"),
            "{shown}"
        );
    }

    /// `/health/ready` is served to whoever reaches the port (a probe comes from outside the
    /// pod): it names the server, never who connects to which host and vhost.
    #[test]
    fn readiness_names_servers_without_user_host_or_vhost() {
        let health = Health::new();
        let relay = health.probe("outbox relay");
        let worker = health.probe("bus worker");
        let kafka = health.probe("kafka relay");
        relay.fail(
            "cannot connect to amqp://shop-app:s3cret@rabbit-7.prod.internal:5672/orders-vhost: \
             Connection refused (os error 111)",
        );
        worker.fail(
            "pool timed out on postgres://ledger@db.prod.internal/ledger_main?sslmode=require",
        );
        kafka.fail("kafka-1.prod.internal:9092/bootstrap: Connect to ipv4#10.4.0.7:9092 failed");
        let shown = health.readiness().to_string();
        for hidden in [
            "shop-app",
            "s3cret",
            "rabbit-7",
            "orders-vhost",
            "5672",
            "ledger@",
            "db.prod",
            "ledger_main",
            "kafka-1",
            "10.4.0.7",
        ] {
            assert!(!shown.contains(hidden), "{hidden:?} shown: {shown}");
        }
        for kept in [
            "outbox relay: failing",
            "cannot connect to rabbitmq: Connection refused (os error 111)",
            "pool timed out on postgresql",
            "Connect to (address) failed",
        ] {
            assert!(shown.contains(kept), "{kept:?} not shown: {shown}");
        }
    }

    #[test]
    fn a_component_is_ready_after_a_pass_until_a_failure_and_again_after_the_next_pass() {
        let health = Health::new();
        assert!(
            health.readiness().ready,
            "no components: nothing to wait for"
        );
        let relay = health.probe("relay");
        let worker = health.probe("worker");
        assert_eq!(health.readiness().components[0].status, Status::Starting);
        relay.pass();
        assert!(!health.readiness().ready, "the worker has not passed yet");
        worker.pass();
        assert!(health.readiness().ready);

        worker.fail("connection lost");
        worker.fail("connection refused");
        let readiness = health.readiness();
        assert!(!readiness.ready);
        match &readiness.components[1].status {
            Status::Failing {
                reason, failures, ..
            } => {
                assert_eq!(reason, "connection refused", "the last reason");
                assert_eq!(*failures, 2);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(readiness.components[0].status, Status::Ready);
        assert!(readiness
            .to_string()
            .contains("worker: failing for 0s (2 in a row): connection refused"));
        worker.pass();
        assert!(health.readiness().ready);
    }

    #[test]
    fn a_condition_holds_a_component_back_while_it_holds_and_a_key_replaces_it() {
        let health = Health::new();
        let relay = health.probe("relay");
        relay.pass();
        relay.watch("blocked", || Some("memory alarm".to_owned()));
        assert_eq!(
            health.readiness().components[0].status,
            Status::Held {
                reason: "memory alarm".to_owned()
            }
        );
        // A rebuilt loop registers its condition again under the same key: replaced, not
        // added.
        relay.watch("blocked", || None);
        assert!(health.readiness().ready);
        // A failure outranks a condition.
        relay.watch("other", || Some("held".to_owned()));
        relay.fail("down");
        assert!(matches!(
            health.readiness().components[0].status,
            Status::Failing { .. }
        ));
    }

    #[test]
    fn probes_with_one_name_share_a_component() {
        let health = Health::new();
        let first = health.probe("relay");
        let second = health.probe("relay");
        first.fail("down");
        second.pass();
        assert_eq!(health.readiness().components.len(), 1);
        assert!(health.readiness().ready);
        assert_eq!(first.name(), "relay");
    }
}
