//! The queues' layout on a real broker: every queue quorum, dead-lettering at least once, and
//! queues of the layout before that moved to it with their messages.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). Each
//! test declares its own exchange and queues (a prefix of its own) and deletes them at the end.

use std::collections::BTreeSet;
use std::time::Duration;

use hexeract::rabbitmq::{
    ensure_topology, holding_queue, Overflow, Queue, QueueKind, RabbitMqWorkerBuilder, Topology,
};
use hexeract::{CancellationToken, Context, HandlerOptions, HandlerOutcome, Message, Registry};
use hexeract_tests::amqp::TestBroker;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.LayoutOrder")]
struct LayoutOrder {
    order_id: u32,
}

/// Dead-letters every message at once.
struct Refuse;

impl hexeract::Handler<LayoutOrder> for Refuse {
    type Error = HandlerOutcome;
    async fn handle(&self, _order: LayoutOrder, _ctx: &Context) -> Result<(), Self::Error> {
        Err(HandlerOutcome::dead_letter("refused", "never"))
    }
}

fn topology(broker: &TestBroker, tiers: &[Duration]) -> Topology {
    let mut registry = Registry::new();
    registry
        .register::<LayoutOrder, _>(Refuse, HandlerOptions::new().name("shop::reserve"))
        .unwrap();
    Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .wait_tiers(tiers.iter().copied())
}

/// The queues exactly as Hexeract declared them before they all became quorum queues: handler
/// queues quorum without a dead-letter strategy or overflow, parking and wait queues classic.
fn old_layout(topology: &Topology) -> Vec<Queue> {
    let queue = topology.queue_for("shop::reserve");
    let parking = topology.parking_queue_for("shop::reserve");
    let mut queues = vec![
        Queue {
            kind: QueueKind::Quorum,
            dead_letter_exchange: Some(String::new()),
            dead_letter_routing_key: Some(parking.clone()),
            delivery_limit: Some(hexeract::rabbitmq::DEFAULT_DELIVERY_LIMIT),
            ..Queue::classic(queue)
        },
        Queue::classic(parking),
    ];
    queues.extend(topology.tiers().iter().map(|tier| Queue {
        message_ttl: Some(*tier),
        dead_letter_exchange: Some(String::new()),
        ..Queue::classic(topology.wait_queue(*tier))
    }));
    queues
}

fn properties(id: &str, with_type: bool) -> BasicProperties {
    let properties = BasicProperties::default()
        .with_message_id(ShortString::from(id.to_owned()))
        .with_delivery_mode(2);
    if with_type {
        properties.with_type("test.LayoutOrder".into())
    } else {
        properties
    }
}

fn ids(messages: &[lapin::message::BasicGetMessage]) -> BTreeSet<String> {
    messages
        .iter()
        .map(|message| {
            message
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default()
        })
        .collect()
}

/// Whether `queue` exists with exactly `layout`'s arguments (a declare with them succeeds).
async fn has_layout(broker: &TestBroker, layout: &Queue) -> bool {
    ensure_topology(&broker.connection, &[], std::slice::from_ref(layout), &[])
        .await
        .is_ok()
}

