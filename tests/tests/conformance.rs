//! The delivery contract, written once and run in every world: the in-memory worker, the
//! outbox on SQLite and on PostgreSQL, RabbitMQ, Kafka (on tansu and on librdkafka's mock
//! cluster) and, where it applies, the scheduler. Each scenario is a function generic over
//! `World` (`worlds.rs`); `on_every_world!` makes it one test per world,
//! `<scenario>::on_<world>`.
//!
//! | behaviour \ world | memory | sqlite | postgres | rabbitmq | kafka (tansu, mock) | scheduler |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | 1. fan-out (ten messages), independent retries | `fan_out_with_independent_retries::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | `…::on_scheduler`: the retry half only (n/a: a schedule has one job, no fan-out) |
//! | 2. always fails: 3 calls, `max_deliveries_exceeded` | `max_deliveries_exceeded::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | `…::on_scheduler` |
//! | 3. `HandlerOutcome::dead_letter` at once | `dead_letter_outcome::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | `…::on_scheduler` |
//! | 4. panic: retried, then `handler_panicked`; a handler that panicked once goes on | `handler_panicked::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | `…::on_scheduler` |
//! | 5. timeout: retried, then `handler_timeout` | `handler_timeout::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | `…::on_scheduler` |
//! | 6. undecodable payload: `payload_invalid` for each handler, body never runs | `payload_invalid::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | n/a: the payload is the scheduler's own |
//! | 7. oversize payload: `payload_too_large`, never decoded, no call | `payload_too_large::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | n/a: the scheduler's own payload has no cap |
//! | 8. unknown message type: retried, then `unknown_message_type` | `unknown_message_type::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` (put straight into a handler's queue: the exchange routes no unknown type) | `…::on_kafka_tansu`, `…::on_kafka_mock`: asserts what Kafka does instead (passed over by design: another handler's type) | n/a: an occurrence is always of a known job |
//! | 9. concurrency limit 2: never more, and reached | `concurrency_limit::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | n/a: one run per occurrence, no limit to set |
//! | 10. cancel with a call in flight | `cancel_with_a_call_in_flight::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | `…::on_scheduler` |
//! | 11. log line and metrics of each outcome | `record_of_each_outcome::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | `…::on_scheduler` |
//! | 12. a failure while stopping is released uncharged | `failure_while_stopping_is_released_uncharged::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | `…::on_scheduler` |
//! | 13. the attempt count survives a restart | `attempt_count_survives_a_restart::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` (each call counted in the store before it is made) | `…::on_scheduler` |
//! | 14. state: a `#[handler]` taking `State<…>` is called with the values given to its worker's builder | `state_given_to_the_worker::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | see 16 |
//! | 15. middleware: a dead letter of its own (`tenant_missing`) without a call; around the call, seeing its outcome; the worker's, then by name, then the handler's own | `middleware_around_every_call::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | see 16 |
//! | 16. a `#[scheduled]` job taking `State<…>`, the scheduler's middleware (and the job's own) around its run | n/a: a scheduler's job | n/a | n/a | n/a | n/a | `stateful_scheduled_job::on_scheduler` |
//! | 18. a timed-out call that ignores its cancellation keeps its `concurrency = 1` permit until it ends: no other call of the handler (its retry included) runs beside it | `a_timed_out_call_keeps_its_permit::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | n/a: one run per occurrence, no limit to set |
//! | 17. state not given: `build()` fails with the exact error, nothing consumed | `missing_state_stops_the_build::on_memory` | `…::on_sqlite` | `…::on_postgres` | `…::on_rabbitmq` | `…::on_kafka_tansu`, `…::on_kafka_mock` | `…::on_scheduler` |
//! | 19. a crash during a call (the worker's `run` dropped where it stands) counts as an attempt: the next start calls attempt 2 | n/a: nothing in memory survives a crash | `a_crash_during_a_call_counts_as_an_attempt::on_sqlite` (the claim's lease hands it on) | `…::on_postgres` | `…::on_rabbitmq` (the connection closed: the broker's delivery count) | `…::on_kafka_tansu`, `…::on_kafka_mock` (the attempt marker written before the call) | `…::on_scheduler` |
//!
//! Scenarios 1 to 11 are the brief's; 12 and 13 come from the engine's contract ("a failure
//! returned while the worker is stopping is released uncharged") and the design ("attempts
//! are counted at claim", "the attempt count travels with the message"); 14 to 17 are those of
//! state (`State<T>`, `.state(value)`) and middleware (`Middleware`, `.middleware(m)`,
//! `.middleware_for(name, m)`, `HandlerOptions::middleware`), which every world's builder has;
//! 18 and 19 are the limits the one-worker issue asks every world to hold (a permit held by a
//! call given up on; attempts counted durably before each call, Kafka included).
//!
//! Every test has a place of its own (an in-memory store, an SQLite file, a PostgreSQL
//! schema, an AMQP exchange and queue prefix, a Kafka topic prefix) and handlers registered in
//! code under names of its own, so tests run in parallel and again. The exceptions are the
//! suite's one `#[handler]` (`stateful`, scenarios 14 and 17) and one `#[scheduled]` job
//! (`scheduler::stateful_job`, 16 and 17), whose names are fixed: each is taken from the
//! program's inventory by name (no world builds from the inventory otherwise), and the tests
//! see their calls through the state they give them, not the process-wide metrics. The knobs
//! are the same everywhere (`Knobs`): 3 deliveries, retries after 20 to 80 ms, a 10 s handler
//! timeout, no state and no middleware, unless the scenario sets others. A world that needs a
//! service it cannot reach fails naming the variable to set (`TEST_DATABASE_URL`,
//! `TEST_AMQP_URL`, `TEST_KAFKA_BROKERS`). Waits are "within 30 s"; no assertion is about time.

#[path = "conformance/scheduler.rs"]
mod scheduler;
#[path = "conformance/support.rs"]
mod support;
#[path = "conformance/worlds.rs"]
mod worlds;

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hexeract::{
    handler, Context, Envelope, HandlerOptions, Message, MissingState, Reason, Registry,
    RegistryError, State,
};
use uuid::Uuid;

