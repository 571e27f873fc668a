//! One trace through every hop, with OpenTelemetry (feature `opentelemetry`): a root span (an
//! HTTP request, say) enqueues a message in the outbox; the handler's call is the child of the
//! message's `create` span, its retry too; its `ctx.publish` is a `create` span under the call,
//! and the second handler's call is that one's child. On the embedded store, through the relay
//! and RabbitMQ, and through the relay and Kafka. The spans come from the SDK's in-memory
//! exporter behind `tracing-opentelemetry`, installed as the process's subscriber (nextest runs
//! each test in a process of its own).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hexeract::config::{Amqp, Database, Kafka};
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::{DeadLetterStore, DeliveryStore};
use hexeract::{handler, App, AppConfig, CancellationToken, Context, Message};
use hexeract_tests::temp::TempDir;
use opentelemetry::trace::{SpanId, SpanKind, Status, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "traced.OrderPlaced", aggregate = "order")]
struct OrderPlaced {
    #[message(key)]
    order_id: u64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "traced.StockReserved", aggregate = "stock")]
struct StockReserved {
    #[message(key)]
    order_id: u64,
}

static RESERVED: AtomicBool = AtomicBool::new(false);

/// Fails its first call; on the second, publishes the follow-up.
#[handler(message = "traced.OrderPlaced", name = "traced.reserve")]
async fn reserve(order: OrderPlaced, ctx: &Context) -> Result<(), String> {
    if ctx.attempt() == 1 {
        return Err("the warehouse did not answer".to_owned());
    }
    ctx.publish(&StockReserved {
        order_id: order.order_id,
    })
    .await
    .map_err(|error| error.to_string())?;
    Ok(())
}

#[handler(message = "traced.StockReserved", name = "traced.notify")]
async fn notify(_reserved: StockReserved, _ctx: &Context) -> Result<(), String> {
    RESERVED.store(true, Ordering::SeqCst);
    Ok(())
}

/// With an aggregate like the others: a Kafka worker refuses to start with a handler whose
/// message has none.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "traced.Refund", aggregate = "refund")]
struct Refund {
    #[message(key)]
    order_id: u64,
}

/// Set once the dead letter was replayed: the refund then succeeds.
static REPLAYED: AtomicBool = AtomicBool::new(false);
static REFUNDED: AtomicBool = AtomicBool::new(false);

#[handler(message = "traced.Refund", name = "traced.refund")]
async fn refund(_refund: Refund, _ctx: &Context) -> Result<(), String> {
    if !REPLAYED.load(Ordering::SeqCst) {
        return Err("the payment provider refused".to_owned());
    }
    REFUNDED.store(true, Ordering::SeqCst);
    Ok(())
}

/// The process's subscriber: every span goes to the in-memory exporter as it ends.
fn install() -> (InMemorySpanExporter, SdkTracerProvider) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("hexeract-tests")));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    (exporter, provider)
}

fn config(dir: &TempDir) -> AppConfig {
    let mut config = AppConfig {
        database: Database::Sqlite(dir.join("outbox.db")),
        worker_port: 0,
        relay_poll_interval: Duration::from_millis(50),
        ..AppConfig::default()
    };
    config.policy.retry = config
        .policy
        .retry
        .clone()
        .initial_delay(Duration::from_millis(50))
        .jitter(0.0);
    config.policy.shutdown_grace = Duration::from_secs(2);
    config
}

