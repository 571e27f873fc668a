//! [`PgStore`]: the outbox on PostgreSQL.
//!
//! Claims use `id = ANY(ARRAY(SELECT … FOR UPDATE SKIP LOCKED))`, which keeps its index plan
//! where `IN (SELECT …)` flips to a sequential scan after an ANALYZE of an empty table. Finished
//! rows are deleted, not marked, and both `deliveries` (fillfactor 70) and `outbox` (50, from
//! schema version 8) leave room on each page for the updates a claim makes. A worker's cycle
//! is one statement: the last batch's acks deleted, the next batch taken.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use sqlx::postgres::{
    PgConnectOptions, PgConnection, PgHasArrayType, PgListener, PgPool, PgPoolOptions, PgRow,
};
use sqlx::types::Json;
use sqlx::Postgres;
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::Notify;
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

/// The schema Hexeract's tables live in unless another is given.
pub const DEFAULT_SCHEMA: &str = "hexeract";

/// The outbox, deliveries and dead letters in one PostgreSQL schema.
///
/// ```no_run
/// # async fn example() -> Result<(), hexeract::store::StoreError> {
/// use hexeract::store::{postgres::PgStore, DeliveryStore};
///
/// let store = PgStore::connect("postgres://app@127.0.0.1/app").await?;
/// store.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    schema: Identifier,
    sql: Arc<Statements>,
    schedule_sql: Arc<schedules::ScheduleStatements>,
    deliveries: Arc<Deliveries<Settle, Settle>>,
    occurrences: Arc<Settle>,
    wake: Arc<Wake>,
}

mod attempts;
mod queues;
mod schedules;
pub(crate) use schedules::insert_scheduled_in;

