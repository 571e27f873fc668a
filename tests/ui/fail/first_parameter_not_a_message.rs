use hexeract::{handler, Context};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async fn reserve_stock(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