use support::{
    captured_log, counts, eventually, finished, handler_field, log_lines, order, raw_order,
    transport_field, unique, until, Act, Calls, Gauge, Handlers, Journal, Nobody, Recorded,
    RequireTenant, NO_TENANT, TENANT_MISSING,
};
use worlds::{Equipment, KafkaMock, KafkaTansu, Knobs, Memory, Postgres, RabbitMq, Sqlite, World};

/// One test per listed cell: `mod $scenario { fn $cell() }`, each running `$run`.
macro_rules! cells {
    ($scenario:ident: $($cell:ident => $run:expr),+ $(,)?) => {
        mod $scenario {
            #[allow(unused_imports)]
            use super::*;

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $cell() {
                    $run.await;
                }
            )+
        }
    };
}

/// Scenario `$scenario` on every world, plus the extra cells given (the scheduler's).
macro_rules! on_every_world {
    ($scenario:ident $(, $cell:ident => $run:expr)* $(,)?) => {
        cells!($scenario:
            on_memory => super::$scenario::<Memory>(),
            on_sqlite => super::$scenario::<Sqlite>(),
            on_postgres => super::$scenario::<Postgres>(),
            on_rabbitmq => super::$scenario::<RabbitMq>(),
            on_kafka_tansu => super::$scenario::<KafkaTansu>(),
            on_kafka_mock => super::$scenario::<KafkaMock>(),
            $($cell => $run,)*
        );
    };
}

on_every_world!(
    fan_out_with_independent_retries,
    on_scheduler => scheduler::a_failure_is_retried(),
);
on_every_world!(
    max_deliveries_exceeded,
    on_scheduler => scheduler::max_deliveries_exceeded(),
);
on_every_world!(
    dead_letter_outcome,
    on_scheduler => scheduler::dead_letter_outcome(),
);
on_every_world!(
    handler_panicked,
    on_scheduler => scheduler::handler_panicked(),
);
on_every_world!(
    handler_timeout,
    on_scheduler => scheduler::handler_timeout(),
);
on_every_world!(payload_invalid);
on_every_world!(payload_too_large);
cells!(unknown_message_type:
    on_memory => super::unknown_message_type::<Memory>(),
    on_sqlite => super::unknown_message_type::<Sqlite>(),
    on_postgres => super::unknown_message_type::<Postgres>(),
    on_rabbitmq => super::unknown_message_type::<RabbitMq>(),
    // Kafka cannot express it: a topic holds every message type of its aggregate, and a
    // handler's group passes over the types of the others' by design. These cells assert that
    // instead: not called, not dead-lettered, and the partition moves on.
    on_kafka_tansu => super::other_message_types_are_passed_over::<KafkaTansu>(),
    on_kafka_mock => super::other_message_types_are_passed_over::<KafkaMock>(),
);
on_every_world!(concurrency_limit);
on_every_world!(a_timed_out_call_keeps_its_permit);
on_every_world!(
    cancel_with_a_call_in_flight,
    on_scheduler => scheduler::cancel_with_a_call_in_flight(),
);
on_every_world!(
    record_of_each_outcome,
    on_scheduler => scheduler::record_of_each_outcome(),
);
on_every_world!(
    failure_while_stopping_is_released_uncharged,
    on_scheduler => scheduler::failure_while_stopping_is_released_uncharged(),
);
on_every_world!(
    attempt_count_survives_a_restart,
    on_scheduler => scheduler::attempt_count_survives_a_restart(),
);
cells!(a_crash_during_a_call_counts_as_an_attempt:
    // Nothing in memory survives a crash: the in-memory world has no cell.
    on_sqlite => super::a_crash_during_a_call_counts_as_an_attempt::<Sqlite>(),
    on_postgres => super::a_crash_during_a_call_counts_as_an_attempt::<Postgres>(),
    on_rabbitmq => super::a_crash_during_a_call_counts_as_an_attempt::<RabbitMq>(),
    on_kafka_tansu => super::a_crash_during_a_call_counts_as_an_attempt::<KafkaTansu>(),
    on_kafka_mock => super::a_crash_during_a_call_counts_as_an_attempt::<KafkaMock>(),
    on_scheduler => super::scheduler::a_crash_during_a_run_counts_as_an_attempt(),
);
on_every_world!(state_given_to_the_worker);
on_every_world!(middleware_around_every_call);
cells!(stateful_scheduled_job:
    on_scheduler => super::scheduler::stateful_job_with_middleware(),
);
on_every_world!(
    missing_state_stops_the_build,
    on_scheduler => scheduler::missing_state_stops_the_build(),
);

/// A fresh world with `handlers` started under `knobs`.
async fn started<W: World>(handlers: &Handlers, knobs: &Knobs) -> W {
    let mut world = W::create().await;
    world.start(handlers.registry(), knobs).await;
    world
}

/// How many messages scenario 1 publishes.
const FAN_OUT_MESSAGES: u32 = 10;

/// Scenario 1: two handlers of one type, each its own subscriber, and ten messages: A fails
/// each message once then succeeds, B succeeds; every handler gets every message, and A's
/// retries never run B again.
async fn fan_out_with_independent_retries<W: World>() {
    let calls = Calls::default();
    let (a, b) = (unique("fan_out.a"), unique("fan_out.b"));
    let handlers = Handlers::new(&calls)
        .with(&a, Act::FailFirst(1))
        .with(&b, Act::Succeed);
    let mut world: W = started(&handlers, &Knobs::default()).await;
    for n in 0..FAN_OUT_MESSAGES {
        world.publish(order(&format!("fan-out-{n}"), n)).await;
    }
    let messages = u64::from(FAN_OUT_MESSAGES);
    until(&world, "A and B each done with every message", |_| {
        finished(&a) == messages && finished(&b) == messages
    })
    .await;
    world.settled().await;
    let letters = world.dead_letters().await;
    world.stop().await.expect("run returns Ok(()) on cancel");
    // Every call was acked: the stop gave nothing back to be delivered again.
    world.settled().await;

    let every = |attempts: &[u32]| -> BTreeMap<u32, Vec<u32>> {
        (0..FAN_OUT_MESSAGES)
            .map(|n| (n, attempts.to_vec()))
            .collect()
    };
    assert_eq!(
        calls.attempts_per_order(&b),
        every(&[1]),
        "B exactly once per message: A's retries did not run it again"
    );
    assert_eq!(
        calls.attempts_per_order(&a),
        every(&[1, 2]),
        "A failed each message on attempt 1, acked it on attempt 2"
    );
    assert_eq!(
        counts(&a),
        (messages, messages, 0),
        "A: handled, retried, dead-lettered"
    );
    assert_eq!(
        counts(&b),
        (messages, 0, 0),
        "B: handled, retried, dead-lettered"
    );
    assert!(letters.is_empty(), "nothing dead-lettered: {letters:?}");
    world.remove().await;
}

