//! Default names of handlers whose function names are raw or not ASCII.
use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

/// Named `crate::match`, as a queue name cannot hold `r#`.
#[handler(message = "OrderPlaced")]
async fn r#match(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

/// A function name that is not ASCII is fine with a `name`.
#[handler(message = "OrderPlaced", name = "orders.grosse")]
async fn größe(_event: OrderPlaced, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {
    let registry = hexeract::Registry::from_inventory().expect("registry");
    let crate_name = module_path!();
    let mut names: Vec<String> = registry
        .handlers()
        .map(|info| info.name.replace(crate_name, "crate"))
        .collect();
    names.sort();
    assert_eq!(names, ["crate::match", "orders.grosse"]);
}
