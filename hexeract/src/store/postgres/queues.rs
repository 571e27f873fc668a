//! [`DeclaredQueues`] on PostgreSQL: the `declared_queues` table (schema version 4).

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;

use super::PgStore;
use crate::store::{DeclaredQueue, DeclaredQueues, StoreError};

impl DeclaredQueues for PgStore {
    fn record_declared_queues<'a>(
        &'a self,
        queues: &'a [DeclaredQueue],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let column =
                |get: fn(&DeclaredQueue) -> &str| -> Vec<&str> { queues.iter().map(get).collect() };
            sqlx::query(&format!(
                "INSERT INTO {}.declared_queues (queue, handler, message_type)
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[])
                 ON CONFLICT (queue) DO UPDATE
                 SET handler = EXCLUDED.handler, message_type = EXCLUDED.message_type,
                     declared_at = now()",
                self.schema.quoted()
            ))
            .bind(column(|queue| &queue.queue))
            .bind(column(|queue| &queue.handler))
            .bind(column(|queue| &queue.message_type))
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn declared_queues(&self) -> BoxFuture<'_, Result<Vec<DeclaredQueue>, StoreError>> {
        Box::pin(async move {
            let rows: Vec<(String, String, String, DateTime<Utc>)> = sqlx::query_as(&format!(
                "SELECT queue, handler, message_type, declared_at
                 FROM {}.declared_queues ORDER BY queue",
                self.schema.quoted()
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
                        declared_at,
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
                "DELETE FROM {}.declared_queues WHERE queue = $1",
                self.schema.quoted()
            ))
            .bind(queue)
            .execute(&self.pool)
            .await?;
            Ok(done.rows_affected() > 0)
        })
    }
}
