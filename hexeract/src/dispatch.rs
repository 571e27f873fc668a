//! One handler call, made safe to run: a panic or a timeout becomes a failed attempt instead of
//! taking the worker down.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::envelope::Envelope;
use crate::handler::ErasedHandler;
use crate::outcome::HandlerOutcome;
use crate::reason::Reason;

/// How a call ended.
pub(crate) enum Call {
    /// The handler returned, panicked or timed out; the outcome says which.
    Finished(HandlerOutcome),
    /// `interrupt` fired first: the call was abandoned and says nothing about the message.
    Interrupted,
}

/// Calls `handler` once. Only the handler's own future is raced against the timeout and the
/// interrupt, so neither ever drops a transaction that belongs to the framework. The race runs
/// inside `catch_unwind`, so a handler whose future panics while being dropped (on a timeout or
/// an interrupt) is caught too.
pub(crate) async fn call_handler(
    handler: &dyn ErasedHandler,
    envelope: &Envelope,
    ctx: &Context,
    timeout: Duration,
    interrupt: &CancellationToken,
) -> Call {
    let race = async {
        tokio::select! {
            biased;
            () = interrupt.cancelled() => None,
            result = tokio::time::timeout(timeout, handler.handle(envelope, ctx)) => Some(result),
        }
    };
    match AssertUnwindSafe(race).catch_unwind().await {
        Ok(Some(Ok(outcome))) => Call::Finished(outcome),
        Ok(Some(Err(_elapsed))) => Call::Finished(HandlerOutcome::Retry {
            reason: Reason::HANDLER_TIMEOUT,
            detail: format!("handler did not finish within {timeout:?}"),
            after: None,
        }),
        Ok(None) => Call::Interrupted,
        // Dropping the interrupted call panicked: it was abandoned all the same.
        Err(_) if interrupt.is_cancelled() => Call::Interrupted,
        Err(panic) => Call::Finished(HandlerOutcome::Retry {
            reason: Reason::HANDLER_PANICKED,
            detail: format!("handler panicked: {}", panic_message(&*panic)),
            after: None,
        }),
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
