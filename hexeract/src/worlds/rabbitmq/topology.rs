//! [`Topology`]: the exchange, queues and bindings a set of handlers needs on the broker, and
//! [`ensure_topology`], which declares them.
//!
//! - one durable **topic exchange** (default `hexeract`); messages are published to it with
//!   their message type as routing key;
//! - per handler, a **quorum queue** `<prefix>.<handler name>` (`::` written as `.`) bound by
//!   the handler's message type, so each handler is its own subscriber; its `x-delivery-limit`
//!   parks a message whose deliveries keep ending without an ack (a message that crashes the
//!   consumer), since classic queues do not count such redeliveries;
//! - per handler queue, a **parking queue** `<queue>.parked` for what cannot be handled;
//! - shared **wait queues** in fixed-delay tiers, `<prefix>.wait.<delay>` (1 s, 2 s, 4 s …
//!   300 s), each behind a fanout exchange of the same name. A retry is published to the tier
//!   of its backoff with the handler's queue as routing key; when the tier's TTL expires the
//!   broker dead-letters it through the default exchange, by that routing key, back to that one
//!   queue. Per-message TTLs would not do: they expire only at the head of a queue, so a short
//!   retry would wait behind a long one.
//!
//! Declaring is idempotent. Declaring an existing queue with other arguments fails with the
//! broker's `PRECONDITION_FAILED`, reported with the queue's name.

use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::ExchangeKind;

use crate::rabbitmq::{BusError, RabbitMqConnection};
use crate::registry::Registry;

/// The exchange messages are published to unless another is configured.
pub const DEFAULT_EXCHANGE: &str = "hexeract";

/// The prefix of queue names unless another is configured.
pub const DEFAULT_PREFIX: &str = "hexeract";

/// The delays of the wait queues: 1 s doubling to 256 s, then 300 s (the longest backoff).
pub const DEFAULT_WAIT_TIERS: [Duration; 10] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
    Duration::from_secs(32),
    Duration::from_secs(64),
    Duration::from_secs(128),
    Duration::from_secs(256),
    Duration::from_secs(300),
];

/// The handler queues' `x-delivery-limit` unless another is set: a backstop. The worker itself
/// parks a message once its deliveries exceed `max_attempts`, counting the ones that never
/// finished, so the broker's limit only acts when the worker cannot even look at the message.
/// Kept apart from `MAX_DELIVERIES` on purpose: a quorum queue's arguments cannot change once
/// declared, and changing `MAX_DELIVERIES` must not make the queues undeclarable.
pub const DEFAULT_DELIVERY_LIMIT: u32 = 20;

/// The wait tiers of a backoff from `initial` doubling up to `max`: `initial`, `2 × initial` …
/// while shorter than `max`, then `max` (at most 32 tiers). The default backoff, 1 s to 300 s,
/// gives [`DEFAULT_WAIT_TIERS`]. Jitter shortens a delay by up to a fifth, so delays of one
/// doubling step share a tier: retries that failed together come back together.
///
/// ```
/// use std::time::Duration;
/// use hexeract::rabbitmq::{tiers_for, DEFAULT_WAIT_TIERS};
///
/// let secs = Duration::from_secs;
/// assert_eq!(tiers_for(secs(1), secs(300)), DEFAULT_WAIT_TIERS);
/// assert_eq!(tiers_for(secs(1), secs(10)), [secs(1), secs(2), secs(4), secs(8), secs(10)]);
/// ```
pub fn tiers_for(initial: Duration, max: Duration) -> Vec<Duration> {
    let initial = initial.max(Duration::from_millis(1));
    let mut tiers = Vec::new();
    let mut tier = initial;
    while tier < max && tiers.len() < 31 {
        tiers.push(tier);
        tier = tier.saturating_mul(2);
    }
    tiers.push(max.max(initial));
    tiers
}

/// Longest name AMQP allows for an exchange, queue or routing key.
const MAX_NAME_BYTES: usize = 255;

/// An exchange to declare (durable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// Its name.
    pub name: String,
    /// `topic` for the message exchange, `fanout` for a wait tier's.
    pub kind: ExchangeKind,
}

/// What kind of queue to declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueKind {
    /// A replicated queue that counts deliveries (`x-delivery-count`) and can dead-letter at
    /// least once: every queue of a [`Topology`].
    Quorum,
    /// A classic durable queue.
    Classic,
}

