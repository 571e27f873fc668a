//! The claim model, shared by handler deliveries and scheduler occurrences: [`Claims`], how a
//! store settles rows claimed under a token, [`Leased`], which turns the engine's verdicts
//! into those row updates, each with a deadline, and [`LeasedFeed`], the feed of the outbox
//! worker and of the scheduler, settled by it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::delivery::{Verdict, World};
use crate::envelope::Envelope;
use crate::reason::Reason;
use crate::store::{DeliveryId, StoreError};
pub(crate) use crate::worker::feed::Row;
use crate::worker::feed::{Arrival, Feed, Pass, Started};

/// Rows claimed under a token, settled by the worker that holds it: handler deliveries (ids
/// [`DeliveryId`]: a `deliveries` row or a message claimed in place, [`DeliveryStore::deliveries`](crate::store::DeliveryStore::deliveries)) and scheduler occurrences (ids `Uuid`,
/// [`ScheduleStore::occurrences`](crate::store::ScheduleStore::occurrences)) follow this one claim model. Each method touches only rows
/// still claimed under `token`: a worker whose lease ended (another took the row over) changes
/// nothing.
pub trait Claims<Id>: Send + Sync {
    /// Deletes the rows whose calls succeeded. Returns how many it deleted.
    fn ack<'a>(&'a self, token: Uuid, ids: &'a [Id]) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Makes a row due again after `delay`, keeping `detail` as its last error. `false` when
    /// the claim was lost.
    fn retry<'a>(
        &'a self,
        token: Uuid,
        id: Id,
        delay: Duration,
        detail: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Moves a row to the dead letters, recording `calls` handler calls made. `false` when the
    /// claim was lost.
    fn dead_letter<'a>(
        &'a self,
        token: Uuid,
        id: Id,
        reason: &'a Reason,
        detail: &'a str,
        calls: u32,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Gives rows back without calling their handlers: due at once, their claimed attempt not
    /// counted. Returns how many it gave back.
    fn release<'a>(&'a self, token: Uuid, ids: &'a [Id]) -> BoxFuture<'a, Result<u64, StoreError>>;
}

/// Deliveries settled where they live: `deliveries` rows by `rows`, messages claimed in place in
/// the outbox by `in_place`. An ack or a release of a batch that holds both runs a statement
/// for each.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) struct Deliveries<R, P> {
    pub(crate) rows: R,
    pub(crate) in_place: P,
}

impl<R: Claims<i64>, P: Claims<Uuid>> Claims<DeliveryId> for Deliveries<R, P> {
    fn ack<'a>(
        &'a self,
        token: Uuid,
        ids: &'a [DeliveryId],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let (rows, outbox) = DeliveryId::split(ids);
            Ok(self.rows.ack(token, &rows).await? + self.in_place.ack(token, &outbox).await?)
        })
    }

    fn release<'a>(
        &'a self,
        token: Uuid,
        ids: &'a [DeliveryId],
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let (rows, outbox) = DeliveryId::split(ids);
            let rows = self.rows.release(token, &rows).await?;
            Ok(rows + self.in_place.release(token, &outbox).await?)
        })
    }

    fn retry<'a>(
        &'a self,
        token: Uuid,
        id: DeliveryId,
        delay: Duration,
        detail: &'a str,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        match id {
            DeliveryId::Row(id) => self.rows.retry(token, id, delay, detail),
            DeliveryId::Outbox(id) => self.in_place.retry(token, id, delay, detail),
        }
    }

    fn dead_letter<'a>(
        &'a self,
        token: Uuid,
        id: DeliveryId,
        reason: &'a Reason,
        detail: &'a str,
        calls: u32,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        match id {
            DeliveryId::Row(id) => self.rows.dead_letter(token, id, reason, detail, calls),
            DeliveryId::Outbox(id) => self.in_place.dead_letter(token, id, reason, detail, calls),
        }
    }
}

/// Runs one of a worker's own statements with a deadline: a statement whose network path went
/// silent (PostgreSQL has no heartbeat) fails the cycle after `after` instead of holding the
/// worker for good. A statement given up on inside a short transaction (SQLite's dead letter,
/// the scheduler's plan) leaves nothing open: the transaction began in a task of its own
/// (`store::begin`, against sqlx #4393) and is rolled back where it is dropped. A relay pass,
/// whose transaction waits for the broker, is never cut: see `store::Passes`.
pub(crate) async fn within<T>(
    what: &'static str,
    after: Duration,
    statement: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(after, statement)
        .await
        .map_err(|_| StoreError::Timeout { what, after })?
}

/// The rows of a kind a worker claims under a lease (handler deliveries, scheduler
/// occurrences), as its feed settles them: each claim is a token and a row, each statement has
/// a deadline.
pub(crate) struct Leased<'a, Id> {
    /// The store's rows of this kind.
    pub(crate) claims: &'a dyn Claims<Id>,
    /// How long a claim lasts: an abandoned call keeps its row that long, since it may still
    /// be running.
    pub(crate) lease: Duration,
    /// The deadline of each statement.
    pub(crate) store_timeout: Duration,
}

