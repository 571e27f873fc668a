//! The newsletter's message, its two handlers and its scheduled job.

use hexeract::outbox::inbox::mark_processed;
use hexeract::{handler, scheduled, Context, Message, State};
use sqlx::PgPool;

/// Everything a handler can fail with; a failure is retried with backoff.
pub(crate) type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Someone signed up. Written to the outbox in the signup's own transaction. The aggregate and
/// its key are for Kafka, which keeps each subscriber's messages in order (docs/kafka.md).
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "news.SubscriberJoined", aggregate = "subscriber")]
pub(crate) struct SubscriberJoined {
    #[message(key)]
    pub(crate) subscriber_id: i64,
    pub(crate) email: String,
}

/// Queues the welcome mail. Idempotent by its key: a second delivery of the same message
/// inserts nothing.
#[handler(message = "news.SubscriberJoined", name = "news.send_welcome")]
async fn send_welcome(
    joined: SubscriberJoined,
    ctx: &Context,
    State(pool): State<PgPool>,
) -> Result<(), sqlx::Error> {
    let queued = sqlx::query(
        "INSERT INTO news.outgoing_mail (message_id, to_address, subject)
         VALUES ($1, $2, 'Welcome to the newsletter')
         ON CONFLICT (message_id) DO NOTHING",
    )
    .bind(ctx.message_id())
    .bind(&joined.email)
    .execute(&pool)
    .await?
    .rows_affected();
    tracing::info!(to = %joined.email, queued, "welcome mail");
    Ok(())
}

/// Counts the signup in today's total. An increment is not idempotent: the inbox mark, in the
/// same transaction, makes a second delivery do nothing.
#[handler(message = "news.SubscriberJoined", name = "news.count_signup")]
async fn count_signup(
    joined: SubscriberJoined,
    ctx: &Context,
    State(pool): State<PgPool>,
) -> Result<(), Failure> {
    let mut tx = pool.begin().await?;
    if !mark_processed(&mut tx, ctx).await? {
        return Ok(()); // counted already: this is a redelivery
    }
    sqlx::query(
        "INSERT INTO news.daily_signups (day, signups) VALUES (current_date, 1)
         ON CONFLICT (day) DO UPDATE SET signups = daily_signups.signups + 1",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(subscriber = joined.subscriber_id, "signup counted");
    Ok(())
}

/// Every hour, deletes the subscribers who did not confirm within 7 days.
#[scheduled(every = "1h", name = "news.purge_unconfirmed")]
async fn purge_unconfirmed(_ctx: &Context, State(pool): State<PgPool>) -> Result<(), sqlx::Error> {
    let purged = sqlx::query(
        "DELETE FROM news.subscribers
         WHERE confirmed_at IS NULL AND joined_at < now() - interval '7 days'",
    )
    .execute(&pool)
    .await?
    .rows_affected();
    tracing::info!(purged, "unconfirmed subscribers purged");
    Ok(())
}
