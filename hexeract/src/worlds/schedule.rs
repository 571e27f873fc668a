//! Scheduled jobs and delayed messages.
//!
//! A job is an async fn with `#[scheduled(cron = "…")]` or `#[scheduled(every = "…")]`; the
//! [`SchedulerWorker`] runs every job of the program (collected at link time, like handlers)
//! from the store's `schedules` and `occurrences` tables, so that replicas share the work: each
//! fire time runs once, under a lease, with the retry policy of handlers.
//!
//! ```
//! use hexeract::{scheduled, Context};
//!
//! /// Every five minutes, at second 0 (UTC unless `tz` says otherwise).
//! #[scheduled(cron = "0 */5 * * * *")]
//! async fn expire_carts(ctx: &Context) -> Result<(), std::io::Error> {
//!     println!("expiring carts (fire time {:?})", ctx.scheduled_for());
//!     Ok(())
//! }
//!
//! /// Every 30 s, counted from the Unix epoch (so every replica agrees on the fire times).
//! #[scheduled(every = "30s", name = "billing::sync_rates", catch_up = "none")]
//! async fn sync_rates(_ctx: &Context) -> anyhow::Result<()> {
//!     Ok(())
//! }
//! ```
//!
//! Delayed messages go to their handlers when due: [`schedule_at`] and [`schedule_after`] on
//! the process's store, [`outbox::schedule_at`](crate::outbox::schedule_at) and
//! [`outbox::schedule_after`](crate::outbox::schedule_after) inside the caller's transaction.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use uuid::Uuid;

use crate::context::Context;
use crate::envelope::Envelope;
use crate::message::Message;
use crate::middleware::ErasedJob;
use crate::outcome::HandlerOutcome;
use crate::publish::PublishError;
use crate::registry::Location;
use crate::registry::MissingState;
use crate::state::States;
use crate::store::{Due, Plan};

mod worker;
pub use worker::{ScheduleSource, SchedulerBuilder, SchedulerWorker};

/// What to do with the fire times a schedule missed (the scheduler was down, or busy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CatchUp {
    /// Run once for all of them, at once, then go on with the next fire time (the default).
    #[default]
    Once,
    /// Skip them: the next run is at the next fire time. A fire time found due more than the
    /// scheduler's `catch_up_grace` (60 s) late counts as missed.
    None,
}

impl CatchUp {
    fn as_str(self) -> &'static str {
        match self {
            CatchUp::Once => "once",
            CatchUp::None => "none",
        }
    }
}

impl std::fmt::Display for CatchUp {
    /// As `#[scheduled(catch_up = "…")]` spells it: `once` or `none`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A scheduled job as `#[scheduled]` registers it. Not public API: the macro fills it in.
#[doc(hidden)]
#[derive(Debug)]
pub struct ScheduleRegistration {
    pub name: &'static str,
    /// A cron expression (checked by the macro), or `None` for an `every` schedule.
    pub cron: Option<&'static str>,
    /// The period of an `every` schedule, in milliseconds.
    pub every_millis: u64,
    /// An IANA time zone name (checked by the macro).
    pub tz: &'static str,
    pub catch_up: CatchUp,
    pub timeout: Option<Duration>,
    pub file: &'static str,
    pub line: u32,
    pub column: u32,
    /// The job, built from its scheduler's state.
    pub make: MakeJob,
}

/// How a `#[scheduled]` job is built from its worker's state (the names of the state types it
/// lacks pushed onto the list).
#[doc(hidden)]
pub type MakeJob = fn(&crate::state::States, &mut Vec<&'static str>) -> Option<Arc<dyn ErasedJob>>;

inventory::collect!(ScheduleRegistration);

/// When a schedule fires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spec {
    /// A cron expression evaluated in a time zone.
    Cron {
        /// The expression.
        cron: hexeract_cron::Cron,
        /// Its time zone.
        tz: hexeract_cron::Tz,
    },
    /// Every `period`, counted from the Unix epoch.
    Every(Duration),
}

impl Spec {
    /// The first fire time strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            // `Cron::parse` rejects expressions that never fire.
            Spec::Cron { cron, tz } => cron
                .next_after(after, *tz)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
            Spec::Every(period) => hexeract_cron::every_next_after(*period, after),
        }
    }

    /// The text the store keeps of it (`cron:<expression>@<zone>`, `every:<n>ms`), to notice a
    /// schedule that changed: a schedule whose text differs starts over at its first fire time.
    pub fn stored_text(&self) -> String {
        match self {
            Spec::Cron { cron, tz } => format!("cron:{cron}@{tz}"),
            Spec::Every(period) => format!("every:{}ms", period.as_millis()),
        }
    }

    /// What runs for a schedule whose next fire time `due` has come (`now`, not before it):
    /// with `Once`, `due` runs (for every fire time missed since, if the next one has passed
    /// too); with `None`, `due` runs only if no later fire time has passed and it is at most
    /// `grace` late. Either way the schedule goes on with the first fire time after `now`.
    pub(crate) fn plan(
        &self,
        catch_up: CatchUp,
        grace: Duration,
        due: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Plan {
        let following = self.next_after(due);
        let missed = following <= now;
        let next_fire_at = if missed {
            self.next_after(now)
        } else {
            following
        };
        let late = (now - due).to_std().unwrap_or_default();
        let fire_at = match catch_up {
            CatchUp::Once => Some(due),
            CatchUp::None => (!missed && late <= grace).then_some(due),
        };
        Plan {
            fire_at,
            next_fire_at,
        }
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::Cron { cron, tz } => write!(f, "cron \"{cron}\" ({tz})"),
            Spec::Every(period) => write!(f, "every {period:?}"),
        }
    }
}

