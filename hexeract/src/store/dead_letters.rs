//! The dead letters' capability ([`DeadLetterStore`]) and how its queries are put: which
//! letters ([`DeadLetterFilter`]) and which page of them ([`Page`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use uuid::Uuid;

use crate::dead_letter::DeadLetter;
use crate::envelope::Envelope;
use crate::store::StoreError;

/// A store's dead letters: recorded, found, replayed and deleted. Workers that park on a broker
/// record theirs here; the operations commands and `run`'s retention use the rest. Filters and
/// pages are applied by the database (indexes on the time, the handler and the reason), so a
/// table of millions is read a page at a time.
pub trait DeadLetterStore: Send + Sync + 'static {
    /// Records a dead letter that did not come from this store's deliveries: a message a broker
    /// worker parked. Recording the same letter (same id) twice keeps one.
    fn insert_dead_letter<'a>(
        &'a self,
        letter: &'a DeadLetter,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The dead letter with this id, if there is one.
    fn find_dead_letter(&self, id: Uuid) -> BoxFuture<'_, Result<Option<DeadLetter>, StoreError>>;

    /// One page of the dead letters `filter` matches, in the page's order (by when they were
    /// dead-lettered, then by id).
    fn dead_letters_matching<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
        page: &'a Page,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, StoreError>>;

    /// How many dead letters `filter` matches.
    fn count_dead_letters<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Deletes, in one statement, every dead letter `filter` matches (every one for an empty
    /// filter); returns how many it deleted.
    fn purge_dead_letters_matching<'a>(
        &'a self,
        filter: &'a DeadLetterFilter,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Dead letters, oldest first, at most `limit`.
    fn dead_letters(&self, limit: u32) -> BoxFuture<'_, Result<Vec<DeadLetter>, StoreError>> {
        Box::pin(async move {
            let page = Page::oldest_first(limit);
            self.dead_letters_matching(&DeadLetterFilter::default(), &page)
                .await
        })
    }

    /// Sends a dead letter back to its handler with attempts reset (to every handler of its
    /// type when it had none); a scheduled job's failed run goes back to the scheduler and runs
    /// again as that job ([`ScheduleStore::replay_occurrence`](crate::store::ScheduleStore::replay_occurrence)).
    /// `false` when there is no dead letter with this id.
    fn replay_dead_letter(&self, id: Uuid) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// Writes `envelope` (a dead letter's message, changed for its way back: attempts reset,
    /// the handler it is for) to the outbox and deletes the dead letter `id`, in one
    /// transaction: the letter leaves only when its message is in the outbox, from where the
    /// relay publishes it (deleting the row once the broker acknowledged it). `false`, and
    /// nothing written, when there is no dead letter with this id. How `dead-letters replay`
    /// sends a letter back through a relay (Kafka).
    fn replay_dead_letter_as<'a>(
        &'a self,
        id: Uuid,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Deletes the dead letters with these ids (an id with none is skipped) in one statement
    /// and returns how many it deleted.
    fn delete_dead_letters<'a>(&'a self, ids: &'a [Uuid])
        -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Deletes one dead letter (once it was replayed some other way, say to a broker);
    /// `false` when there is none with this id.
    fn delete_dead_letter(&self, id: Uuid) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move { Ok(self.delete_dead_letters(&[id]).await? == 1) })
    }

    /// Deletes every dead letter; returns how many there were.
    fn purge_dead_letters(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            self.purge_dead_letters_matching(&DeadLetterFilter::default())
                .await
        })
    }

    /// Deletes the dead letters older than `age` (by when they were dead-lettered, on the
    /// database's clock) and returns how many; what `run`'s retention task does with
    /// `DEAD_LETTER_RETENTION_DAYS`.
    fn purge_dead_letters_before(&self, age: Duration) -> BoxFuture<'_, Result<u64, StoreError>>;
}

