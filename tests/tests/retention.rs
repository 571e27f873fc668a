//! Retention: dead letters and inbox marks older than their retention are deleted, newer ones
//! kept, on PostgreSQL and SQLite.

use std::time::Duration;

use hexeract::outbox::OutboxWorker;
use hexeract::store::DeliveryStore;
use hexeract::store::Store;
use hexeract::store::{DeadLetterStore, Housekeeping};
use hexeract::{CancellationToken, Envelope, Registry};

/// Dead-letters one message (a type no handler knows, one delivery allowed).
async fn one_dead_letter(store: std::sync::Arc<dyn Store>) {
    store
        .publish(vec![Envelope::from_raw("retention.Nobody", &b"{}"[..])])
        .await
        .unwrap();
    let worker = OutboxWorker::builder_shared(store.clone())
        .registry(Registry::new())
        .max_deliveries(1)
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.dead_letters(10).await.unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "dead-lettered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_deletes_only_what_outlived_its_retention() {
    let schema = hexeract_tests::pg::TestSchema::new("hexeract-tests-retention").await;
    let store = std::sync::Arc::new(schema.migrated_store().await);
    one_dead_letter(store.clone()).await;
    let s = &schema.schema;
    sqlx::query(&format!(
        "INSERT INTO {s}.inbox (handler, message_id, processed_at)
         VALUES ('h', gen_random_uuid(), now() - interval '8 days'),
                ('h', gen_random_uuid(), now() - interval '1 day')"
    ))
    .execute(&schema.pool)
    .await
    .unwrap();
    let week = Duration::from_secs(7 * 86_400);
    let month = Duration::from_secs(30 * 86_400);
    assert_eq!(
        store.purge_dead_letters_before(month).await.unwrap(),
        0,
        "new"
    );
    sqlx::query(&format!(
        "UPDATE {s}.dead_letters SET dead_lettered_at = now() - interval '31 days'"
    ))
    .execute(&schema.pool)
    .await
    .unwrap();
    assert_eq!(store.purge_dead_letters_before(month).await.unwrap(), 1);
    assert!(store.dead_letters(10).await.unwrap().is_empty());
    assert_eq!(
        store.purge_inbox_before(week).await.unwrap(),
        1,
        "only the old mark"
    );
    assert_eq!(store.purge_inbox_before(week).await.unwrap(), 0);
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_deletes_only_what_outlived_its_retention() {
    let dir = std::env::temp_dir().join(format!("hexeract-retention-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = hexeract::store::sqlite::SqliteStore::open(dir.join("outbox.db"))
        .await
        .unwrap();
    sqlite.migrate().await.unwrap();
    let store = std::sync::Arc::new(sqlite.clone());
    one_dead_letter(store.clone()).await;
    let now = chrono::Utc::now().timestamp_millis();
    let day = 86_400_000_i64;
    for age in [8 * day, day] {
        sqlx::query(
            "INSERT INTO hexeract_inbox (handler, message_id, processed_at) VALUES ('h', ?1, ?2)",
        )
        .bind(uuid::Uuid::now_v7().hyphenated().to_string())
        .bind(now - age)
        .execute(sqlite.pool())
        .await
        .unwrap();
    }
    let week = Duration::from_secs(7 * 86_400);
    let month = Duration::from_secs(30 * 86_400);
    assert_eq!(
        store.purge_dead_letters_before(month).await.unwrap(),
        0,
        "new"
    );
    sqlx::query("UPDATE hexeract_dead_letters SET dead_lettered_at = ?1")
        .bind(now - 31 * day)
        .execute(sqlite.pool())
        .await
        .unwrap();
    assert_eq!(store.purge_dead_letters_before(month).await.unwrap(), 1);
    assert!(store.dead_letters(10).await.unwrap().is_empty());
    assert_eq!(
        store.purge_inbox_before(week).await.unwrap(),
        1,
        "only the old mark"
    );
    drop(store);
    drop(sqlite);
    let _ = std::fs::remove_dir_all(dir);
}
