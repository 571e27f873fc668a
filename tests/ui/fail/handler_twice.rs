use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
#[handler(message = "OrderPlaced", name = "billing.reserve_again")]
async fn reserve_stock(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