/// The store's wake-up signal and, once a worker asked for it, the task that feeds it from
/// `LISTEN`.
#[derive(Default)]
struct Wake {
    signal: Arc<Notify>,
    listening: tokio::sync::OnceCell<()>,
    /// Stops the `LISTEN` task, and gives its connection back to the pool, when the last clone
    /// of the store is dropped.
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Wake {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl PgStore {
    /// The count `sql` selects (one `bigint`).
    async fn count(&self, sql: &str) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar(sql).fetch_one(&self.pool).await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// The dead-letter queries on this store's table.
    fn dead_letter_sql(&self) -> DeadLetterSql {
        DeadLetterSql {
            table: format!("{}.dead_letters", self.schema.quoted()),
            mark: '$',
        }
    }

    /// Connects to `url` (a `postgres://` URL; TLS through `sslmode`) with a pool of 10
    /// connections named `hexeract`, using the default schema. To a host other than this
    /// machine, an unset `sslmode` means `verify-full` (the server's certificate checked against
    /// its name), not sqlx's `prefer`, which verifies nothing and falls back to plain text.
    pub async fn connect(url: &str) -> Result<PgStore, StoreError> {
        let mut options: PgConnectOptions = url.parse()?;
        if crate::secure::postgres_ssl_mode(url).is_some() {
            options = options.ssl_mode(sqlx::postgres::PgSslMode::VerifyFull);
        }
        let options = options
            .application_name("hexeract")
            .log_statements(tracing::log::LevelFilter::Trace);
        // One connection first: an unreachable database or a refused login fails here at once,
        // with its cause, where the pool would retry for its whole acquire timeout (30 s) and
        // then report only that it timed out.
        // A server that accepts the connection and never answers its startup (a proxy with
        // nothing behind it) fails here after 30 s, as the pool's own connections would.
        let probe = tokio::time::timeout(CONNECT_DEADLINE, PgConnection::connect_with(&options))
            .await
            .map_err(|_| StoreError::Timeout {
                what: "connection's startup",
                after: CONNECT_DEADLINE,
            })??;
        let _ = probe.close().await;
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect_with(options)
            .await?;
        PgStore::new(pool, DEFAULT_SCHEMA)
    }

    /// Uses `pool`, with the tables in `schema` (created by [`migrate`](DeliveryStore::migrate)).
    pub fn new(pool: PgPool, schema: &str) -> Result<PgStore, StoreError> {
        let schema = Identifier::new(schema)?;
        Ok(PgStore {
            sql: Arc::new(Statements::new(&schema)),
            schedule_sql: Arc::new(schedules::ScheduleStatements::new(&schema)),
            deliveries: Arc::new(deliveries(pool.clone(), &schema)),
            occurrences: Arc::new(schedules::occurrences(pool.clone(), &schema)),
            pool,
            schema,
            wake: Arc::default(),
        })
    }

    /// The store's connection pool.
    ///
    /// Run handlers' transactions on a pool of your own, not this one. A handler call that
    /// times out, or outlives the shutdown grace, is dropped where it stands; if it was inside
    /// `pool.begin()` at that moment, sqlx 0.8 can return the connection to its pool still in
    /// a transaction (sqlx issue #4393), and the store's next statements on it would join that
    /// transaction.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema the tables live in.
    pub fn schema(&self) -> &Identifier {
        &self.schema
    }

    /// Deletes the inbox marks older than `age` (by the database's clock) and returns how many
    /// it deleted. A mark only has to outlive the redeliveries of its message: keep `age` well
    /// above the longest a message can still come back (retries, leases, a dead letter you
    /// may replay), or a late duplicate runs its handler again. An `age` beyond 1000 years
    /// counts as 1000 years.
    ///
    /// ```no_run
    /// # async fn example(store: hexeract::store::postgres::PgStore) -> Result<(), hexeract::store::StoreError> {
    /// use std::time::Duration;
    ///
    /// let purged = store.purge_inbox_older_than(Duration::from_secs(7 * 24 * 3600)).await?;
    /// # let _ = purged;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn purge_inbox_older_than(&self, age: Duration) -> Result<u64, StoreError> {
        // Keeps `now() - age` within PostgreSQL's timestamp range.
        const MAX_AGE_MILLIS: i64 = 1000 * 365 * 24 * 3600 * 1000;
        let done = sqlx::query(&self.sql.purge_inbox)
            .bind(millis(age).min(MAX_AGE_MILLIS))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// The take statement (which also deletes the last cycle's acks), so that a benchmark's
    /// raw-sqlx baseline runs exactly the SQL the worker runs. Not a stable interface.
    #[doc(hidden)]
    pub fn take_statement_for_benchmarks(&self) -> &str {
        &self.sql.take
    }

    /// [`DeliveryStore::ack_and_take`]: the take statement, deleting the acks of `acked` (none
    /// for a plain take) in the same statement, then the copies it found of messages that have
    /// their delivery already.
    async fn take_acking(
        &self,
        acked: (Uuid, &[DeliveryId]),
        routes: &Routes,
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> Result<(u64, Vec<Claimed>), StoreError> {
        let (acked_token, acked) = acked;
        let (acked_rows, acked_in_place) = DeliveryId::split(acked);
        let (single, several) = routes.split();
        let rows = sqlx::query(&self.sql.take)
            .bind(token)
            .bind(millis(lease))
            .bind(limit(limit_rows))
            .bind(several.types)
            .bind(several.handlers)
            .bind(single.types)
            .bind(single.handlers)
            .bind(acked_rows)
            .bind(acked_in_place)
            .bind(acked_token)
            .fetch_all(&self.pool)
            .await?;
        let landed = match rows.first() {
            Some(row) => u64::try_from(row.try_get::<i64, _>("acked")?).unwrap_or(0),
            None => 0,
        };
        let mut claimed = Vec::with_capacity(rows.len());
        let mut duplicates = Vec::new();
        for row in &rows {
            // The one row of a take that found nothing.
            if row.try_get::<Option<Uuid>, _>("message_id")?.is_none() {
                continue;
            }
            match claimed_from_row(row)? {
                copy if row.try_get("duplicate")? => duplicates.push(copy.envelope.id),
                delivery => claimed.push(delivery),
            }
        }
        // Copies of messages that have their delivery already: deleted unhandled.
        self.deliveries
            .in_place
            .each(&self.deliveries.in_place.ack, token, &duplicates)
            .await?;
        Ok((landed, claimed))
    }
}

impl fmt::Debug for PgStore {
    // The pool's options hold the password: never print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// The `NOTIFY` channel of a schema's outbox. Derived from a hash so that it stays within
/// PostgreSQL's 63-byte identifier limit whatever the schema's name.
pub fn notify_channel(schema: &Identifier) -> String {
    // FNV-1a: stable across processes and versions, unlike the standard library's hasher.
    let hash = schema
        .as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("hexeract_outbox_{hash:016x}")
}

/// Writes `envelopes` to the outbox of `schema` on `conn`, inside whatever transaction `conn`
/// is in, and notifies the schema's channel in the same statement: PostgreSQL delivers the
/// notification at commit, once per transaction however many rows it wrote, and never after a
/// rollback. What [`outbox::enqueue`](crate::outbox::enqueue) does on PostgreSQL.
pub async fn insert_outbox(
    conn: &mut PgConnection,
    schema: &Identifier,
    envelopes: &[Envelope],
) -> Result<(), StoreError> {
    if envelopes.is_empty() {
        return Ok(());
    }
    crate::store::limit::check(envelopes)?;
    let columns = OutboxColumns::from(envelopes);
    let sql = Statements::insert_outbox(schema);
    columns
        .bind_messages(sqlx::query(&sql).bind(&columns.ids))
        .bind(notify_channel(schema))
        .execute(conn)
        .await?;
    Ok(())
}

/// Records in the inbox of `schema`, on `conn` and inside whatever transaction `conn` is in,
/// that `handler` processed `message_id`. `true` when the row is new, `false` when it was
/// already there. A concurrent transaction inserting the same row waits for this one: it then
/// finds the row if this one commits, and inserts it if this one rolls back. What
/// [`outbox::inbox::mark_processed`](crate::outbox::inbox::mark_processed) does on PostgreSQL.
pub(crate) async fn insert_inbox(
    conn: &mut PgConnection,
    schema: &Identifier,
    handler: &str,
    message_id: Uuid,
) -> Result<bool, StoreError> {
    let done = sqlx::query(&Statements::insert_inbox(schema))
        .bind(handler)
        .bind(message_id)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Envelopes as column arrays, for one `INSERT … SELECT FROM UNNEST(…)`.
struct OutboxColumns {
    ids: Vec<Uuid>,
    types: Vec<String>,
    payloads: Vec<Vec<u8>>,
    headers: Vec<Json<BTreeMap<String, String>>>,
    correlation_ids: Vec<Option<Uuid>>,
    causation_ids: Vec<Option<Uuid>>,
    aggregates: Vec<Option<String>>,
    aggregate_keys: Vec<Option<String>>,
    created_at: Vec<DateTime<Utc>>,
}

impl OutboxColumns {
    /// `query` with the [`MESSAGE_COLUMNS`] arrays bound next, in their order.
    fn bind_messages<'q>(
        &'q self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.types)
            .bind(&self.payloads)
            .bind(&self.headers)
            .bind(&self.correlation_ids)
            .bind(&self.causation_ids)
            .bind(&self.aggregates)
            .bind(&self.aggregate_keys)
            .bind(&self.created_at)
    }
}

impl From<&[Envelope]> for OutboxColumns {
    fn from(envelopes: &[Envelope]) -> OutboxColumns {
        OutboxColumns {
            ids: envelopes.iter().map(|e| e.id).collect(),
            types: envelopes.iter().map(|e| e.message_type.clone()).collect(),
            payloads: envelopes.iter().map(|e| e.payload.to_vec()).collect(),
            headers: envelopes.iter().map(|e| Json(e.headers.clone())).collect(),
            correlation_ids: envelopes.iter().map(|e| e.correlation_id).collect(),
            causation_ids: envelopes.iter().map(|e| e.causation_id).collect(),
            aggregates: envelopes.iter().map(|e| e.aggregate.clone()).collect(),
            aggregate_keys: envelopes.iter().map(|e| e.aggregate_key.clone()).collect(),
            created_at: envelopes.iter().map(|e| e.created_at).collect(),
        }
    }
}

/// How a claim is settled, for deliveries and schedule occurrences alike (one claim model): an
/// ack deletes the row, a retry makes it due again, a release gives it back with its attempt
/// not counted, a dead letter moves it to `dead_letters`; each only while the row still holds
/// the settling worker's token.
pub(super) struct Settle {
    pool: PgPool,
    ack: String,
    release: String,
    retry: String,
    dead_letter: String,
}

impl Settle {
    /// The statements of `table`, where a claimed row has `id`, `attempts`, `available_at`,
    /// `lease_owner`, `recovered` and `last_error`. `to_dead_letters` inserts from `gone`, the
    /// row just deleted, binding `$3` (the letter's id), `$4` (reason), `$5` (detail) and `$6`
    /// (calls made).
    pub(super) fn new(
        pool: PgPool,
        schema: &Identifier,
        table: &str,
        to_dead_letters: &str,
    ) -> Settle {
        let t = format!("{}.{table}", schema.quoted());
        let gone = gone(&t);
        Settle {
            pool,
            ack: format!("DELETE FROM {t} WHERE id = ANY($1) AND lease_owner = $2"),
            release: format!(
                "UPDATE {t}
                 SET attempts = attempts - 1, lease_owner = NULL, available_at = now()
                 WHERE id = ANY($1) AND lease_owner = $2"
            ),
            retry: format!(
                "UPDATE {t}
                 SET available_at = now() + $3::bigint * interval '1 millisecond',
                     lease_owner = NULL,
                     recovered = false,
                     last_error = $4
                 WHERE id = $1 AND lease_owner = $2"
            ),
            dead_letter: format!("{gone} {to_dead_letters}"),
        }
    }

    /// The `ack` or `release` statement over `ids`.
    async fn each<I: ClaimId>(&self, sql: &str, token: Uuid, ids: &[I]) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(sql)
            .bind(ids)
            .bind(token)
            .execute(&self.pool)
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
            let done = sqlx::query(&self.retry)
                .bind(id)
                .bind(token)
                .bind(millis(delay))
                .bind(crate::dead_letter::truncate_detail(detail))
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() == 1)
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
            let done = sqlx::query(&self.dead_letter)
                .bind(id)
                .bind(token)
                .bind(Uuid::now_v7())
                .bind(reason.as_str())
                .bind(crate::dead_letter::truncate_detail(detail))
                .bind(i32::try_from(calls).unwrap_or(i32::MAX))
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }
}

/// The [`Settle`] of messages claimed in place in the outbox: an ack deletes the row, a
/// release gives it back, a dead letter moves it to `dead_letters` with its handler's name,
/// and a retry moves it into `deliveries`, where it waits for its due time with the
/// deliveries of other types (so that the outbox holds only what is new or running, and a
/// take's walk of it in id order never steps over messages waiting for a retry). A retry that
/// finds the delivery already there (it cannot be, short of a hand-made row) reports the
/// claim lost; the delivery there runs.
fn in_place(pool: PgPool, schema: &Identifier) -> Settle {
    let s = schema.quoted();
    let m = MESSAGE_COLUMNS;
    let gone = gone(&format!("{s}.outbox"));
    // An outbox row has no `available_at`: its release and retry are its own.
    Settle {
        release: format!(
            "UPDATE {s}.outbox
             SET attempts = attempts - 1, lease_owner = NULL, leased_until = NULL
             WHERE id = ANY($1) AND lease_owner = $2"
        ),
        retry: format!(
            "{gone}
             INSERT INTO {s}.deliveries
                 (message_id, handler, attempts, available_at, last_error, {m})
             SELECT id, handler, attempts,
                    now() + $3::bigint * interval '1 millisecond', $4, {m}
             FROM gone
             ON CONFLICT (message_id, handler) DO NOTHING"
        ),
        ..Settle::new(pool, schema, "outbox", &to_dead_letters(schema, "id"))
    }
}

/// The deliveries' settling: a dead letter keeps the message as it was, and no handler where
/// none knew its type.
fn deliveries(pool: PgPool, schema: &Identifier) -> Deliveries<Settle, Settle> {
    Deliveries {
        rows: Settle::new(
            pool.clone(),
            schema,
            "deliveries",
            &to_dead_letters(schema, "message_id"),
        ),
        in_place: in_place(pool, schema),
    }
}

/// `WITH gone AS (…)`: the row of `table` claimed as `$1` under the token `$2`, deleted, for
/// a statement that moves it elsewhere to read from.
fn gone(table: &str) -> String {
    format!(
        "WITH gone AS (
             DELETE FROM {table} WHERE id = $1 AND lease_owner = $2 RETURNING *
         )"
    )
}

/// The dead letter of a message row `gone` (whose message id is its `message_id` column),
/// binding `$3` (the letter's id), `$4` (reason), `$5` (detail) and `$6` (calls made), with
/// no handler where none knew its type.
fn to_dead_letters(schema: &Identifier, message_id: &str) -> String {
    let s = schema.quoted();
    let m = MESSAGE_COLUMNS;
    format!(
        "INSERT INTO {s}.dead_letters (id, message_id, handler, reason, detail, attempts, {m})
         SELECT $3, {message_id}, NULLIF(handler, ''), $4, $5, $6, {m} FROM gone"
    )
}

/// The claim of up to `$3` due rows of `table` (that also meet `also`, an `AND …` of their
/// own, from `$4`) under the token `$1` for a lease of `$2` milliseconds: the attempt counted,
/// due again at the lease's end, `recovered` set where an earlier claim was never settled.
/// `returning` names the columns it gives back.
pub(super) fn claim(table: &str, also: &str, returning: &str) -> String {
    format!(
        "UPDATE {table}
         SET attempts = attempts + 1,
             -- SET sees the row as it was: a token still there is an unsettled claim.
             recovered = recovered OR lease_owner IS NOT NULL,
             lease_owner = $1,
             available_at = now() + $2::bigint * interval '1 millisecond'
         WHERE id = ANY(ARRAY(
             SELECT id FROM {table}
             WHERE available_at <= now() {also}
             ORDER BY available_at
             LIMIT $3
             FOR UPDATE SKIP LOCKED))
         RETURNING {returning}"
    )
}

/// [`DeliveryStore::take`] in one statement: `claim` (the deliveries' claim, binding the token
/// `$1`, the lease `$2` in milliseconds and the limit `$3`) for the due deliveries, then as
/// many outbox rows as are left of the limit, not leased or with their lease ended, oldest
/// first. Those of a type with several handlers (`$4` types, `$5` handlers) are moved into
/// deliveries, one per handler, written already claimed (attempt 1, leased to the token) up
/// to the limit and due but unclaimed past it. The others are claimed in place: the outbox row
/// counts the attempt, holds the lease and names the type's one handler (`$6` types, `$7`
/// handlers), or none where no handler knows the type; no delivery row is written. Every part
/// reads the statement's one snapshot, so the claim of due rows never sees the rows the same
/// statement inserts. What a crash leaves is what expand-then-claim leaves: a leased row that
/// comes back when its lease ends, marked `recovered` by the claim that takes it (an outbox
/// row claimed in place whose type has more handlers by then carries the mark into its
/// deliveries).
///
/// The same statement deletes the acked deliveries of the cycle before (`$8` deliveries rows,
/// `$9` messages claimed in place, both under that cycle's token `$10`; empty arrays when
/// there are none), so that a cycle commits once, not twice: where commits wait for the disk,
/// two per batch halved the drain. An acked row is leased to its token, so the take does not
/// see it as due; one whose lease ended meanwhile may be both deleted and claimed again here,
/// and PostgreSQL makes only one of the two changes (either is safe: a handled message, or
/// one more delivery). The statement returns at least one row, whose `acked` counts the acks
/// that landed; a row with no `message_id` stands for "nothing taken".
fn take(s: &str, claim: &str) -> String {
    let m = MESSAGE_COLUMNS;
    let o_m = qualified("o", m);
    let claimed = format!("id, message_id, handler, attempts, recovered, {m}");
    let lease = "now() + $2::bigint * interval '1 millisecond'";
    format!(
        "WITH acked_rows AS (
             DELETE FROM {s}.deliveries WHERE id = ANY($8::bigint[]) AND lease_owner = $10
             RETURNING 1
         ), acked_in_place AS (
             DELETE FROM {s}.outbox WHERE id = ANY($9::uuid[]) AND lease_owner = $10
             RETURNING 1
         ), due AS (
             {claim}
         ), room AS (
             SELECT greatest($3 - (SELECT count(*) FROM due), 0) AS left_over
         ), picked AS (
             SELECT id, message_type FROM {s}.outbox
             WHERE leased_until IS NULL OR leased_until <= now()
             ORDER BY id
             LIMIT (SELECT left_over FROM room)
             FOR UPDATE SKIP LOCKED
         ), ranked AS (
             -- One row per delivery the picked messages make: per handler for a type with
             -- several, else one (`several` NULL). Those within the limit, oldest message
             -- first, are this take's.
             SELECT p.id, r.handler AS several,
                    row_number() OVER (ORDER BY p.id, r.handler)
                        <= (SELECT left_over FROM room) AS mine
             FROM picked p
             LEFT JOIN UNNEST($4::text[], $5::text[]) AS r(message_type, handler)
               ON r.message_type = p.message_type
         ), in_place AS (
             UPDATE {s}.outbox o
             SET handler = coalesce(
                     (SELECT one.handler
                      FROM UNNEST($6::text[], $7::text[]) AS one(message_type, handler)
                      WHERE one.message_type = o.message_type),
                     ''),
                 attempts = o.attempts + 1,
                 -- SET sees the row as it was: a token still there is an unsettled claim.
                 recovered = o.recovered OR o.lease_owner IS NOT NULL,
                 lease_owner = $1,
                 leased_until = {lease}
             WHERE o.id = ANY(ARRAY(SELECT id FROM ranked WHERE several IS NULL AND mine))
             RETURNING NULL::bigint AS id, o.id AS message_id, o.handler, o.attempts,
                       o.recovered, {o_m},
                       -- Published again after a retry moved the first copy into
                       -- deliveries: that delivery is the message's, this copy goes.
                       EXISTS (SELECT 1 FROM {s}.deliveries d
                               WHERE d.message_id = o.id AND d.handler = o.handler)
                           AS duplicate
         ), fresh AS (
             DELETE FROM {s}.outbox o
             WHERE o.id = ANY(ARRAY(SELECT id FROM ranked WHERE several IS NOT NULL))
             RETURNING o.id, o.lease_owner IS NOT NULL OR o.recovered AS recovered, {o_m}
         ), numbered AS (
             SELECT f.*, k.several AS handler, k.mine
             FROM fresh f JOIN ranked k ON k.id = f.id AND k.several IS NOT NULL
         ), inserted AS (
             INSERT INTO {s}.deliveries
                 (message_id, handler, attempts, lease_owner, available_at, recovered, {m})
             SELECT id, handler,
                    CASE WHEN mine THEN 1 ELSE 0 END,
                    CASE WHEN mine THEN $1 END,
                    CASE WHEN mine THEN {lease} ELSE now() END,
                    recovered,
                    {m}
             FROM numbered
             ON CONFLICT (message_id, handler) DO NOTHING
             RETURNING lease_owner, {claimed}
         ), taken AS (
             SELECT {claimed}, false AS duplicate FROM due
             UNION ALL
             SELECT {claimed}, false FROM inserted WHERE lease_owner IS NOT NULL
             UNION ALL
             SELECT {claimed}, duplicate FROM in_place
         )
         SELECT taken.*, acks.acked
         FROM (SELECT (SELECT count(*) FROM acked_rows)
                      + (SELECT count(*) FROM acked_in_place) AS acked) acks
         LEFT JOIN taken ON true"
    )
}

