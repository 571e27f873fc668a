//! [`ScheduleStore`] on PostgreSQL: `schedules`, `occurrences` and `scheduled_messages` in the
//! store's schema (version 3; a delayed message's aggregate since version 5). Claims and the
//! move of due messages use the outbox's `id = ANY(ARRAY(SELECT … FOR UPDATE SKIP LOCKED))`;
//! every time is the database's `now()`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use sqlx::postgres::PgPool;
use sqlx::Row;
use uuid::Uuid;

use super::{claim, limit, notify_channel, PgStore, Settle, MESSAGE_COLUMNS};
use crate::envelope::Envelope;
use crate::store::schedules::{
    occurrence_id, ClaimedOccurrence, Due, FirstFire, Planner, ScheduleDefinition, ScheduleStore,
    SCHEDULE_MESSAGE_TYPE,
};
use crate::store::{millis, Claims, Identifier, StoreError};

/// Version 3 of the schema: the scheduler's tables.
pub(super) fn schema_v3(schema: &Identifier) -> String {
    let s = schema.quoted();
    format!(
        "CREATE TABLE {s}.schedules (
             name text PRIMARY KEY,
             spec text NOT NULL,
             next_fire_at timestamptz NOT NULL,
             updated_at timestamptz NOT NULL DEFAULT now()
         );

         CREATE TABLE {s}.occurrences (
             -- UUID v5 of (schedule, fire time): the same on every replica.
             id uuid PRIMARY KEY,
             schedule text NOT NULL,
             fire_at timestamptz NOT NULL,
             attempts integer NOT NULL DEFAULT 0,
             -- Due time; a claim moves it to the end of the lease.
             available_at timestamptz NOT NULL,
             lease_owner uuid,
             -- Claimed again while a claim was unsettled: its last run may have crashed the
             -- process, so it runs alone.
             recovered boolean NOT NULL DEFAULT false,
             last_error text,
             UNIQUE (schedule, fire_at)
         ) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
                 autovacuum_vacuum_threshold = 1000);
         CREATE INDEX occurrences_due ON {s}.occurrences (available_at);

         CREATE TABLE {s}.scheduled_messages (
             id uuid PRIMARY KEY,
             due_at timestamptz NOT NULL,
             message_type text NOT NULL,
             payload bytea NOT NULL,
             headers jsonb NOT NULL,
             correlation_id uuid,
             causation_id uuid,
             created_at timestamptz NOT NULL
         );
         CREATE INDEX scheduled_messages_due ON {s}.scheduled_messages (due_at);

         INSERT INTO {s}.schema_versions (version) VALUES (3);"
    )
}

/// Version 5 of the schema: delayed messages keep their aggregate, as the outbox does, so
/// that they reach it with theirs.
pub(super) fn schema_v5(schema: &Identifier) -> String {
    let s = schema.quoted();
    format!(
        "ALTER TABLE {s}.scheduled_messages
             ADD COLUMN aggregate text,
             ADD COLUMN aggregate_key text;
         INSERT INTO {s}.schema_versions (version) VALUES (5);"
    )
}

/// The occurrences' [`Settle`]: a dead letter of a run is a message of type
/// [`SCHEDULE_MESSAGE_TYPE`] whose handler is the schedule and whose payload names it and the
/// fire time; its message id is the occurrence's and its `created_at` the fire time (what
/// `replay_occurrence` reads back).
pub(super) fn occurrences(pool: PgPool, schema: &Identifier) -> Settle {
    let s = schema.quoted();
    Settle::new(
        pool,
        schema,
        "occurrences",
        &format!(
            "INSERT INTO {s}.dead_letters
                 (id, message_id, handler, reason, detail, attempts, message_type, payload,
                  headers, created_at)
             SELECT $3, id, schedule, $4, $5, $6, '{SCHEDULE_MESSAGE_TYPE}',
                    convert_to(json_build_object('schedule', schedule,
                                                 'fire_at', fire_at)::text, 'UTF8'),
                    '{{}}'::jsonb, fire_at
             FROM gone"
        ),
    )
}

/// The scheduler's statements, built once per store.
pub(super) struct ScheduleStatements {
    known: String,
    upsert: String,
    any_due: String,
    due: String,
    insert_occurrence: String,
    advance: String,
    claim: String,
    replay: String,
    schedule_message: String,
    release_due: String,
    backlog: String,
}

