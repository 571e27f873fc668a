//! What both database stores must do with a message whose type has one handler: claim it in
//! place in the outbox, and settle it there. Run by `outbox_postgres.rs` and `outbox_sqlite.rs`.

use std::future::Future;
use std::time::Duration;

use hexeract::store::{DeliveryId, Store};
use hexeract::{Envelope, Reason};
use uuid::Uuid;

const TYPE: &str = "test.InPlace";
const HANDLER: &str = "in-place";

/// The routes of a worker with one handler of [`TYPE`].
fn one_handler() -> hexeract::store::Routes {
    hexeract::store::Routes {
        pairs: vec![(TYPE.to_owned(), HANDLER.to_owned())],
    }
}

/// Takes, acks, retries, dead-letters and releases messages claimed in place on `store`
/// (migrated and empty), checking each step against the rows `count(table)` counts.
pub async fn claimed_in_place_and_settled_there<S, F, Fut>(store: &S, count: F)
where
    S: Store,
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = i64>,
{
    let one = one_handler();
    let lease = Duration::from_secs(30);
    let [acked, retried, parked] = [1, 2, 3].map(|n| Envelope::from_raw(TYPE, format!("{n}")));
    store
        .publish(vec![acked.clone(), retried.clone(), parked.clone()])
        .await
        .unwrap();

    // Taken: each claim is the outbox row itself, counted and leased; no delivery row.
    let token = Uuid::now_v7();
    let taken = store.take(&one, token, 10, lease).await.unwrap();
    let mut seen: Vec<_> = taken
        .iter()
        .map(|c| (c.id, c.handler.as_str(), c.envelope.attempt, c.recovered))
        .collect();
    seen.sort_by_key(|(id, ..)| format!("{id:?}"));
    let mut expected: Vec<_> = [&acked, &retried, &parked]
        .iter()
        .map(|e| (DeliveryId::Outbox(e.id), HANDLER, 1, false))
        .collect();
    expected.sort_by_key(|(id, ..)| format!("{id:?}"));
    assert_eq!(seen, expected);
    assert_eq!(count("deliveries").await, 0, "no delivery row is written");
    assert_eq!(count("outbox").await, 3);
    assert!(
        store
            .take(&one, Uuid::now_v7(), 10, lease)
            .await
            .unwrap()
            .is_empty(),
        "claimed rows are hidden from other takes"
    );
    let pending = store.pending_by_handler().await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].handler.as_str(), pending[0].count),
        (HANDLER, 3)
    );

    // An ack deletes the row, under its claim's token only.
    let deliveries = store.deliveries();
    let ack = [DeliveryId::Outbox(acked.id)];
    assert_eq!(deliveries.ack(Uuid::now_v7(), &ack).await.unwrap(), 0);
    assert_eq!(deliveries.ack(token, &ack).await.unwrap(), 1);
    assert_eq!(count("outbox").await, 2);

    // A retry moves the message into deliveries, with its handler and its attempt counted.
    let retry = DeliveryId::Outbox(retried.id);
    assert!(!deliveries
        .retry(Uuid::now_v7(), retry, Duration::ZERO, "not ours")
        .await
        .unwrap());
    assert!(deliveries
        .retry(token, retry, Duration::ZERO, "warehouse down")
        .await
        .unwrap());
    assert!(
        !deliveries
            .retry(token, retry, Duration::ZERO, "again")
            .await
            .unwrap(),
        "the claim went with the row"
    );
    assert_eq!((count("outbox").await, count("deliveries").await), (1, 1));
    let again = store.take(&one, Uuid::now_v7(), 10, lease).await.unwrap();
    assert_eq!(again.len(), 1);
    assert!(
        matches!(again[0].id, DeliveryId::Row(_)),
        "{:?}",
        again[0].id
    );
    assert_eq!(again[0].envelope.id, retried.id);
    assert_eq!(again[0].handler, HANDLER);
    assert_eq!(again[0].envelope.attempt, 2);
    assert_eq!(again[0].envelope.payload, retried.payload);

    // A dead letter moves it to the dead letters, with its handler and the calls made.
    let park = DeliveryId::Outbox(parked.id);
    let reason = Reason::HANDLER_REJECTED;
    assert!(!deliveries
        .dead_letter(Uuid::now_v7(), park, &reason, "not ours", 1)
        .await
        .unwrap());
    assert!(deliveries
        .dead_letter(token, park, &reason, "no such order", 1)
        .await
        .unwrap());
    assert_eq!(count("outbox").await, 0);
    let letters = store.dead_letters(10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].envelope.id, parked.id);
    assert_eq!(letters[0].envelope.payload, parked.payload);
    assert_eq!(letters[0].handler.as_deref(), Some(HANDLER));
    assert_eq!(letters[0].reason, reason);
    assert_eq!(letters[0].detail, "no such order");
    assert_eq!(letters[0].attempts, 1);

    // A release gives the row back at once, its attempt not counted.
    let released = Envelope::from_raw(TYPE, "4");
    store.publish(vec![released.clone()]).await.unwrap();
    let second = Uuid::now_v7();
    let taken = store.take(&one, second, 10, lease).await.unwrap();
    assert_eq!(taken.len(), 1);
    let release = [DeliveryId::Outbox(released.id)];
    assert_eq!(
        deliveries.release(Uuid::now_v7(), &release).await.unwrap(),
        0
    );
    assert_eq!(deliveries.release(second, &release).await.unwrap(), 1);
    let back = store.take(&one, Uuid::now_v7(), 10, lease).await.unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].id, DeliveryId::Outbox(released.id));
    assert_eq!(
        back[0].envelope.attempt, 1,
        "a release does not count the call"
    );
    assert!(!back[0].recovered, "a release is not a crash");

    // Published again while its claim runs (a producer retrying): the one copy stands.
    store.publish(vec![released.clone()]).await.unwrap();
    assert_eq!(count("outbox").await, 1);
    assert_eq!(
        store.backlog().await.unwrap(),
        2,
        "the retried message and this one"
    );
}

