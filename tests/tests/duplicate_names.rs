//! Two handlers with the same name are a startup error naming both places. In a test binary
//! of its own: every other binary's registry must stay valid.

use hexeract::{handler, Context, MemoryWorker, Message};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "test.Ping")]
struct Ping {}

#[handler(message = "test.Ping", name = "billing.charge")]
async fn charge(_ping: Ping, _ctx: &Context) -> Result<(), String> {
    Ok(())
}

mod copy {
    use super::Ping;
    use hexeract::{handler, Context};

    #[handler(message = "test.Ping", name = "billing.charge")]
    async fn charge_again(_ping: Ping, _ctx: &Context) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn a_shared_name_stops_startup_and_names_both_places() {
    let error = MemoryWorker::builder()
        .build()
        .expect_err("duplicate names accepted");
    let text = error.to_string();
    assert!(text.contains("`billing.charge`"), "{text}");
    assert!(
        text.contains("tests/duplicate_names.rs:11:"),
        "first place missing: {text}"
    );
    assert!(
        text.contains("tests/duplicate_names.rs:20:"),
        "second place missing: {text}"
    );
}
