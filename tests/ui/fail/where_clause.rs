use hexeract::{handler, scheduled, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async fn reserve_stock(_event: OrderPlaced, _ctx: &Context) -> Result<(), String>
where
    OrderPlaced: Send,
{
    Ok(())
}

#[scheduled(every = "1m")]
async fn expire_carts(_ctx: &Context) -> Result<(), String>
where
    String: Clone,
{
    Ok(())
}

fn main() {}
