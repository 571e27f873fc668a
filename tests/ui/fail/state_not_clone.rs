use hexeract::{handler, Context, Message, State};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

pub struct Settings {
    pub warehouse: String,
}

#[handler(message = "OrderPlaced")]
async fn reserve_stock(
    _event: OrderPlaced,
    _ctx: &Context,
    _settings: State<Settings>,
) -> Result<(), String> {
    Ok(())
}

fn main() {}
