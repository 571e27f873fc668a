//! [`ScheduleStore`] on SQLite: `<prefix>_schedules`, `<prefix>_occurrences` and
//! `<prefix>_scheduled_messages` (version 3; a delayed message's aggregate since version 5).
//! Times are INTEGER milliseconds on the process's clock, like the outbox's; planning and
//! moving due messages run in `BEGIN IMMEDIATE` transactions, claims in one statement.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::types::Json;
use sqlx::Row;
use uuid::Uuid;

use super::{
    bind_claim, bind_message, claim, limit, now_millis, table, uuid, Settle, SqliteQuery,
    SqliteStore, BEGIN_IMMEDIATE, MESSAGE_COLUMNS,
};
use crate::envelope::Envelope;
use crate::store::schedules::{
    occurrence_id, ClaimedOccurrence, Due, FirstFire, Planner, ScheduleDefinition, ScheduleStore,
    SCHEDULE_MESSAGE_TYPE,
};
use crate::store::{millis, Claims, Identifier, StoreError};

/// Version 3 of the schema: the scheduler's tables.
pub(super) fn schema_v3(prefix: &Identifier) -> String {
    let schedules = table(prefix, "schedules");
    let occurrences = table(prefix, "occurrences");
    let occurrences_due = table(prefix, "occurrences_due");
    let messages = table(prefix, "scheduled_messages");
    let messages_due = table(prefix, "scheduled_messages_due");
    format!(
        "CREATE TABLE {schedules} (
             name TEXT NOT NULL PRIMARY KEY,
             spec TEXT NOT NULL,
             next_fire_at INTEGER NOT NULL,
             updated_at INTEGER NOT NULL
         ) STRICT;

         CREATE TABLE {occurrences} (
             -- UUID v5 of (schedule, fire time): the same on every attempt.
             id TEXT NOT NULL PRIMARY KEY,
             schedule TEXT NOT NULL,
             fire_at INTEGER NOT NULL,
             attempts INTEGER NOT NULL DEFAULT 0,
             -- Due time in ms since the epoch; a claim moves it to the end of the lease.
             available_at INTEGER NOT NULL,
             lease_owner TEXT,
             -- Claimed again while a claim was unsettled: it runs alone.
             recovered INTEGER NOT NULL DEFAULT 0,
             last_error TEXT,
             UNIQUE (schedule, fire_at)
         ) STRICT;
         CREATE INDEX {occurrences_due} ON {occurrences} (available_at);

         CREATE TABLE {messages} (
             id TEXT NOT NULL PRIMARY KEY,
             due_at INTEGER NOT NULL,
             message_type TEXT NOT NULL,
             payload BLOB NOT NULL,
             headers TEXT NOT NULL,
             correlation_id TEXT,
             causation_id TEXT,
             created_at TEXT NOT NULL
         ) STRICT;
         CREATE INDEX {messages_due} ON {messages} (due_at);"
    )
}

/// Version 5 of the schema: delayed messages keep their aggregate, as the outbox does, so
/// that they reach it with theirs.
pub(super) fn schema_v5(prefix: &Identifier) -> String {
    let messages = table(prefix, "scheduled_messages");
    format!(
        "ALTER TABLE {messages} ADD COLUMN aggregate TEXT;
         ALTER TABLE {messages} ADD COLUMN aggregate_key TEXT"
    )
}