/// `x-overflow`: what a queue at its `x-max-length` does with one more message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overflow {
    /// Refuse it: the publisher gets a `basic.nack`, a dead-lettering source keeps it. What
    /// at-least-once dead-lettering requires of its source queue.
    RejectPublish,
    /// Drop (or dead-letter) the oldest message to make room: the broker's default.
    DropHead,
}

/// `x-dead-letter-strategy` (quorum queues): how the broker moves what a queue dead-letters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetterStrategy {
    /// The source keeps the message until its dead-letter target confirmed it (RabbitMQ 3.10
    /// and later; only with [`Overflow::RejectPublish`], else the broker falls back to at most
    /// once).
    AtLeastOnce,
    /// Moved without confirms (the broker's default): a target that refuses it, or a broker
    /// that fails meanwhile, loses it.
    AtMostOnce,
}

/// The parking queues' `x-max-length` unless another is set: a full parking queue refuses a
/// park (the delivery stays in its handler queue) rather than dropping the oldest dead letter.
/// Like the delivery limit, it is part of the queues' arguments: changing it means migrating
/// every parking queue ([`migrate_queue`](crate::rabbitmq::migrate_queue)).
pub const DEFAULT_PARKING_MAX_LENGTH: u64 = 1_000_000;

/// A queue to declare (durable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queue {
    /// Its name.
    pub name: String,
    /// Quorum or classic.
    pub kind: QueueKind,
    /// `x-message-ttl`: how long a message waits before it is dead-lettered.
    pub message_ttl: Option<Duration>,
    /// `x-dead-letter-exchange`: where expired or over-limit messages go (`""`: the default
    /// exchange).
    pub dead_letter_exchange: Option<String>,
    /// `x-dead-letter-routing-key`; without it a dead-lettered message keeps its routing key.
    pub dead_letter_routing_key: Option<String>,
    /// `x-delivery-limit` (quorum queues): deliveries without an ack before the broker
    /// dead-letters the message.
    pub delivery_limit: Option<u32>,
    /// `x-max-length`: messages the queue holds at most.
    pub max_length: Option<u64>,
    /// `x-overflow`: what the queue does at `max_length`, and whether it can dead-letter at
    /// least once.
    pub overflow: Option<Overflow>,
    /// `x-dead-letter-strategy` (quorum queues).
    pub dead_letter_strategy: Option<DeadLetterStrategy>,
}

impl Queue {
    /// A durable classic queue with no arguments.
    pub fn classic(name: impl Into<String>) -> Queue {
        Queue {
            name: name.into(),
            kind: QueueKind::Classic,
            message_ttl: None,
            dead_letter_exchange: None,
            dead_letter_routing_key: None,
            delivery_limit: None,
            max_length: None,
            overflow: None,
            dead_letter_strategy: None,
        }
    }

    /// A durable quorum queue with no other arguments.
    pub fn quorum(name: impl Into<String>) -> Queue {
        Queue {
            kind: QueueKind::Quorum,
            ..Queue::classic(name)
        }
    }

    /// The same queue, dead-lettering at least once: `x-dead-letter-strategy = at-least-once`
    /// and the `x-overflow = reject-publish` it requires.
    pub fn at_least_once(self) -> Queue {
        Queue {
            overflow: Some(Overflow::RejectPublish),
            dead_letter_strategy: Some(DeadLetterStrategy::AtLeastOnce),
            ..self
        }
    }

    /// The arguments the queue is declared with.
    pub(crate) fn arguments(&self) -> FieldTable {
        let mut arguments = FieldTable::default();
        let text = |value: &str| AMQPValue::LongString(LongString::from(value.as_bytes()));
        if self.kind == QueueKind::Quorum {
            arguments.insert("x-queue-type".into(), text("quorum"));
        }
        if let Some(ttl) = self.message_ttl {
            let millis = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
            arguments.insert("x-message-ttl".into(), AMQPValue::LongLongInt(millis));
        }
        if let Some(exchange) = &self.dead_letter_exchange {
            arguments.insert("x-dead-letter-exchange".into(), text(exchange));
        }
        if let Some(key) = &self.dead_letter_routing_key {
            arguments.insert("x-dead-letter-routing-key".into(), text(key));
        }
        if let Some(limit) = self.delivery_limit {
            arguments.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(i64::from(limit)),
            );
        }
        if let Some(length) = self.max_length {
            let length = i64::try_from(length).unwrap_or(i64::MAX);
            arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(length));
        }
        if let Some(overflow) = self.overflow {
            let value = match overflow {
                Overflow::RejectPublish => "reject-publish",
                Overflow::DropHead => "drop-head",
            };
            arguments.insert("x-overflow".into(), text(value));
        }
        if let Some(strategy) = self.dead_letter_strategy {
            let value = match strategy {
                DeadLetterStrategy::AtLeastOnce => "at-least-once",
                DeadLetterStrategy::AtMostOnce => "at-most-once",
            };
            arguments.insert("x-dead-letter-strategy".into(), text(value));
        }
        arguments
    }
}

