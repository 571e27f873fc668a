use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async fn returns_bool(_event: OrderPlaced, _ctx: &Context) -> bool {
    true
}

fn main() {}
