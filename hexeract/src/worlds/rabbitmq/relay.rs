//! [`RabbitMqRelay`]: moves outbox rows to the broker, deleting each only once the broker
//! confirmed it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::delivery::Policy;
use crate::envelope::Envelope;
use crate::health::Probe;
use crate::rabbitmq::publisher::Confirmed;
use crate::rabbitmq::{wire, BusError, RabbitMqConnection, RabbitMqPublisher};
use crate::reason::Reason;
use crate::store::{self, RelaySink, RelayStore, Unpublishable};

/// Relays the transactional outbox to RabbitMQ: takes a batch of rows (locked, oldest first),
/// publishes them to the exchange with confirms, and deletes them in the same transaction once
/// every confirm came back. A crash or a failed publish leaves the rows for the next pass, so a
/// message may be published twice, never lost. Several relays may share a store: each takes
/// rows the others have not locked.
///
/// A non-empty pass is followed at once by the next; an empty one waits for `poll_interval`,
/// or less when the store signals a new row (a publish in this process; on PostgreSQL, a commit
/// of `outbox::enqueue` anywhere). Like the bus worker it never reconnects: `run` returns
/// [`BusError::Connection`] when the broker connection is gone.
///
/// ```no_run
/// # async fn example(store: std::sync::Arc<dyn hexeract::store::RelayStore>) -> Result<(), hexeract::rabbitmq::BusError> {
/// use hexeract::rabbitmq::{RabbitMqRelay, RabbitMqConnection};
/// use hexeract::CancellationToken;
///
/// let connection = RabbitMqConnection::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// let relay = RabbitMqRelay::new(store, &connection).await?.batch_size(100);
/// relay.run(CancellationToken::new()).await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a relay does nothing until `.run(cancel).await`"]
pub struct RabbitMqRelay {
    store: Arc<dyn RelayStore>,
    publisher: RabbitMqPublisher,
    max_message_size: usize,
    unrouted: Arc<Unrouted>,
    batch_size: u32,
    poll_interval: Duration,
    store_timeout: Duration,
    connection: RabbitMqConnection,
    health: Probe,
}

impl RabbitMqRelay {
    /// A relay from `store` to the default exchange, publishing on a channel of `connection`;
    /// `batch_size` 10 and `poll_interval` 100 ms (the outbox worker's library defaults).
    pub async fn new(
        store: Arc<dyn RelayStore>,
        connection: &RabbitMqConnection,
    ) -> Result<RabbitMqRelay, BusError> {
        Ok(RabbitMqRelay {
            store,
            publisher: RabbitMqPublisher::new(connection).await?,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            unrouted: Arc::new(Unrouted::default()),
            batch_size: Policy::library().batch_size,
            poll_interval: Policy::library().poll_interval,
            store_timeout: Policy::library().store_timeout,
            connection: connection.clone(),
            health: Probe::detached("outbox relay"),
        })
    }

    /// Publishes to `exchange` instead of `hexeract`.
    pub fn exchange(mut self, exchange: impl Into<String>) -> RabbitMqRelay {
        self.publisher = self.publisher.exchange(exchange);
        self
    }

    /// The largest payload the broker takes, in bytes (default 128 MiB, RabbitMQ's own
    /// `max_message_size` default; `AMQP_MAX_MESSAGE_SIZE` for `run`). A client cannot read the
    /// broker's setting, and a larger publish makes the broker close the channel, on every pass:
    /// a row over it is dead-lettered as `payload_too_large` instead, and the rows behind it go
    /// on. Set it to the broker's `max_message_size` when that is lower.
    pub fn max_message_size(mut self, bytes: usize) -> RabbitMqRelay {
        self.max_message_size = bytes.max(1);
        self
    }

