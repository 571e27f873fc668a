//! Operations commands for the user's own binary: one line in `main` turns it into a tool that
//! runs the service or inspects it.
//!
//! ```no_run
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     // `my-service` runs the service (as `hexeract::run` does); `my-service handlers`,
//!     // `my-service migrate`, `my-service dead-letters list --reason payload_invalid`, … inspect it.
//!     hexeract::cli::main().await
//! }
//! ```
//!
//! Commands (the same environment as `run`: `DATABASE_URL`, `AMQP_URL`, …):
//!
//! - `run` (or nothing): the service, until SIGTERM or Ctrl-C.
//! - `handlers`: every registered handler (message type, queue under `AMQP_URL`, source
//!   location) and scheduled job (schedule, catch-up, location).
//! - `migrate`: creates or upgrades the store's tables, then exits.
//! - `dead-letters list [--handler NAME] [--reason REASON] [--older-than DURATION] [--limit N]`:
//!   one line per dead letter, newest last.
//! - `dead-letters show ID`: one dead letter in full, payload included.
//! - `dead-letters replay ID`: sends it back to its handler, attempts from 1: a new delivery
//!   from the outbox, or under `AMQP_URL` a publish to the handler's queue.
//! - `dead-letters purge`: deletes every dead letter.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use uuid::Uuid;

use crate::dead_letter::DeadLetter;
use crate::error::Error;
use crate::registry::Registry;

/// Runs the command named by the process's arguments and returns the exit code: 0 on success,
/// 1 when the command failed (the error is printed to stderr), 2 for a usage error.
pub async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut out = String::new();
    let result = execute(&args, &mut out).await;
    print!("{out}");
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(problem)) => {
            eprintln!("{problem}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(CliError::Failed(error)) => {
            eprintln!("error: {error}");
            ExitCode::from(1)
        }
    }
}

/// What went wrong with a command.
#[derive(Debug)]
pub enum CliError {
    /// The arguments do not name a command, or not correctly.
    Usage(String),
    /// The command ran and failed.
    Failed(Error),
}

impl From<Error> for CliError {
    fn from(error: Error) -> CliError {
        CliError::Failed(error)
    }
}

impl From<crate::store::StoreError> for CliError {
    fn from(error: crate::store::StoreError) -> CliError {
        CliError::Failed(error.into())
    }
}

const USAGE: &str = "usage:
  <binary> [run]                       run the service
  <binary> handlers                    list handlers and scheduled jobs
  <binary> migrate                     create or upgrade the store's tables
  <binary> dead-letters list [--handler NAME] [--reason REASON] [--older-than 1h] [--limit 100]
  <binary> dead-letters show ID
  <binary> dead-letters replay ID
  <binary> dead-letters purge";

/// Runs the command `args` (the arguments after the program name), writing what it prints to
/// `out`: for tests and for programs with commands of their own.
pub async fn execute(args: &[String], out: &mut String) -> Result<(), CliError> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        [] | ["run"] => Ok(crate::run(tokio_util::sync::CancellationToken::new()).await?),
        ["handlers"] => handlers(out).await,
        ["migrate"] => {
            let store = crate::store::default_store().await?;
            store.migrate().await?;
            let _ = writeln!(out, "the store's tables are up to date");
            Ok(())
        }
        ["dead-letters", "list", options @ ..] => list(options, out).await,
        ["dead-letters", "show", id] => show(&parse_id(id)?, out).await,
        ["dead-letters", "replay", id] => replay(&parse_id(id)?, out).await,
        ["dead-letters", "purge"] => {
            let store = crate::store::default_store().await?;
            let purged = store.purge_dead_letters().await?;
            let _ = writeln!(out, "purged {purged} dead letter(s)");
            Ok(())
        }
        ["help" | "--help" | "-h"] => {
            let _ = writeln!(out, "{USAGE}");
            Ok(())
        }
        _ => Err(CliError::Usage(format!(
            "unknown command: {}",
            if args.is_empty() {
                String::new()
            } else {
                args.join(" ")
            }
        ))),
    }
}

