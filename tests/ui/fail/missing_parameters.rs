use hexeract::{handler, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async fn reserve_stock() -> Result<(), String> {
    Ok(())
}

fn main() {}
