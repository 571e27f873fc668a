//! The shop's messages, its two message handlers, its scheduled job and the middleware around
//! them.
//!
//! Every handler here may see a message more than once (a retry, a redelivery after a crash),
//! so each one writes its work and its inbox mark (`mark_processed`) in one transaction: the
//! second delivery finds the mark and does nothing.
//!
//! The handlers take the shop's pool and settings as state (`State<PgPool>`,
//! `State<ShopSettings>`), given to the worker in `main`: no globals.

use std::time::Duration;

use hexeract::outbox::inbox::mark_processed;
use hexeract::{handler, scheduled, Context, HandlerOutcome, Message, Middleware, Next, State};
use sqlx::PgPool;
use uuid::Uuid;

/// The header naming the shop a message belongs to: the API sets it on `OrderPlaced`, and each
/// handler copies it to what it sends.
pub(crate) const SHOP_HEADER: &str = "shop";

/// The shop's own settings, as state of its handlers and its scheduled job.
#[derive(Clone, Debug)]
pub(crate) struct ShopSettings {
    /// This deployment's shop (`SHOP_ID`): messages of another shop are not its to handle.
    pub(crate) shop_id: String,
    /// How long a cart lives without a change (`CART_TTL_SECS`).
    pub(crate) cart_ttl: Duration,
}

/// Lets through only the messages of this shop. Several shops may share one broker or one
/// outbox; a message without the header, or another shop's, is dead-lettered with its reason
/// (an operator sees it in `dead-letters list`) instead of being handled here, where it would
/// take this shop's stock.
pub(crate) struct RequireShop {
    pub(crate) shop_id: String,
}

impl Middleware for RequireShop {
    async fn handle(&self, ctx: &Context, next: Next<'_>) -> HandlerOutcome {
        // A scheduled job's run is this shop's own: it carries no message headers.
        if ctx.scheduled_for().is_some() {
            return next.run(ctx).await;
        }
        match ctx.header(SHOP_HEADER) {
            Some(shop) if shop == self.shop_id => next.run(ctx).await,
            Some(other) => HandlerOutcome::dead_letter(
                "wrong_shop",
                format_args!(
                    "the message is for shop {other:?}; this is shop {:?}",
                    self.shop_id
                ),
            ),
            None => HandlerOutcome::dead_letter(
                "shop_missing",
                format_args!(
                    "the message has no `{SHOP_HEADER}` header, so no shop is known to own it"
                ),
            ),
        }
    }
}

/// Everything a handler can fail with; a failure is retried with backoff, up to
/// `MAX_DELIVERIES` calls, then dead-lettered.
pub(crate) type Failure = Box<dyn std::error::Error + Send + Sync>;

/// A customer checked out a cart. Written to the outbox in the checkout's transaction, so it
/// exists if and only if the order does.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "shop.OrderPlaced")]
pub(crate) struct OrderPlaced {
    pub(crate) order_id: Uuid,
    pub(crate) email: String,
    pub(crate) total_cents: i64,
    pub(crate) lines: Vec<OrderLine>,
}

/// One product of an order.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct OrderLine {
    pub(crate) sku: String,
    pub(crate) quantity: i32,
}

/// The warehouse set the goods of an order aside.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "shop.StockReserved")]
pub(crate) struct StockReserved {
    pub(crate) order_id: Uuid,
    pub(crate) email: String,
    pub(crate) total_cents: i64,
}

