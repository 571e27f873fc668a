//! [`RabbitMqPublisher`]: publishing with publisher confirms, pipelined within a window.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::BasicProperties;
use lapin::{Confirmation, PublisherConfirm};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use crate::envelope::Envelope;
use crate::rabbitmq::topology::short;
use crate::rabbitmq::wire;
use crate::rabbitmq::{BusError, RabbitMqConnection, DEFAULT_EXCHANGE};

/// Publishes persistent messages on a channel in confirm mode. A publish is done when the
/// broker confirmed it; up to `confirm_window` publishes wait for their confirms at once, so a
/// batch costs about one round trip, not one per message.
///
/// ```no_run
/// # async fn example(connection: hexeract::rabbitmq::RabbitMqConnection) -> Result<(), Box<dyn std::error::Error>> {
/// use hexeract::rabbitmq::RabbitMqPublisher;
/// use hexeract::{Envelope, Message};
///
/// #[derive(serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// struct OrderPlaced { order_id: u64 }
///
/// let publisher = RabbitMqPublisher::new(&connection).await?;
/// publisher.publish(&Envelope::new(&OrderPlaced { order_id: 7 })?).await?;
/// # Ok(())
/// # }
/// ```
///
/// A clone publishes on the same channel, within the same confirm window.
///
/// A confirm that does not come within the confirm timeout makes the channel suspect: the
/// broker numbers confirms by what it received, so one lost frame would leave every later
/// confirm waiting for a number that never comes. From then on
/// [`is_connected`](RabbitMqPublisher::is_connected) is `false`, and the relay, the bus
/// worker and [`RabbitMqTransport`](crate::rabbitmq::RabbitMqTransport) open a new connection
/// rather than go on publishing into it.
#[derive(Clone)]
pub struct RabbitMqPublisher {
    connection: RabbitMqConnection,
    channel: lapin::Channel,
    exchange: String,
    window: Arc<Semaphore>,
    confirm_timeout: Duration,
    /// Set once a confirm did not come in time; shared by the clones on the channel.
    confirms_lost: Arc<AtomicBool>,
}

/// Publishes waiting for their confirms at once, unless set otherwise.
pub(crate) const DEFAULT_CONFIRM_WINDOW: usize = 128;

