//! Unit-testing handlers through the real adapter path: decode, call, map the result, catch
//! panics and timeouts, exactly as the runtime does, without a runtime or a store.
//!
//! ```
//! use hexeract::testing::Harness;
//! use hexeract::{handler, Context, HandlerOutcome, Message};
//!
//! #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
//! #[message(type = "StockReserved")]
//! struct StockReserved { sku: String, quantity: i32 }
//!
//! #[handler(message = "StockReserved", name = "doc.check_quantity")]
//! async fn check_quantity(event: StockReserved, _ctx: &Context) -> HandlerOutcome {
//!     if event.quantity > 0 { HandlerOutcome::Ack } else { HandlerOutcome::reject("quantity must be positive") }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let harness = Harness::new()?;
//! let deliveries = harness.deliver(&StockReserved { sku: "A-1".into(), quantity: 0 }).await?;
//! assert!(matches!(
//!     deliveries.outcome("doc.check_quantity"),
//!     Some(HandlerOutcome::DeadLetter { reason, .. }) if reason == "handler_rejected"
//! ));
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use chrono::{DateTime, Utc};

use crate::context::Context;
use crate::delivery::{call_handler, call_job, Call};
use crate::envelope::{EncodeError, Envelope};
use crate::message::Message;
use crate::middleware::Middlewares;
use crate::outcome::HandlerOutcome;
use crate::publish::{Publish, PublishError};
use crate::reason::Reason;
use crate::registry::{RegisteredHandler, Registry, RegistryError};
use crate::schedule::ScheduledJob;
use crate::state::States;

mod faults;
#[cfg(feature = "postgres")]
mod postgres;

pub use faults::{Ending, Fault, FaultCheck, FaultReport, FaultRun};
#[cfg(feature = "postgres")]
pub use postgres::TestDatabase;

/// Delivers messages to registered handlers in-process and reports each handler's outcome.
/// What handlers publish through their context is captured, not delivered.
#[derive(Debug, Clone)]
#[must_use = "a harness does nothing until a message is delivered with `.deliver(&message)`"]
pub struct Harness {
    /// The handlers as given, before state and middleware.
    base: Registry,
    /// The handlers as called: with the state and middleware given so far.
    registry: Registry,
    states: States,
    middleware: Middlewares,
    published: Arc<Recorder>,
    /// Jobs registered in code ([`job`](Harness::job)), looked up before the program's
    /// `#[scheduled]` jobs.
    jobs: Vec<ScheduledJob>,
    attempt: u32,
    timeout: Duration,
    max_deliveries: u32,
}

impl Harness {
    /// A harness over every `#[handler]` in the test binary.
    pub fn new() -> Result<Harness, RegistryError> {
        Ok(Harness::with_registry(Registry::from_inventory()?))
    }

    /// A harness over the given handlers.
    pub fn with_registry(registry: Registry) -> Harness {
        Harness {
            base: registry.clone(),
            registry,
            states: States::new(),
            middleware: Middlewares::default(),
            published: Arc::new(Recorder::default()),
            jobs: Vec::new(),
            attempt: 1,
            timeout: Duration::from_secs(30),
            max_deliveries: crate::policy::Policy::library()
                .retry
                .max_deliveries_value(),
        }
        .rebuild()
    }

    /// Gives the handlers a value they take as [`State<T>`](crate::State), as a worker's
    /// `.state(value)` does. A handler whose state the harness was not given dead-letters with
    /// `state_missing`, saying so. Unlike a worker's, a second value of a type replaces the
    /// first, so that a test can override what a shared setup gave.
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Harness {
        self.states.insert(value);
        self.rebuild()
    }

    /// Runs `middleware` around every call, as a worker's `.middleware(m)` does.
    pub fn middleware(mut self, middleware: impl crate::middleware::Middleware) -> Harness {
        self.middleware.add(middleware);
        self.rebuild()
    }

    fn rebuild(mut self) -> Harness {
        self.registry = self
            .base
            .provide_what_can_be(&self.states, &self.middleware)
            .0;
        self
    }

    /// Delivers as call number `attempt` (default 1), for handlers that behave differently on
    /// redelivery.
    pub fn attempt(mut self, attempt: u32) -> Harness {
        self.attempt = attempt.max(1);
        self
    }

