//! The registry: every handler of the program, by message type, collected at link time.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::context::Context;
use crate::envelope::Envelope;
use crate::handler::{ErasedHandler, Handler, TypedHandler};
use crate::message::Message;
use crate::middleware::{Chain, ErasedMiddleware, Middleware, Middlewares};
use crate::outcome::HandlerOutcome;
use crate::state::States;

/// How a registration builds its handler from the worker's state: `None` when a type it takes
/// is missing (pushed to the list).
#[doc(hidden)]
pub type MakeHandler = fn(&States, &mut Vec<&'static str>) -> Option<Arc<dyn ErasedHandler>>;

/// What `#[handler]` submits to `inventory`: plain data and a constructor, since statics cannot
/// hold an `Arc`.
#[doc(hidden)]
#[derive(Debug)]
pub struct HandlerRegistration {
    pub name: &'static str,
    pub message_type: &'static str,
    pub file: &'static str,
    pub line: u32,
    pub column: u32,
    pub timeout: Option<Duration>,
    pub concurrency: Option<u32>,
    pub make: MakeHandler,
}

inventory::collect!(HandlerRegistration);

/// Where a handler was declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Source file, as `file!()` gives it.
    pub file: &'static str,
    /// Line of the function's name.
    pub line: u32,
    /// Column of the function's name.
    pub column: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// A handler's description: for listings, diagnostics and the runtime's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerInfo {
    /// The subscriber name: `module::path::fn` unless given with `name = "…"`.
    pub name: Cow<'static, str>,
    /// The message type it handles.
    pub message_type: &'static str,
    /// Where `#[handler]` was written; `None` for handlers registered in code.
    pub location: Option<Location>,
    /// Its own timeout, overriding the runtime's default.
    pub timeout: Option<Duration>,
    /// Its own concurrency limit, overriding the runtime's default.
    pub concurrency: Option<NonZeroU32>,
}

impl HandlerInfo {
    fn origin(&self) -> String {
        match &self.location {
            Some(location) => location.to_string(),
            None => "registered in code".to_owned(),
        }
    }
}

/// Settings for a handler registered in code with
/// [`MemoryWorkerBuilder::register_handler_with`](crate::MemoryWorkerBuilder::register_handler_with).
#[derive(Clone, Default)]
#[must_use = "options do nothing until given to `register_handler_with`"]
pub struct HandlerOptions {
    name: Option<Cow<'static, str>>,
    timeout: Option<Duration>,
    concurrency: Option<NonZeroU32>,
    middleware: Vec<Arc<dyn ErasedMiddleware>>,
}

impl fmt::Debug for HandlerOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerOptions")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .field("concurrency", &self.concurrency)
            .field("middleware", &self.middleware.len())
            .finish()
    }
}

impl HandlerOptions {
    /// Default options: the name is the handler type's name.
    pub fn new() -> HandlerOptions {
        HandlerOptions::default()
    }

    /// The subscriber name (queue names derive from it).
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> HandlerOptions {
        self.name = Some(name.into());
        self
    }

    /// The handler's own timeout.
    pub fn timeout(mut self, timeout: Duration) -> HandlerOptions {
        self.timeout = Some(timeout);
        self
    }

    /// How many messages this handler may process at once.
    pub fn concurrency(mut self, limit: NonZeroU32) -> HandlerOptions {
        self.concurrency = Some(limit);
        self
    }

    /// Middleware around this handler alone, inside the worker's (see [`crate::middleware`]).
    pub fn middleware(mut self, middleware: impl Middleware) -> HandlerOptions {
        self.middleware.push(Arc::new(middleware));
        self
    }
}

/// A handler registered in code, applied to a registry when a builder builds.
type Registration = Box<dyn FnOnce(&mut Registry) -> Result<(), RegistryError> + Send>;