/// A binding of a queue to an exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The queue.
    pub queue: String,
    /// The exchange.
    pub exchange: String,
    /// The routing key (for the message exchange: the message type).
    pub routing_key: String,
}

/// One handler's place on the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HandlerQueue {
    pub(crate) handler: String,
    pub(crate) message_type: String,
    pub(crate) queue: String,
    pub(crate) parking: String,
}

/// The broker objects a set of handlers needs.
///
/// ```
/// use hexeract::rabbitmq::Topology;
/// use hexeract::{handler, Context, Message, Registry};
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// struct OrderPlaced { order_id: u64 }
///
/// #[handler(message = "OrderPlaced", name = "billing::invoice")]
/// async fn invoice(_event: OrderPlaced, _ctx: &Context) -> Result<(), std::io::Error> { Ok(()) }
///
/// let registry = Registry::from_inventory()?;
/// let topology = Topology::from_registry(&registry).prefix("shop");
/// assert_eq!(topology.queue_for("billing::invoice"), "shop.billing.invoice");
/// assert_eq!(topology.parking_queue_for("billing::invoice"), "shop.billing.invoice.parked");
/// assert!(topology.bindings().iter().any(|binding| binding.queue == "shop.billing.invoice"
///     && binding.exchange == "hexeract"
///     && binding.routing_key == "OrderPlaced"));
/// # Ok::<(), hexeract::RegistryError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a topology only describes queues: nothing is declared until `ensure_topology`"]
pub struct Topology {
    pub(crate) exchange: String,
    prefix: String,
    wait_tiers: Vec<Duration>,
    delivery_limit: u32,
    parking_max_length: u64,
    handlers: Vec<(String, String)>,
}

impl Topology {
    /// The topology of every handler in `registry`, with the default exchange, prefix, wait
    /// tiers and delivery limit.
    pub fn from_registry(registry: &Registry) -> Topology {
        Topology {
            exchange: DEFAULT_EXCHANGE.to_owned(),
            prefix: DEFAULT_PREFIX.to_owned(),
            wait_tiers: DEFAULT_WAIT_TIERS.to_vec(),
            delivery_limit: DEFAULT_DELIVERY_LIMIT,
            parking_max_length: DEFAULT_PARKING_MAX_LENGTH,
            handlers: registry
                .handlers()
                .map(|info| (info.name.to_string(), info.message_type.to_owned()))
                .collect(),
        }
    }

    /// The message exchange's name (default `hexeract`).
    pub fn exchange(mut self, exchange: impl Into<String>) -> Topology {
        self.exchange = exchange.into();
        self
    }

