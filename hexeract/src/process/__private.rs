//! What generated code refers to. Not public API: names here change without notice.

pub use crate::context::Context;
pub use crate::handler::{ErasedHandler, Handler, TypedHandler};
pub use crate::message::{AggregateKey, Message};
pub use crate::middleware::ErasedJob;
pub use crate::outcome::{HandlerOutcome, IntoOutcome};
pub use crate::registry::{HandlerRegistration, MakeHandler, RegisteredHandler};
pub use crate::schedule::{CatchUp, MakeJob, ScheduleRegistration};
pub use crate::state::{FromStates, States};
pub use futures_util::future::BoxFuture;
pub use inventory;
pub use serde;
pub use std::sync::Arc;

/// What `#[handler]` needs from the argument type, in one call: its `MESSAGE_TYPE` (checked
/// against the declared one in const evaluation) and the handler's constructor. Every bound on
/// the argument type is here, so a type that is not a `Message` is reported once.
pub const fn typed<M: Message, H: Handler<M> + Build>() -> Typed {
    Typed {
        message_type: M::MESSAGE_TYPE,
        constructor: construct::<M, H>,
    }
}

#[derive(Debug)]
pub struct Typed {
    pub message_type: &'static str,
    pub constructor: crate::registry::MakeHandler,
}

fn construct<M: Message, H: Handler<M> + Build>(
    states: &States,
    missing: &mut Vec<&'static str>,
) -> Option<Arc<dyn ErasedHandler>> {
    let handler = H::build(states, missing)?;
    Some(Arc::new(crate::handler::TypedHandler::<M, H>::new(handler)))
}

/// A handler or job adapter, built from its worker's state: each `State<T>` parameter taken
/// once, here, not per call.
pub trait Build: Sized {
    /// The adapter, or `None` with the missing types pushed to `missing`.
    fn build(states: &States, missing: &mut Vec<&'static str>) -> Option<Self>;
}

/// One state parameter of a handler or job, taken from `states`, or named in `missing` as the
/// function's signature writes it (`written`).
pub fn state<T: FromStates>(
    states: &States,
    missing: &mut Vec<&'static str>,
    written: &'static str,
) -> Option<T> {
    let taken = crate::state::take(states, &mut Vec::new());
    if taken.is_none() {
        missing.push(written);
    }
    taken
}

/// The constructor of a job adapter, for its registration.
pub const fn job<J: ErasedJob + Build>() -> MakeJob {
    construct_job::<J>
}

fn construct_job<J: ErasedJob + Build>(
    states: &States,
    missing: &mut Vec<&'static str>,
) -> Option<Arc<dyn ErasedJob>> {
    Some(Arc::new(J::build(states, missing)?))
}

/// Converts the runtime's `&Context` into a handler's second parameter; only `&Context`
/// qualifies, which turns a wrong parameter type into one readable error.
pub fn context_arg<'a, T: ContextArg<'a>>(ctx: &'a Context) -> T {
    T::from_context(ctx)
}

#[diagnostic::on_unimplemented(
    message = "the second parameter of a handler must be `&hexeract::Context`, not `{Self}`",
    label = "expected `&Context`",
    note = "a handler is `async fn name(message: M, ctx: &hexeract::Context) -> Result<(), E>`"
)]
pub trait ContextArg<'a> {
    fn from_context(ctx: &'a Context) -> Self;
}

impl<'a> ContextArg<'a> for &'a Context {
    fn from_context(ctx: &'a Context) -> Self {
        ctx
    }
}

/// String equality in const evaluation (`==` on `str` is not const).
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A message assembled in const evaluation, for compile errors that quote values the macro
/// cannot see (another type's `MESSAGE_TYPE`).
#[derive(Debug)]
pub struct ConstMessage {
    bytes: [u8; 1024],
    len: usize,
}

impl ConstMessage {
    pub const fn new() -> ConstMessage {
        ConstMessage {
            bytes: [0; 1024],
            len: 0,
        }
    }

    /// Appends `text`; what does not fit is cut (at a character boundary, by `as_str`).
    pub const fn push(mut self, text: &str) -> ConstMessage {
        let text = text.as_bytes();
        let mut i = 0;
        while i < text.len() && self.len < self.bytes.len() - 4 {
            self.bytes[self.len] = text[i];
            self.len += 1;
            i += 1;
        }
        self
    }

    /// Appends `text` in double quotes.
    pub const fn push_quoted(self, text: &str) -> ConstMessage {
        self.push("\"").push(text).push("\"")
    }

    pub const fn as_str(&self) -> &str {
        let (used, _) = self.bytes.split_at(self.len);
        match core::str::from_utf8(used) {
            Ok(text) => text,
            Err(error) => match core::str::from_utf8(used.split_at(error.valid_up_to()).0) {
                Ok(text) => text,
                Err(_) => "",
            },
        }
    }
}

impl Default for ConstMessage {
    fn default() -> Self {
        ConstMessage::new()
    }
}

/// A `#[handler]` fn's return value as the typed [`Handler`](crate::Handler)'s result: an ack
/// is `Ok(())`, any other outcome the `Err` that carries it. Named at the fn's return type, so
/// that an unsupported one is reported there.
pub fn outcome_result<O: IntoOutcome>(output: O) -> Result<(), HandlerOutcome> {
    output.into_outcome().into_result()
}

/// The call of a `#[handler]` fn, its output turned into a result by `result`: no future of its
/// own around the fn's, so that one that is not `Send` is reported as the fn's.
pub fn outcome_of<F: std::future::Future>(
    call: F,
    result: ToResult<F::Output>,
) -> futures_util::future::Map<F, ToResult<F::Output>> {
    futures_util::FutureExt::map(call, result)
}

/// How a `#[handler]` fn's output becomes a result ([`outcome_result`]).
pub type ToResult<O> = fn(O) -> Result<(), HandlerOutcome>;
