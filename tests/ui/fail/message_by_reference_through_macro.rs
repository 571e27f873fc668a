use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

macro_rules! declare_handler {
    ($name:ident, $m:ty, $c:ty) => {
        #[handler(message = "OrderPlaced")]
        async fn $name(_event: $m, _ctx: $c) -> Result<(), String> {
            Ok(())
        }
    };
}

declare_handler!(message_by_reference, &OrderPlaced, &Context);
declare_handler!(context_by_mut, OrderPlaced, &mut Context);

fn main() {}
