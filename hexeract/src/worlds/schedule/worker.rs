//! [`SchedulerWorker`]: plans, claims and runs the occurrences of scheduled jobs, and moves due
//! delayed messages into the outbox.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::delivery::{Engine, Policy, Slot};
use crate::envelope::Envelope;
use crate::health::Probe;
use crate::knobs::KnobChecks;
use crate::middleware::Middlewares;
use crate::outbox::StorePublisher;
use crate::registry::RegistryError;
use crate::schedule::{jobs_from_inventory, ScheduledJob, Spec};
use crate::state::States;
use crate::store::{
    ClaimedOccurrence, Leased, LeasedFeed, Plan, ScheduleDefinition, ScheduleStore, StoreError,
};
use crate::worker::feed::{Arrival, Pace, Pass, Refill, Started, To, Worker};
use crate::worker::{claim_lease, BuildError, ClaimSource, Source, WorkerBuilder};

/// Builds a [`SchedulerWorker`]. The defaults are the library's: `poll_interval` 100 ms,
/// `batch_size` 10, `min_cycle_delay` 5 ms, `dispatch_timeout` 30 s, and a `lease` of the
/// longest dispatch timeout and 5 s to settle (35 s).
///
/// ```
/// use std::time::Duration;
/// use hexeract::schedule::SchedulerWorker;
/// use hexeract::store::sqlite::SqliteStore;
///
/// # async fn example(store: SqliteStore) -> Result<(), hexeract::Error> {
/// let scheduler = SchedulerWorker::builder(store)
///     .from_inventory()
///     .lease(Duration::from_secs(60))
///     .dispatch_timeout(Duration::from_secs(45))
///     .build()?;
/// scheduler.run(hexeract::CancellationToken::new()).await?;
/// # Ok(())
/// # }
/// ```
pub type SchedulerBuilder = WorkerBuilder<ScheduleSource>;

/// The scheduler's own half of a [`SchedulerWorker`]: the store its schedules and occurrences
/// are kept in, its jobs, and its own knobs. Its setters are on [`SchedulerBuilder`].
pub struct ScheduleSource {
    store: Arc<dyn ScheduleStore>,
    jobs: Vec<ScheduledJob>,
    from_inventory: bool,
    catch_up_grace: Duration,
    release_messages: bool,
    health: Option<Probe>,
}

impl fmt::Debug for ScheduleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduleSource")
            .field("jobs", &self.jobs)
            .finish_non_exhaustive()
    }
}

impl crate::worker::sealed::Sealed for ScheduleSource {}
impl ClaimSource for ScheduleSource {}

impl Source for ScheduleSource {
    type Worker = SchedulerWorker;

    /// In the scheduler's words: its handler timeout is the `dispatch_timeout`.
    fn fmt_builder(builder: &SchedulerBuilder, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policy = &builder.policy;
        f.debug_struct("SchedulerBuilder")
            .field("jobs", &builder.source.jobs)
            .field("from_inventory", &builder.source.from_inventory)
            .field("poll_interval", &policy.poll_interval)
            .field("batch_size", &policy.batch_size)
            .field("min_cycle_delay", &policy.min_cycle_delay)
            .field("lease", &policy.lease)
            .field("dispatch_timeout", &policy.handler_timeout)
            .field("store_timeout", &policy.store_timeout)
            .field("retry", &policy.retry)
            .field("shutdown_grace", &policy.shutdown_grace)
            .finish_non_exhaustive()
    }