/// A job the scheduler runs: its name, when it fires and the function.
#[derive(Clone)]
pub struct ScheduledJob {
    name: Arc<str>,
    spec: Spec,
    catch_up: CatchUp,
    timeout: Option<Duration>,
    location: Option<Location>,
    run: Arc<dyn ErasedJob>,
    /// How a `#[scheduled]` job is built again with its scheduler's state.
    make: Option<MakeJob>,
}

/// A job written as a plain function.
struct FnJob(for<'a> fn(&'a Context) -> BoxFuture<'a, HandlerOutcome>);

impl ErasedJob for FnJob {
    fn run<'a>(&'a self, ctx: &'a Context) -> BoxFuture<'a, HandlerOutcome> {
        (self.0)(ctx)
    }
}

/// Stands in for a `#[scheduled]` job that takes state until its scheduler builds it with that
/// state; a scheduler never runs one (its build stops at the missing state).
struct Unprovided;

impl ErasedJob for Unprovided {
    fn run<'a>(&'a self, _: &'a Context) -> BoxFuture<'a, HandlerOutcome> {
        Box::pin(async {
            HandlerOutcome::dead_letter(
                crate::reason::Reason::STATE_MISSING,
                "the job takes state its scheduler was not given",
            )
        })
    }
}

impl ScheduledJob {
    /// A job named `name` calling `run` when `spec` fires (what `#[scheduled]` builds; for
    /// jobs registered in code). `run` is a plain function returning a boxed future:
    ///
    /// ```
    /// use std::time::Duration;
    /// use hexeract::schedule::{CatchUp, ScheduledJob, Spec};
    /// use hexeract::{Context, HandlerOutcome};
    ///
    /// fn tick(_ctx: &Context) -> futures_util::future::BoxFuture<'_, HandlerOutcome> {
    ///     Box::pin(async { HandlerOutcome::Ack })
    /// }
    /// let job = ScheduledJob::new("tick", Spec::Every(Duration::from_secs(10)), tick)
    ///     .catch_up(CatchUp::None);
    /// assert_eq!(job.name(), "tick");
    /// ```
    pub fn new(
        name: impl Into<String>,
        spec: Spec,
        run: for<'a> fn(&'a Context) -> BoxFuture<'a, HandlerOutcome>,
    ) -> ScheduledJob {
        ScheduledJob {
            name: Arc::from(name.into()),
            spec,
            catch_up: CatchUp::Once,
            timeout: None,
            location: None,
            run: Arc::new(FnJob(run)),
            make: None,
        }
    }

    /// What to do with missed fire times (default [`CatchUp::Once`]).
    pub fn catch_up(mut self, catch_up: CatchUp) -> ScheduledJob {
        self.catch_up = catch_up;
        self
    }

    /// A deadline of its own for each run, instead of the scheduler's `dispatch_timeout`.
    pub fn timeout(mut self, timeout: Duration) -> ScheduledJob {
        self.timeout = Some(timeout);
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When it fires.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// Its catch-up rule.
    pub fn catch_up_rule(&self) -> CatchUp {
        self.catch_up
    }

    /// Where `#[scheduled]` was written, for a job from the macro.
    pub fn location(&self) -> Option<Location> {
        self.location
    }

    pub(crate) fn shared_name(&self) -> Arc<str> {
        self.name.clone()
    }

    pub(crate) fn own_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    pub(crate) fn runner(&self) -> Arc<dyn ErasedJob> {
        self.run.clone()
    }

    /// The job built with `states` (a `#[scheduled]` job that takes state); `None`, with what
    /// is missing pushed to `missing`, when a type it takes is not there.
    pub(crate) fn provide(
        &self,
        states: &States,
        missing: &mut Vec<MissingState>,
    ) -> Option<ScheduledJob> {
        let Some(make) = self.make else {
            return Some(self.clone());
        };
        let mut types = Vec::new();
        match make(states, &mut types) {
            Some(run) => Some(ScheduledJob {
                run,
                ..self.clone()
            }),
            None => {
                missing.extend(types.into_iter().map(|type_name| {
                    MissingState {
                        handler: self.name.to_string(),
                        location: self
                            .location
                            .map_or_else(|| "registered in code".to_owned(), |l| l.to_string()),
                        type_name,
                    }
                }));
                None
            }
        }
    }

    fn from_registration(registration: &ScheduleRegistration) -> Result<ScheduledJob, String> {
        let spec = match registration.cron {
            Some(expression) => Spec::Cron {
                cron: hexeract_cron::Cron::parse(expression).map_err(|e| e.to_string())?,
                tz: hexeract_cron::parse_time_zone(registration.tz).map_err(|e| e.to_string())?,
            },
            None if registration.every_millis == 0 => {
                return Err("`every` must be longer than zero".to_owned())
            }
            None => Spec::Every(Duration::from_millis(registration.every_millis)),
        };
        Ok(ScheduledJob {
            name: Arc::from(registration.name),
            spec,
            catch_up: registration.catch_up,
            timeout: registration.timeout,
            location: Some(Location {
                file: registration.file,
                line: registration.line,
                column: registration.column,
            }),
            run: (registration.make)(&States::new(), &mut Vec::new())
                .unwrap_or_else(|| Arc::new(Unprovided)),
            make: Some(registration.make),
        })
    }
}

