//! # Hexeract
//!
//! Message handlers for Rust. Write a plain async fn, put `#[handler]` on it, and run:
//!
//! ```
//! use hexeract::{handler, CancellationToken, Context, InMemoryStore, Message, MemoryWorker};
//!
//! #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
//! #[message(type = "OrderPlaced")]
//! pub struct OrderPlaced { pub order_id: u64, pub total_cents: i64 }
//!
//! #[handler(message = "OrderPlaced")]
//! async fn send_confirmation(event: OrderPlaced, ctx: &Context) -> Result<(), std::io::Error> {
//!     println!("order {} confirmed (message {})", event.order_id, ctx.message_id());
//!     Ok(())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // The in-memory worker, for tests and programs that need no durability;
//!     // `hexeract::run(cancel)` runs the same handlers on the durable outbox.
//!     let runtime = MemoryWorker::builder().store(InMemoryStore::new()).build()?;
//!     let store = runtime.store().clone();
//!     let cancel = CancellationToken::new();
//!     let running = tokio::spawn(runtime.run(cancel.clone()));
//!
//!     store.publish(&OrderPlaced { order_id: 7, total_cents: 1999 }).await?;
//!     store.wait_idle().await;
//!
//!     cancel.cancel();
//!     running.await??;
//!     Ok(())
//! }
//! ```
//!
//! Every handler of a message type gets every message of that type. A handler that returns
//! `Err` is called again after a backoff (1 s doubling to 300 s, 5 calls in all); then, or
//! at once with [`HandlerOutcome::dead_letter`], the message becomes a [`DeadLetter`] with its
//! [`Reason`]. Panics and timeouts are failed attempts. Nothing is dropped silently.
//!
//! A handler whose argument type is not the message it declares does not compile:
//!
//! ```compile_fail
//! # use hexeract::{handler, Context, Message};
//! # #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
//! # #[message(type = "OrderPlaced")]
//! # pub struct OrderPlaced {}
//! # #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
//! # #[message(type = "OrderShipped")]
//! # pub struct OrderShipped {}
//! #[handler(message = "OrderPlaced")]
//! async fn ship(event: OrderShipped, ctx: &Context) -> Result<(), String> { Ok(()) }
//! ```
//!
//! The guides are in the repository's `docs/` folder; [`handler`] is the macro reference.

// Generated code names `::hexeract`; this makes that path work inside the crate too.
#[allow(unused_extern_crates)]
extern crate self as hexeract;

// The modules sit in one folder per layer (docs/architecture.md: base, core, engine, store,
// worlds, process): each folder is a module here, and the root names every module again, so
// that paths read `crate::outbox` and `hexeract::outbox` whichever folder holds it.
mod base {
    pub(crate) mod knobs;
    pub(crate) mod message;
    pub(crate) mod policy;
    pub(crate) mod reason;
    pub(crate) mod redact;
    pub(crate) mod retry;
    pub(crate) mod secure;
    pub(crate) mod signals;
    pub(crate) mod state;
}
#[path = "core"]
mod core_layer {
    pub(crate) mod context;
    pub(crate) mod dead_letter;
    pub(crate) mod envelope;
    pub(crate) mod handler;
    pub mod middleware;
    pub(crate) mod outcome;
    #[cfg(all(test, any(feature = "rabbitmq", feature = "kafka")))]
    pub(crate) mod proptest_support;
    pub(crate) mod publish;
    pub(crate) mod registry;
    pub(crate) mod trace;
}
mod engine {
    pub(crate) mod delivery;
    pub mod health;
    pub mod metrics;
    pub mod worker;
}
#[path = "store/memory.rs"]
mod memory;
pub mod store;
mod worlds {
    #[cfg(feature = "kafka")]
    pub mod kafka;
    pub mod outbox;
    #[cfg(feature = "rabbitmq")]
    pub mod rabbitmq;
    pub(crate) mod runtime;
    pub mod schedule;
    pub mod testing;
}
mod process {
    pub(crate) mod app;
    pub mod cli;
    pub mod config;
    pub(crate) mod error;
    #[cfg(feature = "fuzzing")]
    pub mod fuzzing;
    pub(crate) mod run;
}
// What the macros' code reaches, as `::hexeract::__private` (the path their errors name).
#[doc(hidden)]
#[path = "process/__private.rs"]
pub mod __private;
use base::{knobs, message, policy, reason, redact, retry, secure, signals, state};
pub use core_layer::middleware;
#[cfg(all(test, any(feature = "rabbitmq", feature = "kafka")))]
use core_layer::proptest_support;
use core_layer::{context, dead_letter, envelope, handler, outcome, publish, registry, trace};
use engine::delivery;
pub use engine::{health, metrics, worker};
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use process::fuzzing;
use process::{app, error, run};
pub use process::{cli, config};
#[cfg(feature = "kafka")]
pub use worlds::kafka;
#[cfg(feature = "rabbitmq")]
pub use worlds::rabbitmq;
use worlds::runtime;
pub use worlds::{outbox, schedule, testing};

