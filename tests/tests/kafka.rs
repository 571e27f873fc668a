//! The Kafka transport against a real broker (`TEST_KAFKA_BROKERS`, default `127.0.0.1:9092`,
//! which `.ci/run` starts) and PostgreSQL (`TEST_DATABASE_URL`): the relay's order across
//! relays, per-aggregate order across partitions and consumers, a retry that holds back only its
//! own partition, restarts and rebalances that lose nothing, and records that cannot be read
//! ending in `dead_letters`.
//!
//! Each test has its own topic prefix (so its own topics and consumer groups) and its own
//! schema.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hexeract::kafka::{KafkaRelay, KafkaWorker};
use hexeract::store::Store;
use hexeract::{
    CancellationToken, Context, Envelope, Error, Handler, HandlerOptions, HandlerOutcome, Message,
    Reason,
};
use hexeract_tests::kafka::TestKafka;
use hexeract_tests::pg::TestSchema;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "kafka.test.Step", aggregate = "account")]
struct Step {
    #[message(key)]
    account: String,
    seq: u32,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "kafka.test.Closed", aggregate = "account")]
struct Closed {
    #[message(key)]
    account: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "kafka.test.Ping")]
struct Ping {
    n: u32,
}

/// One handler call: which consumer instance, which record, when.
#[derive(Clone, Debug)]
struct Seen {
    instance: u32,
    account: String,
    seq: u32,
    attempt: u32,
    at: Instant,
}

/// Records every call; fails the calls `fail` says to fail.
#[derive(Clone)]
struct Recorder {
    instance: u32,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// `(account, seq)` → calls that fail before one succeeds.
    fail: Arc<HashMap<(String, u32), u32>>,
    /// Time each call takes.
    pause: Duration,
}

impl Recorder {
    fn new(instance: u32, seen: &Arc<Mutex<Vec<Seen>>>) -> Recorder {
        Recorder {
            instance,
            seen: seen.clone(),
            fail: Arc::default(),
            pause: Duration::ZERO,
        }
    }
}

impl Handler<Step> for Recorder {
    type Error = HandlerOutcome;
    async fn handle(&self, step: Step, ctx: &Context) -> Result<(), HandlerOutcome> {
        if !self.pause.is_zero() {
            tokio::time::sleep(self.pause).await;
        }
        let attempt = ctx.envelope().attempt;
        self.seen.lock().unwrap().push(Seen {
            instance: self.instance,
            account: step.account.clone(),
            seq: step.seq,
            attempt,
            at: Instant::now(),
        });
        match self.fail.get(&(step.account, step.seq)) {
            Some(failures) if attempt <= *failures => {
                HandlerOutcome::retry("the test fails this call")
            }
            _ => HandlerOutcome::Ack,
        }
        .into_result()
    }
}

const HANDLER: &str = "kafka_test.steps";

fn worker(
    kafka: &TestKafka,
    partitions: i32,
    store: Arc<dyn Store>,
    recorder: Recorder,
) -> KafkaWorker {
    KafkaWorker::builder(kafka.config(partitions), store)
        .register_handler_with::<Step, _>(recorder, HandlerOptions::new().name(HANDLER))
        .retry_delays(Duration::from_millis(200), Duration::from_secs(2))
        .check_interval(Duration::from_millis(500))
        .build()
        .expect("a valid worker")
}

fn start_worker(worker: KafkaWorker) -> (CancellationToken, JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let run = tokio::spawn({
        let cancel = cancel.clone();
        async move { worker.run(cancel).await.expect("the worker runs") }
    });
    (cancel, run)
}

fn start_relay(
    kafka: &TestKafka,
    partitions: i32,
    store: Arc<dyn Store>,
    batch_size: u32,
) -> (CancellationToken, JoinHandle<()>) {
    let relay = KafkaRelay::new(store, &kafka.config(partitions))
        .expect("a relay")
        .batch_size(batch_size)
        .poll_interval(Duration::from_millis(50));
    let cancel = CancellationToken::new();
    let run = tokio::spawn({
        let cancel = cancel.clone();
        async move { relay.run(cancel).await.expect("the relay runs") }
    });
    (cancel, run)
}

/// `steps` steps of each of `accounts` accounts, interleaved (step 0 of every account, then
/// step 1, …), written to the outbox.
async fn enqueue_steps(store: &dyn Store, accounts: u32, steps: u32) -> Vec<Envelope> {
    let mut envelopes = Vec::new();
    for seq in 0..steps {
        for account in 0..accounts {
            envelopes.push(
                Envelope::new(&Step {
                    account: format!("acct-{account}"),
                    seq,
                })
                .unwrap(),
            );
        }
    }
    for chunk in envelopes.chunks(500) {
        store.publish(chunk.to_vec()).await.expect("outbox writes");
    }
    envelopes
}

