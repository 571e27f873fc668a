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
//! The outbox worker and the scheduler are feeds whose passes claim rows under a lease (the
//! store counted the attempt at the claim); the in-memory worker, each RabbitMQ queue and each
//! Kafka partition are feeds whose passes wait for what arrives (a partition's, one record at
//! a time, its call counted in the store first). A push feed whose source stops sending while acks
//! are owed (a broker at its prefetch) acks in `settle` itself and returns [`Row::Settled`]:
//! an ack owed to the next pass could wait for good.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
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
/// scheduler's planning). A pull feed's pass claims what is due and returns; a push feed's
/// waits until something arrives, or until `stop` fires (it then returns nothing). Either way
/// the loop goes on joining calls that end while a pass is under way.
pub(crate) trait Feed: Send + Sync + 'static {
    /// What settles a delivery: a claim's token and the row's id, say.
    type Claim: Send + Sync + 'static;
    /// Why a pass or a settle failed.
    type Error: fmt::Display + Send + 'static;

    /// What log lines and readiness call the worker ("outbox worker", "scheduler").
    const NAME: &'static str;

    /// Whether the loop's start and stop are logged at info level; a loop that comes and goes
    /// with its source (a Kafka partition's, at each assignment) logs them at debug.
    const ANNOUNCED: bool = true;

    /// Once, before the first pass: what ends a wait between passes early, and where a
    /// handler's `ctx.publish` writes. An error ends the run (another worker holds the
    /// in-memory store).
    fn start(&self) -> impl Future<Output = Result<Started, Self::Error>> + Send;

    /// Writes `acks`, does the feed's own work and takes up to `room` deliveries.
    fn pass(
        &self,
        acks: Vec<Self::Claim>,
        room: u32,
        stop: &CancellationToken,
    ) -> impl Future<Output = Result<Pass<Self::Claim>, Self::Error>> + Send;

    /// Carries `verdict` out for the delivery `claim` holds (`handler`'s, with `envelope`). A
    /// success is not written here: [`Row::Ack`] has the loop ack the claim with the next pass.
    /// `stop` is the worker's stop signal (a wait before a retry ends there).
    fn settle(
        &self,
        claim: &Self::Claim,
        handler: Option<&str>,
        envelope: Arc<Envelope>,
        verdict: Verdict,
        stop: &CancellationToken,
    ) -> impl Future<Output = Result<Row, Self::Error>> + Send;

    /// Gives deliveries back without calling their handlers: due at once, their attempt not
    /// counted.
    fn hand_back(
        &self,
        arrivals: Vec<Arrival<Self::Claim>>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Once, when the worker stops, after its last call ended: writes the acks still owed (often
    /// none) and lets go of what the feed holds at its source (a broker's consumer).
    fn close(&self, acks: Vec<Self::Claim>)
        -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// After the last settle, or when the loop is dropped: lets go of what
    /// [`start`](Feed::start) took.
    fn finish(&self) {}
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
    /// The handler it is for.
    pub(crate) to: To,
    /// The message, `attempt` counted (shared by the deliveries of one message to several
    /// handlers).
    pub(crate) envelope: Arc<Envelope>,
    /// An earlier hold of it ended unsettled: it may have crashed a process, so it runs alone.
    pub(crate) recovered: bool,
    /// Why it is dead-lettered without a call (a stored message that cannot be read, a
    /// delivery the broker returned too often).
    pub(crate) refused: Option<Refusal>,
}

/// Why a delivery is dead-lettered without a call.
pub(crate) struct Refusal {
    pub(crate) reason: Reason,
    pub(crate) detail: String,
    /// The handler calls made before (its dead letter's `attempts`).
    pub(crate) calls: u32,
}

impl Refusal {
    /// A stored message another program wrote, which no call could read either.
    pub(crate) fn unreadable(detail: String) -> Refusal {
        Refusal {
            reason: Reason::MESSAGE_UNREADABLE,
            detail,
            calls: 0,
        }
    }
}

/// Which handler a delivery is for.
pub(crate) enum To {
    /// A handler of the worker, by its place among the worker's slots (the feed looked it up).
    Slot(usize),
    /// A handler by name, looked up by the loop: one the worker does not have gets the
    /// `no_such_handler` dead letter.
    Named(String),
    /// No handler knew its type.
    Nobody,
    /// No handler of the worker takes its type, and it arrived where this handler's messages
    /// do (a handler's own queue): its dead letter names that handler.
    #[cfg_attr(not(feature = "rabbitmq"), allow(dead_code))]
    QueueOf(usize),
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
    /// When a call that ends starts the next pass.
    pub(crate) refill: Refill,
}

/// When a call that ends starts the next pass at once (otherwise the pass waits for its time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refill {
    /// Once every call of the worker has ended: a pass takes a whole batch, and its acks are
    /// written in one statement with the next take (the outbox).
    WhenAllEnded,
    /// As soon as any call ends: a slow call holds only its own place (the scheduler, whose
    /// runs may take minutes).
    WhenAnyEnds,
}

