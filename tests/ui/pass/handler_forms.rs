//! Every accepted handler form compiles.
use hexeract::{handler, Context, HandlerOutcome, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {
    pub order_id: u64,
}

/// The Rust name differs from the wire name: the check compares wire names.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "shipping.OrderShipped.v2")]
pub struct ShipmentV2 {
    pub order_id: u64,
}

#[derive(Debug)]
pub struct StockError;

impl std::fmt::Display for StockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("out of stock")
    }
}

impl std::error::Error for StockError {}

#[handler(message = "OrderPlaced")]
async fn with_std_error(_event: OrderPlaced, _ctx: &Context) -> Result<(), StockError> {
    Ok(())
}

#[handler(message = "OrderPlaced", name = "billing.charge", timeout = "1m30s", concurrency = 4)]
pub async fn with_every_option(_event: OrderPlaced, _ctx: &hexeract::Context) -> anyhow::Result<()> {
    Ok(())
}

#[handler(message = "OrderPlaced")]
pub(crate) async fn with_outcome(event: OrderPlaced, _ctx: &Context) -> HandlerOutcome {
    if event.order_id == 0 {
        HandlerOutcome::reject("order id 0")
    } else {
        HandlerOutcome::Ack
    }
}

#[handler(message = "OrderPlaced")]
async fn with_string_error_and_outcome(_: OrderPlaced, _: &Context) -> Result<HandlerOutcome, String> {
    Ok(HandlerOutcome::Ack)
}

#[handler(message = "shipping.OrderShipped.v2")]
async fn with_lifetime<'a>(event: ShipmentV2, ctx: &'a Context) -> Result<(), &'static str> {
    if event.order_id + u64::from(ctx.attempt()) == 0 {
        return Err("impossible");
    }
    Ok(())
}

mod nested {
    use super::OrderPlaced;

    #[hexeract::handler(message = "OrderPlaced", timeout = "250ms")]
    async fn in_a_module(_event: OrderPlaced, _ctx: &hexeract::Context) -> Result<(), std::io::Error> {
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The functions stay callable as written.
    let harness = hexeract::testing::Harness::new().expect("registry");
    let ctx = harness.context_for(&OrderPlaced { order_id: 1 }).unwrap();
    assert!(with_std_error(OrderPlaced { order_id: 1 }, &ctx).await.is_ok());

    let registry = hexeract::Registry::from_inventory().expect("registry");
    // Default names are `module::path::fn`; trybuild names this crate `trybuild000`.
    let crate_name = module_path!();
    let names: Vec<String> = registry
        .handlers()
        .map(|info| info.name.replace(crate_name, "crate"))
        .collect();
    assert_eq!(
        names,
        [
            "billing.charge",
            "boxed.error",
            "crate::nested::in_a_module",
            "crate::with_lifetime",
            "crate::with_outcome",
            "crate::with_std_error",
            "crate::with_string_error_and_outcome",
        ]
    );
    let charge = registry.get("billing.charge").unwrap().info();
    assert_eq!(charge.timeout, Some(std::time::Duration::from_secs(90)));
    assert_eq!(charge.concurrency.map(|c| c.get()), Some(4));
    assert_eq!(charge.location.unwrap().line, 34);
    assert_eq!(registry.handlers_for("shipping.OrderShipped.v2").len(), 1);
}

/// A boxed error that is not `Send` is fine: it is not held across an await.
#[handler(message = "OrderPlaced", name = "boxed.error")]
async fn with_boxed_error(event: OrderPlaced, _ctx: &Context) -> Result<(), Box<dyn std::error::Error>> {
    if event.order_id == 0 {
        return Err("order 0".into());
    }
    Ok(())
}
