//! The chaos suite's ledger: every handler call recorded, then every message sorted into
//! exactly one terminal state, the way RabbitMQ's Jepsen checker sorts a queue's history.
//!
//! A scenario publishes messages with ids it keeps (`sent`), each owed to one or more handlers.
//! Its handlers record each call (`message id, handler, attempt, outcome, pid`) in a `ledger`
//! table of the test's schema, each in a short transaction of its own, so a call's record
//! survives a process that is killed right after it. Once everything is drained, [`classify`]
//! looks at every (message, handler) pair:
//!
//! - **handled**: at least one call ended `ok`, and the pair is not dead-lettered;
//! - **dead-lettered**: the store (or a parking queue) holds it, with a reason;
//! - **lost**: sent, but neither handled nor dead-lettered;
//! - **unexpected**: handled or dead-lettered, but never sent;
//! - **both**: handled *and* dead-lettered: a pair must end in exactly one terminal state.
//!
//! Pass is 0 lost, 0 unexpected, 0 in both states. Calls beyond the first `ok` of a pair are
//! duplicates: at-least-once allows them, so they are counted and printed, not failures.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use sqlx::PgPool;
use uuid::Uuid;

/// One handler call as the ledger recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub message_id: Uuid,
    pub handler: String,
    pub attempt: i32,
    /// Whether the call returned success (the handler's own view; the ack may still be lost).
    pub ok: bool,
    /// The process that made the call.
    pub pid: i32,
}

impl Call {
    /// A successful call of `handler` on the message `ctx` is for, by this process.
    pub fn ok(ctx: &hexeract::Context, handler: &str) -> Call {
        Call {
            message_id: ctx.message_id(),
            handler: handler.to_owned(),
            attempt: i32::try_from(ctx.attempt()).unwrap_or(i32::MAX),
            ok: true,
            pid: i32::try_from(std::process::id()).unwrap_or(-1),
        }
    }
}

/// A (message, handler) pair that ended dead-lettered (or parked), with the reason given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLettered {
    pub message_id: Uuid,
    pub handler: String,
    pub reason: String,
}

/// A (message, handler) pair: the unit that ends in a terminal state.
pub type Pair = (Uuid, String);

/// What [`classify`] found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Pairs owed: sent messages × their handlers.
    pub sent: usize,
    pub handled: usize,
    /// Dead-lettered pairs by reason.
    pub dead_lettered: BTreeMap<String, usize>,
    pub lost: Vec<Pair>,
    pub unexpected: Vec<Pair>,
    /// Pairs both handled and dead-lettered.
    pub both: Vec<Pair>,
    /// Pairs dead-lettered more than once (one dead letter per pair is the contract).
    pub dead_lettered_twice: Vec<Pair>,
    /// Calls recorded, in all.
    pub calls: usize,
    /// `ok` calls beyond the first of their pair.
    pub duplicates: usize,
    /// The highest attempt number seen.
    pub max_attempt: i32,
    /// Processes that recorded at least one call.
    pub processes: usize,
}

impl Verdict {
    /// Dead-lettered pairs, all reasons together.
    pub fn dead_lettered_total(&self) -> usize {
        self.dead_lettered.values().sum()
    }

    /// Whether every pair ended in exactly one terminal state and nothing came from nowhere.
    pub fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.unexpected.is_empty()
            && self.both.is_empty()
            && self.dead_lettered_twice.is_empty()
    }

    /// Prints the figures on one line, `scenario=<name> …`, and panics with the first few
    /// offending pairs when the verdict is not a pass.
    #[track_caller]
    pub fn assert_pass(&self, scenario: &str) {
        println!("scenario={scenario} {self}");
        assert!(
            self.passed(),
            "{scenario}: lost {} (e.g. {:?}), unexpected {} (e.g. {:?}), handled and \
             dead-lettered {} (e.g. {:?}), dead-lettered twice {} (e.g. {:?})",
            self.lost.len(),
            first(&self.lost),
            self.unexpected.len(),
            first(&self.unexpected),
            self.both.len(),
            first(&self.both),
            self.dead_lettered_twice.len(),
            first(&self.dead_lettered_twice),
        );
    }
}

fn first(pairs: &[Pair]) -> &[Pair] {
    &pairs[..pairs.len().min(3)]
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sent={} handled={} dead_lettered={} lost={} unexpected={} both={} calls={} \
             duplicates={} max_attempt={} processes={}",
            self.sent,
            self.handled,
            self.dead_lettered_total(),
            self.lost.len(),
            self.unexpected.len(),
            self.both.len(),
            self.calls,
            self.duplicates,
            self.max_attempt,
            self.processes,
        )?;
        for (reason, count) in &self.dead_lettered {
            write!(f, " dead_lettered[{reason}]={count}")?;
        }
        Ok(())
    }
}