async fn handlers(out: &mut String) -> Result<(), CliError> {
    let registry = Registry::from_inventory().map_err(Error::from)?;
    let settings = crate::config::EnvSettings::from_env().map_err(Error::from)?;
    let _ = writeln!(out, "handlers ({}):", registry.len());
    for info in registry.handlers() {
        let location = info
            .location
            .map_or_else(|| "registered in code".to_owned(), |at| at.to_string());
        let _ = write!(out, "  {}  message {}", info.name, info.message_type);
        if let Some(amqp) = &settings.amqp {
            let _ = write!(
                out,
                "  queue {}.{}",
                amqp.queue_prefix,
                info.name.replace("::", ".")
            );
        }
        let _ = writeln!(out, "  at {location}");
    }
    let jobs = crate::schedule::jobs_from_inventory()?;
    let _ = writeln!(out, "scheduled jobs ({}):", jobs.len());
    for job in &jobs {
        let location = job
            .location()
            .map_or_else(|| "registered in code".to_owned(), |at| at.to_string());
        let _ = writeln!(
            out,
            "  {}  {}  catch-up {:?}  at {location}",
            job.name(),
            job.spec(),
            job.catch_up_rule()
        );
    }
    let store = crate::store::default_store().await?;
    let unowned = crate::runtime::unowned_deliveries(&*store).await?;
    if !unowned.is_empty() {
        let _ = writeln!(out, "pending deliveries no handler here owns:");
        for (handler, count) in unowned {
            let who = if handler.is_empty() {
                "(a message type no handler knows)".to_owned()
            } else {
                format!("{handler} (renamed or removed?)")
            };
            let _ = writeln!(out, "  {who}: {count}");
        }
    }
    Ok(())
}

/// `--handler`, `--reason`, `--older-than`, `--limit`.
#[derive(Debug, Default)]
struct Filter {
    handler: Option<String>,
    reason: Option<String>,
    older_than: Option<Duration>,
    limit: Option<u32>,
}

fn parse_filter(options: &[&str]) -> Result<Filter, CliError> {
    let mut filter = Filter::default();
    let mut rest = options.iter();
    while let Some(option) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| CliError::Usage(format!("{option} needs a value")))?;
        match *option {
            "--handler" => filter.handler = Some((*value).to_owned()),
            "--reason" => filter.reason = Some((*value).to_owned()),
            "--older-than" => {
                filter.older_than = Some(parse_age(value).ok_or_else(|| {
                    CliError::Usage(format!(
                        "--older-than {value:?}: expected a number and a unit, e.g. 30m, 12h, 7d"
                    ))
                })?)
            }
            "--limit" => {
                filter.limit = Some(value.parse().map_err(|_| {
                    CliError::Usage(format!("--limit {value:?}: expected a whole number"))
                })?)
            }
            other => return Err(CliError::Usage(format!("unknown option {other}"))),
        }
    }
    Ok(filter)
}

/// `30s`, `15m`, `12h`, `7d`.
fn parse_age(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(number.checked_mul(seconds)?))
}

impl Filter {
    fn keeps(&self, letter: &DeadLetter, now: chrono::DateTime<chrono::Utc>) -> bool {
        self.handler
            .as_deref()
            .is_none_or(|handler| letter.handler.as_deref() == Some(handler))
            && self
                .reason
                .as_deref()
                .is_none_or(|reason| letter.reason.as_str() == reason)
            && self.older_than.is_none_or(|age| {
                (now - letter.dead_lettered_at).to_std().unwrap_or_default() >= age
            })
    }
}

/// Dead letters are read in pages of this many; filters apply to what was read.
const SCAN: u32 = 100_000;

