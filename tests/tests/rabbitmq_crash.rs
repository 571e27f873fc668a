//! A message that takes its consumer process down, again and again: the process is killed with
//! SIGKILL in the middle of the call, and restarted. Each killed call still counts (the quorum
//! queue counts the deliveries that ended without an ack), so after `max_attempts` of them the
//! next delivery is parked as `max_deliveries_exceeded` without calling the handler, and the
//! messages behind it flow.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). Kills
//! only the child processes it started.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use hexeract::rabbitmq::{headers, RabbitMqPublisher, Topology};
use hexeract::{Envelope, Message, Registry};
use hexeract_tests::amqp::{amqp_url, TestBroker};
use hexeract_tests::ledger;
use lapin::types::AMQPValue;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "crash.Task")]
struct Task {
    n: u32,
    hang: bool,
}

/// An `amqp_child` process; its output lines arrive on `lines`.
struct ChildWorker {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl ChildWorker {
    fn start(broker: &TestBroker, max_attempts: u32) -> ChildWorker {
        ChildWorker::start_with(broker, &[max_attempts.to_string()])
    }

    /// A child taking `prefetch` deliveries at a time, each call sleeping `delay_ms`.
    fn start_tuned(
        broker: &TestBroker,
        max_attempts: u32,
        prefetch: u32,
        delay_ms: u32,
    ) -> ChildWorker {
        ChildWorker::start_with(
            broker,
            &[
                max_attempts.to_string(),
                prefetch.to_string(),
                delay_ms.to_string(),
            ],
        )
    }

    fn start_with(broker: &TestBroker, rest: &[String]) -> ChildWorker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_amqp_child"))
            .args([&broker.exchange, &broker.prefix])
            .args(rest)
            .env("AMQP_CHILD_URL", amqp_url())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start amqp_child");
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        ChildWorker { child, lines }
    }

    /// The next line that starts with one of `prefixes`, within `limit`; lines before it are
    /// skipped.
    fn expect(&self, prefixes: &[&str], limit: Duration) -> String {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if prefixes.iter().any(|prefix| line.starts_with(prefix)) => return line,
                Ok(_) => {}
                Err(_) => panic!("amqp_child printed none of {prefixes:?} within {limit:?}"),
            }
        }
    }

    fn kill(mut self) {
        self.child.kill().expect("SIGKILL our own child");
        self.child.wait().unwrap();
    }

    /// SIGKILL, then every line the child printed before it died that was not read yet.
    fn kill_and_drain(mut self) -> Vec<String> {
        self.child.kill().expect("SIGKILL our own child");
        self.child.wait().unwrap();
        // The reader thread ends once the pipe is closed and read to the end.
        let mut left = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            left.push(line);
        }
        left
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kills_its_consumer_is_parked_after_max_attempts_and_the_rest_flow() {
    let broker = TestBroker::new().await;
    let max_attempts = 3;
    let mut registry = Registry::new();
    registry
        .register::<Task, _>(NoOp, hexeract::HandlerOptions::new().name("crash.work"))
        .unwrap();
    let topology = Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone());
    topology.declare(&broker.connection).await.unwrap();
    let publisher = RabbitMqPublisher::new(&broker.connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone());
    let poison = Envelope::new(&Task { n: 0, hang: true }).unwrap();
    let mut batch = vec![poison.clone()];
    batch.extend((1..=20).map(|n| Envelope::new(&Task { n, hang: false }).unwrap()));
    publisher.publish_all(&batch).await.unwrap();

    let parking = topology.parking_queue_for("crash.work");
    let mut kills = Vec::new();
    loop {
        let child = ChildWorker::start(&broker, max_attempts);
        child.expect(&["ready"], Duration::from_secs(20));
        // Each child either gets the poison message (and hangs on it) or parks it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let hang = loop {
            if let Ok(line) = child.lines.try_recv() {
                if line.starts_with("hang") {
                    break Some(line);
                }
            }
            if broker.ready(&parking).await > 0 {
                break None;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the child neither hung on the poison message nor parked it"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        match hang {
            Some(line) => {
                kills.push(line);
                child.kill();
            }
            None => {
                // Let this child send its last acks (at most 1 ms late) before it is stopped.
                tokio::time::sleep(Duration::from_millis(500)).await;
                break;
            }
        }
        assert!(
            kills.len() <= max_attempts as usize,
            "killed too often: {kills:?}"
        );
    }
    assert_eq!(
        kills.len(),
        max_attempts as usize,
        "the handler was called max_attempts times, each call killed: {kills:?}"
    );
    let attempts: Vec<&str> = kills
        .iter()
        .map(|line| line.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(attempts, ["1", "2", "3"], "each kill counted as an attempt");

    let parked = broker
        .wait_for(
            &topology.parking_queue_for("crash.work"),
            1,
            Duration::from_secs(5),
        )
        .await;
    let message = &parked[0];
    assert_eq!(
        message
            .delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .as_str(),
        poison.id.to_string()
    );
    let reason = message
        .delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|table| table.inner().get(headers::REASON).cloned());
    assert_eq!(
        reason,
        Some(AMQPValue::LongString("max_deliveries_exceeded".into()))
    );
    // The 20 good tasks were handled and acked along the way.
    assert_eq!(broker.ready(&topology.queue_for("crash.work")).await, 0);
    broker.delete(&topology).await;
}

