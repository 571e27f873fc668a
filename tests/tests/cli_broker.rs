//! `dead-letters replay` under `AMQP_URL`: a dead letter goes back to its handler's queue on
//! the broker, attempts start over, and it leaves the dead letters; by filter, every one it
//! matches goes back over one connection and the others stay; a scheduled job's run goes back
//! to the scheduler in the database (it runs from there under `AMQP_URL` too) and runs again.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hexeract::cli::execute;
use hexeract::store::ScheduleDefinition;
use hexeract::{handler, scheduled, CancellationToken, Context, HandlerOutcome, Message};
use hexeract_tests::amqp::TestBroker;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "clibroker.Refund")]
struct Refund {
    cents: i64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "clibroker.Chargeback")]
struct Chargeback {
    cents: i64,
}

static FIXED: AtomicBool = AtomicBool::new(false);
/// (cents, attempt) of each call after the fix.
static HANDLED: Mutex<Vec<(i64, u32)>> = Mutex::new(Vec::new());
static CHARGEBACK_CALLS: AtomicU32 = AtomicU32::new(0);
/// A run of the job: attempt, fire time, fixed by then.
type JobRun = (u32, Option<DateTime<Utc>>, bool);

static JOB_RUNS: Mutex<Vec<JobRun>> = Mutex::new(Vec::new());

#[handler(message = "clibroker.Refund", name = "payments::refund")]
async fn refund(refund: Refund, ctx: &Context) -> HandlerOutcome {
    if !FIXED.load(Ordering::SeqCst) {
        return HandlerOutcome::dead_letter("gateway_rejected", "the gateway said no");
    }
    HANDLED.lock().unwrap().push((refund.cents, ctx.attempt()));
    HandlerOutcome::Ack
}

/// Never manages.
#[handler(message = "clibroker.Chargeback", name = "payments::chargeback")]
async fn chargeback(_chargeback: Chargeback, _ctx: &Context) -> HandlerOutcome {
    CHARGEBACK_CALLS.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::dead_letter("dispute_open", "the dispute is still open")
}

/// Daily: its own fire times do not come during the test (one is made due).
#[scheduled(every = "24h", name = "payments::reconcile")]
async fn reconcile(ctx: &Context) -> HandlerOutcome {
    let fixed = FIXED.load(Ordering::SeqCst);
    JOB_RUNS
        .lock()
        .unwrap()
        .push((ctx.attempt(), ctx.scheduled_for(), fixed));
    if fixed {
        HandlerOutcome::Ack
    } else {
        HandlerOutcome::dead_letter("ledger_locked", "the ledger is locked")
    }
}

async fn run(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let mut out = String::new();
    execute(&args, &mut out)
        .await
        .unwrap_or_else(|error| panic!("{args:?}: {error:?}"));
    out
}

/// The ids at the start of `list`'s lines.
fn ids(listed: &str) -> Vec<String> {
    listed
        .lines()
        .filter(|line| !line.ends_with("dead letter(s)"))
        .map(|line| line.split_whitespace().next().unwrap().to_owned())
        .collect()
}

