//! A deprecated handler, or one of a deprecated message, compiles without warnings: only its
//! callers are warned.
#![deny(warnings)]

use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
#[deprecated(note = "use `reserve_stock_v2`")]
async fn reserve_stock(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {
    let registry = hexeract::Registry::from_inventory().expect("registry");
    assert_eq!(registry.handlers_for("OrderPlaced").len(), 1);
}
