//! One handler call, made safe to run: the permit, the context, the span, the timeout, a panic
//! caught, and a call given up on left to finish, never dropped mid-way.

use std::any::Any;
use std::future::Future;
use std::num::NonZeroU32;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::{CallCancellation, Context};
use crate::delivery::record::Transport;
use crate::delivery::verdict::Call;
use crate::envelope::Envelope;
use crate::metrics::HandlerMetrics;
use crate::middleware::{Chain, Endpoint, ErasedJob, Next};
use crate::outcome::HandlerOutcome;
use crate::publish::Publish;
use crate::reason::Reason;
use crate::registry::RegisteredHandler;
use crate::trace;

/// What a slot calls.
enum Callee {
    /// A handler, with its middleware.
    Handler(Arc<RegisteredHandler>),
    /// A job, and the middleware around its runs.
    Job(Arc<dyn ErasedJob>, Chain),
}

/// Calls given up on that may still run, per handler with no concurrency limit of its own (a
/// limited handler's are capped by its limit: each keeps its permit to its end).
pub(crate) const ABANDONED_CALLS_UNLIMITED: u32 = 16;

/// One handler (or scheduled job) as every world calls it: its name as contexts carry it, its
/// concurrency permits when it is limited, its timeout and its metrics.
pub(crate) struct Slot {
    name: Arc<str>,
    callee: Callee,
    permits: Option<Arc<Semaphore>>,
    /// Calls given up on that still run: at the cap, no new call starts until one of them
    /// ends.
    abandoned: Abandoned,
    /// The probe of the loop that calls it, told of each call that ends.
    probe: std::sync::OnceLock<crate::health::Probe>,
    timeout: Duration,
    metrics: Arc<HandlerMetrics>,
    /// The Kafka consumer group of the handler, for its spans.
    consumer_group: Option<Arc<str>>,
}

impl Slot {
    /// A slot for `handler`: its own timeout and concurrency, or else `timeout` and
    /// `concurrency`.
    pub(crate) fn handler(
        handler: &Arc<RegisteredHandler>,
        timeout: Duration,
        concurrency: Option<NonZeroU32>,
        metrics: &crate::metrics::Metrics,
    ) -> Slot {
        let info = handler.info();
        let limit = info.concurrency.or(concurrency);
        Slot {
            name: Arc::from(&*info.name),
            permits: limit.map(|limit| Arc::new(Semaphore::new(limit.get() as usize))),
            abandoned: Abandoned::new(limit.map_or(ABANDONED_CALLS_UNLIMITED, NonZeroU32::get)),
            probe: std::sync::OnceLock::new(),
            timeout: info.timeout.unwrap_or(timeout),
            metrics: metrics.handler(&info.name),
            callee: Callee::Handler(handler.clone()),
            consumer_group: None,
        }
    }

    /// The same slot, its calls' spans naming `group` as their consumer group.
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) fn in_consumer_group(mut self, group: &str) -> Slot {
        self.consumer_group = Some(Arc::from(group));
        self
    }

    /// A slot for a scheduled job's runs (no concurrency limit: one run per occurrence), with
    /// `chain` around each.
    pub(crate) fn job(
        name: Arc<str>,
        run: Arc<dyn ErasedJob>,
        chain: Chain,
        timeout: Duration,
    ) -> Slot {
        Slot {
            metrics: crate::metrics::Metrics::global().handler(&name),
            name,
            callee: Callee::Job(run, chain),
            permits: None,
            abandoned: Abandoned::new(ABANDONED_CALLS_UNLIMITED),
            probe: std::sync::OnceLock::new(),
            timeout,
            consumer_group: None,
        }
    }

    /// The handler's (or job's) name.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The registered handler, for a handler's slot.
    pub(crate) fn registered(&self) -> Option<&Arc<RegisteredHandler>> {
        match &self.callee {
            Callee::Handler(handler) => Some(handler),
            Callee::Job(..) => None,
        }
    }

    pub(crate) fn metrics(&self) -> &Arc<HandlerMetrics> {
        &self.metrics
    }

    /// Makes `probe`'s component not ready while this handler has no room left for calls given
    /// up on (each still running past its timeout): it then starts no new call, and readiness
    /// says why. Each call that ends is progress of that component
    /// ([`Probe::progress`](crate::health::Probe::progress)).
    pub(crate) fn watch(&self, probe: &crate::health::Probe) {
        let _ = self.probe.set(probe.clone());
        let name = self.name.clone();
        let abandoned = self.abandoned.clone();
        probe.watch(format!("abandoned calls of {name}"), move || {
            abandoned.full().then(|| {
                format!(
                    "handler {name}: {} calls given up on (past their timeout or the \
                     shutdown grace) still run; no new call of it starts until one ends",
                    abandoned.0.cap
                )
            })
        });
    }
}