    /// The prefix of queue names (default `hexeract`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Topology {
        self.prefix = prefix.into();
        self
    }

    /// The wait queues' delays (default [`DEFAULT_WAIT_TIERS`]). A retry waits in the shortest
    /// tier at least as long as its backoff, or the longest tier.
    pub fn wait_tiers(mut self, tiers: impl IntoIterator<Item = Duration>) -> Topology {
        let mut tiers: Vec<Duration> = tiers.into_iter().collect();
        tiers.sort();
        tiers.dedup();
        self.wait_tiers = tiers;
        self
    }

    /// The handler queues' `x-delivery-limit` (default [`DEFAULT_DELIVERY_LIMIT`]): deliveries
    /// that end without an ack (the consumer crashed or lost its connection) before the broker
    /// parks the message.
    pub fn delivery_limit(mut self, limit: u32) -> Topology {
        self.delivery_limit = limit;
        self
    }

    /// The parking queues' `x-max-length` (default [`DEFAULT_PARKING_MAX_LENGTH`]): a full
    /// parking queue refuses further parks, and what would have been parked stays in its
    /// handler queue.
    pub fn parking_max_length(mut self, length: u64) -> Topology {
        self.parking_max_length = length;
        self
    }

    /// The message exchange's name.
    pub fn exchange_name(&self) -> &str {
        &self.exchange
    }

    /// The prefix of every queue name.
    pub(crate) fn queue_prefix(&self) -> &str {
        &self.prefix
    }

    /// The queue of `handler`: `<prefix>.<handler>` with `::` written as `.`.
    pub fn queue_for(&self, handler: &str) -> String {
        queue_name(&self.prefix, handler)
    }

    /// The parking queue of `handler`'s queue.
    pub fn parking_queue_for(&self, handler: &str) -> String {
        parking_queue(&self.queue_for(handler))
    }

    /// The queue in which this topology's queue migrations are recorded: `<prefix>@migrations`
    /// ([`MIGRATION_JOURNAL`](crate::rabbitmq::MIGRATION_JOURNAL) under the default prefix; `@`
    /// is in no handler's queue name).
    pub fn migration_journal(&self) -> String {
        format!("{}@migrations", self.prefix)
    }

    /// The wait tiers' delays, shortest first.
    pub fn tiers(&self) -> &[Duration] {
        &self.wait_tiers
    }

    /// The name of the wait queue (and of its exchange) for `tier`.
    pub fn wait_queue(&self, tier: Duration) -> String {
        format!("{}.wait.{}", self.prefix, tier_label(tier))
    }

    /// The tier a retry after `delay` waits in: the shortest at least as long, or the longest.
    pub fn tier_for(&self, delay: Duration) -> Option<Duration> {
        self.wait_tiers
            .iter()
            .copied()
            .find(|tier| *tier >= delay)
            .or_else(|| self.wait_tiers.last().copied())
    }

    pub(crate) fn handler_queues(&self) -> Vec<HandlerQueue> {
        self.handlers
            .iter()
            .map(|(handler, message_type)| HandlerQueue {
                handler: handler.clone(),
                message_type: message_type.clone(),
                queue: self.queue_for(handler),
                parking: self.parking_queue_for(handler),
            })
            .collect()
    }

    /// The exchanges: the message exchange and one per wait tier.
    pub fn exchanges(&self) -> Vec<Exchange> {
        let mut exchanges = vec![Exchange {
            name: self.exchange.clone(),
            kind: ExchangeKind::Topic,
        }];
        exchanges.extend(self.wait_tiers.iter().map(|tier| Exchange {
            name: self.wait_queue(*tier),
            kind: ExchangeKind::Fanout,
        }));
        exchanges
    }

    /// The queues: the wait tiers, then per handler its parking queue and its queue. All are
    /// quorum queues, and the two that dead-letter (a wait tier when a retry's delay is over, a
    /// handler queue past its delivery limit) do it at least once: the broker keeps the
    /// message in its source until the target confirmed it. The order is the order of a
    /// migration: each dead-letter target is moved to its new layout before its sources.
    pub fn queues(&self) -> Vec<Queue> {
        let mut queues: Vec<Queue> = self
            .wait_tiers
            .iter()
            .map(|tier| self.wait_queue_layout(*tier))
            .collect();
        for handler in self.handler_queues() {
            queues.push(self.parking_queue_layout(&handler.parking));
            queues.push(Queue {
                dead_letter_exchange: Some(String::new()),
                dead_letter_routing_key: Some(handler.parking.clone()),
                delivery_limit: Some(self.delivery_limit),
                ..Queue::quorum(handler.queue).at_least_once()
            });
        }
        queues
    }

    /// The wait tier of `tier`: its TTL is the delay; then the broker dead-letters the retry
    /// through the default exchange by its own routing key (the handler queue's name).
    fn wait_queue_layout(&self, tier: Duration) -> Queue {
        Queue {
            message_ttl: Some(tier),
            dead_letter_exchange: Some(String::new()),
            ..Queue::quorum(self.wait_queue(tier)).at_least_once()
        }
    }

    /// A parking queue named `name`: bounded, refusing once full rather than dropping the
    /// oldest dead letter.
    pub(crate) fn parking_queue_layout(&self, name: &str) -> Queue {
        Queue {
            max_length: Some(self.parking_max_length),
            overflow: Some(Overflow::RejectPublish),
            ..Queue::quorum(name)
        }
    }

    /// The bindings: each handler queue by its message type, each wait queue to its exchange.
    pub fn bindings(&self) -> Vec<Binding> {
        let mut bindings: Vec<Binding> = self
            .handler_queues()
            .into_iter()
            .map(|handler| Binding {
                queue: handler.queue,
                exchange: self.exchange.clone(),
                routing_key: handler.message_type,
            })
            .collect();
        bindings.extend(self.wait_tiers.iter().map(|tier| Binding {
            queue: self.wait_queue(*tier),
            exchange: self.wait_queue(*tier),
            routing_key: String::new(),
        }));
        bindings
    }

    /// Every name this topology would declare, checked: at most 255 bytes, exchanges and queues
    /// not in the broker's reserved `amq.` namespace, no two handlers on one queue.
    pub fn validate(&self) -> Result<(), BusError> {
        let mut problems = Vec::new();
        if self.wait_tiers.is_empty() || self.wait_tiers.iter().any(Duration::is_zero) {
            problems.push("wait tiers: give at least one, each longer than zero".to_owned());
        }
        let names = self
            .exchanges()
            .into_iter()
            .map(|exchange| exchange.name)
            .chain(self.queues().into_iter().map(|queue| queue.name));
        for name in names {
            if let Err(problem) = check_name(&name, true) {
                problems.push(problem);
            }
        }
        for binding in self.bindings() {
            if let Err(problem) = check_name(&binding.routing_key, false) {
                problems.push(problem);
            }
        }
        let mut owners: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
        for (handler, _) in &self.handlers {
            if let Some(other) = owners.insert(self.queue_for(handler), handler) {
                problems.push(format!(
                    "handlers `{other}` and `{handler}` would share the queue {:?} (`::` is \
                     written as `.`): rename one",
                    self.queue_for(handler)
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(BusError::InvalidName(problems.join("; ")))
        }
    }
}

/// The queue of `handler` under `prefix`: `<prefix>.<handler>` with `::` written as `.`; the
/// one naming rule, for code that has a prefix but no topology.
pub(crate) fn queue_name(prefix: &str, handler: &str) -> String {
    format!("{prefix}.{}", handler.replace("::", "."))
}

/// The parking queue of `queue`: `<queue>.parked`.
pub(crate) fn parking_queue(queue: &str) -> String {
    format!("{queue}.parked")
}

/// `1s`, `300s`, `250ms`: whole seconds where they are, milliseconds otherwise.
fn tier_label(tier: Duration) -> String {
    if tier.subsec_millis() == 0 && tier.as_secs() > 0 {
        format!("{}s", tier.as_secs())
    } else {
        format!("{}ms", tier.as_millis())
    }
}

fn check_name(name: &str, reserved_checked: bool) -> Result<(), String> {
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "{name:?} is {} bytes long; AMQP names are at most {MAX_NAME_BYTES} bytes \
             (use a shorter prefix or handler name)",
            name.len()
        ));
    }
    if reserved_checked && name.starts_with("amq.") {
        return Err(format!(
            "{name:?} starts with `amq.`, which the broker reserves"
        ));
    }
    Ok(())
}

