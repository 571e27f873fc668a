use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderShipped")]
pub struct OrderShipped {}

#[handler(message = "OrderPlaced")]
async fn placed_and_shipped(
    _placed: OrderPlaced,
    _shipped: OrderShipped,
    _ctx: &Context,
) -> Result<(), String> {
    Ok(())
}

fn main() {}
