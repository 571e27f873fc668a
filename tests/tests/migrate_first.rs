//! An application that writes to the outbox in its own transaction before Hexeract's tables
//! exist gets an error that says to migrate first (not "relation does not exist"), and
//! `App::migrate` creates the tables before anything runs.

use hexeract::config::Database;
use hexeract::outbox::{enqueue, enqueue_envelopes, EnqueueError};
use hexeract::store::StoreError;
use hexeract::{App, AppConfig, Envelope, Message};
use hexeract_tests::pg::TestSchema;
use hexeract_tests::temp::TempDir;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "migrate.CartCheckedOut")]
struct CartCheckedOut {
    cart: u32,
}

fn assert_not_migrated(error: &EnqueueError, namespace: &str) {
    match error {
        EnqueueError::Store(StoreError::NotMigrated {
            namespace: named, ..
        }) => assert_eq!(named, namespace),
        other => panic!("expected NotMigrated, got {other:?}"),
    }
    let text = error.to_string();
    assert!(
        text.starts_with(&format!("Hexeract's tables are not in {namespace:?} yet")),
        "{text}"
    );
    assert!(text.contains("hexeract::migrate().await"), "{text}");
    assert!(
        std::error::Error::source(error)
            .and_then(std::error::Error::source)
            .is_some(),
        "the database's own error is kept as the source: {text}"
    );
}

#[tokio::test]
async fn on_postgres_an_enqueue_before_the_tables_exist_says_to_migrate_and_works_after() {
    let schema = TestSchema::new("migrate_first").await;
    let envelope = Envelope::new(&CartCheckedOut { cart: 1 }).unwrap();

    let mut tx = schema.pool.begin().await.unwrap();
    let error = enqueue_envelopes(&mut tx, &schema.schema, std::slice::from_ref(&envelope))
        .await
        .unwrap_err();
    assert_not_migrated(&error, &schema.schema);
    drop(tx);

    let store = schema.migrated_store().await;
    let mut tx = schema.pool.begin().await.unwrap();
    enqueue_envelopes(&mut tx, &schema.schema, &[envelope])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(schema.count("outbox").await, 1);
    drop(store);
    schema.drop_schema().await;
}

#[tokio::test]
async fn on_sqlite_app_migrate_creates_the_tables_an_enqueue_needs() {
    let dir = TempDir::new("migrate_first");
    let path = dir.join("app.db");
    let pool = SqlitePoolOptions::new()
        .connect_with(
            SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true),
        )
        .await
        .unwrap();

    let mut tx = pool.begin().await.unwrap();
    let error = enqueue(&mut tx, &CartCheckedOut { cart: 2 })
        .await
        .unwrap_err();
    assert_not_migrated(&error, "hexeract");
    drop(tx);

    let app = App::new(AppConfig {
        database: Database::Sqlite(path.clone()),
        ..AppConfig::default()
    });
    app.migrate().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    enqueue(&mut tx, &CartCheckedOut { cart: 2 }).await.unwrap();
    tx.commit().await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM hexeract_outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}
