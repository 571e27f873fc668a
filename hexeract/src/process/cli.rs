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
//! - `queues upgrade` (under `AMQP_URL`): moves every queue of this program's topology that
//!   exists with an older layout to the current one, its messages kept (what every start does
//!   too); one line per queue moved. Refused while a program still consumes a queue.
//! - `dead-letters list [--handler NAME] [--reason REASON] [--older-than DURATION] [--limit N]`:
//!   one line per dead letter, newest last.
//! - `dead-letters show ID`: one dead letter in full, payload included. `list` and `show` print
//!   control characters and bidirectional-text controls of a letter as escapes (`\u{1b}`):
//!   what a message carries cannot drive the operator's terminal.
//! - `dead-letters replay ID`, or `dead-letters replay` with filters (`--handler`, `--reason`,
//!   `--older-than`, at least one) or `--all`: sends each back, attempts from 1: a new
//!   delivery from the outbox, or under `AMQP_URL` a confirmed publish to the handler's queue.
//!   A scheduled job's run becomes an occurrence of the job again, due now, with its own fire
//!   time (under `AMQP_URL` too: the scheduler runs from the database); refused when this
//!   program has no job of that name. A dead letter is deleted only once it was sent back;
//!   one line per replayed letter, then (with filters) how many. Without `AMQP_URL` or
//!   `KAFKA_BROKERS`, dead letters of a service that delivers through a broker (the store
//!   remembers its RabbitMQ queues, or a broker's consumer parked them) are refused, naming the
//!   variable to set; `--to-store` sends them to the store's deliveries anyway.
//! - `dead-letters purge` with the same filters (at least one) or `--all`: deletes the dead
//!   letters they match, and says how many. Without either it deletes nothing: a usage error,
//!   as is `--older-than 0s` (it would match every dead letter).
//!
//! `replay` and `purge` with filters look at the oldest 100 000 dead letters (`purge` again
//! after each page it deleted), and say so when there may be more.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use uuid::Uuid;

use crate::dead_letter::DeadLetter;
use crate::error::Error;
use crate::registry::Registry;
use crate::store::{DeadLetterFilter, Page, Store, SCHEDULE_MESSAGE_TYPE};

/// Runs the command named by the process's arguments and returns the exit code: 0 on success,
/// 1 when the command failed (the error is printed to stderr), 2 for a usage error.
pub async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut out = String::new();
    let result = execute(&args, &mut out).await;
    finish(result, &out)
}

/// [`main`] for an application built with [`App`](crate::App): `run` runs that worker
/// (with its state, middleware and handlers), and the other commands use its settings and
/// know its handlers.
///
/// ```no_run
/// use hexeract::{App, AppConfig};
///
/// #[derive(Clone)]
/// struct Settings { cart_ttl_secs: u64 }
///
/// #[tokio::main]
/// async fn main() -> std::process::ExitCode {
///     let config = match AppConfig::from_env() {
///         Ok(config) => config,
///         Err(error) => {
///             eprintln!("{error}");
///             return std::process::ExitCode::FAILURE;
///         }
///     };
///     let worker = App::new(config).state(Settings { cart_ttl_secs: 900 });
///     // `app`, `app run`, `app handlers`, `app dead-letters list`, …
///     hexeract::cli::main_with(worker).await
/// }
/// ```
pub async fn main_with(worker: crate::app::App) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut out = String::new();
    let result = execute_with(worker, &args, &mut out).await;
    finish(result, &out)
}

