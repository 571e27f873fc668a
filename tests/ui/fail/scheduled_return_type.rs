use hexeract::{scheduled, Context};

#[scheduled(every = "1m")]
async fn returns_bool(_ctx: &Context) -> bool {
    true
}

#[scheduled(every = "1m")]
async fn returns_nothing(_ctx: &Context) {}

fn main() {}