/// Waits until `done` holds, failing with `what` after `limit`.
async fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the relays emptied the outbox.
async fn relayed_all(store: &dyn Store, limit: Duration) {
    let deadline = Instant::now() + limit;
    while store.backlog().await.unwrap() > 0 {
        assert!(
            Instant::now() < deadline,
            "the relay emptied the outbox within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The distinct `(account, seq)` pairs handled successfully at least once, and the calls made
/// for pairs already handled (duplicates).
fn coverage(seen: &[Seen]) -> (HashSet<(String, u32)>, usize) {
    let mut distinct = HashSet::new();
    let mut duplicates = 0;
    for call in seen {
        if !distinct.insert((call.account.clone(), call.seq)) {
            duplicates += 1;
        }
    }
    (distinct, duplicates)
}

/// Checks Kafka's order within each consumer instance: an account's next call is for the next
/// step, the same one again (a retry or a redelivery), or an earlier one (the partition was
/// handed back and read again from its last commit); never a later one with a step skipped.
fn assert_in_order_per_instance(seen: &[Seen]) {
    let mut last: HashMap<(u32, &str), u32> = HashMap::new();
    for call in seen {
        if let Some(previous) = last.insert((call.instance, &call.account), call.seq) {
            assert!(
                call.seq <= previous + 1,
                "instance {} handled {} step {} right after step {previous}: a step was skipped \
                 or reordered",
                call.instance,
                call.account,
                call.seq
            );
        }
    }
}

/// Logs to the test's output when `RUST_LOG` is set.
fn logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

// Every scenario runs twice: on tansu, the broker `.ci/run` starts (or the brokers at
// TEST_KAFKA_BROKERS), and on a librdkafka mock cluster of its own.
macro_rules! on_both_brokers {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            use hexeract_tests::kafka::TestKafka;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_tansu() {
                super::$scenario(TestKafka::tansu()).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn on_librdkafkas_mock_cluster() {
                super::$scenario(TestKafka::mock()).await;
            }
        }
    )*};
}

on_both_brokers!(
    per_aggregate_order_holds_across_three_partitions_and_two_consumers,
    two_relays_on_one_store_never_reorder_an_aggregate,
    a_retry_holds_back_only_its_own_partition,
    a_restart_mid_stream_loses_nothing,
    a_rebalance_during_consumption_loses_nothing,
    a_record_that_cannot_be_read_is_dead_lettered_and_its_partition_moves_on,
    a_partition_far_behind_is_paused_and_resumed,
    a_forged_replay_header_makes_no_group_skip_a_new_record,
    a_replay_is_handled_by_its_handler_alone,
    a_record_no_handler_consumes_stays_for_a_handler_added_later,
);

async fn store(schema: &TestSchema) -> Arc<dyn Store> {
    logs();
    Arc::new(schema.migrated_store().await)
}

async fn per_aggregate_order_holds_across_three_partitions_and_two_consumers(kafka: TestKafka) {
    let schema = TestSchema::new("kafka_order").await;
    let store = store(&schema).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    kafka.create_topic("account", 3).await;
    let (stop_a, a) = start_worker(worker(&kafka, 3, store.clone(), Recorder::new(1, &seen)));
    let (stop_b, b) = start_worker(worker(&kafka, 3, store.clone(), Recorder::new(2, &seen)));
    let (stop_relay, relay) = start_relay(&kafka, 3, store.clone(), 50);
    // Warm-up records on every partition until both consumers handled one: from then on the
    // group is settled, each consumer holding partitions of its own.
    let deadline = Instant::now() + Duration::from_secs(60);
    for round in 0.. {
        let both = {
            let seen = seen.lock().unwrap();
            seen.iter().any(|call| call.instance == 1) && seen.iter().any(|call| call.instance == 2)
        };
        if both {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "both consumers of the group took partitions"
        );
        let warm: Vec<Envelope> = (0..12)
            .map(|n| {
                Envelope::new(&Step {
                    account: format!("warm-{n}"),
                    seq: round,
                })
                .unwrap()
            })
            .collect();
        store.publish(warm).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let warmed = seen.lock().unwrap().len();
    let envelopes = enqueue_steps(&*store, 30, 20).await;
    let real = |seen: &[Seen]| -> Vec<Seen> {
        seen.iter()
            .filter(|call| call.account.starts_with("acct-"))
            .cloned()
            .collect()
    };
    wait_until(Duration::from_secs(60), "every step handled", || {
        coverage(&real(&seen.lock().unwrap())).0.len() == envelopes.len()
    })
    .await;
    for stop in [&stop_a, &stop_b, &stop_relay] {
        stop.cancel();
    }
    for task in [a, b, relay] {
        task.await.unwrap();
    }

    let seen = real(&seen.lock().unwrap()[warmed..]);
    assert_in_order_per_instance(&seen);
    let (_, duplicates) = coverage(&seen);
    let by_instance = |instance| seen.iter().filter(|call| call.instance == instance).count();
    println!(
        "per-aggregate order: {} steps of 30 accounts, {} calls ({duplicates} duplicates), \
         instance 1: {}, instance 2: {}",
        envelopes.len(),
        seen.len(),
        by_instance(1),
        by_instance(2)
    );
    assert!(
        by_instance(1) > 0 && by_instance(2) > 0,
        "both consumers of the group took partitions"
    );
    // The relay keyed each record by its account: one account, one partition, in step order.
    let records: Vec<_> = kafka
        .read_all(&kafka.topic("account"), envelopes.len() + warmed)
        .into_iter()
        .filter(|record| {
            record
                .key
                .as_deref()
                .is_some_and(|key| key.starts_with("acct-"))
        })
        .collect();
    assert_eq!(records.len(), envelopes.len(), "each row relayed once");
    let mut partition_of: HashMap<String, i32> = HashMap::new();
    let mut steps_of: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for record in &records {
        let account = record.key.clone().expect("keyed");
        assert_eq!(
            *partition_of
                .entry(account.clone())
                .or_insert(record.partition),
            record.partition,
            "{account} is in one partition"
        );
        let step: Step = serde_json::from_slice(&record.payload).unwrap();
        steps_of.entry(account).or_default().push(step.seq);
    }
    for (account, steps) in &steps_of {
        assert_eq!(
            *steps,
            (0..20).collect::<Vec<_>>(),
            "{account}'s steps in order"
        );
    }
    let used: HashSet<i32> = partition_of.values().copied().collect();
    assert_eq!(used.len(), 3, "30 accounts spread over the 3 partitions");
    schema.drop_schema().await;
}

async fn two_relays_on_one_store_never_reorder_an_aggregate(kafka: TestKafka) {
    let schema = TestSchema::new("kafka_two_relays").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 3).await;
    let envelopes = enqueue_steps(&*store, 10, 60).await;
    // Small batches, two relays: without their passes excluding each other, one would publish
    // rows 6–10 while the other still waits for rows 1–5.
    let (stop_1, relay_1) = start_relay(&kafka, 3, store.clone(), 5);
    let (stop_2, relay_2) = start_relay(&kafka, 3, store.clone(), 5);
    relayed_all(&*store, Duration::from_secs(60)).await;
    stop_1.cancel();
    stop_2.cancel();
    relay_1.await.unwrap();
    relay_2.await.unwrap();

    let records = kafka.read_all(&kafka.topic("account"), envelopes.len());
    assert_eq!(records.len(), envelopes.len());
    let mut steps_of: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for record in &records {
        let step: Step = serde_json::from_slice(&record.payload).unwrap();
        steps_of.entry(step.account).or_default().push(step.seq);
    }
    for (account, steps) in &steps_of {
        assert_eq!(
            *steps,
            (0..60).collect::<Vec<_>>(),
            "{account}'s steps in order"
        );
    }
    // The records carry the CloudEvents headers and the key.
    let first = &records[0];
    assert_eq!(first.header("ce_specversion"), Some("1.0"));
    assert_eq!(first.header("ce_type"), Some("kafka.test.Step"));
    assert_eq!(first.header("content-type"), Some("application/json"));
    assert_eq!(first.header("ce_partitionkey"), first.key.as_deref());
    assert!(envelopes
        .iter()
        .any(|envelope| Some(envelope.id.to_string().as_str()) == first.header("ce_id")));
    schema.drop_schema().await;
}

async fn a_retry_holds_back_only_its_own_partition(kafka: TestKafka) {
    let schema = TestSchema::new("kafka_retry").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 3).await;
    let envelopes = enqueue_steps(&*store, 12, 5).await;
    // acct-0 step 1 fails twice: 200 ms, then 400 ms of backoff.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut recorder = Recorder::new(1, &seen);
    recorder.fail = Arc::new(HashMap::from([(("acct-0".to_owned(), 1), 2)]));
    let (stop_relay, relay) = start_relay(&kafka, 3, store.clone(), 100);
    // Relayed before consuming starts: every partition has its records waiting.
    relayed_all(&*store, Duration::from_secs(30)).await;
    let (stop, run) = start_worker(worker(&kafka, 3, store.clone(), recorder));
    wait_until(Duration::from_secs(60), "every step handled", || {
        coverage(&seen.lock().unwrap()).0.len() == envelopes.len()
    })
    .await;
    stop.cancel();
    stop_relay.cancel();
    run.await.unwrap();
    relay.await.unwrap();

    let seen = seen.lock().unwrap().clone();
    let records = kafka.read_all(&kafka.topic("account"), envelopes.len());
    assert_eq!(records.len(), envelopes.len(), "each row relayed once");
    let partition_of: HashMap<String, i32> = records
        .iter()
        .map(|record| (record.key.clone().unwrap(), record.partition))
        .collect();
    let held = partition_of["acct-0"];
    let calls_of_failing: Vec<&Seen> = seen
        .iter()
        .filter(|call| call.account == "acct-0" && call.seq == 1)
        .collect();
    assert_eq!(
        calls_of_failing
            .iter()
            .map(|call| call.attempt)
            .collect::<Vec<_>>(),
        [1, 2, 3],
        "two failures, then the call that acks"
    );
    let first_failure = calls_of_failing[0].at;
    let success = calls_of_failing[2].at;
    // Behind the failing record, in its partition: nothing handled between its first failure
    // and its success.
    let offset_of: HashMap<(String, u32), i64> = records
        .iter()
        .map(|record| {
            let step: Step = serde_json::from_slice(&record.payload).unwrap();
            ((step.account, step.seq), record.offset)
        })
        .collect();
    let failing_offset = offset_of[&("acct-0".to_owned(), 1)];
    let mut behind = 0;
    let mut elsewhere_during_wait = 0;
    for call in &seen {
        let partition = partition_of[&call.account];
        let offset = offset_of[&(call.account.clone(), call.seq)];
        if partition == held && offset > failing_offset {
            behind += 1;
            assert!(
                call.at > success,
                "{} step {} (behind the failing record in partition {held}) was handled before \
                 the failing record was acked",
                call.account,
                call.seq
            );
        }
        if partition != held && call.at > first_failure && call.at < success {
            elsewhere_during_wait += 1;
        }
    }
    let other_partitions: usize = seen
        .iter()
        .filter(|call| partition_of[&call.account] != held)
        .count();
    println!(
        "retry: partition {held} held for {:?} with {behind} records behind; {elsewhere_during_wait} \
         of {other_partitions} records of other partitions handled meanwhile",
        success - first_failure
    );
    assert!(behind > 0, "the failing record has records behind it");
    // The other partitions were not held: their records (a few ms each) were all handled while
    // the failing one waited out its 600 ms of backoff, none after.
    let other_after_success = seen
        .iter()
        .filter(|call| partition_of[&call.account] != held && call.at > success)
        .count();
    assert!(
        other_partitions > 0,
        "some accounts are in other partitions"
    );
    assert_eq!(
        other_after_success, 0,
        "no record of another partition waited for the retry"
    );
    schema.drop_schema().await;
}

