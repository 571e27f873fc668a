use std::borrow::Cow;

use hexeract::{handler, Context, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "OrderPlaced")]
pub struct OrderPlaced {}

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "NoteAdded")]
pub struct NoteAdded<'a> {
    pub text: Cow<'a, str>,
}

#[handler(message = "NoteAdded")]
async fn borrowed_message<'a>(_event: NoteAdded<'a>, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

#[handler(message = "OrderPlaced")]
async fn elided_error(_event: OrderPlaced, _ctx: &Context) -> Result<(), &str> {
    Ok(())
}

#[handler(message = "OrderPlaced")]
async fn error_borrowing_context<'a>(_event: OrderPlaced, ctx: &'a Context) -> Result<(), &'a str> {
    Err(ctx.message_type())
}

fn main() {}
