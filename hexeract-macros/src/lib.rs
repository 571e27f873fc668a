//! Procedural macros for [Hexeract](https://docs.rs/hexeract-runtime).
//!
//! Do not depend on this crate directly: use the re-exports `hexeract::handler`,
//! `hexeract::scheduled` and `hexeract::Message`, whose documentation has the examples. Generated code only refers to
//! `::hexeract::__private`, so the runtime and these macros are versioned together (`=x.y.z`).

mod args;
mod ctxt;
mod duration;
mod fn_checks;
mod handler;
mod message;
mod scheduled;
mod state;
mod types;

use proc_macro::TokenStream;

/// Registers an async fn as the handler of one message type. See `hexeract::handler`.
#[proc_macro_attribute]
pub fn handler(args: TokenStream, item: TokenStream) -> TokenStream {
    handler::expand(args.into(), item.into()).into()
}

/// Registers an async fn as a scheduled job (`cron = "…"` or `every = "…"`). See
/// `hexeract::scheduled`.
#[proc_macro_attribute]
pub fn scheduled(args: TokenStream, item: TokenStream) -> TokenStream {
    scheduled::expand(args.into(), item.into()).into()
}

/// Implements `hexeract::Message` for a type. See `hexeract::Message`.
#[proc_macro_derive(Message, attributes(message))]
pub fn derive_message(input: TokenStream) -> TokenStream {
    message::expand(input.into()).into()
}
