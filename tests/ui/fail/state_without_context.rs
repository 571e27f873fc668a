use hexeract::{handler, scheduled, Message, State};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[derive(Clone)]
pub struct Pool;

#[handler(message = "OrderPlaced")]
async fn reserve_stock(_event: OrderPlaced, State(_pool): State<Pool>) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async fn expire_carts(_pool: State<Pool>) -> Result<(), String> {
    Ok(())
}

fn main() {}