impl fmt::Debug for ScheduledJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduledJob")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .field("catch_up", &self.catch_up.as_str())
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// The message a job's run shows its context: `id`, the schedule's name and the fire time in
/// the payload, the fire time as `ctx.scheduled_for()`, and the attempt.
pub(crate) fn job_envelope(
    id: Uuid,
    schedule: &str,
    fire_at: DateTime<Utc>,
    attempt: u32,
) -> Envelope {
    let fire_time = fire_at.to_rfc3339();
    // Names are plain text; serde_json escapes whatever they hold.
    let payload = format!(
        "{{\"schedule\":{},\"fire_at\":\"{fire_time}\"}}",
        serde_json::Value::from(schedule)
    );
    let mut envelope =
        Envelope::from_raw(crate::store::SCHEDULE_MESSAGE_TYPE, payload.into_bytes());
    envelope.id = id;
    envelope.attempt = attempt;
    envelope.created_at = fire_at;
    envelope
        .headers
        .insert(crate::envelope::FIRE_TIME_HEADER.to_owned(), fire_time);
    envelope
}

/// Every `#[scheduled]` job of the program, or an error naming each that is invalid or
/// whose name is taken twice.
pub fn jobs_from_inventory() -> Result<Vec<ScheduledJob>, crate::worker::BuildError> {
    let mut jobs: Vec<ScheduledJob> = Vec::new();
    let mut problems = Vec::new();
    for registration in inventory::iter::<ScheduleRegistration> {
        match ScheduledJob::from_registration(registration) {
            Ok(job) => {
                if let Some(other) = jobs.iter().find(|other| other.name == job.name) {
                    problems.push(format!(
                        "two scheduled jobs are named {:?} ({} and {}:{}:{}): give one a \
                         `name = \"…\"` of its own",
                        registration.name,
                        other.location.map(|l| l.to_string()).unwrap_or_default(),
                        registration.file,
                        registration.line,
                        registration.column
                    ));
                } else {
                    jobs.push(job);
                }
            }
            Err(problem) => problems.push(format!(
                "scheduled job {:?} at {}:{}: {problem}",
                registration.name, registration.file, registration.line
            )),
        }
    }
    if problems.is_empty() {
        jobs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(jobs)
    } else {
        Err(crate::worker::BuildError::Unsupported(problems.join("; ")))
    }
}

