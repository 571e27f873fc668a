use std::rc::Rc;

use hexeract::{Context, Handler, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

pub struct ReserveStock;

impl Handler<OrderPlaced> for ReserveStock {
    type Error = String;

    async fn handle(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
        let counter = Rc::new(1);
        tokio::task::yield_now().await;
        drop(counter);
        Ok(())
    }
}

fn main() {}
