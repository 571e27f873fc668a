use hexeract::{Context, Handler, InMemoryStore, MemoryWorker, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderShipped")]
pub struct OrderShipped {}

pub struct ReserveStock;

impl Handler<OrderPlaced> for ReserveStock {
    type Error = String;

    async fn handle(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
        Ok(())
    }
}

fn main() {
    let _worker = MemoryWorker::builder()
        .store(InMemoryStore::new())
        .register_handler::<OrderShipped, _>(ReserveStock);
}