/// `columns` (a comma-separated list) each qualified with `alias`.
fn qualified(alias: &str, columns: &str) -> String {
    columns
        .split(", ")
        .map(|column| format!("{alias}.{column}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The id of a claimed row: `bigint` (deliveries) or `uuid` (occurrences).
pub(super) trait ClaimId:
    for<'q> sqlx::Encode<'q, Postgres>
    + sqlx::Type<Postgres>
    + PgHasArrayType
    + Send
    + Sync
    + Copy
    + 'static
{
}

impl<I> ClaimId for I where
    I: for<'q> sqlx::Encode<'q, Postgres>
        + sqlx::Type<Postgres>
        + PgHasArrayType
        + Send
        + Sync
        + Copy
        + 'static
{
}

/// Every statement, with the schema name quoted in once.
struct Statements {
    expand: String,
    claim: String,
    take: String,
    dead_letter: String,
    insert_dead_letter: String,
    relay_take: String,
    relay_delete: String,
    /// The advisory lock of ordered relay passes on this schema, hashed by PostgreSQL.
    relay_lock: String,
    replay: String,
    delete_dead_letters: String,
    purge_inbox: String,
    backlog: String,
    oldest_pending: String,
}

/// The columns of a message wherever it waits: the outbox, a delivery, a dead letter, a
/// delayed message (schema version 5 on). In this order in every statement that binds them.
const MESSAGE_COLUMNS: &str = "message_type, payload, headers, correlation_id, causation_id, \
                               aggregate, aggregate_key, created_at";

impl Statements {
    fn new(schema: &Identifier) -> Statements {
        let s = schema.quoted();
        let m = MESSAGE_COLUMNS;
        let claim = claim(
            &format!("{s}.deliveries"),
            "",
            &format!("id, message_id, handler, attempts, recovered, {m}"),
        );
        Statements {
            take: take(&s, &claim),
            claim,
            expand: format!(
                "WITH fresh AS (
                     DELETE FROM {s}.outbox
                     WHERE id = ANY(ARRAY(
                         SELECT id FROM {s}.outbox
                         WHERE leased_until IS NULL OR leased_until <= now()
                         ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED))
                     RETURNING id, lease_owner IS NOT NULL OR recovered AS recovered, {m}
                 ), routed AS (
                     SELECT f.*, r.handler
                     FROM fresh f
                     JOIN UNNEST($1::text[], $2::text[]) AS r(message_type, handler)
                       ON r.message_type = f.message_type
                     UNION ALL
                     SELECT f.*, '' FROM fresh f WHERE f.message_type <> ALL($1::text[])
                 ), inserted AS (
                     INSERT INTO {s}.deliveries (message_id, handler, recovered, {m})
                     SELECT id, handler, recovered, {m} FROM routed
                     ON CONFLICT (message_id, handler) DO NOTHING
                 )
                 SELECT count(*) FROM fresh"
            ),
            dead_letter: format!(
                "SELECT id, message_id, handler, reason, detail, attempts, dead_lettered_at, {m}
                 FROM {s}.dead_letters WHERE id = $1"
            ),
            // Not a message an outbox worker holds in place (a switch from handlers in the
            // process to a broker while one still runs): it is that worker's until its lease
            // ends.
            relay_take: format!(
                "SELECT id AS message_id, {m}
                 FROM {s}.outbox
                 WHERE leased_until IS NULL OR leased_until <= now()
                 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
            ),
            relay_delete: format!("DELETE FROM {s}.outbox WHERE id = ANY($1)"),
            relay_lock: format!("hexeract ordered relay {s}"),
            insert_dead_letter: format!(
                "INSERT INTO {s}.dead_letters
                     (id, message_id, handler, reason, detail, attempts, dead_lettered_at, {m})
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
                 ON CONFLICT (id) DO NOTHING"
            ),
            replay: format!(
                "WITH gone AS (
                     DELETE FROM {s}.dead_letters WHERE id = $1 RETURNING *
                 ), to_handler AS (
                     INSERT INTO {s}.deliveries (message_id, handler, {m})
                     SELECT message_id, handler, {m} FROM gone WHERE handler IS NOT NULL
                     ON CONFLICT (message_id, handler) DO NOTHING
                 ), to_outbox AS (
                     INSERT INTO {s}.outbox (id, {m})
                     SELECT message_id, {m} FROM gone WHERE handler IS NULL
                     ON CONFLICT (id) DO NOTHING
                 )
                 SELECT count(*) FROM gone"
            ),
            delete_dead_letters: format!("DELETE FROM {s}.dead_letters WHERE id = ANY($1)"),
            backlog: format!(
                "SELECT (SELECT count(*) FROM {s}.outbox) + (SELECT count(*) FROM {s}.deliveries)"
            ),
            oldest_pending: format!(
                "SELECT (SELECT created_at FROM {s}.outbox ORDER BY id LIMIT 1),
                        (SELECT created_at FROM {s}.deliveries ORDER BY message_id LIMIT 1)"
            ),
            // No index on processed_at: a purge reads the whole inbox, which it runs rarely.
            purge_inbox: format!(
                "DELETE FROM {s}.inbox
                 WHERE processed_at < now() - $1::bigint * interval '1 millisecond'"
            ),
        }
    }

    fn insert_outbox(schema: &Identifier) -> String {
        let s = schema.quoted();
        let m = MESSAGE_COLUMNS;
        format!(
            "WITH inserted AS (
                 INSERT INTO {s}.outbox (id, {m})
                 SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::bytea[], $4::jsonb[],
                                      $5::uuid[], $6::uuid[], $7::text[], $8::text[],
                                      $9::timestamptz[])
                 -- A message still in the outbox (waiting, or claimed in place and running)
                 -- published again, by a producer retrying: the copy there stands.
                 ON CONFLICT (id) DO NOTHING
             )
             SELECT pg_notify($10, '')"
        )
    }

    fn insert_inbox(schema: &Identifier) -> String {
        let s = schema.quoted();
        format!(
            "INSERT INTO {s}.inbox (handler, message_id) VALUES ($1, $2)
             ON CONFLICT (handler, message_id) DO NOTHING"
        )
    }

    /// Version 1 of the schema.
    fn schema_v1(schema: &Identifier) -> String {
        let s = schema.quoted();
        // The message a delivery or a dead letter keeps: its MESSAGE_COLUMNS.
        let message = "message_type text NOT NULL,
                 payload bytea NOT NULL,
                 headers jsonb NOT NULL,
                 correlation_id uuid,
                 causation_id uuid,
                 aggregate text,
                 aggregate_key text,
                 -- When the message was published: its first sight.
                 created_at timestamptz NOT NULL";
        format!(
            "CREATE TABLE {s}.outbox (
                 id uuid PRIMARY KEY,
                 message_type text NOT NULL,
                 payload bytea NOT NULL,
                 headers jsonb NOT NULL DEFAULT '{{}}'::jsonb,
                 correlation_id uuid,
                 causation_id uuid,
                 -- For an ordered relay (Kafka): the aggregate and its id, when the message has one.
                 aggregate text,
                 aggregate_key text,
                 created_at timestamptz NOT NULL DEFAULT now()
             ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

             CREATE TABLE {s}.deliveries (
                 id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 message_id uuid NOT NULL,
                 -- '' when no handler knew the message type at expansion.
                 handler text NOT NULL,
                 attempts integer NOT NULL DEFAULT 0,
                 -- Due time; a claim moves it to the end of the lease.
                 available_at timestamptz NOT NULL DEFAULT now(),
                 -- The claim token of the worker holding it, if any.
                 lease_owner uuid,
                 last_error text,
                 {message},
                 UNIQUE (message_id, handler)
             ) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
                     autovacuum_vacuum_threshold = 1000);
             CREATE INDEX deliveries_due ON {s}.deliveries (available_at);

             CREATE TABLE {s}.dead_letters (
                 id uuid PRIMARY KEY,
                 message_id uuid NOT NULL,
                 handler text,
                 reason text NOT NULL,
                 detail text NOT NULL,
                 attempts integer NOT NULL,
                 dead_lettered_at timestamptz NOT NULL DEFAULT now(),
                 {message}
             );
             CREATE INDEX dead_letters_by_time ON {s}.dead_letters (dead_lettered_at, id);

             CREATE TABLE {s}.inbox (
                 handler text NOT NULL,
                 message_id uuid NOT NULL,
                 processed_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (handler, message_id)
             );"
        )
    }
}

