//! The fault mode: what at-least-once delivery does to a message (it arrives twice, it comes
//! back after the handler committed but before the ack, two copies run at once), played
//! against the handlers, and what they leave compared with one clean delivery.

use std::fmt;
use std::future::Future;

use super::Harness;
use crate::envelope::Envelope;
use crate::outcome::HandlerOutcome;
use futures_util::future::{self, LocalBoxFuture};

/// One way at-least-once delivery hands a handler the same message again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fault {
    /// No fault: one delivery, the reference the others are compared with.
    None,
    /// The message arrives twice, as attempt 1 both times (a publish repeated after a lost
    /// confirm, a relay that crashed between its publish and its delete).
    DeliveredTwice,
    /// The handler's call ran to its end (its own transaction committed), then the
    /// acknowledgement was lost and the message came back as attempt 2 (a crash or a lost
    /// connection between the commit and the ack, a lease that ran out).
    RedeliveredAfterCommit,
    /// Two copies run at the same time (a lease that ran out during a slow call, a broker
    /// that handed the message to a second consumer).
    Concurrent,
}

impl Fault {
    /// The faults a check plays, after its clean delivery.
    pub const ALL: [Fault; 3] = [
        Fault::DeliveredTwice,
        Fault::RedeliveredAfterCommit,
        Fault::Concurrent,
    ];

    /// What happened, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Fault::None => "one clean delivery",
            Fault::DeliveredTwice => "delivered twice",
            Fault::RedeliveredAfterCommit => {
                "redelivered after the handler committed, before the ack"
            }
            Fault::Concurrent => "two deliveries at once",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// How one delivery ended for one handler: its last call's outcome after the calls it took.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Ending {
    /// The handler's name.
    pub handler: String,
    /// Which delivery of the run this was: 1, or 2 for the fault's second one.
    pub delivery: u32,
    /// Calls made: more than one when a call asked for a retry.
    pub calls: u32,
    /// `Ack` or `DeadLetter` (a delivery whose calls all asked for a retry ends dead-lettered
    /// with the last call's reason, as a worker ends it after `MAX_DELIVERIES`).
    pub outcome: HandlerOutcome,
}

impl Ending {
    /// The outcome in a word, as the report compares them: `acked`, or `dead-lettered
    /// (<reason>)`.
    pub fn summary(&self) -> String {
        summary(&self.outcome)
    }
}

fn summary(outcome: &HandlerOutcome) -> String {
    match outcome {
        HandlerOutcome::Ack => "acked".to_owned(),
        HandlerOutcome::DeadLetter { reason, detail }
        | HandlerOutcome::Retry { reason, detail, .. } => {
            format!("dead-lettered ({reason}: {detail})")
        }
    }
}

/// One run of a check: the fault played, how each delivery ended, and what the probe read
/// afterwards.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FaultRun<T> {
    /// The fault played ([`Fault::None`] for the clean delivery).
    pub fault: Fault,
    /// Each handler's ending, for each delivery.
    pub endings: Vec<Ending>,
    /// What the probe read after the deliveries.
    pub probe: T,
}

/// What a [`FaultCheck`] found: the clean run, each faulted run, and their differences.
#[derive(Debug, Clone)]
pub struct FaultReport<T> {
    message_type: String,
    /// The clean delivery.
    pub clean: FaultRun<T>,
    /// One run per fault, in [`Fault::ALL`]'s order.
    pub faulted: Vec<FaultRun<T>>,
}

impl<T: fmt::Debug + PartialEq> FaultReport<T> {
    /// Each difference between a faulted run and the clean one, in words: a probe that read
    /// something else, and a delivery that ended otherwise than the clean one did (a
    /// duplicate dead-lettered where the original was acked, say).
    pub fn differences(&self) -> Vec<String> {
        let mut differences = Vec::new();
        for run in &self.faulted {
            if run.probe != self.clean.probe {
                differences.push(format!(
                    "{}: the probe read {:?}; after one clean delivery it read {:?}",
                    run.fault, run.probe, self.clean.probe
                ));
            }
            for ending in &run.endings {
                let Some(clean) = self
                    .clean
                    .endings
                    .iter()
                    .find(|clean| clean.handler == ending.handler)
                else {
                    continue;
                };
                if !same_kind(&clean.outcome, &ending.outcome) {
                    differences.push(format!(
                        "{}: delivery {} to `{}` was {}; one clean delivery was {}",
                        run.fault,
                        ending.delivery,
                        ending.handler,
                        ending.summary(),
                        clean.summary()
                    ));
                }
            }
        }
        differences
    }

