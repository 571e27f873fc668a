use hexeract::Message;

#[derive(Debug, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {
    pub order_id: u64,
}

fn main() {}