/// How long [`PgStore::connect`] waits for the server to answer.
const CONNECT_DEADLINE: Duration = Duration::from_secs(30);

/// The schema version [`migrate_in`] brings a schema to.
const SCHEMA_VERSION: i32 = 9;

/// Creates or upgrades the schema on `conn`, which is in a transaction.
async fn migrate_in(conn: &mut PgConnection, schema: &Identifier) -> Result<(), StoreError> {
    let s = schema.quoted();
    let lock_key = format!("hexeract.migrate.{schema}");
    let bootstrap = format!(
        "CREATE SCHEMA IF NOT EXISTS {s};
         CREATE TABLE IF NOT EXISTS {s}.schema_versions (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         );"
    );
    let current_version = format!("SELECT max(version) FROM {s}.schema_versions");
    // Each version: what it adds, and its statements, which record it.
    let versions = [
        (
            1,
            "the outbox",
            format!(
                "{}; INSERT INTO {s}.schema_versions (version) VALUES (1);",
                Statements::schema_v1(schema)
            ),
        ),
        (
            2,
            "deliveries.recovered",
            format!(
                "ALTER TABLE {s}.deliveries ADD COLUMN recovered boolean NOT NULL DEFAULT false;
                 INSERT INTO {s}.schema_versions (version) VALUES (2);"
            ),
        ),
        (3, "schedules", schedules::schema_v3(schema)),
        (
            4,
            "declared_queues",
            format!(
                "CREATE TABLE {s}.declared_queues (
                     queue text PRIMARY KEY,
                     handler text NOT NULL,
                     message_type text NOT NULL,
                     declared_at timestamptz NOT NULL DEFAULT now()
                 );
                 INSERT INTO {s}.schema_versions (version) VALUES (4);"
            ),
        ),
        (
            5,
            "scheduled_messages.aggregate",
            schedules::schema_v5(schema),
        ),
        (
            6,
            "dead letters indexed by handler and by reason",
            format!(
                "CREATE INDEX dead_letters_by_handler
                     ON {s}.dead_letters (handler, dead_lettered_at, id);
                 CREATE INDEX dead_letters_by_reason
                     ON {s}.dead_letters (reason, dead_lettered_at, id);
                 INSERT INTO {s}.schema_versions (version) VALUES (6);"
            ),
        ),
        (
            7,
            "messages with one handler claimed in place in the outbox",
            format!(
                "ALTER TABLE {s}.outbox
                     -- Set when the message is claimed in place: its type's one handler.
                     ADD COLUMN handler text,
                     ADD COLUMN attempts integer NOT NULL DEFAULT 0,
                     -- The claim token of the worker holding it, if any.
                     ADD COLUMN lease_owner uuid,
                     -- When the claim ends; NULL while nobody claimed it.
                     ADD COLUMN leased_until timestamptz,
                     ADD COLUMN recovered boolean NOT NULL DEFAULT false;
                 INSERT INTO {s}.schema_versions (version) VALUES (7);"
            ),
        ),
        (
            8,
            "outbox pages kept half free, so that a claim in place is a heap-only update",
            format!(
                // A claim in place rewrites the row (attempt, lease) and touches no indexed
                // column: where its page has room for the new version, PostgreSQL writes it
                // there and adds no index entry (a HOT update). Pages filled by inserts have
                // no room, so every claim moved its row to another page and added a primary
                // key entry that later scans had to step over. Inserts from here on leave
                // half of each page free; rows already written stay where they are.
                "ALTER TABLE {s}.outbox SET (fillfactor = 50);
                 INSERT INTO {s}.schema_versions (version) VALUES (8);"
            ),
        ),
        (
            9,
            "record_attempts: calls of Kafka records remembered across restarts",
            format!(
                // One row per consumer group and partition (RecordAttempts).
                "CREATE TABLE {s}.record_attempts (
                     group_id text NOT NULL,
                     topic text NOT NULL,
                     partition integer NOT NULL,
                     -- The record counted exactly (-1: none) and its calls started.
                     record_offset bigint NOT NULL,
                     calls integer NOT NULL,
                     -- Offsets whose calls may have begun and not been seen settled.
                     window_first bigint NOT NULL,
                     window_last bigint NOT NULL,
                     updated_at timestamptz NOT NULL DEFAULT now(),
                     PRIMARY KEY (group_id, topic, partition)
                 );
                 INSERT INTO {s}.schema_versions (version) VALUES (9);"
            ),
        ),
    ];

    // Several processes may start at once: one migrates, the others wait for its transaction
    // and then find the new version.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(lock_key)
        .execute(&mut *conn)
        .await?;
    sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(&bootstrap)).await?;
    let current: Option<i32> = sqlx::query_scalar(&current_version)
        .fetch_one(&mut *conn)
        .await?;
    let current = current.unwrap_or(0);
    for (version, what, statements) in versions.iter().filter(|(v, ..)| *v > current) {
        sqlx::Executor::execute(&mut *conn, sqlx::raw_sql(statements)).await?;
        // A new schema is announced once; each upgrade of an existing one is.
        if current > 0 {
            tracing::info!(%schema, "outbox schema upgraded to version {version} ({what})");
        }
    }
    if current == 0 {
        tracing::info!(%schema, "outbox schema created (version {SCHEMA_VERSION})");
    }
    Ok(())
}

