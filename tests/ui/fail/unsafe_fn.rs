use hexeract::{handler, scheduled, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async unsafe fn reserve_stock(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async unsafe fn expire_carts(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