/// A message claimed in place whose claim ended unsettled, after a deploy gave its type a
/// second handler: expanded into a delivery per handler, each marked recovered (so it runs
/// alone), none lost.
pub async fn claimed_in_place_then_expanded_after_a_deploy<S: Store>(store: &S) {
    let one = one_handler();
    let two = hexeract::store::Routes {
        pairs: vec![
            (TYPE.to_owned(), HANDLER.to_owned()),
            (TYPE.to_owned(), "audit".to_owned()),
        ],
    };
    let envelope = Envelope::from_raw(TYPE, "5");
    store.publish(vec![envelope.clone()]).await.unwrap();
    let taken = store
        .take(&one, Uuid::now_v7(), 10, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    // Its worker dies; the new version starts once the lease has ended.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let expanded = store
        .take(&two, Uuid::now_v7(), 10, Duration::from_secs(30))
        .await
        .unwrap();
    let mut seen: Vec<_> = expanded
        .iter()
        .map(|c| (c.handler.as_str(), c.envelope.id, c.recovered))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [("audit", envelope.id, true), (HANDLER, envelope.id, true)]
    );
    assert!(expanded.iter().all(|c| matches!(c.id, DeliveryId::Row(_))));
    assert_eq!(store.backlog().await.unwrap(), 2);
}

/// A message published again after a retry moved its first copy into deliveries: the copy is
/// dropped at the take, not run beside the delivery.
pub async fn published_again_after_a_retry_runs_once<S, F, Fut>(store: &S, count: F)
where
    S: Store,
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = i64>,
{
    let one = one_handler();
    let lease = Duration::from_secs(30);
    let envelope = Envelope::from_raw(TYPE, "6");
    store.publish(vec![envelope.clone()]).await.unwrap();
    let token = Uuid::now_v7();
    let taken = store.take(&one, token, 10, lease).await.unwrap();
    assert_eq!(taken.len(), 1);
    assert!(store
        .deliveries()
        .retry(token, taken[0].id, Duration::from_secs(60), "later")
        .await
        .unwrap());

    store.publish(vec![envelope.clone()]).await.unwrap();
    assert_eq!(count("outbox").await, 1, "the copy was written");
    assert!(
        store
            .take(&one, Uuid::now_v7(), 10, lease)
            .await
            .unwrap()
            .is_empty(),
        "the copy is not run: the message's delivery waits for its retry"
    );
    assert_eq!((count("outbox").await, count("deliveries").await), (0, 1));
    assert_eq!(store.backlog().await.unwrap(), 1);
}

/// Hands the broker whatever it is given.
#[derive(Default)]
struct Handed(std::sync::Mutex<Vec<Envelope>>);

impl hexeract::store::RelaySink for Handed {
    fn publish<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<hexeract::store::Unpublishable>, String>>
    {
        Box::pin(async move {
            self.0.lock().unwrap().extend_from_slice(envelopes);
            Ok(Vec::new())
        })
    }
}

/// A relay (a broker configured while an outbox worker still runs) leaves the messages the
/// worker holds in place alone until their lease ends.
pub async fn the_relay_leaves_messages_claimed_in_place<S: Store>(store: &S) {
    let one = one_handler();
    let [held, free] = [7, 8].map(|n| Envelope::from_raw(TYPE, format!("{n}")));
    store
        .publish(vec![held.clone(), free.clone()])
        .await
        .unwrap();
    let taken = store
        .take(&one, Uuid::now_v7(), 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(taken[0].envelope.id, held.id, "oldest first");
    let sink = Handed::default();
    assert_eq!(store.relay(10, &sink).await.unwrap(), 1);
    let handed: Vec<_> = sink.0.lock().unwrap().iter().map(|e| e.id).collect();
    assert_eq!(handed, [free.id]);
    assert_eq!(
        store.backlog().await.unwrap(),
        1,
        "the held message is still owed"
    );
}
