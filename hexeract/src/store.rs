//! Durable stores for the transactional outbox: where published messages wait, where each
//! handler's delivery is claimed and settled, and where dead letters are kept.
//!
//! A small core trait, [`DeliveryStore`], and capabilities beside it ([`RelayStore`],
//! [`DeadLetterStore`], [`Housekeeping`], [`DeclaredQueues`], [`ScheduleStore`],
//! [`RecordAttempts`]), with a
//! PostgreSQL and a SQLite implementation of each. Workers ask for the traits they use only;
//! `outbox::enqueue` writes into the caller's own transaction with the backend's connection
//! type.
//!
//! The model: `enqueue` writes one `outbox` row. A worker that knows the handlers takes it. A
//! message whose type has one handler (or none) is claimed *in place*: the outbox row itself
//! counts the attempt and holds the lease. A message whose type has several is *expanded*: the
//! row moves into `deliveries`, one row per (message, handler), each with its own attempts and
//! due time, so each handler is its own subscriber and retries independently. Claiming counts
//! the attempt and holds the row until the end of a lease (on the database clock), under a
//! claim token; a crashed worker's claims come due again when the lease ends. Settling (ack =
//! delete, retry = new due time, dead letter = move to `dead_letters`) only touches rows still
//! holding the settling worker's token; a retry of a message claimed in place moves it into
//! `deliveries` to wait, so that the outbox holds only what is new or running.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::envelope::Envelope;

pub(crate) mod attempts;
pub use attempts::{PartitionCalls, PartitionOf, RecordAttempts};
#[cfg(feature = "postgres")]
pub mod postgres;
mod schedules;
pub use schedules::{
    occurrence_id, ClaimedOccurrence, Due, FirstFire, Plan, Planner, ScheduleDefinition,
    ScheduleStore, SCHEDULE_MESSAGE_TYPE,
};

// The process layer's (the process-wide default store): in its folder, under this module's path.
#[path = "process/default_store.rs"]
pub(crate) mod process;
#[allow(deprecated)]
pub use process::default_schedule_store;
pub use process::{default_store, migrate, wait_until_drained};
mod claims;
/// The brokers' workers put their dead-letter inserts under the store's deadline with it.
#[cfg(any(feature = "rabbitmq", feature = "kafka"))]
pub(crate) use claims::within;
pub use claims::Claims;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use claims::Deliveries;
pub(crate) use claims::{by_token, warn_unless_all_acked, Leased, LeasedFeed};
mod dead_letters;
pub use dead_letters::{DeadLetterFilter, DeadLetterStore, Page};
mod queues;
pub use queues::{DeclaredQueue, DeclaredQueues};
mod gauges;
pub use gauges::sample_gauges;
pub(crate) use gauges::StoreGauges;
pub(crate) mod limit;
pub(crate) mod relay;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use relay::unpublishable_letters;
#[cfg(any(feature = "rabbitmq", feature = "kafka"))]
pub(crate) use relay::Passes;
pub use relay::{RelaySink, RelayStore, Unpublishable};
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) mod unreadable;

/// The handler name a delivery gets when no handler knows its message type: it follows the
/// retry policy and is then dead-lettered as `unknown_message_type`.
pub const NO_HANDLER: &str = "";

/// Which handlers exist for which message types: what expansion needs from the registry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routes {
    /// `(message_type, handler)` pairs.
    pub pairs: Vec<(String, String)>,
}

impl Routes {
    /// The message types and the handlers, as two columns of the same length.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn columns(&self) -> (Vec<&str>, Vec<&str>) {
        self.pairs
            .iter()
            .map(|(message_type, handler)| (message_type.as_str(), handler.as_str()))
            .unzip()
    }

    /// The routes split by how a take handles their messages: the types with exactly one
    /// handler (types, handlers), whose messages are claimed in place in the outbox as those of
    /// types no handler knows are, and the types with several (types, handlers), whose
    /// messages are expanded into a delivery per handler.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn split(&self) -> (RouteColumns<'_>, RouteColumns<'_>) {
        let mut single = RouteColumns::default();
        let mut several = RouteColumns::default();
        for (message_type, handler) in &self.pairs {
            let handlers = self.pairs.iter().filter(|(t, _)| t == message_type).count();
            let side = if handlers == 1 {
                &mut single
            } else {
                &mut several
            };
            side.types.push(message_type);
            side.handlers.push(handler);
        }
        (single, several)
    }

    /// The routes of every handler in `registry`.
    pub fn from_registry(registry: &crate::Registry) -> Routes {
        Routes {
            pairs: registry
                .handlers()
                .map(|info| (info.message_type.to_owned(), info.name.to_string()))
                .collect(),
        }
    }
}