#[tokio::test]
async fn queues_of_the_old_layout_move_to_the_new_one_with_every_message() {
    let broker = TestBroker::new().await;
    let tiers = [Duration::from_secs(120), Duration::from_secs(240)];
    let topology = topology(&broker, &tiers);
    let queue = topology.queue_for("shop::reserve");
    let parking = topology.parking_queue_for("shop::reserve");
    ensure_topology(
        &broker.connection,
        &topology.exchanges(),
        &old_layout(&topology),
        &topology.bindings(),
    )
    .await
    .unwrap();
    // The new layout is refused as long as the old queues exist.
    let new_queues = topology.queues();
    assert!(!has_layout(&broker, &new_queues[0]).await);

    const QUEUED: usize = 300;
    const PARKED: usize = 40;
    const WAITING: usize = 25;
    let mut sent = BTreeSet::new();
    for n in 0..QUEUED {
        let id = format!("queued-{n}");
        // Every tenth as a producer not written with Hexeract: no `type`, only the routing key.
        broker
            .publish_raw(
                "test.LayoutOrder",
                b"{\"order_id\":1}",
                properties(&id, n % 10 != 0),
            )
            .await;
        sent.insert(id);
    }
    for n in 0..PARKED {
        let id = format!("parked-{n}");
        broker
            .publish_to("", &parking, b"{\"order_id\":2}", properties(&id, true))
            .await;
        sent.insert(id);
    }
    for tier in topology.tiers() {
        let wait = topology.wait_queue(*tier);
        for n in 0..WAITING {
            let id = format!("{wait}-{n}");
            // As a retry is: through the tier's exchange, by the handler queue's name.
            broker
                .publish_to(&wait, &queue, b"{\"order_id\":3}", properties(&id, true))
                .await;
            sent.insert(id);
        }
    }

    // What every start does: declare, moving what exists with another layout.
    topology.declare(&broker.connection).await.unwrap();

    for layout in &new_queues {
        assert!(
            has_layout(&broker, layout).await,
            "{} is in its new layout",
            layout.name
        );
        assert_eq!(broker.consumers(&holding_queue(&layout.name)).await, None);
    }
    let in_queue = broker.drain(&queue).await;
    let in_parking = broker.drain(&parking).await;
    let mut found = ids(&in_queue);
    found.extend(ids(&in_parking));
    for tier in topology.tiers() {
        let waiting = broker.drain(&topology.wait_queue(*tier)).await;
        assert_eq!(
            waiting.len(),
            WAITING,
            "every retry still waits in its tier"
        );
        for message in &waiting {
            // The routing key is what brings a retry back to its queue when the tier's delay
            // is over: it must survive the move.
            assert_eq!(message.delivery.routing_key.as_str(), queue);
        }
        found.extend(ids(&waiting));
    }
    let lost: Vec<_> = sent.difference(&found).collect();
    assert!(lost.is_empty(), "lost in the migration: {lost:?}");
    assert_eq!(
        in_queue.len(),
        QUEUED,
        "nothing duplicated when nothing crashed"
    );
    assert_eq!(in_parking.len(), PARKED);
    // A message that had its type from the exchange's routing key keeps it as its `type`.
    assert!(in_queue.iter().all(|message| message
        .delivery
        .properties
        .kind()
        .as_ref()
        .is_some_and(|kind| kind.as_str() == "test.LayoutOrder")));
    eprintln!(
        "queue migration: sent {}, found {} after the move, lost {}",
        sent.len(),
        found.len(),
        lost.len()
    );
    broker.delete(&topology).await;
}

/// Broker errors lapin logged, as `target: fields`.
#[derive(Clone, Default)]
struct LapinErrors(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LapinErrors {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let metadata = event.metadata();
        if *metadata.level() == tracing::Level::ERROR && metadata.target().starts_with("lapin") {
            struct Fields(String);
            impl tracing::field::Visit for Fields {
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    self.0.push_str(&format!(" {}={value:?}", field.name()));
                }
            }
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0
                .lock()
                .unwrap()
                .push(format!("{}:{}", metadata.target(), fields.0));
        }
    }
}

