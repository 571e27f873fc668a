use hexeract::{handler, scheduled, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced", crate = "hexeract runtime")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced", crate = "::hexeract::")]
async fn reserve_stock(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m", crate = hexeract)]
async fn expire_carts(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
