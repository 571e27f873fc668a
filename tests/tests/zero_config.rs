//! `hexeract::run` with no configuration. In a test binary of its own: `run` reads the process
//! environment and runs every handler of the binary on the process's default store.

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
async fn run_delivers_what_publish_sent_even_before_it_started() {
    // Other suites export these for their own services; `run` would refuse them.
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    hexeract::publish(&Hello {}).await.unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(hexeract::run(cancel.clone()));
    tokio::time::timeout(Duration::from_secs(20), HANDLED.notified())
        .await
        .expect("the handler ran");
    cancel.cancel();
    task.await.unwrap().unwrap();
    assert!(hexeract::InMemoryStore::global().is_idle());
}
