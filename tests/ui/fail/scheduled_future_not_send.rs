use hexeract::{scheduled, Context};

#[scheduled(every = "1m")]
async fn holds_rc(_ctx: &Context) -> Result<(), String> {
    let counter = std::rc::Rc::new(1);
    tokio::task::yield_now().await;
    drop(counter);
    Ok(())
}

fn main() {}
