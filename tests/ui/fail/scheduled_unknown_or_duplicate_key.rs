use hexeract::{scheduled, Context};

#[scheduled(every = "1m", timezone = "UTC")]
async fn unknown_key(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(evry = "1m")]
async fn misspelt_key(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m", every = "2m")]
async fn duplicate_key(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[scheduled("0 * * * * *")]
async fn positional(_ctx: &Context) -> Result<(), String> {
    Ok(())
}

fn main() {}
