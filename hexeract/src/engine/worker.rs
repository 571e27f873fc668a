//! [`WorkerBuilder`]: the one builder of every world's worker. What every world shares is
//! written here once: the handlers and their state and middleware, and the knobs of a
//! [`Policy`]. What is a world's own (its store or connection, its queue, its prefetch) lives
//! in its [`Source`], with the setters of that world.
//!
//! ```
//! use std::time::Duration;
//! use hexeract::outbox::OutboxWorker;
//! use hexeract::store::sqlite::SqliteStore;
//! use hexeract::Policy;
//!
//! # async fn example(store: SqliteStore) -> Result<(), hexeract::Error> {
//! // The knobs every world shares, set once and given to any builder.
//! let mut policy = Policy::library();
//! policy.handler_timeout = Duration::from_secs(10);
//! policy.shutdown_grace = Duration::from_secs(20);
//!
//! let worker = OutboxWorker::builder(store)
//!     .policy(policy)
//!     .from_registry()
//!     .poll_interval(Duration::from_millis(50)) // the outbox's own
//!     .build()?;
//! # let _ = worker;
//! # Ok(())
//! # }
//! ```

pub(crate) mod feed;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::delivery::Slot;
use crate::handler::Handler;
use crate::health::Probe;
use crate::knobs::ConfigError;
use crate::message::Message;
use crate::metrics::Metrics;
use crate::middleware::Middleware;
use crate::policy::Policy;
use crate::registry::{HandlerOptions, HandlerSet, RegisteredHandler, Registry, RegistryError};
use crate::retry::RetryPolicy;

/// Why a worker did not build: its settings (every problem at once), its handlers, or what
/// its world cannot run as given. `?` turns it into the program's [`Error`](crate::Error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A setting is out of range; every such setting is listed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The handlers (or jobs) cannot run together: two of one name, a state none was given, a
    /// middleware for a handler the worker does not have.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// What the world cannot run as given: two scheduled jobs of one name, a period of zero.
    #[error("{0}")]
    Unsupported(String),
    /// What a world's own error says it cannot run (a Kafka handler whose message declares no
    /// aggregate: a `KafkaError`, which `?` gives back as `Error::Kafka`).
    #[error(transparent)]
    World(Box<dyn std::error::Error + Send + Sync>),
}

/// A world's own half of a worker: where its deliveries come from (a store's claims, a
/// broker's queues, a topic's partitions, a channel in memory, a schedule's fire times) and
/// what that takes (a store, a connection, its own knobs). [`WorkerBuilder::build`] hands it
/// the handlers and the [`Policy`] and gets the world's worker back.
///
/// The worlds of this crate implement it; it is sealed.
pub trait Source: Sized + sealed::Sealed {
    /// The worker [`WorkerBuilder::build`] makes.
    type Worker;

    /// Builds the worker from what the builder was given.
    #[doc(hidden)]
    fn build(builder: WorkerBuilder<Self>) -> Result<Self::Worker, BuildError>;

    /// The builder as `{:?}` shows it: by default its source's name and its policy.
    #[doc(hidden)]
    fn fmt_builder(builder: &WorkerBuilder<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("source", &std::any::type_name::<Self>())
            .field("policy", &builder.policy)
            .finish_non_exhaustive()
    }
}

/// The worlds whose deliveries are messages for handlers (every world but the scheduler, whose
/// deliveries are job runs): they take handlers, a handler timeout and a payload cap.
pub trait MessageSource: Source {}

/// The worlds that claim their deliveries from a store under a lease, in a poll loop (the
/// outbox worker and the scheduler): they take a poll interval, a batch size, a lease and a
/// deadline for their own statements.
pub trait ClaimSource: Source {}

pub(crate) mod sealed {
    /// Keeps [`Source`](super::Source) to this crate's worlds.
    pub trait Sealed {}
}

/// Builds the worker of one world: `S` is the world's [`Source`] (such as
/// [`OutboxSource`](crate::outbox::OutboxSource)), the builder holds what every world shares:
/// the handlers, the values they take as [`State`](crate::State), the middleware around them,
/// and the knobs of a [`Policy`]. The names the worlds have always had are this type with
/// their source: [`OutboxWorkerBuilder`](crate::outbox::OutboxWorkerBuilder),
/// [`SchedulerBuilder`](crate::schedule::SchedulerBuilder), `RabbitMqWorkerBuilder`,
/// `KafkaWorkerBuilder` and [`MemoryWorkerBuilder`](crate::MemoryWorkerBuilder).
///
/// Every setter takes the builder and gives it back; the call made last wins where two set
/// the same knob ([`policy`](WorkerBuilder::policy) sets them all).
#[must_use = "a builder does nothing until `.build()`"]
pub struct WorkerBuilder<S> {
    /// The handlers (none, on the scheduler: its jobs are its source's), their state and
    /// middleware.
    pub(crate) handlers: HandlerSet,
    pub(crate) policy: Policy,
    pub(crate) source: S,
}

