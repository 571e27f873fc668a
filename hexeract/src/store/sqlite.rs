//! [`SqliteStore`]: the outbox in a SQLite file, the embedded default.
//!
//! SQLite has one writer at a time and no `SKIP LOCKED`: this store is for one process (any
//! number of workers in it). Every claim and settlement is a single statement or one
//! `BEGIN IMMEDIATE` transaction, so each is atomic and takes the write lock before it reads;
//! other writers wait for it (the busy timeout, 5 s) instead of failing with `SQLITE_BUSY`.
//! Each statement is a round trip to the connection's thread (sqlx runs SQLite there), so the
//! worker's cycle sends its acks and claims as one query of four statements.
//!
//! The tables are those of the PostgreSQL store with a name prefix instead of a schema
//! (`hexeract_outbox`, `hexeract_deliveries`, …), as `STRICT` tables. Ids are hyphenated UUID
//! text. Due times and record times (`available_at`, `dead_lettered_at`) are INTEGER
//! milliseconds since the epoch on the application's clock, so comparisons and `now + lease`
//! are exact; a message's own `created_at` is RFC 3339 text, kept as published.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::types::Json;
use sqlx::Sqlite;
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::Notify;
use uuid::fmt::Hyphenated;
use uuid::Uuid;

use crate::dead_letter::DeadLetter;
use crate::envelope::Envelope;
use crate::reason::Reason;
use crate::store::dead_letters::{dead_letter_queries, DeadLetterSql};
use crate::store::unreadable::Problems;
use crate::store::{
    millis, Claimed, Claims, DeadLetterFilter, DeadLetterStore, Deliveries, DeliveryId,
    DeliveryStore, Housekeeping, Identifier, Page, Pending, RelaySink, RelayStore, Routes,
    StoreError,
};

mod attempts;
mod queues;
mod schedules;
pub(crate) use schedules::insert_scheduled_in;

/// The prefix of Hexeract's table names unless another is given.
pub const DEFAULT_PREFIX: &str = "hexeract";

/// The outbox, deliveries and dead letters in one SQLite database, in tables named
/// `<prefix>_outbox`, `<prefix>_deliveries`, `<prefix>_dead_letters`, ….
///
/// ```no_run
/// # async fn example() -> Result<(), hexeract::store::StoreError> {
/// use hexeract::store::{sqlite::SqliteStore, DeliveryStore};
///
/// let store = SqliteStore::open("hexeract.db").await?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    prefix: Identifier,
    sql: Arc<Statements>,
    schedule_sql: Arc<schedules::ScheduleStatements>,
    deliveries: Arc<Deliveries<Settle, Settle>>,
    occurrences: Arc<Settle>,
    /// For an in-memory database: a connection outside the pool that keeps the database alive
    /// however the pool opens and closes its own.
    keep_alive: Option<Arc<SqliteConnection>>,
    /// Fired by every publish through this store: SQLite is one process, so this is the
    /// whole wake-up story.
    wake: Arc<Notify>,
    /// Taken around the store's own writes (see [`Writes`]).
    writes: Writes,
}

impl SqliteStore {
    /// The count `sql` selects (one INTEGER).
    async fn count(&self, sql: &str) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar(sql).fetch_one(&self.pool).await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// The dead-letter queries on this store's table.
    fn dead_letter_sql(&self) -> DeadLetterSql {
        DeadLetterSql {
            table: table(&self.prefix, "dead_letters"),
            mark: '?',
        }
    }

    /// Opens the database file at `path`, creating it if missing, with a pool of 10
    /// connections: WAL journal, `synchronous = NORMAL`, busy timeout 5 s. Tables get the
    /// default prefix.
    ///
    /// Several processes may open the same file at the same moment (a worker and a producer
    /// starting together): the switch to WAL is made once, retried while another connection
    /// holds the file, and the pool's connections then find the file in WAL mode without
    /// asking for the exclusive lock that SQLite's busy timeout does not wait for.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .log_statements(tracing::log::LevelFilter::Trace);
        use_wal(&options).await?;
        let pool = SqlitePoolOptions::new()
            .max_connections(10)
            // A connection is a file this process holds: nothing at the other end can hang
            // up. sqlx's check pings the connection's thread, a round trip per acquire.
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        SqliteStore::new(pool, DEFAULT_PREFIX)
    }

    /// A private in-memory database, gone when the store and its pool are dropped: for tests
    /// and examples.
    ///
    /// Its pool has a single connection, so a caller holding a transaction from
    /// [`pool`](SqliteStore::pool) must not wait for the store (or `hexeract::publish`) before
    /// it commits.
    pub async fn in_memory() -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(format!("hexeract-{}", Uuid::now_v7().simple()))
            .in_memory(true)
            .shared_cache(true)
            .busy_timeout(BUSY_TIMEOUT)
            .log_statements(tracing::log::LevelFilter::Trace);
        let keep_alive = options.connect().await?;
        // One connection: shared-cache connections lock whole tables, and two transactions
        // waiting for each other's tables fail with SQLITE_LOCKED instead of waiting.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await?;
        let mut store = SqliteStore::new(pool, DEFAULT_PREFIX)?;
        store.keep_alive = Some(Arc::new(keep_alive));
        Ok(store)
    }

    /// Uses `pool`, with table names starting with `prefix` and `_` (created by
    /// [`migrate`](DeliveryStore::migrate)).
    pub fn new(pool: SqlitePool, prefix: &str) -> Result<SqliteStore, StoreError> {
        let prefix = Identifier::new(prefix)?;
        let writes = Writes::default();
        Ok(SqliteStore {
            sql: Arc::new(Statements::new(&prefix)),
            schedule_sql: Arc::new(schedules::ScheduleStatements::new(&prefix)),
            deliveries: Arc::new(deliveries(pool.clone(), writes.clone(), &prefix)),
            occurrences: Arc::new(schedules::occurrences(
                pool.clone(),
                writes.clone(),
                &prefix,
            )),
            pool,
            prefix,
            keep_alive: None,
            wake: Arc::default(),
            writes,
        })
    }

    /// The connection pool, for the application's own queries and transactions.
    ///
    /// A transaction that reads before it writes should start with
    /// `pool.begin_with("BEGIN IMMEDIATE")`: in WAL mode a deferred one fails with
    /// `SQLITE_BUSY` at its first write if another connection wrote since its first read.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The prefix of the table names.
    pub fn prefix(&self) -> &Identifier {
        &self.prefix
    }

    /// Deletes the inbox marks older than `age` (`processed_at` is INTEGER milliseconds on the
    /// application's clock, like every record time here) and returns how many it deleted. A
    /// mark only has to outlive the redeliveries of its message: keep `age` well above the
    /// longest a message can still come back (retries, leases, a dead letter you may replay),
    /// or a late duplicate runs its handler again.
    ///
    /// ```no_run
    /// # async fn example(store: hexeract::store::sqlite::SqliteStore) -> Result<(), hexeract::store::StoreError> {
    /// use std::time::Duration;
    ///
    /// let purged = store.purge_inbox_older_than(Duration::from_secs(7 * 24 * 3600)).await?;
    /// # let _ = purged;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn purge_inbox_older_than(&self, age: Duration) -> Result<u64, StoreError> {
        let done = sqlx::query(&self.sql.purge_inbox)
            .bind(now_millis().saturating_sub(millis(age)))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

impl SqliteStore {
    /// Up to `limit_rows` outbox rows not leased (or whose lease ended), oldest first: their
    /// ids and types.
    async fn pick_in(
        &self,
        conn: &mut SqliteConnection,
        limit_rows: u32,
    ) -> Result<Vec<(String, String)>, StoreError> {
        Ok(sqlx::query_as(&self.sql.pick)
            .bind(now_millis())
            .bind(limit(limit_rows))
            .fetch_all(&mut *conn)
            .await?)
    }

