use hexeract::{handler, scheduled, Context, Message, State};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[derive(Clone)]
pub struct Pool;

#[handler(message = "OrderPlaced")]
async fn by_reference(_event: OrderPlaced, _ctx: &Context, _db: &Pool) -> Result<(), String> {
    Ok(())
}

#[handler(message = "OrderPlaced")]
async fn without_state(_event: OrderPlaced, _ctx: &Context, _db: Pool) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async fn job_by_reference(_ctx: &Context, _db: &State<Pool>) -> Result<(), String> {
    Ok(())
}

fn main() {}