/// Prints what a command printed and its error; the exit code.
fn finish(result: Result<(), CliError>, out: &str) -> ExitCode {
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

impl From<crate::worker::BuildError> for CliError {
    fn from(error: crate::worker::BuildError) -> CliError {
        CliError::Failed(error.into())
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
  <binary> queues upgrade              move queues of an older layout to the current one
  <binary> dead-letters list [--handler NAME] [--reason REASON] [--older-than 1h] [--limit 100]
  <binary> dead-letters show ID
  <binary> dead-letters replay ID [--to-store]
  <binary> dead-letters replay [--handler NAME] [--reason REASON] [--older-than 1h] | --all
                               [--to-store]
  <binary> dead-letters purge [--handler NAME] [--reason REASON] [--older-than 1h] | --all
replay and purge without an ID act on every dead letter the filters match: give at least one
filter, or --all for every dead letter (--older-than 0s is not a filter).
replay without AMQP_URL or KAFKA_BROKERS refuses dead letters of a service on a broker;
--to-store sends them to the store's own deliveries anyway";

/// Runs the command `args` (the arguments after the program name), writing what it prints to
/// `out`: for tests and for programs with commands of their own.
pub async fn execute(args: &[String], out: &mut String) -> Result<(), CliError> {
    // Help and usage errors need no settings: an invalid environment does not hide them.
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Parsed::Help = parse(&words, args)? {
        let _ = writeln!(out, "{USAGE}");
        return Ok(());
    }
    let config = crate::config::AppConfig::from_env().map_err(Error::from)?;
    execute_with(crate::app::App::new(config), args, out).await
}

/// [`execute`] for an application built with [`App`](crate::App) (see [`main_with`]).
pub async fn execute_with(
    worker: crate::app::App,
    args: &[String],
    out: &mut String,
) -> Result<(), CliError> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    // Arguments are checked before the store is opened: a usage error touches nothing.
    let command = match parse(&words, args)? {
        Parsed::Help => {
            let _ = writeln!(out, "{USAGE}");
            return Ok(());
        }
        Parsed::Run => {
            return Ok(worker
                .try_run(tokio_util::sync::CancellationToken::new())
                .await?)
        }
        Parsed::Command(command) => command,
    };
    // Those that know the program's handlers need them built (with their state); the others
    // need the settings and the store alone.
    let store = worker.store_opener();
    let (config, registry) = match command {
        Command::Handlers | Command::Replay(..) | Command::UpgradeQueues => {
            let (config, application) = worker.prepare()?;
            (config, Some(application.registry))
        }
        _ => {
            worker.config().check().map_err(Error::from)?;
            (worker.config().clone(), None)
        }
    };
    let program = Program {
        store: store.open().await?,
        config,
    };
    let registry = || {
        registry
            .as_ref()
            .expect("built for the commands that need it")
    };
    match command {
        Command::Handlers => handlers(&program, registry(), out).await,
        Command::Migrate => {
            program.store.migrate().await?;
            let _ = writeln!(out, "the store's tables are up to date");
            Ok(())
        }
        Command::List(options) => list(&program, options, out).await,
        Command::Show(id) => show(&program, &id, out).await,
        Command::Replay(target, to_store) => {
            replay(&program, registry(), &target, to_store, out).await
        }
        Command::Purge(selection) => purge(&program, &selection, out).await,
        Command::UpgradeQueues => upgrade_queues(&program, registry(), out).await,
    }
}

/// What the arguments ask for.
enum Parsed<'a> {
    Help,
    Run,
    Command(Command<'a>),
}

fn parse<'a>(words: &'a [&'a str], args: &[String]) -> Result<Parsed<'a>, CliError> {
    Ok(Parsed::Command(match words {
        [] | ["run"] => return Ok(Parsed::Run),
        ["help" | "--help" | "-h"] => return Ok(Parsed::Help),
        ["handlers"] => Command::Handlers,
        ["migrate"] => Command::Migrate,
        ["queues", "upgrade"] => Command::UpgradeQueues,
        ["dead-letters", "list", options @ ..] => Command::List(options),
        ["dead-letters", "show", id] => Command::Show(parse_id(id)?),
        ["dead-letters", "replay", options @ ..] => {
            let (options, to_store) = take_to_store(options);
            Command::Replay(parse_replay(&options)?, to_store)
        }
        ["dead-letters", "purge", options @ ..] => {
            Command::Purge(parse_selection("purge", options)?)
        }
        _ => {
            return Err(CliError::Usage(format!(
                "unknown command: {}",
                if args.is_empty() {
                    String::new()
                } else {
                    args.join(" ")
                }
            )))
        }
    }))
}

/// A command that works on the program's store and handlers.
enum Command<'a> {
    Handlers,
    Migrate,
    List(&'a [&'a str]),
    Show(Uuid),
    /// What to replay, and whether `--to-store` was given.
    Replay(Replay, bool),
    Purge(Selection),
    UpgradeQueues,
}

/// What the commands work on: the worker's settings and its store.
struct Program {
    config: crate::config::AppConfig,
    store: std::sync::Arc<dyn Store>,
}

async fn handlers(
    program: &Program,
    registry: &Registry,
    out: &mut String,
) -> Result<(), CliError> {
    // Without the `rabbitmq` feature there are no queues to show (and `AMQP_URL` is refused).
    #[cfg_attr(not(feature = "rabbitmq"), allow(unused_variables))]
    let settings = &program.config;
    let _ = writeln!(out, "handlers ({}):", registry.len());
    for info in registry.handlers() {
        let location = info
            .location
            .map_or_else(|| "registered in code".to_owned(), |at| at.to_string());
        let _ = write!(out, "  {}  message {}", info.name, info.message_type);
        if let Some(aggregate) = registry
            .get(&info.name)
            .and_then(|handler| handler.handler().aggregate())
        {
            let _ = write!(out, "  aggregate {aggregate}");
        }
        #[cfg(feature = "rabbitmq")]
        if let Some(amqp) = &settings.amqp {
            let queue = crate::rabbitmq::topology::queue_name(&amqp.queue_prefix, &info.name);
            let _ = write!(out, "  queue {queue}");
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
            "  {}  {}  catch-up {}  at {location}",
            job.name(),
            job.spec(),
            job.catch_up_rule()
        );
    }
    let store = program.store.clone();
    let unowned = crate::run::unowned_deliveries(&*store, registry).await?;
    if !unowned.is_empty() {
        let _ = writeln!(out, "pending deliveries no handler here owns:");
        for (handler, count) in unowned {
            let who = if handler.is_empty() {
                "(a message type no handler knows)".to_owned()
            } else {
                format!("{} (renamed or removed?)", visible(&handler))
            };
            let _ = writeln!(out, "  {who}: {count}");
        }
    }
    #[cfg(feature = "rabbitmq")]
    if let Some(amqp) = &settings.amqp {
        if let Err(error) = unowned_queues(amqp, registry, &*store, out).await {
            // The rest of the listing does not need the broker.
            let error = match error {
                CliError::Failed(error) => error.to_string(),
                CliError::Usage(text) => text,
            };
            let _ = writeln!(out, "queues no handler here owns: not checked ({error})");
        }
    }
    Ok(())
}

/// `queues upgrade`: the topology `run` declares, every queue of an older layout moved to the
/// current one.
#[cfg_attr(not(feature = "rabbitmq"), allow(unused_variables))]
async fn upgrade_queues(
    program: &Program,
    registry: &Registry,
    out: &mut String,
) -> Result<(), CliError> {
    #[cfg(feature = "rabbitmq")]
    if let Some(amqp) = &program.config.amqp {
        let connection = crate::rabbitmq::RabbitMqConnection::connect_named(
            &amqp.url,
            &format!("{}.cli", amqp.queue_prefix),
        )
        .await
        .map_err(Error::from)?;
        let topology = crate::run::rabbitmq::run_topology(
            &program.config,
            &amqp.exchange,
            &amqp.queue_prefix,
            registry,
        );
        let moved = topology.migrate(&connection).await;
        let _ = connection.close().await;
        let moved = moved.map_err(Error::from)?;
        for queue in &moved {
            let _ = writeln!(
                out,
                "{}: {} message(s) moved out, {} back{}",
                queue.queue,
                queue.moved_out,
                queue.moved_back,
                if queue.deleted_with_queue > 0 {
                    format!(
                        "; {} arrived after the last look and were deleted with the old queue",
                        queue.deleted_with_queue
                    )
                } else {
                    String::new()
                }
            );
        }
        let _ = writeln!(
            out,
            "{} queue(s) moved; every queue of this program has the current layout",
            moved.len()
        );
        return Ok(());
    }
    let _ = registry;
    Err(CliError::Usage(
        "queues upgrade works on RabbitMQ: set AMQP_URL".to_owned(),
    ))
}

/// Under `AMQP_URL`: the queues an earlier version declared for handlers this program does not
/// have, with what they hold.
#[cfg(feature = "rabbitmq")]
async fn unowned_queues(
    amqp: &crate::config::Amqp,
    registry: &Registry,
    store: &dyn Store,
    out: &mut String,
) -> Result<(), CliError> {
    let connection = crate::rabbitmq::RabbitMqConnection::connect_named(
        &amqp.url,
        &format!("{}.cli", amqp.queue_prefix),
    )
    .await
    .map_err(Error::from)?;
    let topology = crate::rabbitmq::Topology::from_registry(registry)
        .exchange(amqp.exchange.clone())
        .prefix(amqp.queue_prefix.clone());
    let unowned = crate::run::ownership::find_unowned(&connection, &topology, store).await;
    let _ = connection.lapin().close(200, "done".into()).await;
    let unowned = unowned?;
    if !unowned.is_empty() {
        let _ = writeln!(out, "queues no handler here owns:");
        for queue in &unowned {
            let _ = writeln!(
                out,
                "  {}  (was {}, message {})  {} message(s), {} consumer(s)",
                visible(&queue.declared.queue),
                visible(&queue.declared.handler),
                visible(&queue.declared.message_type),
                queue.messages,
                queue.consumers
            );
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
        if !matches!(
            *option,
            "--handler" | "--reason" | "--older-than" | "--limit"
        ) {
            return Err(CliError::Usage(format!("unknown option {option}")));
        }
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
            _ => unreachable!("checked above"),
        }
    }
    Ok(filter)
}

/// What `replay` and `purge` act on.
#[derive(Debug)]
enum Selection {
    /// `--all`: every dead letter.
    All,
    /// Those a filter keeps: at least one of `--handler`, `--reason`, `--older-than`.
    Matching(Filter),
}

/// What `replay` sends back.
#[derive(Debug)]
enum Replay {
    /// `replay ID`.
    One(Uuid),
    /// `replay` with filters or `--all`.
    Selected(Selection),
}

/// The options of `dead-letters <command>` (`purge`, `replay`): filters, or `--all`, never
/// neither, so that a forgotten or mistyped filter cannot mean every dead letter.
fn parse_selection(command: &str, options: &[&str]) -> Result<Selection, CliError> {
    let mut all = false;
    let mut filters = Vec::new();
    let mut rest = options.iter();
    while let Some(option) = rest.next() {
        match *option {
            "--all" => all = true,
            "--limit" => {
                return Err(CliError::Usage(format!(
                    "--limit is for list: {command} acts on every dead letter its filters match"
                )))
            }
            _ => {
                // The option with its value, if it has one: a value is never read as an option.
                filters.push(*option);
                filters.extend(rest.next());
            }
        }
    }
    let filter = parse_filter(&filters)?;
    if filter.older_than == Some(Duration::ZERO) {
        // Everything was dead-lettered more than no time ago: `--older-than 0s` alone would
        // mean every dead letter without saying so.
        return Err(CliError::Usage(format!(
            "--older-than 0s matches every dead letter: give a longer age (e.g. 1h) to \
             {command} older letters only, or --all for every dead letter"
        )));
    }
    match (all, filter.is_empty()) {
        (true, true) => Ok(Selection::All),
        (true, false) => Err(CliError::Usage(
            "--all means every dead letter: give --all or filters, not both".to_owned(),
        )),
        (false, true) => Err(CliError::Usage(format!(
            "dead-letters {command} needs a filter (--handler NAME, --reason REASON, \
             --older-than DURATION), or --all for every dead letter"
        ))),
        (false, false) => Ok(Selection::Matching(filter)),
    }
}

/// The arguments of `dead-letters replay`: one id, or a selection.
fn parse_replay(options: &[&str]) -> Result<Replay, CliError> {
    match options {
        [] => Err(CliError::Usage(
            "dead-letters replay needs a dead letter's ID, or filters (--handler NAME, \
             --reason REASON, --older-than DURATION), or --all"
                .to_owned(),
        )),
        [id] if !id.starts_with("--") => Ok(Replay::One(parse_id(id)?)),
        [id, ..] if !id.starts_with("--") => Err(CliError::Usage(
            "dead-letters replay takes one ID or filters, not both".to_owned(),
        )),
        _ => Ok(Replay::Selected(parse_selection("replay", options)?)),
    }
}

/// The flag that lets `replay` put messages in the store's deliveries when the store was used
/// with a broker (see [`StoreOnly`]).
const TO_STORE: &str = "--to-store";

/// `options` without [`TO_STORE`], and whether it was there (as an option: the value of a
/// filter that looks like it stays a value).
fn take_to_store<'a>(options: &[&'a str]) -> (Vec<&'a str>, bool) {
    let mut rest = Vec::with_capacity(options.len());
    let mut found = false;
    let mut words = options.iter();
    while let Some(word) = words.next() {
        if *word == TO_STORE {
            found = true;
            continue;
        }
        rest.push(*word);
        if matches!(*word, "--handler" | "--reason" | "--older-than" | "--limit") {
            rest.extend(words.next());
        }
    }
    (rest, found)
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
    /// No filter given (`--limit` is not one: it picks what to show, not what matches).
    fn is_empty(&self) -> bool {
        self.handler.is_none() && self.reason.is_none() && self.older_than.is_none()
    }

    /// The store's filter, `--older-than` counted back from `now`.
    fn at(&self, now: chrono::DateTime<chrono::Utc>) -> DeadLetterFilter {
        DeadLetterFilter {
            handler: self.handler.clone(),
            reason: self.reason.clone(),
            before: self.older_than.map(|age| {
                chrono::Duration::from_std(age)
                    .ok()
                    .and_then(|age| now.checked_sub_signed(age))
                    .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC)
            }),
        }
    }
}