    /// Message types that may have no subscriber: when the broker has no queue for one of them
    /// it is deleted from the outbox and counted (`hexeract_relay_unrouted_total`), not
    /// dead-lettered. Every other message the broker returns as unroutable (no queue is bound
    /// for its type: no handler anywhere subscribes to it) ends in the dead letters as
    /// `unroutable`. `"*"` allows every type (`AMQP_ALLOW_UNROUTED` for `run`).
    ///
    /// ```no_run
    /// # async fn example(store: std::sync::Arc<dyn hexeract::store::RelayStore>, connection: hexeract::rabbitmq::RabbitMqConnection) -> Result<(), hexeract::rabbitmq::BusError> {
    /// use hexeract::rabbitmq::RabbitMqRelay;
    ///
    /// // An audit event some deployments consume and others do not.
    /// let relay = RabbitMqRelay::new(store, &connection).await?.allow_unrouted(["AuditRecorded"]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn allow_unrouted<T: Into<String>>(
        mut self,
        types: impl IntoIterator<Item = T>,
    ) -> RabbitMqRelay {
        self.unrouted = Arc::new(Unrouted::new(types));
        self
    }

    /// Rows per pass (default 10, at least 1).
    pub fn batch_size(mut self, batch_size: u32) -> RabbitMqRelay {
        self.batch_size = batch_size.max(1);
        self
    }

    /// Wait after a pass that found nothing (default 100 ms).
    pub fn poll_interval(mut self, interval: Duration) -> RabbitMqRelay {
        self.poll_interval = interval;
        self
    }

    /// How long the broker may take to confirm a publish (default 30 s); a pass waits no
    /// longer for its batch.
    pub fn confirm_timeout(mut self, timeout: Duration) -> RabbitMqRelay {
        self.publisher = self.publisher.confirm_timeout(timeout);
        self
    }

    /// How long the store may take over its part of a pass, beyond the broker's confirms
    /// (default 30 s). A pass that has not ended by then and the confirm timeout is reported as
    /// failed (readiness too) and left to finish in its own task, never cut in the middle of
    /// its transaction; no other pass starts while it runs, and `run` returns on cancel
    /// without waiting for it. On PostgreSQL the database ends such a pass's transaction once
    /// it has been idle for twice the confirm timeout, so that a pass whose network path went
    /// silent frees its rows.
    pub fn store_timeout(mut self, timeout: Duration) -> RabbitMqRelay {
        self.store_timeout = timeout;
        self
    }

    /// Reports readiness to `probe`: ready after each pass that worked, failing after one that
    /// did not (the store or the broker is down), held while the broker blocks the connection
    /// (`connection.blocked`: publishes wait).
    pub fn health(mut self, probe: Probe) -> RabbitMqRelay {
        self.health = probe;
        self
    }

    /// Relays until `cancel` fires (between passes: a pass holding its transaction always
    /// finishes), then returns `Ok(())`.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), BusError> {
        let connection = self.connection.clone();
        self.health.watch("connection.blocked", move || {
            connection.is_blocked().then(|| {
                "the broker blocked the connection (connection.blocked: a memory or disk \
                 alarm); publishes wait"
                    .to_owned()
            })
        });
        crate::metrics::relay_started("rabbitmq");
        let result = self.relay(cancel).await;
        if let Err(error) = &result {
            self.health.fail(error);
        }
        result
    }

    async fn relay(&self, cancel: CancellationToken) -> Result<(), BusError> {
        let wake = store::wake_signal(&*self.store).await;
        // The exchange may not exist yet (the bus worker declares the whole topology); a publish
        // to a missing exchange would close the channel.
        self.publisher.declare_exchange().await?;
        let sink: Arc<dyn RelaySink> = Arc::new(Sink {
            publisher: self.publisher.clone(),
            property_budget: wire::property_budget(
                self.connection.lapin().configuration().frame_max(),
            ),
            max_message_size: self.max_message_size,
            unrouted: self.unrouted.clone(),
        });
        self.health
            .expect_progress_within(crate::health::stuck_after(
                self.publisher.confirm_timeout_value(),
                self.store_timeout,
                self.poll_interval,
            ));
        let mut passes =
            store::Passes::new(self.store.clone(), self.batch_size, self.store_timeout);
        tracing::info!(batch_size = self.batch_size, "outbox relay started");
        while !cancel.is_cancelled() {
            let pass = passes.next(|| sink.clone()).await;
            match &pass {
                Ok(_) => self.health.pass(),
                Err(error) => self.health.fail(format!("a relay pass failed: {error}")),
            }
            match pass {
                Ok(0) => store::idle(&cancel, &wake, self.poll_interval).await,
                Ok(relayed) => tracing::trace!(relayed, "outbox rows relayed"),
                Err(error) => {
                    if !self.publisher.is_connected() {
                        return Err(BusError::Connection(format!("outbox relay: {error}")));
                    }
                    tracing::warn!(%error, "outbox relay pass failed; retrying after the poll interval");
                    store::idle(&cancel, &wake, self.poll_interval).await;
                }
            }
        }
        tracing::info!("outbox relay stopped");
        Ok(())
    }
}

