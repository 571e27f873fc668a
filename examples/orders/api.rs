//! The shop's HTTP API: carts, checkout and order status.
//!
//! Checkout is the point of the example: the order and its `OrderPlaced` message are written in
//! one PostgreSQL transaction, so either both exist or neither does. No message is lost when the
//! broker is down (it waits in the outbox), and none is sent for an order that rolled back.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use crate::shop::{OrderLine, OrderPlaced, SHOP_HEADER};

/// The shop this API takes orders for (`SHOP_ID`): its orders' messages carry it.
#[derive(Clone, Debug)]
pub(crate) struct ShopId(pub(crate) String);

/// Every route of the API, on `pool`, for the shop `shop`.
pub(crate) fn router(pool: PgPool, shop: ShopId) -> Router {
    Router::new()
        .route("/products", get(products))
        .route("/carts", post(create_cart))
        .route("/carts/{cart_id}", get(cart))
        .route("/carts/{cart_id}/items/{sku}", put(set_item))
        .route("/carts/{cart_id}/checkout", post(checkout))
        .route("/orders/{order_id}", get(order))
        .layer(axum::Extension(shop))
        .with_state(pool)
}

/// An answer other than success: a status and a sentence for the caller.
#[derive(Debug)]
pub(crate) enum ApiError {
    NotFound(String),
    Invalid(String),
    Internal(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, text) = match self {
            ApiError::NotFound(text) => (StatusCode::NOT_FOUND, text),
            ApiError::Invalid(text) => (StatusCode::UNPROCESSABLE_ENTITY, text),
            ApiError::Internal(text) => {
                // The cause goes to the log; the caller gets no internals.
                tracing::error!(error = %text, "request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error".to_owned(),
                )
            }
        };
        (status, Json(json!({ "error": text }))).into_response()
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> ApiError {
        ApiError::Internal(error.to_string())
    }
}

impl From<hexeract::outbox::EnqueueError> for ApiError {
    fn from(error: hexeract::outbox::EnqueueError) -> ApiError {
        ApiError::Internal(error.to_string())
    }
}

async fn products(State(pool): State<PgPool>) -> Result<Json<Value>, ApiError> {
    let rows: Vec<(String, String, i64, i32)> =
        sqlx::query_as("SELECT sku, name, price_cents, in_stock FROM shop.products ORDER BY sku")
            .fetch_all(&pool)
            .await?;
    Ok(Json(Value::Array(
        rows.into_iter()
            .map(|(sku, name, price_cents, in_stock)| {
                json!({ "sku": sku, "name": name, "price_cents": price_cents, "in_stock": in_stock })
            })
            .collect(),
    )))
}

async fn create_cart(State(pool): State<PgPool>) -> Result<(StatusCode, Json<Value>), ApiError> {
    let cart_id = Uuid::now_v7();
    sqlx::query("INSERT INTO shop.carts (id) VALUES ($1)")
        .bind(cart_id)
        .execute(&pool)
        .await?;
    Ok((StatusCode::CREATED, Json(json!({ "cart_id": cart_id }))))
}

