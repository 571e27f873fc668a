//! The [`Message`] trait: a type that travels between services under a stable wire name.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A type that can be published and handled.
///
/// `MESSAGE_TYPE` is the name the message travels under: the routing key on a broker and the
/// `message_type` column in the outbox. It is part of the wire contract, so it is spelled out
/// with `#[message(type = "…")]` rather than taken from the Rust type name, and renaming the
/// Rust type does not break producers or consumers. Payloads are JSON (`serde_json`).
///
/// # Example
///
/// ```
/// use hexeract::Message;
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// pub struct OrderPlaced {
///     pub order_id: u64,
///     pub total_cents: i64,
/// }
///
/// assert_eq!(OrderPlaced::MESSAGE_TYPE, "OrderPlaced");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Hexeract message",
    label = "not a `hexeract::Message`",
    note = "derive it: `#[derive(serde::Serialize, serde::Deserialize, hexeract::Message)]` with `#[message(type = \"…\")]` on the type"
)]
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The wire name of this message type, e.g. `"OrderPlaced"`.
    const MESSAGE_TYPE: &'static str;
}
