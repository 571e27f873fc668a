//! One handler call, made safe to run: a panic or a timeout becomes a failed attempt instead of
//! taking the worker down.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;

use crate::context::Context;
use crate::envelope::Envelope;
use crate::handler::ErasedHandler;
use crate::outcome::HandlerOutcome;
use crate::reason::Reason;

/// Calls `handler` once. Only the handler's own future is raced against the timeout, so a
/// timeout never drops a transaction that belongs to the framework.
pub(crate) async fn call_handler(
    handler: &dyn ErasedHandler,
    envelope: &Envelope,
    ctx: &Context,
    timeout: Duration,
) -> HandlerOutcome {
    let call = AssertUnwindSafe(handler.handle(envelope, ctx)).catch_unwind();
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(panic)) => HandlerOutcome::Retry {
            reason: Reason::HANDLER_PANICKED,
            detail: format!("handler panicked: {}", panic_message(&*panic)),
            after: None,
        },
        Err(_elapsed) => HandlerOutcome::Retry {
            reason: Reason::HANDLER_TIMEOUT,
            detail: format!("handler did not finish within {timeout:?}"),
            after: None,
        },
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