#[tokio::test]
async fn a_start_with_nothing_to_migrate_makes_the_broker_close_no_channel() {
    // Each passive declare of a missing queue is answered by closing its channel, and lapin
    // logs every such close as an error: a start that looked for a holding queue beside each of
    // its queues logged one per queue (here 4: the handler's, its parking queue, two tiers).
    use tracing_subscriber::layer::SubscriberExt;
    let errors = LapinErrors::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(errors.clone()))
        .unwrap();
    let broker = TestBroker::new().await;
    let topology = topology(&broker, &[Duration::from_secs(1), Duration::from_secs(2)]);

    topology.declare(&broker.connection).await.unwrap(); // the first start declares
    topology.declare(&broker.connection).await.unwrap(); // a restart finds them

    let parking = topology.parking_queue_for("shop::reserve");
    assert_eq!(
        broker.consumers(&parking).await,
        Some(0),
        "the topology was declared"
    );
    // Only this test's queues: under `cargo test` other tests of this binary share the
    // subscriber, and some look for missing queues on purpose.
    let ours: Vec<String> = errors
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|error| error.contains(&broker.prefix))
        .cloned()
        .collect();
    assert_eq!(
        ours,
        Vec::<String>::new(),
        "lapin logged these errors while the topology was declared"
    );
    broker.delete(&topology).await;
}

#[tokio::test]
async fn a_migration_a_crash_interrupted_is_finished_at_the_next_declare() {
    let broker = TestBroker::new().await;
    let topology = topology(&broker, &[Duration::from_secs(120)]);
    ensure_topology(&broker.connection, &topology.exchanges(), &[], &[])
        .await
        .unwrap();
    // The state a crash right after deleting the old parking queue leaves: its messages in
    // the holding queue, the queue itself gone.
    let parking = topology.parking_queue_for("shop::reserve");
    let holding = holding_queue(&parking);
    ensure_topology(
        &broker.connection,
        &[],
        &[Queue::quorum(holding.clone())],
        &[],
    )
    .await
    .unwrap();
    for n in 0..20 {
        broker
            .publish_to("", &holding, b"{}", properties(&format!("held-{n}"), true))
            .await;
    }
    // And the migration's record in the topology's journal, written before the holding queue
    // was declared.
    let journal = topology.migration_journal();
    ensure_topology(
        &broker.connection,
        &[],
        &[Queue::quorum(journal.clone())],
        &[],
    )
    .await
    .unwrap();
    broker
        .publish_to("", &journal, parking.as_bytes(), BasicProperties::default())
        .await;
    broker.wait_until_ready(&journal, 1).await; // the crash was a while ago

    topology.declare(&broker.connection).await.unwrap();

    assert_eq!(
        broker.consumers(&holding).await,
        None,
        "the holding queue is gone"
    );
    let parked = broker.drain(&parking).await;
    assert_eq!(parked.len(), 20);
    assert_eq!(
        broker.ready(&journal).await,
        0,
        "the record is cleared once the move ends"
    );
    broker.delete(&topology).await;
}

#[tokio::test]
async fn a_record_a_finished_migration_left_is_cleared_at_the_next_declare() {
    // A crash after the holding queue was deleted, before the record was: nothing to move, and
    // a record left in the journal would make every start look for holding queues.
    let broker = TestBroker::new().await;
    let topology = topology(&broker, &[Duration::from_secs(120)]);
    topology.declare(&broker.connection).await.unwrap();
    let journal = topology.migration_journal();
    let queue = topology.queue_for("shop::reserve");
    broker
        .publish_to("", &journal, queue.as_bytes(), BasicProperties::default())
        .await;
    broker
        .publish_to("", &journal, queue.as_bytes(), BasicProperties::default())
        .await;
    broker.wait_until_ready(&journal, 2).await; // the crash was a while ago

    topology.declare(&broker.connection).await.unwrap();

    assert_eq!(broker.ready(&journal).await, 0, "both records are cleared");
    assert_eq!(broker.consumers(&holding_queue(&queue)).await, None);
    broker.delete(&topology).await;
}