struct NoOp;

impl hexeract::Handler<Task> for NoOp {
    type Error = String;
    async fn handle(&self, _task: Task, _ctx: &hexeract::Context) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Chaos scenario (d): a consumer process SIGKILLed three times with up to 50 deliveries in
/// flight (prefetch 50, each call 5 ms), 3 000 tasks in all, a new process started after each
/// kill. The broker hands every unacked delivery to the next process: nothing lost, the
/// deliveries in flight at a kill are the duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_with_50_deliveries_in_flight_loses_nothing() {
    const TASKS: u32 = 3_000;
    const KILLS: usize = 3;
    const PREFETCH: u32 = 50;
    let broker = TestBroker::new().await;
    let mut registry = Registry::new();
    registry
        .register::<Task, _>(NoOp, hexeract::HandlerOptions::new().name("crash.work"))
        .unwrap();
    let topology = Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone());
    topology.declare(&broker.connection).await.unwrap();
    let publisher = RabbitMqPublisher::new(&broker.connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone());
    let batch: Vec<Envelope> = (0..TASKS)
        .map(|n| Envelope::new(&Task { n, hang: false }).unwrap())
        .collect();
    publisher.publish_all(&batch).await.unwrap();

    let mut calls = Vec::new();
    let record = |line: &str, calls: &mut Vec<ledger::Call>| {
        let mut words = line.split(' ').skip(1);
        let n: u128 = words.next().unwrap().parse().unwrap();
        let attempt: i32 = words.next().unwrap().parse().unwrap();
        calls.push(ledger::Call {
            message_id: uuid::Uuid::from_u128(n),
            handler: "crash.work".to_owned(),
            attempt,
            ok: true,
            pid: 0,
        });
    };
    for kill in 1..=KILLS {
        let child = ChildWorker::start_tuned(&broker, 5, PREFETCH, 5);
        child.expect(&["ready"], Duration::from_secs(20));
        let before = calls.len();
        // Kill once this process has made some calls, so its window is full.
        while calls.len() < before + 300 {
            let line = child.expect(&["done"], Duration::from_secs(20));
            record(&line, &mut calls);
        }
        for line in child.kill_and_drain() {
            if line.starts_with("done") {
                record(&line, &mut calls);
            }
        }
        println!("kill {kill}: calls so far {}", calls.len());
    }
    let last = ChildWorker::start_tuned(&broker, 5, PREFETCH, 5);
    last.expect(&["ready"], Duration::from_secs(20));
    let sent: Vec<uuid::Uuid> = (0..u128::from(TASKS)).map(uuid::Uuid::from_u128).collect();
    let queue = format!("{}.crash.work", broker.prefix);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        while let Ok(line) = last.lines.try_recv() {
            if line.starts_with("done") {
                record(&line, &mut calls);
            }
        }
        let seen: std::collections::HashSet<_> = calls.iter().map(|call| call.message_id).collect();
        if seen.len() == TASKS as usize && broker.ready(&queue).await == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {TASKS} tasks handled within 120 s",
            seen.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let parked = broker
        .ready(&topology.parking_queue_for("crash.work"))
        .await;
    drop(last);
    let verdict = ledger::classify(&sent, &["crash.work"], &calls, &[]);
    verdict.assert_pass("rabbitmq_consumer_sigkill");
    assert_eq!(parked, 0, "nothing parked");
    assert!(
        verdict.duplicates <= KILLS * PREFETCH as usize,
        "{} duplicates after {KILLS} kills: more than prefetch ({PREFETCH}) per kill",
        verdict.duplicates
    );
    broker.delete(&topology).await;
}