/// Scenario 2: a handler that always fails is called `max_deliveries` (3) times, attempts 1 to
/// 3, then dead-lettered as `max_deliveries_exceeded` with its name and the last failure.
async fn max_deliveries_exceeded<W: World>() {
    let calls = Calls::default();
    let h = unique("always_fails");
    let handlers = Handlers::new(&calls).with(&h, Act::FailFirst(u32::MAX));
    let mut world: W = started(&handlers, &Knobs::default()).await;
    let envelope = order("always-fails", 2);
    world.publish(envelope.clone()).await;
    let letters = until(&world, "a dead letter", |letters| !letters.is_empty()).await;
    world.settled().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(
        calls.attempts(&h),
        [1, 2, 3],
        "three calls, attempts 1, 2, 3"
    );
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.handler.as_deref(), Some(h.as_str()));
    assert_eq!(letter.detail, "call 3 failed", "the last call's failure");
    assert_eq!(letter.envelope.id, envelope.id);
    assert_eq!(
        letter.envelope.payload, envelope.payload,
        "the original bytes"
    );
    assert_eq!(
        counts(&h),
        (0, 2, 1),
        "handled, retried, dead-lettered: two retries, then the dead letter"
    );
    world.remove().await;
}

/// Scenario 3: `HandlerOutcome::dead_letter("my_reason", "detail")`: one call, dead-lettered
/// at once with that reason and detail.
async fn dead_letter_outcome<W: World>() {
    let calls = Calls::default();
    let h = unique("rejects");
    let handlers = Handlers::new(&calls).with(&h, Act::DeadLetter("my_reason", "detail"));
    let mut world: W = started(&handlers, &Knobs::default()).await;
    let envelope = order("rejected", 3);
    world.publish(envelope.clone()).await;
    let letters = until(&world, "a dead letter", |letters| !letters.is_empty()).await;
    world.settled().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(calls.attempts(&h), [1], "one call, no retry");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason.as_str(), "my_reason");
    assert_eq!(letter.detail, "detail");
    assert_eq!(letter.attempts, 1);
    assert_eq!(letter.handler.as_deref(), Some(h.as_str()));
    assert_eq!(letter.envelope.id, envelope.id);
    assert_eq!(
        letter.envelope.payload, envelope.payload,
        "the original bytes"
    );
    world.remove().await;
}

/// Scenario 4: a handler that panics: each panic is a failed call, retried, then the message
/// is dead-lettered as `handler_panicked`; a handler that panics once is called again and
/// handles the message: a panic does not stop the handler.
async fn handler_panicked<W: World>() {
    let calls = Calls::default();
    let (h, once) = (unique("panics"), unique("panics_once"));
    let handlers = Handlers::new(&calls)
        .with(&h, Act::PanicFirst(u32::MAX))
        .with(&once, Act::PanicFirst(1));
    let mut world: W = started(&handlers, &Knobs::default()).await;
    world.publish(order("panics", 4)).await;
    let letters = until(
        &world,
        "a dead letter, and the message handled after one panic",
        |letters| !letters.is_empty() && finished(&once) == 1,
    )
    .await;
    world.settled().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(
        calls.attempts(&h),
        [1, 2, 3],
        "each panic was a failed call, retried"
    );
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason, Reason::HANDLER_PANICKED);
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.handler.as_deref(), Some(h.as_str()));
    assert!(
        letter.detail.contains("the handler panicked on purpose"),
        "{}",
        letter.detail
    );
    assert_eq!(
        calls.attempts(&once),
        [1, 2],
        "panicked on attempt 1, acked on attempt 2"
    );
    assert_eq!(
        counts(&once),
        (1, 1, 0),
        "{once}: handled, retried, dead-lettered"
    );
    world.remove().await;
}

/// Scenario 5: a handler slower than the 200 ms handler timeout: each call is given up on (and
/// told so through its context), retried, then dead-lettered as `handler_timeout`.
async fn handler_timeout<W: World>() {
    let calls = Calls::default();
    let h = unique("sleeps");
    let told = Arc::new(AtomicU32::new(0));
    let handlers = Handlers::new(&calls).with(&h, Act::Sleep(Duration::from_secs(5), told.clone()));
    let knobs = Knobs {
        handler_timeout: Duration::from_millis(200),
        ..Knobs::default()
    };
    let mut world: W = started(&handlers, &knobs).await;
    world.publish(order("sleeps", 5)).await;
    let letters = until(&world, "a dead letter", |letters| !letters.is_empty()).await;
    world.settled().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(
        calls.attempts(&h),
        [1, 2, 3],
        "each timeout was a failed call, retried"
    );
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason, Reason::HANDLER_TIMEOUT);
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.handler.as_deref(), Some(h.as_str()));
    // Given up on, not dropped: each call ran on and saw its context cancelled (a dropped
    // future would never count itself).
    eventually("the three calls told that they were given up on", || {
        told.load(Ordering::SeqCst) == 3
    })
    .await;
    world.remove().await;
}