/// A handler's calls given up on that still run, and how many it may have.
#[derive(Clone)]
pub(crate) struct Abandoned(Arc<AbandonedCalls>);

struct AbandonedCalls {
    running: std::sync::atomic::AtomicU32,
    cap: u32,
    /// Woken when one ends.
    ended: tokio::sync::Notify,
}

impl Abandoned {
    fn new(cap: u32) -> Abandoned {
        Abandoned(Arc::new(AbandonedCalls {
            running: std::sync::atomic::AtomicU32::new(0),
            cap,
            ended: tokio::sync::Notify::new(),
        }))
    }

    fn full(&self) -> bool {
        self.0.running.load(std::sync::atomic::Ordering::SeqCst) >= self.0.cap
    }

    /// Until there is room for one more, or `stop` fires (then `false`).
    async fn room(&self, stop: &CancellationToken) -> bool {
        loop {
            let ended = self.0.ended.notified();
            if !self.full() {
                return true;
            }
            tokio::select! {
                biased;
                () = ended => {}
                () = stop.cancelled() => return false,
            }
        }
    }

    /// `task`, given up on, runs on: counted until it ends.
    fn keep(&self, task: tokio::task::JoinHandle<HandlerOutcome>) {
        let calls = self.0.clone();
        calls
            .running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(async move {
            let _ = task.await;
            calls
                .running
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            calls.ended.notify_waiters();
        });
    }
}

/// Calls `slot` once with `envelope`: waits for a permit (unless `stop` fires first: then no
/// call is made), builds the context and the span, and runs the call under the slot's timeout
/// until it ends or `interrupt` fires. Returns how the call ended and how long it ran.
pub(crate) async fn invoke(
    slot: &Slot,
    envelope: &Arc<Envelope>,
    stop: &CancellationToken,
    interrupt: &CancellationToken,
    publisher: &Arc<dyn Publish>,
    transport: Transport,
) -> (Call, Option<Duration>) {
    // Owned, and moved into the call's future: a call given up on (timed out, interrupted)
    // runs on in its task and keeps its permit until it ends, so that a limit of `n` calls is
    // never exceeded by calls still running after their deadline.
    // No new call while the handler's room for calls given up on is full.
    if !slot.abandoned.room(stop).await {
        return (Call::NotStarted, None);
    }
    let permit = match &slot.permits {
        Some(permits) => tokio::select! {
            biased;
            permit = permits.clone().acquire_owned() => Some(permit.expect("never closed")),
            () = stop.cancelled() => return (Call::NotStarted, None),
        },
        None => None,
    };
    if interrupt.is_cancelled() {
        return (Call::NotStarted, None);
    }
    let call_cancelled = Arc::new(CallCancellation::new(stop.clone()));
    let ctx = Context::for_call(
        envelope.clone(),
        slot.name.clone(),
        call_cancelled.clone(),
        publisher.clone(),
    );
    let ctx = match slot.callee {
        Callee::Job(..) => ctx.for_scheduled_run(),
        Callee::Handler(_) => ctx,
    };
    let give_up = move || call_cancelled.give_up();
    let started = Instant::now();
    // Counted until the call's future ends: an abandoned call runs on in its task, and still
    // counts there (and holds its permit there).
    let held = (slot.metrics.call_started(), permit);
    // The call's future (holding `held` to its end) and its span.
    let (call, span): (BoxFuture<'static, HandlerOutcome>, tracing::Span) = match &slot.callee {
        Callee::Handler(handler) => {
            let span = if !trace::spans_wanted() {
                tracing::Span::none()
            } else {
                tracing::info_span!(
                    "hexeract.handle",
                    message_id = %envelope.id,
                    message_type = %envelope.message_type,
                    handler = %slot.name,
                    attempt = envelope.attempt,
                    trace_id = envelope.trace_id().map(tracing::field::display),
                    span_id = envelope.trace_id().map(|_| tracing::field::display(ctx.span_id())),
                    otel.name = tracing::field::Empty,
                    otel.kind = tracing::field::Empty,
                )
            };
            trace::consume(
                &span,
                envelope,
                transport,
                &slot.name,
                slot.consumer_group.as_deref(),
            );
            let handler = handler.clone();
            // The context shares the envelope with the world: no copy per call.
            let call = Box::pin(async move {
                let _held = held;
                handler.call(&ctx).await
            });
            (call, span)
        }
        Callee::Job(run, chain) => {
            let span = tracing::info_span!(
                "hexeract.schedule",
                job = %slot.name,
                fire_at = ctx.scheduled_for().map(tracing::field::display),
                attempt = envelope.attempt,
            );
            let (run, chain) = (run.clone(), chain.clone());
            let call = Box::pin(async move {
                let _held = held;
                Next::new(&chain, Endpoint::Job(&*run)).run(&ctx).await
            });
            (call, span)
        }
    };
    #[cfg(feature = "opentelemetry")]
    let traced = matches!(slot.callee, Callee::Handler(_)).then(|| span.clone());
    let call = call_boxed(
        call,
        give_up,
        slot.timeout,
        interrupt,
        Some(&slot.abandoned),
    )
    .instrument(span)
    .await;
    #[cfg(feature = "opentelemetry")]
    if let Some(traced) = &traced {
        ended(traced, &call);
    }
    if let Some(probe) = slot.probe.get() {
        probe.progress();
    }
    (call, Some(started.elapsed()))
}