/// The handlers a worker's builder was given: every `#[handler]` of the program or a registry
/// of the caller's, plus those registered in code. Every builder keeps one.
pub(crate) struct HandlerSet {
    /// `None`: every `#[handler]` of the program.
    base: Option<Registry>,
    added: Vec<Registration>,
    /// What handlers take as `State<T>`.
    pub(crate) states: States,
    /// The types `.state(value)` was given a second value of, reported when the worker builds.
    given_twice: Vec<&'static str>,
    /// What runs around them.
    pub(crate) middleware: Middlewares,
}

impl HandlerSet {
    /// No handlers but those registered in code.
    pub(crate) fn none() -> HandlerSet {
        HandlerSet {
            base: Some(Registry::new()),
            added: Vec::new(),
            states: States::new(),
            given_twice: Vec::new(),
            middleware: Middlewares::default(),
        }
    }

    /// Every `#[handler]` of the program.
    pub(crate) fn program() -> HandlerSet {
        HandlerSet {
            base: None,
            added: Vec::new(),
            states: States::new(),
            given_twice: Vec::new(),
            middleware: Middlewares::default(),
        }
    }

    /// Adds the state a builder's `.state(value)` gave; a second value of one type is
    /// remembered, to stop the build ([`check_states`](HandlerSet::check_states)), rather than
    /// replacing the first unseen.
    pub(crate) fn give_state<T: Clone + Send + Sync + 'static>(&mut self, value: T) {
        let type_name = std::any::type_name::<T>();
        if self.states.insert(value).is_some() && !self.given_twice.contains(&type_name) {
            self.given_twice.push(type_name);
        }
    }

    /// `Err` naming every type `.state(value)` was given twice.
    pub(crate) fn check_states(&self) -> Result<(), RegistryError> {
        if self.given_twice.is_empty() {
            Ok(())
        } else {
            Err(RegistryError::StateGivenTwice(self.given_twice.clone()))
        }
    }

    /// Starts from every `#[handler]` of the program.
    pub(crate) fn use_program(&mut self) {
        self.base = None;
    }

    /// Starts from `registry`.
    pub(crate) fn use_registry(&mut self, registry: Registry) {
        self.base = Some(registry);
    }

    /// Adds a handler written as a type.
    pub(crate) fn add<M: Message, H: Handler<M>>(&mut self, handler: H, options: HandlerOptions) {
        self.added.push(Box::new(move |registry| {
            registry.register::<M, H>(handler, options)
        }));
    }

    /// The registry: the base with the handlers added, those `keep` refuses left out, each
    /// built with its state and given its middleware. Every duplicate name, and every missing
    /// state, is reported at once; state given twice stops it first.
    pub(crate) fn build(
        self,
        keep: Option<&dyn Fn(&HandlerInfo) -> bool>,
    ) -> Result<Registry, RegistryError> {
        self.check_states()?;
        let mut registry = match self.base {
            Some(registry) => registry,
            None => Registry::from_inventory()?,
        };
        if let Some(keep) = keep {
            registry.retain(|info| keep(info));
        }
        let mut duplicates = Vec::new();
        for registration in self.added {
            match registration(&mut registry) {
                Ok(()) => {}
                Err(RegistryError::DuplicateNames(found)) => duplicates.extend(found),
                Err(other) => return Err(other),
            }
        }
        if duplicates.is_empty() {
            registry.provide(&self.states, &self.middleware)
        } else {
            Err(RegistryError::DuplicateNames(duplicates))
        }
    }
}

/// One handler in the registry: its description and the erased handler to call.
pub struct RegisteredHandler {
    info: HandlerInfo,
    handler: Arc<dyn ErasedHandler>,
    /// How a `#[handler]` is built again with the worker's state; `None` for a handler
    /// registered in code (it holds its state itself).
    make: Option<MakeHandler>,
    /// Every middleware around it, once its worker is built.
    chain: Chain,
}

impl RegisteredHandler {
    fn new(info: HandlerInfo, handler: Arc<dyn ErasedHandler>) -> RegisteredHandler {
        RegisteredHandler {
            info,
            handler,
            make: None,
            chain: Arc::from([]),
        }
    }

