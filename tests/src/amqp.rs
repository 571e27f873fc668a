//! RabbitMQ for the integration tests: a connection to the broker at `TEST_AMQP_URL`, and names
//! of a test's own (prefix and exchange), removed at the end, so tests run in parallel.

use std::time::Duration;

use hexeract::rabbitmq::{RabbitMqConnection, Topology};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use uuid::Uuid;

/// The broker the tests use unless `TEST_AMQP_URL` says otherwise.
pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// `TEST_AMQP_URL`, or [`DEFAULT_URL`].
pub fn amqp_url() -> String {
    std::env::var("TEST_AMQP_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A connection named `name`, or a failure naming `TEST_AMQP_URL`.
pub async fn connect(name: &str) -> RabbitMqConnection {
    RabbitMqConnection::connect_named(&amqp_url(), name)
        .await
        .unwrap_or_else(|error| {
            panic!(
                "cannot reach RabbitMQ ({error}); start it (rabbitmq-server -detached), or set \
                 TEST_AMQP_URL to a broker these tests may declare queues on"
            )
        })
}

/// A test's own names on the broker: an exchange and a queue prefix no other test uses.
#[derive(Debug)]
pub struct TestBroker {
    /// A connection for the test's own publishing and inspection.
    pub connection: RabbitMqConnection,
    /// Prefix of every queue name: `t<uuid>`.
    pub prefix: String,
    /// The test's message exchange: `<prefix>.x`.
    pub exchange: String,
}

impl TestBroker {
    /// Fresh names and a connection called `hexeract-tests-<prefix>`.
    pub async fn new() -> TestBroker {
        let prefix = format!("t{}", Uuid::now_v7().simple());
        let connection = connect(&format!("hexeract-tests-{prefix}")).await;
        TestBroker {
            connection,
            exchange: format!("{prefix}.x"),
            prefix,
        }
    }

    /// Another connection to the broker, named `name` (a worker's, to close by name).
    pub async fn connect(&self, name: &str) -> RabbitMqConnection {
        connect(name).await
    }

    /// Publishes raw bytes with `properties` to the test's exchange, waiting for the confirm:
    /// what a producer not written with Hexeract does.
    pub async fn publish_raw(
        &self,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) {
        self.publish_to(&self.exchange, routing_key, payload, properties)
            .await;
    }

    /// Publishes raw bytes to `exchange` (`""`: straight into the queue `routing_key`).
    pub async fn publish_to(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) {
        let channel = self.connection.lapin().create_channel().await.unwrap();
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .unwrap();
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions::default(),
                payload,
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack(), "the broker confirmed the publish");
        let _ = channel.close(200, "done".into()).await;
    }

    /// Takes every message from `queue` (without waiting for more).
    pub async fn drain(&self, queue: &str) -> Vec<lapin::message::BasicGetMessage> {
        let channel = self.connection.lapin().create_channel().await.unwrap();
        let mut messages = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            messages.push(message);
        }
        let _ = channel.close(200, "done".into()).await;
        messages
    }

    /// Waits until `queue` holds at least `count` messages (up to `limit`), then takes them. A
    /// queue that does not exist yet (a worker is about to declare it) counts as empty.
    pub async fn wait_for(
        &self,
        queue: &str,
        count: usize,
        limit: Duration,
    ) -> Vec<lapin::message::BasicGetMessage> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut messages = Vec::new();
        loop {
            if self.inspect(queue).await.is_some() {
                messages.extend(self.drain(queue).await);
            }
            if messages.len() >= count {
                return messages;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} got {} of {count} messages within {limit:?}",
                messages.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `queue` reports `count` messages ready (a quorum queue's count can trail
    /// its publishers' confirms by a moment), for up to 10 s.
    pub async fn wait_until_ready(&self, queue: &str, count: u32) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let ready = self.ready(queue).await;
            if ready == count {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} reports {ready} messages ready, not {count}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many messages `queue` holds, ready (not counting unacked ones).
    pub async fn ready(&self, queue: &str) -> u32 {
        self.inspect(queue)
            .await
            .unwrap_or_else(|| panic!("queue {queue} does not exist"))
            .message_count()
    }

    /// How many consumers `queue` has; `None` when it does not exist.
    pub async fn consumers(&self, queue: &str) -> Option<u32> {
        Some(self.inspect(queue).await?.consumer_count())
    }

    /// A passive declare of `queue`, on a channel of its own (a failed one closes it).
    async fn inspect(&self, queue: &str) -> Option<lapin::Queue> {
        let channel = self.connection.lapin().create_channel().await.unwrap();
        let declared = channel
            .queue_declare(
                queue.into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .ok()?;
        let _ = channel.close(200, "done".into()).await;
        Some(declared)
    }

    /// Deletes every queue and exchange of `topology`, and its migration journal.
    pub async fn delete(&self, topology: &Topology) {
        let channel = self.connection.lapin().create_channel().await.unwrap();
        let queues = topology.queues().into_iter().map(|queue| queue.name);
        for queue in queues.chain([topology.migration_journal()]) {
            let _ = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        for exchange in topology.exchanges() {
            let _ = channel
                .exchange_delete(
                    exchange.name.as_str().into(),
                    ExchangeDeleteOptions::default(),
                )
                .await;
        }
        let _ = channel.close(200, "done".into()).await;
    }
}

/// Deletes every queue and exchange whose name starts with `prefix` (found with `rabbitmqctl
/// list_queues` / `list_exchanges`), for a test whose topology another process declared;
/// returns how many queues it deleted.
pub async fn delete_queues_with_prefix(prefix: &str) -> usize {
    let names = |what: &str| -> Vec<String> {
        let listed = std::process::Command::new("rabbitmqctl")
            .args(["-q", what, "name"])
            .output()
            .expect("rabbitmqctl runs (RabbitMQ's command-line tool must be installed)");
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .map(str::trim)
            .filter(|name| name.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    };
    let queues = names("list_queues");
    let connection = connect(&format!("hexeract-tests-cleanup-{prefix}")).await;
    let channel = connection.lapin().create_channel().await.unwrap();
    for name in &queues {
        let _ = channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for name in names("list_exchanges") {
        let _ = channel
            .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ = channel.close(200, "done".into()).await;
    queues.len()
}

/// Closes every broker connection named `name` with `rabbitmqctl close_connection`, as an
/// operator would; only connections with exactly this name are touched, so tests beside this
/// one keep theirs. Returns how many it closed.
pub fn close_connections_named(name: &str) -> usize {
    let listed = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .expect("rabbitmqctl runs (RabbitMQ's command-line tool must be installed)");
    assert!(
        listed.status.success(),
        "rabbitmqctl list_connections failed: {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    // 3.10 prints `{"connection_name","NAME"}`; older releases `{<<"connection_name">>,longstr,<<"NAME">>}`.
    let needle = format!("{{\"connection_name\",\"{name}\"}}");
    let needle_binary = format!("{{<<\"connection_name\">>,longstr,<<\"{name}\">>}}");
    let mut closed = 0;
    for line in String::from_utf8_lossy(&listed.stdout).lines() {
        if !(line.contains(&needle) || line.contains(&needle_binary)) {
            continue;
        }
        let pid = line.split('\t').next().unwrap_or("").trim();
        let status = std::process::Command::new("rabbitmqctl")
            .args(["-q", "close_connection", pid, "closed by a test"])
            .status()
            .expect("rabbitmqctl runs");
        assert!(
            status.success(),
            "rabbitmqctl close_connection {pid} failed"
        );
        closed += 1;
    }
    if closed == 0 {
        eprintln!(
            "no connection named {name:?} among:\n{}",
            String::from_utf8_lossy(&listed.stdout)
        );
    }
    closed
}

/// Points `hexeract::run` (by its environment) at RabbitMQ at `amqp_url` with `broker`'s
/// exchange and queue prefix, an SQLite outbox in a fresh directory, a relay polling every
/// `relay_poll_ms` and `WORKER_PORT` on a free port. Returns the directory (remove it at the
/// end) and the port. For tests whose process runs one `hexeract::run` (nextest runs each test
/// in a process of its own).
pub fn run_env(
    broker: &TestBroker,
    amqp_url: &str,
    relay_poll_ms: u32,
) -> (std::path::PathBuf, u16) {
    let dir = std::env::temp_dir().join(format!("hexeract-run-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).expect("create the outbox's directory");
    std::env::remove_var("DATABASE_URL");
    std::env::remove_var("KAFKA_BROKERS");
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("AMQP_URL", amqp_url);
    std::env::set_var("HEXERACT_EXCHANGE", &broker.exchange);
    std::env::set_var("HEXERACT_QUEUE_PREFIX", &broker.prefix);
    std::env::set_var("RELAY_POLL_INTERVAL_MS", relay_poll_ms.to_string());
    let port = crate::http::free_port();
    std::env::set_var("WORKER_PORT", port.to_string());
    (dir, port)
}
