use hexeract::{handler, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async fn reserve_stock(_event: OrderPlaced, _ctx: &String) -> Result<(), String> {
    Ok(())
}

#[handler(message = "OrderPlaced")]
async fn by_value(_event: OrderPlaced, _ctx: String) -> Result<(), String> {
    Ok(())
}

fn main() {}
