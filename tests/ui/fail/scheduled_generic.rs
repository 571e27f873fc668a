use hexeract::{scheduled, Context};

#[scheduled(every = "1m")]
async fn generic<T: Default>(_ctx: &Context) -> Result<(), String> {
    let _ = T::default();
    Ok(())
}

fn main() {}
