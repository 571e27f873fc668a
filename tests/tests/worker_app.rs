//! `hexeract::App`, the application builder: an `AppConfig` built in code, state for
//! `#[handler]` fns and `#[scheduled]` jobs, middleware, a handler written as a type, the one
//! error that lists every missing state before anything starts, `cli::execute_with` on the same
//! worker, and the test harness with state.
//!
//! The worker runs on an SQLite file of the test's own (and `WORKER_PORT` 0), so tests run in
//! parallel; nextest runs each in a process of its own (two tests set the process's
//! environment, and the process store is opened once per process).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hexeract::config::Database;
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::{DeadLetterStore, DeliveryStore};
use hexeract::testing::Harness;
use hexeract::{
    handler, scheduled, App, AppConfig, CancellationToken, Context, Envelope, Error, Handler,
    HandlerOptions, HandlerOutcome, Message, Middleware, Next, RegistryError, State,
};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "app.Ping")]
struct Ping {
    n: u32,
}

/// What the handlers and middleware write down, shared with the test as state.
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    fn note(&self, line: impl Into<String>) {
        self.0.lock().unwrap().push(line.into());
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// The warehouse's name, a second piece of state.
#[derive(Clone)]
struct Warehouse(&'static str);

#[handler(message = "app.Ping", name = "app.stateful")]
async fn stateful(
    ping: Ping,
    _ctx: &Context,
    State(journal): State<Journal>,
    State(warehouse): State<Warehouse>,
) -> Result<(), String> {
    journal.note(format!("stateful {} at {}", ping.n, warehouse.0));
    Ok(())
}

/// Runs every second, so that a worker's run sees it fire.
#[scheduled(every = "1s", name = "app.nightly", catch_up = "none")]
async fn nightly(_ctx: &Context, State(journal): State<Journal>) -> Result<(), String> {
    journal.note("nightly");
    Ok(())
}

/// A handler written as a type: its state is its field.
struct Typed {
    journal: Journal,
}

impl Handler<Ping> for Typed {
    type Error = String;

    async fn handle(&self, ping: Ping, _ctx: &Context) -> Result<(), Self::Error> {
        self.journal.note(format!("typed {}", ping.n));
        Ok(())
    }
}

/// Writes down each call it wraps, with the outcome.
struct Around {
    label: &'static str,
    journal: Journal,
}

impl Middleware for Around {
    async fn handle(&self, ctx: &Context, next: Next<'_>) -> HandlerOutcome {
        let outcome = next.run(ctx).await;
        self.journal.note(format!(
            "{} {} {}",
            self.label,
            ctx.handler_name(),
            if outcome.is_ack() { "ack" } else { "not ack" }
        ));
        outcome
    }
}

/// An SQLite file of the test's own, removed at the end.
struct File(PathBuf);

impl File {
    fn new() -> File {
        File(std::env::temp_dir().join(format!("hexeract-app-{}.db", uuid::Uuid::now_v7())))
    }

    fn config(&self) -> AppConfig {
        let mut config = AppConfig {
            database: Database::Sqlite(self.0.clone()),
            worker_port: 0,
            ..AppConfig::default()
        };
        config.policy.shutdown_grace = Duration::from_secs(2);
        config
    }
}

impl Drop for File {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

#[tokio::test]
async fn missing_state_of_handlers_and_jobs_is_one_error_before_anything_starts() {
    let file = File::new();
    let error = App::new(file.config())
        .try_run(CancellationToken::new())
        .await
        .expect_err("the state is missing");
    let Error::Registry(RegistryError::MissingState(missing)) = &error else {
        panic!("not the missing-state error: {error}");
    };
    let handler_line = line_of("async fn stateful(");
    let job_line = line_of("async fn nightly(");
    assert_eq!(
        error.to_string(),
        format!(
            "handlers take state that was not given to the worker; give each value with \
             `.state(value)` on `hexeract::App` (or on the worker's builder) before it runs:\n  \
             `app.stateful` (tests/tests/worker_app.rs:{handler_line}:10) takes \
             `State<Journal>` and `State<Warehouse>`\n  \
             `app.nightly` (tests/tests/worker_app.rs:{job_line}:10) takes \
             `State<Journal>`"
        )
    );
    assert_eq!(missing.len(), 3);
    // Nothing started: not even the store was opened.
    assert!(!file.0.exists(), "the store was created before the check");

    // One of the two given: the rest is still named.
    let error = App::new(file.config())
        .state(Journal::default())
        .try_run(CancellationToken::new())
        .await
        .expect_err("the warehouse is missing");
    assert!(
        error.to_string().ends_with(
            "`app.stateful` (tests/tests/worker_app.rs:{handler_line}:10) takes `State<Warehouse>`"
                .replace("{handler_line}", &handler_line.to_string())
                .as_str()
        ),
        "{error}"
    );
}

#[tokio::test]
async fn state_given_twice_is_an_error_before_anything_starts() {
    let file = File::new();
    let error = App::new(file.config())
        .state(Journal::default())
        .state(Warehouse("eu-west"))
        .state(Warehouse("us-east"))
        .try_run(CancellationToken::new())
        .await
        .expect_err("a second warehouse would replace the first");
    let Error::Registry(RegistryError::StateGivenTwice(types)) = &error else {
        panic!("not the state-given-twice error: {error}");
    };
    assert_eq!(types, &["worker_app::Warehouse"]);
    assert_eq!(
        error.to_string(),
        "state `worker_app::Warehouse` was given twice (`.state(…)`): a second value of a type \
         would replace the first; give each type once, and wrap values that share a type in \
         types of their own"
    );
    assert!(!file.0.exists(), "the store was created before the check");

    // The worker builders refuse it at `build()` the same way.
    let built = hexeract::MemoryWorker::builder()
        .store(hexeract::InMemoryStore::new())
        .state(Warehouse("eu-west"))
        .state(Journal::default())
        .state(Warehouse("us-east"))
        .build();
    assert!(
        matches!(
            built,
            Err(hexeract::BuildError::Registry(RegistryError::StateGivenTwice(ref types)))
                if types == &["worker_app::Warehouse"]
        ),
        "{built:?}"
    );
}

#[tokio::test]
async fn a_worker_built_in_code_runs_handlers_with_their_state_and_middleware() {
    let file = File::new();
    let journal = Journal::default();
    let cancel = CancellationToken::new();
    let worker = App::new(file.config())
        .state(journal.clone())
        .state(Warehouse("eu-west"))
        .middleware(Around {
            label: "outer",
            journal: journal.clone(),
        })
        .middleware_for(
            "app.stateful",
            Around {
                label: "by_name",
                journal: journal.clone(),
            },
        )
        // A middleware for the scheduled job's name is the job's, not an unknown handler.
        .middleware_for(
            "app.nightly",
            Around {
                label: "job",
                journal: journal.clone(),
            },
        )
        .register_handler_with::<Ping, _>(
            Typed {
                journal: journal.clone(),
            },
            HandlerOptions::new().name("app.typed").middleware(Around {
                label: "own",
                journal: journal.clone(),
            }),
        );
    let running = tokio::spawn(worker.try_run(cancel.clone()));

    // A producer of its own on the same file: the worker polls it.
    let store = SqliteStore::open(&file.0).await.expect("open the file");
    store.migrate().await.expect("migrate");
    store
        .publish(vec![Envelope::new(&Ping { n: 7 }).unwrap()])
        .await
        .expect("publish");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let expected = [
        "stateful 7 at eu-west",
        "by_name app.stateful ack",
        "outer app.stateful ack",
        "typed 7",
        "own app.typed ack",
        "outer app.typed ack",
        // The job, with its state, under the worker's middleware and its own by name.
        "nightly",
        "job app.nightly ack",
        "outer app.nightly ack",
    ];
    loop {
        let lines = journal.lines();
        if expected
            .iter()
            .all(|line| lines.contains(&line.to_string()))
        {
            break;
        }
        if running.is_finished() {
            panic!(
                "the worker stopped before every call: {:?}; calls: {lines:?}",
                running.await
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all calls within 30 s: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    running
        .await
        .expect("no panic")
        .expect("the worker stopped cleanly");
    let lines = journal.lines();
    // Each handler's own lines, innermost first.
    let order = |of: &[&str]| -> Vec<usize> {
        of.iter()
            .map(|line| lines.iter().position(|l| l == line).unwrap())
            .collect()
    };
    let stateful = order(&expected[..3]);
    assert!(stateful.windows(2).all(|w| w[0] < w[1]), "{lines:?}");
    let typed = order(&expected[3..6]);
    assert!(typed.windows(2).all(|w| w[0] < w[1]), "{lines:?}");
    let job = order(&expected[6..]);
    assert!(job.windows(2).all(|w| w[0] < w[1]), "{lines:?}");
    let dead = store.dead_letters(10).await.expect("read the dead letters");
    assert!(dead.is_empty(), "{dead:?}");
}

#[tokio::test]
async fn the_operations_commands_take_the_worker() {
    let file = File::new();
    let worker = App::new(file.config())
        .state(Journal::default())
        .state(Warehouse("eu-west"))
        .register_handler_with::<Ping, _>(
            Typed {
                journal: Journal::default(),
            },
            HandlerOptions::new().name("app.typed"),
        );
    let mut out = String::new();
    hexeract::cli::execute_with(worker, &["handlers".to_owned()], &mut out)
        .await
        .expect("handlers");
    assert!(
        out.contains("app.typed"),
        "a handler registered in code: {out}"
    );
    assert!(out.contains("app.stateful"), "{out}");
    assert!(out.contains("app.nightly"), "{out}");
    // And its store is the worker's file, not the environment's.
    assert!(file.0.exists(), "{out}");

    // Without the state, the commands refuse as `run` would.
    let mut out = String::new();
    let refused =
        hexeract::cli::execute_with(App::new(file.config()), &["handlers".to_owned()], &mut out)
            .await;
    assert!(
        matches!(&refused, Err(hexeract::cli::CliError::Failed(error)) if error.to_string().contains("`app.stateful`")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn the_test_harness_gives_state_and_says_when_it_is_missing() {
    let journal = Journal::default();
    let harness = Harness::new()
        .expect("harness")
        .state(journal.clone())
        .state(Warehouse("lab"));
    let deliveries = harness.deliver(&Ping { n: 1 }).await.unwrap();
    assert_eq!(
        deliveries.outcome("app.stateful"),
        Some(&HandlerOutcome::Ack)
    );
    assert_eq!(journal.lines(), ["stateful 1 at lab"]);

    let without = Harness::new().expect("harness");
    let deliveries = without.deliver(&Ping { n: 2 }).await.unwrap();
    match deliveries.outcome("app.stateful") {
        Some(HandlerOutcome::DeadLetter { reason, detail }) => {
            assert_eq!(reason, "state_missing");
            assert!(detail.contains(".state(value)"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn hexeract_publish_writes_where_a_worker_built_in_code_reads() {
    // No database variable: the environment would name ./hexeract.db, the worker names its own.
    for variable in ["DATABASE_URL", "HEXERACT_SQLITE_PATH"] {
        std::env::remove_var(variable);
    }
    let file = File::new();
    let journal = Journal::default();
    let cancel = CancellationToken::new();
    let worker = App::new(file.config())
        .state(journal.clone())
        .state(Warehouse("eu-west"));
    let running = tokio::spawn(worker.try_run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !file.0.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker did not open its store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // `hexeract::publish` writes to the process's store, which the worker made its own.
    hexeract::publish(&Ping { n: 42 }).await.expect("publish");
    while !journal
        .lines()
        .contains(&"stateful 42 at eu-west".to_owned())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the published message was not handled within 30 s: {:?}",
            journal.lines()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_worker_refuses_a_database_other_than_the_open_process_store() {
    let first = File::new();
    std::env::remove_var("DATABASE_URL");
    std::env::set_var("HEXERACT_SQLITE_PATH", &first.0);
    // Something published first: the process's store is the environment's.
    hexeract::publish(&Ping { n: 1 }).await.expect("publish");
    let other = File::new();
    let error = App::new(other.config())
        .state(Journal::default())
        .state(Warehouse("eu-west"))
        .try_run(CancellationToken::new())
        .await
        .expect_err("two stores in one process");
    let text = error.to_string();
    assert!(text.contains("already open on"), "{text}");
    assert!(text.contains(&first.0.display().to_string()), "{text}");
    assert!(text.contains(&other.0.display().to_string()), "{text}");
    assert!(!other.0.exists(), "the other database was not opened");
}

/// The line of this file that starts with `text`.
fn line_of(text: &str) -> usize {
    include_str!("worker_app.rs")
        .lines()
        .position(|line| line.starts_with(text))
        .expect("the line")
        + 1
}

/// `App::router()` serves the worker's health, readiness and metrics on the application's
/// own port (here nested under `/ops` beside a route of the application's), and with
/// `listen(false)` the worker binds no port of its own.
#[tokio::test]
async fn the_worker_s_endpoints_are_served_on_the_application_s_port() {
    let file = File::new();
    let own_port = hexeract_tests::http::free_port();
    let mut config = file.config();
    config.worker_port = own_port;
    let worker = App::new(config)
        .state(Journal::default())
        .state(Warehouse("eu-west"))
        .listen(false);
    let app = axum::Router::new()
        .route("/orders", axum::routing::get(|| async { "[]" }))
        .nest("/ops", worker.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cancel = CancellationToken::new();
    let serving =
        axum::serve(listener, app).with_graceful_shutdown(cancel.clone().cancelled_owned());
    let server = tokio::spawn(async move { serving.await });
    // Before the worker runs, its router says it is not ready.
    let (status, body) = hexeract_tests::http::get(port, "/ops/health/ready")
        .await
        .expect("the application's port answers");
    assert_eq!(status, 503, "{body}");
    let running = tokio::spawn(worker.try_run(cancel.clone()));
    let ready = hexeract_tests::http::wait_for_status(
        port,
        "/ops/health/ready",
        200,
        Duration::from_secs(30),
    )
    .await;
    assert!(ready.contains("scheduler: ready"), "{ready}");
    assert!(ready.contains("outbox worker"), "{ready}");
    let (status, metrics) = hexeract_tests::http::get(port, "/ops/metrics")
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains("hexeract_component_ready{component=\"scheduler\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("hexeract_outbox_backlog"),
        "the store's gauges: {metrics}"
    );
    assert_eq!(
        hexeract_tests::http::get(port, "/orders").await,
        Some((200, "[]".to_owned()))
    );
    assert_eq!(
        hexeract_tests::http::get(own_port, "/health").await,
        None,
        "listen(false): nothing on WORKER_PORT"
    );
    cancel.cancel();
    running.await.unwrap().unwrap();
    server.await.unwrap().unwrap();
}