/// Sorts every pair of `sent` × `handlers` (and every pair seen that was not sent) into its
/// terminal state. See the module documentation.
pub fn classify(
    sent: &[Uuid],
    handlers: &[&str],
    calls: &[Call],
    dead_letters: &[DeadLettered],
) -> Verdict {
    let owed: HashSet<(Uuid, &str)> = sent
        .iter()
        .flat_map(|id| handlers.iter().map(move |handler| (*id, *handler)))
        .collect();
    let mut ok_calls: HashMap<(Uuid, &str), usize> = HashMap::new();
    for call in calls.iter().filter(|call| call.ok) {
        *ok_calls
            .entry((call.message_id, call.handler.as_str()))
            .or_default() += 1;
    }
    let mut dead: HashMap<(Uuid, &str), Vec<&str>> = HashMap::new();
    for letter in dead_letters {
        dead.entry((letter.message_id, letter.handler.as_str()))
            .or_default()
            .push(letter.reason.as_str());
    }

    let mut verdict = Verdict {
        sent: owed.len(),
        calls: calls.len(),
        max_attempt: calls.iter().map(|call| call.attempt).max().unwrap_or(0),
        processes: calls
            .iter()
            .map(|call| call.pid)
            .collect::<HashSet<_>>()
            .len(),
        duplicates: ok_calls.values().map(|n| n - 1).sum(),
        ..Verdict::default()
    };
    let pair = |(id, handler): (Uuid, &str)| (id, handler.to_owned());
    for &key in &owed {
        match (ok_calls.contains_key(&key), dead.get(&key)) {
            (true, None) => verdict.handled += 1,
            (false, Some(reasons)) => {
                *verdict
                    .dead_lettered
                    .entry(reasons[0].to_owned())
                    .or_default() += 1;
            }
            (true, Some(_)) => verdict.both.push(pair(key)),
            (false, None) => verdict.lost.push(pair(key)),
        }
        if dead.get(&key).is_some_and(|reasons| reasons.len() > 1) {
            verdict.dead_lettered_twice.push(pair(key));
        }
    }
    let seen = ok_calls.keys().chain(dead.keys());
    let mut unexpected: Vec<Pair> = seen
        .filter(|key| !owed.contains(key))
        .map(|&key| pair(key))
        .collect();
    unexpected.sort();
    unexpected.dedup();
    verdict.unexpected = unexpected;
    verdict.lost.sort();
    verdict.both.sort();
    verdict
}

/// The ledger table in `schema`.
pub fn table(schema: &str) -> String {
    format!("\"{schema}\".ledger")
}

/// Creates the ledger table in `schema`.
pub async fn create(pool: &PgPool, schema: &str) {
    sqlx::query(&format!(
        "CREATE TABLE {} (
             id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             message_id uuid NOT NULL,
             handler text NOT NULL,
             attempt integer NOT NULL,
             ok boolean NOT NULL DEFAULT true,
             pid integer NOT NULL,
             at timestamptz NOT NULL DEFAULT clock_timestamp()
         )",
        table(schema)
    ))
    .execute(pool)
    .await
    .expect("create the ledger");
}

/// The statement a handler records a call with: binds message id, handler, attempt, ok, pid.
pub fn insert_statement(schema: &str) -> String {
    format!(
        "INSERT INTO {} (message_id, handler, attempt, ok, pid) VALUES ($1, $2, $3, $4, $5)",
        table(schema)
    )
}

/// Records one call in a transaction of its own.
pub async fn record(
    pool: &PgPool,
    schema: &str,
    message_id: Uuid,
    handler: &str,
    attempt: u32,
    ok: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query(&insert_statement(schema))
        .bind(message_id)
        .bind(handler)
        .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
        .bind(ok)
        .bind(i32::try_from(std::process::id()).unwrap_or(-1))
        .execute(pool)
        .await
        .map(drop)
}

/// Every recorded call, in the order recorded.
pub async fn calls(pool: &PgPool, schema: &str) -> Vec<Call> {
    let rows: Vec<(Uuid, String, i32, bool, i32)> = sqlx::query_as(&format!(
        "SELECT message_id, handler, attempt, ok, pid FROM {} ORDER BY id",
        table(schema)
    ))
    .fetch_all(pool)
    .await
    .expect("read the ledger");
    rows.into_iter()
        .map(|(message_id, handler, attempt, ok, pid)| Call {
            message_id,
            handler,
            attempt,
            ok,
            pid,
        })
        .collect()
}