impl ScheduleStatements {
    pub(super) fn new(schema: &Identifier) -> ScheduleStatements {
        let s = schema.quoted();
        let m = MESSAGE_COLUMNS;
        ScheduleStatements {
            known: format!(
                "SELECT name, spec, now() AS now FROM {s}.schedules WHERE name = ANY($1)"
            ),
            upsert: format!(
                "INSERT INTO {s}.schedules (name, spec, next_fire_at) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE
                 SET spec = excluded.spec, next_fire_at = excluded.next_fire_at, updated_at = now()
                 WHERE {s}.schedules.spec <> excluded.spec"
            ),
            any_due: format!(
                "SELECT EXISTS (SELECT 1 FROM {s}.schedules
                                WHERE name = ANY($1) AND next_fire_at <= now())"
            ),
            due: format!(
                "SELECT name, next_fire_at, now() AS now FROM {s}.schedules
                 WHERE name = ANY($1) AND next_fire_at <= now()
                 ORDER BY next_fire_at
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED"
            ),
            insert_occurrence: format!(
                "INSERT INTO {s}.occurrences (id, schedule, fire_at, available_at)
                 VALUES ($1, $2, $3, $3)
                 ON CONFLICT DO NOTHING"
            ),
            advance: format!(
                "UPDATE {s}.schedules SET next_fire_at = $2, updated_at = now() WHERE name = $1"
            ),
            claim: claim(
                &format!("{s}.occurrences"),
                "AND schedule = ANY($4)",
                "id, schedule, fire_at, attempts, recovered",
            ),
            // The dead letter's message id is the occurrence's id and its `created_at` the fire
            // time (see `occurrences`): the run comes back as it was, attempts from 1.
            replay: format!(
                "WITH gone AS (
                     DELETE FROM {s}.dead_letters
                     WHERE id = $1 AND message_type = '{SCHEDULE_MESSAGE_TYPE}'
                       AND handler IS NOT NULL
                     RETURNING message_id, handler, created_at
                 ), back AS (
                     INSERT INTO {s}.occurrences (id, schedule, fire_at, available_at)
                     SELECT message_id, handler, created_at, now() FROM gone
                     ON CONFLICT DO NOTHING
                 )
                 SELECT count(*) FROM gone"
            ),
            schedule_message: format!(
                "INSERT INTO {s}.scheduled_messages (id, due_at, {m})
                 SELECT id, coalesce($2::timestamptz,
                                 clock_timestamp() + $3::bigint * interval '1 millisecond'), {m}
                 FROM UNNEST($1::uuid[], $4::text[], $5::bytea[], $6::jsonb[], $7::uuid[],
                             $8::uuid[], $9::text[], $10::text[], $11::timestamptz[])
                      AS m(id, {m})
                 ON CONFLICT (id) DO NOTHING"
            ),
            release_due: format!(
                "WITH due AS (
                     DELETE FROM {s}.scheduled_messages
                     WHERE id = ANY(ARRAY(
                         SELECT id FROM {s}.scheduled_messages
                         WHERE due_at <= now()
                         ORDER BY due_at
                         LIMIT $1
                         FOR UPDATE SKIP LOCKED))
                     RETURNING id, {m}),
                 moved AS (
                     INSERT INTO {s}.outbox (id, {m})
                     SELECT * FROM due
                     ON CONFLICT (id) DO NOTHING
                     RETURNING 1)
                 SELECT (SELECT count(*) FROM due) AS moved,
                        CASE WHEN EXISTS (SELECT 1 FROM moved) THEN pg_notify($2, '') END"
            ),
            backlog: format!(
                "SELECT (SELECT count(*) FROM {s}.occurrences)
                      + (SELECT count(*) FROM {s}.scheduled_messages)"
            ),
        }
    }
}

