//! [`DeclaredQueues`] on SQLite: the `<prefix>_declared_queues` table (schema version 4).

use chrono::DateTime;
use futures_util::future::BoxFuture;

use super::{SqliteStore, NOW_MILLIS_SQL};
use crate::store::{DeclaredQueue, DeclaredQueues, StoreError};

impl DeclaredQueues for SqliteStore {
    fn record_declared_queues<'a>(
        &'a self,
        queues: &'a [DeclaredQueue],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let statement = format!(
                "INSERT INTO \"{}_declared_queues\" (queue, handler, message_type, declared_at)
                 VALUES (?1, ?2, ?3, {NOW_MILLIS_SQL})
                 ON CONFLICT (queue) DO UPDATE
                 SET handler = excluded.handler, message_type = excluded.message_type,
                     declared_at = excluded.declared_at",
                self.prefix
            );
            let mut tx = crate::store::begin(&self.pool, None).await?;
            for queue in queues {
                sqlx::query(&statement)
                    .bind(&queue.queue)
                    .bind(&queue.handler)
                    .bind(&queue.message_type)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    fn declared_queues(&self) -> BoxFuture<'_, Result<Vec<DeclaredQueue>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<(String, String, String, i64)> = sqlx::query_as(&format!(
                "SELECT queue, handler, message_type, declared_at
                 FROM \"{}_declared_queues\" ORDER BY queue",
                self.prefix
            ))
            .fetch_all(&self.pool)
            .await?;
            Ok(rows
                .into_iter()
                .map(
                    |(queue, handler, message_type, declared_at)| DeclaredQueue {
                        queue,
                        handler,
                        message_type,
                        declared_at: DateTime::from_timestamp_millis(declared_at)
                            .unwrap_or_default(),
                    },
                )
                .collect())
        })
    }

    fn forget_declared_queue<'a>(
        &'a self,
        queue: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let done = sqlx::query(&format!(
                "DELETE FROM \"{}_declared_queues\" WHERE queue = ?1",
                self.prefix
            ))
            .bind(queue)
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected() > 0)
        })
    }
}
