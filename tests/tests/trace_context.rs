//! W3C trace context through the outbox: a message published with a `traceparent` reaches its
//! handler with it, the handler's span carries its trace id (so every log line of the call
//! does), and a follow-up published from the handler continues the same trace with a new hop
//! whose parent id is the span id of the call that published it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hexeract::outbox::OutboxWorker;
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::DeliveryStore;
use hexeract::{CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Registry};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "trace.Ordered")]
struct Ordered {}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "trace.Shipped")]
struct Shipped {}

/// A handler and the `traceparent` it saw.
type Sighting = (&'static str, Option<String>);

/// What each handler saw.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Sighting>>>);

struct Ship(Seen);

impl Handler<Ordered> for Ship {
    type Error = hexeract::PublishError;
    async fn handle(&self, _order: Ordered, ctx: &Context) -> Result<(), Self::Error> {
        tracing::info!("shipping");
        self.0
             .0
            .lock()
            .unwrap()
            .push(("ship", ctx.header("traceparent").map(str::to_owned)));
        // What a handler writing its follow-up in a transaction of its own gets.
        let envelope = ctx.follow_up(&Shipped {}).expect("encode");
        self.0 .0.lock().unwrap().push((
            "follow_up",
            envelope.header("traceparent").map(str::to_owned),
        ));
        ctx.publish(&Shipped {}).await?;
        Ok(())
    }
}

struct Notify(Seen);

impl Handler<Shipped> for Notify {
    type Error = String;
    async fn handle(&self, _shipped: Shipped, ctx: &Context) -> Result<(), Self::Error> {
        tracing::info!("notifying");
        self.0
             .0
            .lock()
            .unwrap()
            .push(("notify", ctx.header("traceparent").map(str::to_owned)));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traceparent_reaches_the_handlers_span_and_its_follow_up_continues_the_trace() {
    let logs = hexeract_tests::logs::Captured::install("info");
    let store = SqliteStore::in_memory().await.unwrap();
    store.migrate().await.unwrap();
    let seen = Seen::default();
    let worker = OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<Ordered, _>(Ship(seen.clone()), HandlerOptions::new().name("ship"))
        .register_handler_with::<Shipped, _>(
            Notify(seen.clone()),
            HandlerOptions::new().name("notify"),
        )
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    store
        .publish(vec![Envelope::new(&Ordered {})
            .unwrap()
            .with_header("traceparent", TRACEPARENT)])
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seen.0.lock().unwrap().len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "both handlers ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cancel.cancel();
    running.await.unwrap().unwrap();

    let seen = seen.0.lock().unwrap().clone();
    assert_eq!(
        seen[0],
        ("ship", Some(TRACEPARENT.to_owned())),
        "carried as published"
    );
    assert_eq!(seen[1].0, "follow_up");
    assert_eq!(seen[2].0, "notify");
    let follow_up = seen[2]
        .1
        .clone()
        .expect("the follow-up carries a traceparent");
    assert_eq!(
        seen[1].1.as_deref(),
        Some(follow_up.as_str()),
        "ctx.follow_up makes the envelope ctx.publish sends"
    );
    assert!(
        follow_up.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
        "same trace: {follow_up}"
    );
    assert_ne!(follow_up, TRACEPARENT, "a new hop");
    let logs = logs.text();
    for handler in ["ship", "notify"] {
        let line = logs
            .lines()
            .find(|line| line.contains(&format!("handler={handler}")))
            .unwrap_or_else(|| panic!("no log line of {handler} in:\n{logs}"));
        assert!(
            line.contains("trace_id=4bf92f3577b34da6a3ce929d0e0e4736"),
            "{line}"
        );
    }
    // The follow-up's parent id is the span id of the call that published it, as that call's
    // log lines give it: the hop points at a span that exists.
    let ship_line = logs
        .lines()
        .find(|line| line.contains("handler=ship"))
        .unwrap();
    let span_id = ship_line
        .split("span_id=")
        .nth(1)
        .and_then(|rest| rest.get(..16))
        .unwrap_or_else(|| panic!("the call's span id is logged: {ship_line}"));
    assert_eq!(
        follow_up,
        format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{span_id}-01"),
        "{ship_line}"
    );
}
