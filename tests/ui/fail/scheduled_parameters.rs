use hexeract::{scheduled, Context};

#[scheduled(every = "1m")]
async fn no_parameter() -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async fn two_parameters(_ctx: &Context, _retries: u32) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async fn by_value(_ctx: Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async fn by_mut(_ctx: &mut Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