/// Routes as two columns of the same length, for binding as arrays.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
#[derive(Default)]
pub(crate) struct RouteColumns<'a> {
    pub(crate) types: Vec<&'a str>,
    pub(crate) handlers: Vec<&'a str>,
}

/// Where a claimed delivery lives, to settle it.
///
/// A message whose type has one handler (or none: it goes to [`NO_HANDLER`]) is claimed *in
/// place* by [`DeliveryStore::take`]: its outbox row carries the claim (attempts, lease,
/// token), an ack deletes it, and no delivery row is ever written unless a retry moves it into
/// `deliveries` to wait. Messages of a type with several handlers have a `deliveries` row per
/// handler, as do retried ones and those [`DeliveryStore::expand`] moved.
///
/// ```no_run
/// # async fn example(store: hexeract::store::sqlite::SqliteStore) -> Result<(), hexeract::store::StoreError> {
/// use std::time::Duration;
/// use hexeract::store::{DeliveryId, DeliveryStore, Routes};
///
/// let routes = Routes { pairs: vec![("orders.OrderPlaced".into(), "ship".into())] };
/// let token = uuid::Uuid::now_v7();
/// for claimed in store.take(&routes, token, 10, Duration::from_secs(30)).await? {
///     match claimed.id {
///         // New, of a type with one handler: its outbox row holds the claim.
///         DeliveryId::Outbox(message) => assert_eq!(message, claimed.envelope.id),
///         // Due again after a retry, or of a type with several handlers.
///         DeliveryId::Row(_) => {}
///     }
///     store.deliveries().ack(token, &[claimed.id]).await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeliveryId {
    /// A `deliveries` row, by its id.
    Row(i64),
    /// A message claimed in place in the outbox, by the message's id.
    Outbox(Uuid),
}

impl DeliveryId {
    /// The ids of `ids` split by where they live: `deliveries` rows, then outbox rows.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn split(ids: &[DeliveryId]) -> (Vec<i64>, Vec<Uuid>) {
        let mut rows = Vec::new();
        let mut outbox = Vec::new();
        for id in ids {
            match *id {
                DeliveryId::Row(row) => rows.push(row),
                DeliveryId::Outbox(message) => outbox.push(message),
            }
        }
        (rows, outbox)
    }
}

/// A delivery claimed by a worker: the message as published, with `attempt` set to the call
/// this claim is for, and the handler it goes to.
#[derive(Clone, Debug, PartialEq)]
pub struct Claimed {
    /// Where the delivery lives, used to settle it.
    pub id: DeliveryId,
    /// The handler's name; [`NO_HANDLER`] when no handler knew the type at expansion.
    pub handler: String,
    /// The message, `attempt` counted.
    pub envelope: Envelope,
    /// An earlier claim of this delivery ended without being settled (its worker died or
    /// stopped mid-call), so it may be what brought that worker down. Workers run such
    /// deliveries one at a time, so that one message that crashes the process cannot take the
    /// rest of a batch with it. Cleared once a call of it finishes.
    pub recovered: bool,
    /// The stored message could not be read as Hexeract writes it (a row written by another
    /// program: a header that is not a string, a column of the wrong type), and why; `envelope`
    /// holds what could be read. The worker dead-letters such a delivery as
    /// [`Reason::MESSAGE_UNREADABLE`](crate::Reason::MESSAGE_UNREADABLE) without calling its
    /// handler.
    pub unreadable: Option<String>,
}

