//! Relaying the outbox to a broker: the capability a store offers a broker relay
//! ([`RelayStore`]), and what it hands the rows to ([`RelaySink`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::dead_letter::DeadLetter;
use crate::envelope::Envelope;
use crate::reason::Reason;
use crate::store::{DeliveryStore, StoreError};

/// A store whose outbox a broker relay reads: used instead of
/// [`DeliveryStore::expand`](crate::store::DeliveryStore::expand) when a broker does the
/// fan-out.
pub trait RelayStore: DeliveryStore {
    /// Relays up to `limit` outbox rows, oldest first, to a broker: hands them to `sink` and
    /// deletes them once it returned `Ok` (moving those it could never publish to the dead
    /// letters as `payload_invalid`), in one transaction that keeps them locked meanwhile,
    /// so that other relays skip them and a crash or a failed publish leaves them for the next
    /// pass (a row may then be published twice: at least once). Returns how many it relayed.
    fn relay<'a>(
        &'a self,
        limit: u32,
        sink: &'a dyn RelaySink,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;
}

/// Where [`RelayStore::relay`] sends outbox rows: a broker publish that returns `Ok` only
/// once the broker confirmed every envelope it took.
pub trait RelaySink: Send + Sync {
    /// Publishes `envelopes`, in order, and waits for the broker's confirms. Returns the ones
    /// the broker will not take (a message type that cannot be a routing key, a message over
    /// the broker's size limit, one the broker could route to no queue), with why: the store
    /// dead-letters those instead of trying them again forever. `Err` when the publish failed
    /// and may succeed later: every row stays.
    fn publish<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<Vec<Unpublishable>, String>>;

    /// Whether the order of rows must be kept across relays (Kafka keeps each aggregate's
    /// messages in order; RabbitMQ keeps none). When `true`, the passes of all relays of such
    /// sinks on one store never overlap: each takes the oldest rows left by the one before, so
    /// no second relay can publish a later row of an aggregate while an earlier one is still
    /// in flight. A pass that finds another relay's pass running relays nothing.
    fn exclusive(&self) -> bool {
        false
    }

    /// The longest one publish waits for the broker (its confirm or acknowledgement timeout),
    /// 30 s unless the sink says otherwise. A pass holds its transaction idle while it waits;
    /// on PostgreSQL the database ends a pass's transaction left idle for twice this, so that
    /// a relay whose client vanished mid-pass (a network path gone silent) frees the rows it
    /// locked.
    fn publish_timeout(&self) -> Duration {
        Duration::from_secs(30)
    }
}

/// An outbox row the broker will not take, and why: the relay dead-letters it (in the pass's
/// transaction, as the rows it published are deleted) instead of trying it again forever.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpublishable {
    /// The message's id.
    pub id: Uuid,
    /// The dead letter's reason: [`Reason::PAYLOAD_INVALID`] for a message type that cannot be
    /// a routing key, [`Reason::PAYLOAD_TOO_LARGE`] for a message over the broker's limit,
    /// [`Reason::UNROUTABLE`] for one the broker had no queue for.
    pub reason: Reason,
    /// What is wrong with it.
    pub detail: String,
}

impl Unpublishable {
    /// `id` refused for `reason`, with `detail`.
    ///
    /// ```
    /// use hexeract::store::Unpublishable;
    /// use hexeract::Reason;
    ///
    /// let refused = Unpublishable::new(uuid::Uuid::nil(), Reason::UNROUTABLE, "no queue is bound");
    /// assert_eq!(refused.reason, Reason::UNROUTABLE);
    /// ```
    pub fn new(id: Uuid, reason: Reason, detail: impl Into<String>) -> Unpublishable {
        Unpublishable {
            id,
            reason,
            detail: detail.into(),
        }
    }
}

