//! `hexeract::cli`: the operations commands on a service's own store (SQLite here): handlers,
//! migrate, and a dead letter listed, shown, replayed (and then handled) and purged.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use hexeract::cli::{execute, CliError};
use hexeract::{handler, CancellationToken, Context, HandlerOutcome, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "cli.Invoice")]
struct Invoice {
    number: u32,
}

/// Refuses invoices until the test "fixes the bug".
static FIXED: AtomicBool = AtomicBool::new(false);
static HANDLED: AtomicU32 = AtomicU32::new(0);

#[handler(message = "cli.Invoice", name = "billing::book")]
async fn book(invoice: Invoice, _ctx: &Context) -> HandlerOutcome {
    if !FIXED.load(Ordering::SeqCst) {
        return HandlerOutcome::dead_letter(
            "ledger_closed",
            format_args!("invoice {}: the ledger is closed", invoice.number),
        );
    }
    HANDLED.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::Ack
}

async fn run(args: &[&str]) -> Result<String, CliError> {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let mut out = String::new();
    execute(&args, &mut out).await.map(|()| out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_list_handlers_and_list_show_replay_and_purge_dead_letters() {
    let dir = std::env::temp_dir().join(format!("hexeract-cli-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    std::env::set_var("WORKER_PORT", "0");

    assert!(run(&["migrate"]).await.unwrap().contains("up to date"));
    let handlers = run(&["handlers"]).await.unwrap();
    assert!(
        handlers.contains("billing::book  message cli.Invoice  at tests/tests/cli.rs:"),
        "{handlers}"
    );
    assert!(handlers.contains("scheduled jobs (0)"), "{handlers}");

    let cancel = CancellationToken::new();
    let service = tokio::spawn(hexeract::run(cancel.clone()));
    hexeract::publish(&Invoice { number: 42 }).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let listed = run(&["dead-letters", "list", "--reason", "ledger_closed"])
            .await
            .unwrap();
        if listed.contains("1 dead letter(s)") {
            break listed;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead-lettered: {listed}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(listed.contains("billing::book  ledger_closed"), "{listed}");
    assert!(run(&["dead-letters", "list", "--handler", "someone::else"])
        .await
        .unwrap()
        .contains("0 dead letter(s)"));
    assert!(run(&["dead-letters", "list", "--older-than", "1h"])
        .await
        .unwrap()
        .contains("0 dead letter(s)"));
    let id = listed.split_whitespace().next().unwrap().to_owned();
    let shown = run(&["dead-letters", "show", &id]).await.unwrap();
    assert!(shown.contains("reason:          ledger_closed"), "{shown}");
    assert!(
        shown.contains("invoice 42: the ledger is closed"),
        "{shown}"
    );
    assert!(shown.contains(r#"{"number":42}"#), "payload shown: {shown}");

    FIXED.store(true, Ordering::SeqCst);
    let replayed = run(&["dead-letters", "replay", &id]).await.unwrap();
    assert!(replayed.contains("replayed"), "{replayed}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while HANDLED.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replay was handled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        run(&["dead-letters", "list"])
            .await
            .unwrap()
            .contains("0 dead letter(s)"),
        "a replayed dead letter leaves the list"
    );
    assert!(run(&["dead-letters", "purge"])
        .await
        .unwrap()
        .contains("purged 0"));

    for bad in [
        &["dead-letters", "show", "not-an-id"][..],
        &["dead-letters", "list", "--older-than", "soon"][..],
        &["frobnicate"][..],
    ] {
        assert!(matches!(run(bad).await, Err(CliError::Usage(_))), "{bad:?}");
    }
    cancel.cancel();
    service.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// A delivery waiting for a handler that is gone (renamed, say) is listed by `handlers`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_lists_pending_deliveries_that_no_handler_owns() {
    let dir = std::env::temp_dir().join(format!("hexeract-cli-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    for variable in ["DATABASE_URL", "AMQP_URL", "KAFKA_BROKERS"] {
        std::env::remove_var(variable);
    }
    std::env::set_var("HEXERACT_SQLITE_PATH", dir.join("outbox.db"));
    let store = hexeract::store::default_store().await.unwrap();
    store
        .publish(vec![
            hexeract::Envelope::new(&Invoice { number: 1 }).unwrap()
        ])
        .await
        .unwrap();
    // Expanded by an older version, whose handler had another name.
    let routes = hexeract::store::Routes {
        pairs: vec![("cli.Invoice".to_owned(), "billing::book_v1".to_owned())],
    };
    assert_eq!(store.expand(&routes, 10).await.unwrap(), 1);
    let listed = run(&["handlers"]).await.unwrap();
    assert!(
        listed.contains(
            "pending deliveries no handler here owns:\n  billing::book_v1 (renamed or removed?): 1"
        ),
        "{listed}"
    );
    assert!(!listed.contains("billing::book (renamed"), "{listed}");
    let _ = std::fs::remove_dir_all(dir);
}