/// The worker around a [`Feed`]: the feed, the handlers (or jobs) it calls, the engine, the
/// pace and the probe readiness is reported to. Clones share everything.
pub(crate) struct Worker<F: Feed> {
    inner: Arc<Inner<F>>,
}

impl<F: Feed> Clone for Worker<F> {
    fn clone(&self) -> Worker<F> {
        Worker {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<F> {
    feed: F,
    /// The handlers (or jobs), in the order a feed's [`To::Slot`] counts them (shared with
    /// other loops of the world: a Kafka handler's partitions).
    slots: Arc<[Slot]>,
    by_name: HashMap<String, usize>,
    engine: Engine,
    pace: Pace,
    health: Probe,
}

/// One run of a worker, as each of its calls holds it.
struct Run<F> {
    worker: Arc<Inner<F>>,
    /// The worker was told to stop: no new calls, waits before a retry end.
    stop: CancellationToken,
    /// The shutdown grace is over: running calls are given up on.
    interrupt: CancellationToken,
    /// Where a handler's `ctx.publish` writes.
    publisher: Arc<dyn Publish>,
}

impl<F: Feed> Run<F> {
    /// Calls one delivery's handler and settles the verdict; returns its claim when its ack is
    /// owed.
    async fn call(
        self: Arc<Self>,
        number: u64,
        Arrival {
            claim,
            to,
            envelope,
            refused,
            ..
        }: Arrival<F::Claim>,
    ) -> Ended<F::Claim> {
        let (worker, stop) = (&*self.worker, &self.stop);
        let target = worker.target(&to);
        let verdict = match refused {
            Some(Refusal {
                reason,
                detail,
                calls,
            }) => {
                // Dead-lettered alone, the rest of the pass handled.
                tracing::error!(worker = F::NAME, message_id = %envelope.id, %reason, %detail, "a delivery is dead-lettered without a call");
                worker
                    .engine
                    .reject(target, &envelope, reason, detail, calls)
            }
            None => {
                let (interrupt, publisher) = (&self.interrupt, &self.publisher);
                worker
                    .engine
                    .deliver(target, &envelope, stop, interrupt, publisher)
                    .await
            }
        };
        let message_id = envelope.id;
        let handler = target.handler_name();
        let settled = worker
            .feed
            .settle(&claim, handler, envelope, verdict, stop)
            .await;
        let owed = match settled {
            Ok(Row::Ack) => Some(claim),
            Ok(Row::Settled) => None,
            Ok(Row::Lost) => {
                tracing::warn!(
                    worker = F::NAME,
                    %message_id,
                    handler = handler.unwrap_or("none"),
                    "the lease ended before the delivery was settled: another worker took it \
                     over, and this outcome is dropped (it runs again)"
                );
                None
            }
            Err(error) => {
                worker
                    .health
                    .fail(format!("settling a delivery failed: {error}"));
                tracing::warn!(
                    worker = F::NAME,
                    %message_id,
                    %error,
                    "could not settle a delivery; it runs again after its lease"
                );
                None
            }
        };
        (number, owed)
    }
}

/// The calls in flight. A loop that is dropped (the hard stop deadline, a caller's own
/// timeout) leaves them running rather than aborting them: each still settles its delivery
/// (a retry goes back, an abandoned call's row waits for its lease).
struct Detached<T: 'static>(JoinSet<T>);

impl<T: 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        self.0.detach_all();
    }
}

impl<T: 'static> std::ops::Deref for Detached<T> {
    type Target = JoinSet<T>;

    fn deref(&self) -> &JoinSet<T> {
        &self.0
    }
}

impl<T: 'static> std::ops::DerefMut for Detached<T> {
    fn deref_mut(&mut self) -> &mut JoinSet<T> {
        &mut self.0
    }
}

/// Calls [`Feed::finish`] when the loop ends, however it ends.
struct Finish<'a, F: Feed>(&'a F);