    fn build(builder: SchedulerBuilder) -> Result<SchedulerWorker, BuildError> {
        let (handlers, policy, source) = builder.into_parts();
        KnobChecks::default()
            .not_zero_when_set("lease", policy.lease)
            .not_zero("dispatch_timeout", policy.handler_timeout)
            .not_zero("store_timeout", policy.store_timeout)
            .not_zero("poll_interval", policy.poll_interval)
            .at_least_one("batch_size", policy.batch_size.into())
            .at_least_one("max_deliveries", policy.retry.max_deliveries_value().into())
            .finish()?;
        handlers.check_states()?;
        let mut jobs = source.jobs;
        if source.from_inventory {
            jobs.extend(jobs_from_inventory()?);
        }
        let mut missing = Vec::new();
        let jobs: Vec<ScheduledJob> = jobs
            .iter()
            .filter_map(|job| job.provide(&handlers.states, &mut missing))
            .collect();
        if !missing.is_empty() {
            return Err(RegistryError::MissingState(missing).into());
        }
        let unknown: Vec<String> = handlers
            .middleware
            .named()
            .filter(|name| !jobs.iter().any(|job| job.name() == *name))
            .map(str::to_owned)
            .collect();
        if !unknown.is_empty() {
            return Err(RegistryError::UnknownHandlers {
                names: unknown,
                known: jobs.iter().map(|job| job.name().to_owned()).collect(),
            }
            .into());
        }
        let mut by_name = HashMap::new();
        for job in jobs {
            if let Spec::Every(period) = job.spec() {
                if period.as_millis() == 0 {
                    return Err(BuildError::Unsupported(format!(
                        "scheduled job {:?} runs every {period:?}: the period must be at least \
                         1 ms (and is meant to be seconds or more)",
                        job.name()
                    )));
                }
            }
            if let Some(other) = by_name.insert(job.name().to_owned(), job) {
                return Err(BuildError::Unsupported(format!(
                    "two scheduled jobs are named {:?}: give one a name of its own",
                    other.name()
                )));
            }
        }
        let longest_run = crate::policy::longest_call(
            policy.handler_timeout,
            "dispatch_timeout",
            by_name
                .values()
                .map(|job: &ScheduledJob| (job.name(), job.own_timeout())),
        );
        let mut names: Vec<String> = by_name.keys().cloned().collect();
        names.sort();
        let health = source
            .health
            .unwrap_or_else(|| Probe::detached("scheduler"));
        let lease = claim_lease(&policy, "lease (SCHEDULER_LEASE_MS)", longest_run, &health)?;
        let slots: Vec<Slot> = names
            .iter()
            .map(|name| {
                let job = &by_name[name];
                let timeout = job.own_timeout().unwrap_or(policy.handler_timeout);
                let slot = Slot::job(
                    job.shared_name(),
                    job.runner(),
                    handlers.middleware.chain_for(name),
                    timeout,
                );
                slot.watch(&health);
                slot
            })
            .collect();
        let feed = ScheduleFeed {
            store: source.store,
            jobs: by_name,
            names,
            poll_interval: policy.poll_interval,
            batch_size: policy.batch_size,
            dispatch_timeout: policy.handler_timeout,
            lease,
            store_timeout: policy.store_timeout,
            catch_up_grace: source.catch_up_grace,
            release_messages: source.release_messages,
            synced: AtomicBool::new(false),
            pacing: Mutex::new(Pacing::default()),
        };
        let pace = Pace {
            poll_interval: policy.poll_interval,
            busy_delay: policy.min_cycle_delay,
            batch_size: policy.batch_size,
            shutdown_grace: policy.shutdown_grace,
            refill: Refill::WhenAnyEnds,
        };
        // The scheduler's own small payloads: no cap.
        let engine = Engine::new(policy.retry, usize::MAX, "scheduler");
        Ok(SchedulerWorker {
            worker: Worker::new(feed, slots, engine, pace, health),
        })
    }
}

impl WorkerBuilder<ScheduleSource> {
    /// A scheduler over `store`, with no jobs yet.
    pub fn new(store: Arc<dyn ScheduleStore>) -> SchedulerBuilder {
        WorkerBuilder::from_source(
            ScheduleSource {
                store,
                jobs: Vec::new(),
                from_inventory: false,
                catch_up_grace: Duration::from_secs(60),
                release_messages: true,
                health: None,
            },
            Policy::library(),
        )
    }

    /// The state and middleware of an [`App`](crate::App), shared with its handlers.
    pub(crate) fn with_shared(
        mut self,
        states: &States,
        middleware: Middlewares,
    ) -> SchedulerBuilder {
        self.handlers.states.extend(states);
        self.handlers.middleware.extend(middleware);
        self
    }

    /// Every `#[scheduled]` job of the program (plus those added with
    /// [`job`](SchedulerBuilder::job)).
    pub fn from_inventory(mut self) -> SchedulerBuilder {
        self.source.from_inventory = true;
        self
    }

    /// Adds a job.
    pub fn job(mut self, job: ScheduledJob) -> SchedulerBuilder {
        self.source.jobs.push(job);
        self
    }

    /// Wait between two cycles that found work (default 5 ms): a backlog drains quickly
    /// without a busy loop.
    pub fn min_cycle_delay(mut self, delay: Duration) -> SchedulerBuilder {
        self.policy.min_cycle_delay = delay;
        self
    }

    /// Deadline of one run of a job (default 30 s); a run slower than this is a failed attempt
    /// (`handler_timeout`) and follows the retry path. A job's own `timeout` takes precedence.
    pub fn dispatch_timeout(mut self, timeout: Duration) -> SchedulerBuilder {
        self.policy.handler_timeout = timeout;
        self
    }