async fn list(options: &[&str], out: &mut String) -> Result<(), CliError> {
    let filter = parse_filter(options)?;
    let store = crate::store::default_store().await?;
    let now = chrono::Utc::now();
    let letters: Vec<DeadLetter> = store
        .dead_letters(SCAN)
        .await?
        .into_iter()
        .filter(|letter| filter.keeps(letter, now))
        .collect();
    let shown = filter.limit.map_or(letters.len(), |limit| limit as usize);
    let skip = letters.len().saturating_sub(shown);
    for letter in &letters[skip..] {
        let _ = writeln!(
            out,
            "{}  {}  {}  {}  {}  {} attempt(s)  {}",
            letter.id,
            letter.dead_lettered_at.format("%Y-%m-%dT%H:%M:%SZ"),
            letter.envelope.message_type,
            letter.handler.as_deref().unwrap_or("(no handler)"),
            letter.reason,
            letter.attempts,
            first_line(&letter.detail),
        );
    }
    let _ = writeln!(out, "{} dead letter(s)", letters.len());
    Ok(())
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

fn parse_id(text: &str) -> Result<Uuid, CliError> {
    text.parse()
        .map_err(|_| CliError::Usage(format!("{text:?} is not a dead letter id (a UUID)")))
}

async fn find(id: &Uuid) -> Result<DeadLetter, CliError> {
    let store = crate::store::default_store().await?;
    store
        .dead_letters(SCAN)
        .await?
        .into_iter()
        .find(|letter| letter.id == *id)
        .ok_or_else(|| CliError::Usage(format!("no dead letter has the id {id}")))
}

async fn show(id: &Uuid, out: &mut String) -> Result<(), CliError> {
    let letter = find(id).await?;
    let envelope = &letter.envelope;
    let _ = writeln!(out, "id:              {}", letter.id);
    let _ = writeln!(out, "dead-lettered:   {}", letter.dead_lettered_at);
    let _ = writeln!(out, "reason:          {}", letter.reason);
    let _ = writeln!(out, "detail:          {}", letter.detail);
    let _ = writeln!(
        out,
        "handler:         {}",
        letter.handler.as_deref().unwrap_or("(no handler)")
    );
    let _ = writeln!(out, "attempts:        {}", letter.attempts);
    let _ = writeln!(out, "message id:      {}", envelope.id);
    let _ = writeln!(out, "message type:    {}", envelope.message_type);
    let _ = writeln!(out, "published:       {}", envelope.created_at);
    if let Some(correlation) = envelope.correlation_id {
        let _ = writeln!(out, "correlation id:  {correlation}");
    }
    for (name, value) in &envelope.headers {
        let _ = writeln!(out, "header {name}: {value}");
    }
    let _ = writeln!(
        out,
        "payload ({} bytes):\n{}",
        envelope.payload.len(),
        String::from_utf8_lossy(&envelope.payload)
    );
    Ok(())
}

async fn replay(id: &Uuid, out: &mut String) -> Result<(), CliError> {
    let settings = crate::config::EnvSettings::from_env().map_err(Error::from)?;
    let letter = find(id).await?;
    if letter.envelope.message_type == crate::store::SCHEDULE_MESSAGE_TYPE {
        return Err(CliError::Failed(Error::Unsupported(format!(
            "{id} is a run of the scheduled job {:?}: replaying job runs is not supported yet; \
             the job runs again at its next fire time",
            letter.handler.as_deref().unwrap_or("?")
        ))));
    }
    let store = crate::store::default_store().await?;
    #[cfg(feature = "rabbitmq")]
    if let Some(amqp) = &settings.amqp {
        let place = crate::rabbitmq::supervisor::replay_to_broker(amqp, &letter, &*store).await?;
        let _ = writeln!(
            out,
            "replayed {} ({}) to {place}: attempts start over",
            letter.id, letter.envelope.message_type
        );
        return Ok(());
    }
    let _ = &settings;
    if !store.replay_dead_letter(*id).await? {
        return Err(CliError::Usage(format!("no dead letter has the id {id}")));
    }
    let _ = writeln!(
        out,
        "replayed {} ({} for {}): it goes to its handler again, attempts from 1",
        letter.id,
        letter.envelope.message_type,
        letter
            .handler
            .as_deref()
            .unwrap_or("every handler of its type")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_filters_parse_and_bad_ones_are_usage_errors() {
        assert_eq!(parse_age("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_age("7d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("7"), None);
        assert_eq!(parse_age("1w"), None);
        let filter = parse_filter(&["--handler", "shop::reserve", "--limit", "5"]).unwrap();
        assert_eq!(filter.handler.as_deref(), Some("shop::reserve"));
        assert_eq!(filter.limit, Some(5));
        for bad in [
            &["--limit"][..],
            &["--limit", "many"][..],
            &["--colour", "red"][..],
        ] {
            assert!(
                matches!(parse_filter(bad), Err(CliError::Usage(_))),
                "{bad:?}"
            );
        }
    }
}