/// The core of a store: what a worker needs to take messages in, claim each handler's delivery
/// and settle it. A store offers more as capabilities, each a trait of its own that a component
/// asks for only when it needs it: [`RelayStore`] (a broker relay reads the outbox),
/// [`DeadLetterStore`] (the dead letters, for workers that park and for the operations
/// commands), [`Housekeeping`] (what `run` reads at startup and on a timer), [`DeclaredQueues`]
/// (the RabbitMQ queues a worker declared) and [`ScheduleStore`] (the scheduler). [`Store`] is
/// all of them together: what both database stores are, and what
/// [`default_store`] returns.
pub trait DeliveryStore: Send + Sync + 'static {
    /// Creates or upgrades the schema. Idempotent; safe to run from several processes at once.
    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Writes `envelopes` to the outbox in a transaction of its own.
    fn publish(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Moves up to `limit` new outbox rows into deliveries, one per handler `routes` knows for
    /// their type (one with [`NO_HANDLER`] when none does). Returns how many rows moved.
    fn expand<'a>(
        &'a self,
        routes: &'a Routes,
        limit: u32,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Claims up to `limit` due deliveries under `token`: counts the attempt and makes them due
    /// again only when `lease` has passed.
    fn claim(
        &self,
        token: Uuid,
        limit: u32,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<Claimed>, StoreError>>;

    /// What a worker's cycle starts with: claims up to `limit` due deliveries under `token`
    /// and, when fewer were due, takes as many new outbox rows as are left of `limit`, oldest
    /// first. A row whose type has one handler in `routes` (or none) is claimed in place
    /// ([`DeliveryId::Outbox`]); a row whose type has several is expanded and its deliveries
    /// claimed too (some may be left due but unclaimed past the limit). The default is
    /// [`expand`](DeliveryStore::expand) then [`claim`](DeliveryStore::claim), which writes a
    /// delivery row for every message; both database stores claim in place, PostgreSQL in one
    /// statement, SQLite in one write transaction.
    fn take<'a>(
        &'a self,
        routes: &'a Routes,
        token: Uuid,
        limit: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Claimed>, StoreError>> {
        Box::pin(async move {
            self.expand(routes, limit).await?;
            self.claim(token, limit, lease).await
        })
    }

    /// Acks `acked` (deliveries of an earlier claim, under that claim's token), then
    /// [`take`](DeliveryStore::take)s; returns how many of the acks landed and what it took.
    /// One after the other unless the store does both at once, as PostgreSQL does in one
    /// statement (a worker's cycle then commits once, not twice) and SQLite in one round trip
    /// to its connection's thread. A failed ack loses nothing: those deliveries run again when
    /// their lease ends.
    fn ack_and_take<'a>(
        &'a self,
        acked: (Uuid, &'a [DeliveryId]),
        routes: &'a Routes,
        token: Uuid,
        limit: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(u64, Vec<Claimed>), StoreError>> {
        Box::pin(async move {
            let (acked_token, ids) = acked;
            let landed = self.deliveries().ack(acked_token, ids).await?;
            let claimed = self.take(routes, token, limit, lease).await?;
            Ok((landed, claimed))
        })
    }

    /// The claimed deliveries, to settle: ack, retry, dead-letter or release them under their
    /// claim's token.
    fn deliveries(&self) -> &dyn Claims<DeliveryId>;

    /// Messages still owed: outbox rows (new, or claimed in place) plus deliveries not yet settled
    /// (running, due, or waiting for a retry). Zero when everything was handled or
    /// dead-lettered.
    fn backlog(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// A signal that fires when new messages may be waiting: a publish through this store in
    /// this process, and, where the database can tell (PostgreSQL `LISTEN`), a commit of
    /// `outbox::enqueue` in any process. `None` when the store has no such signal; workers then
    /// rely on polling alone. Workers call it once when they start.
    fn wakeups(&self) -> BoxFuture<'_, Result<Option<Arc<Notify>>, StoreError>> {
        Box::pin(async { Ok(None) })
    }

    /// The database, as the workers' log lines name the transport of their deliveries
    /// (`postgresql`, `sqlite`).
    fn kind(&self) -> &'static str {
        "store"
    }
}

/// The deliveries one handler still owes, as [`Housekeeping::pending_by_handler`] counts them.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pending {
    /// The handler's name (`""` for a message type no handler knew when it was expanded).
    pub handler: String,
    /// Deliveries not settled yet: due, running, or waiting for a retry.
    pub count: u64,
    /// When the oldest of them was published.
    pub oldest: Option<DateTime<Utc>>,
}

