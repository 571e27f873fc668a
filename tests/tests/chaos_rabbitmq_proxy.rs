//! Chaos scenario (d) of the reliability suite: `hexeract::run` (SQLite outbox, relay, RabbitMQ
//! worker) reaches RabbitMQ only through a fault-injecting proxy, and the proxy resets every
//! connection, or blackholes them (sockets open, nothing forwarded, as when a network path dies
//! without a reset), while deliveries are in flight. A reset is noticed at once; a blackhole
//! only by the AMQP heartbeat (2 s here), not by the kernel's TCP timeouts (minutes). Either
//! way every message is handled in the end, and the figures (lost, duplicates, time to notice,
//! time to resume) are printed. A last test loses one publish on its way, on a connection that
//! stays up, and checks that the publisher and the relay give the channel up.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). Each
//! test runs in a process of its own (nextest), with its own exchange, queues and SQLite file,
//! and disturbs only the connections through its own proxy.

use std::net::ToSocketAddrs;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hexeract::health::Status;
use hexeract::{handler, CancellationToken, Context, Message};
use hexeract_tests::amqp::TestBroker;
use hexeract_tests::ledger::{self, Call};
use hexeract_tests::proxy::FaultProxy;
use uuid::Uuid;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "chaos.Shipment")]
struct Shipment {
    n: u32,
}

const HANDLER: &str = "chaos::ship";

/// Every call, in order.
static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());

#[handler(message = "chaos.Shipment", name = "chaos::ship")]
async fn ship(_shipment: Shipment, ctx: &Context) -> Result<(), String> {
    // Slow enough that deliveries are in flight when the fault comes.
    tokio::time::sleep(Duration::from_millis(3)).await;
    CALLS.lock().unwrap().push(Call::ok(ctx, HANDLER));
    Ok(())
}

fn calls() -> usize {
    CALLS.lock().unwrap().len()
}

