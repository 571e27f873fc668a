use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async fn by_value(_event: OrderPlaced, _ctx: Context) -> Result<(), String> {
    Ok(())
}

#[handler(message = "OrderPlaced")]
async fn by_mut(_event: OrderPlaced, _ctx: &mut Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