/// Scenario 6: a payload that does not decode (not JSON; JSON with a field of the wrong type)
/// is dead-lettered as `payload_invalid`, once for each handler of its type, with its bytes and
/// the decoder's error, and no handler's body runs; a good message behind them (same key: on
/// Kafka the same partition) is handled by both.
async fn payload_invalid<W: World>() {
    let calls = Calls::default();
    let (a, b) = (unique("decodes.a"), unique("decodes.b"));
    let handlers = Handlers::new(&calls)
        .with(&a, Act::Succeed)
        .with(&b, Act::Succeed);
    let mut world: W = started(&handlers, &Knobs::default()).await;
    let broken = raw_order("undecodable", &b"not json"[..]);
    let mistyped = raw_order(
        "undecodable",
        &br#"{"id":"undecodable","n":"not a number"}"#[..],
    );
    world.publish(broken.clone()).await;
    world.publish(mistyped.clone()).await;
    world.publish(order("undecodable", 6)).await;
    let letters = until(
        &world,
        "four dead letters and the good message handled by both",
        |letters| letters.len() >= 4 && finished(&a) == 3 && finished(&b) == 3,
    )
    .await;
    world.settled().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    for handler in [&a, &b] {
        assert_eq!(
            calls.orders(handler),
            [6],
            "{handler}: the body ran for the good message only"
        );
    }
    let mut seen: Vec<(&str, Uuid)> = letters
        .iter()
        .map(|letter| {
            (
                letter.handler.as_deref().unwrap_or("(none)"),
                letter.envelope.id,
            )
        })
        .collect();
    seen.sort_unstable();
    let mut expected = vec![
        (a.as_str(), broken.id),
        (a.as_str(), mistyped.id),
        (b.as_str(), broken.id),
        (b.as_str(), mistyped.id),
    ];
    expected.sort_unstable();
    assert_eq!(seen, expected, "one dead letter per handler and message");
    for letter in &letters {
        assert_eq!(letter.reason, Reason::PAYLOAD_INVALID, "{letter:?}");
        assert_eq!(
            letter.attempts, 1,
            "the one delivery that could not be decoded"
        );
        let sent = if letter.envelope.id == broken.id {
            &broken
        } else {
            &mistyped
        };
        assert_eq!(letter.envelope.payload, sent.payload, "the original bytes");
        if letter.envelope.id == mistyped.id {
            assert!(
                letter.detail.contains("invalid type"),
                "the decoder's error: {}",
                letter.detail
            );
        }
    }
    world.remove().await;
}

/// Scenario 7: a payload over `max_payload_bytes` (64 here) is dead-lettered as
/// `payload_too_large` without a call: it is never decoded (a valid order is not called, and
/// bytes that are not JSON at all are too large, not invalid); a small one behind them is
/// handled.
async fn payload_too_large<W: World>() {
    let calls = Calls::default();
    let h = unique("small_only");
    let handlers = Handlers::new(&calls).with(&h, Act::Succeed);
    let knobs = Knobs {
        max_payload_bytes: 64,
        ..Knobs::default()
    };
    let mut world: W = started(&handlers, &knobs).await;
    // A valid order, only too large: were it decoded, the handler would be called.
    let payload = format!(
        r#"{{"id":"oversize","n":70,"padding":"{}"}}"#,
        "x".repeat(200)
    );
    let large = raw_order("oversize", payload.clone().into_bytes());
    // Not JSON, and too large: were it decoded first, it would be `payload_invalid`.
    let garbage = raw_order("oversize", vec![b' '; 200]);
    world.publish(large.clone()).await;
    world.publish(garbage.clone()).await;
    world.publish(order("oversize", 7)).await;
    let letters = until(
        &world,
        "two dead letters and the small message handled",
        |letters| letters.len() >= 2 && finished(&h) == 3,
    )
    .await;
    world.settled().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(calls.orders(&h), [7], "no call for the large ones");
    assert_eq!(letters.len(), 2, "{letters:?}");
    for sent in [&large, &garbage] {
        let letter = letters
            .iter()
            .find(|letter| letter.envelope.id == sent.id)
            .unwrap_or_else(|| panic!("no dead letter for {}: {letters:?}", sent.id));
        assert_eq!(letter.reason, Reason::PAYLOAD_TOO_LARGE);
        assert_eq!(letter.handler.as_deref(), Some(h.as_str()));
        assert_eq!(letter.attempts, 0, "no handler call was made");
        assert!(
            letter.detail.contains("max_payload_bytes (64)"),
            "{}",
            letter.detail
        );
        assert_eq!(letter.envelope.payload, sent.payload, "the original bytes");
    }
    world.remove().await;
}

/// Scenario 8: a message of a type no handler knows follows the retry policy, then is
/// dead-lettered as `unknown_message_type` with all 3 attempts; the handler of the known type
/// goes on.
async fn unknown_message_type<W: World>() {
    let calls = Calls::default();
    let h = unique("knows_orders");
    let handlers = Handlers::new(&calls).with(&h, Act::Succeed);
    let mut world: W = started(&handlers, &Knobs::default()).await;
    let stranger = Envelope::new(&Nobody {
        id: "unknown".to_owned(),
    })
    .expect("encodes");
    world.publish(stranger.clone()).await;
    world.publish(order("unknown", 8)).await;
    // The order's ack, by the handler's count of handled messages: on RabbitMQ the stranger's
    // retries and dead letter are counted as the handler's too (it came in the handler's
    // queue).
    let letters = until(&world, "a dead letter and the order handled", |letters| {
        !letters.is_empty() && counts(&h).0 == 1
    })
    .await;
    world.settled().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(calls.orders(&h), [8], "the handler saw its own type only");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(letter.reason, Reason::UNKNOWN_MESSAGE_TYPE);
    assert_eq!(letter.attempts, 3, "retried like a failure first");
    assert_eq!(letter.envelope.id, stranger.id);
    assert_eq!(letter.envelope.message_type, "conformance.Nobody");
    assert!(
        letter.detail.contains("conformance.Nobody"),
        "the detail names the type: {}",
        letter.detail
    );
    // No handler is named where the world routes by type; on RabbitMQ the message could only
    // arrive in a handler's own queue, and that handler is named.
    let named = W::UNKNOWN_TYPE_NAMES_A_HANDLER.then_some(h.as_str());
    assert_eq!(letter.handler.as_deref(), named);
    world.remove().await;
}