    /// [`DeliveryStore::expand`] on `conn`, inside its transaction.
    async fn expand_in(
        &self,
        conn: &mut SqliteConnection,
        routes: &Routes,
        limit_rows: u32,
    ) -> Result<u64, StoreError> {
        let picked = self.pick_in(conn, limit_rows).await?;
        let ids: Vec<String> = picked.into_iter().map(|(id, _)| id).collect();
        self.expand_ids_in(conn, routes, &ids).await
    }

    /// Moves the outbox rows `ids` into deliveries, one per handler of their type in `routes`
    /// (one with no handler where none is).
    async fn expand_ids_in(
        &self,
        conn: &mut SqliteConnection,
        routes: &Routes,
        ids: &[String],
    ) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        sqlx::query(&self.sql.expand_to_deliveries)
            .bind(Json(&routes.pairs))
            .bind(now_millis())
            .bind(Json(ids))
            .execute(&mut *conn)
            .await?;
        let moved = sqlx::query(&self.sql.expand_from_outbox)
            .bind(Json(ids))
            .execute(&mut *conn)
            .await?;
        Ok(moved.rows_affected())
    }

    /// [`DeliveryStore::take`] on `conn`, inside its transaction, where a type has several
    /// handlers: the due deliveries, then new outbox rows (or rows whose claim's lease ended)
    /// up to `limit_rows` in all, oldest first. Those of a type with several handlers are
    /// expanded into deliveries, which are claimed too; the others are claimed in place.
    async fn take_in(
        &self,
        conn: &mut SqliteConnection,
        routes: &Routes,
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> Result<Vec<Claimed>, StoreError> {
        let (single, several) = routes.split();
        let handlers: Vec<(&str, &str)> = single.types.into_iter().zip(single.handlers).collect();
        let mut claimed = self.claim_in(conn, token, limit_rows, lease).await?;
        let left = limit_rows.saturating_sub(claimed.len() as u32);
        if left == 0 {
            return Ok(claimed);
        }
        let now = now_millis();
        let until = now.saturating_add(millis(lease));
        let picked = self.pick_in(conn, left).await?;
        let (expanded, in_place): (Vec<_>, Vec<_>) = picked
            .into_iter()
            .partition(|(_, message_type)| several.types.contains(&message_type.as_str()));
        let expanded: Vec<String> = expanded.into_iter().map(|(id, _)| id).collect();
        self.expand_ids_in(conn, routes, &expanded).await?;
        if !in_place.is_empty() {
            let ids: Vec<String> = in_place.into_iter().map(|(id, _)| id).collect();
            let rows = sqlx::query(&self.sql.claim_in_place_listed)
                .bind(token.hyphenated())
                .bind(until)
                .bind(Json(&handlers))
                .bind(Json(&ids))
                .fetch_all(&mut *conn)
                .await?;
            self.keep_in_place(conn, token, &rows, &mut claimed).await?;
        }
        let left = limit_rows.saturating_sub(claimed.len() as u32);
        if !expanded.is_empty() && left > 0 {
            claimed.extend(self.claim_in(conn, token, left, lease).await?);
        }
        Ok(claimed)
    }

    /// Where every type has at most one handler: deletes the acks of `acked` (its token and
    /// ids), claims the due deliveries, then claims as many new outbox rows in place as the
    /// limit has room for, with `handlers` the routes as (type, handler) pairs; returns how
    /// many acks landed and what it claimed. Four statements, each atomic on its own, sent to
    /// the connection's thread as one: one round trip, where each statement (and a
    /// transaction's `BEGIN` and `COMMIT`) costs two thread switches of its own. A take
    /// interrupted between them leaves no transaction open; what ran stays done (acks landed,
    /// deliveries claimed under a lease).
    async fn ack_and_take_in_place(
        &self,
        conn: &mut SqliteConnection,
        acked: (Uuid, &[DeliveryId]),
        handlers: &[(&str, &str)],
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> Result<(u64, Vec<Claimed>), StoreError> {
        #![allow(deprecated)]
        use futures_util::TryStreamExt;
        let (acked_token, acked) = acked;
        let acked: Vec<serde_json::Value> = acked
            .iter()
            .map(|id| match *id {
                DeliveryId::Row(row) => serde_json::Value::from(row),
                DeliveryId::Outbox(message) => serde_json::Value::from(message.to_string()),
            })
            .collect();
        let acks = sqlx::query(&self.sql.ack_and_take_in_place)
            .bind(acked_token.hyphenated())
            .bind(Json(&acked));
        let mut results = bind_claim(acks, token, limit_rows, lease)
            .bind(Json(handlers))
            // sqlx 0.8 runs every statement of a query on SQLite, and marks it deprecated
            // (launchbadge/sqlx#3108) with nothing that binds arguments in its place. Where it
            // goes, these become four statements of the same transaction.
            .fetch_many(&mut *conn);
        // Each statement's rows, then its result: the two acks', then the two claims'.
        let (mut statement, mut landed) = (0, 0);
        let mut claimed = Vec::new();
        let mut in_place = Vec::new();
        while let Some(step) = results.try_next().await? {
            match step {
                sqlx::Either::Left(done) => {
                    if statement < 2 {
                        landed += done.rows_affected();
                    }
                    statement += 1;
                }
                sqlx::Either::Right(row) if statement == 2 => claimed.push(claimed_from_row(&row)?),
                sqlx::Either::Right(row) => in_place.push(row),
            }
        }
        drop(results);
        if statement != 4 {
            return Err(StoreError::Database(sqlx::Error::Protocol(format!(
                "the take ran {statement} of its 4 statements"
            ))));
        }
        self.keep_in_place(conn, token, &in_place, &mut claimed)
            .await?;
        Ok((landed, claimed))
    }

    /// Adds the rows a claim in place returned to `claimed`, but for copies of messages that
    /// have their delivery already (published again after a retry moved the first copy
    /// into deliveries), which it deletes unhandled, and rows whose id is not a UUID (written
    /// by another program), which it dead-letters as [`Reason::MESSAGE_UNREADABLE`]: such a row
    /// cannot be settled by id later, and the rows claimed with it are handled.
    async fn keep_in_place(
        &self,
        conn: &mut SqliteConnection,
        token: Uuid,
        rows: &[SqliteRow],
        claimed: &mut Vec<Claimed>,
    ) -> Result<(), StoreError> {
        let mut duplicates = Vec::new();
        for row in rows {
            if uuid(row, "message_id").is_err() {
                self.dead_letter_unkeyed(conn, row).await?;
                continue;
            }
            match claimed_from_row(row)? {
                copy if row.try_get::<i64, _>("duplicate")? != 0 => {
                    duplicates.push(copy.envelope.id);
                }
                delivery => claimed.push(delivery),
            }
        }
        if !duplicates.is_empty() {
            sqlx::query(&self.deliveries.in_place.ack)
                .bind(Json(&duplicates))
                .bind(token.hyphenated())
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// Dead-letters the outbox row claimed in place as `row`, whose id is not a UUID, and
    /// deletes it by the id as stored, both in one savepoint.
    async fn dead_letter_unkeyed(
        &self,
        conn: &mut SqliteConnection,
        row: &SqliteRow,
    ) -> Result<(), StoreError> {
        let raw: String = row.try_get("message_id")?;
        let (envelope, detail) = envelope_from_row(row, row.try_get("attempts")?);
        let detail = detail.unwrap_or_else(|| format!("message_id {raw:?} is not a UUID"));
        let handler: String = row.try_get("handler")?;
        tracing::error!(message_id = %raw, %detail, "outbox row cannot be read; dead-lettered");
        crate::metrics::dead_lettered_at_take(&handler, &Reason::MESSAGE_UNREADABLE);
        let mut letter = DeadLetter::new(
            envelope,
            Some(handler).filter(|handler| !handler.is_empty()),
            Reason::MESSAGE_UNREADABLE,
            &detail,
        );
        // No call was made: the claim's count is not an attempt.
        letter.attempts = 0;
        let mut savepoint = conn.begin().await?;
        insert_dead_letter(&self.sql.insert_dead_letter, &letter)
            .execute(&mut *savepoint)
            .await?;
        sqlx::query(&self.sql.relay_delete)
            .bind(Json([&raw]))
            .execute(&mut *savepoint)
            .await?;
        savepoint.commit().await?;
        Ok(())
    }

    /// [`DeliveryStore::claim`] on `conn`.
    async fn claim_in(
        &self,
        conn: &mut SqliteConnection,
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> Result<Vec<Claimed>, StoreError> {
        let rows = bind_claim(sqlx::query(&self.sql.claim), token, limit_rows, lease)
            .fetch_all(&mut *conn)
            .await?;
        rows.iter().map(claimed_from_row).collect()
    }
}

/// A claimed delivery: a `deliveries` row, or an outbox row claimed in place (no `id`).
fn claimed_from_row(row: &SqliteRow) -> Result<Claimed, StoreError> {
    let id = match row.try_get::<Option<i64>, _>("id")? {
        Some(id) => DeliveryId::Row(id),
        None => DeliveryId::Outbox(uuid(row, "message_id")?),
    };
    let (envelope, unreadable) = envelope_from_row(row, row.try_get("attempts")?);
    Ok(Claimed {
        id,
        handler: row.try_get("handler")?,
        envelope,
        recovered: row.try_get::<i64, _>("recovered")? != 0,
        unreadable,
    })
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("prefix", &self.prefix)
            .field("in_memory", &self.keep_alive.is_some())
            .finish_non_exhaustive()
    }
}

/// Writes `envelopes` to the outbox of `prefix` on `conn`, inside whatever transaction `conn`
/// is in (several envelopes in a savepoint of their own, so all or none are written). What
/// [`outbox::enqueue`](crate::outbox::enqueue) does on SQLite.
pub async fn insert_outbox(
    conn: &mut SqliteConnection,
    prefix: &Identifier,
    envelopes: &[Envelope],
) -> Result<(), StoreError> {
    let sql = Statements::insert_outbox(prefix);
    if envelopes.len() <= 1 {
        return insert_rows(conn, &sql, envelopes).await;
    }
    let mut savepoint = conn.begin().await?;
    insert_rows(&mut savepoint, &sql, envelopes).await?;
    savepoint.commit().await?;
    Ok(())
}

/// Records in the inbox of `prefix`, on `conn` and inside whatever transaction `conn` is in,
/// that `handler` processed `message_id`, at now on the application's clock. `true` when the
/// row is new, `false` when it was already there. What
/// [`outbox::inbox::mark_processed`](crate::outbox::inbox::mark_processed) does on SQLite.
pub(crate) async fn insert_inbox(
    conn: &mut SqliteConnection,
    prefix: &Identifier,
    handler: &str,
    message_id: Uuid,
) -> Result<bool, StoreError> {
    let done = sqlx::query(&Statements::insert_inbox(prefix))
        .bind(handler)
        .bind(message_id.hyphenated())
        .bind(now_millis())
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// One prepared insert per envelope: SQLite runs in-process, so rows are cheap and a batch
/// never meets the limit on bound parameters.
async fn insert_rows(
    conn: &mut SqliteConnection,
    sql: &str,
    envelopes: &[Envelope],
) -> Result<(), StoreError> {
    crate::store::limit::check(envelopes)?;
    for envelope in envelopes {
        bind_message(sqlx::query(sql).bind(envelope.id.hyphenated()), envelope)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// A statement that writes a message.
type SqliteQuery<'q> = sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// `query` with `envelope`'s [`MESSAGE_COLUMNS`] bound next, in their order, as SQLite keeps them
/// (ids as hyphenated text).
fn bind_message<'q>(query: SqliteQuery<'q>, envelope: &'q Envelope) -> SqliteQuery<'q> {
    query
        .bind(envelope.message_type.as_str())
        .bind(&envelope.payload[..])
        .bind(Json(&envelope.headers))
        .bind(envelope.correlation_id.map(Uuid::hyphenated))
        .bind(envelope.causation_id.map(Uuid::hyphenated))
        .bind(envelope.aggregate.as_deref())
        .bind(envelope.aggregate_key.as_deref())
        .bind(envelope.created_at)
}

/// The writes of the outbox's hot path queue here, in the order they come, before they take
/// SQLite's write lock: `publish`, the worker's expansion, claim and take, and the settling of
/// a claimed delivery or occurrence (ack, release, retry, dead letter). Writers of one process
/// that met at the lock would wait in its busy handler, which sleeps 1, 2, 5, 10 … ms between
/// tries while the lock may have been free for most of it.
///
/// The store's other writes (the relay's, dead letters written by a broker's worker, replays
/// and purges, migrations, the scheduler's plans and delayed messages), other processes, and
/// the application's own transactions on [`SqliteStore::pool`] still meet them at the lock
/// (the busy timeout, 5 s).
pub(super) type Writes = Arc<tokio::sync::Mutex<()>>;

/// How a claim is settled, for deliveries and schedule occurrences alike (one claim model): an
/// ack deletes the row, a retry makes it due again, a release gives it back with its attempt
/// not counted, a dead letter copies it to `dead_letters` and deletes it; each only while the
/// row still holds the settling worker's token.
pub(super) struct Settle {
    pool: SqlitePool,
    writes: Writes,
    ack: String,
    release: String,
    retry: String,
    /// `retry` copies the row elsewhere (binding the id, the token, the due time and the
    /// detail), and `delete` then deletes it, in one transaction; else `retry` updates it.
    retry_moves: bool,
    dead_letter_copy: String,
    delete: String,
}

impl Settle {
    /// The statements of `name`, where a claimed row has `id`, `attempts`, `available_at`,
    /// `lease_owner`, `recovered` and `last_error`. `to_dead_letters` is an `INSERT … SELECT`
    /// (without its `FROM`) over the claimed row, binding `?3` (the letter's id), `?4` (reason),
    /// `?5` (detail), `?6` (when) and `?7` (calls made).
    pub(super) fn new(
        pool: SqlitePool,
        writes: Writes,
        prefix: &Identifier,
        name: &str,
        to_dead_letters: &str,
    ) -> Settle {
        let t = table(prefix, name);
        Settle {
            pool,
            writes,
            ack: format!("DELETE FROM {t} WHERE {LISTED}"),
            release: format!(
                "UPDATE {t} SET attempts = attempts - 1, lease_owner = NULL, available_at = ?3
                 WHERE {LISTED}"
            ),
            retry: format!(
                "UPDATE {t} SET available_at = ?3, lease_owner = NULL, recovered = 0, last_error = ?4
                 WHERE {CLAIMED}"
            ),
            retry_moves: false,
            dead_letter_copy: format!("{to_dead_letters} FROM {t} WHERE {CLAIMED}"),
            delete: format!("DELETE FROM {t} WHERE {CLAIMED}"),
        }
    }

    /// The `ack` or `release` statement over `ids`.
    async fn each<I: ClaimId>(&self, sql: &str, token: Uuid, ids: &[I]) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let _writing = self.writes.lock().await;
        let done = sqlx::query(sql)
            .bind(Json(ids))
            .bind(token.hyphenated())
            // `release` makes them due now; `ack` has no third parameter.
            .bind(now_millis())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}

impl Settle {
    /// The `ack` of `ids` on `conn`, inside the transaction it is in, under the write lock its
    /// caller holds.
    async fn ack_in<I: ClaimId>(
        &self,
        conn: &mut SqliteConnection,
        token: Uuid,
        ids: &[I],
    ) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(&self.ack)
            .bind(Json(ids))
            .bind(token.hyphenated())
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }
}

impl<I: ClaimId> Claims<I> for Settle {
    fn ack<'a>(&'a self, token: Uuid, ids: &'a [I]) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.each(&self.ack, token, ids))
    }

    fn release<'a>(&'a self, token: Uuid, ids: &'a [I]) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.each(&self.release, token, ids))
    }

    fn retry<'a>(
        &'a self,
        token: Uuid,
        id: I,
        delay: Duration,
        detail: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let retry = sqlx::query(&self.retry)
                .bind(id.bound())
                .bind(token.hyphenated())
                .bind(due_in(delay))
                .bind(crate::dead_letter::truncate_detail(detail));
            if self.retry_moves {
                return self.move_out(id, token, retry).await;
            }
            let _writing = self.writes.lock().await;
            Ok(retry.execute(&self.pool).await?.rows_affected() == 1)
        })
    }

    fn dead_letter<'a>(
        &'a self,
        token: Uuid,
        id: I,
        reason: &'a Reason,
        detail: &'a str,
        calls: u32,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let copy = sqlx::query(&self.dead_letter_copy)
                .bind(id.bound())
                .bind(token.hyphenated())
                .bind(Uuid::now_v7().hyphenated())
                .bind(reason.as_str())
                .bind(crate::dead_letter::truncate_detail(detail))
                .bind(now_millis())
                .bind(i64::from(calls));
            self.move_out(id, token, copy).await
        })
    }
}

