//! [`SchedulerWorker`]: plans, claims and runs the occurrences of scheduled jobs, and moves due
//! delayed messages into the outbox.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::delivery::{spawn_grace_timer, Engine, Policy, Slot, Target, World};
use crate::envelope::Envelope;
use crate::envelope::FIRE_TIME_HEADER;
use crate::health::Probe;
use crate::knobs::KnobChecks;
use crate::middleware::Middlewares;
use crate::outbox::StorePublisher;
use crate::publish::Publish;
use crate::registry::RegistryError;
use crate::schedule::{jobs_from_inventory, ScheduledJob, Spec};
use crate::state::States;
use crate::store::{
    ClaimedOccurrence, ClaimedRows, Plan, Row, ScheduleDefinition, ScheduleStore, StoreError,
    SCHEDULE_MESSAGE_TYPE,
};
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
        let slots = by_name
            .iter()
            .map(|(name, job)| {
                let timeout = job.own_timeout().unwrap_or(policy.handler_timeout);
                let slot = Slot::job(
                    job.shared_name(),
                    job.runner(),
                    handlers.middleware.chain_for(name),
                    timeout,
                );
                slot.watch(&health);
                (name.clone(), slot)
            })
            .collect();
        Ok(SchedulerWorker {
            shared: Arc::new(Shared {
                store: source.store,
                jobs: by_name,
                slots,
                names,
                // The scheduler's own small payloads: no cap.
                engine: Engine::new(policy.retry, usize::MAX, "scheduler"),
                poll_interval: policy.poll_interval,
                batch_size: policy.batch_size,
                min_cycle_delay: policy.min_cycle_delay,
                dispatch_timeout: policy.handler_timeout,
                lease,
                store_timeout: policy.store_timeout,
                catch_up_grace: source.catch_up_grace,
                shutdown_grace: policy.shutdown_grace,
                release_messages: source.release_messages,
                health,
            }),
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
    shared: Arc<Shared>,
}

struct Shared {
    store: Arc<dyn ScheduleStore>,
    jobs: HashMap<String, ScheduledJob>,
    /// Each job as the engine calls it.
    slots: HashMap<String, Slot>,
    names: Vec<String>,
    engine: Engine,
    poll_interval: Duration,
    batch_size: u32,
    min_cycle_delay: Duration,
    dispatch_timeout: Duration,
    lease: Duration,
    store_timeout: Duration,
    catch_up_grace: Duration,
    shutdown_grace: Duration,
    release_messages: bool,
    health: Probe,
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
        &self.shared.names
    }

    /// Runs until `cancel` fires, then lets the cycle in progress finish (jobs get the
    /// shutdown grace) and returns `Ok(())`. Store errors are logged and retried after
    /// `poll_interval`.
    ///
    /// Stopping has one hard deadline: the grace and 5 s to settle. A scheduler whose last
    /// writes cannot land by then stops anyway; its claims run again once their lease ends.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), StoreError> {
        let grace = self.shared.shutdown_grace;
        crate::delivery::stop_by_deadline("scheduler", &cancel, grace, self.serve(cancel.clone()))
            .await
    }

    async fn serve(self, cancel: CancellationToken) -> Result<(), StoreError> {
        let shared = &*self.shared;
        let interrupt = CancellationToken::new();
        let _grace = spawn_grace_timer(cancel.clone(), interrupt.clone(), shared.shutdown_grace);
        let wake = crate::store::wake_signal(&*shared.store).await;
        let publisher: Arc<dyn Publish> = Arc::new(StorePublisher::new(shared.store.clone(), wake));
        let mut synced = false;
        let mut pacing = Pacing::default();
        // Runs in flight, each in a task of its own (run and settle): a cycle never waits for
        // them, and they go on while the loop awaits the store.
        let mut running: JoinSet<Finished> = JoinSet::new();
        let mut finished: Vec<Finished> = Vec::new();
        let next_cycle = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(next_cycle);
        let mut cycle_now = true;
        let mut stopping = false;
        // The claim (token, occurrence) of a suspect running alone, and whether claims wait
        // for the runs in flight to end first so that it can.
        let mut isolating: Option<(Uuid, Uuid)> = None;
        let mut quieting = false;
        tracing::info!(jobs = shared.names.len(), "scheduler started");
        loop {
            if stopping && running.is_empty() {
                break;
            }
            if quieting && running.is_empty() {
                quieting = false;
            }
            let room = if isolating.is_some() || quieting {
                0
            } else {
                (shared.batch_size as usize).saturating_sub(running.len())
            };
            tokio::select! {
                biased;
                () = cancel.cancelled(), if !stopping => stopping = true,
                Some(done) = running.join_next(), if !running.is_empty() => {
                    finished.extend(joined(done));
                    // Every run that is done by now is settled with it, in one ack.
                    while let Some(Some(done)) = running.join_next().now_or_never() {
                        finished.extend(joined(done));
                    }
                    if finished
                        .iter()
                        .any(|(token, occurrence, _)| Some((*token, occurrence.id)) == isolating)
                    {
                        isolating = None;
                    }
                    shared.settle(&mut finished).await;
                    // Room for claims again: the next cycle need not wait.
                    cycle_now = true;
                }
                // A zero wait goes by the flag: a timer would still wait for the clock's next
                // tick (a millisecond).
                () = async { if !cycle_now { (&mut next_cycle).await } }, if !stopping => {
                    let cycle = async {
                        if !synced {
                            shared.sync().await?;
                            synced = true;
                        }
                        shared.cycle(&mut pacing, room).await
                    }
                    .await;
                    let wait = match cycle {
                        Ok((found, token, mut claimed)) => {
                            shared.health.pass();
                            if let Some(suspect) = claimed.iter().position(|o| o.recovered) {
                                // Its last claim was never settled: the run may have crashed
                                // the process. It runs alone: the rest of the batch goes back
                                // uncharged, and if other runs are still going, it goes back
                                // too until they end.
                                let suspect = claimed.swap_remove(suspect);
                                let mut back: Vec<Uuid> = claimed.iter().map(|o| o.id).collect();
                                claimed.clear();
                                if running.is_empty() {
                                    tracing::warn!(
                                        job = %suspect.schedule,
                                        fire_at = %suspect.fire_at,
                                        attempt = suspect.attempts,
                                        "an earlier run of this occurrence never settled (did it crash the process?): running it alone"
                                    );
                                    isolating = Some((token, suspect.id));
                                    claimed.push(suspect);
                                } else {
                                    back.push(suspect.id);
                                    quieting = true;
                                }
                                let release = shared.store.occurrences().release(token, &back);
                                if let Err(error) = shared.timed("release", release).await {
                                    tracing::warn!(%error, "could not give back occurrences; they come back after their lease");
                                }
                            }
                            for occurrence in claimed {
                                let shared = self.shared.clone();
                                let (cancel, interrupt, publisher) =
                                    (cancel.clone(), interrupt.clone(), publisher.clone());
                                let mut run: BoxFuture<'static, Finished> = Box::pin(async move {
                                    shared
                                        .run_one(token, occurrence, &cancel, &interrupt, &publisher)
                                        .await
                                });
                                // Polled once here: a job that does not wait finishes without a
                                // task (and is acked with the others of its batch); one that
                                // waits goes on in a task of its own, never dropped.
                                match futures_util::poll!(&mut run) {
                                    std::task::Poll::Ready(done) => finished.push(done),
                                    std::task::Poll::Pending => {
                                        running.spawn(run);
                                    }
                                }
                            }
                            if !finished.is_empty() {
                                shared.settle(&mut finished).await;
                            }
                            if found > 0 {
                                shared.min_cycle_delay
                            } else {
                                shared.poll_interval
                            }
                        }
                        Err(error) => {
                            shared
                                .health
                                .fail(format!("a scheduler cycle failed: {error}"));
                            tracing::warn!(%error, "scheduler cycle failed; retrying after the poll interval");
                            shared.poll_interval
                        }
                    };
                    cycle_now = wait.is_zero();
                    next_cycle
                        .as_mut()
                        .reset(tokio::time::Instant::now() + wait);
                }
            }
        }
        tracing::info!("scheduler stopped");
        Ok(())
    }
}