/// Kafka's cell of scenario 8: a record of another message type in the handler's topic is
/// passed over (it is another handler's): no call, no dead letter, and the record behind it in
/// the same partition is handled.
async fn other_message_types_are_passed_over<W: World>() {
    let calls = Calls::default();
    let h = unique("knows_orders");
    let handlers = Handlers::new(&calls).with(&h, Act::Succeed);
    let mut world: W = started(&handlers, &Knobs::default()).await;
    let stranger = Envelope::new(&Nobody {
        id: "unknown".to_owned(),
    })
    .expect("encodes");
    world.publish(stranger).await;
    world.publish(order("unknown", 8)).await;
    until(&world, "the order behind it handled", |_| finished(&h) == 1).await;
    world.settled().await;
    let letters = world.dead_letters().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(calls.orders(&h), [8], "the handler saw its own type only");
    assert!(
        letters.is_empty(),
        "passed over, not dead-lettered: {letters:?}"
    );
    assert_eq!(counts(&h), (1, 0, 0), "nothing retried either");
    world.remove().await;
}

/// Scenario 9: a handler limited to 2 calls at once never has more in flight over 10
/// messages, and does reach 2.
async fn concurrency_limit<W: World>() {
    let calls = Calls::default();
    let h = unique("two_at_once");
    let gauge = Arc::new(Gauge::default());
    let handlers = Handlers::new(&calls).with_options(
        &h,
        Act::Overlap(gauge.clone()),
        HandlerOptions::new().concurrency(NonZeroU32::new(2).expect("not zero")),
    );
    let mut world: W = started(&handlers, &Knobs::default()).await;
    // Ten keys: on Kafka, records in every partition, which run side by side.
    for n in 0..10 {
        world.publish(order(&format!("limited-{n}"), n)).await;
    }
    until(&world, "all ten handled", |_| finished(&h) == 10).await;
    world.settled().await;
    let letters = world.dead_letters().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(
        gauge.most(),
        2,
        "never more than 2 calls in flight, and 2 reached"
    );
    assert_eq!(
        calls.orders(&h),
        (0..10).collect::<Vec<_>>(),
        "each message once"
    );
    assert!(letters.is_empty(), "{letters:?}");
    world.remove().await;
}

/// Scenario 18: a handler limited to one call at once whose calls outlast its 200 ms timeout and
/// ignore their cancellation (each runs 600 ms). A call given up on runs on in its task, and
/// holds the handler's permit until it ends: no other call of the handler, its own retry
/// included, starts beside it. Two messages, three calls each, all given up on, then
/// dead-lettered as `handler_timeout`. Before, the permit went back when the call was given up
/// on, and the retry ran beside the call it retried.
async fn a_timed_out_call_keeps_its_permit<W: World>() {
    let calls = Calls::default();
    let h = unique("one_at_once");
    let gauge = Arc::new(Gauge::default());
    let handlers = Handlers::new(&calls).with_options(
        &h,
        Act::Stubborn(gauge.clone(), Duration::from_millis(600)),
        HandlerOptions::new().concurrency(NonZeroU32::new(1).expect("not zero")),
    );
    let knobs = Knobs {
        handler_timeout: Duration::from_millis(200),
        ..Knobs::default()
    };
    let mut world: W = started(&handlers, &knobs).await;
    // Two keys: on Kafka, records in two partitions, which would run side by side but for the
    // permit.
    world.publish(order("stubborn-a", 1)).await;
    world.publish(order("stubborn-b", 2)).await;
    let letters = until(&world, "two dead letters", |letters| letters.len() == 2).await;
    world.settled().await;
    eventually("every abandoned call ended", || {
        gauge.now() == 0 && calls.attempts(&h).len() == 6
    })
    .await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(
        gauge.most(),
        1,
        "a call given up on held its permit to its end"
    );
    assert_eq!(
        calls.attempts_per_order(&h),
        BTreeMap::from([(1, vec![1, 2, 3]), (2, vec![1, 2, 3])]),
        "each message called three times, each call given up on"
    );
    for letter in &letters {
        assert_eq!(letter.reason, Reason::HANDLER_TIMEOUT, "{letter:?}");
        assert_eq!(letter.attempts, 3);
    }
    world.remove().await;
}

/// Scenario 10: cancel while a call is in flight: the call finishes, `run` returns `Ok(())`,
/// and the message is settled: the next start on the same place does not call it again
/// (a marker published after the restart, with the same key, shows that start got going).
async fn cancel_with_a_call_in_flight<W: World>() {
    let calls = Calls::default();
    let h = unique("lingers");
    let done = Arc::new(AtomicU32::new(0));
    let handlers =
        Handlers::new(&calls).with(&h, Act::Linger(Duration::from_millis(500), done.clone()));
    let mut world: W = started(&handlers, &Knobs::default()).await;
    world.publish(order("in-flight", 10)).await;
    until(&world, "the call started", |_| !calls.of(&h).is_empty()).await;
    let stopped = world.stop().await;
    assert_eq!(stopped, Ok(()), "run returns Ok(()) on cancel");
    assert_eq!(
        done.load(Ordering::SeqCst),
        1,
        "the call in flight went on to its end"
    );
    assert_eq!(
        counts(&h),
        (1, 0, 0),
        "the call in flight was recorded as handled"
    );
    // Settled before run returned: nothing is owed (the restart below shows it is not called
    // again either).
    world.settled().await;

    world.start(handlers.registry(), &Knobs::default()).await;
    world.publish(order("in-flight", 11)).await;
    until(&world, "the marker handled", |_| {
        calls.orders(&h).contains(&11)
    })
    .await;
    world.settled().await;
    let letters = world.dead_letters().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(
        calls.orders(&h),
        [10, 11],
        "the settled message was not called again"
    );
    assert_eq!(calls.attempts(&h), [1, 1]);
    assert!(letters.is_empty(), "{letters:?}");
    world.remove().await;
}