/// Which dead letters a query, a count or a purge takes: every condition set must hold; none
/// set takes them all.
///
/// ```
/// use hexeract::store::DeadLetterFilter;
///
/// let week_old_timeouts = DeadLetterFilter::default()
///     .reason("handler_timeout")
///     .before(chrono::Utc::now() - chrono::Duration::days(7));
/// assert!(!week_old_timeouts.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetterFilter {
    /// Dead-lettered for this handler (or scheduled job).
    pub handler: Option<String>,
    /// With this reason (`handler_timeout`, `payload_invalid`…).
    pub reason: Option<String>,
    /// Dead-lettered before this moment.
    pub before: Option<DateTime<Utc>>,
}

impl DeadLetterFilter {
    /// Only the dead letters of `handler`.
    pub fn handler(mut self, handler: impl Into<String>) -> DeadLetterFilter {
        self.handler = Some(handler.into());
        self
    }

    /// Only the dead letters with `reason`.
    pub fn reason(mut self, reason: impl Into<String>) -> DeadLetterFilter {
        self.reason = Some(reason.into());
        self
    }

    /// Only the dead letters dead-lettered before `moment`.
    pub fn before(mut self, moment: DateTime<Utc>) -> DeadLetterFilter {
        self.before = Some(moment);
        self
    }

    /// `true` when it sets no condition: it takes every dead letter.
    pub fn is_empty(&self) -> bool {
        self.handler.is_none() && self.reason.is_none() && self.before.is_none()
    }

    /// Whether `letter` meets the filter: what the stores' queries ask the database.
    pub fn matches(&self, letter: &DeadLetter) -> bool {
        self.handler
            .as_deref()
            .is_none_or(|handler| letter.handler.as_deref() == Some(handler))
            && self
                .reason
                .as_deref()
                .is_none_or(|reason| letter.reason.as_str() == reason)
            && self
                .before
                .is_none_or(|moment| letter.dead_lettered_at < moment)
    }
}

/// One page of dead letters: at most `limit` of them, ordered by when they were dead-lettered
/// (then by id), oldest or newest first, starting after a cursor (the last letter of the page
/// before: pages stay right while letters come and go).
///
/// ```
/// use hexeract::store::{DeadLetterFilter, DeadLetterStore, Page};
///
/// # async fn example(store: &dyn DeadLetterStore) -> Result<(), hexeract::store::StoreError> {
/// let filter = DeadLetterFilter::default().handler("shop::reserve_stock");
/// let mut page = Page::oldest_first(500);
/// loop {
///     let letters = store.dead_letters_matching(&filter, &page).await?;
///     for letter in &letters {
///         println!("{} {}", letter.id, letter.reason);
///     }
///     match letters.last() {
///         Some(last) if letters.len() == 500 => page = page.after(last),
///         _ => break,
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// At most this many letters.
    pub limit: u32,
    /// Newest first instead of oldest first.
    pub newest_first: bool,
    /// Start after this letter's `(dead_lettered_at, id)`, in the page's order.
    pub after: Option<(DateTime<Utc>, Uuid)>,
}

impl Page {
    /// The oldest `limit` letters.
    pub fn oldest_first(limit: u32) -> Page {
        Page {
            limit,
            newest_first: false,
            after: None,
        }
    }

    /// The newest `limit` letters, newest first.
    pub fn newest_first(limit: u32) -> Page {
        Page {
            limit,
            newest_first: true,
            after: None,
        }
    }

    /// The next page: the letters after `last`, the last letter of this one.
    pub fn after(mut self, last: &DeadLetter) -> Page {
        self.after = Some((last.dead_lettered_at, last.id));
        self
    }
}

/// The SQL of the dead-letter queries on `table`, for a database whose placeholders are `mark`
/// and a number (`$1`, `?1`). Only the conditions set are written, so that the planner sees each
/// query as it is and takes the index it fits (by time, by handler, by reason). The values are
/// bound in this order: handler, reason, `before`, the cursor's time and id, then a page's
/// limit.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) struct DeadLetterSql {
    pub(crate) table: String,
    pub(crate) mark: char,
}

