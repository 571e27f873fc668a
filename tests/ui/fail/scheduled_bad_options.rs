use hexeract::{scheduled, Context};

#[scheduled(every = "1m", catch_up = "always")]
async fn bad_catch_up(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m", timeout = "30x")]
async fn bad_timeout(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m", timeout = "0s")]
async fn zero_timeout(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m", name = "nightly report")]
async fn bad_name(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m", name = "")]
async fn empty_name(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async fn größe(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