impl Settle {
    /// Copies a claimed row elsewhere with `copy` (which binds its id `?1` and token `?2`)
    /// and, if it copied it, deletes it, in one write transaction; `false` when the claim was
    /// lost.
    async fn move_out<'q, I: ClaimId>(
        &self,
        id: I,
        token: Uuid,
        copy: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<bool, StoreError> {
        let _writing = self.writes.lock().await;
        let mut tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
        let copied = copy.execute(&mut *tx).await?.rows_affected();
        if copied == 1 {
            sqlx::query(&self.delete)
                .bind(id.bound())
                .bind(token.hyphenated())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(copied == 1)
    }
}

/// The [`Settle`] of messages claimed in place in the outbox: an ack deletes the row, a
/// release gives it back, a dead letter moves it to `dead_letters` with its handler's name,
/// and a retry moves it into `deliveries`, where it waits for its due time with the
/// deliveries of other types (so that the outbox holds only what is new or running).
fn in_place(pool: SqlitePool, writes: Writes, prefix: &Identifier) -> Settle {
    let (o, d) = (table(prefix, "outbox"), table(prefix, "deliveries"));
    let m = MESSAGE_COLUMNS;
    // An outbox row has no `available_at`: its release and retry are its own.
    Settle {
        release: format!(
            "UPDATE {o} SET attempts = attempts - 1, lease_owner = NULL, leased_until = NULL
             WHERE {LISTED}"
        ),
        retry: format!(
            "INSERT INTO {d} (message_id, handler, attempts, available_at, last_error, {m})
             SELECT id, handler, attempts, ?3, ?4, {m} FROM {o} WHERE {CLAIMED}
             ON CONFLICT (message_id, handler) DO NOTHING"
        ),
        retry_moves: true,
        ..Settle::new(
            pool,
            writes,
            prefix,
            "outbox",
            &to_dead_letters(prefix, "id"),
        )
    }
}

/// The deliveries' settling: a dead letter keeps the message as it was, and no handler where
/// none knew its type.
fn deliveries(pool: SqlitePool, writes: Writes, prefix: &Identifier) -> Deliveries<Settle, Settle> {
    Deliveries {
        rows: Settle::new(
            pool.clone(),
            writes.clone(),
            prefix,
            "deliveries",
            &to_dead_letters(prefix, "message_id"),
        ),
        in_place: in_place(pool, writes, prefix),
    }
}

/// Where a row is the one claimed: `?1` its id, `?2` the token it is claimed under.
const CLAIMED: &str = "id = ?1 AND lease_owner = ?2";

/// Where rows are among those claimed: `?1` their ids as a JSON array, `?2` the token.
const LISTED: &str = "id IN (SELECT value FROM json_each(?1)) AND lease_owner = ?2";

/// The dead letter of a message row (whose message id is its `message_id` column), as an
/// `INSERT … SELECT` without its `FROM`, binding `?3` (the letter's id), `?4` (reason), `?5`
/// (detail), `?6` (when) and `?7` (calls made), with no handler where none knew its type.
fn to_dead_letters(prefix: &Identifier, message_id: &str) -> String {
    let dl = table(prefix, "dead_letters");
    let m = MESSAGE_COLUMNS;
    format!(
        "INSERT INTO {dl}
             (id, message_id, handler, reason, detail, attempts, dead_lettered_at, {m})
         SELECT ?3, {message_id}, NULLIF(handler, ''), ?4, ?5, ?7, ?6, {m}"
    )
}

/// The claim of up to `?4` rows of `table` due at `?2` (that also meet `also`, an `AND …` of
/// their own, from `?5`) under the token `?1`, due again at `?3` (the lease's end): the attempt
/// counted, `recovered` set where an earlier claim was never settled. One statement, so SQLite
/// runs it atomically under its write lock. `returning` names the columns it gives back.
pub(super) fn claim(table: &str, also: &str, returning: &str) -> String {
    claim_binding(table, also, returning, ["?1", "?2", "?3", "?4"])
}

/// `query` with a [`claim`]'s token, now, lease end and limit bound next, in that order.
fn bind_claim<'q>(
    query: SqliteQuery<'q>,
    token: Uuid,
    limit_rows: u32,
    lease: Duration,
) -> SqliteQuery<'q> {
    let now = now_millis();
    query
        .bind(token.hyphenated())
        .bind(now)
        .bind(now.saturating_add(millis(lease)))
        .bind(limit(limit_rows))
}

