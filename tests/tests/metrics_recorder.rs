//! Hexeract's series go through the `metrics` facade: a recorder the application installed
//! gets exactly what happened (handled, retried by reason, dead-lettered by reason), and with
//! none installed, `/metrics` serves the same values as Prometheus text.
//!
//! Each test is a process of its own under nextest (a process has one global recorder), and
//! runs a worker on an SQLite file of its own.

use std::collections::BTreeMap;
use std::time::Duration;

use hexeract::config::Database;
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::DeliveryStore;
use hexeract::{handler, App, AppConfig, CancellationToken, Context, Envelope, Message};
use hexeract_tests::temp::TempDir;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "metered.Job")]
struct Job {
    n: u32,
    fail_first: bool,
}

#[handler(message = "metered.Job", name = "metered.work")]
async fn work(job: Job, ctx: &Context) -> Result<(), String> {
    if job.fail_first && ctx.attempt() == 1 {
        return Err(format!("job {} failed on its first call", job.n));
    }
    Ok(())
}

/// A worker on a new SQLite file, with retries 20 ms apart.
fn worker() -> (TempDir, App) {
    let dir = TempDir::new("hexeract-metrics");
    let mut config = AppConfig {
        database: Database::Sqlite(dir.join("outbox.db")),
        worker_port: 0,
        ..AppConfig::default()
    };
    config.policy.retry = config
        .policy
        .retry
        .clone()
        .initial_delay(Duration::from_millis(20))
        .jitter(0.0);
    config.policy.shutdown_grace = Duration::from_secs(2);
    (dir, App::new(config).listen(false))
}

/// Runs `worker` while one job is handled, one fails once and is handled on its retry, and one
/// whose payload does not decode is dead-lettered; stops it once the store owes nothing.
/// `during` runs before the stop, with the worker still running.
async fn one_of_each<F: std::future::Future<Output = ()>>(
    dir: &TempDir,
    worker: App,
    during: impl FnOnce() -> F,
) {
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.try_run(cancel.clone()));
    let store = SqliteStore::open(dir.join("outbox.db"))
        .await
        .expect("open the file");
    store.migrate().await.unwrap();
    let mut undecodable = Envelope::new(&Job {
        n: 3,
        fail_first: false,
    })
    .unwrap();
    undecodable.payload = b"{\"n\": \"three\"}".to_vec().into();
    store
        .publish(vec![
            Envelope::new(&Job {
                n: 1,
                fail_first: false,
            })
            .unwrap(),
            Envelope::new(&Job {
                n: 2,
                fail_first: true,
            })
            .unwrap(),
            undecodable,
        ])
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        hexeract::store::wait_until_drained(&store, Duration::from_millis(20)),
    )
    .await
    .expect("the three messages are settled within 30 s")
    .unwrap();
    during().await;
    cancel.cancel();
    running.await.unwrap().unwrap();
}

