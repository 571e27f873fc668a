//! Passwords in connection URLs never reach a log line or an error, even at TRACE, while
//! connections fail: PostgreSQL and RabbitMQ unreachable, RabbitMQ refusing the credentials,
//! and `hexeract::run` retrying a broker that is down.

use std::time::Duration;

use hexeract::CancellationToken;

const SECRET: &str = "pw-s3cret-4711";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_in_logs_or_errors_when_connections_fail() {
    let logs = hexeract_tests::logs::Captured::install("trace");
    let mut errors = Vec::new();

    // Nothing listens on port 1.
    let pg = format!("postgres://app:{SECRET}@127.0.0.1:1/app");
    errors.push(
        hexeract::store::postgres::PgStore::connect(&pg)
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string(),
    );
    let amqp = format!("amqp://app:{SECRET}@127.0.0.1:1/%2f");
    errors.push(
        hexeract::rabbitmq::RabbitMqConnection::connect(&amqp)
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string(),
    );
    // The real broker, with a password it refuses.
    let refused =
        hexeract_tests::amqp::amqp_url().replacen("guest:guest", &format!("guest:{SECRET}"), 1);
    assert!(
        refused.contains(SECRET),
        "TEST_AMQP_URL has guest:guest credentials"
    );
    errors.push(
        hexeract::rabbitmq::RabbitMqConnection::connect(&refused)
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string(),
    );
    // `run` retrying a broker that is down: its supervisor logs every attempt.
    let dir = std::env::temp_dir().join(format!("hexeract-secrets-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::remove_var("DATABASE_URL");
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("AMQP_URL", &amqp);
    std::env::set_var("WORKER_PORT", "0");
    let cancel = CancellationToken::new();
    let running = tokio::spawn(hexeract::run(cancel.clone()));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("run returns after cancel")
        .unwrap()
        .unwrap();
    // And `run` refusing a bad URL outright.
    std::env::set_var("AMQP_URL", format!("http://app:{SECRET}@broker"));
    errors.push(
        hexeract::run(CancellationToken::new())
            .await
            .unwrap_err()
            .to_string(),
    );

    let logs = logs.text();
    assert!(
        logs.contains("cannot reach RabbitMQ"),
        "the supervisor's retries were logged (the capture works):\n{logs}"
    );
    assert!(logs.contains("***"), "URLs show redacted");
    for error in &errors {
        assert!(!error.contains(SECRET), "a password in an error: {error}");
    }
    if let Some(line) = logs.lines().find(|line| line.contains(SECRET)) {
        panic!("a password in a log line: {line}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