async fn a_restart_mid_stream_loses_nothing(kafka: TestKafka) {
    let schema = TestSchema::new("kafka_restart").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 3).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let envelopes = enqueue_steps(&*store, 40, 50).await;
    let (stop_relay, relay) = start_relay(&kafka, 3, store.clone(), 100);
    let mut recorder = Recorder::new(1, &seen);
    recorder.pause = Duration::from_millis(1);
    // First a graceful stop, then an abrupt one (the task dropped mid-call, as in a crash of
    // the consumer: only the offsets stored before are committed).
    let (stop, first) = start_worker(worker(&kafka, 3, store.clone(), recorder.clone()));
    wait_until(Duration::from_secs(60), "a third handled", || {
        seen.lock().unwrap().len() > envelopes.len() / 3
    })
    .await;
    stop.cancel();
    first.await.unwrap();
    let at_first_stop = seen.lock().unwrap().len();
    recorder.instance = 2;
    let (_never, second) = start_worker(worker(&kafka, 3, store.clone(), recorder.clone()));
    wait_until(Duration::from_secs(60), "two thirds handled", || {
        seen.lock().unwrap().len() > 2 * envelopes.len() / 3
    })
    .await;
    second.abort();
    let _ = second.await;
    let at_abort = seen.lock().unwrap().len();
    if kafka.is_tansu() {
        // tansu 0.6 can leave a consumer that joins while a vanished member is still in the
        // group without a fetch for minutes (docs/kafka.md): wait out the session timeout (6 s)
        // first, as a restart by a supervisor would. The mock cluster takes the join at once.
        tokio::time::sleep(Duration::from_secs(7)).await;
    }
    recorder.instance = 3;
    let (stop, third) = start_worker(worker(&kafka, 3, store.clone(), recorder));
    wait_until(Duration::from_secs(90), "every step handled", || {
        coverage(&seen.lock().unwrap()).0.len() == envelopes.len()
    })
    .await;
    stop.cancel();
    stop_relay.cancel();
    third.await.unwrap();
    relay.await.unwrap();

    let seen = seen.lock().unwrap().clone();
    let (distinct, duplicates) = coverage(&seen);
    println!(
        "restart: {} steps, 0 lost, {duplicates} duplicates ({} calls; stops after {at_first_stop} \
         and {at_abort} calls)",
        envelopes.len(),
        seen.len()
    );
    assert_eq!(distinct.len(), envelopes.len(), "nothing lost");
    assert_in_order_per_instance(&seen);
    schema.drop_schema().await;
}