/// The pairs a store's dead letters stand for.
pub fn dead_lettered(letters: Vec<hexeract::DeadLetter>) -> Vec<DeadLettered> {
    letters
        .into_iter()
        .map(|letter| DeadLettered {
            message_id: letter.envelope.id,
            handler: letter.handler.unwrap_or_default(),
            reason: letter.reason.as_str().to_owned(),
        })
        .collect()
}

/// The dead letters of the Hexeract store in `schema`.
pub async fn dead_letters(pool: &PgPool, schema: &str) -> Vec<DeadLettered> {
    let rows: Vec<(Uuid, Option<String>, String)> = sqlx::query_as(&format!(
        "SELECT message_id, handler, reason FROM \"{schema}\".dead_letters ORDER BY dead_lettered_at"
    ))
    .fetch_all(pool)
    .await
    .expect("read the dead letters");
    rows.into_iter()
        .map(|(message_id, handler, reason)| DeadLettered {
            message_id,
            handler: handler.unwrap_or_default(),
            reason,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: Uuid, handler: &str, attempt: i32, ok: bool) -> Call {
        Call {
            message_id: id,
            handler: handler.to_owned(),
            attempt,
            ok,
            pid: 1,
        }
    }

    fn dead(id: Uuid, handler: &str, reason: &str) -> DeadLettered {
        DeadLettered {
            message_id: id,
            handler: handler.to_owned(),
            reason: reason.to_owned(),
        }
    }

    #[test]
    fn every_pair_lands_in_the_state_its_history_says() {
        let ids: Vec<Uuid> = (1..=5).map(Uuid::from_u128).collect();
        let stranger = Uuid::from_u128(99);
        let calls = [
            // ids[0]: handled once by each handler.
            call(ids[0], "a", 1, true),
            call(ids[0], "b", 1, true),
            // ids[1]: "a" failed, then handled twice (a duplicate); "b" dead-lettered.
            call(ids[1], "a", 1, false),
            call(ids[1], "a", 2, true),
            call(ids[1], "a", 3, true),
            call(ids[1], "b", 1, false),
            // ids[2]: "a" handled and dead-lettered: two terminal states.
            call(ids[2], "a", 1, true),
            call(ids[2], "b", 1, true),
            // ids[3]: "b" never called nor dead-lettered: lost. "a" only failed: lost.
            call(ids[3], "a", 1, false),
            // Never sent.
            call(stranger, "a", 1, true),
        ];
        let dead_letters = [
            dead(ids[1], "b", "max_deliveries_exceeded"),
            dead(ids[2], "a", "handler_failed"),
            // ids[4]: both dead-lettered, "a" twice.
            dead(ids[4], "a", "decode_failed"),
            dead(ids[4], "a", "decode_failed"),
            dead(ids[4], "b", "decode_failed"),
        ];
        let verdict = classify(&ids, &["a", "b"], &calls, &dead_letters);
        assert_eq!(verdict.sent, 10);
        assert_eq!(verdict.handled, 4, "{verdict}");
        assert_eq!(verdict.dead_lettered["max_deliveries_exceeded"], 1);
        assert_eq!(verdict.dead_lettered["decode_failed"], 2);
        assert_eq!(verdict.dead_lettered_total(), 3);
        let mut lost = vec![(ids[3], "a".to_owned()), (ids[3], "b".to_owned())];
        lost.sort();
        assert_eq!(verdict.lost, lost);
        assert_eq!(verdict.both, vec![(ids[2], "a".to_owned())]);
        assert_eq!(verdict.dead_lettered_twice, vec![(ids[4], "a".to_owned())]);
        assert_eq!(verdict.unexpected, vec![(stranger, "a".to_owned())]);
        assert_eq!(verdict.duplicates, 1);
        assert_eq!(verdict.calls, 10);
        assert_eq!(verdict.max_attempt, 3);
        assert!(!verdict.passed());
    }

    #[test]
    fn a_clean_history_passes_and_counts_duplicates_without_failing() {
        let ids: Vec<Uuid> = (1..=3).map(Uuid::from_u128).collect();
        let mut calls: Vec<Call> = ids.iter().map(|id| call(*id, "h", 1, true)).collect();
        calls.push(call(ids[0], "h", 2, true));
        let verdict = classify(&ids, &["h"], &calls, &[]);
        assert!(verdict.passed(), "{verdict}");
        assert_eq!(verdict.handled, 3);
        assert_eq!(verdict.duplicates, 1);
        verdict.assert_pass("clean");
    }

    #[test]
    #[should_panic(expected = "lost 1")]
    fn a_lost_pair_fails_the_assertion() {
        let ids = [Uuid::from_u128(1)];
        classify(&ids, &["h"], &[], &[]).assert_pass("lost");
    }
}