/// The occurrences' [`Settle`]: a dead letter of a run is a message of type
/// [`SCHEDULE_MESSAGE_TYPE`] whose handler is the schedule and whose payload names it and the
/// fire time; its message id is the occurrence's and its `created_at` the fire time (what
/// `replay_occurrence` reads back).
pub(super) fn occurrences(pool: SqlitePool, writes: super::Writes, prefix: &Identifier) -> Settle {
    let dl = table(prefix, "dead_letters");
    Settle::new(
        pool,
        writes,
        prefix,
        "occurrences",
        &format!(
            "INSERT INTO {dl}
                 (id, message_id, handler, reason, detail, attempts, dead_lettered_at,
                  message_type, payload, headers, created_at)
             SELECT ?3, id, schedule, ?4, ?5, ?7, ?6, '{SCHEDULE_MESSAGE_TYPE}',
                    CAST(json_object('schedule', schedule,
                                     'fire_at', strftime('%Y-%m-%dT%H:%M:%fZ',
                                                         fire_at / 1000.0, 'unixepoch'))
                         AS BLOB),
                    '{{}}', strftime('%Y-%m-%dT%H:%M:%fZ', fire_at / 1000.0, 'unixepoch')"
        ),
    )
}

/// The scheduler's statements, built once per store.
pub(super) struct ScheduleStatements {
    known: String,
    upsert: String,
    due: String,
    insert_occurrence: String,
    advance: String,
    claim: String,
    replay_take: String,
    replay_insert: String,
    replay_delete: String,
    schedule_message: String,
    release_copy: String,
    release_delete: String,
    backlog: String,
}

impl ScheduleStatements {
    pub(super) fn new(prefix: &Identifier) -> ScheduleStatements {
        let schedules = table(prefix, "schedules");
        let o = table(prefix, "occurrences");
        let messages = table(prefix, "scheduled_messages");
        let outbox = table(prefix, "outbox");
        let dl = table(prefix, "dead_letters");
        let m = MESSAGE_COLUMNS;
        ScheduleStatements {
            known: format!(
                "SELECT name, spec FROM {schedules}
                 WHERE name IN (SELECT value FROM json_each(?1))"
            ),
            upsert: format!(
                "INSERT INTO {schedules} (name, spec, next_fire_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (name) DO UPDATE
                 SET spec = excluded.spec, next_fire_at = excluded.next_fire_at,
                     updated_at = excluded.updated_at
                 WHERE spec <> excluded.spec"
            ),
            due: format!(
                "SELECT name, next_fire_at FROM {schedules}
                 WHERE name IN (SELECT value FROM json_each(?1)) AND next_fire_at <= ?2
                 ORDER BY next_fire_at
                 LIMIT ?3"
            ),
            insert_occurrence: format!(
                "INSERT INTO {o} (id, schedule, fire_at, available_at) VALUES (?1, ?2, ?3, ?3)
                 ON CONFLICT DO NOTHING"
            ),
            advance: format!(
                "UPDATE {schedules} SET next_fire_at = ?2, updated_at = ?3 WHERE name = ?1"
            ),
            claim: claim(
                &o,
                "AND schedule IN (SELECT value FROM json_each(?5))",
                "id, schedule, fire_at, attempts, recovered",
            ),
            // The dead letter's message id is the occurrence's id and its `created_at` the fire
            // time (see `occurrences`): the run comes back as it was, attempts from 1.
            replay_take: format!(
                "SELECT message_id, handler, created_at FROM {dl}
                 WHERE id = ?1 AND message_type = '{SCHEDULE_MESSAGE_TYPE}'
                   AND handler IS NOT NULL"
            ),
            replay_insert: format!(
                "INSERT INTO {o} (id, schedule, fire_at, available_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT DO NOTHING"
            ),
            replay_delete: format!("DELETE FROM {dl} WHERE id = ?1"),
            schedule_message: format!(
                "INSERT INTO {messages} (id, due_at, {m})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT (id) DO NOTHING"
            ),
            release_copy: format!(
                "INSERT INTO {outbox} (id, {m})
                 SELECT id, {m}
                 FROM {messages}
                 WHERE id IN (SELECT value FROM json_each(?1))
                 ON CONFLICT (id) DO NOTHING"
            ),
            release_delete: format!(
                "DELETE FROM {messages} WHERE id IN (SELECT value FROM json_each(?1))"
            ),
            backlog: format!(
                "SELECT (SELECT count(*) FROM {o}) + (SELECT count(*) FROM {messages})"
            ),
        }
    }