/// Reads a message out of a `deliveries`, `dead_letters` or (with `id AS message_id`) `outbox`
/// row: its [`MESSAGE_COLUMNS`] and `message_id`. A row Hexeract did not write (headers that are
/// not a JSON object of strings) is read as far as it can be, with what was wrong: see
/// [`Problems`](crate::store::unreadable::Problems).
fn envelope_from_row(row: &PgRow, attempts: i32) -> Result<(Envelope, Option<String>), StoreError> {
    let mut problems = Problems::default();
    let headers = problems.headers_column(row.try_get("headers"), || row.try_get("headers"));
    let mut envelope = Envelope::from_raw(
        row.try_get::<String, _>("message_type")?,
        Bytes::from(row.try_get::<Vec<u8>, _>("payload")?),
    );
    envelope.id = row.try_get("message_id")?;
    envelope.headers = headers;
    envelope.correlation_id = row.try_get("correlation_id")?;
    envelope.causation_id = row.try_get("causation_id")?;
    envelope.aggregate = row.try_get("aggregate")?;
    envelope.aggregate_key = row.try_get("aggregate_key")?;
    envelope.created_at = row.try_get("created_at")?;
    envelope.attempt = u32::try_from(attempts).unwrap_or(0);
    Ok((envelope, problems.into_detail()))
}

