//! Chaos scenario (d) of the reliability suite: `hexeract::run` (SQLite outbox, relay, RabbitMQ
//! worker) reaches RabbitMQ only through a fault-injecting proxy, and the proxy resets every
//! connection, or blackholes them (sockets open, nothing forwarded, as when a network path dies
//! without a reset), while deliveries are in flight. A reset is noticed at once; a blackhole
//! only by the AMQP heartbeat (2 s here), not by the kernel's TCP timeouts (minutes). Either
//! way every message is handled in the end, and the figures (lost, duplicates, time to notice,
//! time to resume) are printed.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). Each
//! test runs in a process of its own (nextest), with its own exchange, queues and SQLite file,
//! and disturbs only the connections through its own proxy.

use std::net::ToSocketAddrs;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

enum Fault {
    Reset,
    Blackhole,
}

async fn consume_through_a_proxy(fault: Fault, scenario: &str) {
    const MESSAGES: u32 = 3_000;
    let broker = TestBroker::new().await;
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
    through_proxy.set_query(Some("heartbeat=2"));

    let (dir, port) = hexeract_tests::amqp::run_env(&broker, through_proxy.as_str(), 50);

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
    while calls() < MESSAGES as usize {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} of {MESSAGES} calls within 120 s of the fault",
            calls()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hexeract::store::wait_until_drained(&*store, Duration::from_millis(20))
        .await
        .unwrap();
    // Let redeliveries of unacked deliveries, if any, arrive before the count.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ready = broker
        .ready(&format!("{}.{}", broker.prefix, HANDLER.replace("::", ".")))
        .await;
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
