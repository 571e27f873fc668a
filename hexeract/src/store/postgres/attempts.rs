//! [`RecordAttempts`] on PostgreSQL: the `record_attempts` table (schema version 9).

use futures_util::future::BoxFuture;

use super::PgStore;
use crate::store::attempts::{columns, from_columns};
use crate::store::{PartitionCalls, PartitionOf, RecordAttempts, StoreError};

impl RecordAttempts for PgStore {
    fn partition_calls<'a>(
        &'a self,
        partition: PartitionOf<'a>,
    ) -> BoxFuture<'a, Result<Option<PartitionCalls>, StoreError>> {
        Box::pin(async move {
            let row: Option<(i64, i64, i64, i64)> = sqlx::query_as(&format!(
                "SELECT record_offset, calls::bigint, window_first, window_last
                 FROM {}.record_attempts
                 WHERE group_id = $1 AND topic = $2 AND partition = $3",
                self.schema.quoted()
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
            sqlx::query(&format!(
                "INSERT INTO {}.record_attempts
                     (group_id, topic, partition, record_offset, calls, window_first, window_last)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (group_id, topic, partition) DO UPDATE
                 SET record_offset = EXCLUDED.record_offset, calls = EXCLUDED.calls,
                     window_first = EXCLUDED.window_first, window_last = EXCLUDED.window_last,
                     updated_at = now()",
                self.schema.quoted()
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
