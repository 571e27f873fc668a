use hexeract::{scheduled, Context};

#[scheduled(every = "1m")]
#[scheduled(cron = "0 0 3 * * *", name = "carts::expire_nightly")]
async fn expire_carts(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
