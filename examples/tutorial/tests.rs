//! The newsletter under the testing toolkit, each test on a PostgreSQL database of its own.
//!
//! Run with `cargo test --example tutorial` (PostgreSQL at `TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use hexeract::store::postgres::PgStore;
use hexeract::store::DeliveryStore;
use hexeract::testing::{Harness, TestDatabase};
use hexeract::{HandlerOutcome, Registry};
use sqlx::PgPool;

use crate::api::{sign_up, Signup};
use crate::db;
use crate::news::SubscriberJoined;

/// A database of the test's own, with the newsletter's tables and Hexeract's.
async fn database() -> TestDatabase {
    let url = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let database = TestDatabase::create(&url).await.expect("a test database");
    db::create_tables(database.pool()).await.expect("tables");
    PgStore::new(database.pool().clone(), "hexeract")
        .expect("schema name")
        .migrate()
        .await
        .expect("Hexeract's tables");
    database
}

/// A harness over one handler only, with the pool as its state.
fn harness_of(handler: &str, pool: &PgPool) -> Harness {
    let mut registry = Registry::from_inventory().expect("the handlers");
    registry.retain(|info| info.name == handler);
    Harness::with_registry(registry).state(pool.clone())
}

/// Empties what the handlers write, inbox marks included.
async fn reset(pool: &PgPool) {
    sqlx::query("TRUNCATE news.outgoing_mail, news.daily_signups, hexeract.inbox")
        .execute(pool)
        .await
        .expect("truncate");
}

fn ada() -> SubscriberJoined {
    SubscriberJoined {
        subscriber_id: 1,
        email: "ada@example.com".to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_welcome_mail_is_queued_once_under_every_fault() {
    let database = database().await;
    let pool = database.pool();
    let harness = harness_of("news.send_welcome", pool);
    let report = harness
        .fault_check(&ada())
        .expect("encode")
        .reset(|| reset(pool))
        .probe(|| async {
            let mail: Vec<String> = sqlx::query_scalar("SELECT to_address FROM news.outgoing_mail")
                .fetch_all(pool)
                .await
                .expect("mail");
            mail
        })
        .run()
        .await;
    assert_eq!(report.clean.probe, ["ada@example.com"]);
    report.assert_idempotent();
    database.drop_database().await.expect("drop");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signup_is_counted_once_under_every_fault() {
    let database = database().await;
    let pool = database.pool();
    let harness = harness_of("news.count_signup", pool);
    let report = harness
        .fault_check(&ada())
        .expect("encode")
        .reset(|| reset(pool))
        .probe(|| async {
            let signups: i64 = sqlx::query_scalar(
                "SELECT coalesce(sum(signups), 0)::bigint FROM news.daily_signups",
            )
            .fetch_one(pool)
            .await
            .expect("signups");
            signups
        })
        .run()
        .await;
    assert_eq!(report.clean.probe, 1);
    report.assert_idempotent();
    database.drop_database().await.expect("drop");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_purge_deletes_only_old_unconfirmed_subscribers() {
    let database = database().await;
    let pool = database.pool();
    sqlx::query(
        "INSERT INTO news.subscribers (email, joined_at, confirmed_at) VALUES
             ('old@example.com', now() - interval '8 days', NULL),
             ('confirmed@example.com', now() - interval '8 days', now() - interval '7 days'),
             ('new@example.com', now() - interval '1 day', NULL)",
    )
    .execute(pool)
    .await
    .expect("subscribers");
    let harness = Harness::new().expect("the handlers").state(pool.clone());
    let outcome = harness
        .run_job("news.purge_unconfirmed")
        .await
        .expect("the job");
    assert_eq!(outcome, HandlerOutcome::Ack);
    let left: Vec<String> = sqlx::query_scalar("SELECT email FROM news.subscribers ORDER BY email")
        .fetch_all(pool)
        .await
        .expect("subscribers");
    assert_eq!(left, ["confirmed@example.com", "new@example.com"]);
    database.drop_database().await.expect("drop");
}

/// What a signup leaves: the subscribers' emails and the outbox's message types.
async fn rows(pool: &PgPool) -> (Vec<String>, Vec<String>) {
    let subscribers = sqlx::query_scalar("SELECT email FROM news.subscribers ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("subscribers");
    let outbox = sqlx::query_scalar("SELECT message_type FROM hexeract.outbox ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("outbox");
    (subscribers, outbox)
}

async fn post_signup(pool: &PgPool, email: &str) -> StatusCode {
    let signup = Signup {
        email: email.to_owned(),
    };
    sign_up(State(pool.clone()), Json(signup))
        .await
        .into_response()
        .status()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signup_writes_the_subscriber_and_its_message_and_a_duplicate_writes_nothing() {
    let database = database().await;
    let pool = database.pool();

    assert_eq!(
        post_signup(pool, "ada@example.com").await,
        StatusCode::CREATED
    );
    let joined = (
        vec!["ada@example.com".to_owned()],
        vec!["news.SubscriberJoined".to_owned()],
    );
    assert_eq!(rows(pool).await, joined);

    assert_eq!(
        post_signup(pool, "Ada@Example.com").await,
        StatusCode::CONFLICT
    );
    assert_eq!(rows(pool).await, joined, "a duplicate enqueues nothing");
    database.drop_database().await.expect("drop");
}