async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what} in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replayed_under_a_broker_go_back_to_their_handlers_queues() {
    let broker = TestBroker::new().await;
    let dir = std::env::temp_dir().join(format!("hexeract-cli-broker-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    for variable in ["DATABASE_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("AMQP_URL", hexeract_tests::amqp::amqp_url());
    std::env::set_var("HEXERACT_EXCHANGE", &broker.exchange);
    std::env::set_var("HEXERACT_QUEUE_PREFIX", &broker.prefix);
    std::env::set_var("RELAY_POLL_INTERVAL_MS", "50");
    std::env::set_var("WORKER_PORT", "0");

    // The job is due a second ago; the scheduler finds its schedule as written here.
    let store = hexeract::store::default_store().await.unwrap();
    let job = hexeract::schedule::jobs_from_inventory()
        .unwrap()
        .into_iter()
        .find(|job| job.name() == "payments::reconcile")
        .unwrap();
    let definition = ScheduleDefinition {
        name: job.name().to_owned(),
        spec: job.spec().stored_text(),
    };
    let a_second_ago = |_: &str, now: DateTime<Utc>| now - chrono::Duration::seconds(1);
    store
        .sync_schedules(std::slice::from_ref(&definition), &a_second_ago)
        .await
        .unwrap();

    let cancel = CancellationToken::new();
    let service = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract::publish(&Refund { cents: 500 }).await.unwrap();
    hexeract::publish(&Chargeback { cents: 600 }).await.unwrap();
    hexeract::publish(&Refund { cents: 700 }).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let listed = loop {
        let listed = run(&["dead-letters", "list"]).await;
        if listed.contains("4 dead letter(s)") {
            break listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead-lettered: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let refunds = ids(&run(&["dead-letters", "list", "--handler", "payments::refund"]).await);
    assert_eq!(refunds.len(), 2, "{listed}");
    let chargebacks =
        ids(&run(&["dead-letters", "list", "--handler", "payments::chargeback"]).await);
    assert_eq!(chargebacks.len(), 1, "{listed}");
    assert!(
        listed.contains("payments::reconcile  ledger_locked"),
        "{listed}"
    );

    FIXED.store(true, Ordering::SeqCst);
    let queue = format!("{}.payments.refund", broker.prefix);
    let replayed = run(&["dead-letters", "replay", &refunds[0]]).await;
    assert!(
        replayed.contains(&format!("to queue {queue}")),
        "{replayed}"
    );
    wait_for("the replay handled", || HANDLED.lock().unwrap().len() == 1).await;

    let replayed = run(&["dead-letters", "replay", "--reason", "gateway_rejected"]).await;
    assert_eq!(
        replayed,
        format!(
            "replayed {} (clibroker.Refund) to queue {queue}: attempts start over\n\
             replayed 1 dead letter(s)\n",
            refunds[1]
        )
    );
    wait_for("both refunds handled", || {
        HANDLED.lock().unwrap().len() == 2
    })
    .await;
    let mut handled = HANDLED.lock().unwrap().clone();
    handled.sort_unstable();
    assert_eq!(
        handled,
        [(500, 1), (700, 1)],
        "each once, attempts start over"
    );

    let replayed = run(&["dead-letters", "replay", "--handler", "payments::reconcile"]).await;
    assert!(
        replayed.contains("(the run of the scheduled job payments::reconcile for "),
        "{replayed}"
    );
    assert!(
        replayed.ends_with("replayed 1 dead letter(s)\n"),
        "{replayed}"
    );
    wait_for("the job ran again", || JOB_RUNS.lock().unwrap().len() == 2).await;
    let runs = JOB_RUNS.lock().unwrap().clone();
    assert_eq!(
        runs[1],
        (1, runs[0].1, true),
        "the same fire time again, attempts from 1"
    );

    let left = run(&["dead-letters", "list"]).await;
    assert_eq!(
        ids(&left),
        chargebacks,
        "only the chargeback stayed: {left}"
    );
    // Time for a stray call, were the chargeback replayed too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(CHARGEBACK_CALLS.load(Ordering::SeqCst), 1);
    assert_eq!(HANDLED.lock().unwrap().len(), 2);

    // Replayed, the chargeback is dead-lettered again: the copy gets a row of its own (not
    // the replayed row's id, which the replay then deletes), so it is never parked without
    // one.
    let replayed = run(&["dead-letters", "replay", &chargebacks[0]]).await;
    assert!(
        replayed.contains("replayed 1 dead letter(s)") || replayed.contains("to queue"),
        "{replayed}"
    );
    wait_for("the chargeback called again", || {
        CHARGEBACK_CALLS.load(Ordering::SeqCst) == 2
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let again = loop {
        let again = ids(&run(&["dead-letters", "list", "--handler", "payments::chargeback"]).await);
        if again.len() == 1 && again != chargebacks {
            break again;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the chargeback parked again has a row of its own: {again:?} (was {chargebacks:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(again, chargebacks);

    cancel.cancel();
    service.await.unwrap().unwrap();
    let registry = hexeract::Registry::from_inventory().unwrap();
    let topology = hexeract::rabbitmq::Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone());
    broker.delete(&topology).await;
    let _ = std::fs::remove_dir_all(dir);
}
