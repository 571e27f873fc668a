//! The newsletter's HTTP endpoint: `POST /signups`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::news::SubscriberJoined;

pub(crate) fn router(pool: PgPool) -> Router {
    Router::new()
        .route("/signups", post(sign_up))
        .with_state(pool)
}

#[derive(serde::Deserialize)]
pub(crate) struct Signup {
    pub(crate) email: String,
}

/// Adds a subscriber and enqueues `SubscriberJoined`, in one transaction: both or neither.
pub(crate) async fn sign_up(
    State(pool): State<PgPool>,
    Json(signup): Json<Signup>,
) -> Result<(StatusCode, Json<Value>), Failed> {
    let email = signup.email.trim().to_lowercase();
    if !email.contains('@') {
        let error = json!({ "error": format!("{email:?} is not an email address") });
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, Json(error)));
    }
    let mut tx = pool.begin().await?;
    let inserted: Option<i64> = sqlx::query_scalar(
        "INSERT INTO news.subscribers (email) VALUES ($1)
         ON CONFLICT (email) DO NOTHING RETURNING id",
    )
    .bind(&email)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(subscriber_id) = inserted else {
        // Dropping `tx` rolls it back: nothing was written, nothing is enqueued.
        let error = json!({ "error": format!("{email} is already subscribed") });
        return Ok((StatusCode::CONFLICT, Json(error)));
    };
    let joined = SubscriberJoined {
        subscriber_id,
        email,
    };
    hexeract::outbox::enqueue(&mut tx, &joined).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(json!({ "id": subscriber_id }))))
}

/// A failure of the database: a 500, with the cause in the log, not in the answer.
#[derive(Debug)]
pub(crate) struct Failed(String);

impl IntoResponse for Failed {
    fn into_response(self) -> Response {
        tracing::error!(error = %self.0, "signup failed");
        let error = json!({ "error": "internal error" });
        (StatusCode::INTERNAL_SERVER_ERROR, Json(error)).into_response()
    }
}

impl From<sqlx::Error> for Failed {
    fn from(error: sqlx::Error) -> Failed {
        Failed(error.to_string())
    }
}

impl From<hexeract::outbox::EnqueueError> for Failed {
    fn from(error: hexeract::outbox::EnqueueError) -> Failed {
        Failed(error.to_string())
    }
}
