//! Handlers declared through `macro_rules!`, and next to items named like what the expansion
//! introduces.
use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {
    pub order_id: u64,
}

/// A message type whose wire name is a `$wire:literal`.
macro_rules! message_type {
    ($name:ident, $wire:literal) => {
        #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
        #[message(type = $wire)]
        pub struct $name {}
    };
}

message_type!(OrderCancelled, "OrderCancelled");

/// Every part passed in: `$wire:literal`, `$limit:expr`, `$m:ty` and `$c:ty` arrive wrapped in
/// invisible groups.
macro_rules! audit_handler {
    ($name:ident, $wire:literal, $limit:expr, $m:ty, $c:ty) => {
        #[handler(message = $wire, concurrency = $limit)]
        async fn $name(_event: $m, _ctx: $c) -> Result<(), String> {
            Ok(())
        }
    };
}

audit_handler!(audit_orders, "OrderPlaced", 2, OrderPlaced, &Context);
audit_handler!(audit_orders_in_full, "OrderPlaced", 3, crate::OrderPlaced, &hexeract::Context);

/// The whole handler written in the macro, its parameter names included.
macro_rules! written_in_macro {
    () => {
        #[handler(message = "OrderPlaced")]
        async fn written_in_macro(message: OrderPlaced, ctx: &Context) -> Result<(), String> {
            if message.order_id + u64::from(ctx.attempt()) == 0 {
                return Err("impossible".into());
            }
            Ok(())
        }
    };
}

written_in_macro!();

mod lookalikes {
    use super::OrderPlaced;
    use hexeract::{handler, Context};

    #[allow(non_upper_case_globals, dead_code)]
    const message: u8 = 0;
    #[allow(non_camel_case_types, dead_code)]
    struct ctx;
    #[allow(non_upper_case_globals, dead_code)]
    static typed: u8 = 0;

    #[handler(message = "OrderPlaced")]
    async fn next_to_lookalikes(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
        Ok(())
    }
}

/// An alias of `&Context` is `&Context`.
type Ctx<'a> = &'a Context;

#[handler(message = "OrderPlaced")]
async fn through_alias(_event: OrderPlaced, _ctx: Ctx<'_>) -> Result<(), String> {
    Ok(())
}

fn main() {
    assert_eq!(OrderCancelled::MESSAGE_TYPE, "OrderCancelled");
    let registry = hexeract::Registry::from_inventory().expect("registry");
    let crate_name = module_path!();
    let names: Vec<String> = registry
        .handlers()
        .map(|info| info.name.replace(crate_name, "crate"))
        .collect();
    assert_eq!(
        names,
        [
            "crate::audit_orders",
            "crate::audit_orders_in_full",
            "crate::lookalikes::next_to_lookalikes",
            "crate::through_alias",
            "crate::written_in_macro",
        ]
    );
    let limit = |name: &str| {
        let name = format!("{crate_name}::{name}");
        registry.get(&name).unwrap().info().concurrency.map(|c| c.get())
    };
    assert_eq!(limit("audit_orders"), Some(2));
    assert_eq!(limit("audit_orders_in_full"), Some(3));
}