/// Dead letters are read from the store in pages of this many, filtered and ordered there.
const PAGE: u32 = 1_000;

async fn list(program: &Program, options: &[&str], out: &mut String) -> Result<(), CliError> {
    let filter = parse_filter(options)?;
    let store = program.store.clone();
    let matching = filter.at(chrono::Utc::now());
    let total = store.count_dead_letters(&matching).await?;
    let mut print = |letters: &[DeadLetter]| {
        for letter in letters {
            let _ = writeln!(
                out,
                "{}  {}  {}  {}  {}  {} attempt(s)  {}",
                letter.id,
                letter.dead_lettered_at.format("%Y-%m-%dT%H:%M:%SZ"),
                visible(&letter.envelope.message_type),
                visible(handler_of(letter)),
                visible(letter.reason.as_str()),
                letter.attempts,
                visible(first_line(&letter.detail)),
            );
        }
    };
    match filter.limit {
        // The newest `limit`, shown oldest first like the rest.
        Some(limit) => {
            let mut newest = store
                .dead_letters_matching(&matching, &Page::newest_first(limit))
                .await?;
            newest.reverse();
            print(&newest);
        }
        None => {
            let mut pages = Pages::new(&*store, matching);
            while let Some(letters) = pages.next().await? {
                print(&letters);
            }
        }
    }
    let _ = writeln!(out, "{total} dead letter(s)");
    Ok(())
}

