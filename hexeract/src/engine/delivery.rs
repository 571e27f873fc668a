//! The delivery engine: what happens between "a delivery arrived" and "its verdict is carried
//! out", written once for every world (the in-memory worker, the outbox on SQLite and
//! PostgreSQL, RabbitMQ, Kafka, and the scheduler's job runs).
//!
//! ```text
//!   world: a delivery arrives ──▶ precheck ──▶ invoke ──▶ verdict ──▶ record ──▶ world: settle
//!          (claim, consume,       budget,      permit,     pure:        one log      row update,
//!           poll, channel)        payload      context,    ack/retry/   line and     republish or
//!                                 size         span,       dead letter/ metrics      park, wait in
//!                                              timeout,    abandoned/                partition,
//!                                              panic       release                   occurrence
//! ```
//!
//! A world says only how deliveries arrive and how a [`Verdict`] is carried out
//! ([`World::settle`]); everything else (state, middleware, spans, metrics to come) is changed
//! here, once.

mod invoke;
mod record;
pub(crate) mod verdict;

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::envelope::Envelope;
use crate::metrics::{HandlerMetrics, Metrics};
use crate::outcome::HandlerOutcome;
use crate::publish::Publish;
use crate::reason::Reason;
use crate::retry::RetryPolicy;

pub use crate::policy::Policy;
pub(crate) use crate::policy::IN_MEMORY_CONCURRENCY;
pub(crate) use invoke::{call_handler, call_job, spawn_grace_timer, stop_by_deadline, Slot};
use record::{Delivered, Transport};
#[cfg(any(feature = "rabbitmq", feature = "kafka"))]
pub(crate) use verdict::payload_too_large_detail;
pub(crate) use verdict::{Call, Verdict};

/// Where a delivery goes.
#[derive(Clone, Copy)]
pub(crate) enum Target<'a> {
    /// A handler (or job) this world runs.
    Slot(&'a Slot),
    /// No handler knows the message's type; it arrived where this handler's messages do (a
    /// handler's own queue), if anywhere.
    NoHandlerForType(Option<&'a str>),
    /// The message is meant for this handler (a retry, a replayed dead letter), which this
    /// world does not have.
    NoSuchHandler(&'a str),
}

impl<'a> Target<'a> {
    /// The handler's name, when there is one.
    pub(crate) fn handler_name(&self) -> Option<&'a str> {
        match self {
            Target::Slot(slot) => Some(slot.name()),
            Target::NoHandlerForType(arrived_for) => *arrived_for,
            Target::NoSuchHandler(name) => Some(name),
        }
    }
}

/// A world: its own way of carrying out a verdict. How deliveries arrive is the world's loop.
pub(crate) trait World {
    /// A delivery as the world holds it (a claimed row, a broker delivery, a record).
    type Delivery;
    /// What the world's loop needs back (an id to ack in a batch, a tag to ack).
    type Settled;

    /// Carries `verdict` out for `delivery`.
    fn settle(
        &self,
        delivery: Self::Delivery,
        verdict: Verdict,
    ) -> impl Future<Output = Self::Settled> + Send;
}

/// The engine of one world: its retry policy, payload cap and name, and the metrics it records
/// in.
#[derive(Clone, Debug)]
pub(crate) struct Engine {
    retry: RetryPolicy,
    max_payload_bytes: usize,
    transport: Transport,
    metrics: Metrics,
    /// What messages of a type no handler knows record through, taken on the first one.
    unknown: OnceLock<Arc<HandlerMetrics>>,
}

impl Engine {
    pub(crate) fn new(
        retry: RetryPolicy,
        max_payload_bytes: usize,
        transport: Transport,
    ) -> Engine {
        // What this worker takes, this process may write into the outbox.
        crate::policy::accept_payloads_up_to(max_payload_bytes);
        Engine {
            retry,
            max_payload_bytes,
            transport,
            metrics: Metrics::global().clone(),
            unknown: OnceLock::new(),
        }
    }

    /// Records in `metrics` instead of [`Metrics::global`] (a runtime of its own).
    pub(crate) fn metrics_in(mut self, metrics: Metrics) -> Engine {
        self.metrics = metrics;
        self
    }

    pub(crate) fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// One delivery of `envelope` (its `attempt` the call about to be made) to `target`: the
    /// checks, the call, the verdict and its record. `stop` is the world's shutdown signal,
    /// `interrupt` the end of its grace.
    pub(crate) async fn deliver(
        &self,
        target: Target<'_>,
        envelope: &Arc<Envelope>,
        stop: &CancellationToken,
        interrupt: &CancellationToken,
        publisher: &Arc<dyn Publish>,
    ) -> Verdict {
        if let Some(verdict) = verdict::precheck(
            &self.retry,
            envelope.attempt,
            envelope.payload.len(),
            self.max_payload_bytes,
        ) {
            self.record(target, envelope, &verdict, None);
            return verdict;
        }
        let (call, took) = match target {
            Target::Slot(slot) => {
                invoke::invoke(slot, envelope, stop, interrupt, publisher, self.transport).await
            }
            Target::NoHandlerForType(_) => (
                Call::Finished(verdict::no_handler_for_type(&envelope.message_type)),
                None,
            ),
            Target::NoSuchHandler(name) => (Call::Finished(verdict::no_such_handler(name)), None),
        };
        // Only a failure asks whether the world was stopping (a lock on the token).
        let stopping =
            matches!(call, Call::Finished(HandlerOutcome::Retry { .. })) && stop.is_cancelled();
        let verdict = verdict::verdict(&self.retry, envelope.attempt, call, stopping);
        self.record(target, envelope, &verdict, took);
        verdict
    }

    /// A dead letter the world decided before any call (a delivery it could not read into an
    /// envelope, a stored row another program wrote), recorded like every other verdict.
    pub(crate) fn reject(
        &self,
        target: Target<'_>,
        envelope: &Envelope,
        reason: Reason,
        detail: String,
        calls: u32,
    ) -> Verdict {
        let verdict = Verdict::DeadLetter {
            reason,
            detail,
            calls,
        };
        self.record(target, envelope, &verdict, None);
        verdict
    }

    fn record(
        &self,
        target: Target<'_>,
        envelope: &Envelope,
        verdict: &Verdict,
        took: Option<Duration>,
    ) {
        let delivered = Delivered::of(envelope, target.handler_name(), self.transport);
        match target {
            Target::Slot(slot) => record::record(&delivered, verdict, took, slot.metrics()),
            // A handler renamed or removed, or the handler whose queue an unknown type arrived
            // in (RabbitMQ): rare, and its name is the label.
            Target::NoSuchHandler(name) | Target::NoHandlerForType(Some(name)) => {
                record::record(&delivered, verdict, took, &self.metrics.handler(name));
            }
            Target::NoHandlerForType(None) => {
                let metrics = self
                    .unknown
                    .get_or_init(|| self.metrics.handler(crate::metrics::UNKNOWN));
                record::record(&delivered, verdict, took, metrics);
            }
        }
    }
}
