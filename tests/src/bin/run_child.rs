//! A service that is nothing but `hexeract::run`, for the process-level runtime tests
//! (`tests/run_process.rs`): configured by the environment alone, stopped by SIGTERM.
//!
//! Its one handler, `sleepy`, handles `run.Nap`: it prints `started <n>`, sleeps
//! `nap_ms`, prints `finished <n>` and succeeds. `main` prints the error and exits with 1 when
//! `run` fails (a bad variable, say), and exits with 0 when `run` returns `Ok(())`.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use hexeract::{handler, CancellationToken, Context, Message};

/// A message that takes its handler `nap_ms` to handle.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "run.Nap")]
pub struct Nap {
    pub n: u32,
    pub nap_ms: u64,
}

#[handler(message = "run.Nap", name = "sleepy")]
async fn sleepy(nap: Nap, _ctx: &Context) -> Result<(), std::io::Error> {
    say(&format!("started {}", nap.n))?;
    tokio::time::sleep(Duration::from_millis(nap.nap_ms)).await;
    say(&format!("finished {}", nap.n))
}

fn say(line: &str) -> Result<(), std::io::Error> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    match hexeract::run(CancellationToken::new()).await {
        Ok(()) => {
            let _ = say("stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("run_child: {error}");
            ExitCode::from(1)
        }
    }
}