    /// Timeout applied to handlers without their own (default 30 s, as in the runtime).
    pub fn timeout(mut self, timeout: Duration) -> Harness {
        self.timeout = timeout;
        self
    }

    /// Calls per delivery in a [fault check](Harness::fault_check) (default 5, as
    /// `MAX_DELIVERIES`): a call that asks for a retry is called again at once, up to this
    /// many calls, then the delivery counts as dead-lettered (`max_deliveries_exceeded`).
    pub fn max_deliveries(mut self, max_deliveries: u32) -> Harness {
        self.max_deliveries = max_deliveries.max(1);
        self
    }

    /// Adds a job registered in code, for [`run_job`](Harness::run_job). The program's
    /// `#[scheduled]` jobs are there without it.
    pub fn job(mut self, job: ScheduledJob) -> Harness {
        self.jobs.retain(|other| other.name() != job.name());
        self.jobs.push(job);
        self
    }

    /// Runs the scheduled job named `name` once, as its scheduler runs a fire time due now:
    /// with the harness's state and middleware, under the job's timeout (or the harness's),
    /// with a panic caught. The job's context reads the fire time in
    /// [`scheduled_for`](Context::scheduled_for) and the harness's
    /// [`attempt`](Harness::attempt); what it publishes is captured.
    ///
    /// ```
    /// use hexeract::testing::Harness;
    /// use hexeract::{scheduled, Context, HandlerOutcome, State};
    ///
    /// #[derive(Clone)]
    /// struct Limit(u32);
    ///
    /// #[scheduled(every = "1h", name = "doc.hourly_check")]
    /// async fn hourly_check(ctx: &Context, State(limit): State<Limit>) -> HandlerOutcome {
    ///     assert!(ctx.scheduled_for().is_some());
    ///     if limit.0 > 0 { HandlerOutcome::Ack } else { HandlerOutcome::reject("no limit") }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let harness = Harness::new()?.state(Limit(3));
    /// assert_eq!(harness.run_job("doc.hourly_check").await?, HandlerOutcome::Ack);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn run_job(&self, name: &str) -> Result<HandlerOutcome, JobError> {
        self.run_job_at(name, Utc::now()).await
    }

    /// [`run_job`](Harness::run_job) for the fire time `fire_at`.
    pub async fn run_job_at(
        &self,
        name: &str,
        fire_at: DateTime<Utc>,
    ) -> Result<HandlerOutcome, JobError> {
        let job = self.find_job(name)?;
        let mut missing = Vec::new();
        let Some(job) = job.provide(&self.states, &mut missing) else {
            let types: Vec<&str> = missing.iter().map(|m| m.type_name).collect();
            return Ok(HandlerOutcome::dead_letter(
                Reason::STATE_MISSING,
                format_args!(
                    "the job takes {}, which the harness was not given: add `.state(value)` \
                     to the harness",
                    types.join(" and ")
                ),
            ));
        };
        let envelope =
            crate::schedule::job_envelope(Uuid::now_v7(), job.name(), fire_at, self.attempt);
        let ctx = self.context(envelope, job.name()).for_scheduled_run();
        let timeout = job.own_timeout().unwrap_or(self.timeout);
        let chain = self.middleware.chain_for(job.name());
        Ok(finished(call_job(job.runner(), chain, ctx, timeout).await))
    }

    fn find_job(&self, name: &str) -> Result<ScheduledJob, JobError> {
        if let Some(job) = self.jobs.iter().find(|job| job.name() == name) {
            return Ok(job.clone());
        }
        let program = crate::schedule::jobs_from_inventory()
            .map_err(|error| JobError::Invalid(error.to_string()))?;
        if let Some(job) = program.iter().find(|job| job.name() == name) {
            return Ok(job.clone());
        }
        let mut known: Vec<String> = self
            .jobs
            .iter()
            .chain(&program)
            .map(|job| job.name().to_owned())
            .collect();
        known.sort();
        Err(JobError::Unknown {
            name: name.to_owned(),
            known,
        })
    }

    /// Checks that the handlers of `message`'s type are idempotent under the faults of
    /// at-least-once delivery: see [`FaultCheck`].
    pub fn fault_check<M: Message>(&self, message: &M) -> Result<FaultCheck<'_>, EncodeError> {
        Ok(FaultCheck::new(self, Envelope::new(message)?))
    }

    /// [`fault_check`](Harness::fault_check) of an envelope as it is (with headers a
    /// middleware reads, for instance).
    pub fn fault_check_envelope(&self, envelope: Envelope) -> FaultCheck<'_> {
        FaultCheck::new(self, envelope)
    }

    /// Encodes `message` and delivers it to every handler of its type.
    pub async fn deliver<M: Message>(&self, message: &M) -> Result<Deliveries, EncodeError> {
        Ok(self.deliver_envelope(Envelope::new(message)?).await)
    }

    /// Delivers an envelope as it is (for example a payload that does not decode) to every
    /// handler of its type. An empty result means no handler knows the type.
    pub async fn deliver_envelope(&self, mut envelope: Envelope) -> Deliveries {
        envelope.attempt = self.attempt;
        let mut deliveries = Vec::new();
        for registered in self.registry.handlers_for(&envelope.message_type) {
            deliveries.push(Delivered {
                handler: registered.info().name.to_string(),
                outcome: self.call(registered, envelope.clone()).await,
            });
        }
        Deliveries(deliveries)
    }

    /// One call of `registered` with `envelope`, under its timeout (or the harness's).
    async fn call(
        &self,
        registered: &Arc<RegisteredHandler>,
        envelope: Envelope,
    ) -> HandlerOutcome {
        let info = registered.info();
        let ctx = self.context(envelope, &info.name);
        let timeout = info.timeout.unwrap_or(self.timeout);
        finished(call_handler(registered.clone(), ctx, timeout).await)
    }

    /// A context like the one the runtime would give a handler for `message`, for calling a
    /// handler function directly. Its publishes are captured by this harness.
    pub fn context_for<M: Message>(&self, message: &M) -> Result<Context, EncodeError> {
        let mut envelope = Envelope::new(message)?;
        envelope.attempt = self.attempt;
        Ok(self.context(envelope, "test"))
    }

    /// Everything handlers published through their context, in order.
    pub fn published(&self) -> Vec<Envelope> {
        self.published.envelopes.lock().expect("poisoned").clone()
    }

    /// Forgets what handlers published so far.
    pub fn clear_published(&self) {
        self.published.envelopes.lock().expect("poisoned").clear();
    }

    fn context(&self, envelope: Envelope, handler: &str) -> Context {
        Context::new(
            envelope,
            handler,
            CancellationToken::new(),
            self.published.clone(),
        )
    }
}