    fn due_messages(prefix: &Identifier) -> String {
        let messages = table(prefix, "scheduled_messages");
        format!("SELECT id FROM {messages} WHERE due_at <= ?1 ORDER BY due_at LIMIT ?2")
    }
}

fn millis_to_time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl ScheduleStore for SqliteStore {
    fn sync_schedules<'a>(
        &'a self,
        schedules: &'a [ScheduleDefinition],
        first: &'a FirstFire<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let sql = &self.schedule_sql;
            let names: Vec<&str> = schedules.iter().map(|s| s.name.as_str()).collect();
            let known = sqlx::query(&sql.known)
                .bind(Json(&names))
                .fetch_all(&self.pool)
                .await?;
            let now = now_millis();
            for schedule in schedules {
                let current = known.iter().find_map(|row| {
                    let name: String = row.try_get("name").ok()?;
                    (name == schedule.name)
                        .then(|| row.try_get::<String, _>("spec").ok())
                        .flatten()
                });
                if current.as_deref() == Some(schedule.spec.as_str()) {
                    continue;
                }
                let first_fire = first(&schedule.name, millis_to_time(now));
                sqlx::query(&sql.upsert)
                    .bind(&schedule.name)
                    .bind(&schedule.spec)
                    .bind(first_fire.timestamp_millis())
                    .bind(now)
                    .execute(&self.pool)
                    .await?;
            }
            Ok(())
        })
    }

    fn plan<'a>(
        &'a self,
        names: &'a [String],
        limit_rows: u32,
        planner: &'a Planner<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let sql = &self.schedule_sql;
            let now = now_millis();
            let due = || {
                sqlx::query(&sql.due)
                    .bind(Json(names))
                    .bind(now)
                    .bind(limit(limit_rows))
            };
            let Some((mut tx, due)) = due_under_write_lock(&self.pool, due).await? else {
                return Ok(0);
            };
            let mut written = 0;
            for row in &due {
                let name: String = row.try_get("name")?;
                let next = millis_to_time(row.try_get("next_fire_at")?);
                let plan = planner(&name, next, millis_to_time(now));
                if let Some(fire_at) = plan.fire_at {
                    written += sqlx::query(&sql.insert_occurrence)
                        .bind(occurrence_id(&name, fire_at).hyphenated())
                        .bind(&name)
                        .bind(fire_at.timestamp_millis())
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                }
                sqlx::query(&sql.advance)
                    .bind(&name)
                    .bind(plan.next_fire_at.timestamp_millis())
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(written)
        })
    }

    fn claim_occurrences<'a>(
        &'a self,
        token: Uuid,
        names: &'a [String],
        limit_rows: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<ClaimedOccurrence>, StoreError>> {
        Box::pin(async move {
            let claim = sqlx::query(&self.schedule_sql.claim);
            let rows = bind_claim(claim, token, limit_rows, lease)
                .bind(Json(names))
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(ClaimedOccurrence {
                        id: uuid(row, "id")?,
                        schedule: row.try_get("schedule")?,
                        fire_at: millis_to_time(row.try_get("fire_at")?),
                        attempts: u32::try_from(row.try_get::<i64, _>("attempts")?).unwrap_or(0),
                        recovered: row.try_get::<i64, _>("recovered")? != 0,
                    })
                })
                .collect()
        })
    }

    fn occurrences(&self) -> &dyn Claims<Uuid> {
        &*self.occurrences
    }

    fn replay_occurrence(&self, id: Uuid) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move {
            let sql = &self.schedule_sql;
            let mut tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
            let Some(row) = sqlx::query(&sql.replay_take)
                .bind(id.hyphenated())
                .fetch_optional(&mut *tx)
                .await?
            else {
                tx.rollback().await?;
                return Ok(false);
            };
            let fire_at: DateTime<Utc> = row.try_get("created_at")?;
            sqlx::query(&sql.replay_insert)
                .bind(uuid(&row, "message_id")?.hyphenated())
                .bind(row.try_get::<String, _>("handler")?)
                .bind(fire_at.timestamp_millis())
                .bind(now_millis())
                .execute(&mut *tx)
                .await?;
            sqlx::query(&sql.replay_delete)
                .bind(id.hyphenated())
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(true)
        })
    }

    fn schedule_messages(
        &self,
        envelopes: Vec<Envelope>,
        due: Due,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let sql = &self.schedule_sql.schedule_message;
            if envelopes.len() <= 1 {
                // One statement, no transaction: nothing is left open if this future is
                // dropped halfway (sqlx #4393).
                let mut conn = self.pool.acquire().await?;
                return insert_scheduled_with(&mut conn, sql, &envelopes, due).await;
            }
            let mut tx = crate::store::begin(&self.pool, Some(BEGIN_IMMEDIATE)).await?;
            insert_scheduled_with(&mut tx, sql, &envelopes, due).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn release_due_messages(&self, limit_rows: u32) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let sql = &self.schedule_sql;
            let due_sql = ScheduleStatements::due_messages(&self.prefix);
            let now = now_millis();
            let due = || sqlx::query(&due_sql).bind(now).bind(limit(limit_rows));
            let Some((mut tx, due)) = due_under_write_lock(&self.pool, due).await? else {
                return Ok(0);
            };
            let due: Vec<String> = due
                .iter()
                .map(|row| row.try_get(0))
                .collect::<Result<_, _>>()?;
            sqlx::query(&sql.release_copy)
                .bind(Json(&due))
                .execute(&mut *tx)
                .await?;
            let moved = sqlx::query(&sql.release_delete)
                .bind(Json(&due))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            if moved > 0 {
                self.wake.notify_one();
            }
            Ok(moved)
        })
    }

    fn schedule_backlog(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.count(&self.schedule_sql.backlog))
    }
}

