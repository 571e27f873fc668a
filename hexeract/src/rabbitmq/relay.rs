//! [`OutboxRelay`]: moves outbox rows to the broker, deleting each only once the broker
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
use crate::rabbitmq::{BusError, RabbitMqConnection, RabbitMqPublisher};
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
/// use hexeract::rabbitmq::{OutboxRelay, RabbitMqConnection};
/// use hexeract::CancellationToken;
///
/// let connection = RabbitMqConnection::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// let relay = OutboxRelay::new(store, &connection).await?.batch_size(100);
/// relay.run(CancellationToken::new()).await?;
/// # Ok(())
/// # }
/// ```
pub struct OutboxRelay {
    store: Arc<dyn RelayStore>,
    publisher: RabbitMqPublisher,
    batch_size: u32,
    poll_interval: Duration,
    store_timeout: Duration,
    connection: RabbitMqConnection,
    health: Probe,
}

impl OutboxRelay {
    /// A relay from `store` to the default exchange, publishing on a channel of `connection`;
    /// `batch_size` 10 and `poll_interval` 100 ms (the outbox worker's library defaults).
    pub async fn new(
        store: Arc<dyn RelayStore>,
        connection: &RabbitMqConnection,
    ) -> Result<OutboxRelay, BusError> {
        Ok(OutboxRelay {
            store,
            publisher: RabbitMqPublisher::new(connection).await?,
            batch_size: Policy::library().batch_size,
            poll_interval: Policy::library().poll_interval,
            store_timeout: Policy::library().store_timeout,
            connection: connection.clone(),
            health: Probe::detached("outbox relay"),
        })
    }

    /// Publishes to `exchange` instead of `hexeract`.
    pub fn exchange(mut self, exchange: impl Into<String>) -> OutboxRelay {
        self.publisher = self.publisher.exchange(exchange);
        self
    }

    /// Rows per pass (default 10, at least 1).
    pub fn batch_size(mut self, batch_size: u32) -> OutboxRelay {
        self.batch_size = batch_size.max(1);
        self
    }

    /// Wait after a pass that found nothing (default 100 ms).
    pub fn poll_interval(mut self, interval: Duration) -> OutboxRelay {
        self.poll_interval = interval;
        self
    }

    /// How long the broker may take to confirm a publish (default 30 s); a pass waits no
    /// longer for its batch.
    pub fn confirm_timeout(mut self, timeout: Duration) -> OutboxRelay {
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
    pub fn store_timeout(mut self, timeout: Duration) -> OutboxRelay {
        self.store_timeout = timeout;
        self
    }

    /// Reports readiness to `probe`: ready after each pass that worked, failing after one that
    /// did not (the store or the broker is down), held while the broker blocks the connection
    /// (`connection.blocked`: publishes wait).
    pub fn health(mut self, probe: Probe) -> OutboxRelay {
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
        let publisher = Arc::new(self.publisher.clone());
        let mut passes =
            store::Passes::new(self.store.clone(), self.batch_size, self.store_timeout);
        tracing::info!(batch_size = self.batch_size, "outbox relay started");
        while !cancel.is_cancelled() {
            let pass = passes
                .next(|| Arc::new(Sink(publisher.clone())) as Arc<dyn RelaySink>)
                .await;
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

struct Sink(Arc<RabbitMqPublisher>);

impl RelaySink for Sink {
    fn publish<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<Vec<Unpublishable>, String>> {
        Box::pin(async move {
            // A type that cannot be a routing key never will be: dead-letter it rather than
            // hold back every row behind it.
            let (good, bad): (Vec<&Envelope>, Vec<&Envelope>) =
                envelopes.iter().partition(|envelope| {
                    !envelope.message_type.is_empty() && envelope.message_type.len() <= 255
                });
            let started = std::time::Instant::now();
            let published = good.len();
            let span = crate::trace::relay("rabbitmq", &good);
            if bad.is_empty() {
                self.0.publish_all(envelopes).instrument(span).await
            } else {
                let good: Vec<Envelope> = good.into_iter().cloned().collect();
                self.0.publish_all(&good).instrument(span).await
            }
            .map_err(|error| error.to_string())?;
            crate::metrics::relay_published("rabbitmq", published, started.elapsed());
            Ok(bad
                .into_iter()
                .map(|envelope| Unpublishable {
                    id: envelope.id,
                    detail: format!(
                        "message type of {} bytes cannot be a routing key (1 to 255 bytes)",
                        envelope.message_type.len()
                    ),
                })
                .collect())
        })
    }

    fn publish_timeout(&self) -> Duration {
        self.0.confirm_timeout_value()
    }
}

impl fmt::Debug for OutboxRelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxRelay")
            .field("publisher", &self.publisher)
            .field("batch_size", &self.batch_size)
            .field("poll_interval", &self.poll_interval)
            .finish_non_exhaustive()
    }
}