async fn a_rebalance_during_consumption_loses_nothing(kafka: TestKafka) {
    let schema = TestSchema::new("kafka_rebalance").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 3).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let envelopes = enqueue_steps(&*store, 30, 60).await;
    let (stop_relay, relay) = start_relay(&kafka, 3, store.clone(), 100);
    let mut first = Recorder::new(1, &seen);
    first.pause = Duration::from_millis(2);
    let mut second = first.clone();
    second.instance = 2;
    let (stop_a, a) = start_worker(worker(&kafka, 3, store.clone(), first));
    wait_until(Duration::from_secs(60), "a quarter handled", || {
        seen.lock().unwrap().len() > envelopes.len() / 4
    })
    .await;
    // A second consumer joins: the partitions are shared out again mid-stream.
    let (stop_b, b) = start_worker(worker(&kafka, 3, store.clone(), second));
    let joined = Instant::now() + Duration::from_secs(20);
    while !seen.lock().unwrap().iter().any(|call| call.instance == 2) {
        if Instant::now() > joined {
            // tansu 0.6 does not always hand partitions to a member joining a group whose
            // members are consuming (docs/kafka.md); the mock cluster always does. The first
            // consumer's leaving below is then the rebalance under test.
            assert!(
                kafka.is_tansu(),
                "the second consumer took partitions within 20 s"
            );
            println!("rebalance: tansu gave the joining consumer no partition within 20 s");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And the first leaves: its partitions go to the second.
    stop_a.cancel();
    a.await.unwrap();
    wait_until(Duration::from_secs(90), "every step handled", || {
        coverage(&seen.lock().unwrap()).0.len() == envelopes.len()
    })
    .await;
    stop_b.cancel();
    stop_relay.cancel();
    b.await.unwrap();
    relay.await.unwrap();

    let seen = seen.lock().unwrap().clone();
    let (distinct, duplicates) = coverage(&seen);
    println!(
        "rebalance: {} steps, 0 lost, {duplicates} duplicates ({} calls)",
        envelopes.len(),
        seen.len()
    );
    assert_eq!(distinct.len(), envelopes.len(), "nothing lost");
    assert_in_order_per_instance(&seen);
    schema.drop_schema().await;
}

async fn a_record_that_cannot_be_read_is_dead_lettered_and_its_partition_moves_on(
    kafka: TestKafka,
) {
    let schema = TestSchema::new("kafka_unreadable").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 3).await;
    let topic = kafka.topic("account");
    // Garbage from another producer: no id, no type.
    let (partition, garbage_offset) = kafka
        .send_raw(&topic, "acct-x", &[], b"\x00\x01 not json")
        .await;
    // A record of another message type of the aggregate: passed over, not dead-lettered.
    let closed = Envelope::new(&Closed {
        account: "acct-x".to_owned(),
    })
    .unwrap();
    // Behind them, in the same partition (same key), a good one.
    let good = Envelope::new(&Step {
        account: "acct-x".to_owned(),
        seq: 0,
    })
    .unwrap();
    // Records addressed as `dead-letters replay` addresses them: one to another handler of the
    // topic, but a new message rather than a copy of one this handler had (so handled here
    // too), one to this handler.
    let for_another = Envelope::new(&Step {
        account: "acct-x".to_owned(),
        seq: 1,
    })
    .unwrap()
    .with_header("hexeract-replay-for", "another.handler");
    let for_this = Envelope::new(&Step {
        account: "acct-x".to_owned(),
        seq: 2,
    })
    .unwrap()
    .with_header("hexeract-replay-for", HANDLER);
    store
        .publish(vec![closed, good.clone(), for_another, for_this])
        .await
        .unwrap();
    let (stop_relay, relay) = start_relay(&kafka, 3, store.clone(), 10);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (stop, run) = start_worker(worker(&kafka, 3, store.clone(), Recorder::new(1, &seen)));
    wait_until(Duration::from_secs(60), "the good records handled", || {
        seen.lock().unwrap().len() >= 2
    })
    .await;
    stop.cancel();
    stop_relay.cancel();
    run.await.unwrap();
    relay.await.unwrap();

    let letters = store.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason, Reason::MESSAGE_ID_MISSING);
    assert!(letter.detail.contains("ce_id"), "{}", letter.detail);
    assert_eq!(letter.handler.as_deref(), Some(HANDLER));
    assert_eq!(&letter.envelope.payload[..], b"\x00\x01 not json");
    assert_eq!(letter.envelope.aggregate_key.as_deref(), Some("acct-x"));
    assert_eq!(letter.attempts, 0, "no handler call was made");
    // The group's offset moved past the garbage and the records behind it.
    let group = kafka.config(3).group(HANDLER);
    let committed = kafka.committed(&group, &topic, 3)[partition as usize];
    assert_eq!(
        committed,
        Some(garbage_offset + 5),
        "committed past all five records"
    );
    let handled: Vec<u32> = seen.lock().unwrap().iter().map(|call| call.seq).collect();
    assert_eq!(
        handled,
        [0, 1, 2],
        "a new record addressed to another handler is handled here too"
    );
    println!(
        "unreadable: dead-lettered as {}, offset {garbage_offset} passed",
        letter.reason
    );
    schema.drop_schema().await;
}

