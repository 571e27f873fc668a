//! Moving a queue that exists with another layout to a new one, without losing a message.
//!
//! A queue's type and arguments cannot change in place: declaring it with others fails with
//! `PRECONDITION_FAILED`. So [`migrate_queue`] moves its messages out to a holding queue,
//! deletes it, declares it anew and moves them back:
//!
//! 1. under a lock (an exclusive queue `<queue>.migrating.lock`, released by the broker when
//!    its connection goes), declare the holding queue `<queue>.migrating` (quorum) and a fanout
//!    exchange of the same name that routes to it: a message published there keeps its
//!    routing key, which a wait tier's dead-lettering depends on;
//! 2. move every message out (taken with a manual ack, republished with a confirm and
//!    `mandatory`, acked only once confirmed), bind the holding queue as the queue is bound
//!    (what is published meanwhile lands in both: a duplicate, never a loss), move what came
//!    in meanwhile, and once the queue is empty and nobody consumes it, delete it;
//! 3. declare it with the new layout and its bindings, point the fanout exchange at it, move
//!    the messages back the same way, unbind and delete the holding queue and its exchange.
//!
//! Every step can be repeated, so a crash at any point is recovered by running the migration
//! again (every start does, through [`Topology::declare`](crate::rabbitmq::Topology::declare)):
//! a holding queue that exists means a migration to finish. Messages may be duplicated (a
//! confirmed copy whose original was not acked yet), never lost; each keeps its body,
//! properties, headers and routing key.
//!
//! A migration is recorded in the journal ([`MIGRATION_JOURNAL`], a quorum queue holding one
//! message per migration under way, its body the queue's name) before its holding queue is
//! declared, and cleared once that is deleted. A start reads the journal once (its length with
//! a declare, and its records when it has some) and looks for the holding queue of a queue only
//! when the journal names it (or cannot be read): a look is a passive declare, and a missing
//! queue answers it by closing the channel, which lapin logs as an error.
//!
//! Reading the records of the journal (to clear one, or to name them) holds them unacked for
//! the moment it takes; a process that reads the journal's length just then finds fewer, and
//! may start without finishing a migration a crash interrupted. The record is not lost: the
//! next start (or `queues upgrade`) finishes it.
//!
//! What a migration cannot stop: a message that enters the queue by the default exchange (a
//! retry coming back from a wait tier) in the instant between its last look at the empty queue
//! and the queue's deletion is deleted with it. The broker's count of them is reported
//! ([`QueueMigration::deleted_with_queue`]) and logged as an error; one routed in the very
//! instant of the deletion is not counted, and its publisher is told it was taken.

use std::time::Duration;

use futures_util::future::join_all;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::ExchangeKind;

use crate::rabbitmq::publisher::RabbitMqPublisher;
use crate::rabbitmq::topology::{ensure_topology, inspect_queue, short};
use crate::rabbitmq::{Binding, BusError, Exchange, Queue, RabbitMqConnection, Topology};

/// Messages taken from a queue before their copies' confirms are awaited.
const BATCH: usize = 128;

/// How long a migration waits for another one of the same queue (elsewhere) to finish.
const LOCK_WAIT: Duration = Duration::from_secs(600);

/// The queue in which [`migrate_queue`] records the migrations under way, one message each whose
/// body is the name of the queue being moved: written (with a confirm) before the holding queue
/// is declared, removed once it is deleted. A crash leaves its record, so the next run looks
/// for the holding queue and finishes the move; with the journal empty, the common case, it
/// looks for none. A quorum queue, declared by the first migration check; a broker policy that
/// gives it a message TTL or a length limit could drop a record, and with it the way to a
/// holding queue.
/// [`Topology::declare`](crate::rabbitmq::Topology::declare) keeps its own journal,
/// `<prefix>@migrations` (this one under the default prefix): `@` is in no handler's queue name.
pub const MIGRATION_JOURNAL: &str = "hexeract@migrations";

/// What one queue's migration did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueMigration {
    /// The queue, now in its new layout.
    pub queue: String,
    /// The holding queue its messages waited in (deleted at the end).
    pub holding: String,
    /// Messages moved from the queue to the holding queue (copies that a crash left behind
    /// included, when a run finishes an interrupted one).
    pub moved_out: u64,
    /// Messages moved from the holding queue back to the queue.
    pub moved_back: u64,
    /// Messages the broker deleted with the old queue: they entered it after its last look,
    /// by the default exchange. 0 unless something published straight to the queue meanwhile.
    pub deleted_with_queue: u32,
}