/// The series of `name` of the handler `metered.work` as `labels → value`, labels written
/// `k=v,k=v` (the binary's other handler, `metered.slow`, is in the worker too).
fn series(values: &[(String, String, f64)], name: &str) -> BTreeMap<String, f64> {
    values
        .iter()
        .filter(|(series, labels, _)| series == name && labels.starts_with("handler=metered.work"))
        .map(|(_, labels, value)| (labels.clone(), *value))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorder_of_the_application_gets_exactly_what_happened() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("no recorder installed yet in this process");
    let (dir, worker) = worker();
    let router = worker.router();
    one_of_each(&dir, worker, || async {}).await;

    let mut values = Vec::new();
    let mut durations = 0;
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        let value = match value {
            DebugValue::Counter(count) => count as f64,
            DebugValue::Gauge(value) => value.into_inner(),
            DebugValue::Histogram(samples) => {
                if key.name() == hexeract::metrics::HANDLER_DURATION {
                    durations += samples.len();
                }
                samples.len() as f64
            }
        };
        values.push((key.name().to_owned(), labels.join(","), value));
    }
    assert_eq!(
        series(&values, hexeract::metrics::HANDLED),
        BTreeMap::from([("handler=metered.work".to_owned(), 2.0)]),
        "job 1, and job 2 on its retry"
    );
    assert_eq!(
        series(&values, hexeract::metrics::RETRIED),
        BTreeMap::from([("handler=metered.work,reason=handler_failed".to_owned(), 1.0)])
    );
    let dead = series(&values, hexeract::metrics::DEAD_LETTERED);
    assert_eq!(
        dead.get("handler=metered.work,reason=payload_invalid"),
        Some(&1.0),
        "{dead:?}"
    );
    assert_eq!(
        dead.values().sum::<f64>(),
        1.0,
        "one dead letter in all: {dead:?}"
    );
    assert!(
        dead.keys().all(|labels| hexeract::Reason::ALL
            .iter()
            .any(|reason| labels.ends_with(&format!("reason={reason}")))
            || labels.ends_with("reason=other")),
        "every reason label is one of Reason::ALL or other: {dead:?}"
    );
    // Four calls were timed: job 1, job 2 twice, and the undecodable one, whose call ended at
    // decoding.
    assert_eq!(durations, 4, "{values:?}");
    assert_eq!(
        series(&values, hexeract::metrics::IN_FLIGHT),
        BTreeMap::from([("handler=metered.work".to_owned(), 0.0)]),
        "every call that started ended"
    );
    // The worker's own endpoint has nothing to render: the series went to this recorder.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let (status, body) = hexeract_tests::http::get(port, "/metrics").await.unwrap();
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("recorder of its own"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_recorder_metrics_serves_the_same_values_as_prometheus_text() {
    let (dir, worker) = worker();
    let router = worker.router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let scraped = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let into = scraped.clone();
    one_of_each(&dir, worker, || async move {
        // The store's gauges are sampled at most every 5 s (the worker sampled them as it
        // started): scraped until a sample taken after the work shows.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let (status, body) = hexeract_tests::http::get(port, "/metrics").await.unwrap();
            assert_eq!(status, 200, "{body}");
            let sampled = body.lines().any(|line| line == "hexeract_outbox_backlog 0");
            if sampled || tokio::time::Instant::now() > deadline {
                *into.lock().unwrap() = body;
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let text = scraped.lock().unwrap().clone();
    for line in [
        "# TYPE hexeract_messages_handled_total counter",
        "hexeract_messages_handled_total{handler=\"metered.work\"} 2",
        "hexeract_messages_retried_total{handler=\"metered.work\",reason=\"handler_failed\"} 1",
        "hexeract_messages_dead_lettered_total{handler=\"metered.work\",reason=\"payload_invalid\"} 1",
        "hexeract_messages_dead_lettered_total{handler=\"metered.work\",reason=\"handler_timeout\"} 0",
        "# TYPE hexeract_handler_duration_seconds histogram",
        "hexeract_handler_duration_seconds_count{handler=\"metered.work\"} 4",
        "hexeract_handler_in_flight{handler=\"metered.work\"} 0",
        "hexeract_outbox_backlog 0",
        "hexeract_outbox_oldest_pending_seconds 0",
        "hexeract_component_ready{component=\"outbox worker\"} 1",
    ] {
        assert!(
            text.lines().any(|candidate| candidate == line),
            "`{line}` missing from:\n{text}"
        );
    }
    assert!(
        text.contains(
            "hexeract_handler_duration_seconds_bucket{handler=\"metered.work\",le=\"0.001\"}"
        ),
        "the histogram has the 1 ms bucket: {text}"
    );
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "metered.Slow")]
struct Slow {
    n: u32,
}

/// Set when the slow handler's sleep is over.
static SLOW_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[handler(message = "metered.Slow", name = "metered.slow")]
async fn slow(_slow: Slow, _ctx: &Context) -> Result<(), String> {
    tokio::time::sleep(Duration::from_millis(800)).await;
    SLOW_DONE.store(true, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// A call past its timeout is abandoned, not dropped: it runs on, and counts as in flight
/// until it really ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_call_counts_in_flight_until_it_ends() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("no recorder installed yet in this process");
    let in_flight = || {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find(|(key, ..)| {
                key.key().name() == hexeract::metrics::IN_FLIGHT
                    && key
                        .key()
                        .labels()
                        .any(|label| label.value() == "metered.slow")
            })
            .map(|(_, _, _, value)| match value {
                DebugValue::Gauge(value) => value.into_inner(),
                other => panic!("not a gauge: {other:?}"),
            })
    };
    let store = hexeract::InMemoryStore::new();
    let runtime = hexeract::MemoryWorker::builder()
        .store(store.clone())
        .handlers_where(|info| info.name == "metered.slow")
        .handler_timeout(Duration::from_millis(100))
        .max_deliveries(1)
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let running = tokio::spawn(runtime.run(cancel.clone()));
    store.publish(&Slow { n: 1 }).await.unwrap();
    // Dead-lettered as handler_timeout after 100 ms, while the call sleeps on.
    tokio::time::timeout(Duration::from_secs(10), store.wait_idle())
        .await
        .expect("settled");
    assert_eq!(store.dead_letters().len(), 1);
    assert!(!SLOW_DONE.load(std::sync::atomic::Ordering::SeqCst));
    // The debugging recorder's snapshot takes a gauge's value and sets it back to 0: each read
    // is the change since the one before.
    assert_eq!(in_flight(), Some(1.0), "the abandoned call still runs");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !SLOW_DONE.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        in_flight(),
        Some(-1.0),
        "the call ended: one less than at the last read"
    );
    cancel.cancel();
    running.await.unwrap().unwrap();
}
