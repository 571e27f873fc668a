//! A worker process for the crash tests (`tests/outbox_crash.rs`): the test starts it, kills it
//! with SIGKILL, lets it abort, and starts it again.
//!
//! ```text
//! OUTBOX_CHILD_DATABASE_URL=postgres://… outbox_child <schema> <batch_size> <max_deliveries> <delay_ms>
//! ```
//!
//! It runs one [`OutboxWorker`] over the outbox in `<schema>` (already migrated, with a `ledger`
//! table made by the test) with two handlers of `crash.Job`, `first` and `second`, a lease of
//! 1 s so that a killed child's claims come back quickly, and a pool named
//! `hxc-child-<schema>`. Each call sleeps `<delay_ms>`, then records `(message id, handler,
//! attempt, pid)` in the ledger in a short transaction of its own, then returns `Ok(())`;
//! `first` aborts the process right after recording a job marked `abort`.
//!
//! It prints `ready` once the worker is built and stops gracefully (cancel, finish the cycle,
//! exit 0) when its standard input closes, so a child whose test died does not outlive it.
//! The URL comes from the environment, not the command line, so that no password shows in `ps`.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use hexeract::outbox::OutboxWorker;
use hexeract::store::postgres::PgStore;
use hexeract::{CancellationToken, Context, Handler, HandlerOptions, Message, Registry};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

/// The variable holding the database URL.
const URL_VAR: &str = "OUTBOX_CHILD_DATABASE_URL";

/// The crash tests' message.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "crash.Job")]
struct Job {
    n: u32,
    /// `first` aborts the process on this job, every time.
    abort: bool,
}

/// Records each call in the ledger; see the module documentation.
struct Ledger {
    pool: PgPool,
    insert: String,
    name: &'static str,
    delay: Duration,
}

impl Handler<Job> for Ledger {
    type Error = String;

    async fn handle(&self, job: Job, ctx: &Context) -> Result<(), Self::Error> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let attempt = i32::try_from(ctx.attempt()).unwrap_or(i32::MAX);
        let pid = i32::try_from(std::process::id()).unwrap_or(-1);
        let mut tx = self.pool.begin().await.map_err(|e| e.to_string())?;
        sqlx::query(&self.insert)
            .bind(ctx.message_id())
            .bind(self.name)
            .bind(attempt)
            .bind(pid)
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        if job.abort && self.name == "first" {
            std::process::abort();
        }
        Ok(())
    }
}

struct Args {
    schema: String,
    batch_size: u32,
    max_deliveries: u32,
    delay: Duration,
}

fn parse_args() -> Result<Args, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [schema, batch_size, max_deliveries, delay_ms] = args.as_slice() else {
        return Err(
            "usage: outbox_child <schema> <batch_size> <max_deliveries> <delay_ms>".to_owned(),
        );
    };
    let number = |what: &str, value: &str| {
        value
            .parse::<u32>()
            .map_err(|_| format!("{what} must be a whole number, not {value:?}"))
    };
    Ok(Args {
        schema: schema.clone(),
        batch_size: number("batch_size", batch_size)?,
        max_deliveries: number("max_deliveries", max_deliveries)?,
        delay: Duration::from_millis(number("delay_ms", delay_ms)?.into()),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(problem) => {
            eprintln!("outbox_child: {problem}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<(), String> {
    let args = parse_args()?;
    let url = std::env::var(URL_VAR).map_err(|_| format!("{URL_VAR} is not set"))?;
    let options: PgConnectOptions = url
        .parse()
        .map_err(|_| format!("{URL_VAR} is not a postgres:// URL"))?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(
            options
                .application_name(&format!("hxc-child-{}", args.schema))
                .disable_statement_logging(),
        )
        .await
        // The error names the host, never the password.
        .map_err(|error| format!("cannot reach PostgreSQL at {URL_VAR}: {error}"))?;

    let store = PgStore::new(pool.clone(), &args.schema).map_err(|e| e.to_string())?;
    let insert = format!(
        "INSERT INTO \"{}\".ledger (message_id, handler, attempt, pid) VALUES ($1, $2, $3, $4)",
        store.schema()
    );
    let ledger = |name: &'static str| Ledger {
        pool: pool.clone(),
        insert: insert.clone(),
        name,
        delay: args.delay,
    };
    let worker = OutboxWorker::builder(store)
        .registry(Registry::new())
        .register_handler_with::<Job, _>(ledger("first"), HandlerOptions::new().name("first"))
        .register_handler_with::<Job, _>(ledger("second"), HandlerOptions::new().name("second"))
        .batch_size(args.batch_size)
        .max_deliveries(args.max_deliveries)
        // The call's timeout and the room to settle it (the store timeout) fit in the lease.
        .lease(Duration::from_secs(1))
        .handler_timeout(Duration::from_millis(500))
        .store_timeout(Duration::from_millis(500))
        .retry_delays(Duration::from_millis(10), Duration::from_millis(100))
        .poll_interval(Duration::from_millis(20))
        .shutdown_grace(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;

    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    std::thread::spawn(move || {
        // Any input is ignored; end of input (the test closed the pipe or died) stops the worker.
        let mut line = String::new();
        let mut stdin = std::io::stdin().lock();
        while matches!(stdin.read_line(&mut line), Ok(n) if n > 0) {
            line.clear();
        }
        stop.cancel();
    });
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready").map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())?;

    worker.run(cancel).await.map_err(|e| e.to_string())
}