impl<Id: Copy + Send + Sync> World for Leased<'_, Id> {
    type Delivery = (Uuid, Id);
    type Settled = Result<Row, StoreError>;

    async fn settle(&self, (token, id): (Uuid, Id), verdict: Verdict) -> Self::Settled {
        let (claims, after) = (self.claims, self.store_timeout);
        let written = match verdict {
            Verdict::Ack => return Ok(Row::Ack),
            Verdict::Retry {
                delay,
                reason,
                detail,
            } => {
                let last_error = format!("{}: {detail}", reason.retry_cause());
                within("retry", after, claims.retry(token, id, delay, &last_error)).await?
            }
            Verdict::DeadLetter {
                reason,
                detail,
                calls,
            } => {
                let statement = claims.dead_letter(token, id, &reason, &detail, calls);
                within("dead letter", after, statement).await?
            }
            // The call may still be running: due again only once the lease would have ended,
            // so that no other worker runs it meanwhile, its attempt counted. Settled like a
            // retry, not left claimed: this worker knows why it stopped, so the row is not
            // suspected of crashing a process (which would make it run alone).
            Verdict::Abandoned => {
                let last_error = "the call was still running when the worker stopped \
                                  (shutdown grace exceeded)";
                let statement = claims.retry(token, id, self.lease, last_error);
                within("retry", after, statement).await?
            }
            Verdict::Release => within("release", after, claims.release(token, &[id])).await? == 1,
        };
        Ok(if written { Row::Settled } else { Row::Lost })
    }
}

impl<Id: Copy + Send + Sync> Leased<'_, Id> {
    /// Runs one of the worker's own statements (a take, a plan) with its deadline.
    pub(crate) async fn within<T>(
        &self,
        what: &'static str,
        statement: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        within(what, self.store_timeout, statement).await
    }

    /// Deletes the rows of `acks`, one statement per claim token. A token whose statement
    /// fails does not keep the others from theirs; the first error is returned.
    pub(crate) async fn ack(&self, acks: Vec<(Uuid, Id)>) -> Result<(), StoreError> {
        let mut failed = None;
        for (token, ids) in by_token(acks) {
            let statement = self.claims.ack(token, &ids);
            match within("ack", self.store_timeout, statement).await {
                Ok(landed) => warn_unless_all_acked(landed, ids.len()),
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Gives the rows of `arrivals` back uncalled, one statement per claim token.
    pub(crate) async fn hand_back(
        &self,
        arrivals: Vec<Arrival<(Uuid, Id)>>,
    ) -> Result<(), StoreError> {
        let claims = arrivals.into_iter().map(|arrival| arrival.claim).collect();
        let mut failed = None;
        for (token, ids) in by_token(claims) {
            let statement = self.claims.release(token, &ids);
            if let Err(error) = within("release", self.store_timeout, statement).await {
                failed = failed.or(Some(error));
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// A [`Feed`] of rows claimed under a lease: the outbox worker's and the scheduler's. Each says
/// how it starts and what a pass takes; settling, giving back and acking are [`Leased`]'s,
/// written once for both.
pub(crate) trait LeasedFeed: Send + Sync + 'static {
    /// The id of a row of this kind.
    type Id: Copy + Send + Sync + 'static;

    /// What log lines and readiness call the worker.
    const NAME: &'static str;

    /// See [`Feed::start`].
    fn start(&self) -> impl Future<Output = Result<Started, StoreError>> + Send;

    /// Writes `acks` (or leaves them to ride with the take), does the feed's own work, and
    /// claims up to `room` rows under a fresh token.
    fn take(
        &self,
        acks: Vec<(Uuid, Self::Id)>,
        room: u32,
    ) -> impl Future<Output = Result<Pass<(Uuid, Self::Id)>, StoreError>> + Send;

    /// The rows it claims.
    fn rows(&self) -> Leased<'_, Self::Id>;
}

impl<T: LeasedFeed> Feed for T {
    type Claim = (Uuid, T::Id);
    type Error = StoreError;
    const NAME: &'static str = T::NAME;

    fn start(&self) -> impl Future<Output = Result<Started, StoreError>> + Send {
        LeasedFeed::start(self)
    }

    fn pass(
        &self,
        acks: Vec<(Uuid, T::Id)>,
        room: u32,
        _stop: &CancellationToken,
    ) -> impl Future<Output = Result<Pass<(Uuid, T::Id)>, StoreError>> + Send {
        self.take(acks, room)
    }

    async fn settle(
        &self,
        claim: &(Uuid, T::Id),
        _handler: Option<&str>,
        _envelope: Arc<Envelope>,
        verdict: Verdict,
        _stop: &CancellationToken,
    ) -> Result<Row, StoreError> {
        self.rows().settle(*claim, verdict).await
    }

    async fn hand_back(&self, arrivals: Vec<Arrival<(Uuid, T::Id)>>) -> Result<(), StoreError> {
        self.rows().hand_back(arrivals).await
    }

    async fn close(&self, acks: Vec<(Uuid, T::Id)>) -> Result<(), StoreError> {
        self.rows().ack(acks).await
    }
}

/// Claims (a token and a row each) grouped by token, the largest group first: one statement
/// settles each group.
pub(crate) fn by_token<Id>(claims: Vec<(Uuid, Id)>) -> Vec<(Uuid, Vec<Id>)> {
    let mut groups: Vec<(Uuid, Vec<Id>)> = Vec::new();
    for (token, id) in claims {
        match groups.iter_mut().find(|(group, _)| *group == token) {
            Some((_, ids)) => ids.push(id),
            None => groups.push((token, vec![id])),
        }
    }
    groups.sort_by_key(|(_, ids)| std::cmp::Reverse(ids.len()));
    groups
}

/// Says when fewer acks landed than were written.
pub(crate) fn warn_unless_all_acked(landed: u64, expected: usize) {
    if landed != expected as u64 {
        tracing::warn!(
            acked = landed,
            expected,
            "some acked rows were no longer ours (their lease ended and another worker took \
             them over): they will run again"
        );
    }
}