/// Scenario 11: the record of each outcome: the dead-letter line (with the world as
/// `transport` and the reason), the retry warning and the handled line, and the handlers'
/// counters (handled, retried, dead-lettered).
async fn record_of_each_outcome<W: World>() {
    captured_log();
    let calls = Calls::default();
    let (ok, flaky, reject) = (unique("ok"), unique("flaky"), unique("reject"));
    let handlers = Handlers::new(&calls)
        .with(&ok, Act::Succeed)
        .with(&flaky, Act::FailFirst(1))
        .with(&reject, Act::DeadLetter("my_reason", "detail"));
    let transport = transport_field(W::TRANSPORT);
    let dead_lettered =
        || log_lines(&["message dead-lettered", &handler_field(&reject), &transport]);
    let retried = || {
        log_lines(&[
            "handler failed; will retry",
            &handler_field(&flaky),
            &transport,
        ])
    };
    let handled = |name: &str| log_lines(&["message handled", &handler_field(name), &transport]);
    let mut world: W = started(&handlers, &Knobs::default()).await;
    world.publish(order("recorded", 11)).await;
    until(&world, "every outcome logged", |letters| {
        letters.len() == 1
            && !dead_lettered().is_empty()
            && !retried().is_empty()
            && !handled(&ok).is_empty()
            && !handled(&flaky).is_empty()
    })
    .await;
    world.settled().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    let dead = dead_lettered();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    for field in [
        "ERROR",
        "reason=my_reason",
        "detail=\"detail\"",
        "attempts=1",
        "message_type=\"conformance.Order\"",
    ] {
        assert!(dead[0].contains(field), "{field} missing from: {}", dead[0]);
    }
    let retry = retried();
    assert_eq!(retry.len(), 1, "{retry:#?}");
    for field in ["WARN", "attempt=1", "retry_in=", "detail=\"call 1 failed\""] {
        assert!(
            retry[0].contains(field),
            "{field} missing from: {}",
            retry[0]
        );
    }
    assert_eq!(
        counts(&ok),
        (1, 0, 0),
        "{ok}: handled, retried, dead-lettered"
    );
    assert_eq!(
        counts(&flaky),
        (1, 1, 0),
        "{flaky}: handled, retried, dead-lettered"
    );
    assert_eq!(
        counts(&reject),
        (0, 0, 1),
        "{reject}: handled, retried, dead-lettered"
    );
    assert_eq!(calls.attempts(&flaky), [1, 2]);
    world.remove().await;
}

/// Scenario 12 (beyond the brief's list, from the engine's contract): a call that fails because
/// the worker is stopping (a cooperative handler watching its context) costs no attempt: the
/// message goes back uncharged, and the next start calls it at attempt 1 again.
async fn failure_while_stopping_is_released_uncharged<W: World>() {
    captured_log();
    let calls = Calls::default();
    let h = unique("fails_when_stopped");
    let handlers = Handlers::new(&calls).with(&h, Act::FailWhenStopped(Arc::default()));
    let mut world: W = started(&handlers, &Knobs::default()).await;
    world.publish(order("stopping", 12)).await;
    until(&world, "the call started", |_| !calls.of(&h).is_empty()).await;
    let stopped = world.stop().await;
    assert_eq!(stopped, Ok(()), "run returns Ok(()) on cancel");
    assert_eq!(calls.attempts(&h), [1], "one call before the stop");

    world.start(handlers.registry(), &Knobs::default()).await;
    until(&world, "the message handled after the restart", |_| {
        counts(&h).0 == 1
    })
    .await;
    world.settled().await;
    let letters = world.dead_letters().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(
        calls.attempts(&h),
        [1, 1],
        "called again at attempt 1: the failure at shutdown cost no attempt"
    );
    assert!(letters.is_empty(), "{letters:?}");
    assert_eq!(counts(&h), (1, 0, 0), "not counted as a retry");
    let given_back = log_lines(&[
        "message given back uncharged",
        &handler_field(&h),
        &transport_field(W::TRANSPORT),
    ]);
    assert_eq!(given_back.len(), 1, "{given_back:#?}");
    world.remove().await;
}

/// Retries a second apart: time enough to stop the worker between two calls.
fn slow_retries() -> Knobs {
    Knobs {
        retry_delays: (Duration::from_secs(1), Duration::from_secs(1)),
        ..Knobs::default()
    }
}

/// Runs a handler that always fails until its first call, stops the worker while the retry
/// waits, starts it again and waits for the dead letter; returns the attempts of every call
/// and the dead letter.
async fn fail_across_a_restart<W: World>() -> (Vec<u32>, hexeract::DeadLetter) {
    let calls = Calls::default();
    let h = unique("fails_across_restart");
    let handlers = Handlers::new(&calls).with(&h, Act::FailFirst(u32::MAX));
    let mut world: W = started(&handlers, &slow_retries()).await;
    world.publish(order("restarted", 13)).await;
    // Stopped once the first call's failure is a retry on record, not as soon as the call has
    // begun: a failure the stop overtakes is released uncharged (scenario 12), and the next
    // start would call attempt 1 again.
    until(
        &world,
        "the first call's failure recorded as a retry",
        |_| counts(&h).1 == 1,
    )
    .await;
    assert_eq!(world.stop().await, Ok(()), "run returns Ok(()) on cancel");
    assert_eq!(calls.attempts(&h), [1], "stopped while the retry waits");

    world.start(handlers.registry(), &slow_retries()).await;
    let letters = until(&world, "a dead letter", |letters| !letters.is_empty()).await;
    world.settled().await;
    world.stop().await.expect("run returns Ok(()) on cancel");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = letters[0].clone();
    assert_eq!(letter.reason, Reason::MAX_DELIVERIES_EXCEEDED);
    assert_eq!(letter.handler.as_deref(), Some(h.as_str()));
    world.remove().await;
    (calls.attempts(&h), letter)
}

