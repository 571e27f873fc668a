//! Chaos scenario (e), in the serial pass: RabbitMQ's application stopped and started
//! (`rabbitmqctl stop_app` / `start_app`) while `hexeract::run` relays 10 000 events from its
//! outbox with confirmed publishes and consumes them. Every connection to the broker drops,
//! not only this test's, so this binary's name starts with `serial_`: the default nextest
//! profile leaves such binaries out, and `scripts/test` runs them afterwards, one test at a
//! time, with `--profile serial` (see `.config/nextest.toml`).
//!
//! An outbox row is deleted only once the broker confirmed its publish, so a publish the
//! broker never confirmed is sent again: nothing lost, duplicates counted.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`) and
//! `rabbitmqctl` on the same machine.

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hexeract::{handler, CancellationToken, Context, Message};
use hexeract_tests::amqp::TestBroker;
use hexeract_tests::ledger::{self, Call};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "serial.Invoice")]
struct Invoice {
    n: u32,
}

const HANDLER: &str = "serial::bill";

static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());

#[handler(message = "serial.Invoice", name = "serial::bill")]
async fn bill(_invoice: Invoice, ctx: &Context) -> Result<(), String> {
    CALLS.lock().unwrap().push(Call::ok(ctx, HANDLER));
    Ok(())
}

fn calls() -> usize {
    CALLS.lock().unwrap().len()
}

fn rabbitmqctl(args: &[&str]) {
    let output = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl runs (RabbitMQ's command-line tool must be installed)");
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Starts the broker's application again, whatever happens to the test.
struct StartAppOnDrop;

impl Drop for StartAppOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl").arg("start_app").status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_stopped_and_started_during_10k_confirmed_relay_publishes_loses_nothing() {
    const EVENTS: u32 = 10_000;
    let broker = TestBroker::new().await;
    let (dir, port) = hexeract_tests::amqp::run_env(&broker, &hexeract_tests::amqp::amqp_url(), 20);

    let cancel = CancellationToken::new();
    let running = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract_tests::http::wait_for_status(port, "/health/ready", 200, Duration::from_secs(30))
        .await;
    // Written into the outbox over about 8 s, so that the relay is publishing (and waiting for
    // confirms) the whole time, the broker's outage included.
    let store = hexeract::store::default_store().await.unwrap();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let producer = tokio::spawn({
        let store = store.clone();
        let written = written.clone();
        async move {
            let mut sent = Vec::new();
            for chunk in 0..EVENTS / 100 {
                let envelopes: Vec<hexeract::Envelope> = (chunk * 100..(chunk + 1) * 100)
                    .map(|n| hexeract::Envelope::new(&Invoice { n }).unwrap())
                    .collect();
                sent.extend(envelopes.iter().map(|envelope| envelope.id));
                store.publish(envelopes).await.unwrap();
                written.fetch_add(100, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(80)).await;
            }
            sent
        }
    });

    // The broker goes away once a tenth went through, relay publishes in flight.
    let deadline = Instant::now() + Duration::from_secs(60);
    while calls() < EVENTS as usize / 10 {
        assert!(Instant::now() < deadline, "{} calls within 60 s", calls());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let guard = StartAppOnDrop;
    let at_stop = calls();
    let written_at_stop = written.load(std::sync::atomic::Ordering::SeqCst);
    let stopped_at = Instant::now();
    tokio::task::spawn_blocking(|| rabbitmqctl(&["stop_app"]))
        .await
        .unwrap();
    // `stop_app` returns once the broker's application is down.
    let stop_took = stopped_at.elapsed();
    let calls_when_down = calls();
    let down_since = Instant::now();
    let down =
        hexeract_tests::http::wait_for_status(port, "/health/ready", 503, Duration::from_secs(30))
            .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_start = calls();
    let outage = down_since.elapsed();
    let start_issued = Instant::now();
    let starting = tokio::task::spawn_blocking(|| {
        rabbitmqctl(&["start_app"]);
        rabbitmqctl(&["await_startup"]);
    });
    assert!(
        before_start < EVENTS as usize,
        "every event was handled before the broker came back: the outage missed the flow"
    );
    // Calls come again once the broker accepts connections (during `start_app`) and the
    // supervisor's next attempt finds it.
    while calls() <= before_start {
        assert!(
            start_issued.elapsed() < Duration::from_secs(90),
            "no call within 90 s of start_app"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let resumed = start_issued;
    let resumed_after = resumed.elapsed();
    starting.await.unwrap();
    drop(guard);
    let sent = producer.await.expect("the producer does not panic");

    let started = Instant::now();
    while calls() < EVENTS as usize {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} calls of {EVENTS} within 120 s of the broker's start",
            calls()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hexeract::store::wait_until_drained(&*store, Duration::from_millis(20))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The test's own connection went down with the broker too.
    let broker = TestBroker {
        connection: hexeract_tests::amqp::connect(&format!("hexeract-tests-{}", broker.prefix))
            .await,
        ..broker
    };
    let ready = broker
        .ready(&format!("{}.{}", broker.prefix, HANDLER.replace("::", ".")))
        .await;
    cancel.cancel();
    running.await.unwrap().unwrap();

    let calls = CALLS.lock().unwrap().clone();
    let dead = ledger::dead_lettered(store.dead_letters(1_000).await.unwrap());
    let verdict = ledger::classify(&sent, &[HANDLER], &calls, &dead);
    println!(
        "broker_stop_start: written_at_stop={written_at_stop} calls_at_stop={at_stop} \
         stop_app_ms={} calls_when_down={calls_when_down} calls_before_start={before_start} \
         down_before_start_ms={} calls_again_after_start_app_ms={} queue_ready_at_end={ready}",
        stop_took.as_millis(),
        outage.as_millis(),
        resumed_after.as_millis()
    );
    assert!(down.contains("failing"), "/health/ready said: {down}");
    verdict.assert_pass("broker_stop_start");
    assert_eq!(verdict.dead_lettered_total(), 0, "nothing dead-lettered");
    assert_eq!(ready, 0, "the queue is drained");
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
    let _ = std::fs::remove_dir_all(dir);
}
