//! [`Context`]: what a handler knows about the delivery it is handling.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::envelope::{EncodeError, Envelope};
use crate::message::Message;
use crate::publish::{Publish, PublishError};

/// The delivery a handler is called with: ids, attempt, headers, shutdown signal, and a way to
/// publish follow-up messages in the same conversation.
///
/// ```
/// use hexeract::{handler, Context, Message};
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// struct OrderPlaced { order_id: u64 }
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "InvoiceRequested")]
/// struct InvoiceRequested { order_id: u64 }
///
/// #[handler(message = "OrderPlaced")]
/// async fn request_invoice(event: OrderPlaced, ctx: &Context) -> Result<(), hexeract::PublishError> {
///     tracing::info!(message_id = %ctx.message_id(), attempt = ctx.attempt(), "requesting invoice");
///     // Carries this message's correlation id; its causation id is this message's id.
///     ctx.publish(&InvoiceRequested { order_id: event.order_id }).await?;
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct Context {
    /// Shared with the world that delivers it: a call costs no copy of the message.
    envelope: Arc<Envelope>,
    handler: Arc<str>,
    cancellation: Cancellation,
    publisher: Arc<dyn Publish>,
    /// Set by the scheduler alone: a message cannot pass for a job's run.
    scheduled_run: bool,
    /// This call's W3C span id (never zero): the parent id of what it publishes.
    span_id: u64,
}

impl Context {
    /// A context for one call of `handler` with `envelope`.
    pub fn new(
        envelope: Envelope,
        handler: impl Into<Arc<str>>,
        cancellation: CancellationToken,
        publisher: Arc<dyn Publish>,
    ) -> Context {
        Context {
            envelope: Arc::new(envelope),
            handler: handler.into(),
            cancellation: Cancellation::Given(cancellation),
            publisher,
            scheduled_run: false,
            span_id: crate::envelope::new_span_id(),
        }
    }

    /// The context of one call made by a world: the envelope shared with it, and the call's
    /// cancellation, made only if the handler asks for it.
    pub(crate) fn for_call(
        envelope: Arc<Envelope>,
        handler: Arc<str>,
        cancellation: Arc<CallCancellation>,
        publisher: Arc<dyn Publish>,
    ) -> Context {
        Context {
            envelope,
            handler,
            cancellation: Cancellation::Call(cancellation),
            publisher,
            scheduled_run: false,
            span_id: crate::envelope::new_span_id(),
        }
    }

    /// This call's span id in the W3C Trace Context sense (16 hex digits): the handler's
    /// `hexeract.handle` span records it as `span_id` when the message carries a trace, and a
    /// follow-up published with [`publish`](Context::publish) carries it as the parent id of
    /// its `traceparent`, so each hop of a trace points at the call that made it.
    pub fn span_id(&self) -> String {
        format!("{:016x}", self.span_id)
    }

    /// This context is a scheduled job's run (only the scheduler makes one).
    pub(crate) fn for_scheduled_run(mut self) -> Context {
        self.scheduled_run = true;
        self
    }

    /// For a scheduled job's run, the fire time it stands for; `None` for a message (whatever
    /// headers it carries: only the scheduler makes a job's run), so a middleware can tell a
    /// job's run from a message.
    ///
    /// ```
    /// use hexeract::{scheduled, Context};
    ///
    /// #[scheduled(every = "1h")]
    /// async fn hourly_report(ctx: &Context) -> Result<(), std::io::Error> {
    ///     // After downtime, one run stands for the missed fire times: this is the first.
    ///     let hour = ctx.scheduled_for().expect("a scheduled run");
    ///     println!("report for the hour before {hour}");
    ///     Ok(())
    /// }
    /// ```
    pub fn scheduled_for(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        if !self.scheduled_run {
            return None;
        }
        let text = self
            .envelope
            .headers
            .get(crate::envelope::FIRE_TIME_HEADER)?;
        chrono::DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|time| time.with_timezone(&chrono::Utc))
    }

    /// The message id (UUID v7). Deduplicate on it: delivery is at-least-once.
    pub fn message_id(&self) -> Uuid {
        self.envelope.id
    }

    /// The message's wire type, e.g. `"OrderPlaced"`.
    pub fn message_type(&self) -> &str {
        &self.envelope.message_type
    }

    /// Which call of this handler for this message this is: 1 the first time.
    pub fn attempt(&self) -> u32 {
        self.envelope.attempt
    }

    /// The conversation's id, if the message belongs to one.
    pub fn correlation_id(&self) -> Option<Uuid> {
        self.envelope.correlation_id
    }

    /// The id of the message whose handling published this one.
    pub fn causation_id(&self) -> Option<Uuid> {
        self.envelope.causation_id
    }

    /// A header of the message.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.envelope.header(name)
    }

    /// All further headers of the message.
    pub fn headers(&self) -> &BTreeMap<String, String> {
        &self.envelope.headers
    }

    /// The whole envelope, payload bytes included.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// The name of the handler being called.
    pub fn handler_name(&self) -> &str {
        &self.handler
    }

    /// Cancelled when the runtime shuts down, or when this call has run past its timeout and
    /// was given up on. The runtime never drops a running call: it leaves it to finish and
    /// fires this, so a long handler should watch it, stop early and return `Err`. A call that
    /// fails after the shutdown began does not count against `MAX_DELIVERIES` (in-memory
    /// runtime), and the message is delivered again later either way.
    pub fn cancellation(&self) -> &CancellationToken {
        match &self.cancellation {
            Cancellation::Given(token) => token,
            Cancellation::Call(call) => call.token(),
        }
    }

    /// Publishes a follow-up message in this message's conversation: same correlation id, and
    /// this message's id as causation id. Returns the new message's id.
    pub async fn publish<M: Message>(&self, message: &M) -> Result<Uuid, PublishError> {
        self.publisher
            .publish_envelope(self.follow_up(message)?)
            .await
    }

    /// The envelope of a follow-up message, as [`publish`](Context::publish) makes it (same
    /// correlation id, this message's id as causation id, the trace one hop further with this
    /// call's [`span_id`](Context::span_id) as parent id), for a handler that writes it in a
    /// transaction of its own with
    /// [`outbox::enqueue_envelope`](crate::outbox::enqueue_envelope).
    ///
    /// ```
    /// # use hexeract::{Context, Message};
    /// # #[derive(serde::Serialize, serde::Deserialize, Message)]
    /// # #[message(type = "StockReserved")]
    /// # struct StockReserved { order_id: u64 }
    /// # fn example(ctx: &Context) -> Result<(), hexeract::EncodeError> {
    /// let follow_up = ctx.follow_up(&StockReserved { order_id: 7 })?;
    /// assert_eq!(follow_up.causation_id, Some(ctx.message_id()));
    /// # Ok(())
    /// # }
    /// ```
    pub fn follow_up<M: Message>(&self, message: &M) -> Result<Envelope, EncodeError> {
        let mut envelope = Envelope::new(message)?.caused_by_span(&self.envelope, self.span_id);
        crate::trace::produce(&mut envelope);
        Ok(envelope)
    }
}