impl RabbitMqPublisher {
    /// A publisher to the default exchange (`hexeract`) on a new channel of `connection`, with
    /// a confirm window of 128 and a confirm timeout of 30 s.
    pub async fn new(connection: &RabbitMqConnection) -> Result<RabbitMqPublisher, BusError> {
        let channel = connection.channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|error| BusError::transport("confirm.select", error))?;
        Ok(RabbitMqPublisher {
            connection: connection.clone(),
            channel,
            exchange: DEFAULT_EXCHANGE.to_owned(),
            window: Arc::new(Semaphore::new(DEFAULT_CONFIRM_WINDOW)),
            confirm_timeout: Duration::from_secs(30),
            confirms_lost: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Closes the channel; for a publisher made for one task.
    pub(crate) async fn close(&self) {
        let _ = self.channel.close(200, "done".into()).await;
    }

    /// Publishes to `exchange` instead of `hexeract`.
    pub fn exchange(mut self, exchange: impl Into<String>) -> RabbitMqPublisher {
        self.exchange = exchange.into();
        self
    }

    /// How many publishes may wait for their confirms at once (default 128, at least 1).
    pub fn confirm_window(mut self, window: usize) -> RabbitMqPublisher {
        self.window = Arc::new(Semaphore::new(window.max(1)));
        self
    }

    /// How long a publish waits for its confirm before it fails (default 30 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> RabbitMqPublisher {
        self.confirm_timeout = timeout;
        self
    }

    /// The confirm timeout ([`confirm_timeout`](RabbitMqPublisher::confirm_timeout)).
    pub(crate) fn confirm_timeout_value(&self) -> Duration {
        self.confirm_timeout
    }

    /// Declares the exchange (durable, topic), as the bus worker's topology does: idempotent.
    pub async fn declare_exchange(&self) -> Result<(), BusError> {
        self.channel
            .exchange_declare(
                short(&self.exchange)?,
                lapin::ExchangeKind::Topic,
                lapin::options::ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .map_err(|error| {
                BusError::transport(format!("declaring exchange {:?}", self.exchange), error)
            })
    }

    /// `true` while the channel is open and its confirms come: `false` once a confirm did
    /// not come within the confirm timeout, even if the channel looks open.
    pub fn is_connected(&self) -> bool {
        self.channel.status().connected() && !self.confirms_lost.load(Ordering::SeqCst)
    }

    /// On a connection with lapin's recovery on: waits up to `within` for lapin to bring the
    /// channel back (confirm mode and the exchange replayed); `false` when it does not, or
    /// cannot (recovery off, or given up).
    pub(crate) async fn recovered(&self, within: Duration) -> bool {
        if !self.connection.is_recovering() || self.confirms_lost.load(Ordering::SeqCst) {
            return false;
        }
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.channel.status().connected() && self.connection.is_connected() {
                return true;
            }
            // Closed for good, or a channel the broker closed on its own (lapin does not
            // reopen a channel of a connection that stayed up).
            let channel_back =
                self.channel.status().reconnecting() || self.connection.is_reconnecting();
            if self.connection.is_closed() || (self.connection.is_connected() && !channel_back) {
                return false;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Publishes `envelope` to the exchange with its message type as routing key, and waits
    /// for the broker's confirm. A message no queue is bound for is not an error (an event
    /// nobody subscribes to); see [`publish_mandatory`](RabbitMqPublisher::publish_mandatory).
    pub async fn publish(&self, envelope: &Envelope) -> Result<(), BusError> {
        self.publish_all(std::slice::from_ref(envelope)).await
    }

    /// Publishes `envelope` and fails with [`BusError::NotConfirmed`] when no queue is bound
    /// for its type (the broker returns it).
    pub async fn publish_mandatory(&self, envelope: &Envelope) -> Result<(), BusError> {
        let pending = self
            .send(
                self.place().await,
                &self.exchange,
                &envelope.message_type,
                &envelope.payload,
                wire::properties(envelope, 0),
                true,
            )
            .await?;
        self.confirmed(pending, &envelope.id).await
    }

    /// Publishes `envelopes` in order, then waits for every confirm: one round trip per
    /// window, not per message. Fails if any was not confirmed (some may have been: publishing
    /// is at least once).
    pub async fn publish_all(&self, envelopes: &[Envelope]) -> Result<(), BusError> {
        self.publish_each(envelopes.iter(), false, |envelope| {
            wire::properties(envelope, 0)
        })
        .await
        .map(drop)
    }

    /// Publishes `envelopes` in order, each with the properties `properties` gives it, then
    /// waits for every confirm; with `mandatory`, a message no queue is bound for comes back as
    /// [`Confirmed::Returned`] in its place. Fails if any was nacked or not confirmed in time.
    pub(crate) async fn publish_each<'e>(
        &self,
        envelopes: impl ExactSizeIterator<Item = &'e Envelope>,
        mandatory: bool,
        properties: impl Fn(&Envelope) -> BasicProperties,
    ) -> Result<Vec<Confirmed>, BusError> {
        let mut pending: std::collections::VecDeque<(Unconfirmed, &Uuid)> =
            std::collections::VecDeque::with_capacity(envelopes.len());
        let mut confirmed = Vec::with_capacity(envelopes.len());
        let mut first_error = None;
        for envelope in envelopes {
            // A full window: wait for this batch's oldest confirm, which frees a place. Only a
            // caller holding no place waits for one, so callers sharing the window never wait
            // for each other in a circle.
            let permit = loop {
                if let Ok(permit) = self.window.clone().try_acquire_owned() {
                    break permit;
                }
                match pending.pop_front() {
                    Some((confirm, id)) => match self.confirm_of(confirm, id).await {
                        Ok(outcome) => confirmed.push(outcome),
                        Err(error) => {
                            first_error.get_or_insert(error);
                        }
                    },
                    None => break self.place().await,
                }
            };
            let confirm = self
                .send(
                    permit,
                    &self.exchange,
                    &envelope.message_type,
                    &envelope.payload,
                    properties(envelope),
                    mandatory,
                )
                .await?;
            pending.push_back((confirm, &envelope.id));
        }
        for (confirm, id) in pending {
            match self.confirm_of(confirm, id).await {
                Ok(outcome) => confirmed.push(outcome),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(confirmed), Err)
    }

    /// Publishes raw bytes and properties and waits for the confirm.
    pub(crate) async fn publish_raw(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<(), BusError> {
        let message_id = properties
            .message_id()
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| "(no id)".to_owned());
        let pending = self
            .send(
                self.place().await,
                exchange,
                routing_key,
                payload,
                properties,
                mandatory,
            )
            .await?;
        self.confirmed(pending, &message_id).await
    }

    /// Waits while the broker blocks the connection (`connection.blocked`), up to the confirm
    /// timeout: publishing then would only fill buffers the broker does not read.
    async fn unblocked(&self) -> Result<(), BusError> {
        if !self.connection.is_blocked() {
            return Ok(());
        }
        tracing::warn!("the broker blocks publishing (a memory or disk alarm); waiting");
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        while self.connection.is_blocked() {
            if tokio::time::Instant::now() >= deadline {
                return Err(BusError::NotConfirmed {
                    message_id: "(not sent)".to_owned(),
                    detail: format!(
                        "the broker kept the connection blocked for {:?}",
                        self.confirm_timeout
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// A place in the confirm window.
    async fn place(&self) -> OwnedSemaphorePermit {
        self.window
            .clone()
            .acquire_owned()
            .await
            .expect("the window is never closed")
    }

    async fn send(
        &self,
        permit: OwnedSemaphorePermit,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
        mandatory: bool,
    ) -> Result<Unconfirmed, BusError> {
        if self.confirms_lost.load(Ordering::SeqCst) {
            return Err(BusError::NotConfirmed {
                message_id: "(not sent)".to_owned(),
                detail: "the channel was given up after a confirm did not come in time; \
                         publish on a new connection"
                    .to_owned(),
            });
        }
        self.unblocked().await?;
        let confirm = self
            .channel
            .basic_publish(
                short(exchange)?,
                short(routing_key)?,
                BasicPublishOptions {
                    mandatory,
                    ..BasicPublishOptions::default()
                },
                payload,
                properties,
            )
            .await
            .map_err(|error| BusError::transport("basic.publish", error))?;
        Ok(Unconfirmed {
            confirm,
            _permit: permit,
        })
    }

    /// Waits for `pending`'s confirm, up to the confirm timeout; a message the broker returned
    /// (`mandatory`, no queue bound) is an error. `message_id` names the message in the error.
    async fn confirmed(
        &self,
        pending: Unconfirmed,
        message_id: &(dyn fmt::Display + Sync),
    ) -> Result<(), BusError> {
        match self.confirm_of(pending, message_id).await? {
            Confirmed::Routed => Ok(()),
            Confirmed::Returned(detail) => Err(BusError::NotConfirmed {
                message_id: message_id.to_string(),
                detail,
            }),
        }
    }

    /// Waits for `pending`'s confirm, up to the confirm timeout. `message_id` names the message
    /// in the error.
    async fn confirm_of(
        &self,
        pending: Unconfirmed,
        message_id: &(dyn fmt::Display + Sync),
    ) -> Result<Confirmed, BusError> {
        let not_confirmed = |detail: String| BusError::NotConfirmed {
            message_id: message_id.to_string(),
            detail,
        };
        let Unconfirmed {
            mut confirm,
            _permit,
        } = pending;
        // A confirm already in (most, when a batch is awaited after it was sent) is taken without
        // arming a timer: each armed timer is a lock on the runtime's timer wheel, twice.
        let ready = futures_util::FutureExt::now_or_never(&mut confirm);
        let waited = match ready {
            Some(confirmation) => Ok(confirmation),
            None => tokio::time::timeout(self.confirm_timeout, confirm).await,
        };
        let Ok(confirmation) = waited else {
            if !self.confirms_lost.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    timeout = ?self.confirm_timeout,
                    "a publisher confirm did not come in time; the channel is given up"
                );
                // Closed, the channel fails every confirm still awaited on it at once, instead
                // of each waiting out its own timeout.
                let channel = self.channel.clone();
                tokio::spawn(async move {
                    let _ = channel
                        .close(200, "publisher confirms stopped coming".into())
                        .await;
                });
            }
            return Err(not_confirmed(format!(
                "no confirm within {:?}; the channel is given up",
                self.confirm_timeout
            )));
        };
        let confirmation =
            confirmation.map_err(|error| BusError::transport("publisher confirm", error))?;
        match confirmation {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(Confirmed::Routed),
            // The broker sends `basic.return` before the ack: a confirm alone does not mean
            // that any queue has the message.
            Confirmation::Ack(Some(returned)) => Ok(Confirmed::Returned(format!(
                "returned as unroutable ({} {}): no queue is bound for routing key {:?} on \
                 exchange {:?}",
                returned.reply_code,
                returned.reply_text,
                returned.delivery.routing_key.as_str(),
                returned.delivery.exchange.as_str()
            ))),
            Confirmation::Nack(_) => Err(not_confirmed(
                "the broker nacked it (it could not store the message)".to_owned(),
            )),
        }
    }
}

/// What the broker said of a confirmed publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Confirmed {
    /// Stored in at least one queue (or published without `mandatory`).
    Routed,
    /// Confirmed, but returned first: no queue is bound for its routing key. Why, as text.
    Returned(String),
}

/// A publish waiting for its confirm, holding its place in the window.
struct Unconfirmed {
    confirm: PublisherConfirm,
    _permit: OwnedSemaphorePermit,
}

impl fmt::Debug for RabbitMqPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqPublisher")
            .field("exchange", &self.exchange)
            .field("confirm_timeout", &self.confirm_timeout)
            .finish_non_exhaustive()
    }
}
