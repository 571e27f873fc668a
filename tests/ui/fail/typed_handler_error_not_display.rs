use hexeract::{Context, Handler, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[derive(Debug)]
pub enum StockError {
    OutOfStock,
}

pub struct ReserveStock;

impl Handler<OrderPlaced> for ReserveStock {
    type Error = StockError;

    async fn handle(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), StockError> {
        Err(StockError::OutOfStock)
    }
}

fn main() {}
