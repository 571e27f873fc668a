//! [`RecordAttempts`] on PostgreSQL: the `record_attempts` table (schema version 9).

use futures_util::future::BoxFuture;

use super::PgStore;
use crate::store::StoreError;
use crate::store::{calls_of, RecordAttempts, RecordPosition};

impl RecordAttempts for PgStore {
    fn count_call<'a>(
        &'a self,
        position: RecordPosition<'a>,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        Box::pin(async move {
            let (offset, calls): (i64, i64) = sqlx::query_as(&format!(
                "INSERT INTO {}.record_attempts AS r (group_id, topic, partition, record_offset, calls)
                 VALUES ($1, $2, $3, $4, 1)
                 ON CONFLICT (group_id, topic, partition) DO UPDATE
                 SET calls = CASE
                         WHEN r.record_offset = EXCLUDED.record_offset THEN r.calls + 1
                         WHEN r.record_offset < EXCLUDED.record_offset THEN 1
                         ELSE r.calls
                     END,
                     record_offset = greatest(r.record_offset, EXCLUDED.record_offset),
                     updated_at = now()
                 RETURNING record_offset, calls::bigint",
                self.schema.quoted()
            ))
            .bind(position.group)
            .bind(position.topic)
            .bind(position.partition)
            .bind(position.offset)
            .fetch_one(&self.pool)
            .await?;
            Ok(calls_of(position.offset, offset, calls))
        })
    }

    fn uncount_call<'a>(
        &'a self,
        position: RecordPosition<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(&format!(
                "UPDATE {}.record_attempts SET calls = calls - 1, updated_at = now()
                 WHERE group_id = $1 AND topic = $2 AND partition = $3 AND record_offset = $4
                   AND calls > 0",
                self.schema.quoted()
            ))
            .bind(position.group)
            .bind(position.topic)
            .bind(position.partition)
            .bind(position.offset)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }
}