/// [`claim`] with its token, now, lease end and limit bound from `params`, in that order.
fn claim_binding(table: &str, also: &str, returning: &str, params: [&str; 4]) -> String {
    let [token, now, until, limit] = params;
    format!(
        "UPDATE {table}
         SET attempts = attempts + 1,
             -- SET sees the row as it was: a token still there is an unsettled claim.
             recovered = recovered OR lease_owner IS NOT NULL,
             lease_owner = {token},
             available_at = {until}
         WHERE id IN (
             SELECT id FROM {table}
             WHERE available_at <= {now} {also}
             ORDER BY available_at
             LIMIT {limit})
         RETURNING {returning}"
    )
}

/// The claim in place of the outbox rows `which` selects (a `SELECT` of ids from `?4` on) under
/// the token `?1` until `?2`: the attempt counted, `recovered` set where an earlier claim was
/// never settled, and the handler named from `?3` (a JSON array of [type, handler] pairs for
/// the types with one handler; none where no handler knows the type).
fn claim_in_place(o: &str, d: &str, which: &str) -> String {
    claim_in_place_binding(o, d, which, ["?1", "?2", "?3"])
}

/// [`claim_in_place`] with its token, lease end and handlers bound from `params`, in that
/// order.
fn claim_in_place_binding(o: &str, d: &str, which: &str, params: [&str; 3]) -> String {
    let [token, until, handlers] = params;
    let m = MESSAGE_COLUMNS;
    let which = which.replace("{o}", o);
    format!(
        "UPDATE {o}
         SET handler = coalesce((SELECT json_extract(value, '$[1]') FROM json_each({handlers})
                                 WHERE json_extract(value, '$[0]') = message_type), ''),
             attempts = attempts + 1,
             -- SET sees the row as it was: a token still there is an unsettled claim.
             recovered = recovered OR lease_owner IS NOT NULL,
             lease_owner = {token},
             leased_until = {until}
         WHERE id IN ({which})
         RETURNING NULL AS id, id AS message_id, handler, attempts, recovered, {m},
                   -- Published again after a retry moved the first copy into deliveries:
                   -- that delivery is the message's, this copy goes.
                   EXISTS (SELECT 1 FROM {d} AS d
                           WHERE d.message_id = {o}.id AND d.handler = {o}.handler)
                       AS duplicate"
    )
}

/// The id of a claimed row: an INTEGER (deliveries) or a UUID as text (occurrences). Lists of
/// them are bound as JSON arrays, which a UUID joins in the same text form.
pub(super) trait ClaimId: serde::Serialize + Send + Sync + Copy + 'static {
    /// The id as SQLite stores it.
    type Bound: for<'q> sqlx::Encode<'q, Sqlite> + sqlx::Type<Sqlite> + Send + 'static;

    fn bound(self) -> Self::Bound;
}

