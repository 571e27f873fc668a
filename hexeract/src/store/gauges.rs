//! The store's gauges ([`OUTBOX_BACKLOG`], [`OUTBOX_OLDEST_PENDING`], [`HANDLER_PENDING`],
//! [`HANDLER_OLDEST_PENDING`]): read from a store, set on the metrics recorder. Here, beside
//! the stores, so that the metrics (the engine's) need no store.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Store, StoreError};
use crate::metrics::{
    HANDLER_OLDEST_PENDING, HANDLER_PENDING, OUTBOX_BACKLOG, OUTBOX_OLDEST_PENDING, UNKNOWN,
};

/// Reads what the gauges show (each component's readiness; the store's backlog, oldest message
/// owed and deliveries owed per handler) and sets them, now, on `store`'s own pool: for a
/// process that drives its gauges itself. `run` and `/metrics` sample the store through a
/// cache of their own instead, at most every 5 s on a connection of its own, so that scrapes
/// cannot load the database or take the workers' connections. A store that cannot answer
/// leaves its gauges as they were.
///
/// ```no_run
/// # async fn example(store: std::sync::Arc<dyn hexeract::store::Store>) {
/// let health = hexeract::health::Health::new();
/// hexeract::store::sample_gauges(&health, Some(&*store)).await;
/// # }
/// ```
pub async fn sample_gauges(health: &crate::health::Health, store: Option<&dyn Store>) {
    crate::metrics::sample_health(health);
    if let Some(store) = store {
        sample_store(store).await;
    }
}

/// At most how often [`StoreGauges`] reads the store: a scrape within this long of the last
/// sample renders that sample's values. Shorter than Prometheus' usual scrape interval (15 s
/// or more), so that every scrape still sees values it has not seen, and long enough that a
/// scrape loop (or many Prometheus replicas) costs the database one round of three queries
/// per 5 s.
pub(crate) const STORE_SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// The store's gauges ([`OUTBOX_BACKLOG`], [`OUTBOX_OLDEST_PENDING`], [`HANDLER_PENDING`],
/// [`HANDLER_OLDEST_PENDING`]) as `/metrics` and `run`'s timer read them: sampled at most
/// once per interval however often they are asked for, concurrent requests waiting for the one
/// sample under way rather than starting their own, on a pool of one connection of its own
/// ([`Housekeeping::sampling_store`](super::Housekeeping::sampling_store), opened at the
/// first sample) that waits at most [`SAMPLE_TIMEOUT`] for the database. A scrape loop thus
/// never takes a connection the workers claim with, and a database that stalls holds a
/// scrape for at most three timeouts.
pub(crate) struct StoreGauges {
    store: Arc<dyn Store>,
    interval: Duration,
    state: tokio::sync::Mutex<Sampled>,
    rounds: AtomicU64,
}

/// What [`StoreGauges`] keeps between samples.
#[derive(Default)]
struct Sampled {
    /// When the last sample ended.
    at: Option<std::time::Instant>,
    /// The store on the samples' own pool, once the first sample opened it.
    sampler: Option<Arc<dyn Store>>,
}

impl StoreGauges {
    /// The gauges of `store`, sampled at most every [`STORE_SAMPLE_INTERVAL`].
    pub(crate) fn new(store: Arc<dyn Store>) -> StoreGauges {
        StoreGauges::every(store, STORE_SAMPLE_INTERVAL)
    }

    fn every(store: Arc<dyn Store>, interval: Duration) -> StoreGauges {
        StoreGauges {
            store,
            interval,
            state: tokio::sync::Mutex::new(Sampled::default()),
            rounds: AtomicU64::new(0),
        }
    }

    /// Samples the store unless the last sample is younger than the interval; waits for a
    /// sample under way.
    pub(crate) async fn sample(&self) {
        let mut state = self.state.lock().await;
        if state.at.is_some_and(|at| at.elapsed() < self.interval) {
            return;
        }
        let store = state
            .sampler
            .get_or_insert_with(|| {
                self.store
                    .sampling_store(SAMPLE_TIMEOUT)
                    .unwrap_or_else(|| self.store.clone())
            })
            .clone();
        sample_store(&*store).await;
        self.rounds.fetch_add(1, Ordering::Relaxed);
        state.at = Some(std::time::Instant::now());
    }

