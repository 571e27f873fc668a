use std::rc::Rc;

use hexeract::{Context, HandlerOutcome, Middleware, Next};

pub struct Counted;

impl Middleware for Counted {
    async fn handle(&self, ctx: &Context, next: Next<'_>) -> HandlerOutcome {
        let calls = Rc::new(1);
        let outcome = next.run(ctx).await;
        drop(calls);
        outcome
    }
}

fn main() {}
