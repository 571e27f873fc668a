use hexeract::{scheduled, Context};

#[scheduled(every = "1m")]
fn not_async(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async unsafe fn not_safe(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