/// More records waiting in a partition than the worker queues (64 KiB here): the partition is
/// paused and resumed as its task catches up, and every record is handled once, in order.
async fn a_partition_far_behind_is_paused_and_resumed(kafka: TestKafka) {
    let schema = TestSchema::new("kafka_backlog").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 1).await;
    let envelopes = enqueue_steps(&*store, 5, 700).await;
    let (stop_relay, relay) = start_relay(&kafka, 1, store.clone(), 500);
    relayed_all(&*store, Duration::from_secs(60)).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut recorder = Recorder::new(1, &seen);
    // 1 ms a call: the fetches run far ahead of the handler.
    recorder.pause = Duration::from_millis(1);
    let small_queue = KafkaWorker::builder(kafka.config(1), store.clone())
        .register_handler_with::<Step, _>(recorder, HandlerOptions::new().name(HANDLER))
        .partition_queue_bytes(64 * 1024)
        .build()
        .unwrap();
    let (stop, run) = start_worker(small_queue);
    wait_until(Duration::from_secs(90), "every step handled", || {
        coverage(&seen.lock().unwrap()).0.len() == envelopes.len()
    })
    .await;
    stop.cancel();
    stop_relay.cancel();
    run.await.unwrap();
    relay.await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_in_order_per_instance(&seen);
    assert_eq!(seen.len(), envelopes.len(), "each record handled once");
    schema.drop_schema().await;
}