    /// One call of the handler with `ctx`'s envelope, through its middleware (what a worker
    /// runs, without the worker's timeout, span and panic catch).
    #[inline]
    pub fn call<'a>(
        &'a self,
        ctx: &'a Context,
    ) -> impl std::future::Future<Output = HandlerOutcome> + Send + 'a {
        crate::middleware::Next::new(
            &self.chain,
            crate::middleware::Endpoint::Handler(&*self.handler),
        )
        .run(ctx)
    }

    /// The handler's description.
    pub fn info(&self) -> &HandlerInfo {
        &self.info
    }

    /// The erased handler.
    pub fn handler(&self) -> &dyn ErasedHandler {
        &*self.handler
    }
}

impl fmt::Debug for RegisteredHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.info, f)
    }
}

/// Message type → handlers, built once at startup.
///
/// Every handler of a type gets every message of that type (fan-out); each is its own
/// subscriber with its own retries.
///
/// ```
/// use hexeract::{handler, Context, Message, Registry};
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// struct OrderPlaced { order_id: u64 }
///
/// #[handler(message = "OrderPlaced", name = "billing.charge")]
/// async fn charge(event: OrderPlaced, ctx: &Context) -> Result<(), String> { Ok(()) }
///
/// let registry = Registry::from_inventory()?;
/// let names: Vec<_> = registry.handlers_for("OrderPlaced").iter().map(|h| h.info().name.clone()).collect();
/// assert!(names.contains(&"billing.charge".into()));
/// for info in registry.handlers() {
///     println!("{} <- {} ({:?})", info.name, info.message_type, info.location);
/// }
/// # Ok::<(), hexeract::RegistryError>(())
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    handlers: Vec<Arc<RegisteredHandler>>,
    by_type: HashMap<&'static str, Vec<Arc<RegisteredHandler>>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Every handler declared with `#[handler]` in the program.
    ///
    /// Two handlers with the same name are an error naming both places.
    pub fn from_inventory() -> Result<Registry, RegistryError> {
        let infos = inventory::iter::<HandlerRegistration>
            .into_iter()
            .map(|registration| {
                let info = HandlerInfo {
                    name: Cow::Borrowed(registration.name),
                    message_type: registration.message_type,
                    location: Some(Location {
                        file: registration.file,
                        line: registration.line,
                        column: registration.column,
                    }),
                    timeout: registration.timeout,
                    concurrency: registration.concurrency.and_then(NonZeroU32::new),
                };
                // Built without state for now; a handler that takes some is built again with
                // its worker's (`provide`), and stands in until then.
                let handler =
                    (registration.make)(&States::new(), &mut Vec::new()).unwrap_or_else(|| {
                        Arc::new(Unprovided {
                            message_type: registration.message_type,
                        })
                    });
                let mut registered = RegisteredHandler::new(info, handler);
                registered.make = Some(registration.make);
                registered
            });
        Registry::from_handlers(infos)
    }

    fn from_handlers(
        handlers: impl IntoIterator<Item = RegisteredHandler>,
    ) -> Result<Registry, RegistryError> {
        let mut registry = Registry::new();
        let mut duplicates = Vec::new();
        for handler in handlers {
            if let Err(duplicate) = registry.insert(handler) {
                duplicates.push(duplicate);
            }
        }
        if duplicates.is_empty() {
            Ok(registry)
        } else {
            Err(RegistryError::DuplicateNames(duplicates))
        }
    }

    /// Adds a handler written as a type implementing [`Handler<M>`]. Without a name in
    /// `options`, its name is the type's path (`my_app::billing::Charge`); a generic type must
    /// be given a name.
    pub fn register<M: Message, H: Handler<M>>(
        &mut self,
        handler: H,
        options: HandlerOptions,
    ) -> Result<(), RegistryError> {
        let info = HandlerInfo {
            name: options
                .name
                .unwrap_or(Cow::Borrowed(std::any::type_name::<H>())),
            message_type: M::MESSAGE_TYPE,
            location: None,
            timeout: options.timeout,
            concurrency: options.concurrency,
        };
        if let Err(problem) = check_name(&info.name) {
            return Err(RegistryError::InvalidName {
                name: info.name.to_string(),
                problem,
            });
        }
        let handler: Arc<dyn ErasedHandler> = Arc::new(TypedHandler::<M, H>::new(handler));
        let mut registered = RegisteredHandler::new(info, handler);
        // Its own middleware, innermost: a worker's go around it.
        registered.chain = Arc::from(options.middleware);
        self.insert(registered)
            .map_err(|duplicate| RegistryError::DuplicateNames(vec![duplicate]))
    }

    /// The registry its worker runs: each `#[handler]` that takes state built with `states`,
    /// each handler given its chain of `middleware`. Every missing state, and every middleware
    /// for a handler that is not here, is reported at once.
    pub(crate) fn provide(
        &self,
        states: &States,
        middleware: &Middlewares,
    ) -> Result<Registry, RegistryError> {
        let (provided, missing) = self.provide_what_can_be(states, middleware);
        if !missing.is_empty() {
            return Err(RegistryError::MissingState(missing));
        }
        let unknown: Vec<String> = middleware
            .named()
            .filter(|name| self.get(name).is_none())
            .map(str::to_owned)
            .collect();
        if !unknown.is_empty() {
            return Err(RegistryError::UnknownHandlers {
                names: unknown,
                known: self.handlers().map(|info| info.name.to_string()).collect(),
            });
        }
        Ok(provided)
    }

    /// [`provide`](Registry::provide) for every handler whose state is there; the others stay
    /// as they are (stand-ins that dead-letter, for the test harness), and are returned.
    pub(crate) fn provide_what_can_be(
        &self,
        states: &States,
        middleware: &Middlewares,
    ) -> (Registry, Vec<MissingState>) {
        let mut missing = Vec::new();
        let mut provided = Registry::new();
        for registered in &self.handlers {
            let handler = match registered.make {
                Some(make) => {
                    let mut types = Vec::new();
                    match make(states, &mut types) {
                        Some(handler) => handler,
                        None => {
                            missing.extend(types.into_iter().map(|type_name| MissingState {
                                handler: registered.info.name.to_string(),
                                location: registered.info.origin(),
                                type_name,
                            }));
                            provided
                                .insert(RegisteredHandler {
                                    info: registered.info.clone(),
                                    handler: registered.handler.clone(),
                                    make: registered.make,
                                    chain: registered.chain.clone(),
                                })
                                .expect("names were unique already");
                            continue;
                        }
                    }
                }
                None => registered.handler.clone(),
            };
            // Built now: a later build (a worker given this registry) keeps it as it is, and adds
            // its own middleware outside the chain it has.
            let chain: Chain = middleware
                .chain_for(&registered.info.name)
                .iter()
                .chain(registered.chain.iter())
                .cloned()
                .collect();
            provided
                .insert(RegisteredHandler {
                    info: registered.info.clone(),
                    handler,
                    make: None,
                    chain,
                })
                .expect("names were unique already");
        }
        (provided, missing)
    }

    fn insert(&mut self, registered: RegisteredHandler) -> Result<(), DuplicateName> {
        if let Some(existing) = self.get(&registered.info.name) {
            return Err(DuplicateName {
                name: registered.info.name.to_string(),
                first: existing.info.origin(),
                second: registered.info.origin(),
            });
        }
        let registered = Arc::new(registered);
        let position = self
            .handlers
            .partition_point(|other| other.info.name < registered.info.name);
        self.handlers.insert(position, registered.clone());
        let same_type = self
            .by_type
            .entry(registered.info.message_type)
            .or_default();
        let position = same_type.partition_point(|other| other.info.name < registered.info.name);
        same_type.insert(position, registered);
        Ok(())
    }

    /// Keeps only the handlers `keep` accepts (for tests, or a process that runs a subset).
    pub fn retain(&mut self, mut keep: impl FnMut(&HandlerInfo) -> bool) {
        self.handlers.retain(|handler| keep(&handler.info));
        self.by_type.clear();
        for handler in &self.handlers {
            self.by_type
                .entry(handler.info.message_type)
                .or_default()
                .push(handler.clone());
        }
    }

    /// Every handler, sorted by name.
    pub fn handlers(&self) -> impl Iterator<Item = &HandlerInfo> {
        self.handlers.iter().map(|handler| &handler.info)
    }

    /// The handlers of one message type, sorted by name; empty when there are none. (The
    /// erased handlers are what workers call: not part of the documented API.)
    #[doc(hidden)]
    pub fn handlers_for(&self, message_type: &str) -> &[Arc<RegisteredHandler>] {
        self.by_type.get(message_type).map_or(&[], Vec::as_slice)
    }

    /// The handler with this name, as workers call it (not part of the documented API).
    #[doc(hidden)]
    pub fn get(&self, name: &str) -> Option<&Arc<RegisteredHandler>> {
        self.handlers
            .binary_search_by(|handler| handler.info.name.as_ref().cmp(name))
            .ok()
            .map(|index| &self.handlers[index])
    }

    /// Number of handlers.
    pub fn len(&self) -> usize {
        self.handlers.len()
    }

    /// `true` when no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.handlers()).finish()
    }
}

