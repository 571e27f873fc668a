//! A bus worker process for the RabbitMQ crash test (`tests/rabbitmq_crash.rs`): the test
//! starts it, kills it with SIGKILL while it handles a poison message, and starts it again.
//!
//! ```text
//! AMQP_CHILD_URL=amqp://… amqp_child <exchange> <prefix> <max_attempts> [<prefetch> <delay_ms>]
//! ```
//!
//! It runs one [`RabbitMqWorker`](hexeract::rabbitmq::RabbitMqWorker) with one handler of `crash.Task`, named `crash.work`, on a
//! connection named `<prefix>.child`. A normal task prints `done <n>`; a task marked `hang`
//! prints `hang <n> <attempt>` and then never returns, so the test can kill the process in the
//! middle of the call. With `<prefetch>` and `<delay_ms>`, the worker takes that many deliveries
//! at a time and each call sleeps that long before printing `done <n> <attempt>`. It prints `ready` once the worker consumes its queue. The URL comes
//! from the environment, not the command line, so that no password shows in `ps`.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use hexeract::rabbitmq::{RabbitMqConnection, RabbitMqWorkerBuilder};
use hexeract::{CancellationToken, Context, Handler, HandlerOptions, Message, Registry};

/// The crash test's message.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "crash.Task")]
struct Task {
    n: u32,
    /// The handler hangs on this task, every time.
    hang: bool,
}

struct Work {
    delay: Duration,
}

impl Handler<Task> for Work {
    type Error = String;

    async fn handle(&self, task: Task, ctx: &Context) -> Result<(), Self::Error> {
        if task.hang {
            say(&format!("hang {} {}", task.n, ctx.attempt()));
            std::future::pending::<()>().await;
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        say(&format!("done {} {}", task.n, ctx.attempt()));
        Ok(())
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (exchange, prefix, max_attempts, tuning) = match &args[..] {
        [_, exchange, prefix, max_attempts] => (exchange, prefix, max_attempts, None),
        [_, exchange, prefix, max_attempts, prefetch, delay_ms] => {
            let prefetch: u32 = prefetch.parse().expect("prefetch is a number");
            let delay_ms: u64 = delay_ms.parse().expect("delay_ms is a number");
            (
                exchange,
                prefix,
                max_attempts,
                Some((prefetch, Duration::from_millis(delay_ms))),
            )
        }
        _ => {
            eprintln!(
                "usage: AMQP_CHILD_URL=… amqp_child <exchange> <prefix> <max_attempts> \
                 [<prefetch> <delay_ms>]"
            );
            return ExitCode::from(2);
        }
    };
    let Ok(url) = std::env::var("AMQP_CHILD_URL") else {
        eprintln!("AMQP_CHILD_URL is not set");
        return ExitCode::from(2);
    };
    let max_attempts: u32 = max_attempts.parse().expect("max_attempts is a number");
    let connection = match RabbitMqConnection::connect_named_with_retry(
        &url,
        &format!("{prefix}.child"),
        5,
        Duration::from_millis(200),
    )
    .await
    {
        Ok(connection) => connection,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::from(1);
        }
    };
    let delay = tuning.map_or(Duration::ZERO, |(_, delay)| delay);
    let mut builder = RabbitMqWorkerBuilder::new(connection)
        .registry(Registry::new())
        .register_handler_with::<Task, _>(Work { delay }, HandlerOptions::new().name("crash.work"))
        .exchange(exchange.clone())
        .prefix(prefix.clone())
        .max_attempts(max_attempts);
    if let Some((prefetch, _)) = tuning {
        builder = builder.prefetch(prefetch);
    }
    let worker = builder
        .park_without_rows()
        .build()
        .expect("the worker builds");
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    say("ready");
    match running.await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(error)) => {
            eprintln!("{error}");
            ExitCode::from(1)
        }
        Err(panic) => {
            eprintln!("{panic}");
            ExitCode::from(1)
        }
    }
}
