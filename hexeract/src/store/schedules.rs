//! [`ScheduleStore`]: schedules, their occurrences under claims, and delayed messages, in the
//! same database as the outbox.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use uuid::Uuid;

use crate::envelope::Envelope;
use crate::store::{Claims, DeliveryStore, StoreError};

/// The message type of a scheduled job's occurrence where it shows as a message: in its
/// context and in `dead_letters`.
pub const SCHEDULE_MESSAGE_TYPE: &str = "hexeract.schedule";

/// A schedule the worker runs, as the store is told of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleDefinition {
    /// The schedule's name, unique in the program.
    pub name: String,
    /// What decides its fire times, as text (`cron:<expression>@<zone>`, `every:<ms>`): a row
    /// whose text differs was written by another version of the program, and starts over.
    pub spec: String,
}

/// What a planner decides for a schedule found due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The fire time to run now (an occurrence is written for it), or `None` to skip.
    pub fire_at: Option<DateTime<Utc>>,
    /// The schedule's next fire time.
    pub next_fire_at: DateTime<Utc>,
}

/// Decides, for a schedule `name` whose next fire time `due` is not after `now` (the
/// database's clock), which fire time runs and what comes next.
pub type Planner<'f> = dyn Fn(&str, DateTime<Utc>, DateTime<Utc>) -> Plan + Send + Sync + 'f;

/// Gives the first fire time of a schedule `name` the store did not know (or knew with
/// another spec), after `now` (the database's clock).
pub type FirstFire<'f> = dyn Fn(&str, DateTime<Utc>) -> DateTime<Utc> + Send + Sync + 'f;

/// An occurrence claimed by a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedOccurrence {
    /// Derived from the schedule's name and the fire time: the same on every replica and every
    /// attempt (what `ctx.message_id()` returns).
    pub id: Uuid,
    /// The schedule's name.
    pub schedule: String,
    /// The fire time it stands for.
    pub fire_at: DateTime<Utc>,
    /// Claims so far, this one included.
    pub attempts: u32,
    /// Claimed while an earlier claim of it was never settled: its last run may have crashed
    /// its worker, so it runs alone.
    pub recovered: bool,
}

/// When a delayed message is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// At this instant.
    At(DateTime<Utc>),
    /// This long after now, on the database's clock.
    After(Duration),
}

/// The id of the occurrence of `schedule` at `fire_at`: a UUID v5, so every replica and every
/// attempt agree.
pub fn occurrence_id(schedule: &str, fire_at: DateTime<Utc>) -> Uuid {
    const NAMESPACE: Uuid = Uuid::from_u128(0x6865_7865_7261_6374_2e73_6368_6564_756c);
    let name = format!("{schedule}\u{0}{}", fire_at.timestamp_millis());
    Uuid::new_v5(&NAMESPACE, name.as_bytes())
}

/// Where the scheduler keeps its state: the same database (and namespace) as the outbox, so a
/// delayed message moves into the outbox in one statement and a failed job's dead letter sits
/// with the others.
///
/// The claim model is the outbox's: a claim counts the attempt and moves the occurrence's due
/// time to the end of the lease, on the database's clock (SQLite: the process's clock), under
/// a fresh token; settling checks the token, so a worker whose lease ran out cannot settle over
/// the one that took the occurrence over.
pub trait ScheduleStore: DeliveryStore {
    /// Makes sure each schedule has its row: a new one (or one whose spec changed) starts at
    /// `first(name, now)`. Schedules the store knows and `schedules` does not name are left as
    /// they are (another version of the program may run them).
    fn sync_schedules<'a>(
        &'a self,
        schedules: &'a [ScheduleDefinition],
        first: &'a FirstFire<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// For up to `limit` of the schedules named in `names` that are due, in one transaction:
    /// asks `planner`, writes the occurrence it chose (once per schedule and fire time, however
    /// many workers plan at once) and moves the schedule to its next fire time. Returns how
    /// many occurrences it wrote.
    fn plan<'a>(
        &'a self,
        names: &'a [String],
        limit: u32,
        planner: &'a Planner<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Claims up to `limit` due occurrences of the schedules named in `names`, oldest due
    /// first, under `token` for `lease`.
    fn claim_occurrences<'a>(
        &'a self,
        token: Uuid,
        names: &'a [String],
        limit: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Vec<ClaimedOccurrence>, StoreError>>;

    /// The claimed occurrences, to settle under their claim's token. A dead letter of an
    /// occurrence has message type [`SCHEDULE_MESSAGE_TYPE`], the schedule's name as its
    /// handler and `{"schedule": …, "fire_at": …}` as its payload.
    fn occurrences(&self) -> &dyn Claims<Uuid>;

    /// Runs a dead-lettered job run again: the dead letter `id` (message type
    /// [`SCHEDULE_MESSAGE_TYPE`]) becomes an occurrence of its schedule, due now, attempts
    /// from 1, and leaves the dead letters in the same transaction. It keeps its id and fire
    /// time, so the run sees the `ctx.message_id()` and `ctx.scheduled_for()` of the run that
    /// failed. A fire time that was planned once is never planned again (a schedule only moves
    /// forward), so this cannot meet an occurrence the planner writes; should that fire time
    /// be waiting anyway, it runs once. `false` when no dead letter of a job run has this id.
    fn replay_occurrence(&self, id: Uuid) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// Keeps `envelopes` until `due`, then [`release_due_messages`] puts them in the outbox. A
    /// message whose id is already waiting is not added twice.
    ///
    /// [`release_due_messages`]: ScheduleStore::release_due_messages
    fn schedule_messages(
        &self,
        envelopes: Vec<Envelope>,
        due: Due,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Moves up to `limit` delayed messages that are due into the outbox, in one statement,
    /// and wakes the outbox's consumers; returns how many it moved.
    fn release_due_messages(&self, limit: u32) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Occurrences waiting (due or not, claimed or not) and delayed messages not yet due: what
    /// the scheduler still owes.
    fn schedule_backlog(&self) -> BoxFuture<'_, Result<u64, StoreError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_occurrence_id_depends_on_the_schedule_and_the_fire_time_only() {
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        assert_eq!(occurrence_id("carts", at), occurrence_id("carts", at));
        assert_ne!(occurrence_id("carts", at), occurrence_id("orders", at));
        assert_ne!(
            occurrence_id("carts", at),
            occurrence_id("carts", at + chrono::Duration::seconds(1))
        );
    }
}