/// The registry could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Handler names must be unique: they name queues and consumer groups.
    #[error("{}", DuplicateName::describe(.0))]
    DuplicateNames(Vec<DuplicateName>),
    /// Handlers take state (`State<T>`) that their worker was not given; nothing was started.
    #[error("{}", MissingState::describe(.0))]
    MissingState(Vec<MissingState>),
    /// `.state(value)` was given two values of one type: the second would replace the first,
    /// and the handlers would get only one of them. Each such type is named once.
    #[error(
        "state {} was given twice (`.state(…)`): a second value of a type would replace the \
         first; give each type once, and wrap values that share a type in types of their own",
        .0.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ")
    )]
    StateGivenTwice(Vec<&'static str>),
    /// Middleware was added for handlers that the worker does not have.
    #[error(
        "middleware was added for handlers this worker does not have: {}; its handlers are: {}",
        names.join(", "),
        known.join(", ")
    )]
    UnknownHandlers {
        /// The names given to `middleware_for`.
        names: Vec<String>,
        /// The names of the worker's handlers.
        known: Vec<String>,
    },
    /// A handler registered in code has a name that cannot name a queue.
    #[error(
        "handler name {name:?} {problem}; give the handler a name with `HandlerOptions::new().name(\"…\")`"
    )]
    InvalidName {
        /// The name as given (or derived from the handler's type).
        name: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// The rule `#[handler(name = "…")]` enforces at compile time, for names given at run time:
/// names become queue and consumer-group names.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".to_owned());
    }
    if name.len() > 200 {
        return Err(format!("is {} bytes long; keep it under 200", name.len()));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        Some(bad) => Err(format!(
            "contains {bad:?}: use letters, digits, `_`, `-`, `.` and `::` (it becomes a queue name)"
        )),
        None => Ok(()),
    }
}

