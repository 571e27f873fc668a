use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(mesage = "OrderPlaced")]
async fn typo(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[handler(message = "OrderPlaced", retries = 3)]
async fn unsupported(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
