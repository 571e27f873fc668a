use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler]
async fn bare(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[handler(name = "billing.reserve")]
async fn named_only(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