impl<F: Feed> Drop for Finish<'_, F> {
    fn drop(&mut self) {
        self.0.finish();
    }
}

/// A run that ended: its sequence number, and its claim when the loop owes its ack.
type Ended<C> = (u64, Option<C>);

/// A pass under way: the loop joins calls that end meanwhile.
type PassUnderWay<'a, C, E> = Pin<Box<dyn Future<Output = Result<Pass<C>, E>> + Send + 'a>>;

impl<F: Feed> Worker<F> {
    pub(crate) fn new(
        feed: F,
        slots: impl Into<Arc<[Slot]>>,
        engine: Engine,
        pace: Pace,
        health: Probe,
    ) -> Worker<F> {
        let slots: Arc<[Slot]> = slots.into();
        let by_name = slots
            .iter()
            .enumerate()
            .map(|(index, slot)| (slot.name().to_string(), index))
            .collect();
        Worker {
            inner: Arc::new(Inner {
                feed,
                slots,
                by_name,
                engine,
                pace,
                health,
            }),
        }
    }

    /// The handlers (or jobs) it calls, in the order they were given.
    pub(crate) fn slots(&self) -> &[Slot] {
        &self.inner.slots
    }

    /// Their names, sorted.
    pub(crate) fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.inner.slots.iter().map(|slot| &**slot.name()).collect();
        names.sort_unstable();
        names
    }

    pub(crate) fn pace(&self) -> Pace {
        self.inner.pace
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub(crate) fn feed(&self) -> &F {
        &self.inner.feed
    }

    /// Runs until `cancel` fires, then lets the calls in flight end (they get the shutdown
    /// grace), writes the acks owed and returns. Stopping has one hard deadline: the grace and
    /// [`SETTLE_AFTER_GRACE`](crate::policy::SETTLE_AFTER_GRACE) to settle; what is unsettled
    /// by then runs again once its lease ends (or, in memory, is left where it was). Fails
    /// only when the feed cannot start.
    pub(crate) async fn run(self, cancel: CancellationToken) -> Result<(), F::Error> {
        let grace = self.inner.pace.shutdown_grace;
        stop_by_deadline(F::NAME, &cancel, grace, self.serve(cancel.clone())).await
    }

    async fn serve(self, cancel: CancellationToken) -> Result<(), F::Error> {
        let inner = &*self.inner;
        let pace = inner.pace;
        let Started { wake, publisher } = inner.feed.start().await?;
        let interrupt = CancellationToken::new();
        let _grace = spawn_grace_timer(cancel.clone(), interrupt.clone(), pace.shutdown_grace);
        // What every call of this run shares, behind one `Arc`: a call takes one clone, not one
        // of each token (a token's clone takes a lock).
        let run = Arc::new(Run {
            worker: self.inner.clone(),
            stop: cancel.clone(),
            interrupt,
            publisher,
        });
        let wake = wake.unwrap_or_else(|| Arc::new(Notify::new()));
        // Calls in flight, each in a task of its own (call and settle): a pass never waits for
        // them, and they go on while the loop awaits the feed.
        let _finish = Finish(&inner.feed);
        let mut running: Detached<Ended<F::Claim>> = Detached(JoinSet::new());
        let mut owed: Vec<F::Claim> = Vec::new();
        let mut under_way: Option<PassUnderWay<'_, F::Claim, F::Error>> = None;
        let mut runs: u64 = 0;
        let next_pass = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(next_pass);
        // One wait for the stop across the loop: a new one each turn would register and
        // unregister a waiter on the token, a lock each way.
        let stopped = cancel.cancelled();
        tokio::pin!(stopped);
        let mut pass_now = true;
        let mut wakeable = false;
        let mut stopping = false;
        // The run of a suspect running alone, and whether passes wait for the calls in flight
        // to end first so that it can.
        let mut isolating: Option<u64> = None;
        let mut quieting = false;
        let batch = pace.batch_size as usize;
        if F::ANNOUNCED {
            tracing::info!(
                worker = F::NAME,
                handlers = inner.slots.len(),
                "worker started"
            );
        } else {
            tracing::debug!(
                worker = F::NAME,
                handlers = inner.slots.len(),
                "worker started"
            );
        }
        loop {
            if running.is_empty() {
                if stopping && under_way.is_none() {
                    break;
                }
                // Whatever a suspect waited for has ended, and a suspect's run that ended in
                // a failed task has too.
                quieting = false;
                isolating = None;
            }
            tokio::select! {
                biased;
                () = &mut stopped, if !stopping => stopping = true,
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
                    // Room again (or a suspect's turn): the next pass need not wait.
                    if pace.refill == Refill::WhenAnyEnds || running.is_empty() {
                        pass_now = true;
                    }
                }
                passed = async { under_way.as_mut().expect("a pass is under way").await },
                    if under_way.is_some() =>
                {
                    under_way = None;
                    let wait = match passed {
                        Ok(pass) if stopping => {
                            // Told to stop while it took them: none is called.
                            if !pass.arrivals.is_empty() {
                                inner.give_back(pass.arrivals).await;
                            }
                            Duration::ZERO
                        }
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
                                let mut back = std::mem::take(&mut arrivals);
                                if running.is_empty() {
                                    tracing::warn!(
                                        worker = F::NAME,
                                        message_id = %suspect.envelope.id,
                                        handler = inner.handler_name(&suspect.to).unwrap_or("none"),
                                        attempt = suspect.envelope.attempt,
                                        "an earlier call of this delivery never settled (did it \
                                         crash the process?): running it alone"
                                    );
                                    isolating = Some(runs);
                                    arrivals.push(suspect);
                                } else {
                                    back.push(suspect);
                                    quieting = true;
                                }
                                inner.give_back(back).await;
                            }
                            let mut arrivals = arrivals.into_iter();
                            // The message of the last delivery started: the deliveries of one
                            // message to several handlers start together, or none does.
                            let mut last: Option<usize> = None;
                            while let Some(arrival) = arrivals.next() {
                                let message = Arc::as_ptr(&arrival.envelope) as usize;
                                if last != Some(message) && cancel.is_cancelled() {
                                    // Told to stop by a call of this pass: the rest are not
                                    // started.
                                    let back = std::iter::once(arrival).chain(arrivals).collect();
                                    inner.give_back(back).await;
                                    break;
                                }
                                last = Some(message);
                                let run_number = runs;
                                runs += 1;
                                let mut call: BoxFuture<'static, Ended<F::Claim>> =
                                    Box::pin(Run::call(run.clone(), run_number, arrival));
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
                    // A call that ended during the pass may have asked for the next one.
                    pass_now |= wait.is_zero();
                    next_pass
                        .as_mut()
                        .reset(tokio::time::Instant::now() + wait);
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
                }, if !stopping && under_way.is_none() => {
                    let room = if isolating.is_some() || quieting {
                        0
                    } else {
                        batch.saturating_sub(running.len())
                    };
                    let room = u32::try_from(room).unwrap_or(u32::MAX);
                    let acks = std::mem::take(&mut owed);
                    under_way = Some(Box::pin(inner.feed.pass(acks, room, &cancel)));
                    pass_now = false;
                }
            }
        }
        if let Err(error) = inner.feed.close(owed).await {
            tracing::warn!(worker = F::NAME, %error, "the last acks failed; those deliveries run again when their lease ends");
        }
        if F::ANNOUNCED {
            tracing::info!(worker = F::NAME, "worker stopped");
        } else {
            tracing::debug!(worker = F::NAME, "worker stopped");
        }
        Ok(())
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
            tracing::error!(worker = F::NAME, %error, "a call's task failed before its delivery was settled; it comes back (a claimed row after its lease, a RabbitMQ delivery when its channel closes, a Kafka record at its partition's next pass)");
            None
        }
    }
}

impl<F: Feed> Inner<F> {
    /// Gives `arrivals` back uncalled; a failure is logged (they come back after their lease).
    async fn give_back(&self, arrivals: Vec<Arrival<F::Claim>>) {
        if let Err(error) = self.feed.hand_back(arrivals).await {
            tracing::warn!(worker = F::NAME, %error, "could not give deliveries back; they come back after their lease");
        }
    }

    /// Where a delivery for `to` goes.
    fn target<'a>(&'a self, to: &'a To) -> Target<'a> {
        match to {
            To::Slot(index) => Target::Slot(&self.slots[*index]),
            To::Named(name) => match self.by_name.get(name) {
                Some(index) => Target::Slot(&self.slots[*index]),
                None => Target::NoSuchHandler(name),
            },
            To::Nobody => Target::NoHandlerForType(None),
            To::QueueOf(index) => Target::NoHandlerForType(Some(self.slots[*index].name())),
        }
    }

    fn handler_name<'a>(&'a self, to: &'a To) -> Option<&'a str> {
        self.target(to).handler_name()
    }
}
