use hexeract::scheduled;

#[scheduled(every = "1m")]
async fn borrowed_string(_ctx: &String) -> Result<(), String> {
    Ok(())
}

#[scheduled(every = "1m")]
async fn a_number(_ctx: u32) -> Result<(), String> {
    Ok(())
}

fn main() {}
