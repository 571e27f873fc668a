use std::cell::RefCell;

use hexeract::{Context, Handler, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

pub struct CountOrders {
    pub seen: RefCell<u64>,
}

impl Handler<OrderPlaced> for CountOrders {
    type Error = String;

    async fn handle(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
        *self.seen.borrow_mut() += 1;
        Ok(())
    }
}

fn main() {}