/// A handler (or scheduled job) and a type of state it takes that its worker was not given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingState {
    /// The handler's (or job's) name.
    pub handler: String,
    /// Where it is declared.
    pub location: String,
    /// The parameter's type as the function's signature writes it (`State<PgPool>`).
    pub type_name: &'static str,
}

impl MissingState {
    pub(crate) fn describe(missing: &[MissingState]) -> String {
        let mut text = String::from(
            "handlers take state that was not given to the worker; give each value with \
             `.state(value)` on `hexeract::App` (or on the worker's builder) before it runs:",
        );
        let mut index = 0;
        while let Some(first) = missing.get(index) {
            let same: Vec<String> = missing[index..]
                .iter()
                .take_while(|one| one.handler == first.handler)
                .map(|one| format!("`{}`", one.type_name))
                .collect();
            index += same.len();
            text.push_str(&format!(
                "\n  `{}` ({}) takes {}",
                first.handler,
                first.location,
                same.join(" and ")
            ));
        }
        text
    }
}

/// Stands in for a `#[handler]` that takes state until its worker builds it with that state;
/// a worker never runs one (its build stops at the missing state).
struct Unprovided {
    message_type: &'static str,
}

impl ErasedHandler for Unprovided {
    fn message_type(&self) -> &'static str {
        self.message_type
    }

    fn handle<'a>(&'a self, _: &'a Envelope, _: &'a Context) -> BoxFuture<'a, HandlerOutcome> {
        Box::pin(async {
            HandlerOutcome::dead_letter(
                crate::reason::Reason::STATE_MISSING,
                "the handler takes state (`State<T>`) it was not given: give the value with \
                 `.state(value)` to its worker (or to the test harness)",
            )
        })
    }
}

