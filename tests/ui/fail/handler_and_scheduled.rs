use hexeract::{handler, scheduled, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
#[scheduled(every = "1m")]
async fn reserve_stock(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
#[handler(message = "OrderPlaced")]
async fn expire_carts(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
