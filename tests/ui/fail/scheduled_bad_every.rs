use hexeract::{scheduled, Context};

#[scheduled(every = "500ms")]
async fn too_often(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "0s")]
async fn zero(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "5 minutes")]
async fn not_a_duration(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = 30)]
async fn not_a_string(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