    /// How late a fire time may be found and still run, for a `catch_up = "none"` schedule
    /// (default 60 s).
    pub fn catch_up_grace(mut self, grace: Duration) -> SchedulerBuilder {
        self.source.catch_up_grace = grace;
        self
    }

    /// Leaves delayed messages to another scheduler (by default each scheduler moves those
    /// due into the outbox).
    pub fn without_delayed_messages(mut self) -> SchedulerBuilder {
        self.source.release_messages = false;
        self
    }

    /// Reports readiness to `probe`: ready after each cycle that reached the store.
    pub fn health(mut self, probe: Probe) -> SchedulerBuilder {
        self.source.health = Some(probe);
        self
    }
}

/// Runs scheduled jobs and releases delayed messages, in a poll loop, until cancelled.
///
/// Each cycle: due delayed messages move into the outbox; each due schedule gets its
/// occurrence (one per schedule and fire time, however many replicas plan at once) and moves
/// on to its next fire time; then up to `batch_size` due occurrences are claimed under a lease
/// and run at once, each under its dispatch timeout, and settled under the claim (a worker
/// whose lease ran out cannot settle over the one that took over). A failed run retries with
/// backoff, up to `max_deliveries`, then goes to `dead_letters`.
pub struct SchedulerWorker {
    worker: Worker<ScheduleFeed>,
}

impl SchedulerWorker {
    /// A builder over `store`.
    pub fn builder(store: impl ScheduleStore) -> SchedulerBuilder {
        SchedulerBuilder::new(Arc::new(store))
    }

    /// A builder over a store shared with other parts of the program.
    pub fn builder_shared(store: Arc<dyn ScheduleStore>) -> SchedulerBuilder {
        SchedulerBuilder::new(store)
    }

    /// The jobs it runs, by name.
    pub fn job_names(&self) -> &[String] {
        &self.worker.feed().names
    }

    /// Runs until `cancel` fires, then lets the runs in flight end (jobs get the shutdown
    /// grace) and returns `Ok(())`. Store errors are logged and retried after
    /// `poll_interval`.
    ///
    /// Stopping has one hard deadline: the grace and 5 s to settle. A scheduler whose last
    /// writes cannot land by then stops anyway; its claims run again once their lease ends.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), StoreError> {
        self.worker.run(cancel).await
    }
}

impl fmt::Debug for SchedulerWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let feed = self.worker.feed();
        f.debug_struct("SchedulerWorker")
            .field("jobs", &feed.names)
            .field("lease", &feed.lease)
            .field("dispatch_timeout", &feed.dispatch_timeout)
            .finish_non_exhaustive()
    }
}

/// The scheduler as a feed ([`LeasedFeed`]): each pass acks the runs that succeeded, moves due
/// delayed messages into the outbox, plans due schedules and claims due occurrences, each on
/// its own pace.
struct ScheduleFeed {
    store: Arc<dyn ScheduleStore>,
    jobs: HashMap<String, ScheduledJob>,
    names: Vec<String>,
    poll_interval: Duration,
    batch_size: u32,
    dispatch_timeout: Duration,
    lease: Duration,
    store_timeout: Duration,
    catch_up_grace: Duration,
    release_messages: bool,
    /// Whether the schedules were written (the first pass does).
    synced: AtomicBool,
    pacing: Mutex<Pacing>,
}

impl LeasedFeed for ScheduleFeed {
    type Id = Uuid;
    const NAME: &'static str = "scheduler";

    /// The scheduler waits on its poll interval alone; what its jobs publish wakes the
    /// outbox's workers.
    async fn start(&self) -> Result<Started, StoreError> {
        let wake = crate::store::wake_signal(&*self.store).await;
        Ok(Started {
            wake: None,
            publisher: Arc::new(StorePublisher::new(self.store.clone(), wake)),
        })
    }

    async fn take(
        &self,
        acks: Vec<(Uuid, Uuid)>,
        room: u32,
    ) -> Result<Pass<(Uuid, Uuid)>, StoreError> {
        self.rows().ack(acks).await?;
        if !self.synced.load(Ordering::Relaxed) {
            self.sync().await?;
            self.synced.store(true, Ordering::Relaxed);
        }
        let (found, token, claimed) = self.cycle(room).await?;
        let arrivals = claimed
            .into_iter()
            .map(|occurrence| Arrival {
                claim: (token, occurrence.id),
                envelope: Arc::new(envelope_of(&occurrence)),
                recovered: occurrence.recovered,
                to: To::Named(occurrence.schedule),
                refused: None,
            })
            .collect();
        Ok(Pass { found, arrivals })
    }