/// Two handlers share a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DuplicateName {
    /// The shared name.
    pub name: String,
    /// Where the first is declared.
    pub first: String,
    /// Where the second is declared.
    pub second: String,
}

impl DuplicateName {
    fn describe(duplicates: &[DuplicateName]) -> String {
        let mut text = String::from(
            "two handlers share a name (names must be unique: they name queues and subscribers); \
             give one of each pair a `name = \"…\"` of its own:",
        );
        for duplicate in duplicates {
            text.push_str(&format!(
                "\n  `{}`: {} and {}",
                duplicate.name, duplicate.first, duplicate.second
            ));
        }
        text
    }
}

/// The handler-registration methods of a worker builder, over its `handlers: HandlerSet`: the
/// same four in every world.
macro_rules! handler_registration {
    ($builder:ident) => {
        /// Every `#[handler]` in the program (plus those registered with
        /// [`register_handler`](Self::register_handler)).
        pub fn from_registry(mut self) -> $builder {
            self.handlers.use_program();
            self
        }

        /// These handlers (plus those registered with `register_handler`).
        pub fn registry(mut self, registry: $crate::Registry) -> $builder {
            self.handlers.use_registry(registry);
            self
        }

        /// Adds a handler written as a type; its name is the type's path.
        pub fn register_handler<M: $crate::Message, H: $crate::Handler<M>>(
            self,
            handler: H,
        ) -> $builder {
            self.register_handler_with::<M, H>(handler, $crate::HandlerOptions::new())
        }

        /// Adds a handler written as a type, with its name, timeout or concurrency.
        pub fn register_handler_with<M: $crate::Message, H: $crate::Handler<M>>(
            mut self,
            handler: H,
            options: $crate::HandlerOptions,
        ) -> $builder {
            self.handlers.add::<M, H>(handler, options);
            self
        }

        $crate::registry::state_and_middleware!($builder);
    };
}
pub(crate) use handler_registration;

