use hexeract::scheduled;

#[scheduled(cron = "0 */5 * * *", tz = "europe/berlin", catch_up = "skip", timout = "10s")]
fn everything_wrong(_ctx: &mut hexeract::Context, _extra: u8) {}

fn main() {}
