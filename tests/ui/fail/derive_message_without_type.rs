use hexeract::Message;

#[derive(serde::Serialize, serde::Deserialize, Message)]
pub struct NoAttribute {}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message]
pub struct BareAttribute {}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message()]
pub struct EmptyAttribute {}

fn main() {}