/// A row the brokers can never take (a payload over librdkafka's `message.max.bytes`, 1 MB,
/// within the outbox's own limit, 1 MiB) is dead-lettered by the relay, and the rows behind it
/// are relayed.
async fn a_row_too_large_for_the_brokers_is_dead_lettered_and_the_relay_goes_on(kafka: TestKafka) {
    let schema = TestSchema::new("kafka_too_large").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 3).await;
    let big = Envelope::new(&Step {
        account: "x".repeat(1_010_000),
        seq: 0,
    })
    .unwrap();
    let after = Envelope::new(&Step {
        account: "acct-1".to_owned(),
        seq: 1,
    })
    .unwrap();
    store.publish(vec![big.clone(), after]).await.unwrap();
    let (stop_relay, relay) = start_relay(&kafka, 3, store.clone(), 10);
    relayed_all(&*store, Duration::from_secs(30)).await;
    stop_relay.cancel();
    relay.await.unwrap();
    let letters = store.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].envelope.id, big.id);
    // Over the brokers' size limit: the reason says so (it was `payload_invalid`).
    assert_eq!(letters[0].reason, Reason::PAYLOAD_TOO_LARGE);
    assert!(
        letters[0].detail.contains("refused the record"),
        "{}",
        letters[0].detail
    );
    let records = kafka.read_all(&kafka.topic("account"), 1);
    assert_eq!(records.len(), 1, "the row behind it was relayed");
    assert_eq!(records[0].key.as_deref(), Some("acct-1"));
    schema.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_too_large_for_the_brokers_is_dead_lettered_and_the_relay_goes_on_on_tansu() {
    a_row_too_large_for_the_brokers_is_dead_lettered_and_the_relay_goes_on(TestKafka::tansu())
        .await;
}

#[tokio::test]
async fn a_handler_whose_message_has_no_aggregate_cannot_start() {
    struct Pong;
    impl Handler<Ping> for Pong {
        type Error = String;
        async fn handle(&self, _ping: Ping, _ctx: &Context) -> Result<(), Self::Error> {
            Ok(())
        }
    }
    let store: Arc<dyn Store> = Arc::new(
        hexeract::store::sqlite::SqliteStore::in_memory()
            .await
            .unwrap(),
    );
    let error = KafkaWorker::builder(
        hexeract::kafka::KafkaConfig::new("127.0.0.1:9092", "shop"),
        store,
    )
    .register_handler_with::<Ping, _>(Pong, HandlerOptions::new().name("shop.pong"))
    .build()
    .unwrap_err();
    // The builder's own error says the same, and `?` gives it back as the program's.
    let built = error.to_string();
    let error = Error::from(error);
    assert_eq!(error.to_string(), built);
    assert!(matches!(error, Error::Kafka(_)), "{error:?}");
    assert_eq!(
        error.to_string(),
        "handler `shop.pong` handles `kafka.test.Ping`, which declares no aggregate: with Kafka \
         every message needs one, to choose its topic and keep its order; declare it with \
         #[message(type = \"kafka.test.Ping\", aggregate = \"…\")] and mark the aggregate id \
         field #[message(key)]"
    );
}

/// With the default replication factor (3), a cluster of one broker cannot hold the topics:
/// the admin step fails naming `KAFKA_REPLICATION_FACTOR`, rather than running with records
/// kept on one disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_smaller_than_the_replication_factor_is_an_error_naming_the_variable() {
    let kafka = TestKafka::mock_of(1);
    let config = hexeract::kafka::KafkaConfig::new(kafka.brokers(), kafka.prefix.clone());
    let error = hexeract::kafka::ensure_topics(&config, &["account"])
        .await
        .expect_err("one broker cannot hold 3 replicas");
    let text = error.to_string();
    assert!(
        text.contains("KAFKA_REPLICATION_FACTOR is 3")
            && text.contains("lists 1 broker(s)")
            && text.contains("set KAFKA_REPLICATION_FACTOR"),
        "{text}"
    );
    // With a factor the cluster can hold, the same step passes (the topic made beforehand: the
    // mock cluster has no CreateTopics).
    kafka.create_topic_with("account", 3, 1).await;
    hexeract::kafka::ensure_topics(&config.replication_factor(1), &["account"])
        .await
        .expect("one replica on one broker");
}

/// A topic that is missing is never created by the admin step's own metadata requests (which
/// would create it with the broker's defaults: on the mock cluster 4 partitions, on Kafka
/// often 1 partition and 1 replica): it is created as configured (the mock has no
/// CreateTopics, so there it is not created at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_is_never_created_with_the_brokers_defaults() {
    let kafka = TestKafka::mock();
    // The mock answers no CreateTopics: give up on it after 5 s rather than 60.
    let config = kafka.config(3).client_option("socket.timeout.ms", "5000");
    let created = hexeract::kafka::ensure_topics(&config, &["account"]).await;
    let probe: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()
        .unwrap();
    let topic = kafka.topic("account");
    let metadata =
        rdkafka::consumer::Consumer::fetch_metadata(&probe, Some(&topic), Duration::from_secs(10))
            .unwrap();
    let listed = &metadata.topics()[0];
    if listed.error().is_none() {
        assert_eq!(
            listed.partitions().len(),
            3,
            "created with the configured partitions, not the broker's default ({created:?})"
        );
        for partition in listed.partitions() {
            assert_eq!(partition.replicas().len(), 3, "3 replicas ({created:?})");
        }
    } else {
        assert!(created.is_err(), "not listed, yet reported created");
    }
}

/// An existing topic with fewer replicas than the factor is used, with a warning naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_topic_with_fewer_replicas_than_the_factor_is_warned_about() {
    let logs = hexeract_tests::logs::Captured::install("hexeract=warn");
    let kafka = TestKafka::mock();
    kafka.create_topic_with("account", 3, 1).await;
    kafka.create_topic_with("cart", 3, 3).await;
    hexeract::kafka::ensure_topics(&kafka.config(3), &["account", "cart"])
        .await
        .expect("existing topics are used as they are");
    let text = logs.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("fewer replicas than the replication factor"))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(
        warnings[0].contains(&kafka.topic("account"))
            && warnings[0].contains("replicas=1")
            && warnings[0].contains("replication_factor=3"),
        "{}",
        warnings[0]
    );
}