/// Scenario 13 (beyond the brief's list, from the design: attempts are counted where the
/// message is, so a restart, or a crash loop, cannot give a message more calls): stopped while
/// a retry waits and started again, the worker goes on at attempt 2, and the message is
/// dead-lettered after 3 calls in all.
async fn attempt_count_survives_a_restart<W: World>() {
    let (attempts, letter) = fail_across_a_restart::<W>().await;
    assert_eq!(attempts, [1, 2, 3], "the count went on across the restart");
    assert_eq!(letter.attempts, 3);
}

/// Scenario 19: the process dies during a call (the worker's `run` dropped where it stands:
/// no cancellation, no grace, no settle). The call was an attempt: where the world counts
/// attempts (a column at the claim, the broker's delivery count, Kafka's attempt markers
/// written before the call), the next start calls the message as attempt 2, not 1 again, so a
/// message that kills its process every time ends as a dead letter after `max_deliveries`
/// calls instead of looping. The handler's first call never ends; its second acks.
async fn a_crash_during_a_call_counts_as_an_attempt<W: World>() {
    let calls = Calls::default();
    let h = unique("crashes_under");
    let hang = Arc::new(AtomicBool::new(false));
    let handlers = Handlers::new(&calls).with(&h, Act::HangFirst(hang));
    // The crash comes well inside the call's timeout, so nothing settles the call first; the
    // claim worlds' lease (the timeout and 5 s to settle) is what hands the delivery on.
    let knobs = Knobs {
        handler_timeout: Duration::from_secs(3),
        ..Knobs::default()
    };
    let mut world: W = started(&handlers, &knobs).await;
    world.publish(order("crashes", 19)).await;
    eventually("the first call began", || calls.attempts(&h) == [1]).await;
    world.crash().await;

    world.start(handlers.registry(), &knobs).await;
    eventually("a second call after the crash", || {
        calls.attempts(&h).len() == 2
    })
    .await;
    world.settled().await;
    let letters = world.dead_letters().await;
    world.stop().await.expect("run returns Ok(()) on cancel");
    assert_eq!(
        calls.attempts(&h),
        [1, 2],
        "the call the crash cut off counted: the next one is attempt 2"
    );
    assert_eq!(
        calls.attempts_per_order(&h),
        BTreeMap::from([(19, vec![1, 2])]),
        "the message itself, called again"
    );
    assert!(letters.is_empty(), "acked on its second call: {letters:?}");
    world.remove().await;
}

/// The message of the suite's one `#[handler]`, [`stateful`]: a type of its own, of the orders'
/// aggregate (on Kafka, in the test's one topic).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "conformance.Restock", aggregate = "order")]
struct Restock {
    #[message(key)]
    id: String,
    n: u32,
}

/// Restock number `n` with the aggregate id `key`.
fn restock(key: &str, n: u32) -> Envelope {
    Envelope::new(&Restock {
        id: key.to_owned(),
        n,
    })
    .expect("a restock encodes")
}

/// What [`stateful`] saw of each call: the restock's `n`, the attempt and the label it was given.
#[derive(Debug, Default)]
struct Sightings(Mutex<Vec<(u32, u32, String)>>);

impl Sightings {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Every call, sorted.
    fn sorted(&self) -> Vec<(u32, u32, String)> {
        let mut seen = self.0.lock().unwrap().clone();
        seen.sort_unstable();
        seen
    }
}

/// The name of [`stateful`].
const STATEFUL: &str = "conformance.stateful";

/// Where [`stateful`]'s name is (line, column): scenario 17's error names it.
const STATEFUL_AT: (u32, u32) = (line!() + 5, 10);

/// The suite's one `#[handler]`: it takes state, the test's [`Sightings`] and a label, and
/// writes each call into the one with the other.
#[handler(message = "conformance.Restock", name = "conformance.stateful")]
async fn stateful(
    restock: Restock,
    ctx: &Context,
    State(sightings): State<Arc<Sightings>>,
    State(label): State<String>,
) -> Result<(), String> {
    sightings
        .0
        .lock()
        .unwrap()
        .push((restock.n, ctx.attempt(), label));
    Ok(())
}

/// [`stateful`] alone, from the program's `#[handler]`s.
fn stateful_only() -> Registry {
    let mut registry = Registry::from_inventory().expect("the program's handlers");
    registry.retain(|info| info.name == STATEFUL);
    assert_eq!(
        registry.len(),
        1,
        "`stateful` is in the inventory: {registry:?}"
    );
    registry
}

/// The default knobs, with the state [`stateful`] takes: `sightings` and `label`.
fn stateful_state(sightings: &Arc<Sightings>, label: &str) -> Knobs {
    Knobs {
        equipment: Equipment::default()
            .state(sightings.clone())
            .state(label.to_owned()),
        ..Knobs::default()
    }
}

/// Scenario 14: a `#[handler]` that takes state (`State<Arc<Sightings>>` and `State<String>`),
/// its values given with the world's builder's `.state(value)`, is called with those values:
/// each call writes itself into the test's own `Sightings`, with the test's own label.
async fn state_given_to_the_worker<W: World>() {
    let sightings = Arc::new(Sightings::default());
    let label = unique("label");
    let mut world = W::create().await;
    world
        .start(stateful_only(), &stateful_state(&sightings, &label))
        .await;
    for n in 0..3 {
        world.publish(restock(&format!("stateful-{n}"), n)).await;
    }
    until(&world, "three calls", |_| sightings.len() == 3).await;
    world.settled().await;
    let letters = world.dead_letters().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    assert_eq!(
        sightings.sorted(),
        (0..3).map(|n| (n, 1, label.clone())).collect::<Vec<_>>(),
        "each message once, at attempt 1, into the sightings and with the label given"
    );
    assert!(letters.is_empty(), "{letters:?}");
    world.remove().await;
}

