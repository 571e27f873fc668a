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
) -> Option<Taken<T>> {
    match crate::state::take::<T>(states, &mut Vec::new()) {
        Some(value) => Some(Taken(Arc::new(move || value.clone()))),
        None => {
            missing.push(written);
            None
        }
    }
}

/// A state parameter written `State<T>`: [`state`], with the bound on `T`, so that a `T` that
/// cannot be state is reported as such.
pub fn state_of<T: StateValue>(
    states: &States,
    missing: &mut Vec<&'static str>,
    written: &'static str,
) -> Option<Taken<crate::State<T>>> {
    state::<crate::State<T>>(states, missing, written)
}

#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be state: it must be `Clone + Send + Sync + 'static`",
    label = "state is cloned for each call, and calls run on any thread",
    note = "derive `Clone`, and hold what is not thread-safe behind a type that is: `Arc` for `Rc`, `Mutex` or `RwLock` for `RefCell` or `Cell`"
)]
pub trait StateValue: Clone + Send + Sync + 'static {}

#[diagnostic::do_not_recommend]
impl<T: Clone + Send + Sync + 'static> StateValue for T {}

/// A state value an adapter holds: a clone of it for each call. `Clone + Send + Sync` whatever
/// `T` is, so that a type that is not state is reported once, by [`state`].
pub struct Taken<T>(Arc<dyn Fn() -> T + Send + Sync>);

impl<T> Taken<T> {
    /// A clone of the value.
    pub fn get(&self) -> T {
        (self.0)()
    }
}

impl<T> Clone for Taken<T> {
    fn clone(&self) -> Self {
        Taken(Arc::clone(&self.0))
    }
}

impl<T> std::fmt::Debug for Taken<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(std::any::type_name::<T>())
    }
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

/// What `#[derive(Message)]` needs of serde, checked once with a headline that says what to
/// derive.
pub const fn message_serde<T: MessageSerde>() {}

#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a message: it does not implement serde's `Serialize` and `Deserialize`",
    label = "needs `#[derive(serde::Serialize, serde::Deserialize)]`",
    note = "a message travels as JSON: derive serde's traits next to `Message`, `#[derive(serde::Serialize, serde::Deserialize, hexeract::Message)]`"
)]
pub trait MessageSerde: serde::Serialize + serde::de::DeserializeOwned {}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned> MessageSerde for T {}

/// What `#[derive(Message)]` needs of threads, checked once with a headline of its own.
pub const fn message_thread_safe<T: MessageThreadSafe>() {}

#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a message: it must be `Send + Sync + 'static`",
    label = "messages are handled and published on any thread",
    note = "hold shared data as `Arc`, not `Rc`, behind `Mutex` or `RwLock`, not `RefCell` or `Cell`; and own it (`String`, not `&str`)"
)]
pub trait MessageThreadSafe: Send + Sync + 'static {}

#[diagnostic::do_not_recommend]
impl<T: Send + Sync + 'static> MessageThreadSafe for T {}

/// Converts the scheduler's `&Context` into a scheduled job's parameter; only `&Context`
/// qualifies, which turns a wrong parameter type into one error that speaks of jobs.
pub fn job_context<'a, T: JobContext<'a>>(ctx: &'a Context) -> T {
    T::from_context(ctx)
}

#[diagnostic::on_unimplemented(
    message = "the parameter of a scheduled job must be `&hexeract::Context`, not `{Self}`",
    label = "expected `&Context`",
    note = "a scheduled job is `async fn name(ctx: &hexeract::Context) -> Result<(), E>`, with any state after the context: `async fn name(ctx: &Context, db: State<PgPool>)`"
)]
pub trait JobContext<'a> {
    fn from_context(ctx: &'a Context) -> Self;
}

#[diagnostic::do_not_recommend]
impl<'a> JobContext<'a> for &'a Context {
    fn from_context(ctx: &'a Context) -> Self {
        ctx
    }
}

/// One state parameter of a scheduled job: [`state`], with an error that speaks of jobs.
pub fn job_state<T: JobState>(
    states: &States,
    missing: &mut Vec<&'static str>,
    written: &'static str,
) -> Option<Taken<T>> {
    state::<T>(states, missing, written)
}

#[diagnostic::on_unimplemented(
    message = "the parameters after a scheduled job's `&Context` are state, `State<T>`, not `{Self}`",
    label = "expected `State<…>`",
    note = "take it as `name: State<T>` (or `State(name): State<T>`) and give the value to the scheduler with `.state(value)`, e.g. `async fn expire_carts(ctx: &Context, db: State<PgPool>)` and `App::new(config).state(pool)`"
)]
pub trait JobState: FromStates {}

#[diagnostic::do_not_recommend]
impl<T: FromStates> JobState for T {}

/// A scheduled job's return value as its outcome; named at the job's return type, so that an
/// unsupported one is reported there, as a job's.
pub fn job_outcome<O: JobOutcome>(output: O) -> HandlerOutcome {
    output.into_outcome()
}

#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a scheduled job's return type",
    label = "unsupported return type",
    note = "a scheduled job returns `Result<(), E>` where E implements Display (std::error::Error types, anyhow::Error, Box<dyn Error>, String; `Err` retries the run), or `hexeract::HandlerOutcome`"
)]
pub trait JobOutcome: IntoOutcome {}

#[diagnostic::do_not_recommend]
impl<O: IntoOutcome> JobOutcome for O {}

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

/// Whether a handler's declared message and its argument type's `MESSAGE_TYPE` are the same,
/// as a type: the handler's expansion requires a trait of its own, implemented for `true` only,
/// whose message names both.
#[derive(Debug)]
pub struct SameMessageType<const SAME: bool>;

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
