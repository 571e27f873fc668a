//! The one loop of a worker, written once over a [`Feed`]: the world's half that says how
//! deliveries arrive and how a verdict is carried out. The loop owns the rest: the passes and
//! their pace, how many calls run at once, handler lookup, the engine's call and verdict, the
//! publisher a handler's context writes to, readiness, the shutdown grace and the hard stop
//! deadline, a delivery suspected of crashing the process run alone, and acks batched into
//! the next pass.
//!
//! ```text
//!        ┌──────────── pass: acks owed, the feed's own work, up to `room` arrivals ◀──────┐
//!        ▼                                                                                │
//!   arrival ──▶ handler lookup ──▶ engine: call, verdict ──▶ feed: settle ──▶ ack owed ───┘
//!   (polled once: a call that is done at once needs no task; one that waits gets a task of
//!    its own and is never dropped)
//! ```
//!
//! The outbox worker and the scheduler are feeds (their passes claim rows under a lease, and
//! the store counted the attempt at the claim).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::delivery::{spawn_grace_timer, stop_by_deadline, Engine, Slot, Target, Verdict};
use crate::envelope::Envelope;
use crate::health::Probe;
use crate::publish::Publish;
use crate::reason::Reason;

/// A world's half of a worker at run time: where deliveries arrive from, and where verdicts go.
///
/// Each pass the loop hands back the claims of the calls that succeeded since the last one
/// (`acks`: a feed writes them with its next statement, as the outbox does in one round trip
/// with its take) and asks for up to `room` deliveries (`0` while a suspect runs alone or the
/// calls in flight fill the batch: the feed then does only its own work, such as the
/// scheduler's planning).
pub(crate) trait Feed: Send + Sync + 'static {
    /// What settles a delivery: a claim's token and the row's id.
    type Claim: Copy + Send + Sync + 'static;
    /// Why a pass or a settle failed.
    type Error: fmt::Display + Send + 'static;

    /// What log lines and readiness call the worker ("outbox worker", "scheduler").
    const NAME: &'static str;

    /// Once, before the first pass: what ends a wait between passes early, and where a
    /// handler's `ctx.publish` writes.
    fn start(&self) -> impl Future<Output = Started> + Send;

    /// Writes `acks`, does the feed's own work and takes up to `room` deliveries.
    fn pass(
        &self,
        acks: Vec<Self::Claim>,
        room: u32,
    ) -> impl Future<Output = Result<Pass<Self::Claim>, Self::Error>> + Send;

    /// Carries `verdict` out for the delivery `claim` holds. A success is not written here:
    /// [`Row::Ack`] gives the claim back to the loop, which acks it with the next pass.
    fn settle(
        &self,
        claim: Self::Claim,
        verdict: Verdict,
    ) -> impl Future<Output = Result<Row, Self::Error>> + Send;

    /// Gives deliveries back without calling their handlers: due at once, their attempt not
    /// counted.
    fn hand_back(
        &self,
        claims: Vec<Self::Claim>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Writes the acks still owed when the worker stops.
    fn ack(&self, acks: Vec<Self::Claim>) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// What a feed's [`start`](Feed::start) returns.
pub(crate) struct Started {
    /// Ends a wait between passes early (new messages may be waiting); `None`: the poll
    /// interval alone.
    pub(crate) wake: Option<Arc<Notify>>,
    /// Where a handler's `ctx.publish` writes.
    pub(crate) publisher: Arc<dyn Publish>,
}

/// What one pass found.
pub(crate) struct Pass<C> {
    /// How much work the pass found, its own included (the scheduler's released messages):
    /// none means the next pass waits for the poll interval or a wake-up.
    pub(crate) found: usize,
    /// The deliveries it took.
    pub(crate) arrivals: Vec<Arrival<C>>,
}

impl<C> Pass<C> {
    /// A pass that took `arrivals` and found nothing else.
    pub(crate) fn of(arrivals: Vec<Arrival<C>>) -> Pass<C> {
        Pass {
            found: arrivals.len(),
            arrivals,
        }
    }
}

/// One delivery, as a feed hands it to the loop.
pub(crate) struct Arrival<C> {
    /// What settles it.
    pub(crate) claim: C,
    /// The handler it is for; `None` when no handler knew its type.
    pub(crate) handler: Option<String>,
    /// The message, `attempt` counted.
    pub(crate) envelope: Envelope,
    /// An earlier hold of it ended unsettled: it may have crashed a process, so it runs alone.
    pub(crate) recovered: bool,
    /// Why the stored message cannot be read (it is dead-lettered without a call).
    pub(crate) unreadable: Option<String>,
}

/// What became of a delivery once its verdict was carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Row {
    /// Its call succeeded: the loop acks it, with the others of its pass, in one statement.
    Ack,
    /// Settled: due again, dead-lettered or given back.
    Settled,
    /// The claim was no longer ours (the lease ended and another worker took the delivery
    /// over): this verdict was not written, and the delivery runs again.
    Lost,
}

