use std::cell::RefCell;

use hexeract::Message;

// Serializable, but not `Sync`.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {
    pub lines: RefCell<Vec<String>>,
}

fn main() {}