/// How messages are carried over.
#[derive(Clone, Debug, Default)]
pub(crate) struct MigrationOptions {
    /// The message exchange of the worker's rule "a message without `type` that came through
    /// the message exchange has its routing key as type": applied while moving, since the
    /// moved copy no longer comes from that exchange.
    pub(crate) message_exchange: Option<String>,
    /// The journal the migration is recorded in; [`MIGRATION_JOURNAL`] when `None`.
    pub(crate) journal: Option<String>,
    /// Whether the journal holds a record of this queue, when the caller read it (once for all
    /// its queues: reading the records holds them for a moment, so a read per queue could
    /// miss the record of the next); `None` to read the journal's length.
    pub(crate) recorded: Option<bool>,
}

impl MigrationOptions {
    fn journal(&self) -> &str {
        self.journal.as_deref().unwrap_or(MIGRATION_JOURNAL)
    }
}

/// The holding queue (and fanout exchange) of `queue`'s migration: `<queue>.migrating`.
pub fn holding_queue(queue: &str) -> String {
    format!("{queue}.migrating")
}

/// Moves `queue` to the layout it describes, if it exists with another one, or finishes a
/// migration a crash interrupted; otherwise declares it (when it is missing) and does nothing
/// else. `bindings` are the queue's bindings in its new layout (their exchanges must exist).
/// `Ok(None)` when there was nothing to move.
///
/// Refuses (`BusError::Transport`, nothing moved or deleted) while the old queue has
/// consumers: their unacked deliveries would be deleted with it. Stop the programs that still
/// consume it (an older version), then run it again.
///
/// ```no_run
/// # async fn example(connection: hexeract::rabbitmq::RabbitMqConnection) -> Result<(), hexeract::rabbitmq::BusError> {
/// use hexeract::rabbitmq::{migrate_queue, Binding, Queue};
///
/// // A classic queue of yours becomes a quorum queue, its messages kept.
/// let queue = Queue::quorum("orders.received").at_least_once();
/// let bindings = [Binding {
///     queue: "orders.received".into(),
///     exchange: "orders".into(),
///     routing_key: "OrderPlaced".into(),
/// }];
/// if let Some(moved) = migrate_queue(&connection, &queue, &bindings).await? {
///     println!("{}: {} messages moved", moved.queue, moved.moved_back);
/// }
/// # Ok(())
/// # }
/// ```
pub async fn migrate_queue(
    connection: &RabbitMqConnection,
    queue: &Queue,
    bindings: &[Binding],
) -> Result<Option<QueueMigration>, BusError> {
    let own = connection.sibling("migration").await?;
    let migrated = migrate_queue_with(&own, queue, bindings, &MigrationOptions::default()).await;
    let _ = own.close().await;
    migrated
}