impl<S: Source> WorkerBuilder<S> {
    /// A builder of `source`'s worker with no handlers yet, starting from `policy`.
    pub(crate) fn from_source(source: S, policy: Policy) -> WorkerBuilder<S> {
        WorkerBuilder {
            handlers: HandlerSet::none(),
            policy,
            source,
        }
    }

    /// The handlers, the policy and the source, for the source's `build`.
    pub(crate) fn into_parts(self) -> (HandlerSet, Policy, S) {
        (self.handlers, self.policy, self.source)
    }

    /// Every knob the worlds share at once, replacing what earlier setters set (later ones
    /// change it again). A world reads the knobs that apply to it and leaves the rest; each
    /// field of [`Policy`] says which world reads it.
    pub fn policy(mut self, policy: Policy) -> WorkerBuilder<S> {
        self.policy = policy;
        self
    }

    /// Handler calls per delivery in total, the first included (default 5; at least 1). Then
    /// the delivery is dead-lettered.
    pub fn max_deliveries(mut self, max_deliveries: u32) -> WorkerBuilder<S> {
        self.policy.max_deliveries(max_deliveries);
        self
    }

    /// First and longest delay between calls (default 1 s and 300 s, doubling, jittered).
    pub fn retry_delays(mut self, initial: Duration, max: Duration) -> WorkerBuilder<S> {
        self.policy.retry = self.policy.retry.initial_delay(initial).max_delay(max);
        self
    }

    /// The whole retry policy, its `max_deliveries` included: the same knobs as
    /// [`max_deliveries`](WorkerBuilder::max_deliveries) and
    /// [`retry_delays`](WorkerBuilder::retry_delays), so the call made last wins.
    pub fn retry_policy(mut self, retry: RetryPolicy) -> WorkerBuilder<S> {
        self.policy.retry = retry;
        self
    }

    /// How long a cancelled worker lets running calls finish (default 8 s). Calls still
    /// running then are interrupted, and their deliveries handed back (put back in memory,
    /// left to their lease, returned to the queue, not committed) to be made again.
    pub fn shutdown_grace(mut self, grace: Duration) -> WorkerBuilder<S> {
        self.policy.shutdown_grace = grace;
        self
    }

    /// Gives the handlers (or jobs) a value they take as [`State<T>`](crate::State), one per
    /// type: a second value of a type stops [`build`](WorkerBuilder::build)
    /// ([`RegistryError::StateGivenTwice`]).
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> WorkerBuilder<S> {
        self.handlers.give_state(value);
        self
    }

    /// Runs `middleware` around every handler call (or job run), inside the middleware added
    /// before (see [`middleware`](crate::middleware)).
    pub fn middleware(mut self, middleware: impl Middleware) -> WorkerBuilder<S> {
        self.handlers.middleware.add(middleware);
        self
    }

    /// Runs `middleware` around the calls of the handler (or job) named `handler` alone,
    /// inside the worker's middleware. A name that is not one of the worker's stops
    /// [`build`](WorkerBuilder::build).
    pub fn middleware_for(
        mut self,
        handler: impl Into<Cow<'static, str>>,
        middleware: impl Middleware,
    ) -> WorkerBuilder<S> {
        self.handlers.middleware.add_for(handler, middleware);
        self
    }

    /// Checks the knobs (every problem at once) and the handlers, and makes the worker.
    pub fn build(self) -> Result<S::Worker, BuildError> {
        S::build(self)
    }
}

impl<S: MessageSource> WorkerBuilder<S> {
    /// Every `#[handler]` in the program (plus those registered with
    /// [`register_handler`](WorkerBuilder::register_handler)).
    pub fn from_registry(mut self) -> WorkerBuilder<S> {
        self.handlers.use_program();
        self
    }

    /// These handlers instead (plus those registered with `register_handler`).
    pub fn registry(mut self, registry: Registry) -> WorkerBuilder<S> {
        self.handlers.use_registry(registry);
        self
    }

    /// Adds a handler written as a type; its name is the type's path.
    pub fn register_handler<M: Message, H: Handler<M>>(self, handler: H) -> WorkerBuilder<S> {
        self.register_handler_with::<M, H>(handler, HandlerOptions::new())
    }

