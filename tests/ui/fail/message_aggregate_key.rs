use hexeract::Message;

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced", aggregate = "order")]
pub struct NoKey {
    pub order_id: u64,
}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderShipped")]
pub struct KeyWithoutAggregate {
    #[message(key)]
    pub order_id: u64,
}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderMerged", aggregate = "order")]
pub struct TwoKeys {
    #[message(key)]
    pub order_id: u64,
    #[message(key)]
    pub other_id: u64,
}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderLineAdded", aggregate = "order items")]
pub struct BadAggregateName {
    #[message(key)]
    pub order_id: u64,
}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderNoted", aggregate = "order")]
pub struct WrongFieldAttribute {
    #[message(id)]
    pub order_id: u64,
}

#[derive(serde::Serialize, serde::Deserialize, Message)]
#[message(type = "StockChanged", aggregate = "stock")]
pub enum KeyInAnEnum {
    Reserved {
        #[message(key)]
        sku: String,
    },
}

fn main() {}
