use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(OrderPlaced)]
async fn positional(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[handler(message = )]
async fn no_value(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