/// A producer that addresses a new record to another handler (`hexeract-replay-for`), even
/// naming an earlier record as the one it copies (`hexeract-replay-of`), cannot make this
/// handler skip it: only an exact copy of a record this group already passed is passed over.
async fn a_forged_replay_header_makes_no_group_skip_a_new_record(kafka: TestKafka) {
    let schema = TestSchema::new("kafka_forged_replay").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 3).await;
    let topic = kafka.topic("account");
    let step = |seq| {
        Envelope::new(&Step {
            account: "acct-f".to_owned(),
            seq,
        })
        .unwrap()
    };
    let first = step(0);
    store.publish(vec![first.clone()]).await.unwrap();
    let (stop_relay, relay) = start_relay(&kafka, 3, store.clone(), 10);
    relayed_all(&*store, Duration::from_secs(30)).await;
    let original = kafka.read_all(&topic, 1).remove(0);
    let position = format!("{topic}/{}/{}", original.partition, original.offset);
    store
        .publish(vec![
            // Addressed to another handler, naming nothing.
            step(1).with_header("hexeract-replay-for", "another.handler"),
            // Addressed to another handler, naming the first record, which it does not copy.
            step(2)
                .with_header("hexeract-replay-for", "another.handler")
                .with_header("hexeract-replay-of", position.clone()),
            // Naming the first record with its id, but another payload.
            {
                let mut same_id = step(3);
                same_id.id = first.id;
                same_id
                    .with_header("hexeract-replay-for", "another.handler")
                    .with_header("hexeract-replay-of", position)
            },
        ])
        .await
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (stop, run) = start_worker(worker(&kafka, 3, store.clone(), Recorder::new(1, &seen)));
    wait_until(Duration::from_secs(60), "every record handled", || {
        seen.lock().unwrap().len() >= 4
    })
    .await;
    stop.cancel();
    stop_relay.cancel();
    run.await.unwrap();
    relay.await.unwrap();
    // (The outbox relays in id order: the copy of the first id goes right after it.)
    let mut handled: Vec<u32> = seen.lock().unwrap().iter().map(|call| call.seq).collect();
    handled.sort_unstable();
    assert_eq!(handled, [0, 1, 2, 3], "no record was skipped");
    schema.drop_schema().await;
}

