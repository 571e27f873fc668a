//! `dead-letters replay` under `AMQP_URL`: the dead letter goes back to its handler's queue on
//! the broker, attempts start over, and it leaves the dead letters.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use hexeract::cli::execute;
use hexeract::{handler, CancellationToken, Context, HandlerOutcome, Message};
use hexeract_tests::amqp::TestBroker;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "clibroker.Refund")]
struct Refund {
    cents: i64,
}

static FIXED: AtomicBool = AtomicBool::new(false);
/// Attempt of the call after the fix.
static HANDLED_AT: AtomicU32 = AtomicU32::new(0);

#[handler(message = "clibroker.Refund", name = "payments::refund")]
async fn refund(_refund: Refund, ctx: &Context) -> HandlerOutcome {
    if !FIXED.load(Ordering::SeqCst) {
        return HandlerOutcome::dead_letter("gateway_rejected", "the gateway said no");
    }
    HANDLED_AT.store(ctx.attempt(), Ordering::SeqCst);
    HandlerOutcome::Ack
}

async fn run(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let mut out = String::new();
    execute(&args, &mut out)
        .await
        .unwrap_or_else(|error| panic!("{args:?}: {error:?}"));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_replayed_under_a_broker_goes_back_to_its_handlers_queue() {
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

    let cancel = CancellationToken::new();
    let service = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract::publish(&Refund { cents: 500 }).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let listed = loop {
        let listed = run(&["dead-letters", "list"]).await;
        if listed.contains("1 dead letter(s)") {
            break listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead-lettered: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        listed.contains("payments::refund  gateway_rejected"),
        "{listed}"
    );
    let id = listed.split_whitespace().next().unwrap().to_owned();

    FIXED.store(true, Ordering::SeqCst);
    let replayed = run(&["dead-letters", "replay", &id]).await;
    let queue = format!("{}.payments.refund", broker.prefix);
    assert!(
        replayed.contains(&format!("to queue {queue}")),
        "{replayed}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while HANDLED_AT.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replay was handled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(HANDLED_AT.load(Ordering::SeqCst), 1, "attempts start over");
    assert!(run(&["dead-letters", "list"])
        .await
        .contains("0 dead letter(s)"));

    cancel.cancel();
    service.await.unwrap().unwrap();
    let registry = hexeract::Registry::from_inventory().unwrap();
    let topology = hexeract::rabbitmq::Topology::from_registry(&registry)
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone());
    broker.delete(&topology).await;
    let _ = std::fs::remove_dir_all(dir);
}