impl ClaimId for i64 {
    type Bound = i64;

    fn bound(self) -> i64 {
        self
    }
}

impl ClaimId for Uuid {
    type Bound = Hyphenated;

    fn bound(self) -> Hyphenated {
        self.hyphenated()
    }
}

/// Every statement, with the table names quoted in once.
struct Statements {
    insert_outbox: String,
    pick: String,
    /// Four statements sent as one ([`SqliteStore::ack_and_take_in_place`]).
    ack_and_take_in_place: String,
    claim_in_place_listed: String,
    expand_to_deliveries: String,
    expand_from_outbox: String,
    claim: String,
    dead_letter: String,
    insert_dead_letter: String,
    relay_take: String,
    relay_delete: String,
    replay_to_handler: String,
    replay_to_outbox: String,
    replay_delete: String,
    delete_dead_letters: String,
    purge_inbox: String,
}

/// The columns of a message wherever it waits: the outbox, a delivery, a dead letter, a
/// delayed message (schema version 5 on). In this order in every statement that binds them.
const MESSAGE_COLUMNS: &str = "message_type, payload, headers, correlation_id, causation_id, \
                               aggregate, aggregate_key, created_at";

/// Now on SQLite's clock as INTEGER milliseconds, for column defaults.
const NOW_MILLIS_SQL: &str = "(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))";

/// `"<prefix>_<name>"`: the prefix is a checked identifier, so there is nothing to escape.
fn table(prefix: &Identifier, name: &str) -> String {
    format!("\"{prefix}_{name}\"")
}

impl Statements {
    fn new(prefix: &Identifier) -> Statements {
        let o = table(prefix, "outbox");
        let d = table(prefix, "deliveries");
        let dl = table(prefix, "dead_letters");
        let m = MESSAGE_COLUMNS;
        Statements {
            insert_outbox: Statements::insert_outbox(prefix),
            // Rows nobody holds: new, or their claim's lease ended (`?1` now).
            pick: format!(
                "SELECT id, message_type FROM {o}
                 WHERE leased_until IS NULL OR leased_until <= ?1
                 ORDER BY id LIMIT ?2"
            ),
            claim_in_place_listed: claim_in_place(&o, &d, "SELECT value FROM json_each(?4)"),
            // `?1` the acks' token, `?2` the acked ids as a JSON array (deliveries rows as
            // integers, messages claimed in place as text); `?3` the new claim's token, `?4`
            // now, `?5` the lease's end, `?6` the limit, `?7` the routes of the types with
            // one handler. The claim in place takes what the claim of due deliveries left of
            // the limit: `changes()` is the rows that statement claimed. sqlx binds the
            // numbers the statements do not use with the arguments in order, and stops
            // binding a statement once those run out: the acks come first, so that the
            // claims skip two numbers and not the other way round.
            ack_and_take_in_place: format!(
                "DELETE FROM {d}
                 WHERE id IN (SELECT value FROM json_each(?2) WHERE type = 'integer')
                   AND lease_owner = ?1;
                 DELETE FROM {o}
                 WHERE id IN (SELECT value FROM json_each(?2) WHERE type = 'text')
                   AND lease_owner = ?1;
                 {claim};
                 {in_place}",
                claim = claim_binding(
                    &d,
                    "",
                    &format!("id, message_id, handler, attempts, recovered, {m}"),
                    ["?3", "?4", "?5", "?6"],
                ),
                in_place = claim_in_place_binding(
                    &o,
                    &d,
                    "SELECT id FROM {o} WHERE leased_until IS NULL OR leased_until <= ?4
                     ORDER BY id LIMIT max(?6 - changes(), 0)",
                    ["?3", "?5", "?7"],
                ),
            ),
            // With `expand_from_outbox`, in one `BEGIN IMMEDIATE` transaction, over the same
            // picked rows `?3` (a JSON array of ids). `?1` is the routes as a JSON array of
            // [type, handler] pairs. A row claimed in place before whose claim ended carries
            // `recovered` into its deliveries.
            expand_to_deliveries: format!(
                "INSERT INTO {d} (message_id, handler, available_at, recovered, {m})
                 SELECT id, coalesce(route_handler, ''), ?2,
                        lease_owner IS NOT NULL OR recovered, {m}
                 FROM (SELECT * FROM {o} WHERE id IN (SELECT value FROM json_each(?3)))
                 LEFT JOIN (SELECT json_extract(value, '$[0]') AS route_type,
                                   json_extract(value, '$[1]') AS route_handler
                            FROM json_each(?1))
                   ON route_type = message_type
                 WHERE true
                 ON CONFLICT (message_id, handler) DO NOTHING"
            ),
            expand_from_outbox: format!(
                "DELETE FROM {o} WHERE id IN (SELECT value FROM json_each(?1))"
            ),
            // One statement, so SQLite runs it atomically under its write lock.
            claim: claim(
                &d,
                "",
                &format!("id, message_id, handler, attempts, recovered, {m}"),
            ),
            // Not a message an outbox worker holds in place (a switch from handlers in the
            // process to a broker while one still runs): it is that worker's until its lease
            // ends (`?2` now).
            relay_take: format!(
                "SELECT id AS message_id, {m} FROM {o}
                 WHERE leased_until IS NULL OR leased_until <= ?2
                 ORDER BY id LIMIT ?1"
            ),
            relay_delete: format!("DELETE FROM {o} WHERE id IN (SELECT value FROM json_each(?1))"),
            insert_dead_letter: format!(
                "INSERT INTO {dl}
                     (id, message_id, handler, reason, detail, attempts, dead_lettered_at, {m})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)
                 ON CONFLICT (id) DO NOTHING"
            ),
            dead_letter: format!(
                "SELECT id, message_id, handler, reason, detail, attempts, dead_lettered_at, {m}
                 FROM {dl} WHERE id = ?1"
            ),
            replay_to_handler: format!(
                "INSERT INTO {d} (message_id, handler, available_at, {m})
                 SELECT message_id, handler, ?2, {m} FROM {dl}
                 WHERE id = ?1 AND handler IS NOT NULL
                 ON CONFLICT (message_id, handler) DO NOTHING"
            ),
            replay_to_outbox: format!(
                "INSERT INTO {o} (id, {m})
                 SELECT message_id, {m} FROM {dl}
                 WHERE id = ?1 AND handler IS NULL
                 ON CONFLICT (id) DO NOTHING"
            ),
            replay_delete: format!("DELETE FROM {dl} WHERE id = ?1"),
            delete_dead_letters: format!(
                "DELETE FROM {dl} WHERE id IN (SELECT value FROM json_each(?1))"
            ),
            // No index on processed_at: a purge reads the whole inbox, which it runs rarely.
            purge_inbox: format!(
                "DELETE FROM {inbox} WHERE processed_at < ?1",
                inbox = table(prefix, "inbox")
            ),
        }
    }

    fn insert_outbox(prefix: &Identifier) -> String {
        let o = table(prefix, "outbox");
        let m = MESSAGE_COLUMNS;
        // A message still in the outbox (waiting, or claimed in place and running) published
        // again, by a producer retrying: the copy there stands.
        format!(
            "INSERT INTO {o} (id, {m}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (id) DO NOTHING"
        )
    }

    fn insert_inbox(prefix: &Identifier) -> String {
        let inbox = table(prefix, "inbox");
        format!(
            "INSERT INTO {inbox} (handler, message_id, processed_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (handler, message_id) DO NOTHING"
        )
    }

    /// Version 1 of the schema.
    fn schema_v1(prefix: &Identifier) -> String {
        let o = table(prefix, "outbox");
        let d = table(prefix, "deliveries");
        let dl = table(prefix, "dead_letters");
        let inbox = table(prefix, "inbox");
        let deliveries_due = table(prefix, "deliveries_due");
        let dead_letters_by_time = table(prefix, "dead_letters_by_time");
        let now = NOW_MILLIS_SQL;
        // The message a delivery or a dead letter keeps: its MESSAGE_COLUMNS.
        let message = "message_type TEXT NOT NULL,
                 payload BLOB NOT NULL,
                 headers TEXT NOT NULL,
                 correlation_id TEXT,
                 causation_id TEXT,
                 aggregate TEXT,
                 aggregate_key TEXT,
                 -- When the message was published: its first sight.
                 created_at TEXT NOT NULL";
        format!(
            "CREATE TABLE {o} (
                 id TEXT NOT NULL PRIMARY KEY,
                 message_type TEXT NOT NULL,
                 payload BLOB NOT NULL,
                 headers TEXT NOT NULL DEFAULT '{{}}',
                 correlation_id TEXT,
                 causation_id TEXT,
                 -- For an ordered relay (Kafka): the aggregate and its id, when the message has one.
                 aggregate TEXT,
                 aggregate_key TEXT,
                 created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
             ) STRICT;

             CREATE TABLE {d} (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 message_id TEXT NOT NULL,
                 -- '' when no handler knew the message type at expansion.
                 handler TEXT NOT NULL,
                 attempts INTEGER NOT NULL DEFAULT 0,
                 -- Due time in ms since the epoch; a claim moves it to the end of the lease.
                 available_at INTEGER NOT NULL,
                 -- The claim token of the worker holding it, if any.
                 lease_owner TEXT,
                 last_error TEXT,
                 {message},
                 UNIQUE (message_id, handler)
             ) STRICT;
             CREATE INDEX {deliveries_due} ON {d} (available_at);

             CREATE TABLE {dl} (
                 id TEXT NOT NULL PRIMARY KEY,
                 message_id TEXT NOT NULL,
                 handler TEXT,
                 reason TEXT NOT NULL,
                 detail TEXT NOT NULL,
                 attempts INTEGER NOT NULL,
                 dead_lettered_at INTEGER NOT NULL DEFAULT {now},
                 {message}
             ) STRICT;
             CREATE INDEX {dead_letters_by_time} ON {dl} (dead_lettered_at, id);

             CREATE TABLE {inbox} (
                 handler TEXT NOT NULL,
                 message_id TEXT NOT NULL,
                 processed_at INTEGER NOT NULL DEFAULT {now},
                 PRIMARY KEY (handler, message_id)
             ) STRICT, WITHOUT ROWID;"
        )
    }
}