/// The pages of the dead letters a filter matches, oldest first, read one at a time.
struct Pages<'a> {
    store: &'a dyn Store,
    filter: DeadLetterFilter,
    page: Option<Page>,
}

impl<'a> Pages<'a> {
    fn new(store: &'a dyn Store, filter: DeadLetterFilter) -> Pages<'a> {
        Pages {
            store,
            filter,
            page: Some(Page::oldest_first(PAGE)),
        }
    }

    /// The next page; `None` after the last.
    async fn next(&mut self) -> Result<Option<Vec<DeadLetter>>, CliError> {
        let Some(page) = self.page.take() else {
            return Ok(None);
        };
        let letters = self
            .store
            .dead_letters_matching(&self.filter, &page)
            .await?;
        if letters.len() == PAGE as usize {
            self.page = letters.last().map(|last| page.after(last));
        }
        Ok((!letters.is_empty()).then_some(letters))
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

fn handler_of(letter: &DeadLetter) -> &str {
    letter.handler.as_deref().unwrap_or("(no handler)")
}

/// `text` as it may reach an operator's terminal, on one line: control characters (`ESC`,
/// carriage returns, line breaks, …) and the invisible controls of bidirectional text are
/// written out as escapes (`\u{1b}`, `\r`, `\n`), so that what a dead letter carries cannot
/// clear the screen, move the cursor, rewrite a line or reorder what is shown. Every other
/// character, text in any script included, is shown as it is.
fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    escaped(text, false)
}

/// [`visible`] for text printed on lines of its own (a payload): line breaks and tabs stay.
fn visible_lines(text: &str) -> std::borrow::Cow<'_, str> {
    escaped(text, true)
}

fn escaped(text: &str, keep_lines: bool) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| {
        let layout = keep_lines && matches!(c, '\n' | '\t');
        (c.is_control() && !layout) || is_bidi_control(c)
    };
    if !text.contains(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !hidden(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The characters that change the order in which text is shown, without showing themselves
/// (Unicode's bidirectional formatting characters, "Trojan Source"), and the line and
/// paragraph separators.
fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
            | '\u{2028}' | '\u{2029}'
    )
}

fn parse_id(text: &str) -> Result<Uuid, CliError> {
    text.parse()
        .map_err(|_| CliError::Usage(format!("{text:?} is not a dead letter id (a UUID)")))
}

async fn find(store: &dyn Store, id: &Uuid) -> Result<DeadLetter, CliError> {
    store
        .find_dead_letter(*id)
        .await?
        .ok_or_else(|| CliError::Usage(format!("no dead letter has the id {id}")))
}

/// The store's filter of `selection` (empty for `--all`), `--older-than` counted back from
/// `now`.
fn selected(selection: &Selection, now: chrono::DateTime<chrono::Utc>) -> DeadLetterFilter {
    match selection {
        Selection::All => DeadLetterFilter::default(),
        Selection::Matching(filter) => filter.at(now),
    }
}

async fn show(program: &Program, id: &Uuid, out: &mut String) -> Result<(), CliError> {
    let store = program.store.clone();
    let letter = find(&*store, id).await?;
    let envelope = &letter.envelope;
    let _ = writeln!(out, "id:              {}", letter.id);
    let _ = writeln!(out, "dead-lettered:   {}", letter.dead_lettered_at);
    let _ = writeln!(out, "reason:          {}", visible(letter.reason.as_str()));
    let _ = writeln!(out, "detail:          {}", visible(&letter.detail));
    let _ = writeln!(out, "handler:         {}", visible(handler_of(&letter)));
    let _ = writeln!(out, "attempts:        {}", letter.attempts);
    let _ = writeln!(out, "message id:      {}", envelope.id);
    let _ = writeln!(out, "message type:    {}", visible(&envelope.message_type));
    let _ = writeln!(out, "published:       {}", envelope.created_at);
    if let Some(correlation) = envelope.correlation_id {
        let _ = writeln!(out, "correlation id:  {correlation}");
    }
    for (name, value) in &envelope.headers {
        let _ = writeln!(out, "header {}: {}", visible(name), visible(value));
    }
    let _ = writeln!(
        out,
        "payload ({} bytes):\n{}",
        envelope.payload.len(),
        visible_lines(&String::from_utf8_lossy(&envelope.payload))
    );
    Ok(())
}

async fn purge(program: &Program, selection: &Selection, out: &mut String) -> Result<(), CliError> {
    let store = program.store.clone();
    let purged = store
        .purge_dead_letters_matching(&selected(selection, chrono::Utc::now()))
        .await?;
    let _ = writeln!(out, "purged {purged} dead letter(s)");
    Ok(())
}

async fn replay(
    program: &Program,
    registry: &Registry,
    target: &Replay,
    to_store: bool,
    out: &mut String,
) -> Result<(), CliError> {
    let settings = &program.config;
    let store = program.store.clone();
    let mut owners = Owners::of_this_program(registry)?;
    // Without a broker, messages go to the store's deliveries: checked only then.
    let broker = settings.amqp.is_some() || settings.kafka.is_some();
    let mut store_only = if broker || to_store {
        None
    } else {
        Some(StoreOnly::of(&*store).await?)
    };
    let selection = match target {
        Replay::One(id) => {
            let letter = find(&*store, id).await?;
            owners.count(std::slice::from_ref(&letter));
            owners.refuse(target)?;
            if let Some(store_only) = &mut store_only {
                store_only.count(std::slice::from_ref(&letter));
                store_only.refuse()?;
            }
            let mut resend = Resend::new(settings, &*store);
            let sent = resend.send(&letter).await;
            resend.close().await;
            return match sent? {
                Some(line) => {
                    let _ = writeln!(out, "{line}");
                    Ok(())
                }
                None => Err(CliError::Usage(format!("no dead letter has the id {id}"))),
            };
        }
        Replay::Selected(selection) => selection,
    };
    // What was dead-lettered before now: a replayed message that fails again while this runs
    // is a new dead letter, and is not taken again.
    let now = chrono::Utc::now();
    let mut filter = selected(selection, now);
    filter.before = Some(filter.before.map_or(now, |before| before.min(now)));
    // Nothing is replayed when any of them is for a handler or job this program does not have.
    let mut pages = Pages::new(&*store, filter.clone());
    while let Some(letters) = pages.next().await? {
        owners.count(&letters);
        if let Some(store_only) = &mut store_only {
            store_only.count(&letters);
        }
    }
    owners.refuse(target)?;
    if let Some(store_only) = &store_only {
        store_only.refuse()?;
    }
    let mut resend = Resend::new(settings, &*store);
    let mut replayed = 0;
    // Replayed letters leave the table; the next page starts after the last one read.
    let mut pages = Pages::new(&*store, filter);
    while let Some(letters) = pages.next().await? {
        for letter in &letters {
            match resend.send(letter).await {
                Ok(Some(line)) => {
                    let _ = writeln!(out, "{line}");
                    replayed += 1;
                }
                Ok(None) => {
                    let _ = writeln!(
                        out,
                        "{}: no longer a dead letter (replayed or purged meanwhile)",
                        letter.id
                    );
                }
                Err(error) => {
                    resend.close().await;
                    let _ = writeln!(
                        out,
                        "replayed {replayed} dead letter(s), then {} failed: it and those after \
                         it stay dead letters",
                        letter.id
                    );
                    return Err(error);
                }
            }
        }
    }
    resend.close().await;
    let _ = writeln!(out, "replayed {replayed} dead letter(s)");
    Ok(())
}

/// The handlers and scheduled jobs of this program, and the dead letters to replay that are for
/// others (renamed or removed): nothing here would ever handle those.
struct Owners {
    jobs: Vec<crate::schedule::ScheduledJob>,
    handlers: Registry,
    /// Handler or job name → dead letters for it.
    missing: std::collections::BTreeMap<String, usize>,
}

impl Owners {
    fn of_this_program(registry: &Registry) -> Result<Owners, CliError> {
        Ok(Owners {
            jobs: crate::schedule::jobs_from_inventory()?,
            handlers: registry.clone(),
            missing: Default::default(),
        })
    }