/// The pace of a worker's passes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    /// How long a pass that found nothing waits before the next (a wake-up ends it early).
    pub(crate) poll_interval: Duration,
    /// How long a pass that found work waits before the next (zero: at once).
    pub(crate) busy_delay: Duration,
    /// How many calls run at once, at most: a pass takes no more than the room left.
    pub(crate) batch_size: u32,
    /// How long calls in flight get to end once the worker is told to stop.
    pub(crate) shutdown_grace: Duration,
}

/// The worker around a [`Feed`]: the feed, the handlers (or jobs) it calls, the engine, the
/// pace and the probe readiness is reported to.
pub(crate) struct Worker<F: Feed> {
    inner: Arc<Inner<F>>,
}

struct Inner<F> {
    feed: F,
    slots: HashMap<String, Slot>,
    engine: Engine,
    pace: Pace,
    health: Probe,
}

/// A run that ended: its sequence number, and its claim when the loop owes its ack.
type Ended<C> = (u64, Option<C>);

impl<F: Feed> Worker<F> {
    pub(crate) fn new(
        feed: F,
        slots: HashMap<String, Slot>,
        engine: Engine,
        pace: Pace,
        health: Probe,
    ) -> Worker<F> {
        Worker {
            inner: Arc::new(Inner {
                feed,
                slots,
                engine,
                pace,
                health,
            }),
        }
    }

    /// The handlers (or jobs) it calls, by name, sorted.
    pub(crate) fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.inner.slots.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    pub(crate) fn pace(&self) -> Pace {
        self.inner.pace
    }

    pub(crate) fn feed(&self) -> &F {
        &self.inner.feed
    }