/// Takes the order's goods out of stock, or rejects the order when one is short. On success it
/// sends `StockReserved` in the same transaction, so the confirmation follows exactly when the
/// stock is taken.
#[handler(message = "shop.OrderPlaced", name = "shop.reserve_stock")]
async fn reserve_stock(
    order: OrderPlaced,
    ctx: &Context,
    State(pool): State<PgPool>,
) -> Result<(), Failure> {
    let mut tx = pool.begin().await?;
    if !mark_processed(&mut tx, ctx).await? {
        tracing::info!(order = %order.order_id, "stock already reserved: a redelivery, nothing to do");
        return Ok(());
    }
    let skus: Vec<&str> = order.lines.iter().map(|line| line.sku.as_str()).collect();
    // Locked in one order (by sku), so two reservations never wait on each other in a cycle.
    let stock: Vec<(String, i32)> = sqlx::query_as(
        "SELECT sku, in_stock FROM shop.products WHERE sku = ANY($1) ORDER BY sku FOR UPDATE",
    )
    .bind(&skus)
    .fetch_all(&mut *tx)
    .await?;
    let short: Vec<&str> = order
        .lines
        .iter()
        .filter(|line| {
            stock
                .iter()
                .find(|(sku, _)| *sku == line.sku)
                .is_none_or(|(_, in_stock)| *in_stock < line.quantity)
        })
        .map(|line| line.sku.as_str())
        .collect();
    if !short.is_empty() {
        let detail = format!("out of stock: {}", short.join(", "));
        set_status(&mut tx, order.order_id, "rejected", Some(&detail)).await?;
        tx.commit().await?;
        tracing::warn!(order = %order.order_id, %detail, "order rejected");
        return Ok(());
    }
    for line in &order.lines {
        sqlx::query("UPDATE shop.products SET in_stock = in_stock - $2 WHERE sku = $1")
            .bind(&line.sku)
            .bind(line.quantity)
            .execute(&mut *tx)
            .await?;
    }
    set_status(&mut tx, order.order_id, "reserved", None).await?;
    let reserved = StockReserved {
        order_id: order.order_id,
        email: order.email.clone(),
        total_cents: order.total_cents,
    };
    // `follow_up` keeps the conversation: the same correlation id, and the trace one hop on
    // from this call.
    let mut follow_up = ctx.follow_up(&reserved)?;
    if let Some(shop) = ctx.header(SHOP_HEADER) {
        follow_up = follow_up.with_header(SHOP_HEADER, shop);
    }
    hexeract::outbox::enqueue_envelope(&mut tx, follow_up).await?;
    tx.commit().await?;
    tracing::info!(order = %order.order_id, attempt = ctx.attempt(), "stock reserved");
    Ok(())
}

/// Mails the customer that the order is confirmed. An address under the reserved `.invalid`
/// domain can never receive mail: that confirmation is dead-lettered at once, with a reason,
/// for an operator to look at (`dead-letters list`), instead of being retried.
#[handler(message = "shop.StockReserved", name = "shop.send_confirmation")]
async fn send_confirmation(
    event: StockReserved,
    ctx: &Context,
    State(pool): State<PgPool>,
    State(settings): State<ShopSettings>,
) -> Result<HandlerOutcome, Failure> {
    if event.email.ends_with(".invalid") {
        return Ok(HandlerOutcome::dead_letter(
            "undeliverable_address",
            format_args!(
                "{} is under the .invalid domain, which never receives mail (order {})",
                event.email, event.order_id
            ),
        ));
    }
    let mut tx = pool.begin().await?;
    if !mark_processed(&mut tx, ctx).await? {
        tracing::info!(order = %event.order_id, "confirmation already sent: a redelivery, nothing to do");
        return Ok(HandlerOutcome::Ack);
    }
    // A real shop calls its mail provider here, with ctx.message_id() as the idempotency key
    // (a call made before the commit runs again if the process dies before it).
    sqlx::query(
        "INSERT INTO shop.outgoing_mail (message_id, order_id, to_address, subject)
         VALUES ($1, $2, $3, $4)",
    )
    .bind(ctx.message_id())
    .bind(event.order_id)
    .bind(&event.email)
    .bind(format!(
        "Your order at {} is confirmed ({}.{:02})",
        settings.shop_id,
        event.total_cents / 100,
        event.total_cents % 100
    ))
    .execute(&mut *tx)
    .await?;
    set_status(&mut tx, event.order_id, "confirmed", None).await?;
    tx.commit().await?;
    tracing::info!(order = %event.order_id, to = %event.email, "confirmation sent");
    Ok(HandlerOutcome::Ack)
}

/// Deletes carts nobody touched for `CART_TTL_SECS`. Every replica runs the scheduler, and each
/// fire time runs once among them; a fire time missed while no replica ran is skipped (the
/// next one does the same work).
#[scheduled(every = "5s", name = "shop.expire_stale_carts", catch_up = "none")]
async fn expire_stale_carts(
    _ctx: &Context,
    State(pool): State<PgPool>,
    State(settings): State<ShopSettings>,
) -> Result<(), sqlx::Error> {
    let expired =
        sqlx::query("DELETE FROM shop.carts WHERE updated_at < now() - make_interval(secs => $1)")
            .bind(settings.cart_ttl.as_secs_f64())
            .execute(&pool)
            .await?
            .rows_affected();
    if expired > 0 {
        tracing::info!(expired, "expired stale carts");
    }
    Ok(())
}

async fn set_status(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    order_id: Uuid,
    status: &str,
    detail: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE shop.orders SET status = $2, status_detail = $3, updated_at = now() WHERE id = $1",
    )
    .bind(order_id)
    .bind(status)
    .bind(detail)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
