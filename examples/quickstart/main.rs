//! Hexeract in one file: two message types, three handlers, a scheduled job, no setup.
//!
//! `cargo run --example quickstart` publishes a few messages and shows what happens to each:
//! handled at once, handled after a retry, delivered later on purpose, or dead-lettered with a
//! reason; meanwhile a scheduled job fires every second. With no environment
//! the messages go through an SQLite outbox file (`hexeract.db`); with `DATABASE_URL` set,
//! through PostgreSQL, with the same code.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hexeract::{
    handler, scheduled, App, AppConfig, CancellationToken, Context, Envelope, HandlerOutcome,
    Message, State,
};

/// What the handlers share, given to the worker as state (`State<Demo>`): a real program gives
/// its database pool, HTTP client or settings the same way.
#[derive(Clone, Default)]
struct Demo {
    /// Whether the warehouse has already been "down" once.
    warehouse_was_down: Arc<AtomicBool>,
    /// Heartbeats so far.
    heartbeats: Arc<AtomicU32>,
}

/// A customer placed an order. `type` is the name on the wire, independent of the Rust name.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {
    pub order_id: u64,
    pub total_cents: i64,
}

/// A customer asked for money back.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "RefundRequested")]
pub struct RefundRequested {
    pub order_id: u64,
    pub amount_cents: i64,
}

/// Succeeds every time.
#[handler(message = "OrderPlaced")]
async fn send_confirmation(order: OrderPlaced, ctx: &Context) -> Result<(), std::io::Error> {
    println!(
        "  [send_confirmation] order {} confirmed ({} cents), message {}",
        order.order_id,
        order.total_cents,
        ctx.message_id()
    );
    Ok(())
}

/// Fails the first time (the warehouse is "down"), so the runtime retries it after a backoff.
/// It is its own subscriber: the retry does not run `send_confirmation` again.
#[handler(message = "OrderPlaced", timeout = "10s")]
async fn reserve_stock(
    order: OrderPlaced,
    ctx: &Context,
    State(demo): State<Demo>,
) -> Result<(), String> {
    if !demo.warehouse_was_down.swap(true, Ordering::SeqCst) {
        println!(
            "  [reserve_stock] order {}: warehouse unavailable on attempt {}, will be retried",
            order.order_id,
            ctx.attempt()
        );
        return Err("warehouse unavailable".into());
    }
    println!(
        "  [reserve_stock] order {}: stock reserved on attempt {}",
        order.order_id,
        ctx.attempt()
    );
    Ok(())
}

/// Refuses what can never succeed: it dead-letters at once instead of retrying.
#[handler(message = "RefundRequested")]
async fn issue_refund(refund: RefundRequested, _ctx: &Context) -> HandlerOutcome {
    if refund.amount_cents <= 0 {
        println!(
            "  [issue_refund] order {}: refusing a refund of {} cents",
            refund.order_id, refund.amount_cents
        );
        return HandlerOutcome::dead_letter(
            "invalid_amount",
            format_args!(
                "refund amount must be positive, got {}",
                refund.amount_cents
            ),
        );
    }
    println!(
        "  [issue_refund] order {}: refunded {} cents",
        refund.order_id, refund.amount_cents
    );
    HandlerOutcome::Ack
}

/// A scheduled job: every second, on the second (fire times count from the Unix epoch, so every
/// replica agrees on them and each one runs once). Missed beats are not caught up, and a beat
/// that takes more than 5 s is a failed run (without `timeout`, the 30 s dispatch timeout).
#[scheduled(every = "1s", catch_up = "none", timeout = "5s")]
async fn heartbeat(ctx: &Context, State(demo): State<Demo>) -> Result<(), std::io::Error> {
    let beat = demo.heartbeats.fetch_add(1, Ordering::SeqCst) + 1;
    if beat <= 2 {
        let fire_time = ctx
            .scheduled_for()
            .map(|at| at.format("%H:%M:%S").to_string());
        println!("  [heartbeat] fire time {}", fire_time.unwrap_or_default());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_target(false)
        .init();

    // The whole runtime: every #[handler] and #[scheduled] job above with their state, the
    // outbox (an SQLite file here, PostgreSQL when DATABASE_URL is set), retries, dead letters,
    // graceful shutdown. (`hexeract::run(cancel)` is the same for handlers without state.)
    let demo = Demo::default();
    let cancel = CancellationToken::new();
    let app = App::new(AppConfig::from_env()?).state(demo.clone());
    let running = tokio::spawn(app.try_run(cancel.clone()));

    println!("publishing 2 orders, 2 refunds and 1 refund whose payload does not decode:");
    let mut ids = vec![
        hexeract::publish(&OrderPlaced {
            order_id: 1,
            total_cents: 4_990,
        })
        .await?,
        hexeract::publish(&OrderPlaced {
            order_id: 2,
            total_cents: 1_250,
        })
        .await?,
        hexeract::publish(&RefundRequested {
            order_id: 1,
            amount_cents: 990,
        })
        .await?,
        hexeract::publish(&RefundRequested {
            order_id: 2,
            amount_cents: -5,
        })
        .await?,
    ];
    // Delivered to its handlers in 1.5 s, not before.
    println!("and 1 order to be delivered in 1.5 s:");
    hexeract::schedule_after(
        Duration::from_millis(1_500),
        &OrderPlaced {
            order_id: 3,
            total_cents: 700,
        },
    )
    .await?;
    // Bytes from a producer that got the contract wrong: no handler ever sees them.
    let store = hexeract::store::default_store().await?;
    let garbage = Envelope::from_raw("RefundRequested", &b"{\"order_id\": \"two\"}"[..]);
    ids.push(garbage.id);
    store.publish(vec![garbage]).await?;

    // Wait until the delayed order went out, every message is handled or dead-lettered and
    // the heartbeat fired twice, then shut down.
    let schedules = hexeract::store::default_store().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while schedules.schedule_backlog().await? > 0 || demo.heartbeats.load(Ordering::SeqCst) < 2 {
        if tokio::time::Instant::now() > deadline {
            cancel.cancel();
            running.await??;
            return Err(
                "the delayed order or the heartbeat did not come within 30 s (see the \
                        warnings above)"
                    .into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hexeract::store::wait_until_drained(&*store, Duration::from_millis(20)).await?;
    cancel.cancel();
    running.await??;

    // The outbox file keeps dead letters across runs: show this run's.
    let dead_letters: Vec<_> = store
        .dead_letters(1_000)
        .await?
        .into_iter()
        .filter(|dead| ids.contains(&dead.envelope.id))
        .collect();
    println!("\ndead letters ({}):", dead_letters.len());
    for dead in &dead_letters {
        println!(
            "  {} for {}: {} ({}), after {} attempt(s); payload {}",
            dead.envelope.message_type,
            dead.handler.as_deref().unwrap_or("no handler"),
            dead.reason,
            dead.detail,
            dead.attempts,
            String::from_utf8_lossy(&dead.envelope.payload),
        );
    }
    if dead_letters.len() != 2 {
        return Err(format!("expected 2 dead letters, found {}", dead_letters.len()).into());
    }
    println!(
        "\nall messages settled: 7 handled (1 after a retry, 2 of them 1.5 s late on purpose), \
         2 dead-lettered; the heartbeat fired {} times",
        demo.heartbeats.load(Ordering::SeqCst)
    );
    match std::env::var("DATABASE_URL") {
        Ok(_) => println!("(messages and dead letters are kept in PostgreSQL, schema `hexeract`)"),
        Err(_) => println!("(messages and dead letters are kept in ./hexeract.db; set DATABASE_URL for PostgreSQL)"),
    }
    Ok(())
}