/// What `run` reads of a store at startup and on a timer: who is still owed deliveries, how old
/// the oldest message owed is, and the inbox's retention.
pub trait Housekeeping: Send + Sync + 'static {
    /// Deliveries still owed, counted by handler name (`""` for a message type no handler
    /// knew when it was taken): the `deliveries` rows, and the outbox rows claimed in place
    /// whose claim still runs (one whose claim ended is routed again when it is next taken).
    /// A name no registered handler has is a handler that was renamed or removed, and its
    /// deliveries wait for nobody.
    fn pending_by_handler(&self) -> BoxFuture<'_, Result<Vec<Pending>, StoreError>>;

    /// When the oldest message still owed (in the outbox, or with a delivery not settled) was
    /// published; `None` when nothing is owed. For the `hexeract_outbox_oldest_pending_seconds`
    /// gauge.
    fn oldest_pending(&self) -> BoxFuture<'_, Result<Option<DateTime<Utc>>, StoreError>>;

    /// Deletes the inbox marks older than `age` and returns how many (see
    /// [`outbox::inbox`](crate::outbox::inbox)); what `run`'s retention task does with
    /// `INBOX_RETENTION_DAYS`.
    fn purge_inbox_before(&self, age: Duration) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// This store on a pool of its own, of one connection opened on first use that waits at
    /// most `timeout` for the database, reading and writing the same tables: what the
    /// `/metrics` gauges are sampled through, so that scrapes never take a connection the
    /// workers claim with. `None` (the default) when the store has no such pool (an
    /// in-memory database another pool would not see): the samples then use the store itself.
    fn sampling_store(&self, timeout: Duration) -> Option<Arc<dyn Store>> {
        let _ = timeout;
        None
    }
}

/// Every capability of a store at once: what `run`, the operations commands and
/// [`default_store`] work with. Implemented for every type that has them all, as both database
/// stores do.
///
/// ```no_run
/// # async fn example() -> Result<(), hexeract::Error> {
/// let store = hexeract::store::default_store().await?;
/// println!("{} messages owed", store.backlog().await?);
/// println!("{} dead letters", store.dead_letters(1_000).await?.len());
/// # Ok(())
/// # }
/// ```
pub trait Store:
    DeliveryStore
    + RelayStore
    + DeadLetterStore
    + Housekeeping
    + DeclaredQueues
    + ScheduleStore
    + RecordAttempts
{
}

impl<T> Store for T where
    T: DeliveryStore
        + RelayStore
        + DeadLetterStore
        + Housekeeping
        + DeclaredQueues
        + ScheduleStore
        + RecordAttempts
{
}

/// The store's wake-up signal ([`DeliveryStore::wakeups`]), or one that never fires when the
/// store has none or cannot subscribe: then the caller relies on polling alone.
pub(crate) async fn wake_signal(store: &dyn DeliveryStore) -> Arc<Notify> {
    match store.wakeups().await {
        Ok(Some(wake)) => wake,
        Ok(None) => Arc::new(Notify::new()),
        Err(error) => {
            tracing::warn!(%error, "cannot subscribe to outbox notifications; polling only");
            Arc::new(Notify::new())
        }
    }
}

/// What a poll loop does after a pass that found nothing: waits for `interval`, a wake-up or
/// the cancellation, whichever comes first (the brokers' relays).
#[cfg(any(feature = "rabbitmq", feature = "kafka"))]
pub(crate) async fn idle(
    cancel: &tokio_util::sync::CancellationToken,
    wake: &Notify,
    interval: Duration,
) {
    tokio::select! {
        () = cancel.cancelled() => {}
        () = wake.notified() => {}
        () = tokio::time::sleep(interval) => {}
    }
}

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database reported an error or could not be reached.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A schema or table name is not a plain SQL identifier.
    #[error(transparent)]
    Identifier(#[from] IdentifierError),
    /// The relay's publish failed; the rows stay in the outbox.
    #[error("relaying the outbox failed, the rows stay: {0}")]
    Relay(String),
    /// A statement did not answer in time (see
    /// [`OutboxWorkerBuilder::store_timeout`](crate::outbox::OutboxWorkerBuilder::store_timeout)):
    /// the database, or the network path to it, may be gone.
    #[error(
        "the database did not answer the {what} within {after:?}; giving up on that connection"
    )]
    Timeout {
        /// Which statement.
        what: &'static str,
        /// How long it was given.
        after: Duration,
    },
    /// A message's payload is larger than the workers take (`MAX_PAYLOAD_BYTES`, 1 MiB unless
    /// set): it would only be dead-lettered undecoded, so it is refused before anything of the
    /// call is written.
    #[error(
        "message {id} ({message_type}) has a payload of {bytes} bytes, more than \
         MAX_PAYLOAD_BYTES ({max}), the largest the workers take: nothing was written"
    )]
    PayloadTooLarge {
        /// The message's id.
        id: Uuid,
        /// Its type.
        message_type: String,
        /// Its payload's size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A row could not be turned back into a message (corrupt headers).
    #[error("stored row {id} is unreadable: {problem}")]
    Corrupt {
        /// Which row.
        id: String,
        /// What is wrong.
        problem: String,
    },
    /// The application wrote in its own transaction (an `enqueue`, an inbox mark) before
    /// Hexeract's tables were created in the database.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    #[error(
        "Hexeract's tables are not in {namespace:?} yet ({source}): create them before the \
         application writes to them, with `hexeract::migrate().await` (or `App::migrate`) at \
         startup, or the `migrate` command of `hexeract::cli` as a deploy step"
    )]
    NotMigrated {
        /// The schema (PostgreSQL) or table prefix (SQLite) written to.
        namespace: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
}