/// The dead letters of the outbox rows a relay could never publish (no handler, no call made):
/// what both stores' `relay` records.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn unpublishable_letters(
    envelopes: &[Envelope],
    unpublishable: &[Unpublishable],
) -> Vec<DeadLetter> {
    unpublishable
        .iter()
        .filter_map(|rejected| {
            let envelope = envelopes
                .iter()
                .find(|envelope| envelope.id == rejected.id)?;
            tracing::error!(
                message_id = %envelope.id,
                message_type = %envelope.message_type,
                reason = %rejected.reason,
                detail = %rejected.detail,
                "outbox row not published; dead-lettered"
            );
            crate::metrics::dead_lettered_by_relay(&rejected.reason);
            Some(DeadLetter::new(
                envelope.clone(),
                None,
                rejected.reason.clone(),
                &rejected.detail,
            ))
        })
        .collect()
}

/// The rows of a relay pass split into the messages to publish and the dead letters of those
/// that could not be read (rows Hexeract did not write): one such row is dead-lettered alone, as
/// [`Reason::MESSAGE_UNREADABLE`], and the rows behind it are published.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn readable(taken: Vec<(Envelope, Option<String>)>) -> (Vec<Envelope>, Vec<DeadLetter>) {
    let mut envelopes = Vec::with_capacity(taken.len());
    let mut letters = Vec::new();
    for (envelope, unreadable) in taken {
        match unreadable {
            None => envelopes.push(envelope),
            Some(detail) => {
                tracing::error!(message_id = %envelope.id, %detail, "outbox row cannot be read; dead-lettered");
                crate::metrics::dead_lettered_by_relay(&Reason::MESSAGE_UNREADABLE);
                letters.push(DeadLetter::new(
                    envelope,
                    None,
                    Reason::MESSAGE_UNREADABLE,
                    &detail,
                ));
            }
        }
    }
    (envelopes, letters)
}

/// A relay's passes, each with a deadline that never cuts one in half: a pass holds a
/// transaction across the broker's confirms, and a future dropped in the middle of one could
/// leave its connection in it (sqlx #4393 is one way). So each pass runs in a task of its own;
/// one that has not ended by `store_timeout` plus the sink's
/// [`publish_timeout`](RelaySink::publish_timeout) is reported as a
/// [`StoreError::Timeout`] and left to finish on its own, and no other pass starts while it
/// runs (the next call waits for it again). Its rows are published and deleted, or stay for a
/// later pass, as with any pass; a stopped relay leaves it to end by itself.
#[cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]
pub(crate) struct Passes {
    store: Arc<dyn RelayStore>,
    limit: u32,
    store_timeout: Duration,
    /// A pass given up on that has not ended yet, with its deadline.
    running: Option<(JoinHandle<Result<u64, StoreError>>, Duration)>,
}

#[cfg_attr(not(any(feature = "rabbitmq", feature = "kafka")), allow(dead_code))]
impl Passes {
    pub(crate) fn new(store: Arc<dyn RelayStore>, limit: u32, store_timeout: Duration) -> Passes {
        Passes {
            store,
            limit,
            store_timeout,
            running: None,
        }
    }

    /// Relays one pass to the sink `sink` makes (only called when a new pass starts), or waits
    /// again for the one still running.
    pub(crate) async fn next(
        &mut self,
        sink: impl FnOnce() -> Arc<dyn RelaySink>,
    ) -> Result<u64, StoreError> {
        let (mut pass, after) = match self.running.take() {
            Some(running) => running,
            None => {
                let (store, limit, sink) = (self.store.clone(), self.limit, sink());
                let after = self.store_timeout.saturating_add(sink.publish_timeout());
                let pass = tokio::spawn(async move { store.relay(limit, &*sink).await });
                (pass, after)
            }
        };
        match tokio::time::timeout(after, &mut pass).await {
            Ok(Ok(relayed)) => relayed,
            Ok(Err(error)) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // The runtime is shutting down.
            Ok(Err(error)) => Err(StoreError::Relay(error.to_string())),
            Err(_) => {
                self.running = Some((pass, after));
                Err(StoreError::Timeout {
                    what: "relay pass",
                    after,
                })
            }
        }
    }
}