#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
impl DeadLetterSql {
    /// A page of letters, with `columns` after the letter's own.
    pub(crate) fn select(&self, columns: &str, filter: &DeadLetterFilter, page: &Page) -> String {
        let (conditions, used) = self.conditions(filter, Some(page));
        let order = if page.newest_first { "DESC" } else { "ASC" };
        format!(
            "SELECT id, message_id, handler, reason, detail, attempts, dead_lettered_at, {columns}
             FROM {table} {conditions}
             ORDER BY dead_lettered_at {order}, id {order}
             LIMIT {mark}{limit}",
            table = self.table,
            mark = self.mark,
            limit = used + 1,
        )
    }

    /// How many letters match.
    pub(crate) fn count(&self, filter: &DeadLetterFilter) -> String {
        let (conditions, _) = self.conditions(filter, None);
        format!("SELECT count(*) FROM {} {conditions}", self.table)
    }

    /// Deletes the letters that match.
    pub(crate) fn purge(&self, filter: &DeadLetterFilter) -> String {
        let (conditions, _) = self.conditions(filter, None);
        format!("DELETE FROM {} {conditions}", self.table)
    }

    /// The `WHERE` of `filter` and of `page`'s cursor (empty without a condition), and how many
    /// placeholders it used.
    fn conditions(&self, filter: &DeadLetterFilter, page: Option<&Page>) -> (String, usize) {
        let mark = self.mark;
        let mut conditions = Vec::new();
        let mut used = 0;
        let mut next = || {
            used += 1;
            format!("{mark}{used}")
        };
        if filter.handler.is_some() {
            conditions.push(format!("handler = {}", next()));
        }
        if filter.reason.is_some() {
            conditions.push(format!("reason = {}", next()));
        }
        if filter.before.is_some() {
            conditions.push(format!("dead_lettered_at < {}", next()));
        }
        if let Some(page) = page.filter(|page| page.after.is_some()) {
            let past = if page.newest_first { "<" } else { ">" };
            let (at, id) = (next(), next());
            conditions.push(format!("(dead_lettered_at, id) {past} ({at}, {id})"));
        }
        if conditions.is_empty() {
            (String::new(), used)
        } else {
            (format!("WHERE {}", conditions.join(" AND ")), used)
        }
    }
}

/// The [`DeadLetterStore`] methods whose text is the same on every database: a query from
/// [`DeadLetterSql`], its values bound by the backend's `bind_matching`, its rows read by the
/// backend's `dead_letter_from_row`. Expanded inside each backend's `impl DeadLetterStore`,
/// where those names (and `limit`, `MESSAGE_COLUMNS`, `dead_letter_sql`) are the backend's own:
/// sqlx has no trait that would let one generic function bind and read for both.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! dead_letter_queries {
    () => {
        fn dead_letters_matching<'a>(
            &'a self,
            filter: &'a DeadLetterFilter,
            page: &'a Page,
        ) -> BoxFuture<'a, Result<Vec<DeadLetter>, StoreError>> {
            Box::pin(async move {
                let sql = self.dead_letter_sql().select(MESSAGE_COLUMNS, filter, page);
                let rows = bind_matching(sqlx::query(&sql), filter, Some(page))
                    .bind(limit(page.limit))
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(dead_letter_from_row).collect()
            })
        }

        fn count_dead_letters<'a>(
            &'a self,
            filter: &'a DeadLetterFilter,
        ) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async move {
                let sql = self.dead_letter_sql().count(filter);
                let count: i64 = bind_matching(sqlx::query(&sql), filter, None)
                    .fetch_one(&self.pool)
                    .await?
                    .try_get(0)?;
                Ok(u64::try_from(count).unwrap_or(0))
            })
        }

        fn purge_dead_letters_matching<'a>(
            &'a self,
            filter: &'a DeadLetterFilter,
        ) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async move {
                let sql = self.dead_letter_sql().purge(filter);
                let done = bind_matching(sqlx::query(&sql), filter, None)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected())
            })
        }
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) use dead_letter_queries;