/// `dead-letters replay` of one handler's dead letter: the handler gets the record again, the
/// topic's other handler of the type, which handled the original, passes over the copy.
async fn a_replay_is_handled_by_its_handler_alone(kafka: TestKafka) {
    const OTHER: &str = "kafka_test.other_steps";
    let schema = TestSchema::new("kafka_replay").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 3).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut failing = Recorder::new(1, &seen);
    failing.fail = Arc::new(HashMap::from([(("acct-r".to_owned(), 0), u32::MAX)]));
    let both = KafkaWorker::builder(kafka.config(3), store.clone())
        .register_handler_with::<Step, _>(failing, HandlerOptions::new().name(HANDLER))
        .register_handler_with::<Step, _>(
            Recorder::new(2, &seen),
            HandlerOptions::new().name(OTHER),
        )
        .max_deliveries(1)
        .check_interval(Duration::from_millis(500))
        .build()
        .unwrap();
    let (stop, run) = start_worker(both);
    let (stop_relay, relay) = start_relay(&kafka, 3, store.clone(), 10);
    let step = |seq| {
        Envelope::new(&Step {
            account: "acct-r".to_owned(),
            seq,
        })
        .unwrap()
    };
    store.publish(vec![step(0)]).await.unwrap();
    let calls = |instance: u32, seq: u32| {
        let seen = seen.lock().unwrap();
        seen.iter()
            .filter(|call| call.instance == instance && call.seq == seq)
            .count()
    };
    wait_until(Duration::from_secs(60), "both handlers called", || {
        calls(1, 0) == 1 && calls(2, 0) == 1
    })
    .await;
    let letter = loop {
        let letters = store.dead_letters(10).await.unwrap();
        if let Some(letter) = letters.into_iter().next() {
            break letter;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(letter.handler.as_deref(), Some(HANDLER));
    let replay = hexeract::kafka::wire::replay_envelope(&letter);
    assert!(
        replay
            .headers
            .get("hexeract-replay-of")
            .is_some_and(|of| of.starts_with(&kafka.topic("account"))),
        "{:?}",
        replay.headers
    );
    // The replay, then a record behind it in the same partition: once the other handler has
    // that one, it has passed the replay.
    store.publish(vec![replay, step(1)]).await.unwrap();
    wait_until(
        Duration::from_secs(60),
        "the replay and the next step handled",
        || calls(1, 0) == 2 && calls(2, 1) == 1,
    )
    .await;
    stop.cancel();
    stop_relay.cancel();
    run.await.unwrap();
    relay.await.unwrap();
    assert_eq!(calls(2, 0), 1, "the other handler passed over the copy");
    schema.drop_schema().await;
}

/// Counts the `Closed` records it handles.
#[derive(Clone, Default)]
struct CloseCounter(Arc<Mutex<Vec<String>>>);

impl Handler<Closed> for CloseCounter {
    type Error = String;
    async fn handle(&self, closed: Closed, _ctx: &Context) -> Result<(), String> {
        self.0.lock().unwrap().push(closed.account);
        Ok(())
    }
}

/// A record of a type no handler consumes (`Closed`) is passed over, and committed past, by the
/// topic's groups, but stays on the topic: a handler of its type added later (a new group)
/// receives it.
async fn a_record_no_handler_consumes_stays_for_a_handler_added_later(kafka: TestKafka) {
    let schema = TestSchema::new("kafka_unhandled_type").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 3).await;
    let closed = Envelope::new(&Closed {
        account: "acct-u".to_owned(),
    })
    .unwrap();
    let step = Envelope::new(&Step {
        account: "acct-u".to_owned(),
        seq: 0,
    })
    .unwrap();
    store.publish(vec![closed, step]).await.unwrap();
    let (stop_relay, relay) = start_relay(&kafka, 3, store.clone(), 10);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (stop, run) = start_worker(worker(&kafka, 3, store.clone(), Recorder::new(1, &seen)));
    wait_until(Duration::from_secs(60), "the step handled", || {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    stop.cancel();
    run.await.unwrap();
    let later = CloseCounter::default();
    let closer = KafkaWorker::builder(kafka.config(3), store.clone())
        .register_handler_with::<Closed, _>(
            later.clone(),
            HandlerOptions::new().name("kafka_test.closer"),
        )
        .check_interval(Duration::from_millis(500))
        .build()
        .unwrap();
    let (stop, run) = start_worker(closer);
    wait_until(
        Duration::from_secs(60),
        "the handler added later has the record",
        || !later.0.lock().unwrap().is_empty(),
    )
    .await;
    stop.cancel();
    stop_relay.cancel();
    run.await.unwrap();
    relay.await.unwrap();
    assert_eq!(*later.0.lock().unwrap(), ["acct-u"]);
    assert!(store.dead_letters(10).await.unwrap().is_empty());
    schema.drop_schema().await;
}

/// Calls of `seq` 0 that never finish (as if each killed its process: the call outlives the
/// shutdown grace and is abandoned, its outcome never settled); every other step acks.
#[derive(Clone)]
struct NeverFinishes {
    calls: Arc<Mutex<Vec<(u32, u32)>>>,
}

impl Handler<Step> for NeverFinishes {
    type Error = HandlerOutcome;
    async fn handle(&self, step: Step, ctx: &Context) -> Result<(), HandlerOutcome> {
        self.calls
            .lock()
            .unwrap()
            .push((step.seq, ctx.envelope().attempt));
        if step.seq == 0 {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// A record whose every call ends with its process (here: a call still running when the worker
/// stops, abandoned past the shutdown grace, so nothing of it is settled, as after a crash):
/// each call is counted in the store before it is made, so each new start goes on with the
/// count, and once it passes `max_deliveries` (3) the record is dead-lettered without a call,
/// and the record behind it in its partition is handled. Before, the count lived in memory and
/// started over with each process: the record was called again at attempt 1 forever and its
/// partition never moved on. On librdkafka's mock cluster, where each restart's group join is
/// quick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_whose_calls_never_finish_is_dead_lettered_after_max_deliveries_starts() {
    let kafka = TestKafka::mock();
    let schema = TestSchema::new("kafka_never_finishes").await;
    let store = store(&schema).await;
    kafka.create_topic("account", 1).await;
    let steps: Vec<Envelope> = (0..2)
        .map(|seq| {
            Envelope::new(&Step {
                account: "acct-crash".to_owned(),
                seq,
            })
            .unwrap()
        })
        .collect();
    store.publish(steps).await.unwrap();
    let (stop_relay, relay) = start_relay(&kafka, 1, store.clone(), 10);
    relayed_all(&*store, Duration::from_secs(30)).await;
    stop_relay.cancel();
    relay.await.unwrap();

    let calls = Arc::new(Mutex::new(Vec::new()));
    let handler = NeverFinishes {
        calls: calls.clone(),
    };
    let build = || {
        KafkaWorker::builder(kafka.config(1), store.clone())
            .register_handler_with::<Step, _>(handler.clone(), HandlerOptions::new().name(HANDLER))
            .max_deliveries(3)
            .shutdown_grace(Duration::from_millis(100))
            .check_interval(Duration::from_millis(500))
            .build()
            .expect("a valid worker")
    };
    for start in 1..=3_u32 {
        let (stop, run) = start_worker(build());
        wait_until(Duration::from_secs(60), "the start's call begun", || {
            calls.lock().unwrap().len() == start as usize
        })
        .await;
        stop.cancel();
        run.await.unwrap();
    }
    assert_eq!(
        *calls.lock().unwrap(),
        [(0, 1), (0, 2), (0, 3)],
        "one call per start, the count going on"
    );

    let (stop, run) = start_worker(build());
    wait_until(
        Duration::from_secs(60),
        "the step behind it handled",
        || calls.lock().unwrap().iter().any(|(seq, _)| *seq == 1),
    )
    .await;
    stop.cancel();
    run.await.unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        [(0, 1), (0, 2), (0, 3), (1, 1)],
        "no fourth call of step 0"
    );
    let letters = store.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert_eq!(letters[0].attempts, 3);
    assert!(
        letters[0].detail.contains("never finished"),
        "{}",
        letters[0].detail
    );
    schema.drop_schema().await;
}
