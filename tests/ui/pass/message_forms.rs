//! `#[derive(Message)]` on every kind of type, and handlers declared in unusual places.
use hexeract::{handler, Context, Message};

/// Enums are messages too.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "inventory.StockChanged")]
pub enum StockChanged {
    Reserved { sku: String, quantity: u32 },
    Released { sku: String },
}

/// Generic messages need no extra bounds; the wire name is shared by every instantiation.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "audit.Changed")]
pub struct Changed<T> {
    pub before: T,
    pub after: T,
}

/// Tuple structs, raw identifiers and attributes after the derive.
#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(r#type = "Tick")]
#[allow(dead_code)]
pub struct Tick(pub u64);

type Outcome = Result<(), String>;

#[handler(message = "audit.Changed")]
/// Doc comments and other attributes stay on the function.
#[allow(clippy::needless_pass_by_value)]
async fn audit(change: Changed<i64>, _: &Context) -> Outcome {
    if change.before == change.after {
        return Err("nothing changed".into());
    }
    Ok(())
}

fn main() {
    assert_eq!(StockChanged::MESSAGE_TYPE, "inventory.StockChanged");
    assert_eq!(<Changed<i64>>::MESSAGE_TYPE, "audit.Changed");
    assert_eq!(Tick::MESSAGE_TYPE, "Tick");

    // A handler declared inside a function body is registered like any other.
    #[handler(message = "Tick", name = "local.on_tick")]
    async fn on_tick(Tick(n): Tick, _ctx: &Context) -> Result<(), std::num::TryFromIntError> {
        u32::try_from(n).map(drop)
    }

    let registry = hexeract::Registry::from_inventory().expect("registry");
    assert!(registry.get("local.on_tick").is_some());
    assert_eq!(registry.handlers_for("audit.Changed").len(), 1);
    assert_eq!(registry.handlers_for("inventory.StockChanged").len(), 0);
}
