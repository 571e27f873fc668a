//! [`RabbitMqTransport`]: direct publishing that rides out a broker blip.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::envelope::Envelope;
use crate::publish::{Publish, PublishError};
use crate::rabbitmq::{BusError, RabbitMqConnection, RabbitMqPublisher, DEFAULT_EXCHANGE};

/// Publishes straight to the broker, with confirms, and recovers from a lost connection. It
/// publishes on a connection with lapin's automatic recovery on
/// ([`RabbitMqConnection::connect_recovering`]): lapin connects again and replays the channel's
/// confirm mode and the exchange. A publish that fails because the connection or channel is
/// gone waits for that recovery (up to `reconnect_timeout`) and is retried once; when lapin
/// cannot recover (it gave up, or the broker closed only the channel) the transport opens a
/// fresh connection itself, with backoff, within the same timeout. A broker that stays
/// unreachable surfaces as [`BusError::Connection`]; one that refuses the message as
/// [`BusError::NotConfirmed`] or [`BusError::Transport`].
///
/// This survives a broker blip, not a crash of this process: when a message must not be lost
/// with the process, write it to the outbox in your transaction
/// ([`outbox::enqueue`](crate::outbox::enqueue)) and let the relay publish it.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use hexeract::rabbitmq::RabbitMqTransport;
/// use hexeract::{Envelope, Message};
///
/// #[derive(serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "PriceChanged")]
/// struct PriceChanged { sku: String, cents: i64 }
///
/// let transport = RabbitMqTransport::connect("amqp://guest:guest@127.0.0.1:5672/%2f").await?;
/// let envelope = Envelope::new(&PriceChanged { sku: "SKU-1".into(), cents: 990 })?;
/// transport.publish(&envelope).await?;
/// // Fails when no queue is bound for the type (the broker returns the message):
/// transport.publish_mandatory(&envelope).await?;
/// # Ok(())
/// # }
/// ```
pub struct RabbitMqTransport {
    connection: Mutex<RabbitMqConnection>,
    publisher: Mutex<Arc<RabbitMqPublisher>>,
    exchange: String,
    reconnect_timeout: Duration,
    reconnects: AtomicU64,
    recovered_by_lapin: AtomicU64,
}

impl RabbitMqTransport {
    /// Connects to `url` (connection name `hexeract-publisher`) and publishes to `hexeract`.
    pub async fn connect(url: &str) -> Result<RabbitMqTransport, BusError> {
        RabbitMqTransport::connect_named(url, "hexeract-publisher", DEFAULT_EXCHANGE).await
    }

    /// Connects to `url` with the connection name `name` and publishes to `exchange` (declared
    /// if missing: durable, topic).
    pub async fn connect_named(
        url: &str,
        name: &str,
        exchange: &str,
    ) -> Result<RabbitMqTransport, BusError> {
        let connection = RabbitMqConnection::connect_recovering(url, name).await?;
        let publisher = open_publisher(&connection, exchange).await?;
        Ok(RabbitMqTransport {
            connection: Mutex::new(connection),
            publisher: Mutex::new(publisher),
            exchange: exchange.to_owned(),
            reconnect_timeout: Duration::from_secs(30),
            reconnects: AtomicU64::new(0),
            recovered_by_lapin: AtomicU64::new(0),
        })
    }

    /// How long a publish that lost its connection keeps trying to reconnect (default 30 s).
    pub fn reconnect_timeout(mut self, timeout: Duration) -> RabbitMqTransport {
        self.reconnect_timeout = timeout;
        self
    }

    /// Publishes `envelope` and waits for the broker's confirm; an event no queue is bound for
    /// is not an error.
    pub async fn publish(&self, envelope: &Envelope) -> Result<(), BusError> {
        self.with_retry(|publisher| async move { publisher.publish(envelope).await })
            .await
    }

    /// Publishes `envelope` and fails with [`BusError::NotConfirmed`] when no queue is bound
    /// for its type.
    pub async fn publish_mandatory(&self, envelope: &Envelope) -> Result<(), BusError> {
        self.with_retry(|publisher| async move { publisher.publish_mandatory(envelope).await })
            .await
    }

    /// How many times a publish found the connection lost and went on once it was back
    /// (recovered by lapin or opened again).
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// How many of those [`reconnects`](RabbitMqTransport::reconnects) lapin's automatic
    /// recovery handled; the others opened a fresh connection.
    pub fn recovered_by_lapin(&self) -> u64 {
        self.recovered_by_lapin.load(Ordering::Relaxed)
    }

    /// `true` while the broker has blocked the connection (a memory or disk alarm): publishes
    /// wait meanwhile, up to their confirm timeout.
    pub async fn is_blocked(&self) -> bool {
        self.connection.lock().await.is_blocked()
    }

