use std::rc::Rc;

use hexeract::{handler, Context, Message, State};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[derive(Clone)]
pub struct Cache {
    pub entries: Rc<Vec<String>>,
}

#[handler(message = "OrderPlaced")]
async fn reserve_stock(
    _event: OrderPlaced,
    _ctx: &Context,
    _cache: State<Cache>,
) -> Result<(), String> {
    Ok(())
}

fn main() {}
