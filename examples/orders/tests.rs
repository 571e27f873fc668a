//! The shop's handlers and its scheduled job under the testing toolkit: each handler, given an
//! order, leaves the same rows when the order's message comes twice, comes back after its
//! commit, or runs twice at once (the fault mode), on a PostgreSQL database of the test's own.
//!
//! Run with `cargo test --example orders` (PostgreSQL at `TEST_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use std::time::Duration;

use hexeract::store::postgres::PgStore;
use hexeract::store::DeliveryStore;
use hexeract::testing::{FaultReport, Harness, TestDatabase};
use hexeract::{Envelope, HandlerOutcome, Message};
use sqlx::PgPool;
use uuid::Uuid;

use crate::db;
use crate::shop::{OrderLine, OrderPlaced, RequireShop, ShopSettings, StockReserved, SHOP_HEADER};

const SHOP: &str = "test-shop";

/// A database of the test's own with the shop's tables and Hexeract's (the inbox, the outbox).
async fn shop_database() -> TestDatabase {
    let url = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let database = TestDatabase::create(&url).await.unwrap_or_else(|error| {
        panic!("cannot create a test database ({error}); start PostgreSQL or set TEST_DATABASE_URL")
    });
    db::migrate(database.pool())
        .await
        .expect("the shop's tables");
    PgStore::new(database.pool().clone(), "hexeract")
        .expect("schema name")
        .migrate()
        .await
        .expect("Hexeract's tables");
    database
}

fn harness(pool: &PgPool) -> Harness {
    Harness::new()
        .expect("the shop's handlers")
        .state(pool.clone())
        .state(ShopSettings {
            shop_id: SHOP.to_owned(),
            cart_ttl: Duration::from_secs(3600),
        })
        .middleware(RequireShop {
            shop_id: SHOP.to_owned(),
        })
}

/// `message` with this shop's header, as the API sends it.
fn for_this_shop<M: Message>(message: &M) -> Envelope {
    Envelope::new(message)
        .expect("encode")
        .with_header(SHOP_HEADER, SHOP)
}

/// Puts the order back as the checkout left it: placed, the catalogue stocked, nothing sent,
/// no inbox marks.
async fn reset(pool: &PgPool, order_id: Uuid) {
    let mut tx = pool.begin().await.expect("begin");
    for statement in [
        "TRUNCATE shop.outgoing_mail, shop.order_lines, shop.orders, hexeract.inbox, hexeract.outbox",
        "UPDATE shop.products SET in_stock = CASE sku WHEN 'mug' THEN 10 WHEN 'tshirt' THEN 3 ELSE 100 END",
    ] {
        sqlx::query(statement)
            .execute(&mut *tx)
            .await
            .expect("reset");
    }
    sqlx::query(
        "INSERT INTO shop.orders (id, email, total_cents, status) \
         VALUES ($1, 'ada@example.com', 4900, 'placed')",
    )
    .bind(order_id)
    .execute(&mut *tx)
    .await
    .expect("the order");
    tx.commit().await.expect("commit");
}

/// What the handlers change: the order's status, the stock, the follow-ups in the outbox, the
/// mail sent.
#[derive(Debug, PartialEq)]
struct Shop {
    status: String,
    stock: Vec<(String, i32)>,
    outbox: Vec<String>,
    mail: i64,
}

async fn read(pool: &PgPool, order_id: Uuid) -> Shop {
    let status = sqlx::query_scalar("SELECT status FROM shop.orders WHERE id = $1")
        .bind(order_id)
        .fetch_one(pool)
        .await
        .expect("status");
    let stock = sqlx::query_as("SELECT sku, in_stock FROM shop.products ORDER BY sku")
        .fetch_all(pool)
        .await
        .expect("stock");
    let outbox = sqlx::query_scalar("SELECT message_type FROM hexeract.outbox ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("outbox");
    let mail = sqlx::query_scalar("SELECT count(*) FROM shop.outgoing_mail")
        .fetch_one(pool)
        .await
        .expect("mail");
    Shop {
        status,
        stock,
        outbox,
        mail,
    }
}

/// The fault mode on `envelope`, each run starting from the order `order_id` as the checkout
/// left it, and reading the shop afterwards.
async fn fault_check(pool: &PgPool, order_id: Uuid, envelope: Envelope) -> FaultReport<Shop> {
    harness(pool)
        .fault_check_envelope(envelope)
        .reset(|| reset(pool, order_id))
        .probe(|| read(pool, order_id))
        .run()
        .await
}

fn stock_reserved(order_id: Uuid) -> StockReserved {
    StockReserved {
        order_id,
        email: "ada@example.com".to_owned(),
        total_cents: 4900,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reserving_stock_is_idempotent_under_every_fault() {
    let database = shop_database().await;
    let pool = database.pool();
    let order_id = Uuid::now_v7();
    let order = OrderPlaced {
        order_id,
        email: "ada@example.com".to_owned(),
        total_cents: 4900,
        lines: vec![
            OrderLine {
                sku: "mug".to_owned(),
                quantity: 2,
            },
            OrderLine {
                sku: "tshirt".to_owned(),
                quantity: 1,
            },
        ],
    };
    let report = fault_check(pool, order_id, for_this_shop(&order)).await;
    assert_eq!(
        report.clean.probe,
        Shop {
            status: "reserved".to_owned(),
            stock: vec![
                ("mug".to_owned(), 8),
                ("sticker".to_owned(), 100),
                ("tshirt".to_owned(), 2)
            ],
            outbox: vec!["shop.StockReserved".to_owned()],
            mail: 0,
        }
    );
    report.assert_idempotent();
    database.drop_database().await.expect("drop");
}

#[tokio::test(flavor = "multi_thread")]
async fn sending_the_confirmation_is_idempotent_under_every_fault() {
    let database = shop_database().await;
    let pool = database.pool();
    let order_id = Uuid::now_v7();
    let report = fault_check(pool, order_id, for_this_shop(&stock_reserved(order_id))).await;
    assert_eq!(report.clean.probe.status, "confirmed");
    assert_eq!(report.clean.probe.mail, 1);
    report.assert_idempotent();
    database.drop_database().await.expect("drop");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_of_another_shop_is_dead_lettered_every_time_and_changes_nothing() {
    let database = shop_database().await;
    let pool = database.pool();
    let order_id = Uuid::now_v7();
    let envelope = Envelope::new(&stock_reserved(order_id))
        .expect("encode")
        .with_header(SHOP_HEADER, "another-shop");
    let report = fault_check(pool, order_id, envelope).await;
    assert!(matches!(
        &report.clean.endings[0].outcome,
        HandlerOutcome::DeadLetter { reason, .. } if reason == "wrong_shop"
    ));
    assert_eq!(report.clean.probe.status, "placed");
    report.assert_idempotent();
    database.drop_database().await.expect("drop");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cart_expiry_job_deletes_only_stale_carts() {
    let database = shop_database().await;
    let pool = database.pool();
    sqlx::query(
        "INSERT INTO shop.carts (id, updated_at) VALUES \
         ($1, now() - interval '2 hours'), ($2, now())",
    )
    .bind(Uuid::now_v7())
    .bind(Uuid::now_v7())
    .execute(pool)
    .await
    .expect("carts");
    let outcome = harness(pool)
        .run_job("shop.expire_stale_carts")
        .await
        .expect("the job exists");
    assert_eq!(outcome, HandlerOutcome::Ack);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM shop.carts")
        .fetch_one(pool)
        .await
        .expect("count");
    assert_eq!(left, 1, "the stale cart is gone, the fresh one stays");
    database.drop_database().await.expect("drop");
}