    async fn with_retry<'a, F, Fut>(&'a self, publish: F) -> Result<(), BusError>
    where
        F: Fn(Arc<RabbitMqPublisher>) -> Fut,
        Fut: std::future::Future<Output = Result<(), BusError>> + 'a,
    {
        let publisher = self.publisher.lock().await.clone();
        let detail = match publish(publisher.clone()).await {
            // The connection or channel was lost, whatever the publisher reads by now: lapin
            // may have recovered it between the error and this line.
            Err(BusError::Connection(detail)) => detail,
            // The broker closed the channel (what a refused operation does).
            Err(BusError::Transport { detail, .. }) if !publisher.is_connected() => detail,
            // A confirm that never came: the channel's confirms cannot be trusted any more.
            Err(BusError::NotConfirmed { detail, .. }) if !publisher.is_connected() => detail,
            other => return other,
        };
        tracing::warn!(
            detail,
            "publish failed on a lost connection; retrying once it is back"
        );
        let started = tokio::time::Instant::now();
        if publisher.recovered(self.reconnect_timeout).await {
            self.reconnects.fetch_add(1, Ordering::Relaxed);
            self.recovered_by_lapin.fetch_add(1, Ordering::Relaxed);
            tracing::info!(after = ?started.elapsed(), "publisher recovered by lapin");
            return publish(publisher).await;
        }
        let publisher = self.reconnect(&publisher).await?;
        publish(publisher).await
    }

    /// A working publisher: the current one if another publish already reconnected, else a new
    /// connection, retried with backoff until `reconnect_timeout`.
    async fn reconnect(
        &self,
        failed: &Arc<RabbitMqPublisher>,
    ) -> Result<Arc<RabbitMqPublisher>, BusError> {
        let mut current = self.publisher.lock().await;
        if !Arc::ptr_eq(&current, failed) && current.is_connected() {
            return Ok(current.clone());
        }
        let deadline = tokio::time::Instant::now() + self.reconnect_timeout;
        let mut backoff =
            crate::retry::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut connection = self.connection.lock().await;
        loop {
            let delay = backoff.next_delay();
            let attempt = async {
                let fresh = connection.reconnect().await?;
                let publisher = open_publisher(&fresh, &self.exchange).await?;
                Ok::<_, BusError>((fresh, publisher))
            };
            match attempt.await {
                Ok((fresh, publisher)) => {
                    *connection = fresh;
                    *current = publisher.clone();
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(connection = connection.name(), "publisher reconnected");
                    return Ok(publisher);
                }
                Err(error) if tokio::time::Instant::now() + delay >= deadline => {
                    return Err(BusError::Connection(format!(
                        "the broker stayed unreachable for {:?}: {error}",
                        self.reconnect_timeout
                    )))
                }
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?delay, "publisher reconnect failed");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

async fn open_publisher(
    connection: &RabbitMqConnection,
    exchange: &str,
) -> Result<Arc<RabbitMqPublisher>, BusError> {
    let publisher = RabbitMqPublisher::new(connection)
        .await?
        .exchange(exchange.to_owned());
    publisher.declare_exchange().await?;
    Ok(Arc::new(publisher))
}

impl Publish for RabbitMqTransport {
    fn publish_envelope(&self, envelope: Envelope) -> BoxFuture<'_, Result<Uuid, PublishError>> {
        Box::pin(async move {
            let id = envelope.id;
            self.publish(&envelope)
                .await
                .map_err(|error| PublishError::Transport(error.into()))?;
            Ok(id)
        })
    }
}

impl fmt::Debug for RabbitMqTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqTransport")
            .field("exchange", &self.exchange)
            .field("reconnect_timeout", &self.reconnect_timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A transport named `name` on the broker these tests use: `TEST_AMQP_URL`, by default
    /// the local one.
    async fn transport(name: &str) -> RabbitMqTransport {
        let url = std::env::var("TEST_AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
        RabbitMqTransport::connect_named(&url, name, DEFAULT_EXCHANGE)
            .await
            .expect("RabbitMQ is reachable (set TEST_AMQP_URL to point at one)")
    }

    /// Publishes through `transport`'s `with_retry`, each call answered by `answer` (given the
    /// call's number, from 0, and the publisher it is made on); returns what `with_retry`
    /// returned and how many calls it made.
    async fn retried(
        transport: &RabbitMqTransport,
        answer: impl Fn(u32, &RabbitMqPublisher) -> Result<(), BusError>,
    ) -> (Result<(), BusError>, u32) {
        let calls = AtomicU32::new(0);
        let published = transport
            .with_retry(|publisher| {
                let answered = answer(calls.fetch_add(1, Ordering::SeqCst), &publisher);
                async move { answered }
            })
            .await;
        (published, calls.load(Ordering::SeqCst))
    }

    /// A publish that failed on a lost channel is retried once even when lapin recovered the
    /// channel before the failure reached the transport (a race the transport lost when it
    /// asked the channel's state instead of reading the error).
    #[tokio::test]
    async fn a_publish_lost_to_a_channel_already_recovered_is_retried_once() {
        let transport = transport("hexeract-unit-transport-race").await;
        let (published, calls) = retried(&transport, |call, publisher| {
            assert!(publisher.is_connected(), "the channel is up at every call");
            if call == 0 {
                Err(BusError::Connection(
                    "invalid channel state: reconnecting".to_owned(),
                ))
            } else {
                Ok(())
            }
        })
        .await;
        assert!(published.is_ok(), "{published:?}");
        assert_eq!(calls, 2, "retried once");
        assert_eq!(transport.reconnects(), 1);
        assert_eq!(transport.recovered_by_lapin(), 1);
    }

    /// A refusal on a channel that stays up is the broker's answer, not a blip: not retried.
    #[tokio::test]
    async fn a_refusal_on_a_working_channel_is_not_retried() {
        let transport = transport("hexeract-unit-transport-refusal").await;
        let (published, calls) = retried(&transport, |_, _| {
            Err(BusError::Transport {
                operation: "publish".to_owned(),
                detail: "refused".to_owned(),
            })
        })
        .await;
        assert!(matches!(published, Err(BusError::Transport { .. })));
        assert_eq!(calls, 1);
        assert_eq!(transport.reconnects(), 0);
    }
}
