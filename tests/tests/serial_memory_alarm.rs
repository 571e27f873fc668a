//! Chaos scenario, serial pass: a RabbitMQ memory alarm (`connection.blocked`) raised while
//! `hexeract::run` relays and consumes, then cleared. The alarm is node-wide: every
//! publishing connection of the broker blocks, so this binary's name starts with `serial_`
//! (see `tests/tests/serial_broker_restart.rs`).
//!
//! While blocked, publishes wait (the relay's confirms do not come) and consumption goes on
//! for what is already queued; once the alarm clears everything flows again. Nothing may be
//! lost or dead-lettered.
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
#[message(type = "serial.Parcel")]
struct Parcel {
    n: u32,
}

const HANDLER: &str = "serial::deliver";

static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());

#[handler(message = "serial.Parcel", name = "serial::deliver")]
async fn deliver(_parcel: Parcel, ctx: &Context) -> Result<(), String> {
    // Slow enough that messages are still queued when the alarm is raised.
    tokio::time::sleep(Duration::from_millis(2)).await;
    CALLS.lock().unwrap().push(Call::ok(ctx, HANDLER));
    Ok(())
}

fn calls() -> usize {
    CALLS.lock().unwrap().len()
}

/// The broker's memory high watermark as `rabbitmqctl eval` prints it (`0.4`, or
/// `{absolute,N}`).
fn watermark() -> String {
    let output = Command::new("rabbitmqctl")
        .args(["eval", "vm_memory_monitor:get_vm_memory_high_watermark()."])
        .output()
        .expect("rabbitmqctl runs (RabbitMQ's command-line tool must be installed)");
    assert!(output.status.success(), "rabbitmqctl eval failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_owned()
}

fn set_watermark(args: &[&str]) {
    let output = Command::new("rabbitmqctl")
        .arg("set_vm_memory_high_watermark")
        .args(args)
        .output()
        .expect("rabbitmqctl runs");
    assert!(
        output.status.success(),
        "rabbitmqctl set_vm_memory_high_watermark {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Whether the broker has a memory alarm raised.
fn memory_alarm_raised() -> bool {
    let output = Command::new("rabbitmqctl")
        .args(["eval", "rabbit_alarm:get_alarms()."])
        .output()
        .expect("rabbitmqctl runs");
    String::from_utf8_lossy(&output.stdout).contains("memory")
}

/// Puts the watermark back as it was, whatever happens to the test.
struct RestoreWatermark(String);

impl RestoreWatermark {
    fn restore(&self) {
        match self
            .0
            .strip_prefix("{absolute,")
            .and_then(|s| s.strip_suffix('}'))
        {
            Some(bytes) => set_watermark(&["absolute", bytes]),
            None => set_watermark(&[&self.0]),
        }
    }
}

impl Drop for RestoreWatermark {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        self.restore();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_alarm_stalls_publishing_and_once_cleared_nothing_is_lost() {
    const EVENTS: u32 = 5_000;
    let broker = TestBroker::new().await;
    let (dir, port) = hexeract_tests::amqp::run_env(&broker, &hexeract_tests::amqp::amqp_url(), 20);

    let cancel = CancellationToken::new();
    let running = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract_tests::http::wait_for_status(port, "/health/ready", 200, Duration::from_secs(30))
        .await;
    let store = hexeract::store::default_store().await.unwrap();
    let mut sent = Vec::new();
    let mut publish = |range: std::ops::Range<u32>| {
        let envelopes: Vec<hexeract::Envelope> = range
            .map(|n| hexeract::Envelope::new(&Parcel { n }).unwrap())
            .collect();
        sent.extend(envelopes.iter().map(|envelope| envelope.id));
        envelopes
    };
    let first = publish(0..EVENTS / 2);
    store.publish(first).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while calls() < EVENTS as usize / 2 {
        assert!(Instant::now() < deadline, "{} calls within 60 s", calls());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // The alarm, then the second half into the outbox: the relay's publishes are blocked.
    let restore = RestoreWatermark(watermark());
    tokio::task::spawn_blocking(|| {
        set_watermark(&["0.000001"]);
        let raised = Instant::now();
        while !memory_alarm_raised() {
            assert!(
                raised.elapsed() < Duration::from_secs(30),
                "no memory alarm 30 s after lowering the watermark"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
    let at_alarm = calls();
    let second = publish(EVENTS / 2..EVENTS);
    store.publish(second).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during_alarm = calls() - at_alarm;
    let cleared_at = Instant::now();
    tokio::task::spawn_blocking(move || restore.restore())
        .await
        .unwrap();

    while calls() < EVENTS as usize {
        assert!(
            cleared_at.elapsed() < Duration::from_secs(120),
            "{} of {EVENTS} calls within 120 s of the alarm clearing",
            calls()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let flowed_after = cleared_at.elapsed();
    hexeract::store::wait_until_drained(&*store, Duration::from_millis(20))
        .await
        .unwrap();
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
        "memory_alarm: calls_before_alarm={at_alarm} calls_during_3s_alarm={during_alarm} \
         all_handled_after_clear_ms={} queue_ready_at_end={ready}",
        flowed_after.as_millis()
    );
    verdict.assert_pass("memory_alarm");
    assert_eq!(
        during_alarm, 0,
        "nothing written during the alarm reached a handler before it cleared: publishing \
         was blocked"
    );
    assert_eq!(verdict.dead_lettered_total(), 0, "nothing dead-lettered");
    assert_eq!(ready, 0, "the queue is drained");
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
    let _ = std::fs::remove_dir_all(dir);
}