    /// Runs until `cancel` fires, then lets the calls in flight end (they get the shutdown
    /// grace), writes the acks owed and returns. Stopping has one hard deadline: the grace and
    /// [`SETTLE_AFTER_GRACE`](crate::policy::SETTLE_AFTER_GRACE) to settle; what is unsettled
    /// by then runs again once its lease ends.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let grace = self.inner.pace.shutdown_grace;
        let serve = async {
            self.serve(cancel.clone()).await;
            Ok::<(), std::convert::Infallible>(())
        };
        let _ = stop_by_deadline(F::NAME, &cancel, grace, serve).await;
    }

    async fn serve(self, cancel: CancellationToken) {
        let inner = &*self.inner;
        let pace = inner.pace;
        let interrupt = CancellationToken::new();
        let _grace = spawn_grace_timer(cancel.clone(), interrupt.clone(), pace.shutdown_grace);
        let Started { wake, publisher } = inner.feed.start().await;
        let wake = wake.unwrap_or_else(|| Arc::new(Notify::new()));
        // Calls in flight, each in a task of its own (call and settle): a pass never waits for
        // them, and they go on while the loop awaits the feed.
        let mut running: JoinSet<Ended<F::Claim>> = JoinSet::new();
        let mut owed: Vec<F::Claim> = Vec::new();
        let mut runs: u64 = 0;
        let next_pass = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(next_pass);
        let mut pass_now = true;
        let mut wakeable = false;
        let mut stopping = false;
        // The run of a suspect running alone, and whether passes wait for the calls in flight
        // to end first so that it can.
        let mut isolating: Option<u64> = None;
        let mut quieting = false;
        let batch = pace.batch_size as usize;
        tracing::info!(
            worker = F::NAME,
            handlers = inner.slots.len(),
            "worker started"
        );
        loop {
            if stopping && running.is_empty() {
                break;
            }
            if running.is_empty() {
                // Whatever a suspect waited for has ended, and a suspect's run that ended in
                // a failed task has too.
                quieting = false;
                isolating = None;
            }
            let room = if isolating.is_some() || quieting {
                0
            } else {
                batch.saturating_sub(running.len())
            };
            tokio::select! {
                biased;
                () = cancel.cancelled(), if !stopping => stopping = true,
                Some(done) = running.join_next(), if !running.is_empty() => {
                    let mut ended = vec![done];
                    // Every run that is done by now is acked with it, in one pass.
                    while let Some(Some(done)) = running.join_next().now_or_never() {
                        ended.push(done);
                    }
                    for done in ended {
                        if let Some((run, claim)) = joined::<F>(done) {
                            owed.extend(claim);
                            if isolating == Some(run) {
                                isolating = None;
                            }
                        }
                    }
                    // Room for a pass's worth of deliveries (or a suspect's turn): the next
                    // pass need not wait. Fewer calls ending, one at a time, wait for more, so
                    // that a pass takes several.
                    if running.len() <= batch / 2 {
                        pass_now = true;
                    }
                }
                // A zero wait goes by the flag: a timer would still wait for the clock's next
                // tick (a millisecond).
                () = async {
                    if !pass_now {
                        if wakeable {
                            tokio::select! {
                                () = &mut next_pass => {}
                                () = wake.notified() => {}
                            }
                        } else {
                            (&mut next_pass).await;
                        }
                    }
                }, if !stopping => {
                    let room = u32::try_from(room).unwrap_or(u32::MAX);
                    let wait = match inner.feed.pass(std::mem::take(&mut owed), room).await {
                        Ok(pass) => {
                            inner.health.pass();
                            let found = pass.found;
                            let mut arrivals = pass.arrivals;
                            if let Some(suspect) = arrivals.iter().position(|a| a.recovered) {
                                // Its last hold was never settled: the call may have crashed
                                // the process. It runs alone: the rest of the pass goes back
                                // uncharged, and if other calls are still going, it goes back
                                // too until they end.
                                let suspect = arrivals.swap_remove(suspect);
                                let mut back: Vec<F::Claim> =
                                    arrivals.drain(..).map(|arrival| arrival.claim).collect();
                                if running.is_empty() {
                                    tracing::warn!(
                                        worker = F::NAME,
                                        message_id = %suspect.envelope.id,
                                        handler = suspect.handler.as_deref().unwrap_or("none"),
                                        attempt = suspect.envelope.attempt,
                                        "an earlier call of this delivery never settled (did it \
                                         crash the process?): running it alone"
                                    );
                                    isolating = Some(runs);
                                    arrivals.push(suspect);
                                } else {
                                    back.push(suspect.claim);
                                    quieting = true;
                                }
                                if let Err(error) = inner.feed.hand_back(back).await {
                                    tracing::warn!(worker = F::NAME, %error, "could not give deliveries back; they come back after their lease");
                                }
                            }
                            for arrival in arrivals {
                                let run_number = runs;
                                runs += 1;
                                let worker = self.inner.clone();
                                let (cancel, interrupt, publisher) =
                                    (cancel.clone(), interrupt.clone(), publisher.clone());
                                let mut call: BoxFuture<'static, Ended<F::Claim>> =
                                    Box::pin(async move {
                                        let claim = worker
                                            .call(arrival, &cancel, &interrupt, &publisher)
                                            .await;
                                        (run_number, claim)
                                    });
                                // Polled once here: a call that does not wait ends without a
                                // task (and is acked with the next pass); one that waits goes
                                // on in a task of its own, never dropped.
                                match futures_util::poll!(&mut call) {
                                    Poll::Ready((run, claim)) => {
                                        owed.extend(claim);
                                        if isolating == Some(run) {
                                            isolating = None;
                                        }
                                    }
                                    Poll::Pending => {
                                        running.spawn(call);
                                    }
                                }
                            }
                            if found > 0 {
                                wakeable = false;
                                pace.busy_delay
                            } else {
                                wakeable = true;
                                pace.poll_interval
                            }
                        }
                        Err(error) => {
                            inner
                                .health
                                .fail(format!("a pass of the {} failed: {error}", F::NAME));
                            tracing::warn!(worker = F::NAME, %error, "a pass failed; retrying after the poll interval");
                            wakeable = true;
                            pace.poll_interval
                        }
                    };
                    pass_now = wait.is_zero();
                    next_pass
                        .as_mut()
                        .reset(tokio::time::Instant::now() + wait);
                }
            }
        }
        if !owed.is_empty() {
            if let Err(error) = inner.feed.ack(owed).await {
                tracing::warn!(worker = F::NAME, %error, "the last acks failed; those deliveries run again when their lease ends");
            }
        }
        tracing::info!(worker = F::NAME, "worker stopped");
    }
}

