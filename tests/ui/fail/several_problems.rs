use hexeract::{handler, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[handler(mesage = "OrderPlaced", timeout = "soon", concurrency = 0)]
fn everything_wrong(_event: &OrderPlaced) -> Result<(), String> {
    Ok(())
}

fn main() {}