pub(crate) fn short(name: &str) -> Result<ShortString, BusError> {
    ShortString::try_new(name).map_err(|_| {
        BusError::InvalidName(format!(
            "{name:?} is longer than {MAX_NAME_BYTES} bytes, the AMQP limit"
        ))
    })
}

/// Declares `exchanges`, `queues` and `bindings` (all durable) on a channel of its own. Safe to
/// run again: what exists with the same arguments is left as it is.
pub async fn ensure_topology(
    connection: &RabbitMqConnection,
    exchanges: &[Exchange],
    queues: &[Queue],
    bindings: &[Binding],
) -> Result<(), BusError> {
    let channel = connection.channel().await?;
    for exchange in exchanges {
        channel
            .exchange_declare(
                short(&exchange.name)?,
                exchange.kind.clone(),
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|error| declare_error("exchange", &exchange.name, error))?;
    }
    for queue in queues {
        declare_queue(&channel, queue).await?;
    }
    for binding in bindings {
        channel
            .queue_bind(
                short(&binding.queue)?,
                short(&binding.exchange)?,
                short(&binding.routing_key)?,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|error| declare_error("binding of queue", &binding.queue, error))?;
    }
    let _ = channel.close(200, "topology declared".into()).await;
    Ok(())
}

/// Declares `queue` as [`ensure_topology`] does; how many messages it holds ready.
pub(crate) async fn declare_counted(
    connection: &RabbitMqConnection,
    queue: &Queue,
) -> Result<u32, BusError> {
    let channel = connection.channel().await?;
    let declared = declare_queue(&channel, queue).await?;
    let _ = channel.close(200, "declared".into()).await;
    Ok(declared.message_count())
}

