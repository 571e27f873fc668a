//! Handlers: the typed [`Handler`] users implement (or `#[handler]` generates), the dyn-safe
//! [`ErasedHandler`] the registry stores, and the [`TypedHandler`] adapter between them.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;

use futures_util::future::BoxFuture;

use crate::context::Context;
use crate::envelope::Envelope;
use crate::message::Message;
use crate::outcome::{HandlerError, HandlerOutcome};
use crate::reason::Reason;

/// Handles messages of type `M`.
///
/// `#[handler]` implements this for an async fn; implement it yourself for a handler that
/// carries state (a pool, a client), and register it with a builder's `register_handler`
/// ([`OutboxWorkerBuilder`](crate::outbox::OutboxWorkerBuilder::register_handler),
/// [`MemoryWorkerBuilder`](crate::MemoryWorkerBuilder::register_handler), …).
///
/// `Ok(())` acks. An `Err` is retried (with backoff, until the calls run out) when `Error` is an
/// ordinary error; with `type Error = HandlerOutcome` the handler says what an `Err` does, such
/// as `Err(HandlerOutcome::dead_letter("sku_unknown", …))` ([`HandlerError`]).
///
/// ```
/// use hexeract::{Context, Handler, Message};
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// struct OrderPlaced { order_id: u64 }
///
/// struct ReserveStock { warehouse: String }
///
/// impl Handler<OrderPlaced> for ReserveStock {
///     type Error = std::io::Error;
///
///     async fn handle(&self, event: OrderPlaced, ctx: &Context) -> Result<(), Self::Error> {
///         println!("{}: reserve order {} (message {})", self.warehouse, event.order_id, ctx.message_id());
///         Ok(())
///     }
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not handle `{M}`: it is not a `Handler<{M}>`",
    label = "not a `Handler<{M}>`",
    note = "register a handler for the message type it handles (`register_handler` infers it from the one `impl Handler<M>`), or implement `hexeract::Handler<{M}>` for it"
)]
pub trait Handler<M>: Send + Sync + 'static {
    /// What an `Err` of a call is: any `Display` error (retried), or [`HandlerOutcome`].
    type Error: HandlerError;

    /// Handles one delivery of `message`.
    fn handle(
        &self,
        message: M,
        ctx: &Context,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// A handler with its message type erased: what the registry stores and workers call.
///
/// Workers never see message types: they look the envelope's type up in the registry and call
/// this, and the adapter behind it decodes. An envelope that does not decode comes back as
/// [`HandlerOutcome::DeadLetter`] with [`Reason::PAYLOAD_INVALID`].
pub trait ErasedHandler: Send + Sync + 'static {
    /// The [`Message::MESSAGE_TYPE`] this handler accepts.
    fn message_type(&self) -> &'static str;

    /// The [`Message::AGGREGATE`] of that message type: `None` unless it declares one (a
    /// transport that orders by aggregate, Kafka, needs one).
    fn aggregate(&self) -> Option<&'static str> {
        None
    }

    /// Decodes `envelope` and calls the typed handler.
    fn handle<'a>(
        &'a self,
        envelope: &'a Envelope,
        ctx: &'a Context,
    ) -> BoxFuture<'a, HandlerOutcome>;
}

/// Adapts a typed [`Handler<M>`] to [`ErasedHandler`]: decode, call, map the result.
pub struct TypedHandler<M, H> {
    handler: H,
    _message: PhantomData<fn() -> M>,
}

impl<M: Message, H: Handler<M>> TypedHandler<M, H> {
    /// Wraps `handler`.
    pub fn new(handler: H) -> TypedHandler<M, H> {
        TypedHandler {
            handler,
            _message: PhantomData,
        }
    }
}

impl<M, H> fmt::Debug for TypedHandler<M, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedHandler")
            .field("message", &std::any::type_name::<M>())
            .field("handler", &std::any::type_name::<H>())
            .finish()
    }
}

impl<M: Message, H: Handler<M>> ErasedHandler for TypedHandler<M, H> {
    fn message_type(&self) -> &'static str {
        M::MESSAGE_TYPE
    }

    fn aggregate(&self) -> Option<&'static str> {
        M::AGGREGATE
    }

    fn handle<'a>(
        &'a self,
        envelope: &'a Envelope,
        ctx: &'a Context,
    ) -> BoxFuture<'a, HandlerOutcome> {
        Box::pin(async move {
            match envelope.decode::<M>() {
                Ok(message) => match self.handler.handle(message, ctx).await {
                    Ok(()) => HandlerOutcome::Ack,
                    Err(error) => error.into_outcome(),
                },
                Err(error) => HandlerOutcome::dead_letter(Reason::PAYLOAD_INVALID, error),
            }
        })
    }
}
