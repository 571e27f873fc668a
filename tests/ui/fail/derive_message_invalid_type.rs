use hexeract::Message;

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = "")]
pub struct EmptyType {}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = "orders.*")]
pub struct Wildcard {}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(typ = "OrderPlaced")]
pub struct Misspelt {}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = OrderPlaced)]
pub struct NotAString {}

fn main() {}
