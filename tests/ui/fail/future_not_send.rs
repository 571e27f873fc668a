use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async fn holds_rc(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    let counter = std::rc::Rc::new(1);
    tokio::task::yield_now().await;
    drop(counter);
    Ok(())
}

fn main() {}