/// A run's task, joined: a panic outside the job (the job's own are caught) is logged, and
/// its claim comes back after its lease.
fn joined(done: Result<Finished, tokio::task::JoinError>) -> Option<Finished> {
    match done {
        Ok(finished) => Some(finished),
        Err(error) => {
            tracing::error!(%error, "a scheduled run's task failed; its occurrence comes back after its lease");
            None
        }
    }
}

/// A run that ended: its claim, and whether to ack it (`Ok(false)`: settled otherwise).
type Finished = (Uuid, ClaimedOccurrence, Result<bool, StoreError>);

impl fmt::Debug for SchedulerWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchedulerWorker")
            .field("jobs", &self.shared.names)
            .field("lease", &self.shared.lease)
            .field("dispatch_timeout", &self.shared.dispatch_timeout)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// `statement` with the scheduler's deadline ([`store_timeout`](SchedulerBuilder::store_timeout)).
    async fn timed<T>(
        &self,
        what: &'static str,
        statement: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        crate::store::within(what, self.store_timeout, statement).await
    }

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
        self.timed("sync", self.store.sync_schedules(&definitions, &first))
            .await
    }

    /// One cycle: releases due delayed messages, plans due schedules, claims up to `room`
    /// occurrences. Returns how much it found to do, the claim token and the claims.
    async fn cycle(
        &self,
        pacing: &mut Pacing,
        room: usize,
    ) -> Result<(usize, Uuid, Vec<ClaimedOccurrence>), StoreError> {
        let mut found = 0;
        let token = Uuid::now_v7();
        // Fire times and due times are only looked for once per poll interval (or again at
        // once while a full batch says there is more): a backlog of occurrences drains at the
        // pace of claims, not of these statements.
        if self.release_messages && pacing.release_due(self.poll_interval) {
            let moved = self
                .timed(
                    "release of due messages",
                    self.store.release_due_messages(self.batch_size),
                )
                .await?;
            if moved > 0 {
                tracing::debug!(moved, "delayed messages released to the outbox");
            }
            pacing.released(moved >= u64::from(self.batch_size));
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
        if pacing.plan_due(self.poll_interval) {
            let written = self
                .timed(
                    "plan",
                    self.store.plan(&self.names, self.batch_size, &planner),
                )
                .await?;
            // A full batch of due schedules: there may be more.
            pacing.planned(written >= u64::from(self.batch_size));
        }
        if room == 0 {
            // Runs fill the batch (or one runs alone): plan and release, claim nothing.
            return Ok((found, token, Vec::new()));
        }
        let limit = u32::try_from(room).unwrap_or(u32::MAX).min(self.batch_size);
        let claim = self
            .store
            .claim_occurrences(token, &self.names, limit, self.lease);
        let claimed = self.timed("claim", claim).await?;
        found += claimed.len();
        Ok((found, token, claimed))
    }

    /// Acks the runs in `finished` that succeeded, one statement per claim token; the others
    /// were settled when they ended. A store error is logged: those claims run again after
    /// their lease.
    async fn settle(&self, finished: &mut Vec<Finished>) {
        let mut by_token: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
        for (token, occurrence, result) in finished.drain(..) {
            match result {
                Ok(true) => by_token.entry(token).or_default().push(occurrence.id),
                Ok(false) => {}
                Err(error) => {
                    self.health
                        .fail(format!("settling a scheduled run failed: {error}"));
                    tracing::warn!(
                        job = %occurrence.schedule,
                        fire_at = %occurrence.fire_at,
                        %error,
                        "could not settle a scheduled run; it runs again after its lease"
                    );
                }
            }
        }
        for (token, ids) in by_token {
            let ack = self.store.occurrences().ack(token, &ids);
            match self.timed("ack", ack).await {
                Ok(done) if done < ids.len() as u64 => tracing::warn!(
                    finished = ids.len(),
                    settled = done,
                    lease = ?self.lease,
                    "some leases ended before their runs were settled: other workers took them over"
                ),
                Ok(_) => {}
                Err(error) => {
                    self.health
                        .fail(format!("acking scheduled runs failed: {error}"));
                    tracing::warn!(%error, runs = ids.len(), "could not ack scheduled runs; they run again after their lease");
                }
            }
        }
    }

    /// Runs one occurrence and settles it, except a success: `Ok(true)` means "ack it".
    async fn run_one(
        &self,
        token: Uuid,
        occurrence: ClaimedOccurrence,
        cancel: &CancellationToken,
        interrupt: &CancellationToken,
        publisher: &Arc<dyn Publish>,
    ) -> Finished {
        let result = self
            .run_claimed(token, &occurrence, cancel, interrupt, publisher)
            .await;
        (token, occurrence, result)
    }

    async fn run_claimed(
        &self,
        token: Uuid,
        occurrence: &ClaimedOccurrence,
        cancel: &CancellationToken,
        interrupt: &CancellationToken,
        publisher: &Arc<dyn Publish>,
    ) -> Result<bool, StoreError> {
        let Some(slot) = self.slots.get(&occurrence.schedule) else {
            // Claims only take this worker's schedules.
            return Ok(false);
        };
        let envelope = Arc::new(envelope_of(occurrence));
        let verdict = self
            .engine
            .deliver(Target::Slot(slot), &envelope, cancel, interrupt, publisher)
            .await;
        let world = ClaimedRows {
            claims: self.store.occurrences(),
            token,
            lease: self.lease,
            store_timeout: self.store_timeout,
        };
        match world.settle(occurrence.id, verdict).await? {
            Row::Ack => Ok(true),
            Row::Settled => Ok(false),
            Row::Lost => {
                tracing::warn!(
                    job = %occurrence.schedule,
                    fire_at = %occurrence.fire_at,
                    lease = ?self.lease,
                    "the lease ended before the run was settled: another worker took it over, and \
                     this outcome is dropped"
                );
                Ok(false)
            }
        }
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
    let fire_at = occurrence.fire_at.to_rfc3339();
    // Names are plain text; serde_json escapes whatever they hold.
    let payload = format!(
        "{{\"schedule\":{},\"fire_at\":\"{fire_at}\"}}",
        serde_json::Value::from(occurrence.schedule.as_str())
    );
    let mut envelope = Envelope::from_raw(SCHEDULE_MESSAGE_TYPE, payload.into_bytes());
    envelope.id = occurrence.id;
    envelope.attempt = occurrence.attempts;
    envelope.created_at = occurrence.fire_at;
    envelope
        .headers
        .insert(FIRE_TIME_HEADER.to_owned(), fire_at);
    envelope
}