/// The guides of `docs/` that carry examples, compiled as doctests so that they stay true.
#[cfg(all(doctest, feature = "rabbitmq"))]
#[doc = include_str!("../docs/rabbitmq.md")]
pub struct RabbitMqGuide;
#[cfg(all(doctest, feature = "rabbitmq"))]
#[doc = include_str!("../docs/health.md")]
pub struct HealthGuide;
#[cfg(doctest)]
#[doc = include_str!("../docs/operations.md")]
pub struct OperationsGuide;
#[cfg(all(doctest, feature = "sqlite"))]
#[doc = include_str!("../docs/configuration.md")]
pub struct ConfigurationGuide;
#[cfg(all(doctest, feature = "kafka"))]
#[doc = include_str!("../docs/kafka.md")]
pub struct KafkaGuide;
#[cfg(all(doctest, feature = "postgres"))]
#[doc = include_str!("../docs/scheduler.md")]
pub struct SchedulerGuide;
#[cfg(doctest)]
#[doc = include_str!("../docs/scheduled.md")]
pub struct ScheduledReference;
#[cfg(all(doctest, feature = "postgres"))]
#[doc = include_str!("../docs/testing.md")]
pub struct TestingGuide;
#[cfg(all(doctest, feature = "postgres", feature = "sqlite"))]
#[doc = include_str!("../docs/getting-started.md")]
pub struct GettingStartedGuide;
#[cfg(all(doctest, feature = "postgres"))]
#[doc = include_str!("../docs/outbox.md")]
pub struct OutboxGuide;

pub use app::run;
pub use app::App;
pub use config::AppConfig;
pub use context::Context;
pub use dead_letter::{DeadLetter, MAX_DETAIL_BYTES};
pub use delivery::Policy;
pub use envelope::{DecodeError, EncodeError, Envelope};
pub use error::{ConfigError, ConfigProblem, Error};
pub use handler::Handler;
pub use memory::{InMemoryStore, StoreBusy};
pub use message::{AggregateKey, Message};
pub use middleware::{Middleware, Next};
pub use outcome::{HandlerError, HandlerOutcome, IntoOutcome};
pub use publish::{Publish, PublishError};
pub use reason::Reason;
pub use registry::{
    DuplicateName, HandlerInfo, HandlerOptions, Location, MissingState, Registry, RegistryError,
};
pub use retry::RetryPolicy;
pub use runtime::{HandlerStats, MemorySource, MemoryWorker, MemoryWorkerBuilder};
pub use schedule::{schedule_after, schedule_at};
/// The sqlx Hexeract is built with: an application that writes its own queries, or
/// [`outbox::enqueue`]s in its own transactions, can use it from here and is then on the same
/// version (one `sqlx::Transaction` type), without a dependency of its own.
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use hexeract::sqlx::SqlitePool;
///
/// let pool = SqlitePool::connect("sqlite:hexeract.db").await?;
/// let mut tx = pool.begin().await?;
/// hexeract::sqlx::query("UPDATE carts SET checked_out = 1 WHERE id = 7")
///     .execute(&mut *tx)
///     .await?;
/// tx.commit().await?;
/// # Ok(())
/// # }
/// ```
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use sqlx;
pub use state::{FromStates, State, States};
pub use store::process::{migrate, publish};
pub use tokio_util::sync::CancellationToken;
/// The application builder's name before it was [`App`]: the seed's
/// `Worker::new(config).try_run(cancel)` keeps compiling.
#[deprecated(
    note = "renamed `App` (a world's loop is a worker: `OutboxWorker`, `MemoryWorker`, …)"
)]
pub type Worker = App;
/// The settings' name before they were [`AppConfig`].
#[deprecated(note = "renamed `AppConfig`")]
pub type WorkerConfig = AppConfig;
/// The in-memory world's name before it was [`MemoryWorker`].
#[deprecated(note = "renamed `MemoryWorker`: the in-memory world's worker")]
pub type Runtime = MemoryWorker;
/// The in-memory world's builder's name before it was [`MemoryWorkerBuilder`].
#[deprecated(note = "renamed `MemoryWorkerBuilder`")]
pub type RuntimeBuilder = MemoryWorkerBuilder;
pub use worker::{BuildError, WorkerBuilder};

#[doc = include_str!("../docs/handlers.md")]
pub use hexeract_macros::handler;

/// Registers an async fn as a scheduled job, run by the scheduler that
/// [`hexeract::run`](crate::run) starts (see [`schedule`] for the model).
///
/// ```
/// use hexeract::{scheduled, Context};
///
/// #[scheduled(cron = "0 30 2 * * *", tz = "Europe/Berlin", name = "carts::expire")]
/// async fn expire_carts(_ctx: &Context) -> Result<(), std::io::Error> {
///     Ok(())
/// }
/// ```
///
/// Keys: `cron = "sec min hour day month weekday"` or `every = "30s"` (exactly one), `name`
/// (default `module::path::fn`), `tz` (an IANA zone, default `UTC`; cron only), `catch_up =
/// "once" | "none"` (default `once`), `timeout = "45s"` and `crate = "::hx"` (the path of this
/// crate, when the dependency is renamed; see [`handler`](macro@handler#crate)). A cron
/// expression, duration or time zone that is not valid is a compile error pointing at the
/// string.
pub use hexeract_macros::scheduled;

/// Derives [`Message`](trait@Message) with the wire name from `#[message(type = "…")]`.
///
/// ```
/// use hexeract::Message;
///
/// #[derive(serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "billing.InvoiceIssued")]
/// struct InvoiceIssued { invoice_id: u64 }
///
/// assert_eq!(InvoiceIssued::MESSAGE_TYPE, "billing.InvoiceIssued");
/// ```
///
/// Keys of `#[message(…)]`: `type` (required), `aggregate` (with a `#[message(key)]` field, see
/// [`AggregateKey`]) and `crate = "::hx"`, the path of this crate when the dependency is
/// renamed in Cargo.toml or reached through a re-export (see
/// [`handler`](macro@handler#crate)).
pub use hexeract_macros::Message;