/// The one declare of a [`Queue`]: durable, with its arguments.
async fn declare_queue(channel: &lapin::Channel, queue: &Queue) -> Result<lapin::Queue, BusError> {
    channel
        .queue_declare(
            short(&queue.name)?,
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            queue.arguments(),
        )
        .await
        .map_err(|error| declare_error("queue", &queue.name, error))
}

fn declare_error(what: &str, name: &str, error: lapin::Error) -> BusError {
    let detail = error.to_string();
    if let Some(argument) = inequivalent_argument(&detail) {
        return BusError::Mismatch {
            object: format!("{what} {name:?}"),
            argument,
            detail,
        };
    }
    BusError::transport(format!("declaring {what} {name:?}"), error)
}

/// The argument a `PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue …` names.
fn inequivalent_argument(detail: &str) -> Option<String> {
    let (_, rest) = detail.split_once("inequivalent arg '")?;
    let (argument, _) = rest.split_once('\'')?;
    Some(argument.to_owned())
}

/// `(messages, consumers)` of `queue`, or `None` when the broker has no such queue: a passive
/// declare, which creates nothing and checks no argument. On a channel of its own: a passive
/// declare of a missing queue closes its channel.
pub(crate) async fn inspect_queue(
    connection: &RabbitMqConnection,
    queue: &str,
) -> Result<Option<(u32, u32)>, BusError> {
    let channel = connection.channel().await?;
    let declared = channel
        .queue_declare(
            short(queue)?,
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    match declared {
        Ok(found) => {
            let _ = channel.close(200, "done".into()).await;
            Ok(Some((found.message_count(), found.consumer_count())))
        }
        Err(error) if is_not_found(&error) => Ok(None),
        Err(error) => Err(BusError::transport(
            format!("a passive declare of queue {queue}"),
            error,
        )),
    }
}

/// Whether `queue` exists ([`inspect_queue`]).
pub(crate) async fn queue_exists(
    connection: &RabbitMqConnection,
    queue: &str,
) -> Result<bool, BusError> {
    Ok(inspect_queue(connection, queue).await?.is_some())
}

fn is_not_found(error: &lapin::Error) -> bool {
    matches!(error.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 404)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology() -> Topology {
        Topology {
            exchange: "ex".into(),
            prefix: "p".into(),
            wait_tiers: DEFAULT_WAIT_TIERS.to_vec(),
            delivery_limit: 5,
            parking_max_length: 1000,
            handlers: vec![("shop::reserve".into(), "OrderPlaced".into())],
        }
    }

    /// `queue`'s arguments as `name=value` lines, sorted.
    fn arguments_of(queue: &Queue) -> Vec<String> {
        let mut lines: Vec<String> = queue
            .arguments()
            .inner()
            .iter()
            .map(|(name, value)| {
                let value = match value {
                    AMQPValue::LongString(text) => String::from_utf8_lossy(text.as_bytes()).into(),
                    AMQPValue::LongLongInt(number) => number.to_string(),
                    other => format!("{other:?}"),
                };
                format!("{name}={value}")
            })
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn every_queue_is_quorum_and_the_ones_that_dead_letter_do_it_at_least_once() {
        let topology = topology().wait_tiers([Duration::from_secs(1), Duration::from_secs(2)]);
        let table: [(&str, &[&str]); 4] = [
            (
                "p.wait.1s",
                &[
                    "x-dead-letter-exchange=",
                    "x-dead-letter-strategy=at-least-once",
                    "x-message-ttl=1000",
                    "x-overflow=reject-publish",
                    "x-queue-type=quorum",
                ],
            ),
            (
                "p.wait.2s",
                &[
                    "x-dead-letter-exchange=",
                    "x-dead-letter-strategy=at-least-once",
                    "x-message-ttl=2000",
                    "x-overflow=reject-publish",
                    "x-queue-type=quorum",
                ],
            ),
            (
                "p.shop.reserve.parked",
                &[
                    "x-max-length=1000",
                    "x-overflow=reject-publish",
                    "x-queue-type=quorum",
                ],
            ),
            (
                "p.shop.reserve",
                &[
                    "x-dead-letter-exchange=",
                    "x-dead-letter-routing-key=p.shop.reserve.parked",
                    "x-dead-letter-strategy=at-least-once",
                    "x-delivery-limit=5",
                    "x-overflow=reject-publish",
                    "x-queue-type=quorum",
                ],
            ),
        ];
        let queues = topology.queues();
        let declared: Vec<(&str, Vec<String>)> = queues
            .iter()
            .map(|queue| (queue.name.as_str(), arguments_of(queue)))
            .collect();
        let expected: Vec<(&str, Vec<String>)> = table
            .iter()
            .map(|(name, lines)| (*name, lines.iter().map(|line| (*line).to_owned()).collect()))
            .collect();
        // In this order: a migration moves each dead-letter target before its sources.
        assert_eq!(declared, expected);
    }

    #[test]
    fn a_parking_queue_declared_by_the_worker_has_the_topology_s_bound() {
        let topology = topology().parking_max_length(7);
        assert_eq!(
            arguments_of(&topology.parking_queue_layout("orders.parked")),
            [
                "x-max-length=7",
                "x-overflow=reject-publish",
                "x-queue-type=quorum"
            ]
        );
        assert_eq!(arguments_of(&Queue::classic("plain")), Vec::<String>::new());
    }

    #[test]
    fn the_argument_of_a_precondition_failure_is_read_out_of_the_broker_s_text() {
        let detail = "protocol error: PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' \
                      for queue 'orders.parked' in vhost '/': received none but current is \
                      the value '604800000' of type 'signedint'";
        assert_eq!(
            inequivalent_argument(detail).as_deref(),
            Some("x-message-ttl")
        );
        assert_eq!(inequivalent_argument("NOT_FOUND - no queue 'x'"), None);
    }

    #[test]
    fn a_retry_waits_in_the_shortest_tier_that_is_long_enough() {
        let topology = topology();
        let secs = Duration::from_secs;
        assert_eq!(topology.tier_for(Duration::from_millis(800)), Some(secs(1)));
        assert_eq!(topology.tier_for(secs(1)), Some(secs(1)));
        assert_eq!(
            topology.tier_for(Duration::from_millis(1001)),
            Some(secs(2))
        );
        assert_eq!(topology.tier_for(secs(290)), Some(secs(300)));
        assert_eq!(topology.tier_for(secs(3600)), Some(secs(300)));
        assert_eq!(topology.wait_queue(secs(4)), "p.wait.4s");
        assert_eq!(
            topology.wait_queue(Duration::from_millis(250)),
            "p.wait.250ms"
        );
    }

    #[test]
    fn handler_queues_are_quorum_queues_that_park_over_their_delivery_limit() {
        let queues = topology().queues();
        let queue = queues.iter().find(|q| q.name == "p.shop.reserve").unwrap();
        assert_eq!(queue.kind, QueueKind::Quorum);
        assert_eq!(queue.delivery_limit, Some(5));
        assert_eq!(
            queue.dead_letter_routing_key.as_deref(),
            Some("p.shop.reserve.parked")
        );
        assert!(queues.iter().any(|q| q.name == "p.shop.reserve.parked"));
        let wait = queues.iter().find(|q| q.name == "p.wait.2s").unwrap();
        assert_eq!(wait.message_ttl, Some(Duration::from_secs(2)));
        assert_eq!(wait.dead_letter_exchange.as_deref(), Some(""));
        assert_eq!(wait.dead_letter_routing_key, None);
    }

    #[test]
    fn names_longer_than_amqp_allows_are_rejected_before_declaring() {
        let long = topology().prefix("x".repeat(300));
        let error = long.validate().unwrap_err().to_string();
        assert!(error.contains("at most 255 bytes"), "{error}");
        assert!(topology().validate().is_ok());
        let reserved = topology().exchange("amq.topic");
        assert!(reserved
            .validate()
            .unwrap_err()
            .to_string()
            .contains("amq."));
    }
}
