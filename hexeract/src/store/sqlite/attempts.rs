//! [`RecordAttempts`] on SQLite: the `record_attempts` table (schema version 8).

use futures_util::future::BoxFuture;

use super::{table, SqliteStore};
use crate::store::attempts::{columns, from_columns};
use crate::store::{PartitionCalls, PartitionOf, RecordAttempts, StoreError};

impl RecordAttempts for SqliteStore {
    fn partition_calls<'a>(
        &'a self,
        partition: PartitionOf<'a>,
    ) -> BoxFuture<'a, Result<Option<PartitionCalls>, StoreError>> {
        Box::pin(async move {
            let row: Option<(i64, i64, i64, i64)> = sqlx::query_as(&format!(
                "SELECT record_offset, calls, window_first, window_last FROM {}
                 WHERE group_id = ?1 AND topic = ?2 AND partition = ?3",
                table(&self.prefix, "record_attempts")
            ))
            .bind(partition.group)
            .bind(partition.topic)
            .bind(partition.partition)
            .fetch_optional(&self.pool)
            .await?;
            Ok(row.map(from_columns))
        })
    }

    fn remember_partition_calls<'a>(
        &'a self,
        partition: PartitionOf<'a>,
        calls: PartitionCalls,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let (offset, count, first, last) = columns(&calls);
            let _writing = self.writes.lock().await;
            sqlx::query(&format!(
                "INSERT INTO {}
                     (group_id, topic, partition, record_offset, calls, window_first, window_last)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (group_id, topic, partition) DO UPDATE
                 SET record_offset = excluded.record_offset, calls = excluded.calls,
                     window_first = excluded.window_first, window_last = excluded.window_last",
                table(&self.prefix, "record_attempts")
            ))
            .bind(partition.group)
            .bind(partition.topic)
            .bind(partition.partition)
            .bind(offset)
            .bind(count)
            .bind(first)
            .bind(last)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }
}