    /// Adds a handler written as a type, with its name, timeout or concurrency.
    pub fn register_handler_with<M: Message, H: Handler<M>>(
        mut self,
        handler: H,
        options: HandlerOptions,
    ) -> WorkerBuilder<S> {
        self.handlers.add::<M, H>(handler, options);
        self
    }

    /// Timeout of a handler call unless the handler sets its own (default 30 s): a slower
    /// call is a failed attempt (`handler_timeout`).
    pub fn handler_timeout(mut self, timeout: Duration) -> WorkerBuilder<S> {
        self.policy.handler_timeout = timeout;
        self
    }

    /// Calls of one handler at once unless the handler sets its own (default: bounded by the
    /// world alone, its claim batch, prefetch or partitions; 16 in memory).
    pub fn concurrency(mut self, limit: u32) -> WorkerBuilder<S> {
        self.policy.concurrency = Some(limit);
        self
    }

    /// Largest payload handed to a handler (default 1 MiB), checked before it is decoded; a
    /// larger one is dead-lettered as `payload_too_large`.
    pub fn max_payload_bytes(mut self, max: usize) -> WorkerBuilder<S> {
        self.policy.max_payload_bytes = max;
        self
    }
}

impl<S: ClaimSource> WorkerBuilder<S> {
    /// How long to sleep after a poll that found nothing, or failed (default 100 ms). A
    /// publish in this process wakes the outbox worker sooner.
    pub fn poll_interval(mut self, interval: Duration) -> WorkerBuilder<S> {
        self.policy.poll_interval = interval;
        self
    }

    /// How many deliveries (or occurrences) are called at once, at most (default 10). The
    /// outbox worker claims a batch and claims the next once the whole batch is settled; the
    /// scheduler claims the room left as each run ends, and moves up to this many delayed
    /// messages per pass.
    pub fn batch_size(mut self, batch_size: u32) -> WorkerBuilder<S> {
        self.policy.batch_size = batch_size;
        self
    }

    /// How long one statement of the worker's own (take, plan, claim, ack, settle) may take
    /// before the cycle gives up on it (default 30 s): the cycle fails, `/health/ready` says
    /// so, and the next one starts on another connection. PostgreSQL has no heartbeat: without
    /// this, a connection whose network path went silent mid-statement would hold the worker
    /// until the kernel gives up on the socket (many minutes, or never without keepalives).
    /// The connection given up on stays out of the pool until its socket fails.
    ///
    /// ```
    /// # fn example(store: hexeract::store::postgres::PgStore) {
    /// use std::time::Duration;
    /// use hexeract::outbox::OutboxWorker;
    ///
    /// let builder = OutboxWorker::builder(store).store_timeout(Duration::from_secs(5));
    /// # let _ = builder;
    /// # }
    /// ```
    pub fn store_timeout(mut self, timeout: Duration) -> WorkerBuilder<S> {
        self.policy.store_timeout = timeout;
        self
    }

    /// How long a claim lasts: a worker that dies holding deliveries (or occurrences) releases
    /// them when it ends. By default the longest handler (or job) timeout and 5 s for the
    /// settle after it (35 s with the defaults; the store timeout when it is shorter than
    /// 5 s); [`build`](WorkerBuilder::build) refuses a shorter one, which would let another
    /// worker take a delivery while its call still runs.
    pub fn lease(mut self, lease: Duration) -> WorkerBuilder<S> {
        self.policy.lease = Some(lease);
        self
    }
}

/// A handler as every world calls it: the policy's timeout and concurrency unless the handler
/// sets its own, counted in `metrics`, and watched by `probe` when the world has one (readiness
/// says so while the handler is at its cap of calls given up on).
pub(crate) fn handler_slot(
    policy: &Policy,
    handler: &Arc<RegisteredHandler>,
    metrics: &Metrics,
    probe: Option<&Probe>,
) -> Slot {
    let slot = Slot::handler(
        handler,
        policy.handler_timeout,
        policy.concurrency_limit(),
        metrics,
    );
    if let Some(probe) = probe {
        slot.watch(probe);
    }
    slot
}

/// The lease of a loop that claims from a store, checked against its longest call (`longest`,
/// with who needs it) under the variable `knob`, and `probe` told how long a pass of the loop
/// may take before it reads stuck.
pub(crate) fn claim_lease(
    policy: &Policy,
    knob: &str,
    longest: (Duration, String),
    probe: &Probe,
) -> Result<Duration, BuildError> {
    probe.expect_progress_within(crate::health::stuck_after(
        longest.0,
        policy.store_timeout,
        policy.poll_interval,
    ));
    Ok(policy.checked_lease(knob, longest)?)
}

impl<S: Source> fmt::Debug for WorkerBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        S::fmt_builder(self, f)
    }
}