/// How long a statement waits for another connection's lock before `database is locked`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Puts the file of `options` in WAL mode, which then stays with the file.
///
/// `PRAGMA journal_mode = WAL` needs an exclusive lock that SQLite's busy timeout does not wait
/// for (a connection of another process, or one closing and checkpointing, makes it fail at
/// once with `database is locked`), so the switch is retried here, for up to [`BUSY_TIMEOUT`].
async fn use_wal(options: &SqliteConnectOptions) -> Result<(), StoreError> {
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        let switched = async {
            let connection = options
                .clone()
                .journal_mode(SqliteJournalMode::Wal)
                .connect()
                .await?;
            connection.close().await
        }
        .await;
        match switched {
            Err(error) if is_busy(&error) && started.elapsed() < BUSY_TIMEOUT => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            switched => return Ok(switched?),
        }
    }
}

/// `SQLITE_BUSY` or `SQLITE_LOCKED`, with any extended code.
fn is_busy(error: &sqlx::Error) -> bool {
    let code = match error {
        sqlx::Error::Database(error) => error.code(),
        _ => None,
    };
    code.and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

/// The schema version [`migrate_in`] brings the tables to.
const SCHEMA_VERSION: i64 = 8;

/// Creates or upgrades the schema on `conn`, which is in a `BEGIN IMMEDIATE` transaction:
/// holding the write lock, it is the only migration running, in any process.
async fn migrate_in(conn: &mut SqliteConnection, prefix: &Identifier) -> Result<(), StoreError> {
    let versions = table(prefix, "schema_versions");
    let bootstrap = format!(
        "CREATE TABLE IF NOT EXISTS {versions} (
             version INTEGER PRIMARY KEY,
             applied_at INTEGER NOT NULL DEFAULT {NOW_MILLIS_SQL}
         ) STRICT"
    );
    let current_version = format!("SELECT max(version) FROM {versions}");
    let record = |version: i64| {
        format!(
            "INSERT INTO {versions} (version, applied_at) VALUES ({version}, {NOW_MILLIS_SQL});"
        )
    };
    let (deliveries, dead_letters) = (table(prefix, "deliveries"), table(prefix, "dead_letters"));
    let declared_queues = table(prefix, "declared_queues");
    let outbox = table(prefix, "outbox");
    // Each version: what it adds, and its statements, which record it.
    let steps = [
        (
            1,
            "the outbox",
            format!("{}; {}", Statements::schema_v1(prefix), record(1)),
        ),
        (
            2,
            "deliveries.recovered",
            format!(
                "ALTER TABLE {deliveries} ADD COLUMN recovered INTEGER NOT NULL DEFAULT 0; {}",
                record(2)
            ),
        ),
        (
            3,
            "schedules",
            format!("{}; {}", schedules::schema_v3(prefix), record(3)),
        ),
        (
            4,
            "declared_queues",
            format!(
                "CREATE TABLE {declared_queues} (
                     queue TEXT PRIMARY KEY,
                     handler TEXT NOT NULL,
                     message_type TEXT NOT NULL,
                     declared_at INTEGER NOT NULL
                 ) STRICT, WITHOUT ROWID; {}",
                record(4)
            ),
        ),
        (
            5,
            "scheduled_messages.aggregate",
            format!("{}; {}", schedules::schema_v5(prefix), record(5)),
        ),
        (
            6,
            "dead letters indexed by handler and by reason",
            format!(
                "CREATE INDEX \"{prefix}_dead_letters_by_handler\"
                     ON {dead_letters} (handler, dead_lettered_at, id);
                 CREATE INDEX \"{prefix}_dead_letters_by_reason\"
                     ON {dead_letters} (reason, dead_lettered_at, id); {}",
                record(6)
            ),
        ),
        (
            7,
            "messages with one handler claimed in place in the outbox",
            format!(
                "ALTER TABLE {outbox} ADD COLUMN handler TEXT;
                 ALTER TABLE {outbox} ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
                 ALTER TABLE {outbox} ADD COLUMN lease_owner TEXT;
                 ALTER TABLE {outbox} ADD COLUMN leased_until INTEGER;
                 ALTER TABLE {outbox} ADD COLUMN recovered INTEGER NOT NULL DEFAULT 0; {}",
                record(7)
            ),
        ),
        (
            8,
            "record_attempts: calls of Kafka records remembered across restarts",
            format!(
                "CREATE TABLE {} (
                     group_id TEXT NOT NULL,
                     topic TEXT NOT NULL,
                     partition INTEGER NOT NULL,
                     record_offset INTEGER NOT NULL,
                     calls INTEGER NOT NULL,
                     window_first INTEGER NOT NULL,
                     window_last INTEGER NOT NULL,
                     PRIMARY KEY (group_id, topic, partition)
                 ) STRICT; {}",
                table(prefix, "record_attempts"),
                record(8)
            ),
        ),
    ];

    sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(&bootstrap)).await?;
    let current: Option<i64> = sqlx::query_scalar(&current_version)
        .fetch_one(&mut *conn)
        .await?;
    let current = current.unwrap_or(0);
    for (version, what, statements) in steps.iter().filter(|(v, ..)| *v > current) {
        sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(statements)).await?;
        // New tables are announced once; each upgrade of existing ones is.
        if current > 0 {
            tracing::info!(%prefix, "outbox tables upgraded to version {version} ({what})");
        }
    }
    if current == 0 {
        tracing::info!(%prefix, "outbox tables created (version {SCHEMA_VERSION})");
    }
    Ok(())
}

/// The application's clock in milliseconds since the epoch: the one clock of every due time,
/// since the database runs in this process.
fn now_millis() -> i64 {
    Utc::now().timestamp_millis()
}