/// A claimed delivery: a `deliveries` row, or an outbox row claimed in place (no `id`).
fn claimed_from_row(row: &PgRow) -> Result<Claimed, StoreError> {
    let id = match row.try_get::<Option<i64>, _>("id")? {
        Some(id) => DeliveryId::Row(id),
        None => DeliveryId::Outbox(row.try_get("message_id")?),
    };
    let (envelope, unreadable) = envelope_from_row(row, row.try_get("attempts")?)?;
    Ok(Claimed {
        id,
        handler: row.try_get("handler")?,
        envelope,
        recovered: row.try_get("recovered")?,
        unreadable,
    })
}

/// The `insert_dead_letter` statement with `letter` bound.
fn insert_dead_letter<'q>(
    sql: &'q str,
    letter: &'q DeadLetter,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let envelope = &letter.envelope;
    sqlx::query(sql)
        .bind(letter.id)
        .bind(envelope.id)
        .bind(letter.handler.as_deref())
        .bind(letter.reason.as_str())
        .bind(crate::dead_letter::truncate_detail(&letter.detail))
        .bind(i32::try_from(letter.attempts).unwrap_or(i32::MAX))
        .bind(letter.dead_lettered_at)
        .bind(envelope.message_type.as_str())
        .bind(&envelope.payload[..])
        .bind(Json(&envelope.headers))
        .bind(envelope.correlation_id)
        .bind(envelope.causation_id)
        .bind(envelope.aggregate.as_deref())
        .bind(envelope.aggregate_key.as_deref())
        .bind(envelope.created_at)
}