/// The rows `due` selects, looked for first on `pool` and, when there are any, again in a write
/// transaction begun for them, where what another worker did meanwhile is seen: nothing due is
/// the common case, found out without taking the write lock. `None` when nothing is due.
async fn due_under_write_lock<'q>(
    pool: &SqlitePool,
    due: impl Fn() -> SqliteQuery<'q>,
) -> Result<Option<(sqlx::Transaction<'static, sqlx::Sqlite>, Vec<SqliteRow>)>, StoreError> {
    if due().fetch_all(pool).await?.is_empty() {
        return Ok(None);
    }
    let mut tx = crate::store::begin(pool, Some(BEGIN_IMMEDIATE)).await?;
    let rows = due().fetch_all(&mut *tx).await?;
    Ok(Some((tx, rows)))
}

async fn insert_scheduled_with(
    conn: &mut sqlx::SqliteConnection,
    sql: &str,
    envelopes: &[Envelope],
    due: Due,
) -> Result<(), StoreError> {
    crate::store::limit::check(envelopes)?;
    let due_at = match due {
        Due::At(at) => at.timestamp_millis(),
        Due::After(delay) => now_millis().saturating_add(millis(delay)),
    };
    for envelope in envelopes {
        let query = sqlx::query(sql).bind(envelope.id.hyphenated()).bind(due_at);
        bind_message(query, envelope).execute(&mut *conn).await?;
    }
    Ok(())
}

/// Inserts delayed messages on `conn`, inside whatever transaction it is in: what
/// [`schedule::schedule_at`](crate::schedule::schedule_at) does on SQLite.
pub(crate) async fn insert_scheduled_in(
    conn: &mut sqlx::SqliteConnection,
    prefix: &Identifier,
    envelopes: &[Envelope],
    due: Due,
) -> Result<(), StoreError> {
    let sql = ScheduleStatements::new(prefix);
    insert_scheduled_with(conn, &sql.schedule_message, envelopes, due).await
}