/// `delay` after now, in milliseconds since the epoch, saturating (SQLite would turn an
/// overflowing integer into a float).
fn due_in(delay: Duration) -> i64 {
    now_millis().saturating_add(millis(delay))
}

fn uuid(row: &SqliteRow, column: &str) -> Result<Uuid, StoreError> {
    Ok(row.try_get::<Hyphenated, _>(column)?.into_uuid())
}

fn optional_uuid(row: &SqliteRow, column: &str) -> Result<Option<Uuid>, StoreError> {
    Ok(row
        .try_get::<Option<Hyphenated>, _>(column)?
        .map(Hyphenated::into_uuid))
}

/// Reads a message out of a `deliveries`, `dead_letters` or (with `id AS message_id`) outbox
/// row: its [`MESSAGE_COLUMNS`] and `message_id`. A row Hexeract did not write (headers that are
/// not a JSON object of strings, an id or a time that does not parse) is read as far as it can
/// be, with what was wrong: see [`Problems`]. A message id that is not a UUID reads as one
/// derived from it.
fn envelope_from_row(row: &SqliteRow, attempts: i64) -> (Envelope, Option<String>) {
    let mut problems = Problems::default();
    let headers = problems.headers_column(row.try_get("headers"), || row.try_get("headers"));
    let message_type = problems.or(
        "message_type",
        row.try_get::<String, _>("message_type"),
        String::new(),
    );
    let payload = problems.or("payload", row.try_get::<Vec<u8>, _>("payload"), Vec::new());
    let mut envelope = Envelope::from_raw(message_type, Bytes::from(payload));
    envelope.id = match uuid(row, "message_id") {
        Ok(id) => id,
        Err(error) => {
            let raw: String = row.try_get("message_id").unwrap_or_default();
            problems.note(format!("message_id {raw:?}: {error}"));
            unreadable_id(&raw)
        }
    };
    envelope.headers = headers;
    envelope.correlation_id =
        problems.or("correlation_id", optional_uuid(row, "correlation_id"), None);
    envelope.causation_id = problems.or("causation_id", optional_uuid(row, "causation_id"), None);
    envelope.aggregate = problems.or("aggregate", row.try_get("aggregate"), None);
    envelope.aggregate_key = problems.or("aggregate_key", row.try_get("aggregate_key"), None);
    envelope.created_at = problems.or(
        "created_at",
        row.try_get("created_at"),
        DateTime::<Utc>::UNIX_EPOCH,
    );
    envelope.attempt = u32::try_from(attempts).unwrap_or(0);
    (envelope, problems.into_detail())
}

/// The id a message whose stored id is not a UUID is known by (UUID v5 in a namespace of
/// Hexeract's): stable, so that its dead letter is found again.
fn unreadable_id(raw: &str) -> Uuid {
    const NAMESPACE: Uuid = Uuid::from_u128(0x6865_7865_7261_6374_2d73_716c_6974_6521);
    Uuid::new_v5(&NAMESPACE, raw.as_bytes())
}

fn dead_letter_from_row(row: &SqliteRow) -> Result<DeadLetter, StoreError> {
    let id = uuid(row, "id")?;
    let attempts: i64 = row.try_get("attempts")?;
    let dead_lettered_at: i64 = row.try_get("dead_lettered_at")?;
    Ok(DeadLetter {
        id,
        envelope: envelope_from_row(row, attempts).0,
        handler: row.try_get("handler")?,
        reason: Reason::from(row.try_get::<String, _>("reason")?),
        detail: row.try_get("detail")?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        dead_lettered_at: DateTime::from_timestamp_millis(dead_lettered_at).ok_or_else(|| {
            StoreError::Corrupt {
                id: id.to_string(),
                problem: format!("dead_lettered_at {dead_lettered_at} is out of range"),
            }
        })?,
    })
}

/// The `insert_dead_letter` statement with `letter` bound.
fn insert_dead_letter<'q>(sql: &'q str, letter: &'q DeadLetter) -> SqliteQuery<'q> {
    let envelope = &letter.envelope;
    let query = sqlx::query(sql)
        .bind(letter.id.hyphenated())
        .bind(envelope.id.hyphenated())
        .bind(letter.handler.as_deref())
        .bind(letter.reason.as_str())
        .bind(crate::dead_letter::truncate_detail(&letter.detail))
        .bind(i64::from(letter.attempts))
        .bind(letter.dead_lettered_at.timestamp_millis());
    bind_message(query, envelope)
}

/// Binds the values of a [`DeadLetterSql`] query's conditions, in their order (times as the INTEGER
/// milliseconds and ids as the text they are stored as).
fn bind_matching<'q>(
    mut query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    filter: &'q DeadLetterFilter,
    page: Option<&'q Page>,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    if let Some(handler) = &filter.handler {
        query = query.bind(handler);
    }
    if let Some(reason) = &filter.reason {
        query = query.bind(reason);
    }
    if let Some(before) = filter.before {
        query = query.bind(before.timestamp_millis());
    }
    if let Some((at, id)) = page.and_then(|page| page.after) {
        query = query.bind(at.timestamp_millis()).bind(id.hyphenated());
    }
    query
}

fn limit(value: u32) -> i64 {
    i64::from(value)
}

/// Opens a transaction that holds the write lock from its first statement.
const BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

impl DeliveryStore for SqliteStore {
    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
            migrate_in(&mut tx, &self.prefix).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn publish(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let _writing = self.writes.lock().await;
            if envelopes.len() <= 1 {
                let mut conn = self.pool.acquire().await?;
                insert_rows(&mut conn, &self.sql.insert_outbox, &envelopes).await?;
                self.wake.notify_one();
                return Ok(());
            }
            let mut tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
            insert_rows(&mut tx, &self.sql.insert_outbox, &envelopes).await?;
            tx.commit().await?;
            self.wake.notify_one();
            Ok(())
        })
    }

    fn expand<'a>(
        &'a self,
        routes: &'a Routes,
        limit_rows: u32,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let _writing = self.writes.lock().await;
            let mut tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
            let moved = self.expand_in(&mut tx, routes, limit_rows).await?;
            tx.commit().await?;
            Ok(moved)
        })
    }

    fn claim(
        &self,
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<Claimed>, StoreError>> {
        Box::pin(async move {
            let _writing = self.writes.lock().await;
            let mut conn = self.pool.acquire().await?;
            self.claim_in(&mut conn, token, limit_rows, lease).await
        })
    }

    fn ack_and_take<'a>(
        &'a self,
        acked: (Uuid, &'a [DeliveryId]),
        routes: &'a Routes,
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(u64, Vec<Claimed>), StoreError>> {
        Box::pin(async move {
            let (acked_token, ids) = acked;
            let (single, several) = routes.split();
            if several.types.is_empty() {
                let handlers: Vec<(&str, &str)> =
                    single.types.into_iter().zip(single.handlers).collect();
                let _writing = self.writes.lock().await;
                let mut conn = self.pool.acquire().await?;
                return self
                    .ack_and_take_in_place(&mut conn, acked, &handlers, token, limit_rows, lease)
                    .await;
            }
            let (rows, outbox) = DeliveryId::split(ids);
            let _writing = self.writes.lock().await;
            let mut tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
            let deliveries = &self.deliveries;
            let mut landed = deliveries.rows.ack_in(&mut tx, acked_token, &rows).await?;
            landed += deliveries
                .in_place
                .ack_in(&mut tx, acked_token, &outbox)
                .await?;
            let claimed = self
                .take_in(&mut tx, routes, token, limit_rows, lease)
                .await?;
            tx.commit().await?;
            Ok((landed, claimed))
        })
    }

    // The acks of none: one path for both.
    fn take<'a>(
        &'a self,
        routes: &'a Routes,
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Claimed>, StoreError>> {
        Box::pin(async move {
            let (_, claimed) = self
                .ack_and_take((Uuid::nil(), &[]), routes, token, limit_rows, lease)
                .await?;
            Ok(claimed)
        })
    }

    fn deliveries(&self) -> &dyn Claims<DeliveryId> {
        &*self.deliveries
    }

    fn backlog(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let p = &self.prefix;
            let sql = format!(
                "SELECT (SELECT count(*) FROM \"{p}_outbox\") + (SELECT count(*) FROM \"{p}_deliveries\")"
            );
            self.count(&sql).await
        })
    }

    fn wakeups(&self) -> BoxFuture<'_, Result<Option<Arc<Notify>>, StoreError>> {
        Box::pin(async move { Ok(Some(self.wake.clone())) })
    }

    fn kind(&self) -> &'static str {
        "sqlite"
    }
}

