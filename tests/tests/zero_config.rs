//! `hexeract::run` with no configuration but the SQLite file's place. In a test binary of its
//! own: `run` reads the process environment and runs every handler of the binary.

use std::time::Duration;

use hexeract::{handler, CancellationToken, Context, Message};

static HANDLED: tokio::sync::Notify = tokio::sync::Notify::const_new();

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.Hello")]
struct Hello {}

#[handler(message = "test.Hello")]
async fn receive(_message: Hello, _ctx: &Context) -> Result<(), String> {
    HANDLED.notify_one();
    Ok(())
}

#[tokio::test]
async fn run_delivers_what_publish_sent_through_an_sqlite_outbox() {
    let dir = std::env::temp_dir().join(format!("hexeract-zero-config-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("outbox.db");
    // Other suites export these for their own services; with them `run` would use PostgreSQL
    // or refuse to start. Only this test runs in this process, so changing it is safe.
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    std::env::set_var("HEXERACT_SQLITE_PATH", &path);
    std::env::set_var("WORKER_PORT", "0");

    hexeract::publish(&Hello {}).await.unwrap();
    assert!(path.exists(), "the SQLite file is created on first use");
    let cancel = CancellationToken::new();
    let task = tokio::spawn(hexeract::run(cancel.clone()));
    tokio::time::timeout(Duration::from_secs(20), HANDLED.notified())
        .await
        .expect("the handler ran");
    let store = hexeract::store::default_store().await.unwrap();
    hexeract::store::wait_until_drained(&*store, Duration::from_millis(10))
        .await
        .unwrap();
    cancel.cancel();
    task.await.unwrap().unwrap();
    assert!(store.dead_letters(10).await.unwrap().is_empty());
    drop(store);
    std::fs::remove_dir_all(&dir).ok();
}
