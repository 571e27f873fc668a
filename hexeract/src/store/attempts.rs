//! Calls of records that a broker hands out by position (a Kafka partition's offset), remembered
//! in the store so that a record that kills its process is called again after the restart with
//! its count going on, and is dead-lettered once the count passes the retry limit, instead of
//! crashing every process that reads its partition.
//!
//! Written once per window of records, not per call: a partition's holder writes the window of
//! offsets it is about to call (one row per consumer group and partition) and, where it knows
//! more, the exact count of one record (a record retried, or one it stopped with a call still
//! running). A holder that finds a window its predecessor never closed (the process died) calls
//! the records in it one at a time, each counted exactly before its call.

use futures_util::future::BoxFuture;

use crate::store::StoreError;

/// A consumer group's partition: the group (one per handler), its topic and partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionOf<'a> {
    /// The consumer group.
    pub group: &'a str,
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
}

/// What the store remembers of a partition's calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionCalls {
    /// A record counted exactly: its offset and the calls of it started so far.
    pub counted: Option<(i64, u32)>,
    /// Offsets (first and last, inclusive) whose calls its holder may have started and not seen
    /// settled; empty (`first > last`) once a holder stopped cleanly.
    pub window: (i64, i64),
}

impl PartitionCalls {
    /// No window: nothing in flight.
    pub const CLOSED: (i64, i64) = (0, -1);

    /// Whether `offset` is in the window.
    pub fn in_window(&self, offset: i64) -> bool {
        self.window.0 <= offset && offset <= self.window.1
    }

    /// The calls counted for the record at `offset`, if it is the one counted exactly.
    pub fn calls_of(&self, offset: i64) -> Option<u32> {
        self.counted
            .filter(|(counted, _)| *counted == offset)
            .map(|(_, calls)| calls)
    }
}

/// The calls of each consumer group's partitions, remembered across restarts (one row per
/// group and partition, written by the partition's holder alone).
pub trait RecordAttempts: Send + Sync + 'static {
    /// What the store remembers of `partition`'s calls (`None`: nothing yet).
    fn partition_calls<'a>(
        &'a self,
        partition: PartitionOf<'a>,
    ) -> BoxFuture<'a, Result<Option<PartitionCalls>, StoreError>>;

    /// Remembers `calls` for `partition`, replacing what was there.
    fn remember_partition_calls<'a>(
        &'a self,
        partition: PartitionOf<'a>,
        calls: PartitionCalls,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// The row's columns for `calls`: counted offset (-1 for none), calls, window.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn columns(calls: &PartitionCalls) -> (i64, i64, i64, i64) {
    let (offset, count) = calls.counted.unwrap_or((-1, 0));
    (offset, i64::from(count), calls.window.0, calls.window.1)
}

/// `PartitionCalls` from the row's columns.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn from_columns((offset, count, first, last): (i64, i64, i64, i64)) -> PartitionCalls {
    PartitionCalls {
        counted: (offset >= 0).then(|| (offset, u32::try_from(count).unwrap_or(u32::MAX))),
        window: (first, last),
    }
}
