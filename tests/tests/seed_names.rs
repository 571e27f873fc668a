//! The names the seeds and earlier releases used, kept as deprecated aliases of the names that
//! say which is which (CHANGELOG.md, "Renamed"): the service notes' `WorkerConfig::from_env()` +
//! `Worker::new(config).try_run(…)`, the in-memory `Runtime` and `RuntimeBuilder`, and the
//! RabbitMQ relay's `OutboxRelay`. Code written with them compiles (with a deprecation warning)
//! and behaves as with the new names.
#![allow(deprecated)]

use std::time::Duration;

use hexeract::rabbitmq::{OutboxRelay, RabbitMqRelay};
use hexeract::{
    AppConfig, CancellationToken, Context, InMemoryStore, MemoryWorker, Message, Registry, Runtime,
    RuntimeBuilder, Worker, WorkerConfig,
};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "seed_names.Ping")]
struct Ping {
    n: u32,
}

struct Count(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl hexeract::Handler<Ping> for Count {
    type Error = String;
    async fn handle(&self, ping: Ping, _ctx: &Context) -> Result<(), Self::Error> {
        self.0
            .fetch_add(ping.n, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn the_old_names_are_the_new_types() {
    // Each alias is the very type: a value of one is a value of the other.
    fn same<T>(_: Option<T>, _: Option<T>) {}
    same::<Worker>(None, None::<hexeract::App>);
    same::<WorkerConfig>(None, None::<AppConfig>);
    same::<Runtime>(None, None::<MemoryWorker>);
    same::<RuntimeBuilder>(None, None::<hexeract::MemoryWorkerBuilder>);
    same::<OutboxRelay>(None, None::<RabbitMqRelay>);
    // The service notes' settings, built the old way, are the new defaults.
    assert_eq!(
        format!("{:?}", WorkerConfig::default()),
        format!("{:?}", AppConfig::default())
    );
    let worker = Worker::new(WorkerConfig::default()).listen(false);
    assert_eq!(
        format!("{:?}", worker.config()),
        format!("{:?}", AppConfig::default())
    );
}

#[tokio::test]
async fn a_runtime_built_by_its_old_name_delivers() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let store = InMemoryStore::new();
    let runtime: Runtime = RuntimeBuilder::default()
        .store(store.clone())
        .registry(Registry::new())
        .register_handler::<Ping, _>(Count(calls.clone()))
        .build()
        .expect("the runtime builds");
    let cancel = CancellationToken::new();
    let running = tokio::spawn(runtime.run(cancel.clone()));
    store.publish(&Ping { n: 7 }).await.expect("published");
    tokio::time::timeout(Duration::from_secs(10), store.wait_idle())
        .await
        .expect("idle within 10 s");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 7);
    cancel.cancel();
    running
        .await
        .expect("the runtime did not panic")
        .expect("the runtime stopped cleanly");
}