/// Waits until more than `count` calls were made; returns how long that took.
async fn calls_beyond(count: usize, limit: Duration) -> Duration {
    let started = Instant::now();
    while calls() <= count {
        assert!(
            started.elapsed() < limit,
            "no call within {limit:?} ({} calls so far)",
            calls()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

/// A fault proxy to RabbitMQ, and the URL through it, with a heartbeat of `heartbeat` seconds.
async fn proxy_to_rabbitmq(heartbeat: u32) -> (FaultProxy, String) {
    let upstream = url::Url::parse(&hexeract_tests::amqp::amqp_url())
        .expect("TEST_AMQP_URL is a URL")
        .socket_addrs(|| Some(5672))
        .expect("TEST_AMQP_URL names a reachable host")
        .into_iter()
        .next()
        .or_else(|| "127.0.0.1:5672".to_socket_addrs().ok()?.next())
        .expect("an address for RabbitMQ");
    let proxy = FaultProxy::start(upstream).await;
    let mut through_proxy =
        url::Url::parse(&hexeract_tests::amqp::amqp_url()).expect("TEST_AMQP_URL is a URL");
    through_proxy
        .set_host(Some(&proxy.addr().ip().to_string()))
        .expect("an IP host");
    through_proxy
        .set_port(Some(proxy.addr().port()))
        .expect("a port");
    through_proxy.set_query(Some(&format!("heartbeat={heartbeat}")));
    (proxy, through_proxy.to_string())
}

/// A test broker, a fault proxy to RabbitMQ, and a connection through it named for the broker's
/// prefix, with a heartbeat of `heartbeat` seconds.
async fn connected_through_a_proxy(
    heartbeat: u32,
) -> (
    TestBroker,
    FaultProxy,
    hexeract::rabbitmq::RabbitMqConnection,
) {
    let broker = TestBroker::new().await;
    let (proxy, through_proxy) = proxy_to_rabbitmq(heartbeat).await;
    let connection =
        hexeract::rabbitmq::RabbitMqConnection::connect_named(&through_proxy, &broker.prefix)
            .await
            .expect("connect through the proxy");
    (broker, proxy, connection)
}

enum Fault {
    Reset,
    Blackhole,
}

async fn consume_through_a_proxy(fault: Fault, scenario: &str) {
    const MESSAGES: u32 = 3_000;
    // What the supervisors say about the lost connection shows in the test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "hexeract=info".into()))
        .try_init();
    let broker = TestBroker::new().await;
    let (proxy, through_proxy) = proxy_to_rabbitmq(2).await;
    let (dir, port) = hexeract_tests::amqp::run_env(&broker, &through_proxy, 50);

    let cancel = CancellationToken::new();
    let running = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract_tests::http::wait_for_status(port, "/health/ready", 200, Duration::from_secs(30))
        .await;
    let envelopes: Vec<hexeract::Envelope> = (0..MESSAGES)
        .map(|n| hexeract::Envelope::new(&Shipment { n }).unwrap())
        .collect();
    let sent: Vec<Uuid> = envelopes.iter().map(|envelope| envelope.id).collect();
    let store = hexeract::store::default_store().await.unwrap();
    store.publish(envelopes).await.unwrap();

    // The fault comes once a tenth went through.
    let deadline = Instant::now() + Duration::from_secs(60);
    while calls() < MESSAGES as usize / 10 {
        assert!(Instant::now() < deadline, "{} calls within 60 s", calls());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let connections_before = proxy.accepted();
    let (noticed, resumed) = match fault {
        Fault::Reset => {
            let at_fault = calls();
            proxy.reset_all();
            // A reset is an error on the socket at once: the time to notice is nil, the
            // time that counts is until calls come again (a new connection, consumers back).
            let resumed = calls_beyond(at_fault + 50, Duration::from_secs(60)).await;
            (Duration::ZERO, resumed)
        }
        Fault::Blackhole => {
            proxy.blackhole(true);
            let noticed = Instant::now();
            hexeract_tests::http::wait_for_status(
                port,
                "/health/ready",
                503,
                Duration::from_secs(30),
            )
            .await;
            let noticed = noticed.elapsed();
            let at_lift = calls();
            proxy.blackhole(false);
            let resumed = calls_beyond(at_lift, Duration::from_secs(90)).await;
            (noticed, resumed)
        }
    };
    let started = Instant::now();
    let queue = format!("{}.{}", broker.prefix, HANDLER.replace("::", "."));
    while calls() < MESSAGES as usize {
        if started.elapsed() > Duration::from_secs(120) {
            // Where the messages are, to tell a stalled relay from a stalled consumer.
            let pending = store.backlog().await;
            let readiness = hexeract_tests::http::get(port, "/health/ready").await;
            panic!(
                "{} of {MESSAGES} calls within 120 s of the fault; outbox pending: {pending:?}; \
                 queue ready: {}, consumers: {:?}; proxy open connections: {}; \
                 /health/ready: {readiness:?}",
                calls(),
                broker.ready(&queue).await,
                broker.consumers(&queue).await,
                proxy.open_connections(),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hexeract::store::wait_until_drained(&*store, Duration::from_millis(20))
        .await
        .unwrap();
    // Let redeliveries of unacked deliveries, if any, arrive before the count.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ready = broker.ready(&queue).await;
    cancel.cancel();
    running.await.unwrap().unwrap();

    let calls = CALLS.lock().unwrap().clone();
    let dead = ledger::dead_lettered(store.dead_letters(1_000).await.unwrap());
    let verdict = ledger::classify(&sent, &[HANDLER], &calls, &dead);
    println!(
        "{scenario}: noticed_ms={} resumed_ms={} new_connections={} queue_ready_at_end={ready}",
        noticed.as_millis(),
        resumed.as_millis(),
        proxy.accepted() - connections_before,
    );
    verdict.assert_pass(scenario);
    assert_eq!(verdict.dead_lettered_total(), 0, "nothing dead-lettered");
    assert_eq!(ready, 0, "the queue is drained");
    assert!(
        proxy.accepted() > connections_before,
        "the worker connected again through the proxy"
    );
    if let Fault::Blackhole = fault {
        // Two heartbeats of 2 s, with room for a loaded machine: far below the minutes a
        // kernel takes to give up on a silent peer.
        assert!(
            noticed < Duration::from_secs(15),
            "a blackhole noticed only after {noticed:?}, with a 2 s heartbeat"
        );
    }
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_reset_mid_consumption_loses_nothing() {
    consume_through_a_proxy(Fault::Reset, "rabbitmq_proxy_reset").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_connection_is_noticed_within_the_heartbeat_and_loses_nothing() {
    consume_through_a_proxy(Fault::Blackhole, "rabbitmq_proxy_blackhole").await;
}

/// The broker numbers publisher confirms by the publishes it received. When a publish is lost
/// on its way while the connection stays up, every later confirm names a number the client
/// gave to an earlier publish, and the last one waits for ever. (A TCP stream never loses
/// bytes, but a frame lost between the broker and the client library does the same; a
/// blackhole proxy that dropped bytes once made a relay wait for such confirms for good.) The
/// first confirm that does not come in time gives the channel up: `is_connected` turns false,
/// and the relay, the bus worker and the transport then open a new connection instead of
/// publishing into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_lost_on_its_way_gives_the_channel_up() {
    let broker = TestBroker::new().await;
    // A long heartbeat: the lost bytes, not a missed heartbeat, are what the client meets.
    let (proxy, through_proxy) = proxy_to_rabbitmq(60).await;
    let connection =
        hexeract::rabbitmq::RabbitMqConnection::connect_named(&through_proxy, &broker.prefix)
            .await
            .expect("connect through the proxy");
    let publisher = hexeract::rabbitmq::RabbitMqPublisher::new(&connection)
        .await
        .expect("a publisher")
        .exchange(broker.exchange.clone())
        .confirm_timeout(Duration::from_secs(1));
    publisher.declare_exchange().await.expect("declare");
    let shipment = |n| hexeract::Envelope::new(&Shipment { n }).unwrap();
    publisher.publish(&shipment(0)).await.expect("confirmed");
    assert!(publisher.is_connected());

    // The second publish never reaches the broker.
    proxy.lose_requests(true);
    let lost = publisher.publish(&shipment(1)).await;
    proxy.lose_requests(false);
    assert!(
        matches!(&lost, Err(hexeract::rabbitmq::BusError::NotConfirmed { detail, .. }) if detail.contains("no confirm within")),
        "{lost:?}"
    );
    assert!(
        !publisher.is_connected(),
        "a channel whose confirm did not come is given up"
    );
    // Were it used again, the broker would confirm the third publish as its second, which the
    // client would take for the lost one, and the third would wait in vain: it is refused at
    // once instead, and the channel is closed.
    let started = std::time::Instant::now();
    let third = publisher.publish(&shipment(2)).await;
    assert!(
        matches!(&third, Err(hexeract::rabbitmq::BusError::NotConfirmed { detail, .. }) if detail.contains("given up")),
        "{third:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "refused without waiting for a confirm"
    );
    assert_eq!(
        proxy.open_connections(),
        1,
        "the connection itself stayed up"
    );

    // A relay on such a channel stops (its supervisor connects again) instead of failing
    // every pass for good; a relay on a new connection then relays the rows it left.
    let dir = std::env::temp_dir().join(format!("hexeract-lost-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = hexeract::store::sqlite::SqliteStore::open(dir.join("outbox.db"))
        .await
        .unwrap();
    hexeract::store::DeliveryStore::migrate(&store)
        .await
        .unwrap();
    let queue = format!("{}.all", broker.prefix);
    let channel = broker.connection.lapin().create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            broker.exchange.as_str().into(),
            "#".into(),
            lapin::options::QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let health = hexeract::health::Health::new();
    let relay_store: std::sync::Arc<dyn hexeract::store::RelayStore> =
        std::sync::Arc::new(store.clone());
    let relay_connection =
        hexeract::rabbitmq::RabbitMqConnection::connect_named(&through_proxy, "relay")
            .await
            .expect("connect through the proxy");
    let relay = hexeract::rabbitmq::RabbitMqRelay::new(relay_store.clone(), &relay_connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone())
        .batch_size(5)
        .poll_interval(Duration::from_millis(20))
        .confirm_timeout(Duration::from_secs(1))
        .health(health.probe("outbox relay"));
    let cancel = CancellationToken::new();
    let running = tokio::spawn(relay.run(cancel.clone()));
    // Once it declared its exchange and found nothing to relay, its first publishes are lost:
    // every confirm after them is behind.
    let started = std::time::Instant::now();
    while !health
        .readiness()
        .components
        .iter()
        .any(|component| component.name == "outbox relay" && component.status == Status::Ready)
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            health.readiness()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.lose_requests(true);
    let envelopes: Vec<hexeract::Envelope> = (10..20).map(shipment).collect();
    let ids: Vec<Uuid> = envelopes.iter().map(|envelope| envelope.id).collect();
    hexeract::store::DeliveryStore::publish(&store, envelopes)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.lose_requests(false);
    let stopped = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the relay stops within 30 s rather than failing its passes for good")
        .expect("no panic");
    assert!(
        matches!(&stopped, Err(hexeract::rabbitmq::BusError::Connection(_))),
        "{stopped:?}"
    );
    let fresh = broker.connect("relay.again").await;
    let relay = hexeract::rabbitmq::RabbitMqRelay::new(relay_store, &fresh)
        .await
        .unwrap()
        .exchange(broker.exchange.clone())
        .poll_interval(Duration::from_millis(20));
    let cancel = CancellationToken::new();
    let running = tokio::spawn(relay.run(cancel.clone()));
    hexeract::store::wait_until_drained(&store, Duration::from_millis(20))
        .await
        .unwrap();
    cancel.cancel();
    running.await.unwrap().unwrap();
    let relayed: std::collections::HashSet<Uuid> = broker
        .drain(&queue)
        .await
        .iter()
        .map(|message| {
            message
                .properties
                .message_id()
                .as_ref()
                .expect("a message id")
                .as_str()
                .parse()
                .expect("a UUID")
        })
        .collect();
    let missing: Vec<&Uuid> = ids.iter().filter(|id| !relayed.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "every row reaches the queue: {missing:?}"
    );
    channel
        .queue_delete(
            queue.as_str().into(),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Closing a connection whose broker stopped answering (a blackhole: the socket open, nothing
/// forwarded) ends at the close's deadline with an error that says so, instead of waiting for
/// a `close-ok` that never comes: a program's shutdown, or a tool's last step, does not hang
/// on it. (A benchmark run once waited for good on such a close.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_connection_whose_broker_stopped_answering_ends_at_its_deadline() {
    // A long heartbeat: the close's own deadline, not a missed heartbeat, is what ends it.
    let (_broker, proxy, connection) = connected_through_a_proxy(60).await;
    proxy.blackhole(true);
    // Far above the close's 5 s deadline, far below the heartbeat's two minutes: a guard, so
    // that a close without a deadline fails here instead of hanging the suite.
    let closed = tokio::time::timeout(Duration::from_secs(30), connection.close())
        .await
        .expect("the close returns: it has a deadline of its own");
    assert!(
        matches!(
            &closed,
            Err(hexeract::rabbitmq::BusError::Transport { operation, detail })
                if operation == "connection.close" && detail.contains("did not confirm the close")
        ),
        "{closed:?}"
    );
}
