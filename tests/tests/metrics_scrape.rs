//! What a scrape loop on `/metrics` costs the workers: an outbox worker drains a backlog on
//! PostgreSQL (its own schema) with nobody scraping, then with a client scraping `/metrics`
//! 50 times a second, and prints both throughputs. A measurement, not a check: it runs only
//! when asked (`cargo nextest run -p hexeract-tests --test metrics_scrape --run-ignored
//! ignored-only --no-capture`); docs/reliability.md has the figures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hexeract::outbox::OutboxWorker;
use hexeract::store::postgres::PgStore;
use hexeract::store::DeliveryStore;
use hexeract::{CancellationToken, Context, Envelope, Handler, HandlerOptions, Message, Registry};
use hexeract_tests::pg::TestSchema;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "scrape.Tick")]
struct Tick {
    n: u32,
}

struct Count(Arc<AtomicU64>);

impl Handler<Tick> for Count {
    type Error = String;
    async fn handle(&self, _tick: Tick, _ctx: &Context) -> Result<(), Self::Error> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Messages per run: enough that the outbox's scans cost something while it drains.
const MESSAGES: u32 = 100_000;

/// Drains [`MESSAGES`] through one outbox worker on a pool of 4 connections, with `scrapes`
/// requests a second on `/metrics` meanwhile; returns messages per second and the scrapes
/// made.
async fn drain(scrapes: u32) -> (f64, u64) {
    let db = TestSchema::on(hexeract_tests::pg::connect("hexeract-tests-metrics-scrape", 4).await);
    let store: PgStore = db.migrated_store().await;
    for chunk in (0..MESSAGES).collect::<Vec<_>>().chunks(1_000) {
        let envelopes = chunk
            .iter()
            .map(|n| Envelope::new(&Tick { n: *n }).unwrap())
            .collect();
        store.publish(envelopes).await.unwrap();
    }
    let handled = Arc::new(AtomicU64::new(0));
    let worker = OutboxWorker::builder(store.clone())
        .registry(Registry::new())
        .register_handler_with::<Tick, _>(
            Count(handled.clone()),
            HandlerOptions::new().name("count"),
        )
        .batch_size(100)
        .build()
        .expect("worker builds");

    let cancel = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(hexeract::health::serve(
        listener,
        hexeract::health::Health::new(),
        Some(Arc::new(store.clone())),
        cancel.clone(),
    ));
    let scraped = Arc::new(AtomicU64::new(0));
    let scraper = (scrapes > 0).then(|| {
        let scraped = scraped.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1) / scrapes);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !cancel.is_cancelled() {
                every.tick().await;
                let scraped = scraped.clone();
                // Each scrape on its own, as Prometheus' would come: a slow one does not hold
                // the next back.
                tokio::spawn(async move {
                    if let Some((200, _)) = hexeract_tests::http::get(port, "/metrics").await {
                        scraped.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        })
    });

    let started = Instant::now();
    let running = tokio::spawn(worker.run(cancel.clone()));
    while handled.load(Ordering::Relaxed) < u64::from(MESSAGES) {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "drained in time"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    cancel.cancel();
    running.await.unwrap().unwrap();
    if let Some(scraper) = scraper {
        scraper.await.unwrap();
    }
    let _ = server.await;
    db.drop_schema().await;
    (
        f64::from(MESSAGES) / took.as_secs_f64(),
        scraped.load(Ordering::Relaxed),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it on purpose, on a quiet machine"]
async fn throughput_with_and_without_a_scrape_loop() {
    let mut quiet = Vec::new();
    let mut scraped = Vec::new();
    // Alternating, so that a change in the machine's load touches both sides.
    for round in 1..=5 {
        let (without, _) = drain(0).await;
        let (with, scrapes) = drain(50).await;
        println!(
            "round {round}: {without:.0} msg/s without scrapes, {with:.0} msg/s with 50 \
             scrapes/s ({scrapes} scrapes answered), {:+.1} %",
            (with / without - 1.0) * 100.0
        );
        quiet.push(without);
        scraped.push(with);
    }
    let (quiet, scraped) = (median(quiet), median(scraped));
    println!(
        "median: {quiet:.0} msg/s without scrapes, {scraped:.0} msg/s with 50 scrapes/s, \
         {:+.1} %",
        (scraped / quiet - 1.0) * 100.0
    );
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