#[tokio::test]
async fn a_queue_still_consumed_is_not_migrated() {
    let broker = TestBroker::new().await;
    let topology = topology(&broker, &[Duration::from_secs(120)]);
    ensure_topology(
        &broker.connection,
        &topology.exchanges(),
        &old_layout(&topology),
        &topology.bindings(),
    )
    .await
    .unwrap();
    let queue = topology.queue_for("shop::reserve");
    broker
        .publish_raw("test.LayoutOrder", b"{}", properties("consumed", true))
        .await;
    // An older version, still consuming the queue.
    let channel = broker.connection.lapin().create_channel().await.unwrap();
    channel
        .basic_qos(1, lapin::options::BasicQosOptions::default())
        .await
        .unwrap();
    let _consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "older-version".into(),
            lapin::options::BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    let error = topology.declare(&broker.connection).await.unwrap_err();
    assert!(error.to_string().contains("consumer"), "{error}");
    let _ = channel.close(200, "done".into()).await;
    // The consumer's unacked delivery went back to the queue it was never taken out of.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        ids(&broker.drain(&queue).await),
        BTreeSet::from(["consumed".to_owned()])
    );
    topology.declare(&broker.connection).await.unwrap();
    broker.delete(&topology).await;
}

/// Publishes fillers straight into `queue` until it refuses one (`basic.nack`); how many it
/// took. A quorum queue checks its `x-max-length` after an enqueue, so it may take one more.
async fn fill(broker: &TestBroker, queue: &str) -> usize {
    let channel = broker.connection.lapin().create_channel().await.unwrap();
    channel
        .confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .unwrap();
    for taken in 0..10 {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                lapin::options::BasicPublishOptions::default(),
                b"{}",
                properties(&format!("filler-{taken}"), true),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        if confirm.is_nack() {
            let _ = channel.close(200, "done".into()).await;
            return taken;
        }
    }
    panic!("{queue} took 10 messages: it is not bounded");
}