/// Records on the call's span how it ended.
#[cfg(feature = "opentelemetry")]
fn ended(span: &tracing::Span, call: &Call) {
    let (outcome, detail) = match call {
        Call::Finished(HandlerOutcome::Ack) => (trace::Outcome::Handled, None),
        Call::Finished(HandlerOutcome::Retry { detail, .. }) => {
            (trace::Outcome::Failed, Some(detail.as_str()))
        }
        Call::Finished(HandlerOutcome::DeadLetter { detail, .. }) => {
            (trace::Outcome::Rejected, Some(detail.as_str()))
        }
        Call::Interrupted | Call::NotStarted => (trace::Outcome::Interrupted, None),
    };
    trace::ended(span, outcome, detail);
}

/// Calls `handler` once, outside any world (the test harness): [`call_boxed`] with the
/// handler's own future.
pub(crate) async fn call_handler(
    handler: Arc<RegisteredHandler>,
    ctx: Context,
    timeout: Duration,
) -> Call {
    call_alone(ctx, timeout, move |ctx| {
        Box::pin(async move { handler.call(&ctx).await })
    })
    .await
}

/// Runs a scheduled job once, outside any world (the test harness): its middleware `chain`
/// around the job, as the scheduler's slot does.
pub(crate) async fn call_job(
    run: Arc<dyn ErasedJob>,
    chain: Chain,
    ctx: Context,
    timeout: Duration,
) -> Call {
    call_alone(ctx, timeout, move |ctx| {
        Box::pin(async move { Next::new(&chain, Endpoint::Job(&*run)).run(&ctx).await })
    })
    .await
}

/// [`call_boxed`] for a call nothing interrupts: timed out, it is given up on through its
/// context's cancellation.
async fn call_alone(
    ctx: Context,
    timeout: Duration,
    call: impl FnOnce(Context) -> BoxFuture<'static, HandlerOutcome>,
) -> Call {
    let call_cancelled = ctx.cancellation().clone();
    let never = CancellationToken::new();
    call_boxed(
        call(ctx),
        move || call_cancelled.cancel(),
        timeout,
        &never,
        None,
    )
    .await
}

