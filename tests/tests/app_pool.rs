//! `App::pool`: the worker keeps Hexeract's tables on the application's own PostgreSQL pool
//! (here on a database only that pool reaches), migrates them there, and delivers from there.

use std::time::Duration;

use hexeract::config::Database;
use hexeract::testing::TestDatabase;
use hexeract::{
    handler, App, AppConfig, CancellationToken, Context, HandlerOutcome, Message, State,
};
use hexeract_tests::temp::TempDir;
use tokio::sync::mpsc;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "app_pool.Ping")]
struct Ping {
    n: u32,
}

#[derive(Clone)]
struct Seen(mpsc::UnboundedSender<u32>);

#[handler(message = "app_pool.Ping", name = "app_pool.record")]
async fn record(ping: Ping, _ctx: &Context, State(seen): State<Seen>) -> HandlerOutcome {
    let _ = seen.0.send(ping.n);
    HandlerOutcome::Ack
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_keeps_its_tables_and_delivers_on_the_applications_pool() {
    let database = TestDatabase::create(&hexeract_tests::pg::database_url())
        .await
        .unwrap_or_else(|error| {
            panic!("cannot create a test database ({error}); set TEST_DATABASE_URL")
        });
    // Settings that would put the store in an SQLite file: the pool takes its place.
    let dir = TempDir::new("app_pool");
    let sqlite = dir.join("unused.db");
    let (sender, mut seen) = mpsc::unbounded_channel();
    let app = App::new(AppConfig {
        database: Database::Sqlite(sqlite.clone()),
        ..AppConfig::default()
    })
    .listen(false)
    .pool(database.pool().clone())
    .state(Seen(sender));
    assert!(
        matches!(&app.config().database, Database::Postgres(url) if url.contains(database.name())),
        "the app's database is the pool's: {:?}",
        app.config().database
    );

    app.migrate().await.unwrap();
    let outbox: Option<String> = sqlx::query_scalar("SELECT to_regclass('hexeract.outbox')::text")
        .fetch_one(database.pool())
        .await
        .unwrap();
    assert_eq!(outbox.as_deref(), Some("hexeract.outbox"));
    assert!(!sqlite.exists(), "no SQLite store was opened");

    let cancel = CancellationToken::new();
    let running = tokio::spawn(app.try_run(cancel.clone()));
    // `hexeract::publish` writes to the process's store: the one on the app's pool.
    hexeract::publish(&Ping { n: 7 }).await.unwrap();
    let delivered = tokio::time::timeout(Duration::from_secs(30), seen.recv())
        .await
        .expect("the handler ran within 30 s");
    assert_eq!(delivered, Some(7));
    cancel.cancel();
    running.await.unwrap().unwrap();

    database.drop_database().await.unwrap();
}