/// A `dead_letters` row as a [`DeadLetter`].
fn dead_letter_from_row(row: &PgRow) -> Result<DeadLetter, StoreError> {
    let attempts: i32 = row.try_get("attempts")?;
    Ok(DeadLetter {
        id: row.try_get("id")?,
        envelope: envelope_from_row(row, attempts)?.0,
        handler: row.try_get("handler")?,
        reason: Reason::from(row.try_get::<String, _>("reason")?),
        detail: row.try_get("detail")?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        dead_lettered_at: row.try_get("dead_lettered_at")?,
    })
}

/// Binds the values of a [`DeadLetterSql`] query's conditions, in their order.
fn bind_matching<'q>(
    mut query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    filter: &'q DeadLetterFilter,
    page: Option<&'q Page>,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    if let Some(handler) = &filter.handler {
        query = query.bind(handler);
    }
    if let Some(reason) = &filter.reason {
        query = query.bind(reason);
    }
    if let Some(before) = filter.before {
        query = query.bind(before);
    }
    if let Some((at, id)) = page.and_then(|page| page.after) {
        query = query.bind(at).bind(id);
    }
    query
}

fn limit(value: u32) -> i64 {
    i64::from(value)
}

impl DeliveryStore for PgStore {
    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut tx = crate::store::begin(&self.pool, None).await?;
            migrate_in(&mut tx, &self.schema).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn publish(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await?;
            insert_outbox(&mut conn, &self.schema, &envelopes).await?;
            // The worker may be in this process: wake it without waiting for the NOTIFY.
            self.wake.signal.notify_one();
            Ok(())
        })
    }

    fn expand<'a>(
        &'a self,
        routes: &'a Routes,
        limit_rows: u32,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let (types, handlers) = routes.columns();
            let moved: i64 = sqlx::query_scalar(&self.sql.expand)
                .bind(types)
                .bind(handlers)
                .bind(limit(limit_rows))
                .fetch_one(&self.pool)
                .await?;
            Ok(u64::try_from(moved).unwrap_or(0))
        })
    }

    fn claim(
        &self,
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<Claimed>, StoreError>> {
        Box::pin(async move {
            let rows = sqlx::query(&self.sql.claim)
                .bind(token)
                .bind(millis(lease))
                .bind(limit(limit_rows))
                .fetch_all(&self.pool)
                .await?;
            rows.iter().map(claimed_from_row).collect()
        })
    }

    fn take<'a>(
        &'a self,
        routes: &'a Routes,
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<Claimed>, StoreError>> {
        Box::pin(async move {
            let (_, claimed) = self
                .take_acking((Uuid::nil(), &[]), routes, token, limit_rows, lease)
                .await?;
            Ok(claimed)
        })
    }

    // One statement: the acks and the take commit together.
    fn ack_and_take<'a>(
        &'a self,
        acked: (Uuid, &'a [DeliveryId]),
        routes: &'a Routes,
        token: Uuid,
        limit_rows: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(u64, Vec<Claimed>), StoreError>> {
        Box::pin(self.take_acking(acked, routes, token, limit_rows, lease))
    }

    fn deliveries(&self) -> &dyn Claims<DeliveryId> {
        &*self.deliveries
    }

    fn backlog(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.count(&self.sql.backlog))
    }

    fn wakeups(&self) -> BoxFuture<'_, Result<Option<Arc<Notify>>, StoreError>> {
        Box::pin(async move {
            self.wake
                .listening
                .get_or_try_init(|| async {
                    let mut listener = PgListener::connect_with(&self.pool).await?;
                    listener.listen(&notify_channel(&self.schema)).await?;
                    tokio::spawn(forward_notifications(
                        listener,
                        self.wake.signal.clone(),
                        self.wake.stop.clone(),
                    ));
                    Ok::<(), StoreError>(())
                })
                .await?;
            Ok(Some(self.wake.signal.clone()))
        })
    }

    fn kind(&self) -> &'static str {
        "postgresql"
    }
}