    /// `true` when no faulted run differs from the clean one.
    pub fn is_idempotent(&self) -> bool {
        self.differences().is_empty()
    }

    /// Panics, listing each difference, unless the handlers are idempotent under every fault.
    #[track_caller]
    pub fn assert_idempotent(&self) {
        let differences = self.differences();
        if !differences.is_empty() {
            panic!("{}", self.describe(&differences));
        }
    }

    fn describe(&self, differences: &[String]) -> String {
        let mut text = format!(
            "the handlers of {:?} are not idempotent under at-least-once delivery: {} \
             difference{} from one clean delivery:",
            self.message_type,
            differences.len(),
            if differences.len() == 1 { "" } else { "s" }
        );
        for difference in differences {
            text.push_str("\n  - ");
            text.push_str(difference);
        }
        text.push_str(
            "\nA handler sees a message more than once: deduplicate on ctx.message_id() in the \
             transaction that does the work (hexeract::outbox::inbox::mark_processed), or make \
             the work idempotent itself.",
        );
        text
    }
}

impl<T: fmt::Debug + PartialEq> fmt::Display for FaultReport<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let differences = self.differences();
        if differences.is_empty() {
            write!(
                f,
                "the handlers of {:?} left what one clean delivery leaves under each fault ({})",
                self.message_type,
                Fault::ALL.map(Fault::describe).join("; ")
            )
        } else {
            f.write_str(&self.describe(&differences))
        }
    }
}

/// Acked and acked, or dead-lettered for the same reason (details may differ: they carry
/// times and ids).
fn same_kind(a: &HandlerOutcome, b: &HandlerOutcome) -> bool {
    match (a, b) {
        (HandlerOutcome::Ack, HandlerOutcome::Ack) => true,
        (
            HandlerOutcome::DeadLetter { reason: a, .. } | HandlerOutcome::Retry { reason: a, .. },
            HandlerOutcome::DeadLetter { reason: b, .. } | HandlerOutcome::Retry { reason: b, .. },
        ) => a == b,
        _ => false,
    }
}

type Reset<'a> = Box<dyn FnMut() -> LocalBoxFuture<'a, ()> + 'a>;
type Probe<'a, T> = Box<dyn FnMut() -> LocalBoxFuture<'a, T> + 'a>;

/// Plays the faults of at-least-once delivery against the handlers of one message and compares
/// what they leave with what one clean delivery leaves. Made by
/// [`Harness::fault_check`].
///
/// Each run starts with [`reset`](FaultCheck::reset) (put the world back: truncate the
/// tables, clear a list), delivers as its [`Fault`] says, then reads the
/// [`probe`](FaultCheck::probe) (a query, a closure over what the handlers change). First one
/// clean delivery, then one run per fault in [`Fault::ALL`]. Each delivery runs to its end:
/// a call that asks for a retry is called again at once, up to the harness's
/// [`max_deliveries`](Harness::max_deliveries). What the handlers publish is forgotten before
/// each run, so a probe may read [`Harness::published`].
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use hexeract::testing::Harness;
/// use hexeract::{handler, Context, HandlerOutcome, Message, State};
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "doc.PointsEarned")]
/// struct PointsEarned { points: u32 }
///
/// #[derive(Clone, Default)]
/// struct Ledger(Arc<Mutex<Vec<(uuid::Uuid, u32)>>>);
///
/// // Idempotent: the ledger keeps one line per message id.
/// #[handler(message = "doc.PointsEarned", name = "doc.add_points")]
/// async fn add_points(event: PointsEarned, ctx: &Context, State(ledger): State<Ledger>) -> HandlerOutcome {
///     let mut lines = ledger.0.lock().unwrap();
///     if !lines.iter().any(|(id, _)| *id == ctx.message_id()) {
///         lines.push((ctx.message_id(), event.points));
///     }
///     HandlerOutcome::Ack
/// }
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = Ledger::default();
/// let harness = Harness::new()?.state(ledger.clone());
/// let report = harness
///     .fault_check(&PointsEarned { points: 10 })?
///     .reset(|| async { ledger.0.lock().unwrap().clear() })
///     .probe(|| async { ledger.0.lock().unwrap().iter().map(|(_, p)| p).sum::<u32>() })
///     .run()
///     .await;
/// report.assert_idempotent();
/// # Ok(())
/// # }
/// ```
#[must_use = "a fault check does nothing until `.run().await`"]
pub struct FaultCheck<'a, T = ()> {
    harness: &'a Harness,
    envelope: Envelope,
    reset: Reset<'a>,
    probe: Probe<'a, T>,
}

