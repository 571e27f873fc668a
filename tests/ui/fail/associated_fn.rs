use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

pub struct Stock;

impl Stock {
    #[handler(message = "OrderPlaced")]
    async fn reserve(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
        Ok(())
    }
}

fn main() {}
