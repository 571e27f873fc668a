use hexeract::{scheduled, Context};

#[scheduled]
async fn no_arguments(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(name = "reports::nightly")]
async fn no_schedule(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(cron = "0 0 * * * *", every = "1h")]
async fn both(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