    /// Counts those of `letters` no handler or job of this program owns.
    fn count(&mut self, letters: &[DeadLetter]) {
        for letter in letters {
            let Some(owner) = letter.handler.as_deref() else {
                continue; // no handler: it goes to every handler of its type
            };
            let known = if letter.envelope.message_type == SCHEDULE_MESSAGE_TYPE {
                self.jobs.iter().any(|job| job.name() == owner)
            } else {
                // A message for a handler that is gone would wait for nobody (in the database,
                // or in the old handler's queue if it is still on the broker).
                self.handlers.handlers().any(|info| info.name == owner)
                    || owner == crate::store::NO_HANDLER
            };
            if !known {
                *self.missing.entry(owner.to_owned()).or_default() += 1;
            }
        }
    }

    /// Refuses, before anything is replayed, when any letter counted has no owner here.
    fn refuse(&self, target: &Replay) -> Result<(), CliError> {
        if self.missing.is_empty() {
            return Ok(());
        }
        let problem = match target {
            Replay::One(id) => format!(
                "{id} is for {:?}, a handler or scheduled job this program does not have \
                 (renamed or removed?): nothing here would handle it. Replay it from a program \
                 that has it, or delete it with `dead-letters purge --handler NAME`",
                self.missing.keys().next().cloned().unwrap_or_default()
            ),
            Replay::Selected(_) => format!(
                "nothing was replayed: some of the dead letters to replay are for handlers or \
                 scheduled jobs this program does not have (renamed or removed?): {}. Narrow \
                 the filters, or delete those with `dead-letters purge --handler NAME`",
                self.missing
                    .iter()
                    .map(|(owner, count)| format!("{owner:?} ({count})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        Err(CliError::Failed(Error::Unsupported(problem)))
    }
}

/// What a replay without a broker (neither `AMQP_URL` nor `KAFKA_BROKERS` set) would put in
/// the store's deliveries, and whether the store shows that its service delivers through a
/// broker: it remembers queues declared on RabbitMQ, or a letter was parked by a broker's
/// consumer. Such a service never reads those deliveries, so the messages would leave the dead
/// letters for nowhere. A scheduled job's run is not counted: it always goes back to the
/// scheduler, which runs from the store.
#[derive(Debug, Default)]
struct StoreOnly {
    /// The handler queues the store remembers declaring on RabbitMQ.
    declared_queues: usize,
    /// Messages (not job runs) to replay.
    messages: usize,
    /// Of those, the ones a RabbitMQ or Kafka consumer parked: the first, and how many.
    parked: Option<Uuid>,
    parked_count: usize,
}

impl StoreOnly {
    async fn of(store: &dyn Store) -> Result<StoreOnly, CliError> {
        Ok(StoreOnly {
            declared_queues: store.declared_queues().await?.len(),
            ..StoreOnly::default()
        })
    }

    fn count(&mut self, letters: &[DeadLetter]) {
        for letter in letters {
            if letter.envelope.message_type == SCHEDULE_MESSAGE_TYPE {
                continue;
            }
            self.messages += 1;
            if parked_by_a_broker(letter) {
                self.parked.get_or_insert(letter.id);
                self.parked_count += 1;
            }
        }
    }

    /// Refuses, before anything is replayed, when the messages counted would go to the store
    /// of a service that delivers through a broker.
    fn refuse(&self) -> Result<(), CliError> {
        const HOW: &str = "without AMQP_URL or KAFKA_BROKERS a replay puts messages in the \
            store's deliveries, which a service on a broker never reads: they would leave the \
            dead letters and be handled nowhere";
        let problem = if self.messages == 0 {
            return Ok(());
        } else if self.declared_queues > 0 {
            format!(
                "nothing was replayed: this store remembers {} queue(s) its service declared on \
                 RabbitMQ, and {HOW}. Set AMQP_URL as the service has it to replay to the \
                 broker, or add {TO_STORE} if the service now runs from the store alone",
                self.declared_queues
            )
        } else if let Some(first) = self.parked {
            format!(
                "nothing was replayed: {} of the dead letters ({first} first) were parked by a \
                 RabbitMQ or Kafka consumer, and {HOW}. Set AMQP_URL (RabbitMQ) or \
                 KAFKA_BROKERS (Kafka; or HEXERACT_TRANSPORT=kafka, as the service may have it \
                 for a local broker) as the service has it to replay to the broker, or add \
                 {TO_STORE} if the service now runs from the store alone",
                self.parked_count
            )
        } else {
            return Ok(());
        };
        Err(CliError::Failed(Error::Unsupported(problem)))
    }
}

/// Whether `letter` was written by a broker's consumer: RabbitMQ and Kafka workers give the
/// letters they park a name-based id (UUID v5, from the queue or the record's position, so that
/// a message parked twice is one letter); the store's own dead letters have time-ordered ids
/// (v7).
fn parked_by_a_broker(letter: &DeadLetter) -> bool {
    letter.id.get_version() == Some(uuid::Version::Sha1)
}

/// Where `replay` sends dead letters back: job runs to the scheduler's occurrences; messages
/// to the outbox, or under `AMQP_URL` to the broker (connected once, at the first message).
struct Resend<'a> {
    store: &'a dyn Store,
    #[cfg(feature = "rabbitmq")]
    amqp: Option<&'a crate::config::Amqp>,
    #[cfg(feature = "rabbitmq")]
    broker: Option<crate::run::rabbitmq::BrokerReplay>,
    /// `KAFKA_BROKERS` is set.
    #[cfg(feature = "kafka")]
    kafka: bool,
}

impl<'a> Resend<'a> {
    fn new(settings: &'a crate::config::AppConfig, store: &'a dyn Store) -> Resend<'a> {
        let _ = settings;
        Resend {
            store,
            #[cfg(feature = "rabbitmq")]
            amqp: settings.amqp.as_ref(),
            #[cfg(feature = "rabbitmq")]
            broker: None,
            #[cfg(feature = "kafka")]
            kafka: settings.kafka.is_some(),
        }
    }

    /// Sends `letter` back and deletes it; returns the line saying where it went, or `None`
    /// when it is no longer a dead letter.
    async fn send(&mut self, letter: &DeadLetter) -> Result<Option<String>, CliError> {
        let envelope = &letter.envelope;
        if envelope.message_type == SCHEDULE_MESSAGE_TYPE {
            // The scheduler runs from the database under `AMQP_URL` too.
            if !self.store.replay_occurrence(letter.id).await? {
                return Ok(None);
            }
            return Ok(Some(format!(
                "replayed {} (the run of the scheduled job {} for {}): it runs again soon, \
                 attempts from 1",
                letter.id,
                visible(letter.handler.as_deref().unwrap_or("?")),
                envelope.created_at.format("%Y-%m-%dT%H:%M:%S%.3fZ")
            )));
        }
        #[cfg(feature = "rabbitmq")]
        if let Some(amqp) = self.amqp {
            let broker = match &mut self.broker {
                Some(broker) => broker,
                empty => empty.insert(crate::run::rabbitmq::BrokerReplay::connect(amqp).await?),
            };
            let place = broker.replay(letter, self.store).await?;
            return Ok(Some(format!(
                "replayed {} ({}) to {}: attempts start over",
                letter.id,
                visible(&envelope.message_type),
                visible(&place)
            )));
        }
        #[cfg(feature = "kafka")]
        if self.kafka {
            // Through the outbox and the relay to the aggregate's topic, for its handler alone.
            let envelope = crate::kafka::wire::replay_envelope(letter);
            // One transaction: the letter leaves with its message in the outbox, which the relay
            // deletes only once Kafka acknowledged the record.
            if !self
                .store
                .replay_dead_letter_as(letter.id, &envelope)
                .await?
            {
                return Ok(None);
            }
            return Ok(Some(format!(
                "replayed {} ({}) through the outbox to its Kafka topic, for {}: attempts start \
                 over, after the records of its aggregate published since",
                letter.id,
                visible(&letter.envelope.message_type),
                visible(
                    letter
                        .handler
                        .as_deref()
                        .unwrap_or("every handler of its type")
                )
            )));
        }
        if !self.store.replay_dead_letter(letter.id).await? {
            return Ok(None);
        }
        Ok(Some(format!(
            "replayed {} ({} for {}): it goes to its handler again, attempts from 1",
            letter.id,
            visible(&envelope.message_type),
            visible(
                letter
                    .handler
                    .as_deref()
                    .unwrap_or("every handler of its type")
            )
        )))
    }

    async fn close(self) {
        #[cfg(feature = "rabbitmq")]
        if let Some(broker) = self.broker {
            broker.close().await;
        }
    }
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

    fn usage_error<T: std::fmt::Debug>(result: Result<T, CliError>) -> String {
        match result {
            Err(CliError::Usage(problem)) => problem,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn purge_and_replay_need_a_filter_or_all_and_never_both() {
        for command in ["purge", "replay"] {
            let problem = usage_error(parse_selection(command, &[]));
            assert!(problem.contains("--all"), "{problem}");
            assert!(problem.contains(command), "{problem}");
            assert!(matches!(
                parse_selection(command, &["--all"]),
                Ok(Selection::All)
            ));
            let problem = usage_error(parse_selection(command, &["--all", "--reason", "x"]));
            assert!(problem.contains("not both"), "{problem}");
            usage_error(parse_selection(command, &["--reason", "x", "--all"]));
            let problem = usage_error(parse_selection(
                command,
                &["--handler", "a", "--limit", "5"],
            ));
            assert!(problem.contains("--limit is for list"), "{problem}");
            usage_error(parse_selection(command, &["--handler"]));
            usage_error(parse_selection(command, &["--older-than", "soon"]));
            // A zero age is older than nothing: it would quietly mean every dead letter.
            for zero in ["0s", "0m", "0h", "0d", "00s"] {
                let problem = usage_error(parse_selection(command, &["--older-than", zero]));
                assert!(
                    problem.contains("--older-than 0s") && problem.contains("--all"),
                    "{problem}"
                );
                usage_error(parse_selection(
                    command,
                    &["--reason", "x", "--older-than", zero],
                ));
            }
            assert!(matches!(
                parse_selection(command, &["--older-than", "1s"]),
                Ok(Selection::Matching(_))
            ));
            usage_error(parse_selection(command, &["--colour", "red"]));
        }
        let Ok(Selection::Matching(filter)) = parse_selection(
            "purge",
            &[
                "--reason",
                "ledger_closed",
                "--older-than",
                "2h",
                "--handler",
                "billing::book",
            ],
        ) else {
            panic!("filters select what they match");
        };
        assert_eq!(filter.reason.as_deref(), Some("ledger_closed"));
        assert_eq!(filter.older_than, Some(Duration::from_secs(7_200)));
        assert_eq!(filter.handler.as_deref(), Some("billing::book"));
        // A value is a value, even one that looks like `--all`.
        let Ok(Selection::Matching(filter)) = parse_selection("purge", &["--handler", "--all"])
        else {
            panic!("a handler named --all");
        };
        assert_eq!(filter.handler.as_deref(), Some("--all"));
    }

    #[test]
    fn replay_takes_one_id_or_a_selection() {
        let id = Uuid::now_v7();
        let text = id.to_string();
        assert!(matches!(parse_replay(&[&text]), Ok(Replay::One(one)) if one == id));
        assert!(matches!(
            parse_replay(&["--all"]),
            Ok(Replay::Selected(Selection::All))
        ));
        assert!(matches!(
            parse_replay(&["--handler", "billing::book"]),
            Ok(Replay::Selected(Selection::Matching(filter)))
                if filter.handler.as_deref() == Some("billing::book")
        ));
        let problem = usage_error(parse_replay(&[]));
        assert!(
            problem.contains("ID") && problem.contains("--all"),
            "{problem}"
        );
        let problem = usage_error(parse_replay(&[&text, "--handler", "billing::book"]));
        assert!(problem.contains("not both"), "{problem}");
        usage_error(parse_replay(&["--handler", "billing::book", &text]));
        usage_error(parse_replay(&["not-an-id"]));
        usage_error(parse_replay(&["--limit", "3"]));
    }

    #[test]
    fn to_store_is_taken_wherever_it_stands_but_never_from_a_value() {
        assert_eq!(
            take_to_store(&["--to-store", "--all"]),
            (vec!["--all"], true)
        );
        assert_eq!(
            take_to_store(&["--reason", "x", "--to-store"]),
            (vec!["--reason", "x"], true)
        );
        assert_eq!(
            take_to_store(&["--handler", "--to-store"]),
            (vec!["--handler", "--to-store"], false)
        );
        assert_eq!(take_to_store(&["--all"]), (vec!["--all"], false));
    }

    #[test]
    fn control_and_bidi_characters_are_shown_as_escapes_and_text_as_it_is() {
        for (text, one_line, on_lines) in [
            (
                "plain text, äöü, 日本語",
                "plain text, äöü, 日本語",
                "plain text, äöü, 日本語",
            ),
            ("\x1b[2Jgone", "\\u{1b}[2Jgone", "\\u{1b}[2Jgone"),
            ("a\nb\tc\rd", "a\\nb\\tc\\rd", "a\nb\tc\\rd"),
            (
                "\u{7f}\u{9b}\0",
                "\\u{7f}\\u{9b}\\u{0}",
                "\\u{7f}\\u{9b}\\u{0}",
            ),
            ("abc\u{202e}fed", "abc\\u{202e}fed", "abc\\u{202e}fed"),
            (
                "\u{2066}x\u{2069}\u{2028}",
                "\\u{2066}x\\u{2069}\\u{2028}",
                "\\u{2066}x\\u{2069}\\u{2028}",
            ),
        ] {
            assert_eq!(visible(text), one_line, "{text:?}");
            assert_eq!(visible_lines(text), on_lines, "{text:?}");
        }
        assert!(matches!(visible("as is"), std::borrow::Cow::Borrowed(_)));
    }

    fn letter(id: Uuid, message_type: &str) -> DeadLetter {
        let mut letter = DeadLetter::new(
            crate::Envelope::from_raw(message_type, &b"{}"[..]),
            Some("billing::book".to_owned()),
            crate::Reason::from_static("ledger_closed"),
            "",
        );
        letter.id = id;
        letter
    }

    #[test]
    fn a_replay_to_the_store_is_refused_for_a_service_on_a_broker_only() {
        let ours = letter(Uuid::now_v7(), "Invoice");
        let parked = letter(Uuid::new_v5(&Uuid::nil(), b"parked"), "Invoice");
        let job_run = letter(Uuid::new_v5(&Uuid::nil(), b"run"), SCHEDULE_MESSAGE_TYPE);
        // (queues the store remembers, letters, refused naming)
        let cases: [(usize, Vec<&DeadLetter>, Option<&str>); 6] = [
            (0, vec![&ours], None),
            (0, vec![], None),
            (0, vec![&job_run], None),
            (2, vec![&job_run], None),
            (2, vec![&ours], Some("AMQP_URL")),
            (0, vec![&ours, &parked], Some("KAFKA_BROKERS")),
        ];
        for (declared_queues, letters, refused) in cases {
            let mut store_only = StoreOnly {
                declared_queues,
                ..StoreOnly::default()
            };
            let letters: Vec<DeadLetter> = letters.into_iter().cloned().collect();
            store_only.count(&letters);
            match (store_only.refuse(), refused) {
                (Ok(()), None) => {}
                (Err(CliError::Failed(error)), Some(variable)) => {
                    let error = error.to_string();
                    assert!(error.contains(variable), "{error}");
                    assert!(error.contains("AMQP_URL"), "{error}");
                    assert!(error.contains(TO_STORE), "{error}");
                }
                (other, _) => panic!("{declared_queues} queue(s), {letters:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_purge_without_filters_or_all_is_a_usage_error() {
        let mut out = String::new();
        let args = ["dead-letters".to_owned(), "purge".to_owned()];
        let problem = usage_error(execute(&args, &mut out).await);
        assert!(problem.contains("--all"), "{problem}");
        assert!(out.is_empty(), "{out}");
    }
}