/// RabbitMQ's default `max_message_size`: 128 MiB.
pub(crate) const DEFAULT_MAX_MESSAGE_SIZE: usize = 128 * 1024 * 1024;

/// The message types allowed to reach no queue.
#[derive(Debug, Default)]
struct Unrouted {
    any: bool,
    types: std::collections::HashSet<String>,
}

impl Unrouted {
    fn new<T: Into<String>>(types: impl IntoIterator<Item = T>) -> Unrouted {
        let types: std::collections::HashSet<String> = types.into_iter().map(Into::into).collect();
        Unrouted {
            any: types.contains("*"),
            types,
        }
    }

    fn allows(&self, message_type: &str) -> bool {
        self.any || self.types.contains(message_type)
    }
}

struct Sink {
    publisher: RabbitMqPublisher,
    /// The bytes of properties a message may take on this connection (`frame_max`).
    property_budget: usize,
    max_message_size: usize,
    unrouted: Arc<Unrouted>,
}

impl Sink {
    /// Why the broker would never take `envelope`, if it would not.
    fn refusal(&self, envelope: &Envelope) -> Option<Unpublishable> {
        if envelope.message_type.is_empty() || envelope.message_type.len() > 255 {
            return Some(Unpublishable::new(
                envelope.id,
                Reason::PAYLOAD_INVALID,
                format!(
                    "message type of {} bytes cannot be a routing key (1 to 255 bytes)",
                    envelope.message_type.len()
                ),
            ));
        }
        if !wire::fits_in_a_frame(envelope, self.property_budget) {
            return Some(Unpublishable::new(
                envelope.id,
                Reason::PAYLOAD_INVALID,
                format!(
                    "its headers do not fit in one AMQP frame ({} bytes for properties) even \
                     without those Hexeract may leave out: headers named x-hexeract-… are kept",
                    self.property_budget
                ),
            ));
        }
        if envelope.payload.len() > self.max_message_size {
            return Some(Unpublishable::new(
                envelope.id,
                Reason::PAYLOAD_TOO_LARGE,
                format!(
                    "payload of {} bytes is over the broker's limit of {} bytes \
                     (AMQP_MAX_MESSAGE_SIZE, the broker's max_message_size)",
                    envelope.payload.len(),
                    self.max_message_size
                ),
            ));
        }
        None
    }
}

impl RelaySink for Sink {
    fn publish<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<Vec<Unpublishable>, String>> {
        Box::pin(async move {
            // A row the broker will never take is dead-lettered rather than held back with
            // every row behind it.
            let mut never: Vec<Unpublishable> = Vec::new();
            let good: Vec<&Envelope> = envelopes
                .iter()
                .filter(|envelope| match self.refusal(envelope) {
                    Some(refused) => {
                        never.push(refused);
                        false
                    }
                    None => true,
                })
                .collect();
            let started = std::time::Instant::now();
            let span = crate::trace::relay("rabbitmq", &good);
            let budget = self.property_budget;
            // Mandatory: the broker returns a message no queue is bound for, rather than
            // confirming it into nowhere.
            let confirmed = self
                .publisher
                .publish_each(good.iter().copied(), true, |envelope| {
                    wire::relay_properties(envelope, budget)
                })
                .instrument(span)
                .await
                .map_err(|error| error.to_string())?;
            let mut routed = 0;
            for (envelope, confirmed) in good.iter().zip(confirmed) {
                match confirmed {
                    Confirmed::Routed => routed += 1,
                    Confirmed::Returned(_) if self.unrouted.allows(&envelope.message_type) => {
                        crate::metrics::relay_unrouted("rabbitmq");
                    }
                    Confirmed::Returned(detail) => never.push(Unpublishable::new(
                        envelope.id,
                        Reason::UNROUTABLE,
                        format!(
                            "{detail}: no handler subscribes to {:?} (a type meant to have \
                             none is allowed with AMQP_ALLOW_UNROUTED)",
                            envelope.message_type
                        ),
                    )),
                }
            }
            crate::metrics::relay_published("rabbitmq", routed, started.elapsed());
            Ok(never)
        })
    }

    fn publish_timeout(&self) -> Duration {
        self.publisher.confirm_timeout_value()
    }
}

impl fmt::Debug for RabbitMqRelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqRelay")
            .field("publisher", &self.publisher)
            .field("batch_size", &self.batch_size)
            .field("poll_interval", &self.poll_interval)
            .field("max_message_size", &self.max_message_size)
            .field("unrouted", &self.unrouted)
            .finish_non_exhaustive()
    }
}