/// Runs `config`'s worker, enqueues one order inside an `http.request` span, waits for the
/// follow-up to be handled and returns every span ended meanwhile.
async fn one_order(dir: &TempDir, config: AppConfig, system: &str) -> Vec<SpanData> {
    let (exporter, provider) = install();
    let store = SqliteStore::open(dir.join("outbox.db")).await.unwrap();
    store.migrate().await.unwrap();
    let mut config = config;
    let port = hexeract_tests::http::free_port();
    config.worker_port = port;
    config.worker_addr = [127, 0, 0, 1].into();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(App::new(config).try_run(cancel.clone()));
    // Every loop ready (on Kafka: each consumer group joined) before the order is placed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while hexeract_tests::http::get(port, "/health/ready")
        .await
        .map(|(status, _)| status)
        != Some(200)
    {
        if running.is_finished() {
            panic!("the worker stopped on {system}: {:?}", running.await);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready within 60 s on {system}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    enqueue_in_a_request(&store, &OrderPlaced { order_id: 7 }).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !RESERVED.load(Ordering::SeqCst) {
        if tokio::time::Instant::now() > deadline {
            let _ = provider.force_flush();
            panic!(
                "the follow-up was not handled within 90 s on {system}; the spans so far:\n{}",
                tree(&exporter.get_finished_spans().unwrap_or_default())
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    running.await.unwrap().unwrap();
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    println!("the trace on {system}:\n{}", tree(&spans));
    spans
}

/// Enqueues `message` in a transaction of its own, inside an `http.request` span (kind server):
/// the root of the trace, as a web request would be.
async fn enqueue_in_a_request<M: Message>(store: &SqliteStore, message: &M) {
    let request = tracing::info_span!("http.request", otel.kind = "server");
    async {
        let mut tx = store.pool().begin().await.unwrap();
        hexeract::outbox::enqueue(&mut tx, message).await.unwrap();
        tx.commit().await.unwrap();
    }
    .instrument(request)
    .await;
}

/// The spans of one trace as an indented tree, each with its kind and Hexeract's attributes.
fn tree(spans: &[SpanData]) -> String {
    let mut children: HashMap<SpanId, Vec<&SpanData>> = HashMap::new();
    for span in spans {
        children.entry(span.parent_span_id).or_default().push(span);
    }
    fn render(
        out: &mut String,
        children: &HashMap<SpanId, Vec<&SpanData>>,
        parent: SpanId,
        depth: usize,
    ) {
        let mut spans = children.get(&parent).cloned().unwrap_or_default();
        spans.sort_by_key(|span| span.start_time);
        for span in spans {
            if !span.name.starts_with("process")
                && !span.name.starts_with("create")
                && span.name != "http.request"
                && span.name != "send"
            {
                continue;
            }
            let attribute = |key: &str| {
                span.attributes
                    .iter()
                    .find(|kv| kv.key.as_str() == key)
                    .map(|kv| kv.value.to_string())
            };
            let mut line = format!(
                "{}{} [{:?}] span {}",
                "  ".repeat(depth),
                span.name,
                span.span_kind,
                span.span_context.span_id()
            );
            for key in ["messaging.system", "hexeract.attempt", "hexeract.outcome"] {
                if let Some(value) = attribute(key) {
                    line.push_str(&format!(" {key}={value}"));
                }
            }
            for link in span.links.iter() {
                line.push_str(&format!(" (links to {})", link.span_context.span_id()));
            }
            out.push_str(&line);
            out.push('\n');
            render(out, children, span.span_context.span_id(), depth + 1);
        }
    }
    let mut out = String::new();
    render(&mut out, &children, SpanId::INVALID, 0);
    out
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The one span named `name`.
fn only<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found: Vec<&SpanData> = spans.iter().filter(|span| span.name == name).collect();
    assert_eq!(found.len(), 1, "one span named {name}: {}", tree(spans));
    found[0]
}

/// The trace's shape, whatever the world: request → create → process (twice: the retry) →
/// create → process, one trace id, each parent checked.
fn assert_one_linked_trace(spans: &[SpanData], system: &str) {
    let request = only(spans, "http.request");
    let trace_id = request.span_context.trace_id();
    let created = only(spans, "create traced.OrderPlaced");
    assert_eq!(created.span_kind, SpanKind::Producer);
    assert_eq!(
        created.parent_span_id,
        request.span_context.span_id(),
        "{}",
        tree(spans)
    );
    assert_eq!(
        attribute(created, "messaging.destination.name").as_deref(),
        Some("traced.OrderPlaced")
    );

    let mut calls: Vec<&SpanData> = spans
        .iter()
        .filter(|span| span.name == "process traced.OrderPlaced")
        .collect();
    calls.sort_by_key(|span| attribute(span, "hexeract.attempt"));
    assert_eq!(calls.len(), 2, "a call and its retry: {}", tree(spans));
    for (attempt, call) in calls.iter().enumerate() {
        assert_eq!(call.span_kind, SpanKind::Consumer);
        assert_eq!(call.span_context.trace_id(), trace_id, "{}", tree(spans));
        assert_eq!(
            call.parent_span_id,
            created.span_context.span_id(),
            "attempt {} is a child of the message's create span: {}",
            attempt + 1,
            tree(spans)
        );
        assert_eq!(
            attribute(call, "hexeract.attempt"),
            Some((attempt + 1).to_string())
        );
        assert_eq!(attribute(call, "messaging.system").as_deref(), Some(system));
        assert_eq!(
            attribute(call, "messaging.operation.type").as_deref(),
            Some("process")
        );
        assert_eq!(
            attribute(call, "hexeract.handler").as_deref(),
            Some("traced.reserve")
        );
    }
    assert_ne!(
        calls[0].span_context.span_id(),
        calls[1].span_context.span_id()
    );
    assert_eq!(
        attribute(calls[0], "hexeract.outcome").as_deref(),
        Some("failed")
    );
    assert!(
        matches!(&calls[0].status, Status::Error { description } if description.contains("the warehouse did not answer")),
        "{:?}",
        calls[0].status
    );
    assert_eq!(
        attribute(calls[1], "hexeract.outcome").as_deref(),
        Some("handled")
    );

    let follow_up = only(spans, "create traced.StockReserved");
    assert_eq!(follow_up.span_kind, SpanKind::Producer);
    assert_eq!(follow_up.span_context.trace_id(), trace_id);
    assert_eq!(
        follow_up.parent_span_id,
        calls[1].span_context.span_id(),
        "ctx.publish is a child of the call that published: {}",
        tree(spans)
    );
    let second = only(spans, "process traced.StockReserved");
    assert_eq!(second.span_context.trace_id(), trace_id);
    assert_eq!(second.parent_span_id, follow_up.span_context.span_id());
    assert_eq!(
        attribute(second, "messaging.message.conversation_id"),
        attribute(calls[1], "messaging.message.conversation_id")
            .or_else(|| attribute(calls[1], "messaging.message.id")),
        "one conversation"
    );
}

/// The relay's `send` span of `system`: a producer span linked to the message's create span.
fn assert_relayed(spans: &[SpanData], system: &str) {
    let created = only(spans, "create traced.OrderPlaced");
    let sent = spans
        .iter()
        .filter(|span| span.name == "send")
        .find(|span| {
            span.links.iter().any(|link| {
                link.span_context.span_id() == created.span_context.span_id()
                    && link.span_context.trace_id() == created.span_context.trace_id()
            })
        })
        .unwrap_or_else(|| panic!("no send span linked to the create span: {}", tree(spans)));
    assert_eq!(sent.span_kind, SpanKind::Producer);
    assert_eq!(attribute(sent, "messaging.system").as_deref(), Some(system));
    assert_eq!(
        attribute(sent, "messaging.operation.type").as_deref(),
        Some("send")
    );
}

fn dir() -> TempDir {
    TempDir::new("hexeract-otel")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_through_the_embedded_store() {
    let dir = dir();
    let spans = one_order(&dir, config(&dir), "sqlite").await;
    assert_one_linked_trace(&spans, "sqlite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_through_the_relay_and_rabbitmq() {
    let broker = hexeract_tests::amqp::TestBroker::new().await;
    let dir = dir();
    let mut config = config(&dir);
    config.amqp = Some(Amqp {
        url: hexeract_tests::amqp::amqp_url(),
        exchange: broker.exchange.clone(),
        queue_prefix: broker.prefix.clone(),
        ..Amqp::new("")
    });
    let spans = one_order(&dir, config, "rabbitmq").await;
    assert_one_linked_trace(&spans, "rabbitmq");
    assert_relayed(&spans, "rabbitmq");
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_through_the_relay_and_kafka() {
    let kafka = hexeract_tests::kafka::TestKafka::tansu();
    let dir = dir();
    let mut config = config(&dir);
    config.kafka = Some(Kafka {
        brokers: kafka.brokers().to_owned(),
        topic_prefix: kafka.prefix.clone(),
        partitions: Some(1),
        // tansu is a single broker.
        replication_factor: Some(1),
        security: Default::default(),
    });
    let spans = one_order(&dir, config, "kafka").await;
    assert_one_linked_trace(&spans, "kafka");
    assert_relayed(&spans, "kafka");
    let call = spans
        .iter()
        .find(|span| span.name == "process traced.OrderPlaced")
        .unwrap();
    let group = attribute(call, "messaging.consumer.group.name").expect("a consumer group");
    assert!(group.contains("traced.reserve"), "{group}");
}

/// A message replayed from the dead letters is handled in the trace it was published in: the
/// replayed call is a second `process` span under the same `create` span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_dead_letter_is_handled_in_its_trace() {
    let dir = dir();
    let (exporter, provider) = install();
    let store = SqliteStore::open(dir.join("outbox.db")).await.unwrap();
    store.migrate().await.unwrap();
    let mut config = config(&dir);
    config.policy.retry = config
        .policy
        .retry
        .clone()
        .max_deliveries(std::num::NonZeroU32::new(1).unwrap());
    let cancel = CancellationToken::new();
    let running = tokio::spawn(App::new(config).listen(false).try_run(cancel.clone()));
    enqueue_in_a_request(&store, &Refund { order_id: 9 }).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let letter = loop {
        if let Some(letter) = store.dead_letters(10).await.unwrap().into_iter().next() {
            break letter;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dead letter within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    REPLAYED.store(true, Ordering::SeqCst);
    assert!(store.replay_dead_letter(letter.id).await.unwrap());
    while !REFUNDED.load(Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replay was not handled within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    running.await.unwrap().unwrap();
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let created = only(&spans, "create traced.Refund");
    let calls: Vec<&SpanData> = spans
        .iter()
        .filter(|span| span.name == "process traced.Refund")
        .collect();
    assert_eq!(
        calls.len(),
        2,
        "the call and the replayed call: {}",
        tree(&spans)
    );
    for call in &calls {
        assert_eq!(
            call.parent_span_id,
            created.span_context.span_id(),
            "{}",
            tree(&spans)
        );
        assert_eq!(
            call.span_context.trace_id(),
            created.span_context.trace_id()
        );
    }
    let outcomes: Vec<Option<String>> = calls
        .iter()
        .map(|call| attribute(call, "hexeract.outcome"))
        .collect();
    assert!(
        outcomes.contains(&Some("failed".to_owned())),
        "{outcomes:?}"
    );
    assert!(
        outcomes.contains(&Some("handled".to_owned())),
        "{outcomes:?}"
    );
}
