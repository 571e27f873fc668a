//! The RabbitMQ worker on a real broker, in what is RabbitMQ's own: the parking queues and the
//! headers of a parked copy, bad input from plain AMQP clients, prefetch, deliveries handed back
//! at shutdown, the dead-letter row written before the park, the wire format, connections, the
//! relay and TLS. Fan-out, retries and their attempt count across a restart, and the other
//! outcomes of the delivery contract are the conformance suite's (`conformance.rs`, its
//! `on_rabbitmq` cells).
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). Each
//! test declares its own exchange and queues (a prefix of its own) and deletes them at the end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hexeract::health::{Health, Status};
use hexeract::rabbitmq::{
    headers, RabbitMqPublisher, RabbitMqWorker, RabbitMqWorkerBuilder, Topology,
};
use hexeract::store::DeadLetterStore;
use hexeract::{
    CancellationToken, Context, Envelope, Handler, HandlerOptions, HandlerOutcome, Message,
    Registry,
};
use hexeract_tests::amqp::TestBroker;
use lapin::types::AMQPValue;
use lapin::BasicProperties;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.OrderPlaced")]
struct OrderPlaced {
    order_id: u32,
}

/// One call: (order, handler, attempt).
type Call = (u32, &'static str, u32);

/// Every call.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn all(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }

    async fn wait_for(&self, count: usize, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.0.lock().unwrap().len() < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {count} calls within {limit:?}",
                self.0.lock().unwrap().len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Succeeds.
struct Record(Calls, &'static str);

impl Handler<OrderPlaced> for Record {
    type Error = String;
    async fn handle(&self, order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        self.0
             .0
            .lock()
            .unwrap()
            .push((order.order_id, self.1, ctx.attempt()));
        Ok(())
    }
}

/// Fails the first `failures` calls of each message.
struct FailFirst(Calls, u32);

impl Handler<OrderPlaced> for FailFirst {
    type Error = String;
    async fn handle(&self, order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        self.0
             .0
            .lock()
            .unwrap()
            .push((order.order_id, "flaky", ctx.attempt()));
        if ctx.attempt() <= self.1 {
            Err(format!("failing call {}", ctx.attempt()))
        } else {
            Ok(())
        }
    }
}

fn worker(
    broker: &TestBroker,
    connection: hexeract::rabbitmq::RabbitMqConnection,
) -> RabbitMqWorkerBuilder {
    RabbitMqWorkerBuilder::new(connection)
        .registry(Registry::new())
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .wait_tiers([
            Duration::from_millis(50),
            Duration::from_millis(100),
            Duration::from_millis(200),
        ])
        .retry_delays(Duration::from_millis(50), Duration::from_millis(200))
        // The tests that read rows give a store; the others read the parking queues.
        .park_without_rows()
}

struct Running {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), hexeract::rabbitmq::BusError>>,
    topology: Topology,
}

impl Running {
    fn start(worker: RabbitMqWorker) -> Running {
        let topology = worker.topology().clone();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(worker.run(cancel.clone()));
        Running {
            cancel,
            task,
            topology,
        }
    }

    async fn stop(self) -> Topology {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("run returns soon after cancel")
            .unwrap()
            .expect("run returns Ok(()) on cancel");
        self.topology
    }
}

/// Waits until the worker consumes every one of its handler queues (it declares its topology
/// first).
async fn declared(broker: &TestBroker, topology: &Topology) {
    let queues: Vec<String> = topology
        .queues()
        .into_iter()
        .filter(|queue| queue.delivery_limit.is_some())
        .map(|queue| queue.name)
        .collect();
    for _ in 0..400 {
        let mut consumed = 0;
        for queue in &queues {
            if broker.consumers(queue).await.unwrap_or(0) > 0 {
                consumed += 1;
            }
        }
        if consumed == queues.len() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the worker did not start consuming {queues:?}");
}

async fn publisher(broker: &TestBroker) -> RabbitMqPublisher {
    RabbitMqPublisher::new(&broker.connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone())
}

fn header<'a>(message: &'a lapin::message::BasicGetMessage, name: &str) -> Option<&'a AMQPValue> {
    message
        .delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|table| table.inner().get(name))
}