    /// How many samples read the store.
    #[cfg(test)]
    fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }
}

/// Reads the store's gauges (three queries) and sets them.
pub(crate) async fn sample_store(store: &dyn Store) {
    let now = chrono::Utc::now();
    let age = |published: Option<chrono::DateTime<chrono::Utc>>| {
        published.map_or(0.0, |published| {
            (now - published).to_std().unwrap_or_default().as_secs_f64()
        })
    };
    if let Some(oldest) = bounded(store.oldest_pending()).await {
        ::metrics::gauge!(OUTBOX_OLDEST_PENDING).set(age(oldest));
    }
    if let Some(backlog) = bounded(store.backlog()).await {
        ::metrics::gauge!(OUTBOX_BACKLOG).set(backlog as f64);
    }
    if let Some(owed) = bounded(store.pending_by_handler()).await {
        // A handler that owed deliveries at the last sample and owes none now reads 0.
        static OWING: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
        let mut owing = OWING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now_owing: BTreeSet<String> = owed
            .iter()
            .map(|pending| label_of(&pending.handler).to_owned())
            .collect();
        for handler in owing.difference(&now_owing) {
            ::metrics::gauge!(HANDLER_PENDING, "handler" => handler.clone()).set(0.0);
            ::metrics::gauge!(HANDLER_OLDEST_PENDING, "handler" => handler.clone()).set(0.0);
        }
        for pending in owed {
            let handler = label_of(&pending.handler).to_owned();
            ::metrics::gauge!(HANDLER_PENDING, "handler" => handler.clone())
                .set(pending.count as f64);
            ::metrics::gauge!(HANDLER_OLDEST_PENDING, "handler" => handler)
                .set(age(pending.oldest));
        }
        *owing = now_owing;
    }
}

/// How long [`sample_gauges`] waits for each of the store's answers, and [`StoreGauges`]' pool for
/// its connection.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(2);

/// The store's answer to `query`, or `None` when it failed or took longer than
/// [`SAMPLE_TIMEOUT`]: a store that stalls gives up its gauges for this sample, not the scrape
/// or the shutdown.
async fn bounded<T>(query: impl std::future::Future<Output = Result<T, StoreError>>) -> Option<T> {
    tokio::time::timeout(SAMPLE_TIMEOUT, query).await.ok()?.ok()
}

/// The `handler` label of deliveries of a handler named `handler` in the store (`""`: no
/// handler knew the message type).
fn label_of(handler: &str) -> &str {
    if handler.is_empty() {
        UNKNOWN
    } else {
        handler
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However many scrapes come, at once or one after another, the store is read once per
    /// interval.
    #[cfg(feature = "sqlite")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rapid_and_concurrent_samples_read_the_store_once_per_interval() {
        use crate::store::DeliveryStore;

        let dir = std::env::temp_dir().join(format!("hexeract-gauges-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = crate::store::sqlite::SqliteStore::open(dir.join("outbox.db"))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let interval = Duration::from_millis(1_500);
        let gauges = StoreGauges::every(Arc::new(store), interval);
        let started = std::time::Instant::now();
        futures_util::future::join_all((0..50).map(|_| gauges.sample())).await;
        assert_eq!(gauges.rounds(), 1, "50 at once share one sample");
        for _ in 0..50 {
            gauges.sample().await;
        }
        assert!(
            started.elapsed() < interval,
            "the test ran too slowly to tell"
        );
        assert_eq!(
            gauges.rounds(),
            1,
            "50 in a row within the interval read nothing"
        );
        tokio::time::sleep(interval).await;
        futures_util::future::join_all((0..50).map(|_| gauges.sample())).await;
        assert_eq!(gauges.rounds(), 2, "one more after the interval");
        let _ = std::fs::remove_dir_all(dir);
    }
}