impl RelayStore for SqliteStore {
    fn relay<'a>(
        &'a self,
        limit_rows: u32,
        sink: &'a dyn RelaySink,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            // An ordered relay (Kafka) holds SQLite's write lock across its pass, so that no
            // other relay, of this process or another, publishes a later row of an aggregate
            // while it waits. Any other holds no lock while the broker confirms (RabbitMQ may
            // block publishing for as long as an alarm lasts): it reads its rows, publishes
            // them, then dead-letters or deletes them in one short write, and the
            // application's own writes go on meanwhile.
            let mut ordered = match sink.exclusive() {
                true => Some(crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?),
                false => None,
            };
            let take = sqlx::query(&self.sql.relay_take)
                .bind(limit(limit_rows))
                .bind(now_millis());
            let rows = match &mut ordered {
                Some(tx) => take.fetch_all(&mut **tx).await?,
                None => take.fetch_all(&self.pool).await?,
            };
            if rows.is_empty() {
                if let Some(tx) = ordered {
                    tx.rollback().await?;
                }
                return Ok(0);
            }
            // Deleted by the id as stored, which need not be a UUID in a row written by hand.
            let ids: Vec<String> = rows
                .iter()
                .map(|row| row.try_get("message_id"))
                .collect::<Result<_, _>>()?;
            let taken = rows.iter().map(|row| envelope_from_row(row, 0)).collect();
            drop(rows);
            let (envelopes, unreadable) = crate::store::relay::readable(taken);
            let unpublishable = match sink.publish(&envelopes).await {
                Ok(unpublishable) => unpublishable,
                Err(error) => {
                    if let Some(tx) = ordered {
                        tx.rollback().await?;
                    }
                    return Err(StoreError::Relay(error));
                }
            };
            // The write queue is taken before SQLite's lock, as every writer of the queue
            // takes it: an ordered pass already holds the lock, and waiting for the queue then
            // would wait for a writer that waits for the lock.
            let (_writing, mut tx) = match ordered {
                Some(tx) => (None, tx),
                None => {
                    let writing = self.writes.lock().await;
                    let tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
                    (Some(writing), tx)
                }
            };
            for letter in crate::store::unpublishable_letters(&envelopes, &unpublishable)
                .into_iter()
                .chain(unreadable)
            {
                insert_dead_letter(&self.sql.insert_dead_letter, &letter)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(&self.sql.relay_delete)
                .bind(Json(&ids))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(ids.len() as u64)
        })
    }
}

impl DeadLetterStore for SqliteStore {
    fn insert_dead_letter<'a>(
        &'a self,
        letter: &'a DeadLetter,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            insert_dead_letter(&self.sql.insert_dead_letter, letter)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn find_dead_letter(&self, id: Uuid) -> BoxFuture<'_, Result<Option<DeadLetter>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(&self.sql.dead_letter)
                .bind(id.hyphenated())
                .fetch_optional(&self.pool)
                .await?;
            row.as_ref().map(dead_letter_from_row).transpose()
        })
    }

    dead_letter_queries!();

    fn replay_dead_letter(&self, id: Uuid) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move {
            // A job's run goes back to the scheduler, not to a handler of its name.
            if crate::store::ScheduleStore::replay_occurrence(self, id).await? {
                return Ok(true);
            }
            let mut tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
            sqlx::query(&self.sql.replay_to_handler)
                .bind(id.hyphenated())
                .bind(now_millis())
                .execute(&mut *tx)
                .await?;
            sqlx::query(&self.sql.replay_to_outbox)
                .bind(id.hyphenated())
                .execute(&mut *tx)
                .await?;
            let gone = sqlx::query(&self.sql.replay_delete)
                .bind(id.hyphenated())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(gone.rows_affected() == 1)
        })
    }

    fn replay_dead_letter_as<'a>(
        &'a self,
        id: Uuid,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
            let gone = sqlx::query(&self.sql.replay_delete)
                .bind(id.hyphenated())
                .execute(&mut *tx)
                .await?;
            if gone.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(false);
            }
            insert_rows(
                &mut tx,
                &self.sql.insert_outbox,
                std::slice::from_ref(envelope),
            )
            .await?;
            tx.commit().await?;
            self.wake.notify_one();
            Ok(true)
        })
    }

    fn delete_dead_letters<'a>(
        &'a self,
        ids: &'a [Uuid],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            if ids.is_empty() {
                return Ok(0);
            }
            let ids: Vec<String> = ids.iter().map(|id| id.hyphenated().to_string()).collect();
            let done = sqlx::query(&self.sql.delete_dead_letters)
                .bind(Json(ids))
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected())
        })
    }

    fn purge_dead_letters_before(&self, age: Duration) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let done = sqlx::query(&format!(
                "DELETE FROM \"{}_dead_letters\" WHERE dead_lettered_at < ?1",
                self.prefix
            ))
            .bind(now_millis().saturating_sub(millis(age)))
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected())
        })
    }
}

impl Housekeeping for SqliteStore {
    fn sampling_store(&self, timeout: Duration) -> Option<Arc<dyn crate::store::Store>> {
        // Another pool on an in-memory database would open another database.
        if self.keep_alive.is_some() {
            return None;
        }
        let options = (*self.pool.connect_options()).clone();
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .test_before_acquire(false)
            .acquire_timeout(timeout)
            .idle_timeout(Some(Duration::from_secs(60)))
            .connect_lazy_with(options);
        let store = SqliteStore::new(pool, self.prefix.as_str()).ok()?;
        Some(Arc::new(store))
    }

    fn pending_by_handler(&self) -> BoxFuture<'_, Result<Vec<Pending>, StoreError>> {
        Box::pin(async move {
            // With min(), SQLite takes the bare column created_at from the row holding the
            // smallest message id: the oldest (ids are UUID v7, in publish order).
            let rows: Vec<(String, i64, Option<DateTime<Utc>>)> = sqlx::query_as(&format!(
                "SELECT handler, count, created_at FROM (
                     SELECT handler, count(*) AS count, created_at, min(message_id)
                     FROM (SELECT handler, message_id, created_at FROM \"{p}_deliveries\"
                           UNION ALL
                           SELECT handler, id, created_at FROM \"{p}_outbox\"
                           -- Claimed in place and running; a row whose claim ended is
                           -- routed again when it is next taken.
                           WHERE lease_owner IS NOT NULL AND leased_until > ?1)
                     GROUP BY handler
                 ) ORDER BY handler",
                p = self.prefix
            ))
            .bind(now_millis())
            .fetch_all(&self.pool)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(handler, count, oldest)| Pending {
                    handler,
                    count: u64::try_from(count).unwrap_or(0),
                    oldest,
                })
                .collect())
        })
    }

    fn oldest_pending(&self) -> BoxFuture<'_, Result<Option<DateTime<Utc>>, StoreError>> {
        Box::pin(async move {
            let p = &self.prefix;
            // Message ids are UUID v7 text, in publish order: both lookups follow an index.
            let sql = format!(
                "SELECT (SELECT created_at FROM \"{p}_outbox\" ORDER BY id LIMIT 1),
                        (SELECT created_at FROM \"{p}_deliveries\" ORDER BY message_id LIMIT 1)"
            );
            let oldest: (Option<DateTime<Utc>>, Option<DateTime<Utc>>) =
                sqlx::query_as(&sql).fetch_one(&self.pool).await?;
            Ok(match oldest {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            })
        })
    }

    fn purge_inbox_before(&self, age: Duration) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.purge_inbox_older_than(age))
    }
}