/// Messages `queue` holds, ready or not, from `rabbitmqctl`.
fn held(queue: &str) -> u64 {
    let listed = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_queues", "name", "messages"])
        .output()
        .expect("rabbitmqctl runs");
    let text = String::from_utf8_lossy(&listed.stdout);
    text.lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.first() == Some(&queue))
        .map(|fields| {
            fields[1..]
                .iter()
                .filter_map(|field| field.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or_else(|| panic!("no queue {queue} in: {text}"))
}

#[tokio::test]
async fn a_retry_whose_queue_is_full_stays_in_its_wait_tier() {
    let broker = TestBroker::new().await;
    let tier = Duration::from_millis(200);
    let topology = topology(&broker, &[tier]);
    topology.declare(&broker.connection).await.unwrap();
    // A handler queue of one's own that refuses once full.
    let full = format!("{}.full", broker.prefix);
    let bounded = Queue {
        max_length: Some(1),
        overflow: Some(Overflow::RejectPublish),
        ..Queue::quorum(full.clone())
    };
    ensure_topology(&broker.connection, &[], &[bounded], &[])
        .await
        .unwrap();
    let fillers = fill(&broker, &full).await;
    let wait = topology.wait_queue(tier);
    broker
        .publish_to(&wait, &full, b"{}", properties("retry", true))
        .await;

    // Many times the tier's delay: the broker has tried to dead-letter it and been refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // `rabbitmqctl` shows a quorum queue's counts as of its last statistics (every 5 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        held(&wait),
        1,
        "the retry is kept in its wait tier, not dropped"
    );
    assert_eq!(held(&full), fillers as u64);

    // Once there is room the broker tries again, on its own schedule (here about three
    // minutes later: its dead-letter worker's retry interval), too slow to wait for here.
    let channel = broker.connection.lapin().create_channel().await.unwrap();
    let _ = channel
        .queue_delete(full.as_str().into(), Default::default())
        .await;
    broker.delete(&topology).await;
}

#[tokio::test]
async fn a_park_a_full_parking_queue_refuses_leaves_the_message_in_its_queue() {
    let broker = TestBroker::new().await;
    let mut registry = Registry::new();
    registry
        .register::<LayoutOrder, _>(Refuse, HandlerOptions::new().name("shop::reserve"))
        .unwrap();
    let connection = broker.connect(&format!("{}.worker", broker.prefix)).await;
    let worker = RabbitMqWorkerBuilder::new(connection)
        .registry(registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .parking_max_length(1)
        .park_without_rows()
        .build()
        .unwrap();
    let topology = worker.topology().clone();
    topology.declare(&broker.connection).await.unwrap();
    let queue = topology.queue_for("shop::reserve");
    let parking = topology.parking_queue_for("shop::reserve");
    let fillers = fill(&broker, &parking).await;
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let mut headers = FieldTable::default();
    headers.insert("x-test".into(), AMQPValue::Boolean(true));
    broker
        .publish_raw(
            "test.LayoutOrder",
            b"{\"order_id\":9}",
            properties("refused", true).with_headers(headers),
        )
        .await;

    // Parked at its first call; the park is nacked, so it goes back to its queue, again and
    // again, and is never acked away. (`rabbitmqctl` shows a quorum queue's counts as of its
    // last statistics, every 5 s.)
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(
        held(&parking),
        fillers as u64,
        "the full parking queue took nothing"
    );
    assert_eq!(held(&queue), 1, "the message is still in its queue");
    cancel.cancel();
    running.await.unwrap().unwrap();

    // Room again: the next worker parks it.
    assert_eq!(broker.drain(&parking).await.len(), fillers);
    let mut registry = Registry::new();
    registry
        .register::<LayoutOrder, _>(Refuse, HandlerOptions::new().name("shop::reserve"))
        .unwrap();
    let connection = broker.connect(&format!("{}.worker2", broker.prefix)).await;
    let worker = RabbitMqWorkerBuilder::new(connection)
        .registry(registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .parking_max_length(1)
        .park_without_rows()
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let parked = broker.wait_for(&parking, 1, Duration::from_secs(20)).await;
    assert_eq!(ids(&parked), BTreeSet::from(["refused".to_owned()]));
    cancel.cancel();
    running.await.unwrap().unwrap();
    broker.delete(&topology).await;
}

/// `queues upgrade`: the command moves the program's queues of the old layout (here its wait
/// tiers: this test binary has no `#[handler]`), says what it moved, and a second run moves
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queues_upgrade_command_moves_the_program_s_queues() {
    let broker = TestBroker::new().await;
    let (dir, _port) =
        hexeract_tests::amqp::run_env(&broker, &hexeract_tests::amqp::amqp_url(), 50);
    // The wait tiers `run` declares by default, as classic queues.
    let tiers = hexeract::rabbitmq::DEFAULT_WAIT_TIERS;
    let topology = Topology::from_registry(&Registry::new())
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .wait_tiers(tiers);
    let mut old = old_layout(&topology);
    old.retain(|queue| queue.message_ttl.is_some());
    ensure_topology(
        &broker.connection,
        &topology.exchanges(),
        &old,
        &topology.bindings(),
    )
    .await
    .unwrap();
    let wait = topology.wait_queue(tiers[9]);
    for n in 0..10 {
        broker
            .publish_to(
                &wait,
                "somewhere",
                b"{}",
                properties(&format!("w-{n}"), true),
            )
            .await;
    }

    let args = |words: &[&str]| {
        words
            .iter()
            .map(|word| (*word).to_owned())
            .collect::<Vec<_>>()
    };
    let mut out = String::new();
    hexeract::cli::execute(&args(&["queues", "upgrade"]), &mut out)
        .await
        .unwrap_or_else(|error| panic!("{error:?}"));
    assert!(
        out.contains(&format!("{wait}: 10 message(s) moved out, 10 back")),
        "{out}"
    );
    assert!(out.contains("10 queue(s) moved"), "{out}");
    let mut again = String::new();
    hexeract::cli::execute(&args(&["queues", "upgrade"]), &mut again)
        .await
        .unwrap_or_else(|error| panic!("{error:?}"));
    assert!(again.contains("0 queue(s) moved"), "{again}");
    assert_eq!(broker.drain(&wait).await.len(), 10);
    broker.delete(&topology).await;
    let _ = std::fs::remove_dir_all(dir);
}