/// Scenario 15: middleware around every call. The worker's (`.middleware`, in order): one
/// that writes `enter outer` and `exit outer: <outcome>` around the rest of the chain, then
/// one that dead-letters a message without a `tenant` header as `tenant_missing` without
/// calling on. One of the two handlers has its own too: one by name (`.middleware_for`) and
/// one from its options (`HandlerOptions::middleware`), each writing around the rest. A message
/// without a tenant is dead-lettered for each handler with that reason and detail, neither
/// handler called, and the outer middleware saw that outcome; one with a tenant reaches both
/// handlers, through the worker's middleware, then the one by name, then the handler's own.
async fn middleware_around_every_call<W: World>() {
    let calls = Calls::default();
    let journal = Journal::default();
    let (guarded, other) = (unique("guarded"), unique("guarded.other"));
    let handlers = Handlers::new(&calls)
        .with_options(
            &guarded,
            Act::Note(journal.clone()),
            HandlerOptions::new().middleware(Recorded::new("own", &journal)),
        )
        .with(&other, Act::Note(journal.clone()));
    let knobs = Knobs {
        equipment: Equipment::default()
            .middleware(Recorded::new("outer", &journal))
            .middleware(RequireTenant)
            .middleware_for(&guarded, Recorded::new("by_name", &journal)),
        ..Knobs::default()
    };
    let mut world: W = started(&handlers, &knobs).await;
    let untenanted = order("tenants", 15);
    world.publish(untenanted.clone()).await;
    let letters = until(&world, "a dead letter for each handler", |letters| {
        letters.len() == 2 && finished(&guarded) == 1 && finished(&other) == 1
    })
    .await;
    // One message at a time: the journal's entries of one call do not mix with the next's.
    world
        .publish(order("tenants", 16).with_header("tenant", "acme"))
        .await;
    until(&world, "the message with a tenant done by both", |_| {
        finished(&guarded) == 2 && finished(&other) == 2
    })
    .await;
    world.settled().await;
    let all_letters = world.dead_letters().await;
    world.stop().await.expect("run returns Ok(()) on cancel");

    let mut dead_lettered: Vec<&str> = letters
        .iter()
        .map(|letter| letter.handler.as_deref().unwrap_or("(none)"))
        .collect();
    dead_lettered.sort_unstable();
    let mut both = [guarded.as_str(), other.as_str()];
    both.sort_unstable();
    assert_eq!(dead_lettered, both, "one dead letter per handler");
    for letter in &letters {
        assert_eq!(letter.reason.as_str(), TENANT_MISSING, "{letter:?}");
        assert_eq!(letter.detail, NO_TENANT);
        assert_eq!(letter.attempts, 1);
        assert_eq!(letter.envelope.id, untenanted.id);
    }
    assert_eq!(
        all_letters.len(),
        2,
        "no other dead letter: {all_letters:?}"
    );
    assert_eq!(
        calls.orders(&guarded),
        [16],
        "called for the message with a tenant only"
    );
    assert_eq!(
        calls.orders(&other),
        [16],
        "called for the message with a tenant only"
    );
    assert_eq!(
        journal.of(&guarded),
        [
            // Without a tenant: dead-lettered inside the outer middleware, which saw it.
            "enter outer",
            "exit outer: dead_letter(tenant_missing)",
            // With one: the worker's, then the handler's by name, then its options', then it.
            "enter outer",
            "enter by_name",
            "enter own",
            "call",
            "exit own: ack",
            "exit by_name: ack",
            "exit outer: ack",
        ]
    );
    assert_eq!(
        journal.of(&other),
        [
            "enter outer",
            "exit outer: dead_letter(tenant_missing)",
            "enter outer",
            "call",
            "exit outer: ack",
        ],
        "the worker's middleware only"
    );
    assert_eq!(
        counts(&guarded),
        (1, 0, 1),
        "handled, retried, dead-lettered: the middleware's dead letter recorded as a handler's"
    );
    world.remove().await;
}

/// Scenario 17: a worker whose `#[handler]` takes state it was not given does not build: the
/// error names the handler, where it is and each type missing, in full; and nothing was
/// consumed: a message published before is handled by the next worker, given the state, once,
/// at attempt 1.
async fn missing_state_stops_the_build<W: World>() {
    let sightings = Arc::new(Sightings::default());
    let label = unique("label");
    let given = stateful_state(&sightings, &label);
    let mut world = W::create().await;
    // A worker with the state first, to make the place (on RabbitMQ, the queues: a message
    // published before them would be dropped by the exchange).
    world.start(stateful_only(), &given).await;
    world.stop().await.expect("run returns Ok(()) on cancel");
    let envelope = restock("missing-state", 17);
    world.publish(envelope.clone()).await;

    let error = world
        .try_start(stateful_only(), &Knobs::default())
        .await
        .expect_err("a worker without the handler's state does not build");
    let (line, column) = STATEFUL_AT;
    let location = format!("tests/tests/conformance.rs:{line}:{column}");
    assert_eq!(
        error.to_string(),
        format!(
            "handlers take state that was not given to the worker; give each value with \
             `.state(value)` on `hexeract::App` (or on the worker's builder) before it runs:\n  \
             `conformance.stateful` ({location}) takes `State<Arc<Sightings>>` and \
             `State<String>`"
        )
    );
    let hexeract::Error::Registry(RegistryError::MissingState(missing)) = &error else {
        panic!("not a missing state: {error:?}");
    };
    let missing_type = |type_name| MissingState {
        handler: STATEFUL.to_owned(),
        location: location.clone(),
        type_name,
    };
    assert_eq!(
        missing,
        &[
            missing_type("State<Arc<Sightings>>"),
            missing_type("State<String>"),
        ]
    );
    assert_eq!(sightings.len(), 0, "no call");

    world.start(stateful_only(), &given).await;
    until(&world, "the message handled", |_| sightings.len() == 1).await;
    world.settled().await;
    let letters = world.dead_letters().await;
    world.stop().await.expect("run returns Ok(()) on cancel");
    assert_eq!(
        sightings.sorted(),
        [(17, 1, label)],
        "handled once, at attempt 1, by the worker given the state: the failed build took nothing"
    );
    assert!(letters.is_empty(), "{letters:?}");
    world.remove().await;
}
