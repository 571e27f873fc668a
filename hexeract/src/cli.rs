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
//! - `dead-letters show ID`: one dead letter in full, payload included.
//! - `dead-letters replay ID`, or `dead-letters replay` with filters (`--handler`, `--reason`,
//!   `--older-than`, at least one) or `--all`: sends each back, attempts from 1: a new
//!   delivery from the outbox, or under `AMQP_URL` a confirmed publish to the handler's queue.
//!   A scheduled job's run becomes an occurrence of the job again, due now, with its own fire
//!   time (under `AMQP_URL` too: the scheduler runs from the database); refused when this
//!   program has no job of that name. A dead letter is deleted only once it was sent back;
//!   one line per replayed letter, then (with filters) how many.
//! - `dead-letters purge` with the same filters (at least one) or `--all`: deletes the dead
//!   letters they match, and says how many. Without either it deletes nothing: a usage error.
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

/// [`main`] for an application built with [`Worker`](crate::Worker): `run` runs that worker
/// (with its state, middleware and handlers), and the other commands use its settings and
/// know its handlers.
///
/// ```no_run
/// use hexeract::{Worker, WorkerConfig};
///
/// #[derive(Clone)]
/// struct Settings { cart_ttl_secs: u64 }
///
/// #[tokio::main]
/// async fn main() -> std::process::ExitCode {
///     let config = match WorkerConfig::from_env() {
///         Ok(config) => config,
///         Err(error) => {
///             eprintln!("{error}");
///             return std::process::ExitCode::FAILURE;
///         }
///     };
///     let worker = Worker::new(config).state(Settings { cart_ttl_secs: 900 });
///     // `app`, `app run`, `app handlers`, `app dead-letters list`, …
///     hexeract::cli::main_with(worker).await
/// }
/// ```
pub async fn main_with(worker: crate::app::Worker) -> ExitCode {
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
  <binary> dead-letters replay ID
  <binary> dead-letters replay [--handler NAME] [--reason REASON] [--older-than 1h] | --all
  <binary> dead-letters purge [--handler NAME] [--reason REASON] [--older-than 1h] | --all
replay and purge without an ID act on every dead letter the filters match: give at least one
filter, or --all for every dead letter";

/// Runs the command `args` (the arguments after the program name), writing what it prints to
/// `out`: for tests and for programs with commands of their own.
pub async fn execute(args: &[String], out: &mut String) -> Result<(), CliError> {
    // Help and usage errors need no settings: an invalid environment does not hide them.
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Parsed::Help = parse(&words, args)? {
        let _ = writeln!(out, "{USAGE}");
        return Ok(());
    }
    let config = crate::config::WorkerConfig::from_env().map_err(Error::from)?;
    execute_with(crate::app::Worker::new(config), args, out).await
}

/// [`execute`] for an application built with [`Worker`](crate::Worker) (see [`main_with`]).
pub async fn execute_with(
    worker: crate::app::Worker,
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
    let (config, registry) = match command {
        Command::Handlers | Command::Replay(_) | Command::UpgradeQueues => {
            let (config, application) = worker.prepare()?;
            (config, Some(application.registry))
        }
        _ => {
            worker.config().check().map_err(Error::from)?;
            (worker.config().clone(), None)
        }
    };
    let program = Program {
        store: crate::store::process::store_for(&config.database).await?,
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
        Command::Replay(target) => replay(&program, registry(), &target, out).await,
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
        ["dead-letters", "replay", options @ ..] => Command::Replay(parse_replay(options)?),
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
    Replay(Replay),
    Purge(Selection),
    UpgradeQueues,
}

/// What the commands work on: the worker's settings and its store.
struct Program {
    config: crate::config::WorkerConfig,
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
                format!("{handler} (renamed or removed?)")
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
        let topology = crate::rabbitmq::supervisor::run_topology(
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
    let unowned = crate::rabbitmq::ownership::find_unowned(&connection, &topology, store).await;
    let _ = connection.lapin().close(200, "done".into()).await;
    let unowned = unowned?;
    if !unowned.is_empty() {
        let _ = writeln!(out, "queues no handler here owns:");
        for queue in &unowned {
            let _ = writeln!(
                out,
                "  {}  (was {}, message {})  {} message(s), {} consumer(s)",
                queue.declared.queue,
                queue.declared.handler,
                queue.declared.message_type,
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
                letter.envelope.message_type,
                letter.handler.as_deref().unwrap_or("(no handler)"),
                letter.reason,
                letter.attempts,
                first_line(&letter.detail),
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
    out: &mut String,
) -> Result<(), CliError> {
    let settings = &program.config;
    let store = program.store.clone();
    let mut owners = Owners::of_this_program(registry)?;
    let selection = match target {
        Replay::One(id) => {
            let letter = find(&*store, id).await?;
            owners.count(std::slice::from_ref(&letter));
            owners.refuse(target)?;
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
    }
    owners.refuse(target)?;
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

/// Where `replay` sends dead letters back: job runs to the scheduler's occurrences; messages
/// to the outbox, or under `AMQP_URL` to the broker (connected once, at the first message).
struct Resend<'a> {
    store: &'a dyn Store,
    #[cfg(feature = "rabbitmq")]
    amqp: Option<&'a crate::config::Amqp>,
    #[cfg(feature = "rabbitmq")]
    broker: Option<crate::rabbitmq::supervisor::BrokerReplay>,
    /// `KAFKA_BROKERS` is set.
    #[cfg(feature = "kafka")]
    kafka: bool,
}

impl<'a> Resend<'a> {
    fn new(settings: &'a crate::config::WorkerConfig, store: &'a dyn Store) -> Resend<'a> {
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
                letter.handler.as_deref().unwrap_or("?"),
                envelope.created_at.format("%Y-%m-%dT%H:%M:%S%.3fZ")
            )));
        }
        #[cfg(feature = "rabbitmq")]
        if let Some(amqp) = self.amqp {
            let broker = match &mut self.broker {
                Some(broker) => broker,
                empty => {
                    empty.insert(crate::rabbitmq::supervisor::BrokerReplay::connect(amqp).await?)
                }
            };
            let place = broker.replay(letter, self.store).await?;
            return Ok(Some(format!(
                "replayed {} ({}) to {place}: attempts start over",
                letter.id, envelope.message_type
            )));
        }
        #[cfg(feature = "kafka")]
        if self.kafka {
            // Through the outbox and the relay to the aggregate's topic, for its handler alone.
            let mut envelope = envelope.clone();
            envelope.attempt = 0;
            if let Some(handler) = &letter.handler {
                envelope.headers.insert(
                    crate::kafka::wire::headers::REPLAY_FOR.to_owned(),
                    handler.clone(),
                );
            }
            self.store.publish(vec![envelope]).await?;
            if !self.store.delete_dead_letter(letter.id).await? {
                return Ok(Some(format!(
                    "{}: sent to the outbox, but it was no longer a dead letter (replayed or \
                     purged meanwhile): it may be handled twice",
                    letter.id
                )));
            }
            return Ok(Some(format!(
                "replayed {} ({}) through the outbox to its Kafka topic, for {}: attempts start \
                 over, after the records of its aggregate published since",
                letter.id,
                letter.envelope.message_type,
                letter
                    .handler
                    .as_deref()
                    .unwrap_or("every handler of its type")
            )));
        }
        if !self.store.replay_dead_letter(letter.id).await? {
            return Ok(None);
        }
        Ok(Some(format!(
            "replayed {} ({} for {}): it goes to its handler again, attempts from 1",
            letter.id,
            envelope.message_type,
            letter
                .handler
                .as_deref()
                .unwrap_or("every handler of its type")
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

    #[tokio::test]
    async fn a_purge_without_filters_or_all_is_a_usage_error() {
        let mut out = String::new();
        let args = ["dead-letters".to_owned(), "purge".to_owned()];
        let problem = usage_error(execute(&args, &mut out).await);
        assert!(problem.contains("--all"), "{problem}");
        assert!(out.is_empty(), "{out}");
    }
}
