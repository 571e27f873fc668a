//! `#[message(aggregate = …)]` with its `#[message(key)]` field, on every supported key shape.
use hexeract::Message;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced", aggregate = "order")]
pub struct OrderPlaced {
    #[message(key)]
    pub order_id: u64,
    pub total_cents: i64,
}

/// A `String` key, other attributes beside it, and a key that is not the first field.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "stock.Reserved", aggregate = "stock-item")]
pub struct StockReserved {
    pub quantity: u32,
    #[serde(rename = "SKU")]
    #[message(key)]
    pub sku: String,
}

/// A tuple struct's field.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "AccountOpened", aggregate = "account")]
pub struct AccountOpened(#[message(key)] pub i32, pub String);

/// A generic message keyed by a field of a concrete type.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "audit.Changed", aggregate = "audit.entity")]
pub struct Changed<T> {
    #[message(key)]
    pub entity_id: u128,
    pub before: T,
    pub after: T,
}

/// No aggregate: no key.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "Tick")]
pub struct Tick(pub u64);

fn main() {
    assert_eq!(OrderPlaced::AGGREGATE, Some("order"));
    let placed = OrderPlaced {
        order_id: 42,
        total_cents: 1,
    };
    assert_eq!(placed.aggregate_key().as_deref(), Some("42"));
    let envelope = hexeract::Envelope::new(&placed).unwrap();
    assert_eq!(envelope.aggregate.as_deref(), Some("order"));
    assert_eq!(envelope.aggregate_key.as_deref(), Some("42"));

    let reserved = StockReserved {
        quantity: 2,
        sku: "mug-01".into(),
    };
    assert_eq!(StockReserved::AGGREGATE, Some("stock-item"));
    assert_eq!(reserved.aggregate_key().as_deref(), Some("mug-01"));
    assert_eq!(
        AccountOpened(-7, "x".into()).aggregate_key().as_deref(),
        Some("-7")
    );
    let changed = Changed {
        entity_id: 9,
        before: 1u8,
        after: 2u8,
    };
    assert_eq!(changed.aggregate_key().as_deref(), Some("9"));

    assert_eq!(Tick::AGGREGATE, None);
    assert_eq!(Tick(1).aggregate_key(), None);
    let envelope = hexeract::Envelope::new(&Tick(1)).unwrap();
    assert_eq!((envelope.aggregate, envelope.aggregate_key), (None, None));
}
