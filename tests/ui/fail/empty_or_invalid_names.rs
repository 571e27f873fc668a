use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "")]
async fn empty_message(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[handler(message = "OrderPlaced", name = "billing reserve")]
async fn space_in_name(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