/// Where a context's [`cancellation`](Context::cancellation) comes from.
#[derive(Clone)]
enum Cancellation {
    /// A token given whole ([`Context::new`]).
    Given(CancellationToken),
    /// A world's call: a child of the world's stop, made when first asked for.
    Call(Arc<CallCancellation>),
}

/// The cancellation of one call: fires when its world stops, or when the world gives up on the
/// call (a timeout, or a shutdown past its grace).
///
/// Most handlers never look at it, so its token is made on the first
/// [`Context::cancellation`]: a call that does not ask costs no child token (an allocation and
/// three locks on the tree of tokens, taken and released per message).
pub(crate) struct CallCancellation {
    stop: CancellationToken,
    token: OnceLock<CancellationToken>,
    given_up: AtomicBool,
}

impl CallCancellation {
    /// The cancellation of a call in a world that stops with `stop`.
    pub(crate) fn new(stop: CancellationToken) -> CallCancellation {
        CallCancellation {
            stop,
            token: OnceLock::new(),
            given_up: AtomicBool::new(false),
        }
    }

    fn token(&self) -> &CancellationToken {
        if let Some(token) = self.token.get() {
            return token;
        }
        let token = self.token.get_or_init(|| self.stop.child_token());
        // Against `give_up` on another thread: either it sees the token (and cancels it), or
        // this sees its flag. The fences order each side's write before its read.
        fence(Ordering::SeqCst);
        if self.given_up.load(Ordering::Relaxed) {
            token.cancel();
        }
        token
    }

    /// The world gave up on the call: its token fires, now or when it is made.
    pub(crate) fn give_up(&self) {
        self.given_up.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if let Some(token) = self.token.get() {
            token.cancel();
        }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("message_id", &self.envelope.id)
            .field("message_type", &self.envelope.message_type)
            .field("attempt", &self.envelope.attempt)
            .field("handler", &self.handler)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_given_up_on_before_it_asks_gets_a_cancelled_token() {
        let call = CallCancellation::new(CancellationToken::new());
        call.give_up();
        assert!(call.token().is_cancelled());
    }

    #[test]
    fn a_token_asked_for_fires_when_the_call_is_given_up_on() {
        let call = CallCancellation::new(CancellationToken::new());
        let token = call.token().clone();
        assert!(!token.is_cancelled(), "nothing happened yet");
        call.give_up();
        assert!(token.is_cancelled());
    }

    #[test]
    fn a_token_asked_for_fires_when_the_world_stops() {
        let stop = CancellationToken::new();
        let call = CallCancellation::new(stop.clone());
        let token = call.token().clone();
        stop.cancel();
        assert!(token.is_cancelled());
        // Made after the stop, it is cancelled from the start.
        let late = CallCancellation::new(stop);
        assert!(late.token().is_cancelled());
    }

    #[test]
    fn a_give_up_racing_the_first_ask_is_never_lost() {
        for _ in 0..2_000 {
            let call = Arc::new(CallCancellation::new(CancellationToken::new()));
            let asker = {
                let call = call.clone();
                std::thread::spawn(move || call.token().clone())
            };
            call.give_up();
            let token = asker.join().expect("no panic");
            assert!(token.is_cancelled(), "the give-up was lost");
        }
    }

    #[test]
    fn a_context_shares_the_envelope_it_was_made_with() {
        let envelope = Arc::new(Envelope::from_raw("Ping", &b"{}"[..]));
        let call = Arc::new(CallCancellation::new(CancellationToken::new()));
        let publisher: Arc<dyn Publish> = Arc::new(crate::InMemoryStore::new());
        let ctx = Context::for_call(envelope.clone(), Arc::from("h"), call, publisher);
        assert!(std::ptr::eq(ctx.envelope(), &*envelope), "no copy");
        drop(ctx);
        assert_eq!(
            Arc::strong_count(&envelope),
            1,
            "the world has it back alone"
        );
    }
}
