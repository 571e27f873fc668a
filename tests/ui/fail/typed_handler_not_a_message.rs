use hexeract::{Context, Handler, InMemoryStore, MemoryWorker};

pub struct Echo;

impl Handler<String> for Echo {
    type Error = String;

    async fn handle(&self, _text: String, _ctx: &Context) -> Result<(), String> {
        Ok(())
    }
}

fn main() {
    let _worker = MemoryWorker::builder()
        .store(InMemoryStore::new())
        .register_handler(Echo);
}