/// Sends `message` to its handlers at `at` (or at once if `at` has passed), through the
/// process's store ([`default_store`](crate::store::default_store)). Returns the message id.
///
/// ```no_run
/// # async fn example() -> Result<(), hexeract::PublishError> {
/// use hexeract::Message;
///
/// #[derive(serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "CartReminder")]
/// struct CartReminder { cart_id: u64 }
///
/// let at = chrono::Utc::now() + chrono::Duration::hours(24);
/// hexeract::schedule_at(at, &CartReminder { cart_id: 7 }).await?;
/// # Ok(())
/// # }
/// ```
pub async fn schedule_at<M: Message>(at: DateTime<Utc>, message: &M) -> Result<Uuid, PublishError> {
    let mut envelope = Envelope::new(message)?;
    crate::trace::produce(&mut envelope);
    schedule_envelope(envelope, Due::At(at)).await
}

/// Sends `message` to its handlers `delay` from now (on the database's clock), through the
/// process's store. Returns the message id.
///
/// ```no_run
/// # async fn example() -> Result<(), hexeract::PublishError> {
/// use std::time::Duration;
/// use hexeract::Message;
///
/// #[derive(serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "CartReminder")]
/// struct CartReminder { cart_id: u64 }
///
/// hexeract::schedule_after(Duration::from_secs(3600), &CartReminder { cart_id: 7 }).await?;
/// # Ok(())
/// # }
/// ```
pub async fn schedule_after<M: Message>(
    delay: Duration,
    message: &M,
) -> Result<Uuid, PublishError> {
    let mut envelope = Envelope::new(message)?;
    crate::trace::produce(&mut envelope);
    schedule_envelope(envelope, Due::After(delay)).await
}

async fn schedule_envelope(envelope: Envelope, due: Due) -> Result<Uuid, PublishError> {
    let id = envelope.id;
    let store = crate::store::default_store()
        .await
        .map_err(|error| PublishError::Store(error.into()))?;
    store
        .schedule_messages(vec![envelope], due)
        .await
        .map_err(|error| PublishError::Store(error.into()))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(seconds, 0).unwrap()
    }

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn a_due_fire_time_runs_and_the_next_follows_it() {
        // 1_800_000_000 is a multiple of 30 s.
        let spec = Spec::Every(Duration::from_secs(30));
        let plan = spec.plan(CatchUp::Once, GRACE, at(1_800_000_030), at(1_800_000_030));
        assert_eq!(plan.fire_at, Some(at(1_800_000_030)));
        assert_eq!(plan.next_fire_at, at(1_800_000_060));
        let plan = spec.plan(CatchUp::None, GRACE, at(1_800_000_030), at(1_800_000_031));
        assert_eq!(
            plan.fire_at,
            Some(at(1_800_000_030)),
            "a second late is not missed"
        );
    }

    #[test]
    fn missed_fire_times_run_once_with_once_and_not_at_all_with_none() {
        let spec = Spec::Every(Duration::from_secs(30));
        // Down for ten minutes: twenty fire times passed.
        let due = at(1_800_000_030);
        let now = at(1_800_000_630 + 5);
        let once = spec.plan(CatchUp::Once, GRACE, due, now);
        assert_eq!(once.fire_at, Some(due), "one run stands for all of them");
        assert_eq!(
            once.next_fire_at,
            at(1_800_000_660),
            "then the next after now"
        );
        let none = spec.plan(CatchUp::None, GRACE, due, now);
        assert_eq!(none.fire_at, None);
        assert_eq!(none.next_fire_at, at(1_800_000_660));
        // A daily job found 10 minutes late: no later fire time passed, but past the grace.
        let daily = Spec::Every(Duration::from_secs(86_400));
        let due = at(1_800_057_600);
        let late = daily.plan(CatchUp::None, GRACE, due, at(1_800_058_200));
        assert_eq!(late.fire_at, None);
        assert_eq!(late.next_fire_at, at(1_800_144_000));
    }
}
