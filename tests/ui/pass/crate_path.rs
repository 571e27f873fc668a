//! `crate = "…"` names the runtime crate by another path: a dependency renamed in Cargo.toml,
//! or a re-export. Here `hexeract` is reached as `::hx` (as after
//! `hx = { package = "hexeract-runtime", … }`) and as `crate::framework::engine`.
extern crate hexeract as hx;

use hexeract::__private::{inventory, HandlerRegistration, ScheduleRegistration};

pub mod framework {
    pub use ::hexeract as engine;
}

#[derive(Debug, serde::Serialize, serde::Deserialize, hx::Message)]
#[message(type = "OrderPlaced", crate = "::hx")]
pub struct OrderPlaced {
    pub order_id: u64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, framework::engine::Message)]
#[message(type = "OrderShipped", aggregate = "order", crate = "crate::framework::engine")]
pub struct OrderShipped {
    #[message(key)]
    pub order_id: u64,
}

#[derive(Clone)]
pub struct Warehouse;

#[hx::handler(message = "OrderPlaced", crate = "::hx")]
async fn reserve_stock(
    _event: OrderPlaced,
    _ctx: &hx::Context,
    _warehouse: hx::State<Warehouse>,
) -> Result<(), String> {
    Ok(())
}

#[framework::engine::handler(message = "OrderShipped", crate = "crate::framework::engine")]
async fn notify_customer(
    _event: OrderShipped,
    _ctx: &framework::engine::Context,
) -> framework::engine::HandlerOutcome {
    framework::engine::HandlerOutcome::Ack
}

#[hx::scheduled(every = "1m", crate = "::hx")]
async fn expire_carts(_ctx: &hx::Context, _warehouse: hx::State<Warehouse>) -> Result<(), String> {
    Ok(())
}

fn main() {
    use hx::Message;
    assert_eq!(OrderShipped::AGGREGATE, Some("order"));
    assert_eq!(
        OrderShipped { order_id: 7 }.aggregate_key().as_deref(),
        Some("7")
    );
    let handlers: Vec<&str> = inventory::iter::<HandlerRegistration>
        .into_iter()
        .map(|registration| registration.name)
        .collect();
    assert!(handlers.contains(&concat!(module_path!(), "::reserve_stock")));
    assert!(handlers.contains(&concat!(module_path!(), "::notify_customer")));
    let jobs: Vec<&str> = inventory::iter::<ScheduleRegistration>
        .into_iter()
        .map(|registration| registration.name)
        .collect();
    assert!(jobs.contains(&concat!(module_path!(), "::expire_carts")));
    let _ = (reserve_stock, notify_customer, expire_carts);
}
