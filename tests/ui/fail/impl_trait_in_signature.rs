use hexeract::{handler, Context, IntoOutcome, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(message = "OrderPlaced")]
async fn any_message(_event: impl Message, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[handler(message = "OrderPlaced")]
async fn any_outcome(_event: OrderPlaced, _ctx: &Context) -> impl IntoOutcome {
    Ok::<(), String>(())
}

fn main() {}
