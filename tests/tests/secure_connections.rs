//! Secure connections are verified: a PostgreSQL server whose certificate no trusted authority
//! issued is refused before any query, and the same server is accepted once its authority is
//! given (`sslrootcert`). Which URLs must verify (every host but this machine) is
//! `secure.rs`'s table and `config.rs`'s startup check; this is the refusal on the wire.
//!
//! Needs PostgreSQL at `TEST_DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`):
//! a local TLS endpoint with a certificate of its own, made for the run, stands in front of it.

use hexeract::store::postgres::PgStore;
use hexeract_tests::pg::{database_addr, database_url};
use hexeract_tests::tls::TlsProxy;

/// The test database's URL, through the TLS endpoint on `port`, named `localhost` (the name
/// its certificate carries), with `query` added.
fn through(port: u16, query: &str) -> String {
    let mut url = url::Url::parse(&database_url()).expect("TEST_DATABASE_URL is a URL");
    url.set_host(Some("localhost")).unwrap();
    url.set_port(Some(port)).unwrap();
    url.set_query(Some(query));
    url.into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_certificate_from_an_unknown_authority_is_refused_and_a_known_one_accepted() {
    let proxy = TlsProxy::start_postgres(database_addr()).await;

    let refused = PgStore::connect(&through(proxy.port, "sslmode=verify-full"))
        .await
        .expect_err("a certificate no trusted authority issued");
    let text = refused.to_string();
    assert!(
        text.contains("certificate") || text.contains("UnknownIssuer"),
        "{text}"
    );
    assert_eq!(
        proxy.sessions.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no TLS session was completed"
    );

    let trusted = format!(
        "sslmode=verify-full&sslrootcert={}",
        proxy.ca_file.display()
    );
    let store = PgStore::connect(&through(proxy.port, &trusted))
        .await
        .expect("the same server, its authority trusted");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(one, 1);
    assert!(proxy.sessions.load(std::sync::atomic::Ordering::SeqCst) >= 1);
}
