//! A scheduler process for the pause test (`tests/scheduler_pause.rs`): the test starts two,
//! stops one with SIGSTOP past its lease, and lets it go on with SIGCONT.
//!
//! ```text
//! SCHEDULER_CHILD_DATABASE_URL=postgres://… scheduler_child <schema> <lease_ms> <retry_ms>
//! ```
//!
//! It runs one [`SchedulerWorker`] over `<schema>` (already migrated, with a `ledger` table
//! made by the test) with one job, `pausable`, daily. Each run first records `(occurrence id,
//! attempt, pid)` in the ledger; the first attempt then sleeps 2 s and fails, the second fails
//! at once, later ones succeed; each marks its row `ended` just before it returns. Failures
//! retry after `<retry_ms>`.
//!
//! It prints `ready` once the worker is built and stops gracefully when its standard input
//! closes. The URL comes from the environment, so that no password shows in `ps`.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use futures_util::future::BoxFuture;
use hexeract::schedule::{ScheduledJob, SchedulerWorker, Spec};
use hexeract::store::postgres::PgStore;
use hexeract::{CancellationToken, Context, HandlerOutcome};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

/// The variable holding the database URL.
const URL_VAR: &str = "SCHEDULER_CHILD_DATABASE_URL";

/// The job's name, which the test writes the schedule of.
pub const JOB: &str = "pausable";

/// The pool and the ledger insert, for the job (a plain function).
static LEDGER: OnceLock<(PgPool, String)> = OnceLock::new();

fn pausable(ctx: &Context) -> BoxFuture<'_, HandlerOutcome> {
    Box::pin(async move {
        let (pool, insert) = LEDGER.get().expect("set before the worker starts");
        let recorded = sqlx::query(insert)
            .bind(ctx.message_id())
            .bind(i32::try_from(ctx.attempt()).unwrap_or(i32::MAX))
            .bind(i32::try_from(std::process::id()).unwrap_or(-1))
            .execute(pool)
            .await;
        if let Err(error) = recorded {
            return HandlerOutcome::retry(format_args!("ledger: {error}"));
        }
        let outcome = match ctx.attempt() {
            1 => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                HandlerOutcome::retry("the first run failed, late")
            }
            2 => HandlerOutcome::retry("the second run failed"),
            _ => HandlerOutcome::Ack,
        };
        // Tells the test the run is over: its settle follows at once.
        let (pool, _) = LEDGER.get().expect("set before the worker starts");
        let ended = format!(
            "UPDATE {} SET ended = true WHERE attempt = $1 AND pid = $2",
            ledger_table()
        );
        let _ = sqlx::query(&ended)
            .bind(i32::try_from(ctx.attempt()).unwrap_or(i32::MAX))
            .bind(i32::try_from(std::process::id()).unwrap_or(-1))
            .execute(pool)
            .await;
        outcome
    })
}

/// The ledger's quoted name.
fn ledger_table() -> &'static str {
    LEDGER_TABLE.get().expect("set before the worker starts")
}

static LEDGER_TABLE: OnceLock<String> = OnceLock::new();

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("scheduler_child: {problem}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [schema, lease_ms, retry_ms] = args.as_slice() else {
        return Err("usage: scheduler_child <schema> <lease_ms> <retry_ms>".to_owned());
    };
    let millis = |what: &str, value: &str| {
        value
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{what} must be a whole number, not {value:?}"))
    };
    let lease = millis("lease_ms", lease_ms)?;
    let retry = millis("retry_ms", retry_ms)?;
    let url = std::env::var(URL_VAR).map_err(|_| format!("{URL_VAR} is not set"))?;
    let options: PgConnectOptions = url
        .parse()
        .map_err(|_| format!("{URL_VAR} is not a postgres:// URL"))?;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(
            options
                .application_name(&format!("hxs-child-{schema}"))
                .disable_statement_logging(),
        )
        .await
        .map_err(|error| format!("cannot reach PostgreSQL at {URL_VAR}: {error}"))?;
    let store = PgStore::new(pool.clone(), schema).map_err(|e| e.to_string())?;
    let insert = format!(
        "INSERT INTO {}.ledger (message_id, attempt, pid) VALUES ($1, $2, $3)",
        store.schema().quoted()
    );
    LEDGER
        .set((pool, insert))
        .map_err(|_| "set twice".to_owned())?;
    LEDGER_TABLE
        .set(format!("{}.ledger", store.schema().quoted()))
        .map_err(|_| "set twice".to_owned())?;
    let worker = SchedulerWorker::builder(store)
        .job(job())
        // The lease covers a run's whole timeout and the room to settle it (the store
        // timeout), as the builder requires: 3/4 of it for the run, 1/4 for the settle.
        .lease(lease)
        .dispatch_timeout(lease * 3 / 4)
        .store_timeout(lease / 4)
        .retry_delays(retry, retry)
        .poll_interval(Duration::from_millis(20))
        .build()
        .map_err(|e| e.to_string())?;

    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    std::thread::spawn(move || {
        // Standard input closes when the test drops its end (or dies).
        for _ in std::io::stdin().lock().lines() {}
        stop.cancel();
    });
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    worker.run(cancel).await.map_err(|e| e.to_string())
}

/// The child's one job; the test uses the same definition to write its schedule.
pub fn job() -> ScheduledJob {
    ScheduledJob::new(JOB, Spec::Every(Duration::from_secs(86_400)), pausable)
}
