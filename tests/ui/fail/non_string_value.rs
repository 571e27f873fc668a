use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = OrderPlaced)]
async fn path_instead_of_string(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[handler(message = "OrderPlaced", name = billing)]
async fn bare_name(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