/// Each handler's outcome for one delivered message, in handler-name order.
#[derive(Debug, Clone, PartialEq)]
pub struct Deliveries(Vec<Delivered>);

/// One handler's outcome.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Delivered {
    /// The handler's name.
    pub handler: String,
    /// What the call came to (a panic or timeout is a `Retry` with its reason).
    pub outcome: HandlerOutcome,
}

impl Deliveries {
    /// The outcome of the handler with this name, if it was called.
    pub fn outcome(&self, handler: &str) -> Option<&HandlerOutcome> {
        self.0
            .iter()
            .find(|delivered| delivered.handler == handler)
            .map(|delivered| &delivered.outcome)
    }

    /// Every handler's outcome.
    pub fn iter(&self) -> impl Iterator<Item = &Delivered> {
        self.0.iter()
    }

    /// Number of handlers called.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `true` when no handler knows the message type.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The outcome of a call the harness made: nothing interrupts those.
fn finished(call: Call) -> HandlerOutcome {
    match call {
        Call::Finished(outcome) => outcome,
        Call::Interrupted | Call::NotStarted => {
            unreachable!("the harness never interrupts a call")
        }
    }
}

/// Why [`Harness::run_job`] ran nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// No job has this name.
    #[error("no scheduled job is named {name:?}; the jobs are: {}", if known.is_empty() { "none".to_owned() } else { known.join(", ") })]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names of the jobs there are.
        known: Vec<String>,
    },
    /// The program's `#[scheduled]` jobs do not build (a name taken twice, a bad schedule).
    #[error("the program's scheduled jobs are invalid: {0}")]
    Invalid(String),
}

#[derive(Debug, Default)]
struct Recorder {
    envelopes: Mutex<Vec<Envelope>>,
}

impl Publish for Recorder {
    fn publish_envelope(&self, envelope: Envelope) -> BoxFuture<'_, Result<Uuid, PublishError>> {
        let id = envelope.id;
        self.envelopes.lock().expect("poisoned").push(envelope);
        Box::pin(async move { Ok(id) })
    }
}
