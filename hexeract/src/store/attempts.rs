//! Calls of records that a broker hands out by position (a Kafka partition's offset), counted
//! in the store before each call: a record that kills its process is called again after the
//! restart with its count going on, and is dead-lettered once the count passes the retry limit,
//! instead of crashing every process that reads its partition.

use futures_util::future::BoxFuture;

use crate::store::StoreError;

/// Where a record is: the consumer group reading it, its topic, partition and offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordPosition<'a> {
    /// The consumer group (one per handler).
    pub group: &'a str,
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// The record's offset in its partition.
    pub offset: i64,
}

/// The calls of the record each consumer group's partition is at, remembered across restarts:
/// one row per group and partition, which follows the partition's records as they are called.
pub trait RecordAttempts: Send + Sync + 'static {
    /// Counts a call of the record at `position`, about to be made, and returns the calls
    /// counted for it so far, this one included: 1 for a record the partition had not reached,
    /// one more for the record it is at (a retry, or a call again after a restart whose call
    /// never finished). A record behind the one the partition is at (read again after a
    /// rebalance, before its commit landed) is not tracked: 1, and nothing changes.
    fn count_call<'a>(
        &'a self,
        position: RecordPosition<'a>,
    ) -> BoxFuture<'a, Result<u32, StoreError>>;

    /// Takes back the call counted for the record at `position` (it was never made, or ended
    /// in a failure while the worker was stopping, which does not count): nothing when the
    /// partition is at another record.
    fn uncount_call<'a>(
        &'a self,
        position: RecordPosition<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// The count [`RecordAttempts::count_call`] returns for `offset`, from the row's offset and
/// calls after the upsert.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn calls_of(offset: i64, row_offset: i64, row_calls: i64) -> u32 {
    if row_offset == offset {
        u32::try_from(row_calls).unwrap_or(u32::MAX)
    } else {
        1
    }
}
