use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async fn reserve_stock(_event: OrderPlaced, _ctx: &Context, _retries: u32) -> Result<(), String> {
    Ok(())
}

fn main() {}