fn text(value: Option<&AMQPValue>) -> String {
    match value {
        Some(AMQPValue::LongString(text)) => String::from_utf8_lossy(text.as_bytes()).into_owned(),
        other => panic!("not a string header: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_failing_is_parked_after_max_attempts_with_its_reason() {
    let broker = TestBroker::new().await;
    let calls = Calls::default();
    let worker = worker(&broker, broker.connect("hexeract-tests-park").await)
        .register_handler_with::<OrderPlaced, _>(
            FailFirst(calls.clone(), u32::MAX),
            HandlerOptions::new().name("always_fails"),
        )
        .max_attempts(3)
        .build()
        .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    let envelope = Envelope::new(&OrderPlaced { order_id: 9 }).unwrap();
    publisher(&broker).await.publish(&envelope).await.unwrap();
    let parking = running.topology.parking_queue_for("always_fails");
    let parked = broker.wait_for(&parking, 1, Duration::from_secs(10)).await;
    let topology = running.stop().await;

    assert_eq!(calls.all().len(), 3, "three calls, then parked");
    let message = &parked[0];
    assert_eq!(
        message.delivery.data,
        envelope.payload.to_vec(),
        "original bytes"
    );
    assert_eq!(
        message
            .delivery
            .properties
            .message_id()
            .as_ref()
            .unwrap()
            .as_str(),
        envelope.id.to_string()
    );
    assert_eq!(
        text(header(message, headers::REASON)),
        "max_deliveries_exceeded"
    );
    assert_eq!(text(header(message, headers::DETAIL)), "failing call 3");
    assert_eq!(text(header(message, headers::HANDLER)), "always_fails");
    assert_eq!(
        header(message, headers::ATTEMPTS),
        Some(&AMQPValue::LongLongInt(3))
    );
    broker.delete(&topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_from_a_plain_client_is_parked_with_its_reason() {
    let broker = TestBroker::new().await;
    let calls = Calls::default();
    let worker = worker(&broker, broker.connect("hexeract-tests-poison").await)
        .register_handler_with::<OrderPlaced, _>(
            Record(calls.clone(), "ok"),
            HandlerOptions::new().name("poison"),
        )
        .max_payload_bytes(1024)
        .max_attempts(2)
        .build()
        .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    let json = |id: &str| {
        BasicProperties::default()
            .with_message_id(id.into())
            .with_content_type("application/json".into())
            .with_type("test.OrderPlaced".into())
    };
    let queue = running.topology.queue_for("poison");
    // Oversize, invalid JSON, no message id, wrong content type: straight from the exchange.
    broker
        .publish_raw("test.OrderPlaced", &vec![b' '; 4096], json("too-large"))
        .await;
    broker
        .publish_raw("test.OrderPlaced", b"{not json", json("invalid"))
        .await;
    broker
        .publish_raw(
            "test.OrderPlaced",
            br#"{"order_id":1}"#,
            BasicProperties::default().with_type("test.OrderPlaced".into()),
        )
        .await;
    broker
        .publish_raw(
            "test.OrderPlaced",
            b"<order/>",
            json("xml").with_content_type("application/xml".into()),
        )
        .await;
    // A type this queue's handler does not handle, put into its queue directly.
    broker
        .publish_to(
            "",
            &queue,
            b"{}",
            json("unknown").with_type("test.Nobody".into()),
        )
        .await;
    // And a good one, which still goes through.
    broker
        .publish_raw(
            "test.OrderPlaced",
            br#"{"order_id":7}"#,
            json(&Uuid::now_v7().to_string()),
        )
        .await;

    let parking = running.topology.parking_queue_for("poison");
    let parked = broker.wait_for(&parking, 5, Duration::from_secs(15)).await;
    calls.wait_for(1, Duration::from_secs(5)).await;
    let topology = running.stop().await;

    let mut reasons: Vec<(String, String)> = parked
        .iter()
        .map(|message| {
            let id = message
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_else(|| "(none)".into());
            (id, text(header(message, headers::REASON)))
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("(none)".to_owned(), "message_id_missing".to_owned()),
            ("invalid".to_owned(), "payload_invalid".to_owned()),
            ("too-large".to_owned(), "payload_too_large".to_owned()),
            ("unknown".to_owned(), "unknown_message_type".to_owned()),
            ("xml".to_owned(), "payload_invalid".to_owned()),
        ]
    );
    assert_eq!(calls.all(), [(7, "ok", 1)], "the good message went through");
    assert_eq!(broker.ready(&queue).await, 0);
    broker.delete(&topology).await;
}

/// Counts calls in flight and the most seen at once.
struct Slow {
    in_flight: Arc<AtomicU32>,
    most: Arc<AtomicU32>,
    done: Arc<AtomicU32>,
}

impl Handler<OrderPlaced> for Slow {
    type Error = String;
    async fn handle(&self, _order: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.done.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_than_prefetch_calls_run_at_once_and_cancel_finishes_the_calls_in_flight() {
    let broker = TestBroker::new().await;
    let (in_flight, most, done) = (
        Arc::default(),
        Arc::<AtomicU32>::default(),
        Arc::<AtomicU32>::default(),
    );
    let worker = worker(&broker, broker.connect("hexeract-tests-prefetch").await)
        .register_handler_with::<OrderPlaced, _>(
            Slow {
                in_flight,
                most: most.clone(),
                done: done.clone(),
            },
            HandlerOptions::new().name("slow"),
        )
        .prefetch(4)
        .build()
        .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    let envelopes: Vec<Envelope> = (0..100)
        .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
        .collect();
    publisher(&broker)
        .await
        .publish_all(&envelopes)
        .await
        .unwrap();
    while done.load(Ordering::SeqCst) < 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let queue = running.topology.queue_for("slow");
    let topology = running.stop().await;
    let finished = done.load(Ordering::SeqCst);
    assert_eq!(
        most.load(Ordering::SeqCst),
        4,
        "prefetch 4: four calls at once, never more"
    );
    // Every finished call was acked; the rest went back to the queue, none lost. The broker
    // requeues what a closed channel held as it closes it, after `stop` returned: wait for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while broker.ready(&queue).await != 100 - finished && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(broker.ready(&queue).await, 100 - finished);
    broker.delete(&topology).await;
}

/// Records each call; the call of order 0 first waits `pause`.
struct FirstSlow(Calls, Duration);

impl Handler<OrderPlaced> for FirstSlow {
    type Error = String;
    async fn handle(&self, order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        if order.order_id == 0 {
            tokio::time::sleep(self.1).await;
        }
        self.0
             .0
            .lock()
            .unwrap()
            .push((order.order_id, "first-slow", ctx.attempt()));
        Ok(())
    }
}

/// Calls that finish behind a slow one (out of delivery order) are acked while it runs: the
/// worker neither waits for it to ack them nor spins. A first version looped forever without
/// awaiting once half the window was settled behind a running call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_settled_behind_a_slow_call_are_acked_while_it_runs() {
    let broker = TestBroker::new().await;
    let calls = Calls::default();
    let worker = worker(&broker, broker.connect("hexeract-tests-behind-slow").await)
        .register_handler_with::<OrderPlaced, _>(
            FirstSlow(calls.clone(), Duration::from_secs(3)),
            HandlerOptions::new().name("first-slow"),
        )
        .prefetch(4)
        .build()
        .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    let envelopes: Vec<Envelope> = (0..20)
        .map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap())
        .collect();
    publisher(&broker)
        .await
        .publish_all(&envelopes)
        .await
        .unwrap();
    // Three of the four first deliveries settle at once behind order 0, which takes 3 s; the
    // window moves on only if they are acked.
    calls.wait_for(10, Duration::from_secs(2)).await;
    assert!(
        !calls.all().iter().any(|(order, _, _)| *order == 0),
        "order 0 is still running"
    );
    calls.wait_for(20, Duration::from_secs(10)).await;
    let queue = running.topology.queue_for("first-slow");
    let topology = running.stop().await;
    assert_eq!(broker.ready(&queue).await, 0, "every call was acked");
    assert_eq!(calls.all().len(), 20, "each message once");
    broker.delete(&topology).await;
}

/// Records each call, after a pause.
struct Pausing(Calls, Duration);

impl Handler<OrderPlaced> for Pausing {
    type Error = String;
    async fn handle(&self, order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        self.0
             .0
            .lock()
            .unwrap()
            .push((order.order_id, "pausing", ctx.attempt()));
        tokio::time::sleep(self.1).await;
        Ok(())
    }
}

/// Eight messages (each with `properties`) for a handler with one permit; the worker stops
/// while the first call runs, so the other seven, waiting for the permit, are handed back; a
/// second worker then takes them. Returns every call and what the parking queue holds.
async fn hand_back_at_shutdown(
    name: &'static str,
    properties: impl Fn() -> BasicProperties,
) -> (Vec<Call>, u32) {
    let broker = TestBroker::new().await;
    let calls = Calls::default();
    let build = |connection, pause| {
        worker(&broker, connection)
            .register_handler_with::<OrderPlaced, _>(
                Pausing(calls.clone(), pause),
                HandlerOptions::new()
                    .name(name)
                    .concurrency(std::num::NonZeroU32::new(1).unwrap()),
            )
            .prefetch(8)
            .build()
            .unwrap()
    };
    let running = Running::start(build(
        broker.connect(&format!("hexeract-tests-{name}-1")).await,
        Duration::from_millis(300),
    ));
    declared(&broker, &running.topology).await;
    for n in 0..8u32 {
        broker
            .publish_raw(
                "test.OrderPlaced",
                format!("{{\"order_id\":{n}}}").as_bytes(),
                properties(),
            )
            .await;
    }
    // One call runs; the other seven wait for the handler's only permit.
    calls.wait_for(1, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let parking = running.topology.parking_queue_for(name);
    let _ = running.stop().await;
    assert_eq!(
        calls.all().len(),
        1,
        "the stopping worker started no other call"
    );

    let running = Running::start(build(
        broker.connect(&format!("hexeract-tests-{name}-2")).await,
        Duration::ZERO,
    ));
    calls.wait_for(8, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let topology = running.stop().await;
    let parked = broker.ready(&parking).await;
    broker.delete(&topology).await;
    let mut seen = calls.all();
    seen.sort();
    (seen, parked)
}

/// Deliveries a stopping worker holds but never started a call on go back uncharged (on
/// RabbitMQ < 4.3 a plain `nack` would count each one as an attempt), keeping the calls made
/// before: the next worker calls every message at attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_given_back_at_shutdown_are_not_charged_an_attempt() {
    // Each message was called once already (a failed call, retried): the next call is the
    // second.
    let (seen, _) = hand_back_at_shutdown("one_at_a_time", || {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(headers::ATTEMPTS.into(), AMQPValue::LongLongInt(1));
        BasicProperties::default()
            .with_message_id(Uuid::now_v7().to_string().as_str().into())
            .with_type("test.OrderPlaced".into())
            .with_content_type("application/json".into())
            .with_headers(headers)
    })
    .await;
    assert_eq!(
        seen,
        (0..8).map(|n| (n, "pausing", 2)).collect::<Vec<_>>(),
        "each message called once more, at attempt 2: the hand-back cost nothing"
    );
}

/// Issue 17, item 3: a delivery whose type comes from its routing key alone (no `type`
/// property), handed back at shutdown while it waited for its handler's permit, keeps its type:
/// the copy is handled by the next worker, not parked as `unknown_message_type`.
#[tokio::test]
async fn typeless_deliveries_given_back_at_shutdown_keep_their_type() {
    // Only the routing key says what it is.
    let (seen, parked) = hand_back_at_shutdown("typeless_one_at_a_time", || {
        BasicProperties::default()
            .with_message_id(Uuid::now_v7().to_string().as_str().into())
            .with_content_type("application/json".into())
    })
    .await;
    let orders: Vec<u32> = seen.into_iter().map(|(n, _, _)| n).collect();
    assert_eq!(
        orders,
        (0..8).collect::<Vec<_>>(),
        "every message handled once"
    );
    assert_eq!(parked, 0, "nothing parked as unknown_message_type");
}

/// A worker that would park messages with no row anywhere a person looks is refused at build,
/// naming both ways to build it.
#[tokio::test]
async fn build_requires_a_dead_letter_store_or_parking_without_rows() {
    let broker = TestBroker::new().await;
    let error = RabbitMqWorkerBuilder::new(broker.connection.clone())
        .registry(Registry::new())
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("dead_letters"), "{error}");
    assert!(error.contains(".park_without_rows()"), "{error}");
    let dir = hexeract_tests::temp::TempDir::new("rabbitmq-dead-letters");
    let store = hexeract::store::sqlite::SqliteStore::open(dir.path().join("dead.db"))
        .await
        .unwrap();
    RabbitMqWorkerBuilder::new(broker.connection.clone())
        .registry(Registry::new())
        .dead_letters(Arc::new(store))
        .build()
        .expect("with a store");
    RabbitMqWorkerBuilder::new(broker.connection.clone())
        .registry(Registry::new())
        .park_without_rows()
        .build()
        .expect("parking without rows, said so");
}

#[tokio::test]
async fn build_rejects_invalid_knobs_all_at_once() {
    let broker = TestBroker::new().await;
    let error = RabbitMqWorkerBuilder::new(broker.connection.clone())
        .registry(Registry::new())
        .prefetch(0)
        .max_attempts(0)
        .max_payload_bytes(0)
        .wait_tiers([])
        .dead_letter_routing_key("parked")
        .park_without_rows()
        .build()
        .unwrap_err()
        .to_string();
    for knob in [
        "prefetch",
        "max_attempts",
        "max_payload_bytes",
        "wait_tiers",
        "dead_letter_routing_key",
    ] {
        assert!(error.contains(knob), "{knob} missing from: {error}");
    }
    let error = RabbitMqWorkerBuilder::new(broker.connection.clone())
        .registry(Registry::new())
        .prefetch(70_000)
        .park_without_rows()
        .build()
        .unwrap_err()
        .to_string();
    assert!(error.contains("65535"), "{error}");
    let recovering = hexeract::rabbitmq::RabbitMqConnection::connect_recovering(
        &hexeract_tests::amqp::amqp_url(),
        &format!("{}.recovering", broker.prefix),
    )
    .await
    .unwrap();
    let error = RabbitMqWorkerBuilder::new(recovering.clone())
        .registry(Registry::new())
        .park_without_rows()
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("connection") && error.contains("automatic recovery"),
        "{error}"
    );
    recovering.close().await.unwrap();
}

/// Returns `HandlerOutcome::dead_letter` at once.
struct Reject;

impl Handler<OrderPlaced> for Reject {
    type Error = HandlerOutcome;
    async fn handle(&self, _order: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        Err(HandlerOutcome::dead_letter("sku_unknown", "no such SKU"))
    }
}

/// Issue 17, item 1: while `dead_letters` cannot take a row (here its table is renamed away),
/// nothing is parked or acked: the deliveries wait and try again, and once the table is back,
/// every message has exactly one row and one parked copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_parked_only_once_its_dead_letter_row_is_written() {
    const MESSAGES: u32 = 3;
    let broker = TestBroker::new().await;
    let schema = hexeract_tests::pg::TestSchema::new("hexeract-tests-dead-letter-row").await;
    let store: Arc<dyn hexeract::store::Store> = Arc::new(schema.migrated_store().await);
    let worker = worker(
        &broker,
        broker.connect("hexeract-tests-dead-letter-row").await,
    )
    .register_handler_with::<OrderPlaced, _>(Reject, HandlerOptions::new().name("reject_row"))
    .dead_letters(store.clone())
    .build()
    .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    let parking = running.topology.parking_queue_for("reject_row");
    let rename =
        |from: &str, to: &str| format!("ALTER TABLE \"{}\".{from} RENAME TO {to}", schema.schema);
    sqlx::query(&rename("dead_letters", "dead_letters_away"))
        .execute(&schema.pool)
        .await
        .unwrap();
    let publisher = publisher(&broker).await;
    let mut sent = Vec::new();
    for order_id in 0..MESSAGES {
        let envelope = Envelope::new(&OrderPlaced { order_id }).unwrap();
        sent.push(envelope.id);
        publisher.publish(&envelope).await.unwrap();
    }
    // Each delivery was called and dead-lettered, and its row refused: none is parked.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        broker.ready(&parking).await,
        0,
        "nothing parked while its row cannot be written"
    );
    sqlx::query(&rename("dead_letters_away", "dead_letters"))
        .execute(&schema.pool)
        .await
        .unwrap();
    let parked = broker
        .wait_for(&parking, MESSAGES as usize, Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let topology = running.stop().await;
    assert_eq!(parked.len(), MESSAGES as usize, "one parked copy each");
    let mut recorded: Vec<Uuid> = store
        .dead_letters(100)
        .await
        .unwrap()
        .into_iter()
        .map(|letter| letter.envelope.id)
        .collect();
    recorded.sort();
    sent.sort();
    assert_eq!(recorded, sent, "one row each, none missing, none twice");
    broker.delete(&topology).await;
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_outcome_parks_at_once_and_is_recorded_in_dead_letters() {
    let broker = TestBroker::new().await;
    let dir = std::env::temp_dir().join(format!("hexeract-amqp-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = hexeract::store::sqlite::SqliteStore::open(dir.join("dead.db"))
        .await
        .unwrap();
    hexeract::store::DeliveryStore::migrate(&store)
        .await
        .unwrap();
    let store = Arc::new(store);
    let worker = worker(&broker, broker.connect("hexeract-tests-reject").await)
        .register_handler_with::<OrderPlaced, _>(Reject, HandlerOptions::new().name("reject"))
        .dead_letters(store.clone())
        .build()
        .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    let envelope = Envelope::new(&OrderPlaced { order_id: 3 }).unwrap();
    publisher(&broker).await.publish(&envelope).await.unwrap();
    let parked = broker
        .wait_for(
            &running.topology.parking_queue_for("reject"),
            1,
            Duration::from_secs(10),
        )
        .await;
    let topology = running.stop().await;
    assert_eq!(text(header(&parked[0], headers::REASON)), "sku_unknown");

    let letters = hexeract::store::DeadLetterStore::dead_letters(&*store, 10)
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.envelope.id, envelope.id);
    assert_eq!(letter.envelope.payload, envelope.payload);
    assert_eq!(letter.reason.as_str(), "sku_unknown");
    assert_eq!(letter.detail, "no such SKU");
    assert_eq!(letter.handler.as_deref(), Some("reject"));
    assert_eq!(letter.attempts, 1);
    broker.delete(&topology).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_publish_during_a_reconnect_succeeds_and_mandatory_fails_when_unroutable() {
    let broker = TestBroker::new().await;
    let mut registry = Registry::new();
    registry
        .register::<OrderPlaced, _>(
            Record(Calls::default(), "x"),
            HandlerOptions::new().name("direct"),
        )
        .unwrap();
    let topology = Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone());
    topology.declare(&broker.connection).await.unwrap();
    let name = format!("{}.transport", broker.prefix);
    let transport = hexeract::rabbitmq::RabbitMqTransport::connect_named(
        &hexeract_tests::amqp::amqp_url(),
        &name,
        &broker.exchange,
    )
    .await
    .unwrap();
    transport
        .publish(&Envelope::new(&OrderPlaced { order_id: 1 }).unwrap())
        .await
        .unwrap();

    let closed =
        tokio::task::spawn_blocking(move || hexeract_tests::amqp::close_connections_named(&name))
            .await
            .unwrap();
    assert_eq!(closed, 1);
    // The connection is gone: this publish reconnects and is retried once.
    transport
        .publish(&Envelope::new(&OrderPlaced { order_id: 2 }).unwrap())
        .await
        .expect("the publish in the reconnect window went through");
    assert_eq!(
        transport.reconnects(),
        1,
        "it found the connection closed and reconnected"
    );
    assert_eq!(
        transport.recovered_by_lapin(),
        1,
        "lapin's automatic recovery brought the channel back"
    );
    let queue = topology.queue_for("direct");
    let arrived = broker.wait_for(&queue, 2, Duration::from_secs(10)).await;
    assert_eq!(arrived.len(), 2, "both publishes reached the queue");

    let unroutable = Envelope::from_raw("test.NobodyListens", &b"{}"[..]);
    let error = transport.publish_mandatory(&unroutable).await.unwrap_err();
    assert!(
        matches!(error, hexeract::rabbitmq::BusError::NotConfirmed { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("unroutable"), "{error}");
    // Without mandatory, an event nobody subscribes to is not an error.
    transport.publish(&unroutable).await.unwrap();
    broker.delete(&topology).await;
}

/// What a handler saw of one message: id, correlation and causation ids, `traceparent`,
/// attempt.
type Sight = (Uuid, Option<Uuid>, Option<Uuid>, Option<String>, u32);

/// Every sight.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Sight>>>);

struct Inspect(Seen);

impl Handler<OrderPlaced> for Inspect {
    type Error = String;
    async fn handle(&self, _order: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
        self.0 .0.lock().unwrap().push((
            ctx.message_id(),
            ctx.correlation_id(),
            ctx.causation_id(),
            ctx.header("traceparent").map(str::to_owned),
            ctx.attempt(),
        ));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_amqp_clients_following_the_wire_format_page_interoperate() {
    let broker = TestBroker::new().await;
    let seen = Seen::default();
    let worker = worker(&broker, broker.connect("hexeract-tests-wire").await)
        .register_handler_with::<OrderPlaced, _>(
            Inspect(seen.clone()),
            HandlerOptions::new().name("wire"),
        )
        .build()
        .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;

    // In: a producer that is not Hexeract, using only docs/wire-format.md.
    let correlation = Uuid::now_v7();
    let causation = Uuid::now_v7();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut table = lapin::types::FieldTable::default();
    table.insert(
        "x-causation-id".into(),
        AMQPValue::LongString(causation.to_string().as_str().into()),
    );
    table.insert(
        "traceparent".into(),
        AMQPValue::LongString(traceparent.into()),
    );
    let properties = BasicProperties::default()
        .with_message_id("order-42-placed".into())
        .with_type("test.OrderPlaced".into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_correlation_id(correlation.to_string().as_str().into())
        .with_headers(table);
    broker
        .publish_raw(
            "test.OrderPlaced",
            br#"{"order_id":42}"#,
            properties.clone(),
        )
        .await;
    // The same message id again is the same message to Hexeract (a stable derived UUID).
    broker
        .publish_raw("test.OrderPlaced", br#"{"order_id":42}"#, properties)
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.0.lock().unwrap().len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the handler got both deliveries"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let topology = running.stop().await;
    let calls = seen.0.lock().unwrap().clone();
    assert_eq!(calls[0].0, calls[1].0, "one message id for both deliveries");
    assert_eq!(calls[0].1, Some(correlation));
    assert_eq!(calls[0].2, Some(causation));
    assert_eq!(calls[0].3.as_deref(), Some(traceparent));
    assert_eq!(calls[0].4, 1);

    // Out: what a consumer that is not Hexeract finds on a message Hexeract published.
    let channel = broker.connection.lapin().create_channel().await.unwrap();
    let plain = format!("{}.plain", broker.prefix);
    channel
        .queue_declare(
            plain.as_str().into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            plain.as_str().into(),
            broker.exchange.as_str().into(),
            "test.OrderPlaced".into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let parent = Envelope::new(&OrderPlaced { order_id: 1 }).unwrap();
    let envelope = Envelope::new(&OrderPlaced { order_id: 2 })
        .unwrap()
        .caused_by(&parent)
        .with_header("traceparent", traceparent);
    publisher(&broker).await.publish(&envelope).await.unwrap();
    let got = broker.wait_for(&plain, 1, Duration::from_secs(10)).await;
    let delivery = &got[0].delivery;
    let properties = &delivery.properties;
    assert_eq!(delivery.routing_key.as_str(), "test.OrderPlaced");
    assert_eq!(
        properties.message_id().as_ref().unwrap().as_str(),
        envelope.id.to_string()
    );
    assert_eq!(
        properties.kind().as_ref().unwrap().as_str(),
        "test.OrderPlaced"
    );
    assert_eq!(
        properties.content_type().as_ref().unwrap().as_str(),
        "application/json"
    );
    assert_eq!(*properties.delivery_mode(), Some(2));
    assert_eq!(
        properties.correlation_id().as_ref().unwrap().as_str(),
        parent.id.to_string()
    );
    assert_eq!(
        text(header(&got[0], headers::CAUSATION_ID)),
        parent.id.to_string()
    );
    assert_eq!(text(header(&got[0], "traceparent")), traceparent);
    assert!(
        header(&got[0], headers::ATTEMPTS).is_none(),
        "a fresh message carries no attempts"
    );
    assert_eq!(delivery.data, envelope.payload.to_vec());
    let _ = channel
        .queue_delete(plain.as_str().into(), Default::default())
        .await;
    broker.delete(&topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_a_connection_error_when_its_connection_is_closed_and_ok_only_on_cancel() {
    let broker = TestBroker::new().await;
    let name = format!("{}.worker", broker.prefix);
    let calls = Calls::default();
    let health = Health::new();
    let worker = worker(&broker, broker.connect(&name).await)
        .register_handler_with::<OrderPlaced, _>(
            Record(calls, "x"),
            HandlerOptions::new().name("closed"),
        )
        .health(health.probe("bus worker"))
        .build()
        .unwrap();
    assert_eq!(health.readiness().components[0].status, Status::Starting);
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !health.readiness().ready {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ready once consuming: {}",
            health.readiness()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let closed =
        tokio::task::spawn_blocking(move || hexeract_tests::amqp::close_connections_named(&name))
            .await
            .unwrap();
    assert_eq!(closed, 1);
    let result = tokio::time::timeout(Duration::from_secs(20), running.task)
        .await
        .expect("run returns once its connection is gone")
        .unwrap();
    assert!(
        matches!(result, Err(hexeract::rabbitmq::BusError::Connection(_))),
        "{result:?}"
    );
    assert!(!running.cancel.is_cancelled());
    let readiness = health.readiness();
    assert!(!readiness.ready, "{readiness}");
    assert!(
        matches!(&readiness.components[0].status, Status::Failing { reason, .. } if reason.contains("consumer")),
        "{readiness}"
    );
    broker.delete(&running.topology).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_without_a_type_keeps_its_type_through_a_retry() {
    let broker = TestBroker::new().await;
    let calls = Calls::default();
    let worker = worker(&broker, broker.connect("hexeract-tests-untyped").await)
        .register_handler_with::<OrderPlaced, _>(
            FailFirst(calls.clone(), 1),
            HandlerOptions::new().name("untyped"),
        )
        .build()
        .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    // Only the routing key says what it is.
    broker
        .publish_raw(
            "test.OrderPlaced",
            br#"{"order_id":5}"#,
            BasicProperties::default().with_message_id(Uuid::now_v7().to_string().as_str().into()),
        )
        .await;
    calls.wait_for(2, Duration::from_secs(10)).await;
    let parking = running.topology.parking_queue_for("untyped");
    let topology = running.stop().await;
    assert_eq!(
        calls.all(),
        [(5, "flaky", 1), (5, "flaky", 2)],
        "failed, then handled on the retry"
    );
    assert_eq!(broker.ready(&parking).await, 0, "nothing parked");
    broker.delete(&topology).await;
}

#[tokio::test]
async fn connection_errors_never_show_the_password() {
    for url in [
        "amqp://app:s3cr/et@127.0.0.1:1/%2f",
        "amqp://app:s3cr/et@127.0.0.1:1/%2f?heartbeat=oops",
        "amqp://app:s3cr/et@[not a host/%2f",
    ] {
        let error = hexeract::rabbitmq::RabbitMqConnection::connect(url)
            .await
            .unwrap_err();
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains("s3cr"), "{url}: {shown}");
        assert!(shown.contains("app:***@"), "{url}: {shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_the_outbox_and_dead_letters_a_row_it_can_never_publish() {
    use hexeract::store::DeliveryStore;

    let broker = TestBroker::new().await;
    let mut registry = Registry::new();
    registry
        .register::<OrderPlaced, _>(
            Record(Calls::default(), "x"),
            HandlerOptions::new().name("relayed"),
        )
        .unwrap();
    let topology = Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone());
    topology.declare(&broker.connection).await.unwrap();
    let dir = std::env::temp_dir().join(format!("hexeract-relay-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = hexeract::store::sqlite::SqliteStore::open(dir.join("outbox.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    // The oldest row cannot be published (its type is no routing key); it must not hold back
    // the others.
    let poison = Envelope::from_raw("x".repeat(300), &b"{}"[..]);
    let mut rows = vec![poison.clone()];
    rows.extend((0..250).map(|n| Envelope::new(&OrderPlaced { order_id: n }).unwrap()));
    store.publish(rows).await.unwrap();
    let store = Arc::new(store);

    let health = Health::new();
    let relay = hexeract::rabbitmq::RabbitMqRelay::new(store.clone(), &broker.connection)
        .await
        .unwrap()
        .exchange(broker.exchange.clone())
        .batch_size(100)
        .poll_interval(Duration::from_millis(10))
        .health(health.probe("outbox relay"));
    assert!(!health.readiness().ready, "no pass yet");
    let cancel = CancellationToken::new();
    let running = tokio::spawn(relay.run(cancel.clone()));
    let queue = topology.queue_for("relayed");
    let arrived = broker.wait_for(&queue, 250, Duration::from_secs(20)).await;
    while store.backlog().await.unwrap() > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(health.readiness().ready, "{}", health.readiness());
    cancel.cancel();
    running.await.unwrap().unwrap();

    assert_eq!(arrived.len(), 250, "every good row was published once");
    let letters = store.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].envelope.id, poison.id);
    assert_eq!(letters[0].reason, hexeract::Reason::PAYLOAD_INVALID);
    assert!(
        letters[0].detail.contains("routing key"),
        "{}",
        letters[0].detail
    );
    broker.delete(&topology).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_parking_queue_is_declared_again_and_nothing_is_lost() {
    let broker = TestBroker::new().await;
    let calls = Calls::default();
    let worker = worker(&broker, broker.connect("hexeract-tests-reparking").await)
        .register_handler_with::<OrderPlaced, _>(
            Record(calls.clone(), "ok"),
            HandlerOptions::new().name("reparking"),
        )
        .prefetch(1)
        .build()
        .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    let parking = running.topology.parking_queue_for("reparking");
    // An operator deletes the parking queue while the worker runs.
    let channel = broker.connection.lapin().create_channel().await.unwrap();
    channel
        .queue_delete(parking.as_str().into(), Default::default())
        .await
        .unwrap();
    let json = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_type("test.OrderPlaced".into());
    broker
        .publish_raw(
            "test.OrderPlaced",
            b"{broken",
            json.clone().with_message_id("broken".into()),
        )
        .await;
    broker
        .publish_raw(
            "test.OrderPlaced",
            br#"{"order_id":8}"#,
            json.with_message_id(Uuid::now_v7().to_string().as_str().into()),
        )
        .await;
    let parked = broker.wait_for(&parking, 1, Duration::from_secs(10)).await;
    calls.wait_for(1, Duration::from_secs(10)).await;
    let topology = running.stop().await;
    assert_eq!(text(header(&parked[0], headers::REASON)), "payload_invalid");
    assert_eq!(
        parked[0].data, b"{broken",
        "parked with its body as it came"
    );
    assert_eq!(
        calls.all(),
        [(8, "ok", 1)],
        "the message behind it was not held back"
    );
    broker.delete(&topology).await;
}

/// The test broker's URL taken apart: its address, and what goes between `://` and the host
/// (credentials) and after the port (vhost).
async fn broker_parts() -> (std::net::SocketAddr, String, String) {
    let url = hexeract_tests::amqp::amqp_url();
    let rest = url.split_once("://").expect("a URL").1;
    let (credentials, rest) = rest.rsplit_once('@').unwrap_or(("guest:guest", rest));
    let (authority, vhost) = rest.split_once('/').unwrap_or((rest, "%2f"));
    let authority = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:5672")
    };
    let address = tokio::net::lookup_host(&authority)
        .await
        .expect("the broker's address")
        .next()
        .expect("an address");
    (address, credentials.to_owned(), vhost.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca_in_cacertfile_consumes_and_publishes_and_an_unknown_ca_is_refused()
{
    let broker = TestBroker::new().await;
    let (upstream, credentials, vhost) = broker_parts().await;
    let proxy = hexeract_tests::tls::TlsProxy::start(upstream).await;
    let plain = format!("amqps://{credentials}@localhost:{}/{vhost}", proxy.port);

    // The proxy's certificate is from a CA nobody trusts by default: refused, and said so.
    let error = hexeract::rabbitmq::RabbitMqConnection::connect_named(&plain, "untrusted")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("UnknownIssuer") && error.contains("cacertfile"),
        "{error}"
    );
    assert!(!error.contains("guest:guest"), "no password in: {error}");
    // A cacertfile that cannot be read is named in the error.
    let missing = format!("{plain}?cacertfile=/nonexistent/ca.pem");
    let error = hexeract::rabbitmq::RabbitMqConnection::connect_named(&missing, "missing")
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("/nonexistent/ca.pem"), "{error}");

    let ca = proxy.ca_file.to_str().expect("a UTF-8 temp path");
    let url = format!("{plain}?heartbeat=10&cacertfile={ca}");
    let calls = Calls::default();
    let connection = hexeract::rabbitmq::RabbitMqConnection::connect_named(
        &url,
        &format!("{}.tls-consumer", broker.prefix),
    )
    .await
    .expect("trusted through cacertfile");
    let worker = worker(&broker, connection)
        .register_handler_with::<OrderPlaced, _>(
            Record(calls.clone(), "tls"),
            HandlerOptions::new().name("tls"),
        )
        .build()
        .unwrap();
    let running = Running::start(worker);
    declared(&broker, &running.topology).await;
    let transport = hexeract::rabbitmq::RabbitMqTransport::connect_named(
        &url,
        &format!("{}.tls-publisher", broker.prefix),
        &broker.exchange,
    )
    .await
    .expect("the transport connects over TLS too");
    for order_id in 0..20 {
        transport
            .publish_mandatory(&Envelope::new(&OrderPlaced { order_id }).unwrap())
            .await
            .unwrap();
    }
    calls.wait_for(20, Duration::from_secs(10)).await;
    let topology = running.stop().await;
    assert_eq!(calls.all().len(), 20, "each message handled once");
    assert!(
        proxy.sessions.load(Ordering::SeqCst) >= 2,
        "consumer and publisher both went through the TLS proxy"
    );
    broker.delete(&topology).await;
}

/// Counts its calls and acks.
struct Counted(Arc<AtomicU32>);

impl Handler<OrderPlaced> for Counted {
    type Error = std::convert::Infallible;
    async fn handle(&self, _order: OrderPlaced, _ctx: &Context) -> Result<(), Self::Error> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Issue 17, item 2: messages the broker has already returned as often as the queue's
/// `x-delivery-limit` allows (here by a plain client that nacks them, as crashed consumers
/// would return them) are parked by the worker with a row and a reason of their own, before one
/// more return would have the broker park them with neither; their handler is not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_at_the_delivery_limit_is_parked_with_its_row_before_the_broker_parks_it() {
    const MESSAGES: usize = 5;
    const LIMIT: u32 = 3;
    let broker = TestBroker::new().await;
    let schema = hexeract_tests::pg::TestSchema::new("hexeract-tests-delivery-limit").await;
    let store: Arc<dyn hexeract::store::Store> = Arc::new(schema.migrated_store().await);
    let calls = Arc::new(AtomicU32::new(0));
    let worker = worker(
        &broker,
        broker.connect("hexeract-tests-delivery-limit").await,
    )
    .register_handler_with::<OrderPlaced, _>(
        Counted(calls.clone()),
        HandlerOptions::new().name("limited"),
    )
    .max_attempts(50)
    .delivery_limit(LIMIT)
    .dead_letters(store.clone())
    .build()
    .unwrap();
    worker.topology().declare(&broker.connection).await.unwrap();
    let queue = worker.topology().queue_for("limited");
    let parking = worker.topology().parking_queue_for("limited");
    let publisher = publisher(&broker).await;
    let mut sent = Vec::new();
    for order_id in 0..MESSAGES as u32 {
        let envelope = Envelope::new(&OrderPlaced { order_id }).unwrap();
        sent.push(envelope.id);
        publisher.publish(&envelope).await.unwrap();
    }
    // LIMIT rounds: take every message, then give them all back, as consumers that crashed
    // with them would. Each return counts one more delivery in `x-delivery-count`.
    let channel = broker.connection.lapin().create_channel().await.unwrap();
    for round in 0..LIMIT {
        let mut taken = Vec::new();
        while taken.len() < MESSAGES {
            match channel
                .basic_get(
                    queue.as_str().into(),
                    lapin::options::BasicGetOptions { no_ack: false },
                )
                .await
                .unwrap()
            {
                Some(message) => taken.push(message),
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        for message in taken {
            message
                .delivery
                .acker
                .nack(lapin::options::BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        assert_eq!(
            broker.ready(&parking).await,
            0,
            "round {round}: the broker parked nothing yet"
        );
    }
    let _ = channel.close(200, "done".into()).await;

    let running = Running::start(worker);
    let parked = broker
        .wait_for(&parking, MESSAGES, Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let topology = running.stop().await;
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no call was made");
    assert_eq!(parked.len(), MESSAGES, "one parked copy each");
    for message in &parked {
        assert_eq!(
            text(header(message, headers::REASON)),
            "delivery_limit_reached"
        );
    }
    let letters = store.dead_letters(100).await.unwrap();
    let mut recorded: Vec<Uuid> = letters.iter().map(|letter| letter.envelope.id).collect();
    recorded.sort();
    sent.sort();
    println!(
        "delivery_limit: sent={MESSAGES} parked={} rows={} lost={}",
        parked.len(),
        letters.len(),
        sent.iter().filter(|id| !recorded.contains(id)).count()
    );
    assert_eq!(recorded, sent, "one row each, none missing, none twice");
    for letter in &letters {
        assert_eq!(letter.reason.as_str(), "delivery_limit_reached");
        assert!(
            letter
                .detail
                .contains(&format!("delivered it {} times", LIMIT + 1)),
            "{}",
            letter.detail
        );
        assert_eq!(letter.handler.as_deref(), Some("limited"));
    }
    broker.delete(&topology).await;
    schema.drop_schema().await;
}

/// A delivery that cannot be read, in a queue of several types the application manages
/// (`queue(…)`), is dead-lettered with the handler of the type it claims: its row and its
/// parked copy name the handler a person looks for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_delivery_in_a_shared_queue_names_the_handler_of_its_type() {
    use hexeract::rabbitmq::{ensure_topology, Queue, QueueKind};
    let broker = TestBroker::new().await;
    let queue = format!("{}.shared", broker.prefix);
    ensure_topology(
        &broker.connection,
        &[],
        &[Queue {
            kind: QueueKind::Quorum,
            ..Queue::classic(queue.clone())
        }],
        &[],
    )
    .await
    .unwrap();
    let dir = hexeract_tests::temp::TempDir::new("rabbitmq-shared-unreadable");
    let store = hexeract::store::sqlite::SqliteStore::open(dir.path().join("dead.db"))
        .await
        .unwrap();
    hexeract::store::DeliveryStore::migrate(&store)
        .await
        .unwrap();
    let store = Arc::new(store);
    let worker = worker(&broker, broker.connect("hexeract-tests-shared").await)
        .queue(queue.clone())
        .register_handler_with::<OrderPlaced, _>(
            Record(Calls::default(), "shared"),
            HandlerOptions::new().name("shared_orders"),
        )
        .dead_letters(store.clone())
        .build()
        .unwrap();
    let running = Running::start(worker);
    // No message_id: it cannot be told apart from its redeliveries, so it is not read.
    broker
        .publish_to(
            "",
            &queue,
            b"{\"order_id\":7}",
            BasicProperties::default()
                .with_type("test.OrderPlaced".into())
                .with_content_type("application/json".into()),
        )
        .await;
    let parked = broker
        .wait_for(&format!("{queue}.parked"), 1, Duration::from_secs(10))
        .await;
    let topology = running.stop().await;
    let letters = DeadLetterStore::dead_letters(&*store, 10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].reason.as_str(), "message_id_missing");
    assert_eq!(
        letters[0].handler.as_deref(),
        Some("shared_orders"),
        "the row names the handler of the type the delivery claims"
    );
    assert_eq!(
        text(header(&parked[0], headers::HANDLER)),
        "shared_orders",
        "so does the parked copy"
    );
    broker.delete(&topology).await;
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
}
