//! One handler call, made safe to run: a panic or a timeout becomes a failed attempt instead of
//! taking the worker down, and a call given up on is left to finish, never dropped mid-way.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::Context;
use crate::outcome::HandlerOutcome;
use crate::reason::Reason;
use crate::registry::RegisteredHandler;

/// How a call ended.
pub(crate) enum Call {
    /// The handler returned, panicked or timed out; the outcome says which.
    Finished(HandlerOutcome),
    /// `interrupt` fired first: the call was given up on and says nothing about the message.
    Interrupted,
}

/// Calls `handler` once.
///
/// The call is polled once where it stands: a handler that does not wait (most do their work
/// and return) finishes there, at the cost of a function call. One that waits moves into a task
/// of its own and runs there under its timeout.
///
/// A call that times out or is interrupted is *abandoned*, not dropped: its task runs on, and
/// `ctx.cancellation()` fires so that a cooperative handler stops. Dropping a handler's future
/// in the middle of `pool.begin()` can return a pooled connection still inside a transaction
/// (sqlx #4393), which would poison the pool for everyone; an abandoned call ends its
/// transaction itself. A panic, wherever it happens in the call, is caught.
pub(crate) async fn call_handler(
    handler: Arc<RegisteredHandler>,
    ctx: Context,
    timeout: Duration,
    interrupt: &CancellationToken,
) -> Call {
    let call_cancelled = ctx.cancellation().clone();
    // The context carries the envelope: one copy per call.
    let call: BoxFuture<'static, HandlerOutcome> =
        Box::pin(async move { handler.handler().handle(ctx.envelope(), &ctx).await });
    call_boxed(call, call_cancelled, timeout, interrupt).await
}

/// [`call_handler`] for any call (a scheduled job's): `call_cancelled` is what its context's
/// `cancellation()` returns, fired when the call is abandoned.
pub(crate) async fn call_boxed(
    mut call: BoxFuture<'static, HandlerOutcome>,
    call_cancelled: CancellationToken,
    timeout: Duration,
    interrupt: &CancellationToken,
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
    match finished {
        Some(Ok(Ok(outcome))) => Call::Finished(outcome),
        Some(Ok(Err(error))) if error.is_panic() => Call::Finished(panicked(&*error.into_panic())),
        // The executor is shutting down and cancelled the task.
        Some(Ok(Err(_))) => Call::Interrupted,
        Some(Err(_elapsed)) => {
            call_cancelled.cancel();
            Call::Finished(HandlerOutcome::Retry {
                reason: Reason::HANDLER_TIMEOUT,
                detail: format!("handler did not finish within {timeout:?}"),
                after: None,
            })
        }
        None => {
            call_cancelled.cancel();
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