    fn rows(&self) -> Leased<'_, Uuid> {
        Leased {
            claims: self.store.occurrences(),
            lease: self.lease,
            store_timeout: self.store_timeout,
        }
    }
}

impl ScheduleFeed {
    /// Writes each job's schedule, starting a new or changed one at its first fire time.
    async fn sync(&self) -> Result<(), StoreError> {
        let definitions: Vec<ScheduleDefinition> = self
            .names
            .iter()
            .map(|name| ScheduleDefinition {
                name: name.clone(),
                spec: self.jobs[name].spec().stored_text(),
            })
            .collect();
        let first = |name: &str, now| self.jobs[name].spec().next_after(now);
        self.rows()
            .within("sync", self.store.sync_schedules(&definitions, &first))
            .await
    }

    /// One cycle: releases due delayed messages, plans due schedules, claims up to `room`
    /// occurrences. Returns how much it found to do, the claim token and the claims.
    async fn cycle(&self, room: u32) -> Result<(usize, Uuid, Vec<ClaimedOccurrence>), StoreError> {
        let mut found = 0;
        let token = Uuid::now_v7();
        let pacing = |step: fn(&Pacing, Duration) -> bool| {
            step(&self.pacing.lock().expect("pacing"), self.poll_interval)
        };
        // Fire times and due times are only looked for once per poll interval (or again at
        // once while a full batch says there is more): a backlog of occurrences drains at the
        // pace of claims, not of these statements.
        if self.release_messages && pacing(Pacing::release_due) {
            let moved = self
                .rows()
                .within(
                    "release of due messages",
                    self.store.release_due_messages(self.batch_size),
                )
                .await?;
            if moved > 0 {
                tracing::debug!(moved, "delayed messages released to the outbox");
            }
            let more = moved >= u64::from(self.batch_size);
            self.pacing.lock().expect("pacing").released(more);
            found += usize::try_from(moved).unwrap_or(usize::MAX);
        }
        if self.names.is_empty() {
            return Ok((found, token, Vec::new()));
        }
        let planner = |name: &str, due, now| match self.jobs.get(name) {
            Some(job) => job
                .spec()
                .plan(job.catch_up_rule(), self.catch_up_grace, due, now),
            // Only the jobs of this worker are asked about.
            None => Plan {
                fire_at: None,
                next_fire_at: due,
            },
        };
        if pacing(Pacing::plan_due) {
            let written = self
                .rows()
                .within(
                    "plan",
                    self.store.plan(&self.names, self.batch_size, &planner),
                )
                .await?;
            // A full batch of due schedules: there may be more.
            let more = written >= u64::from(self.batch_size);
            self.pacing.lock().expect("pacing").planned(more);
        }
        if room == 0 {
            // Runs fill the batch (or one runs alone): plan and release, claim nothing.
            return Ok((found, token, Vec::new()));
        }
        let limit = room.min(self.batch_size);
        let claim = self
            .store
            .claim_occurrences(token, &self.names, limit, self.lease);
        let claimed = self.rows().within("claim", claim).await?;
        found += claimed.len();
        Ok((found, token, claimed))
    }
}

/// When a cycle last looked for due schedules and due delayed messages.
#[derive(Default)]
struct Pacing {
    last_plan: Option<std::time::Instant>,
    more_to_plan: bool,
    last_release: Option<std::time::Instant>,
    more_to_release: bool,
}

impl Pacing {
    fn plan_due(&self, interval: Duration) -> bool {
        self.more_to_plan || self.last_plan.is_none_or(|last| last.elapsed() >= interval)
    }

    fn planned(&mut self, more: bool) {
        self.last_plan = Some(std::time::Instant::now());
        self.more_to_plan = more;
    }

    fn release_due(&self, interval: Duration) -> bool {
        self.more_to_release
            || self
                .last_release
                .is_none_or(|last| last.elapsed() >= interval)
    }

    fn released(&mut self, more: bool) {
        self.last_release = Some(std::time::Instant::now());
        self.more_to_release = more;
    }
}

/// The message a job's context shows: the occurrence's id, the schedule and fire time.
fn envelope_of(occurrence: &ClaimedOccurrence) -> Envelope {
    super::job_envelope(
        occurrence.id,
        &occurrence.schedule,
        occurrence.fire_at,
        occurrence.attempts,
    )
}
