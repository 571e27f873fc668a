//! `hexeract::testing::Harness`: handlers unit-tested through the real adapter path.

use std::time::Duration;

use hexeract::testing::Harness;
use hexeract::{handler, Context, Envelope, HandlerOutcome, Message, Reason};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.PaymentReceived")]
struct PaymentReceived {
    order_id: u64,
    amount_cents: i64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.ReceiptRequested")]
struct ReceiptRequested {
    order_id: u64,
}

#[handler(message = "test.PaymentReceived", name = "payments.book")]
async fn book(payment: PaymentReceived, ctx: &Context) -> Result<(), String> {
    if payment.amount_cents < 0 {
        return Err(format!("negative amount on attempt {}", ctx.attempt()));
    }
    ctx.publish(&ReceiptRequested {
        order_id: payment.order_id,
    })
    .await
    .map_err(|error| error.to_string())?;
    Ok(())
}

#[handler(
    message = "test.PaymentReceived",
    name = "payments.audit",
    timeout = "20ms"
)]
async fn audit(payment: PaymentReceived, _ctx: &Context) -> HandlerOutcome {
    match payment.amount_cents {
        0 => panic!("zero-amount payment"),
        1 => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            HandlerOutcome::Ack
        }
        _ => HandlerOutcome::Ack,
    }
}

#[tokio::test]
async fn deliver_calls_every_handler_of_the_type_and_reports_each_outcome() {
    let harness = Harness::new().unwrap();
    let deliveries = harness
        .deliver(&PaymentReceived {
            order_id: 9,
            amount_cents: 500,
        })
        .await
        .unwrap();
    let handlers: Vec<_> = deliveries.iter().map(|d| d.handler.as_str()).collect();
    assert_eq!(handlers, ["payments.audit", "payments.book"]);
    assert!(deliveries.iter().all(|d| d.outcome.is_ack()));

    let published = harness.published();
    assert_eq!(published.len(), 1, "what handlers publish is captured");
    assert_eq!(published[0].message_type, "test.ReceiptRequested");
    assert_eq!(
        published[0].decode::<ReceiptRequested>().unwrap().order_id,
        9
    );
    assert!(published[0].causation_id.is_some());
}

#[tokio::test]
async fn errors_panics_timeouts_and_bad_payloads_come_back_as_outcomes() {
    let harness = Harness::new().unwrap().attempt(3);
    let failed = harness
        .deliver(&PaymentReceived {
            order_id: 1,
            amount_cents: -1,
        })
        .await
        .unwrap();
    assert!(matches!(
        failed.outcome("payments.book"),
        Some(HandlerOutcome::Retry { reason, detail, .. })
            if *reason == Reason::MAX_DELIVERIES_EXCEEDED && detail == "negative amount on attempt 3"
    ));

    let panicked = harness
        .deliver(&PaymentReceived {
            order_id: 1,
            amount_cents: 0,
        })
        .await
        .unwrap();
    assert!(matches!(
        panicked.outcome("payments.audit"),
        Some(HandlerOutcome::Retry { reason, detail, .. })
            if *reason == Reason::HANDLER_PANICKED && detail.contains("zero-amount payment")
    ));

    let slow = harness
        .deliver(&PaymentReceived {
            order_id: 1,
            amount_cents: 1,
        })
        .await
        .unwrap();
    assert!(matches!(
        slow.outcome("payments.audit"),
        Some(HandlerOutcome::Retry { reason, .. }) if *reason == Reason::HANDLER_TIMEOUT
    ));

    let garbage = harness
        .deliver_envelope(Envelope::from_raw("test.PaymentReceived", &b"[1, 2"[..]))
        .await;
    assert_eq!(garbage.len(), 2);
    assert!(garbage.iter().all(|d| matches!(
        &d.outcome,
        HandlerOutcome::DeadLetter { reason, .. } if *reason == Reason::PAYLOAD_INVALID
    )));

    let unknown = harness
        .deliver_envelope(Envelope::from_raw("test.Unknown", &b"{}"[..]))
        .await;
    assert!(unknown.is_empty(), "no handler knows the type");
}

#[tokio::test]
async fn a_handler_function_can_be_called_directly_with_a_test_context() {
    let harness = Harness::new().unwrap().attempt(2);
    let payment = PaymentReceived {
        order_id: 4,
        amount_cents: -3,
    };
    let ctx = harness.context_for(&payment).unwrap();
    assert_eq!(ctx.attempt(), 2);
    assert_eq!(
        book(payment, &ctx).await,
        Err("negative amount on attempt 2".to_owned())
    );
    assert!(harness.published().is_empty());
}
