//! Integration and UI tests of Hexeract live in `tests/`; this library holds what they share.

pub mod amqp;
pub mod http;
pub mod in_place;
pub mod kafka;
pub mod ledger;
pub mod logs;
pub mod pg;
pub mod proxy;
pub mod temp;
pub mod tls;
