//! [`RecordAttempts`] on SQLite: the `record_attempts` table (schema version 8).

use futures_util::future::BoxFuture;

use super::{table, SqliteStore};
use crate::store::StoreError;
use crate::store::{calls_of, RecordAttempts, RecordPosition};

impl RecordAttempts for SqliteStore {
    fn count_call<'a>(
        &'a self,
        position: RecordPosition<'a>,
    ) -> BoxFuture<'a, Result<u32, StoreError>> {
        Box::pin(async move {
            let _writing = self.writes.lock().await;
            let (offset, calls): (i64, i64) = sqlx::query_as(&format!(
                "INSERT INTO {t} (group_id, topic, partition, record_offset, calls)
                 VALUES (?1, ?2, ?3, ?4, 1)
                 ON CONFLICT (group_id, topic, partition) DO UPDATE
                 SET calls = CASE
                         WHEN record_offset = excluded.record_offset THEN calls + 1
                         WHEN record_offset < excluded.record_offset THEN 1
                         ELSE calls
                     END,
                     record_offset = max(record_offset, excluded.record_offset)
                 RETURNING record_offset, calls",
                t = table(&self.prefix, "record_attempts")
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
            let _writing = self.writes.lock().await;
            sqlx::query(&format!(
                "UPDATE {t} SET calls = calls - 1
                 WHERE group_id = ?1 AND topic = ?2 AND partition = ?3 AND record_offset = ?4
                   AND calls > 0",
                t = table(&self.prefix, "record_attempts")
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
