#![doc = include_str!("../../docs/middleware.md")]

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::future::BoxFuture;

use crate::context::Context;
use crate::handler::ErasedHandler;
use crate::outcome::HandlerOutcome;

/// Code around every handler call: see the [module](crate::middleware) for the order and the
/// rules.
pub trait Middleware: Send + Sync + 'static {
    /// Handles one call: `next.run(ctx).await` calls the rest of the chain and the handler.
    fn handle(&self, ctx: &Context, next: Next<'_>) -> impl Future<Output = HandlerOutcome> + Send;
}

/// A [`Middleware`] with its future boxed: what chains hold.
pub(crate) trait ErasedMiddleware: Send + Sync + 'static {
    fn handle_boxed<'a>(
        &'a self,
        ctx: &'a Context,
        next: Next<'a>,
    ) -> BoxFuture<'a, HandlerOutcome>;
}

impl<M: Middleware> ErasedMiddleware for M {
    fn handle_boxed<'a>(
        &'a self,
        ctx: &'a Context,
        next: Next<'a>,
    ) -> BoxFuture<'a, HandlerOutcome> {
        Box::pin(self.handle(ctx, next))
    }
}

/// A scheduled job's body, with its state: what the scheduler calls. Not public API: the
/// `#[scheduled]` macro implements it.
#[doc(hidden)]
pub trait ErasedJob: Send + Sync + 'static {
    /// One run.
    fn run<'a>(&'a self, ctx: &'a Context) -> BoxFuture<'a, HandlerOutcome>;
}

/// What a chain ends in.
#[derive(Clone, Copy)]
pub(crate) enum Endpoint<'a> {
    Handler(&'a dyn ErasedHandler),
    Job(&'a dyn ErasedJob),
}

/// The rest of the chain after a middleware, and the handler at its end.
pub struct Next<'a> {
    chain: &'a [Arc<dyn ErasedMiddleware>],
    endpoint: Endpoint<'a>,
}

impl<'a> Next<'a> {
    #[inline]
    pub(crate) fn new(chain: &'a [Arc<dyn ErasedMiddleware>], endpoint: Endpoint<'a>) -> Next<'a> {
        Next { chain, endpoint }
    }

    /// Calls the next middleware, or the handler after the last one.
    #[inline]
    pub fn run(self, ctx: &'a Context) -> impl Future<Output = HandlerOutcome> + Send + 'a {
        match self.chain.split_first() {
            Some((first, rest)) => first.handle_boxed(ctx, Next::new(rest, self.endpoint)),
            None => match self.endpoint {
                Endpoint::Handler(handler) => handler.handle(ctx.envelope(), ctx),
                Endpoint::Job(job) => job.run(ctx),
            },
        }
    }
}

impl fmt::Debug for Next<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Next")
            .field("middleware_left", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// A chain of middleware, outermost first.
pub(crate) type Chain = Arc<[Arc<dyn ErasedMiddleware>]>;

/// The middleware a builder was given: the worker's, and each handler's own by name.
#[derive(Clone, Default)]
pub(crate) struct Middlewares {
    global: Vec<Arc<dyn ErasedMiddleware>>,
    by_handler: Vec<(Cow<'static, str>, Arc<dyn ErasedMiddleware>)>,
}

impl Middlewares {
    /// Around every handler and job, inside those added before.
    pub(crate) fn add(&mut self, middleware: impl Middleware) {
        self.global.push(Arc::new(middleware));
    }

    /// Around the handler (or job) named `name`, inside the worker's.
    pub(crate) fn add_for(
        &mut self,
        name: impl Into<Cow<'static, str>>,
        middleware: impl Middleware,
    ) {
        self.by_handler.push((name.into(), Arc::new(middleware)));
    }

    /// Adds `other`'s after this one's.
    pub(crate) fn extend(&mut self, other: Middlewares) {
        self.global.extend(other.global);
        self.by_handler.extend(other.by_handler);
    }

    /// The chain of the handler named `name`: the worker's, then its own by name.
    pub(crate) fn chain_for(&self, name: &str) -> Chain {
        self.global
            .iter()
            .chain(
                self.by_handler
                    .iter()
                    .filter(|(handler, _)| handler == name)
                    .map(|(_, middleware)| middleware),
            )
            .cloned()
            .collect()
    }

    /// Moves the per-handler middleware whose name `take` accepts into a new set, which has
    /// the worker's middleware too (a worker's handlers and its scheduler's jobs share those).
    pub(crate) fn split_off(&mut self, take: impl Fn(&str) -> bool) -> Middlewares {
        let (taken, kept) = std::mem::take(&mut self.by_handler)
            .into_iter()
            .partition(|(name, _)| take(name));
        self.by_handler = kept;
        Middlewares {
            global: self.global.clone(),
            by_handler: taken,
        }
    }

    /// The handler names given to `add_for`, for a check that each names a handler.
    pub(crate) fn named(&self) -> impl Iterator<Item = &str> {
        self.by_handler.iter().map(|(name, _)| name.as_ref())
    }
}

impl fmt::Debug for Middlewares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Middlewares")
            .field("global", &self.global.len())
            .field(
                "by_handler",
                &self
                    .by_handler
                    .iter()
                    .map(|(name, _)| name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}
