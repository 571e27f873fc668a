#![deny(unused_must_use)]

use hexeract::testing::Harness;
use hexeract::{App, AppConfig, HandlerOptions, HandlerOutcome, InMemoryStore, MemoryWorker, Registry};

fn main() {
    App::new(AppConfig::default()).listen(false);
    MemoryWorker::builder().store(InMemoryStore::new());
    HandlerOptions::new().name("audit");
    Harness::with_registry(Registry::new()).attempt(2);
    HandlerOutcome::reject("no such SKU");
}