/// [`migrate_queue`] on `connection`, which should be a connection of its own: while the
/// journal holds a record, a missing holding queue is found by a passive declare that closes
/// its channel.
pub(crate) async fn migrate_queue_with(
    connection: &RabbitMqConnection,
    queue: &Queue,
    bindings: &[Binding],
    options: &MigrationOptions,
) -> Result<Option<QueueMigration>, BusError> {
    let holding = holding_queue(&queue.name);
    short(&lock_name(&queue.name))?;
    // The common case, at every start: no migration recorded, the queue as declared. With a
    // record (of this queue or another), a holding queue of this one means a move to finish.
    let journal = options.journal();
    let recorded = match options.recorded {
        Some(recorded) => recorded,
        // Unreadable: look, as if it held records.
        None => journal::records_or_warn(connection, journal)
            .await
            .is_none_or(|records| records > 0),
    };
    if !recorded || inspect_queue(connection, &holding).await?.is_none() {
        match declare(connection, queue).await {
            Ok(()) => {
                if recorded {
                    // A migration of this queue that finished but crashed before clearing
                    // its record leaves the record; nothing is left to move.
                    journal::clear_or_warn(connection, journal, &queue.name).await;
                }
                return Ok(None);
            }
            Err(BusError::Mismatch { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    let lock = Lock::acquire(connection, &queue.name).await?;
    let migrated = Migration {
        connection,
        queue,
        bindings,
        holding,
        options,
    }
    .run()
    .await;
    lock.release().await;
    migrated
}

struct Migration<'a> {
    connection: &'a RabbitMqConnection,
    queue: &'a Queue,
    bindings: &'a [Binding],
    holding: String,
    options: &'a MigrationOptions,
}

impl Migration<'_> {
    async fn run(&self) -> Result<Option<QueueMigration>, BusError> {
        let name = &self.queue.name;
        // Looked at again under the lock: another process may have finished meanwhile.
        let holding_exists = inspect_queue(self.connection, &self.holding)
            .await?
            .is_some();
        let in_new_layout = match declare(self.connection, self.queue).await {
            Ok(()) => true,
            Err(BusError::Mismatch { .. }) => false,
            Err(error) => return Err(error),
        };
        if in_new_layout && !holding_exists {
            journal::clear_or_warn(self.connection, self.options.journal(), name).await;
            return Ok(None);
        }
        journal::record(self.connection, self.options.journal(), name).await?;
        let mut report = QueueMigration {
            queue: name.clone(),
            holding: self.holding.clone(),
            moved_out: 0,
            moved_back: 0,
            deleted_with_queue: 0,
        };
        ensure_topology(
            self.connection,
            &[Exchange {
                name: self.holding.clone(),
                kind: ExchangeKind::Fanout,
            }],
            &[Queue::quorum(self.holding.clone())],
            &[],
        )
        .await?;
        if !in_new_layout {
            tracing::warn!(
                queue = %name,
                holding = %self.holding,
                "the queue exists with another layout; moving its messages to the new one"
            );
            self.route_mover_to(&self.holding, name).await?;
            self.refuse_if_consumed(name).await?;
            report.moved_out += self.move_all(name).await?;
            // From here on what is published for the queue lands in the holding queue too.
            for binding in self.bindings {
                self.bind(&self.holding, binding).await?;
            }
            loop {
                report.moved_out += self.move_all(name).await?;
                let (messages, _) = self.refuse_if_consumed(name).await?;
                if messages == 0 {
                    break;
                }
            }
            report.deleted_with_queue = self.delete_queue(name).await?;
            if report.deleted_with_queue > 0 {
                tracing::error!(
                    queue = %name,
                    deleted = report.deleted_with_queue,
                    "messages entered the queue by the default exchange after its last look and \
                     were deleted with it"
                );
            }
        }
        ensure_topology(
            self.connection,
            &[],
            std::slice::from_ref(self.queue),
            self.bindings,
        )
        .await?;
        self.route_mover_to(name, &self.holding).await?;
        report.moved_back += self.move_all(&self.holding).await?;
        for binding in self.bindings {
            self.unbind(&self.holding, binding).await?;
        }
        loop {
            report.moved_back += self.move_all(&self.holding).await?;
            match inspect_queue(self.connection, &self.holding).await? {
                Some((0, _)) | None => break,
                Some(_) => {}
            }
        }
        // Unbound and empty, under the lock: nothing can enter it any more.
        self.delete_queue(&self.holding).await?;
        let channel = self.connection.channel().await?;
        channel
            .exchange_delete(short(&self.holding)?, ExchangeDeleteOptions::default())
            .await
            .map_err(|error| BusError::transport("deleting a migration's exchange", error))?;
        let _ = channel.close(200, "migrated".into()).await;
        // Moved: a record left behind only makes the next start look again.
        journal::clear_or_warn(self.connection, self.options.journal(), name).await;
        tracing::info!(
            queue = %name,
            moved_out = report.moved_out,
            moved_back = report.moved_back,
            "queue migrated to its new layout"
        );
        Ok(Some(report))
    }

    /// `(messages, consumers)` of `queue`; an error while anyone consumes it.
    async fn refuse_if_consumed(&self, queue: &str) -> Result<(u32, u32), BusError> {
        let (messages, consumers) = inspect_queue(self.connection, queue)
            .await?
            .unwrap_or((0, 0));
        if consumers > 0 {
            return Err(BusError::Transport {
                operation: format!("migrating queue {queue:?} to its new layout"),
                detail: format!(
                    "{consumers} consumer(s) still read it (a program of an older version?): \
                     its unacked deliveries would be deleted with it; stop them, and the \
                     migration runs at the next start (or with the `queues upgrade` command)"
                ),
            });
        }
        Ok((messages, consumers))
    }

    /// The fanout exchange of the migration routes to `to` alone.
    async fn route_mover_to(&self, to: &str, from: &str) -> Result<(), BusError> {
        let mover = |queue: &str| Binding {
            queue: queue.to_owned(),
            exchange: self.holding.clone(),
            routing_key: String::new(),
        };
        // Unbinding what is not bound is accepted; a queue that is not there yet is not.
        if inspect_queue(self.connection, from).await?.is_some() {
            self.unbind(from, &mover(from)).await?;
        }
        self.bind(to, &mover(to)).await
    }

    async fn bind(&self, queue: &str, binding: &Binding) -> Result<(), BusError> {
        let channel = self.connection.channel().await?;
        channel
            .queue_bind(
                short(queue)?,
                short(&binding.exchange)?,
                short(&binding.routing_key)?,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|error| BusError::transport(format!("binding queue {queue:?}"), error))?;
        let _ = channel.close(200, "bound".into()).await;
        Ok(())
    }

    async fn unbind(&self, queue: &str, binding: &Binding) -> Result<(), BusError> {
        let channel = self.connection.channel().await?;
        channel
            .queue_unbind(
                short(queue)?,
                short(&binding.exchange)?,
                short(&binding.routing_key)?,
                FieldTable::default(),
            )
            .await
            .map_err(|error| BusError::transport(format!("unbinding queue {queue:?}"), error))?;
        let _ = channel.close(200, "unbound".into()).await;
        Ok(())
    }

    /// Deletes `queue`; the messages the broker deleted with it.
    async fn delete_queue(&self, queue: &str) -> Result<u32, BusError> {
        let channel = self.connection.channel().await?;
        let deleted = channel
            .queue_delete(short(queue)?, QueueDeleteOptions::default())
            .await
            .map_err(|error| BusError::transport(format!("deleting queue {queue:?}"), error))?;
        let _ = channel.close(200, "deleted".into()).await;
        Ok(deleted)
    }

    /// Moves every message of `from` through the migration's fanout exchange, each acked in
    /// `from` only once its copy is confirmed; how many.
    async fn move_all(&self, from: &str) -> Result<u64, BusError> {
        let channel = self.connection.channel().await?;
        let publisher = RabbitMqPublisher::new(self.connection).await?;
        let mut moved = 0;
        loop {
            let mut batch = Vec::with_capacity(BATCH);
            while batch.len() < BATCH {
                let got = channel
                    .basic_get(short(from)?, BasicGetOptions { no_ack: false })
                    .await
                    .map_err(|error| {
                        BusError::transport(format!("basic.get from {from:?}"), error)
                    })?;
                match got {
                    Some(message) => batch.push(message.delivery),
                    None => break,
                }
            }
            let Some(last) = batch.last().map(|delivery| delivery.delivery_tag) else {
                break;
            };
            let copies = batch.iter().map(|delivery| {
                let mut properties = delivery.properties.clone();
                if properties.kind().is_none()
                    && self.options.message_exchange.as_deref() == Some(delivery.exchange.as_str())
                {
                    properties = properties
                        .with_type(ShortString::from(delivery.routing_key.as_str().to_owned()));
                }
                publisher.publish_raw(
                    &self.holding,
                    delivery.routing_key.as_str(),
                    &delivery.data,
                    properties,
                    true,
                )
            });
            let confirmed = join_all(copies).await;
            if let Some(error) = confirmed.into_iter().find_map(Result::err) {
                // Back where they were; some may now be in both places.
                let _ = channel
                    .basic_nack(
                        last,
                        BasicNackOptions {
                            multiple: true,
                            requeue: true,
                        },
                    )
                    .await;
                let _ = channel.close(200, "move failed".into()).await;
                return Err(error);
            }
            channel
                .basic_ack(last, BasicAckOptions { multiple: true })
                .await
                .map_err(|error| BusError::transport(format!("basic.ack in {from:?}"), error))?;
            moved += batch.len() as u64;
        }
        let _ = channel.close(200, "moved".into()).await;
        publisher.close().await;
        Ok(moved)
    }
}

/// The records of a migration journal ([`MIGRATION_JOURNAL`]).
mod journal {
    use lapin::options::{BasicAckOptions, BasicGetOptions};
    use lapin::BasicProperties;

    use crate::rabbitmq::publisher::RabbitMqPublisher;
    use crate::rabbitmq::topology::{declare_counted, short};
    use crate::rabbitmq::{BusError, Queue, RabbitMqConnection};

    /// How many migrations `journal` records, declaring it (a quorum queue) if it is not there
    /// yet: a declare that creates what is missing, so it never closes its channel. Records
    /// another process holds unacked while it reads them are not counted.
    pub(super) async fn records(
        connection: &RabbitMqConnection,
        journal: &str,
    ) -> Result<u32, BusError> {
        declare_counted(connection, &Queue::quorum(journal)).await
    }

    /// [`records`], or `None` when the journal cannot be read (its node down, or declared with
    /// other arguments), which is logged: the caller then looks for every holding queue.
    pub(super) async fn records_or_warn(
        connection: &RabbitMqConnection,
        journal: &str,
    ) -> Option<u32> {
        match records(connection, journal).await {
            Ok(records) => Some(records),
            Err(error) => {
                tracing::warn!(
                    %journal,
                    %error,
                    "the migration journal cannot be read; looking for a holding queue of each \
                     queue"
                );
                None
            }
        }
    }

    /// [`clear`], a failure logged: a record left behind only makes the next start look for
    /// the queue's holding queue again, and clear it then.
    pub(super) async fn clear_or_warn(connection: &RabbitMqConnection, journal: &str, queue: &str) {
        if let Err(error) = clear(connection, journal, queue).await {
            tracing::warn!(
                %journal,
                queue,
                %error,
                "could not clear the migration's record; the next start looks for its holding \
                 queue again"
            );
        }
    }

    /// Records that `queue` is being moved, confirmed before this returns.
    pub(super) async fn record(
        connection: &RabbitMqConnection,
        journal: &str,
        queue: &str,
    ) -> Result<(), BusError> {
        records(connection, journal).await?;
        let publisher = RabbitMqPublisher::new(connection).await?;
        let recorded = publisher
            .publish_raw(
                "",
                journal,
                queue.as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
                true,
            )
            .await;
        publisher.close().await;
        recorded
    }

    /// Removes every record of `queue`; the others go back to the journal when the channel
    /// closes.
    pub(super) async fn clear(
        connection: &RabbitMqConnection,
        journal: &str,
        queue: &str,
    ) -> Result<(), BusError> {
        let channel = connection.channel().await?;
        while let Some(message) = take(&channel, journal).await? {
            if message.delivery.data == queue.as_bytes() {
                channel
                    .basic_ack(message.delivery.delivery_tag, BasicAckOptions::default())
                    .await
                    .map_err(|error| BusError::transport("clearing a migration's record", error))?;
            }
        }
        let _ = channel.close(200, "cleared".into()).await;
        Ok(())
    }

    /// The queues `journal` holds records of, each once; the records stay.
    pub(super) async fn names(
        connection: &RabbitMqConnection,
        journal: &str,
    ) -> Result<Vec<String>, BusError> {
        let channel = connection.channel().await?;
        let mut names = Vec::new();
        while let Some(message) = take(&channel, journal).await? {
            let name = String::from_utf8_lossy(&message.delivery.data).into_owned();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let _ = channel.close(200, "read".into()).await;
        Ok(names)
    }

    /// The next record not yet taken on `channel`, unacked.
    async fn take(
        channel: &lapin::Channel,
        journal: &str,
    ) -> Result<Option<lapin::message::BasicGetMessage>, BusError> {
        channel
            .basic_get(short(journal)?, BasicGetOptions { no_ack: false })
            .await
            .map_err(|error| BusError::transport("reading the migration journal", error))
    }
}

async fn declare(connection: &RabbitMqConnection, queue: &Queue) -> Result<(), BusError> {
    ensure_topology(connection, &[], std::slice::from_ref(queue), &[]).await
}

fn lock_name(queue: &str) -> String {
    format!("{}.lock", holding_queue(queue))
}

/// One migration of a queue at a time, across processes: an exclusive queue, which the broker
/// deletes when the connection that holds it goes (a crash releases it).
struct Lock {
    channel: lapin::Channel,
    name: String,
}

impl Lock {
    async fn acquire(connection: &RabbitMqConnection, queue: &str) -> Result<Lock, BusError> {
        let name = lock_name(queue);
        let deadline = tokio::time::Instant::now() + LOCK_WAIT;
        let mut logged = false;
        loop {
            let channel = connection.channel().await?;
            let declared = channel
                .queue_declare(
                    short(&name)?,
                    QueueDeclareOptions {
                        exclusive: true,
                        auto_delete: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await;
            match declared {
                Ok(_) => return Ok(Lock { channel, name }),
                Err(error) if is_locked(&error) && tokio::time::Instant::now() < deadline => {
                    if !logged {
                        tracing::info!(%queue, "another process is migrating the queue; waiting");
                        logged = true;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(error) => {
                    return Err(BusError::transport(
                        format!("taking the migration lock {name:?}"),
                        error,
                    ))
                }
            }
        }
    }

    async fn release(self) {
        let _ = self
            .channel
            .queue_delete(ShortString::from(self.name), QueueDeleteOptions::default())
            .await;
        let _ = self.channel.close(200, "migrated".into()).await;
    }
}

/// `RESOURCE_LOCKED`: another connection holds the exclusive queue.
fn is_locked(error: &lapin::Error) -> bool {
    matches!(error.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 405)
}

/// Declaring a topology moves its queues of an older layout first: here, beside the migration
/// it runs, so that the topology (which the metrics and the publisher use) depends on nothing
/// of the migration's.
impl Topology {
    /// Declares everything with [`ensure_topology`](crate::rabbitmq::ensure_topology), first moving to this layout every queue
    /// that exists with another one (or whose migration a crash interrupted): see
    /// [`migrate_queue`](crate::rabbitmq::migrate_queue).
    pub async fn declare(&self, connection: &RabbitMqConnection) -> Result<(), BusError> {
        self.validate()?;
        ensure_topology(connection, &self.exchanges(), &[], &[]).await?;
        self.upgrade(connection, |_| true).await?;
        ensure_topology(
            connection,
            &self.exchanges(),
            &self.queues(),
            &self.bindings(),
        )
        .await
    }

    /// Moves to this layout every queue of `self.queues()` that `which` selects and that
    /// exists with another layout or was left half-moved by a crash; the exchanges must exist.
    /// One report per queue moved.
    pub(crate) async fn upgrade(
        &self,
        connection: &RabbitMqConnection,
        which: impl Fn(&Queue) -> bool,
    ) -> Result<Vec<QueueMigration>, BusError> {
        let bindings = self.bindings();
        let own = connection.sibling("migration").await?;
        let moved = self.upgrade_on(&own, &bindings, which).await;
        let _ = own.close().await;
        moved
    }

    async fn upgrade_on(
        &self,
        connection: &RabbitMqConnection,
        bindings: &[Binding],
        which: impl Fn(&Queue) -> bool,
    ) -> Result<Vec<QueueMigration>, BusError> {
        // The journal's records, read once: `None` when it cannot be read (then each queue
        // looks for its holding queue).
        let journal = self.migration_journal();
        let records = match journal::records_or_warn(connection, &journal).await {
            Some(0) => Some(Vec::new()),
            Some(_) => journal::names(connection, &journal).await.ok(),
            None => None,
        };
        let queues = self.queues();
        let mut moved = Vec::new();
        for queue in queues.iter().filter(|queue| which(queue)) {
            let own: Vec<Binding> = bindings
                .iter()
                .filter(|binding| binding.queue == queue.name)
                .cloned()
                .collect();
            let options = MigrationOptions {
                message_exchange: Some(self.exchange.clone()),
                journal: Some(journal.clone()),
                recorded: Some(
                    records
                        .as_ref()
                        .is_none_or(|names| names.contains(&queue.name)),
                ),
            };
            if let Some(report) = migrate_queue_with(connection, queue, &own, &options).await? {
                moved.push(report);
            }
        }
        let others: Vec<&String> = records
            .iter()
            .flatten()
            .filter(|name| !queues.iter().any(|queue| queue.name == **name))
            .collect();
        if !others.is_empty() {
            tracing::warn!(
                %journal,
                queues = ?others,
                "the migration journal records moves of queues this program does not declare: \
                 another program's migration under way, or an interrupted one of a queue no \
                 longer used, whose messages may wait in `<queue>.migrating` (`queues upgrade` \
                 in a program that declares the queue finishes it)"
            );
        }
        Ok(moved)
    }

    /// Moves every queue of this topology that exists with another layout to this one (the
    /// exchanges are declared first); what the `queues upgrade` command runs. One report per
    /// queue moved; a queue already in this layout is left alone.
    pub async fn migrate(
        &self,
        connection: &RabbitMqConnection,
    ) -> Result<Vec<QueueMigration>, BusError> {
        self.validate()?;
        ensure_topology(connection, &self.exchanges(), &[], &[]).await?;
        self.upgrade(connection, |_| true).await
    }
}