impl RelayStore for PgStore {
    fn relay<'a>(
        &'a self,
        limit_rows: u32,
        sink: &'a dyn RelaySink,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut tx = crate::store::begin(&self.pool, None).await?;
            // The transaction waits, idle, for the broker's confirms. Should this client vanish
            // mid-pass (a network path gone silent), the database ends the transaction after
            // twice the longest such wait, and the rows it locked come free for other passes.
            let idle = millis(sink.publish_timeout().saturating_mul(2)).max(1_000);
            sqlx::query(&format!(
                "SET LOCAL idle_in_transaction_session_timeout = {idle}"
            ))
            .execute(&mut *tx)
            .await?;
            if sink.exclusive() {
                // Held to the end of the transaction: until this pass's rows are deleted (or
                // back, after a failed publish), no other ordered relay of this schema starts.
                let ours: bool =
                    sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext($1))")
                        .bind(&self.sql.relay_lock)
                        .fetch_one(&mut *tx)
                        .await?;
                if !ours {
                    tx.rollback().await?;
                    return Ok(0);
                }
            }
            let rows = sqlx::query(&self.sql.relay_take)
                .bind(limit(limit_rows))
                .fetch_all(&mut *tx)
                .await?;
            if rows.is_empty() {
                tx.rollback().await?;
                return Ok(0);
            }
            let mut taken = Vec::with_capacity(rows.len());
            for row in &rows {
                taken.push(envelope_from_row(row, 0)?);
            }
            let ids: Vec<Uuid> = taken.iter().map(|(envelope, _)| envelope.id).collect();
            let (envelopes, unreadable) = crate::store::relay::readable(taken);
            let unpublishable = match sink.publish(&envelopes).await {
                Ok(unpublishable) => unpublishable,
                Err(error) => {
                    tx.rollback().await?;
                    return Err(StoreError::Relay(error));
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
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(ids.len() as u64)
        })
    }
}

impl DeadLetterStore for PgStore {
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
                .bind(id)
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
            let replayed: i64 = sqlx::query_scalar(&self.sql.replay)
                .bind(id)
                .fetch_one(&self.pool)
                .await?;
            Ok(replayed == 1)
        })
    }

    fn replay_dead_letter_as<'a>(
        &'a self,
        id: Uuid,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let mut tx = crate::store::begin(&self.pool, None).await?;
            let gone = sqlx::query(&self.sql.delete_dead_letters)
                .bind([id].as_slice())
                .execute(&mut *tx)
                .await?;
            if gone.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(false);
            }
            insert_outbox(&mut tx, &self.schema, std::slice::from_ref(envelope)).await?;
            tx.commit().await?;
            self.wake.signal.notify_one();
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
            let done = sqlx::query(&self.sql.delete_dead_letters)
                .bind(ids)
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected())
        })
    }

    fn purge_dead_letters_before(&self, age: Duration) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            // Keeps `now() - age` within PostgreSQL's timestamp range.
            const MAX_AGE_MILLIS: i64 = 1000 * 365 * 24 * 3600 * 1000;
            let done = sqlx::query(&format!(
                "DELETE FROM {}.dead_letters
                 WHERE dead_lettered_at < now() - $1::bigint * interval '1 millisecond'",
                self.schema.quoted()
            ))
            .bind(millis(age).min(MAX_AGE_MILLIS))
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected())
        })
    }
}

impl Housekeeping for PgStore {
    fn sampling_store(&self, timeout: Duration) -> Option<Arc<dyn crate::store::Store>> {
        // The same database, user and settings as this store's connections.
        let options = (*self.pool.connect_options()).clone();
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(timeout)
            .idle_timeout(Some(Duration::from_secs(60)))
            .connect_lazy_with(options);
        let store = PgStore::new(pool, self.schema.as_str()).ok()?;
        Some(Arc::new(store))
    }

    fn pending_by_handler(&self) -> BoxFuture<'_, Result<Vec<Pending>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<(String, i64, Option<DateTime<Utc>>)> = sqlx::query_as(&format!(
                "SELECT handler, count(*), min(created_at)
                 FROM (SELECT handler, created_at FROM {s}.deliveries
                       UNION ALL
                       SELECT handler, created_at FROM {s}.outbox
                       -- Claimed in place and running; a row whose claim ended is routed
                       -- again when it is next taken.
                       WHERE lease_owner IS NOT NULL AND leased_until > now()) owed
                 GROUP BY handler ORDER BY handler",
                s = self.schema.quoted()
            ))
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
            // Message ids are UUID v7, in publish order: both lookups follow an index.
            let oldest: (Option<DateTime<Utc>>, Option<DateTime<Utc>>) =
                sqlx::query_as(&self.sql.oldest_pending)
                    .fetch_one(&self.pool)
                    .await?;
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

/// Turns every notification on the outbox channel into a wake-up, until the store is gone.
/// `PgListener` reconnects by itself after a connection loss; a notification lost meanwhile
/// only costs one poll interval.
async fn forward_notifications(
    mut listener: PgListener,
    signal: Arc<Notify>,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => return,
            received = listener.try_recv() => received,
        };
        match received {
            Ok(Some(_)) => signal.notify_one(),
            Ok(None) => {
                tracing::debug!("outbox listener reconnected");
                // Whatever was notified while disconnected is found by this poll.
                signal.notify_one();
            }
            Err(error) => {
                tracing::warn!(%error, "outbox listener failed; retrying in 1 s");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}
