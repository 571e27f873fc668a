//! The inbox on PostgreSQL and SQLite: `outbox::inbox::mark_processed` records a (handler,
//! message) pair in the caller's transaction, says whether it is the first time, and leaves
//! nothing behind when that transaction rolls back; `purge_inbox_older_than` removes old marks
//! only.
//!
//! PostgreSQL at `TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`), each
//! test in a schema of its own, dropped at the end; SQLite in a file in a directory of its own
//! under the system's temp directory, removed at the end. Tests run in parallel.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hexeract::outbox::inbox::{mark_processed, mark_processed_in};
use hexeract::store::postgres::PgStore;
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::{DeliveryStore, StoreError};
use hexeract::testing::Harness;
use hexeract::{CancellationToken, Context, Envelope, Message, Publish, PublishError};
use hexeract_tests::pg::TestSchema;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.PaymentReceived")]
struct PaymentReceived {
    order_id: u32,
}

/// Publishes nothing: these tests only need a context's ids.
struct NoPublish;

impl Publish for NoPublish {
    fn publish_envelope(
        &self,
        _envelope: Envelope,
    ) -> Pin<Box<dyn Future<Output = Result<Uuid, PublishError>> + Send + '_>> {
        Box::pin(async { Err(PublishError::Store("publishing is off in this test".into())) })
    }
}

/// The context `handler` would get for `envelope`.
fn context(envelope: &Envelope, handler: &str) -> Context {
    Context::new(
        envelope.clone(),
        handler,
        CancellationToken::new(),
        Arc::new(NoPublish),
    )
}

