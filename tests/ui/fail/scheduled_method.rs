use hexeract::{scheduled, Context};

pub struct Reports;

impl Reports {
    #[scheduled(every = "1m")]
    async fn nightly(&self, _ctx: &Context) -> Result<(), String> {
        Ok(())
    }
}

fn main() {}
