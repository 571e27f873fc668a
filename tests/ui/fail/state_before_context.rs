use hexeract::{handler, scheduled, Context, Message, State};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[derive(Clone)]
pub struct Pool;

// axum's order, state before the request: here the context comes first.
#[handler(message = "OrderPlaced")]
async fn reserve_stock(
    _event: OrderPlaced,
    State(_pool): State<Pool>,
    _ctx: &Context,
) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async fn expire_carts(State(_pool): State<Pool>, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