impl<T> fmt::Debug for FaultCheck<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultCheck")
            .field("message_type", &self.envelope.message_type)
            .finish_non_exhaustive()
    }
}

impl<'a> FaultCheck<'a, ()> {
    pub(super) fn new(harness: &'a Harness, envelope: Envelope) -> FaultCheck<'a, ()> {
        FaultCheck {
            harness,
            envelope,
            reset: Box::new(|| Box::pin(future::ready(()))),
            probe: Box::new(|| Box::pin(future::ready(()))),
        }
    }
}

impl<'a, T: fmt::Debug + PartialEq> FaultCheck<'a, T> {
    /// Puts the world back before each run (default: nothing). Without it, each run starts
    /// from what the one before left, and a probe that counts rows sees them add up.
    pub fn reset<F, Fut>(mut self, mut reset: F) -> FaultCheck<'a, T>
    where
        F: FnMut() -> Fut + 'a,
        Fut: Future<Output = ()> + 'a,
    {
        self.reset = Box::new(move || Box::pin(reset()));
        self
    }

    /// Reads what the handlers changed, after each run (default: nothing, so only how the
    /// deliveries ended is compared).
    pub fn probe<U, F, Fut>(self, mut probe: F) -> FaultCheck<'a, U>
    where
        U: fmt::Debug + PartialEq,
        F: FnMut() -> Fut + 'a,
        Fut: Future<Output = U> + 'a,
    {
        FaultCheck {
            harness: self.harness,
            envelope: self.envelope,
            reset: self.reset,
            probe: Box::new(move || Box::pin(probe())),
        }
    }

    /// Plays the clean delivery and each fault, and reports.
    pub async fn run(mut self) -> FaultReport<T> {
        let clean = self.play(Fault::None).await;
        let mut faulted = Vec::with_capacity(Fault::ALL.len());
        for fault in Fault::ALL {
            faulted.push(self.play(fault).await);
        }
        FaultReport {
            message_type: self.envelope.message_type.clone(),
            clean,
            faulted,
        }
    }

    async fn play(&mut self, fault: Fault) -> FaultRun<T> {
        (self.reset)().await;
        self.harness.clear_published();
        let harness = self.harness;
        let envelope = &self.envelope;
        let endings = match fault {
            Fault::None => to_the_end(harness, envelope, 1, 1).await,
            Fault::DeliveredTwice => {
                let mut endings = to_the_end(harness, envelope, 1, 1).await;
                endings.extend(to_the_end(harness, envelope, 1, 2).await);
                endings
            }
            Fault::RedeliveredAfterCommit => {
                let mut endings = to_the_end(harness, envelope, 1, 1).await;
                let calls = endings.iter().map(|ending| ending.calls).max().unwrap_or(1);
                endings.extend(to_the_end(harness, envelope, calls + 1, 2).await);
                endings
            }
            Fault::Concurrent => {
                let (mut first, second) = future::join(
                    to_the_end(harness, envelope, 1, 1),
                    to_the_end(harness, envelope, 1, 2),
                )
                .await;
                first.extend(second);
                first
            }
        };
        let probe = (self.probe)().await;
        FaultRun {
            fault,
            endings,
            probe,
        }
    }
}

/// Delivers `envelope` to each handler of its type, from call `attempt` on, calling again at
/// once while a call asks for a retry, up to the harness's `max_deliveries` calls.
async fn to_the_end(
    harness: &Harness,
    envelope: &Envelope,
    attempt: u32,
    delivery: u32,
) -> Vec<Ending> {
    let handlers = harness.registry.handlers_for(&envelope.message_type);
    let mut endings = Vec::with_capacity(handlers.len());
    for registered in handlers {
        let mut calls = 0;
        let outcome = loop {
            let mut envelope = envelope.clone();
            envelope.attempt = attempt + calls;
            calls += 1;
            match harness.call(registered, envelope).await {
                HandlerOutcome::Retry { reason, detail, .. } if calls >= harness.max_deliveries => {
                    break HandlerOutcome::DeadLetter { reason, detail };
                }
                HandlerOutcome::Retry { .. } => {}
                ended => break ended,
            }
        };
        endings.push(Ending {
            handler: registered.info().name.to_string(),
            delivery,
            calls,
            outcome,
        });
    }
    endings
}