/// Runs one call to its end.
///
/// The call is polled once where it stands: a handler that does not wait (most do their work
/// and return) finishes there, at the cost of a function call. One that waits moves into a task
/// of its own and runs there under its timeout.
///
/// A call that times out or is interrupted is *abandoned*, not dropped: its task runs on, and
/// `give_up` fires what its context's `cancellation()` returns, so that a cooperative handler
/// stops. Dropping a handler's future in the middle of `pool.begin()` can return a
/// pooled connection still inside a transaction (sqlx #4393), which would poison the pool for
/// everyone; an abandoned call ends its transaction itself. A panic, wherever it happens in the
/// call, is caught. An abandoned call is counted in `abandoned` (the handler's) until its task
/// ends.
async fn call_boxed(
    mut call: BoxFuture<'static, HandlerOutcome>,
    give_up: impl FnOnce(),
    timeout: Duration,
    interrupt: &CancellationToken,
    abandoned: Option<&Abandoned>,
) -> Call {
    let first_poll = std::future::poll_fn(|cx| {
        Poll::Ready(panic::catch_unwind(AssertUnwindSafe(|| {
            call.as_mut().poll(cx)
        })))
    })
    .await;
    match first_poll {
        Ok(Poll::Ready(outcome)) => return Call::Finished(outcome),
        Err(panic) => {
            // A future that panicked is not polled again; dropping it may panic too.
            let _ = panic::catch_unwind(AssertUnwindSafe(move || drop(call)));
            return Call::Finished(panicked(&*panic));
        }
        Ok(Poll::Pending) => {}
    }
    let mut task = tokio::spawn(call.instrument(tracing::Span::current()));
    let finished = tokio::select! {
        biased;
        () = interrupt.cancelled() => None,
        result = tokio::time::timeout(timeout, &mut task) => Some(result),
    };
    if let (None | Some(Err(_)), Some(abandoned)) = (&finished, abandoned) {
        abandoned.keep(task);
    }
    match finished {
        Some(Ok(Ok(outcome))) => Call::Finished(outcome),
        Some(Ok(Err(error))) if error.is_panic() => Call::Finished(panicked(&*error.into_panic())),
        // The executor is shutting down and cancelled the task.
        Some(Ok(Err(_))) => Call::Interrupted,
        Some(Err(_elapsed)) => {
            give_up();
            Call::Finished(HandlerOutcome::Retry {
                reason: Reason::HANDLER_TIMEOUT,
                detail: format!("handler did not finish within {timeout:?}"),
                after: None,
            })
        }
        None => {
            give_up();
            Call::Interrupted
        }
    }
}

fn panicked(panic: &(dyn Any + Send)) -> HandlerOutcome {
    HandlerOutcome::Retry {
        reason: Reason::HANDLER_PANICKED,
        detail: format!("handler panicked: {}", panic_message(panic)),
        after: None,
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    if let Some(message) = panic.downcast_ref::<&'static str>() {
        message
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message
    } else {
        "(a panic payload that is not a string)"
    }
}

use crate::policy::SETTLE_AFTER_GRACE;

/// Runs a loop until it returns, or until its hard shutdown deadline passes: `grace` +
/// [`SETTLE_AFTER_GRACE`] after `cancel` fires; `Ok(())` when the deadline cut it short
/// (logged, with `what` naming the loop). The loop's future is dropped there: its store calls begin
/// their transactions through `store::begin`, so none is left open on a pooled connection.
pub(crate) async fn stop_by_deadline<E>(
    what: &'static str,
    cancel: &CancellationToken,
    grace: Duration,
    running: impl Future<Output = Result<(), E>>,
) -> Result<(), E> {
    let deadline = grace.saturating_add(SETTLE_AFTER_GRACE);
    tokio::select! {
        biased;
        stopped = running => stopped,
        () = async {
            cancel.cancelled().await;
            tokio::time::sleep(deadline).await;
        } => {
            tracing::warn!(
                worker = what,
                ?deadline,
                "not stopped within its shutdown deadline (the grace and {SETTLE_AFTER_GRACE:?} to \
                 settle): stopping now; what it still held runs again once its lease ends or its \
                 channel closes"
            );
            Ok(())
        }
    }
}

/// Fires `interrupt` once `grace` has passed after `cancel`.
pub(crate) fn spawn_grace_timer(
    cancel: CancellationToken,
    interrupt: CancellationToken,
    grace: Duration,
) -> tokio_util::sync::DropGuard {
    let stop_timer = CancellationToken::new();
    let guard = stop_timer.clone().drop_guard();
    tokio::spawn(async move {
        tokio::select! {
            () = stop_timer.cancelled() => {}
            () = async { cancel.cancelled().await; tokio::time::sleep(grace).await } => interrupt.cancel(),
        }
    });
    guard
}
