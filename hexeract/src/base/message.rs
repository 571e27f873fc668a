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

    /// The aggregate this message type belongs to, `#[message(aggregate = "order")]`: messages
    /// of one aggregate id are kept in order by transports that can (Kafka). `None` unless
    /// declared.
    const AGGREGATE: Option<&'static str> = None;

    /// The aggregate id of this message as text: the `#[message(key)]` field, which every
    /// message with an aggregate has. `None` for a message without an aggregate.
    fn aggregate_key(&self) -> Option<String> {
        None
    }
}

/// A type that can be an aggregate id (`#[message(key)]`): it is written as text, the
/// partition key of its messages. Integers, `String`, `Uuid` and references to them are.
///
/// ```
/// use hexeract::Message;
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced", aggregate = "order")]
/// pub struct OrderPlaced {
///     #[message(key)]
///     pub order_id: u64,
///     pub total_cents: i64,
/// }
///
/// let placed = OrderPlaced { order_id: 42, total_cents: 990 };
/// assert_eq!(OrderPlaced::AGGREGATE, Some("order"));
/// assert_eq!(placed.aggregate_key().as_deref(), Some("42"));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an aggregate key",
    label = "the `#[message(key)]` field",
    note = "an aggregate key is written as text, the partition key of the message: use an integer, a `String` or a `uuid::Uuid` (convert other ids to one of them)"
)]
pub trait AggregateKey {
    /// The key as text.
    fn to_key(&self) -> String;
}

macro_rules! display_keys {
    ($($ty:ty),*) => {
        $(impl AggregateKey for $ty {
            fn to_key(&self) -> String {
                self.to_string()
            }
        })*
    };
}

display_keys!(
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    String,
    uuid::Uuid
);

impl AggregateKey for str {
    fn to_key(&self) -> String {
        self.to_owned()
    }
}

impl<T: AggregateKey + ?Sized> AggregateKey for &T {
    fn to_key(&self) -> String {
        (**self).to_key()
    }
}