impl ScheduleStore for PgStore {
    fn sync_schedules<'a>(
        &'a self,
        schedules: &'a [ScheduleDefinition],
        first: &'a FirstFire<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let sql = &self.schedule_sql;
            let names: Vec<&str> = schedules.iter().map(|s| s.name.as_str()).collect();
            let known = sqlx::query(&sql.known)
                .bind(&names)
                .fetch_all(&self.pool)
                .await?;
            let now: DateTime<Utc> = match known.first() {
                Some(row) => row.try_get("now")?,
                None => {
                    sqlx::query_scalar("SELECT now()")
                        .fetch_one(&self.pool)
                        .await?
                }
            };
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
                sqlx::query(&sql.upsert)
                    .bind(&schedule.name)
                    .bind(&schedule.spec)
                    .bind(first(&schedule.name, now))
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
            // Nothing due is the common case: one statement finds out, without a transaction.
            let any_due: bool = sqlx::query_scalar(&sql.any_due)
                .bind(names)
                .fetch_one(&self.pool)
                .await?;
            if !any_due {
                return Ok(0);
            }
            let mut tx = crate::store::begin(&self.pool, None).await?;
            let due = sqlx::query(&sql.due)
                .bind(names)
                .bind(limit(limit_rows))
                .fetch_all(&mut *tx)
                .await?;
            if due.is_empty() {
                tx.commit().await?;
                return Ok(0);
            }
            let mut written = 0;
            for row in &due {
                let name: String = row.try_get("name")?;
                let next: DateTime<Utc> = row.try_get("next_fire_at")?;
                let now: DateTime<Utc> = row.try_get("now")?;
                let plan = planner(&name, next, now);
                if let Some(fire_at) = plan.fire_at {
                    written += sqlx::query(&sql.insert_occurrence)
                        .bind(occurrence_id(&name, fire_at))
                        .bind(&name)
                        .bind(fire_at)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                }
                sqlx::query(&sql.advance)
                    .bind(&name)
                    .bind(plan.next_fire_at)
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
            let rows = sqlx::query(&self.schedule_sql.claim)
                .bind(token)
                .bind(millis(lease))
                .bind(limit(limit_rows))
                .bind(names)
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(ClaimedOccurrence {
                        id: row.try_get("id")?,
                        schedule: row.try_get("schedule")?,
                        fire_at: row.try_get("fire_at")?,
                        attempts: u32::try_from(row.try_get::<i32, _>("attempts")?).unwrap_or(0),
                        recovered: row.try_get("recovered")?,
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
            let replayed: i64 = sqlx::query_scalar(&self.schedule_sql.replay)
                .bind(id)
                .fetch_one(&self.pool)
                .await?;
            Ok(replayed == 1)
        })
    }

    fn schedule_messages(
        &self,
        envelopes: Vec<Envelope>,
        due: Due,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await?;
            insert_scheduled(&mut conn, &self.schedule_sql, &envelopes, due).await
        })
    }

    fn release_due_messages(&self, limit_rows: u32) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query(&self.schedule_sql.release_due)
                .bind(limit(limit_rows))
                .bind(notify_channel(&self.schema))
                .fetch_one(&self.pool)
                .await?;
            let moved: i64 = row.try_get("moved")?;
            if moved > 0 {
                self.wake.signal.notify_one();
            }
            Ok(u64::try_from(moved).unwrap_or(0))
        })
    }

    fn schedule_backlog(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.count(&self.schedule_sql.backlog))
    }
}

impl PgStore {
    /// The scheduler's claim and ack statements, so that a benchmark's raw-sqlx baseline runs
    /// exactly the SQL the worker runs. Not a stable interface.
    #[doc(hidden)]
    pub fn schedule_statements_for_benchmarks(&self) -> [&str; 2] {
        [&self.schedule_sql.claim, &self.occurrences.ack]
    }
}

/// Inserts delayed messages on `conn`, inside whatever transaction it is in: what
/// [`schedule::schedule_at`](crate::schedule::schedule_at) does on PostgreSQL.
pub(crate) async fn insert_scheduled(
    conn: &mut sqlx::PgConnection,
    sql: &ScheduleStatements,
    envelopes: &[Envelope],
    due: Due,
) -> Result<(), StoreError> {
    if envelopes.is_empty() {
        return Ok(());
    }
    crate::store::limit::check(envelopes)?;
    let (at, after) = match due {
        Due::At(at) => (Some(at), None),
        Due::After(delay) => (None, Some(millis(delay))),
    };
    let columns = super::OutboxColumns::from(envelopes);
    let query = sqlx::query(&sql.schedule_message)
        .bind(&columns.ids)
        .bind(at)
        .bind(after);
    columns.bind_messages(query).execute(conn).await?;
    Ok(())
}

/// [`insert_scheduled`] with the statement built for `schema`, for a caller's transaction.
pub(crate) async fn insert_scheduled_in(
    conn: &mut sqlx::PgConnection,
    schema: &Identifier,
    envelopes: &[Envelope],
    due: Due,
) -> Result<(), StoreError> {
    insert_scheduled(conn, &ScheduleStatements::new(schema), envelopes, due).await
}
