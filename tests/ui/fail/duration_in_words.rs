use hexeract::{handler, scheduled, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced", timeout = "5 minutes")]
async fn reserve_stock(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "30 s")]
async fn expire_carts(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "90")]
async fn sync(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1.5h")]
async fn report(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