/// The state and middleware methods of a worker builder, over its `handlers: HandlerSet`.
macro_rules! state_and_middleware {
    ($builder:ident) => {
        /// Gives the handlers a value they take as [`State<T>`]($crate::State), one per type: a
        /// second value of a type stops the worker before it starts
        /// ([`RegistryError::StateGivenTwice`]($crate::RegistryError::StateGivenTwice)).
        pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> $builder {
            self.handlers.give_state(value);
            self
        }

        /// Runs `middleware` around every handler call, inside the middleware added before
        /// (see [`middleware`]($crate::middleware)).
        pub fn middleware(mut self, middleware: impl $crate::middleware::Middleware) -> $builder {
            self.handlers.middleware.add(middleware);
            self
        }

        /// Runs `middleware` around the calls of the handler named `handler` alone, inside the
        /// worker's middleware (on an `App`, the name may be a scheduled job's too). A name
        /// that is not one of the worker's stops it before it starts (`build()`, `try_run`).
        pub fn middleware_for(
            mut self,
            handler: impl Into<::std::borrow::Cow<'static, str>>,
            middleware: impl $crate::middleware::Middleware,
        ) -> $builder {
            self.handlers.middleware.add_for(handler, middleware);
            self
        }
    };
}
pub(crate) use state_and_middleware;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::Context;

    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct Ping;
    impl Message for Ping {
        const MESSAGE_TYPE: &'static str = "Ping";
    }

    struct Noop;
    impl Handler<Ping> for Noop {
        type Error = String;
        async fn handle(&self, _: Ping, _: &Context) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    fn entry(name: &'static str, line: u32) -> RegisteredHandler {
        let info = HandlerInfo {
            name: Cow::Borrowed(name),
            message_type: "Ping",
            location: Some(Location {
                file: "src/a.rs",
                line,
                column: 1,
            }),
            timeout: None,
            concurrency: None,
        };
        RegisteredHandler::new(info, Arc::new(TypedHandler::<Ping, _>::new(Noop)))
    }

    #[test]
    fn duplicate_names_name_both_places() {
        let error = Registry::from_handlers([entry("a", 1), entry("b", 2), entry("a", 30)])
            .expect_err("duplicate accepted");
        let text = error.to_string();
        assert!(
            text.contains("`a`: src/a.rs:1:1 and src/a.rs:30:1"),
            "{text}"
        );
        assert!(!text.contains("`b`"), "{text}");
    }

    #[test]
    fn handlers_are_found_by_type_and_name_in_name_order() {
        let registry =
            Registry::from_handlers([entry("z", 1), entry("m", 2), entry("a", 3)]).unwrap();
        let names: Vec<_> = registry
            .handlers_for("Ping")
            .iter()
            .map(|h| h.info().name.as_ref())
            .collect();
        assert_eq!(names, ["a", "m", "z"]);
        assert!(registry.get("m").is_some());
        assert!(registry.get("q").is_none());
        assert!(registry.handlers_for("Pong").is_empty());
    }

    #[test]
    fn code_registration_rejects_a_taken_name() {
        let mut registry = Registry::new();
        registry
            .register::<Ping, _>(Noop, HandlerOptions::new().name("x"))
            .unwrap();
        let error = registry
            .register::<Ping, _>(Noop, HandlerOptions::new().name("x"))
            .expect_err("duplicate accepted");
        assert!(
            error
                .to_string()
                .contains("`x`: registered in code and registered in code"),
            "{error}"
        );
    }

    #[test]
    fn code_registration_checks_names() {
        struct Generic<T>(std::marker::PhantomData<fn() -> T>);
        impl<T: 'static> Handler<Ping> for Generic<T> {
            type Error = String;
            async fn handle(&self, _: Ping, _: &Context) -> Result<(), Self::Error> {
                Ok(())
            }
        }
        let mut registry = Registry::new();
        let error = registry
            .register::<Ping, _>(
                Generic::<u8>(std::marker::PhantomData),
                HandlerOptions::new(),
            )
            .expect_err("a type path with generics is not a queue name");
        assert!(error.to_string().contains("contains '<'"), "{error}");
        let error = registry
            .register::<Ping, _>(Noop, HandlerOptions::new().name("has space"))
            .expect_err("a space is not allowed");
        assert!(
            error.to_string().contains("HandlerOptions::new().name"),
            "{error}"
        );
        registry
            .register::<Ping, _>(Noop, HandlerOptions::new())
            .expect("a plain type path is a valid name");
        // The type's path, as `std::any::type_name` gives it.
        let name = std::any::type_name::<Noop>();
        assert!(name.ends_with("::registry::tests::Noop"), "{name}");
        assert!(registry.get(name).is_some());
    }

    #[test]
    fn retain_rebuilds_the_type_index() {
        let mut registry = Registry::from_handlers([entry("a", 1), entry("b", 2)]).unwrap();
        registry.retain(|info| info.name == "b");
        assert_eq!(registry.len(), 1);
        assert_eq!(registry.handlers_for("Ping").len(), 1);
    }
}