fn payment(order_id: u32) -> Envelope {
    Envelope::new(&PaymentReceived { order_id }).unwrap()
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------------------

/// A pool on the test database and a fresh, migrated schema; `drop_schema` removes it.
struct PgDb {
    db: TestSchema,
    store: PgStore,
}

impl std::ops::Deref for PgDb {
    type Target = TestSchema;

    fn deref(&self) -> &TestSchema {
        &self.db
    }
}

impl PgDb {
    async fn new() -> PgDb {
        let db = TestSchema::new("hexeract-tests").await;
        let store = db.migrated_store().await;
        PgDb { db, store }
    }

    async fn marks(&self) -> i64 {
        self.count("inbox").await
    }

    /// One transaction that only marks: what a handler's first statement does.
    async fn mark(&self, ctx: &Context) -> bool {
        let mut tx = self.pool.begin().await.unwrap();
        let first = mark_processed_in(&mut tx, &self.schema, ctx).await.unwrap();
        tx.commit().await.unwrap();
        first
    }

    async fn drop_schema(self) {
        self.db.drop_schema().await;
    }
}

#[tokio::test]
async fn pg_the_first_mark_is_true_and_a_later_one_false() {
    let db = PgDb::new().await;
    let ctx = Harness::new()
        .unwrap()
        .context_for(&PaymentReceived { order_id: 1 })
        .unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    assert!(mark_processed_in(&mut tx, &db.schema, &ctx).await.unwrap());
    assert_eq!(db.marks().await, 0, "not visible before commit");
    tx.commit().await.unwrap();
    assert_eq!(db.marks().await, 1);

    let mut tx = db.pool.begin().await.unwrap();
    assert!(
        !mark_processed_in(&mut tx, &db.schema, &ctx).await.unwrap(),
        "a redelivery finds the mark"
    );
    tx.commit().await.unwrap();
    assert_eq!(db.marks().await, 1);

    let (handler, message_id): (String, Uuid) = sqlx::query_as(&format!(
        "SELECT handler, message_id FROM \"{}\".inbox",
        db.schema
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (handler.as_str(), message_id),
        (ctx.handler_name(), ctx.message_id())
    );
    db.drop_schema().await;
}

/// The pattern of the module docs: mark, do the work, commit. `fail` makes the work fail
/// after the mark, as a failed side effect would.
async fn pg_handle(db: &PgDb, ctx: &Context, fail: bool) -> Result<(), StoreError> {
    let mut tx = db.pool.begin().await?;
    if !mark_processed_in(&mut tx, &db.schema, ctx).await? {
        return Ok(());
    }
    sqlx::query(&format!(
        "INSERT INTO \"{}\".revenue (message_id) VALUES ($1)",
        db.schema
    ))
    .bind(ctx.message_id())
    .execute(&mut *tx)
    .await?;
    if fail {
        // Dropping the transaction rolls it back, mark included.
        return Err(StoreError::Corrupt {
            id: ctx.message_id().to_string(),
            problem: "the side effect failed".into(),
        });
    }
    tx.commit().await?;
    Ok(())
}

#[tokio::test]
async fn pg_a_rolled_back_mark_lets_the_retry_run_again() {
    let db = PgDb::new().await;
    sqlx::query(&format!(
        "CREATE TABLE \"{}\".revenue (message_id uuid NOT NULL)",
        db.schema
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let ctx = context(&payment(2), "billing.record_revenue");

    let mut tx = db.pool.begin().await.unwrap();
    assert!(mark_processed_in(&mut tx, &db.schema, &ctx).await.unwrap());
    tx.rollback().await.unwrap();
    assert_eq!(db.marks().await, 0, "a rollback leaves no mark");

    assert!(pg_handle(&db, &ctx, true).await.is_err());
    assert_eq!(db.marks().await, 0, "a failed call leaves no mark");
    pg_handle(&db, &ctx, false).await.unwrap();
    pg_handle(&db, &ctx, false).await.unwrap();
    pg_handle(&db, &ctx, false).await.unwrap();
    let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM \"{}\".revenue", db.schema))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        rows, 1,
        "the retry ran the work once, the redeliveries not at all"
    );
    assert_eq!(db.marks().await, 1);
    db.drop_schema().await;
}

#[tokio::test]
async fn pg_handlers_mark_the_same_message_independently() {
    let db = PgDb::new().await;
    let envelope = payment(3);
    let billing = context(&envelope, "billing");
    let shipping = context(&envelope, "shipping");

    assert!(db.mark(&billing).await);
    assert!(
        db.mark(&shipping).await,
        "another handler's mark is not ours"
    );
    assert!(!db.mark(&billing).await);
    assert!(!db.mark(&shipping).await);
    assert!(
        db.mark(&context(&payment(3), "billing")).await,
        "another message, even with an equal payload, is new"
    );
    assert_eq!(db.marks().await, 3);
    db.drop_schema().await;
}

#[tokio::test]
async fn pg_a_concurrent_duplicate_waits_for_the_first_transaction() {
    let db = PgDb::new().await;
    let ctx = context(&payment(4), "billing");

    for commit in [false, true] {
        let mut first = db.pool.begin().await.unwrap();
        assert!(mark_processed_in(&mut first, &db.schema, &ctx)
            .await
            .unwrap());
        let second = {
            let (pool, schema, ctx) = (db.pool.clone(), db.schema.clone(), ctx.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let marked = mark_processed_in(&mut tx, &schema, &ctx).await.unwrap();
                tx.commit().await.unwrap();
                marked
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "the duplicate waits on the row");
        if commit {
            first.commit().await.unwrap();
            assert!(!second.await.unwrap(), "the first committed: already done");
        } else {
            first.rollback().await.unwrap();
            assert!(
                second.await.unwrap(),
                "the first rolled back: the duplicate runs"
            );
            // Leave the table empty again for the committing round.
            sqlx::query(&format!("DELETE FROM \"{}\".inbox", db.schema))
                .execute(&db.pool)
                .await
                .unwrap();
        }
    }
    assert_eq!(db.marks().await, 1);
    db.drop_schema().await;
}

#[tokio::test]
async fn pg_purge_removes_old_marks_only() {
    let db = PgDb::new().await;
    let old = context(&payment(5), "billing");
    let fresh = context(&payment(6), "billing");
    assert!(db.mark(&old).await);
    assert!(db.mark(&fresh).await);
    sqlx::query(&format!(
        "UPDATE \"{}\".inbox SET processed_at = now() - interval '2 hours' WHERE message_id = $1",
        db.schema
    ))
    .bind(old.message_id())
    .execute(&db.pool)
    .await
    .unwrap();

    assert_eq!(
        db.store
            .purge_inbox_older_than(Duration::from_secs(3 * 3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        db.store
            .purge_inbox_older_than(Duration::from_secs(3600))
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.marks().await, 1);
    assert!(!db.mark(&fresh).await, "the fresh mark stays");
    assert!(db.mark(&old).await, "a purged mark is gone");
    assert_eq!(
        db.store
            .purge_inbox_older_than(Duration::MAX)
            .await
            .unwrap(),
        0,
        "an age beyond any mark purges nothing"
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn pg_a_bad_namespace_is_refused() {
    let db = PgDb::new().await;
    let ctx = context(&payment(7), "billing");
    let mut tx = db.pool.begin().await.unwrap();
    let refused = mark_processed_in(&mut tx, "no;such schema", &ctx).await;
    assert!(
        matches!(refused, Err(StoreError::Identifier(_))),
        "{refused:?}"
    );
    tx.rollback().await.unwrap();
    db.drop_schema().await;
}

// ---------------------------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------------------------

/// A fresh directory with a migrated store in it (default prefix); removed on drop.
struct SqliteDb {
    dir: PathBuf,
    store: SqliteStore,
}

impl SqliteDb {
    async fn new() -> SqliteDb {
        let dir = std::env::temp_dir().join(format!("hexeract-inbox-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("create the test directory");
        let store = SqliteStore::open(dir.join("inbox.db"))
            .await
            .expect("open the database file");
        store.migrate().await.expect("migrate");
        SqliteDb { dir, store }
    }

    async fn marks(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM \"hexeract_inbox\"")
            .fetch_one(self.store.pool())
            .await
            .unwrap()
    }

    /// One transaction that only marks, in the default namespace.
    async fn mark(&self, ctx: &Context) -> bool {
        let mut tx = self.store.pool().begin().await.unwrap();
        let first = mark_processed(&mut tx, ctx).await.unwrap();
        tx.commit().await.unwrap();
        first
    }

    /// Closes the pool so that the files are released before the directory goes.
    async fn finish(self) {
        self.store.pool().close().await;
    }
}

impl Drop for SqliteDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn sqlite_the_first_mark_is_true_and_a_later_one_false() {
    let db = SqliteDb::new().await;
    let ctx = Harness::new()
        .unwrap()
        .context_for(&PaymentReceived { order_id: 1 })
        .unwrap();

    let mut tx = db.store.pool().begin().await.unwrap();
    assert!(mark_processed(&mut tx, &ctx).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(db.marks().await, 1);

    let mut tx = db.store.pool().begin().await.unwrap();
    assert!(
        !mark_processed(&mut tx, &ctx).await.unwrap(),
        "a redelivery finds the mark"
    );
    tx.commit().await.unwrap();
    assert_eq!(db.marks().await, 1);

    let (handler, message_id, processed_at): (String, String, i64) =
        sqlx::query_as("SELECT handler, message_id, processed_at FROM \"hexeract_inbox\"")
            .fetch_one(db.store.pool())
            .await
            .unwrap();
    assert_eq!(handler, ctx.handler_name());
    assert_eq!(message_id, ctx.message_id().hyphenated().to_string());
    let now = chrono::Utc::now().timestamp_millis();
    assert!(
        (now - 60_000..=now).contains(&processed_at),
        "processed_at is milliseconds since the epoch: {processed_at}"
    );
    db.finish().await;
}

/// The pattern of the module docs on SQLite; `fail` makes the work fail after the mark.
async fn sqlite_handle(store: &SqliteStore, ctx: &Context, fail: bool) -> Result<(), StoreError> {
    let mut tx = store.pool().begin().await?;
    if !mark_processed(&mut tx, ctx).await? {
        return Ok(());
    }
    sqlx::query("INSERT INTO revenue (message_id) VALUES (?1)")
        .bind(ctx.message_id().hyphenated().to_string())
        .execute(&mut *tx)
        .await?;
    if fail {
        return Err(StoreError::Corrupt {
            id: ctx.message_id().to_string(),
            problem: "the side effect failed".into(),
        });
    }
    tx.commit().await?;
    Ok(())
}

#[tokio::test]
async fn sqlite_a_rolled_back_mark_lets_the_retry_run_again() {
    let db = SqliteDb::new().await;
    sqlx::query("CREATE TABLE revenue (message_id TEXT NOT NULL) STRICT")
        .execute(db.store.pool())
        .await
        .unwrap();
    let ctx = context(&payment(2), "billing.record_revenue");

    let mut tx = db.store.pool().begin().await.unwrap();
    assert!(mark_processed(&mut tx, &ctx).await.unwrap());
    tx.rollback().await.unwrap();
    assert_eq!(db.marks().await, 0, "a rollback leaves no mark");

    assert!(sqlite_handle(&db.store, &ctx, true).await.is_err());
    assert_eq!(db.marks().await, 0, "a failed call leaves no mark");
    sqlite_handle(&db.store, &ctx, false).await.unwrap();
    sqlite_handle(&db.store, &ctx, false).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM revenue")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(
        rows, 1,
        "the retry ran the work once, the redelivery not at all"
    );
    assert_eq!(db.marks().await, 1);
    db.finish().await;
}

#[tokio::test]
async fn sqlite_handlers_mark_the_same_message_independently() {
    let db = SqliteDb::new().await;
    let envelope = payment(3);
    let billing = context(&envelope, "billing");
    let shipping = context(&envelope, "shipping");

    assert!(db.mark(&billing).await);
    assert!(
        db.mark(&shipping).await,
        "another handler's mark is not ours"
    );
    assert!(!db.mark(&billing).await);
    assert!(!db.mark(&shipping).await);
    assert_eq!(db.marks().await, 2);
    db.finish().await;
}

#[tokio::test]
async fn sqlite_purge_removes_old_marks_only() {
    let db = SqliteDb::new().await;
    let old = context(&payment(5), "billing");
    let fresh = context(&payment(6), "billing");
    assert!(db.mark(&old).await);
    assert!(db.mark(&fresh).await);
    sqlx::query(
        "UPDATE \"hexeract_inbox\" SET processed_at = processed_at - 7200000 \
         WHERE message_id = ?1",
    )
    .bind(old.message_id().hyphenated().to_string())
    .execute(db.store.pool())
    .await
    .unwrap();

    assert_eq!(
        db.store
            .purge_inbox_older_than(Duration::from_secs(3 * 3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        db.store
            .purge_inbox_older_than(Duration::from_secs(3600))
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.marks().await, 1);
    assert!(!db.mark(&fresh).await, "the fresh mark stays");
    assert!(db.mark(&old).await, "a purged mark is gone");
    assert_eq!(
        db.store
            .purge_inbox_older_than(Duration::MAX)
            .await
            .unwrap(),
        0,
        "an age beyond any mark purges nothing"
    );
    db.finish().await;
}

#[tokio::test]
async fn sqlite_a_namespace_is_a_table_prefix() {
    let db = SqliteDb::new().await;
    let other = SqliteStore::new(db.store.pool().clone(), "tenant_a").unwrap();
    other.migrate().await.unwrap();
    let ctx = context(&payment(8), "billing");

    let mut tx = db.store.pool().begin().await.unwrap();
    assert!(mark_processed_in(&mut tx, "tenant_a", &ctx).await.unwrap());
    assert!(!mark_processed_in(&mut tx, "tenant_a", &ctx).await.unwrap());
    tx.commit().await.unwrap();
    let in_prefix: i64 = sqlx::query_scalar("SELECT count(*) FROM \"tenant_a_inbox\"")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(in_prefix, 1);
    assert_eq!(db.marks().await, 0, "the default inbox is another table");
    assert!(db.mark(&ctx).await);
    db.finish().await;
}