async fn cart(
    State(pool): State<PgPool>,
    Path(cart_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let cart_id = id("cart", &cart_id)?;
    let found: Option<(chrono::DateTime<chrono::Utc>,)> =
        sqlx::query_as("SELECT updated_at FROM shop.carts WHERE id = $1")
            .bind(cart_id)
            .fetch_optional(&pool)
            .await?;
    let Some((updated_at,)) = found else {
        return Err(no_cart(cart_id));
    };
    let items = cart_lines(&pool, cart_id).await?;
    Ok(Json(json!({
        "cart_id": cart_id,
        "updated_at": updated_at,
        "items": items.iter().map(|(sku, quantity, price_cents)| {
            json!({ "sku": sku, "quantity": quantity, "price_cents": price_cents })
        }).collect::<Vec<_>>(),
    })))
}

#[derive(serde::Deserialize)]
struct SetItem {
    quantity: i32,
}

/// Sets how many of `sku` the cart holds (0 removes it) and keeps the cart alive.
async fn set_item(
    State(pool): State<PgPool>,
    Path((cart_id, sku)): Path<(String, String)>,
    Json(item): Json<SetItem>,
) -> Result<Json<Value>, ApiError> {
    let cart_id = id("cart", &cart_id)?;
    if !(0..=1000).contains(&item.quantity) {
        return Err(ApiError::Invalid(format!(
            "quantity {} is not between 0 and 1000",
            item.quantity
        )));
    }
    let mut tx = pool.begin().await?;
    let touched = sqlx::query("UPDATE shop.carts SET updated_at = now() WHERE id = $1")
        .bind(cart_id)
        .execute(&mut *tx)
        .await?;
    if touched.rows_affected() == 0 {
        return Err(no_cart(cart_id));
    }
    let known: Option<(String,)> = sqlx::query_as("SELECT sku FROM shop.products WHERE sku = $1")
        .bind(&sku)
        .fetch_optional(&mut *tx)
        .await?;
    if known.is_none() {
        return Err(ApiError::NotFound(format!(
            "no product has the sku {sku:?}"
        )));
    }
    if item.quantity == 0 {
        sqlx::query("DELETE FROM shop.cart_items WHERE cart_id = $1 AND sku = $2")
            .bind(cart_id)
            .bind(&sku)
            .execute(&mut *tx)
            .await?;
    } else {
        sqlx::query(
            "INSERT INTO shop.cart_items (cart_id, sku, quantity) VALUES ($1, $2, $3)
             ON CONFLICT (cart_id, sku) DO UPDATE SET quantity = EXCLUDED.quantity",
        )
        .bind(cart_id)
        .bind(&sku)
        .bind(item.quantity)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Json(
        json!({ "cart_id": cart_id, "sku": sku, "quantity": item.quantity }),
    ))
}

#[derive(serde::Deserialize)]
struct Checkout {
    email: String,
}

/// Turns the cart into an order and enqueues `OrderPlaced`, in one transaction.
async fn checkout(
    State(pool): State<PgPool>,
    axum::Extension(shop): axum::Extension<ShopId>,
    Path(cart_id): Path<String>,
    Json(checkout): Json<Checkout>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let cart_id = id("cart", &cart_id)?;
    let email = checkout.email.trim();
    if !email.contains('@') || email.len() > 320 {
        return Err(ApiError::Invalid(format!(
            "{email:?} is not an email address"
        )));
    }
    let mut tx = pool.begin().await?;
    // Locks the cart: of two checkouts of one cart, the second finds it gone.
    let found: Option<(Uuid,)> =
        sqlx::query_as("SELECT id FROM shop.carts WHERE id = $1 FOR UPDATE")
            .bind(cart_id)
            .fetch_optional(&mut *tx)
            .await?;
    if found.is_none() {
        return Err(no_cart(cart_id));
    }
    let lines = cart_lines(&mut *tx, cart_id).await?;
    if lines.is_empty() {
        return Err(ApiError::Invalid(format!("cart {cart_id} is empty")));
    }
    let total_cents: i64 = lines
        .iter()
        .map(|(_, quantity, price)| i64::from(*quantity) * price)
        .sum();
    let order_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO shop.orders (id, email, total_cents, status) VALUES ($1, $2, $3, 'placed')",
    )
    .bind(order_id)
    .bind(email)
    .bind(total_cents)
    .execute(&mut *tx)
    .await?;
    for (sku, quantity, price_cents) in &lines {
        sqlx::query(
            "INSERT INTO shop.order_lines (order_id, sku, quantity, price_cents)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(order_id)
        .bind(sku)
        .bind(quantity)
        .bind(price_cents)
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query("DELETE FROM shop.carts WHERE id = $1")
        .bind(cart_id)
        .execute(&mut *tx)
        .await?;
    let placed = OrderPlaced {
        order_id,
        email: email.to_owned(),
        total_cents,
        lines: lines
            .iter()
            .map(|(sku, quantity, _)| OrderLine {
                sku: sku.clone(),
                quantity: *quantity,
            })
            .collect(),
    };
    // The message says which shop it is for; the handlers' middleware checks it.
    let envelope = hexeract::Envelope::new(&placed)
        .map_err(|error| ApiError::Internal(error.to_string()))?
        .with_header(SHOP_HEADER, shop.0);
    let message_id = hexeract::outbox::enqueue_envelope(&mut tx, envelope).await?;
    tx.commit().await?;
    tracing::info!(order = %order_id, message_id = %message_id, total_cents, "order placed");
    Ok((
        StatusCode::CREATED,
        Json(json!({ "order_id": order_id, "status": "placed", "total_cents": total_cents })),
    ))
}

async fn order(
    State(pool): State<PgPool>,
    Path(order_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let order_id = id("order", &order_id)?;
    let found: Option<(String, i64, String, Option<String>)> = sqlx::query_as(
        "SELECT email, total_cents, status, status_detail FROM shop.orders WHERE id = $1",
    )
    .bind(order_id)
    .fetch_optional(&pool)
    .await?;
    let Some((email, total_cents, status, detail)) = found else {
        return Err(ApiError::NotFound(format!(
            "no order has the id {order_id}"
        )));
    };
    let lines: Vec<(String, i32, i64)> = sqlx::query_as(
        "SELECT sku, quantity, price_cents FROM shop.order_lines WHERE order_id = $1 ORDER BY sku",
    )
    .bind(order_id)
    .fetch_all(&pool)
    .await?;
    let mail: Vec<(String, String)> = sqlx::query_as(
        "SELECT to_address, subject FROM shop.outgoing_mail WHERE order_id = $1 ORDER BY sent_at",
    )
    .bind(order_id)
    .fetch_all(&pool)
    .await?;
    Ok(Json(json!({
        "order_id": order_id,
        "email": email,
        "total_cents": total_cents,
        "status": status,
        "status_detail": detail,
        "lines": lines.iter().map(|(sku, quantity, price_cents)| {
            json!({ "sku": sku, "quantity": quantity, "price_cents": price_cents })
        }).collect::<Vec<_>>(),
        "mail": mail.iter().map(|(to, subject)| json!({ "to": to, "subject": subject })).collect::<Vec<_>>(),
    })))
}

async fn cart_lines<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    cart_id: Uuid,
) -> Result<Vec<(String, i32, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT i.sku, i.quantity, p.price_cents
         FROM shop.cart_items i JOIN shop.products p USING (sku)
         WHERE i.cart_id = $1 ORDER BY i.sku",
    )
    .bind(cart_id)
    .fetch_all(executor)
    .await
}

/// An id from the path: no `what` has an id that is not a UUID.
fn id(what: &str, text: &str) -> Result<Uuid, ApiError> {
    text.parse()
        .map_err(|_| ApiError::NotFound(format!("no {what} has the id {text:?}")))
}

fn no_cart(cart_id: Uuid) -> ApiError {
    ApiError::NotFound(format!(
        "no cart has the id {cart_id} (carts expire after CART_TTL_SECS without a change)"
    ))
}
