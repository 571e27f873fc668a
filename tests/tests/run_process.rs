//! `hexeract::run` as a process (`run_child`), configured by the environment alone: SIGTERM
//! while a handler sleeps lets the handler finish, acks its message and exits 0; bad variables
//! stop it before anything starts, with a non-zero exit and every bad variable named.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use hexeract::store::sqlite::SqliteStore;
use hexeract::store::DeadLetterStore;
use hexeract::store::DeliveryStore;
use hexeract::{Envelope, Message};

/// The child's message (the same wire type).
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "run.Nap")]
struct Nap {
    n: u32,
    nap_ms: u64,
}

fn child() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_run_child"));
    // The suite's own services must not leak into the child's configuration.
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS", "RUST_LOG"] {
        command.env_remove(variable);
    }
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_a_handler_sleeps_lets_it_finish_acks_its_message_and_exits_0() {
    let dir = std::env::temp_dir().join(format!("hexeract-run-child-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("outbox.db");
    let port = hexeract_tests::http::free_port();
    let mut running = child()
        .env("HEXERACT_SQLITE_PATH", &path)
        .env("WORKER_PORT", port.to_string())
        .env("RELAY_POLL_INTERVAL_MS", "50")
        .env("CONSUMER_POLL_INTERVAL_MS", "50")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start run_child");
    let (lines, mut said) = tokio::sync::mpsc::unbounded_channel();
    let stdout = running.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    hexeract_tests::http::wait_for_status(port, "/health/ready", 200, Duration::from_secs(30))
        .await;

    // The child migrated the file; publish into it from here, as another process would.
    let store = SqliteStore::open(&path).await.unwrap();
    store
        .publish(vec![Envelope::new(&Nap {
            n: 1,
            nap_ms: 2_000,
        })
        .unwrap()])
        .await
        .unwrap();
    let started = tokio::time::timeout(Duration::from_secs(10), said.recv())
        .await
        .expect("the handler started within 10 s");
    assert_eq!(started.as_deref(), Some("started 1"));

    let status = Command::new("kill")
        .args(["-TERM", &running.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = tokio::task::spawn_blocking(move || running.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exited.success(), "exit status {exited}");
    // Everything it said until its standard output closed.
    let mut rest = Vec::new();
    while let Some(line) = said.recv().await {
        rest.push(line);
    }
    assert_eq!(
        rest,
        ["finished 1", "stopped"],
        "the handler finished before run returned"
    );
    assert_eq!(store.backlog().await.unwrap(), 0, "its message was acked");
    assert!(store.dead_letters(10).await.unwrap().is_empty());
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_variables_stop_the_process_before_anything_starts_naming_each() {
    let dir = std::env::temp_dir().join(format!("hexeract-run-child-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = child()
        .env("HEXERACT_SQLITE_PATH", dir.join("outbox.db"))
        .env("WORKER_PORT", "http")
        .env("MAX_DELIVERIES", "0")
        .output()
        .expect("run run_child");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("WORKER_PORT = \"http\": a whole number from 0 to 65535"),
        "{stderr}"
    );
    assert!(
        stderr.contains("MAX_DELIVERIES = \"0\": a whole number from 1 to 1000"),
        "{stderr}"
    );
    assert!(
        !dir.join("outbox.db").exists(),
        "nothing started: no store was opened"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn under_kafka_a_handler_whose_message_has_no_aggregate_stops_startup_naming_it() {
    let dir = std::env::temp_dir().join(format!("hexeract-run-child-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = child()
        .env("HEXERACT_SQLITE_PATH", dir.join("outbox.db"))
        .env("WORKER_PORT", "0")
        // Nothing listens there: the check comes before any connection.
        .env("KAFKA_BROKERS", "127.0.0.1:1")
        .env("KAFKA_TOPIC_PREFIX", "shop")
        .output()
        .expect("run run_child");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "handler `sleepy` handles `run.Nap`, which declares no aggregate: with Kafka every \
             message needs one"
        ),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Unset, `KAFKA_TOPIC_PREFIX` is the executable's name (issue 18); set empty, or beside
/// `AMQP_URL`, Kafka stops startup with one error naming both problems.
#[test]
fn kafka_beside_amqp_and_an_empty_topic_prefix_stop_startup() {
    let dir = std::env::temp_dir().join(format!("hexeract-run-child-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = child()
        .env("HEXERACT_SQLITE_PATH", dir.join("outbox.db"))
        .env("KAFKA_BROKERS", "localhost:9092")
        .env("KAFKA_TOPIC_PREFIX", "")
        .env("AMQP_URL", "amqp://localhost")
        .output()
        .expect("run run_child");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("KAFKA_TOPIC_PREFIX = \"\": not empty: the prefix of every topic"),
        "{stderr}"
    );
    assert!(stderr.contains("not both"), "{stderr}");
    assert!(!dir.join("outbox.db").exists(), "nothing started");
    // HEXERACT_TRANSPORT=kafka beside AMQP_URL: named as the conflict it is.
    let output = child()
        .env("HEXERACT_SQLITE_PATH", dir.join("outbox.db"))
        .env("HEXERACT_TRANSPORT", "kafka")
        .env("AMQP_URL", "amqp://localhost")
        .output()
        .expect("run run_child");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("HEXERACT_TRANSPORT = \"kafka\": a transport the other settings agree with: AMQP_URL is set too"),
        "{stderr}"
    );
    assert!(!dir.join("outbox.db").exists(), "nothing started");
    let _ = std::fs::remove_dir_all(&dir);
}