/// A run's task, joined: a panic outside the call (the handler's own are caught) is logged,
/// and its delivery comes back after its lease.
fn joined<F: Feed>(
    done: Result<Ended<F::Claim>, tokio::task::JoinError>,
) -> Option<Ended<F::Claim>> {
    match done {
        Ok(ended) => Some(ended),
        Err(error) => {
            tracing::error!(worker = F::NAME, %error, "a call's task failed; its delivery comes back after its lease");
            None
        }
    }
}

impl<F: Feed> Inner<F> {
    /// Where a delivery for `handler` goes.
    fn target<'a>(&'a self, handler: Option<&'a str>) -> Target<'a> {
        match handler {
            None => Target::NoHandlerForType(None),
            Some(name) => match self.slots.get(name) {
                Some(slot) => Target::Slot(slot),
                None => Target::NoSuchHandler(name),
            },
        }
    }

    /// Calls one delivery's handler and settles the verdict; returns its claim when its ack is
    /// owed.
    async fn call(
        &self,
        arrival: Arrival<F::Claim>,
        stop: &CancellationToken,
        interrupt: &CancellationToken,
        publisher: &Arc<dyn Publish>,
    ) -> Option<F::Claim> {
        let Arrival {
            claim,
            handler,
            envelope,
            unreadable,
            ..
        } = arrival;
        let target = self.target(handler.as_deref());
        let message_id = envelope.id;
        let verdict = match unreadable {
            Some(detail) => {
                // A row another program wrote, which no call would read either: dead-lettered
                // alone, the rest of the pass handled.
                tracing::error!(worker = F::NAME, %message_id, %detail, "stored message cannot be read; dead-lettered");
                self.engine
                    .reject(target, &envelope, Reason::MESSAGE_UNREADABLE, detail, 0)
            }
            None => {
                let envelope = Arc::new(envelope);
                self.engine
                    .deliver(target, &envelope, stop, interrupt, publisher)
                    .await
            }
        };
        match self.feed.settle(claim, verdict).await {
            Ok(Row::Ack) => Some(claim),
            Ok(Row::Settled) => None,
            Ok(Row::Lost) => {
                tracing::warn!(
                    worker = F::NAME,
                    %message_id,
                    handler = handler.as_deref().unwrap_or("none"),
                    "the lease ended before the delivery was settled: another worker took it \
                     over, and this outcome is dropped (it runs again)"
                );
                None
            }
            Err(error) => {
                self.health
                    .fail(format!("settling a delivery failed: {error}"));
                tracing::warn!(
                    worker = F::NAME,
                    %message_id,
                    %error,
                    "could not settle a delivery; it runs again after its lease"
                );
                None
            }
        }
    }
}