impl StoreError {
    /// This error, or [`StoreError::NotMigrated`] when it is the database saying that a table
    /// of `namespace` does not exist.
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    pub(crate) fn unless_not_migrated(self, namespace: &Identifier) -> StoreError {
        match self {
            StoreError::Database(source) if is_missing_table(&source) => StoreError::NotMigrated {
                namespace: namespace.as_str().to_owned(),
                source,
            },
            other => other,
        }
    }
}

/// PostgreSQL's `undefined_table` or `invalid_schema_name`, or SQLite's "no such table".
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn is_missing_table(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(database) = error else {
        return false;
    };
    matches!(database.code().as_deref(), Some("42P01" | "3F000"))
        || database.message().starts_with("no such table")
}

/// A schema name, checked to be a plain SQL identifier and always used quoted: names are never
/// spliced into SQL unchecked.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Identifier(String);

/// A name that is not a plain SQL identifier.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name:?} is not a valid schema or table name: use 1 to 63 ASCII letters, digits and `_`, \
     not starting with a digit"
)]
pub struct IdentifierError {
    /// The name given.
    pub name: String,
}

impl Identifier {
    /// Checks `name` against `^[A-Za-z_][A-Za-z0-9_]*$`, at most 63 bytes.
    pub fn new(name: impl Into<String>) -> Result<Identifier, IdentifierError> {
        let name = name.into();
        let mut chars = name.chars();
        let valid_start = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if valid_start && valid_rest && name.len() <= 63 {
            Ok(Identifier(name))
        } else {
            Err(IdentifierError { name })
        }
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name quoted for SQL (`"name"`); the check above leaves nothing to escape.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

impl fmt::Debug for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A duration as whole milliseconds for SQL, saturating.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// `pool.begin_with(statement)` (or `pool.begin()` for `None`) that can be dropped at any
/// moment. sqlx 0.8 counts a transaction as begun only once `BEGIN` has returned: a future
/// dropped while `BEGIN` is in flight hands its connection back to the pool inside a
/// transaction nobody will end (sqlx issue #4393), and every later statement on that
/// connection joins it, holding its row locks (PostgreSQL) or the write lock (SQLite) until the
/// connection is next closed. Here `BEGIN` runs in a task of its own, which always sees it
/// through: if the caller is gone by then, the transaction it returns is dropped there, which
/// rolls it back before the connection goes back to the pool.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) async fn begin<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    statement: Option<&'static str>,
) -> Result<sqlx::Transaction<'static, DB>, sqlx::Error> {
    let pool = pool.clone();
    let begun = tokio::spawn(async move {
        match statement {
            Some(statement) => pool.begin_with(statement).await,
            None => pool.begin().await,
        }
    });
    match begun.await {
        Ok(result) => result,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        // The runtime is shutting down.
        Err(_) => Err(sqlx::Error::PoolClosed),
    }
}

#[cfg(test)]
mod tests {
    use super::Identifier;

    #[test]
    fn identifiers_are_plain_names_only() {
        for good in ["hexeract", "_x", "Orders_2", &"a".repeat(63)] {
            assert!(Identifier::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "2x",
            "a-b",
            "a b",
            "a\"b",
            "a;drop",
            "ß",
            &"a".repeat(64),
        ] {
            assert!(Identifier::new(bad).is_err(), "{bad}");
        }
        assert_eq!(Identifier::new("outbox").unwrap().quoted(), "\"outbox\"");
    }
}
