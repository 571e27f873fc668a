use hexeract::{scheduled, Context};

/// A 5-field expression, as crontab writes it: the seconds field is missing.
#[scheduled(cron = "0 */5 * * *")]
async fn five_fields(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(cron = "0 0 25 * * *")]
async fn out_of_range(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(cron = "0 0 0 30 2 *")]
async fn never_fires(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(cron = "@daily")]
async fn macro_name(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(cron = "0 0 12 L * *")]
async fn quartz_extension(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(cron = "")]
async fn empty(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
