use hexeract::{scheduled, Context};

#[scheduled(cron = "0 30 2 * * *", tz = "Europe/Berln")]
async fn misspelt(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(cron = "0 30 2 * * *", tz = "Mars/Olympus_Mons")]
async fn unknown(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1h", tz = "Europe/Berlin")]
async fn with_every(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
