//! PostgreSQL support for the integration tests: the test database's URL, pools on it, and a
//! fresh schema per test.
//!
//! The database is the one at `TEST_DATABASE_URL` ([`DEFAULT_URL`] when unset). Each test
//! works in a schema of its own, `t_<uuid v7>`, which it drops at the end with
//! [`TestSchema::drop_schema`], so tests run in parallel.

use hexeract::store::postgres::PgStore;
use hexeract::store::DeliveryStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use uuid::Uuid;

/// The test database when `TEST_DATABASE_URL` is unset.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The test database's URL: `TEST_DATABASE_URL`, or [`DEFAULT_URL`].
pub fn database_url() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A pool of up to `max_connections` on the test database whose connections carry
/// `application_name` and log no statements.
///
/// # Panics
///
/// With a message naming `TEST_DATABASE_URL` when the URL is not a `postgres://` URL or
/// PostgreSQL cannot be reached.
pub async fn connect(application_name: &str, max_connections: u32) -> PgPool {
    let options: PgConnectOptions = database_url()
        .parse()
        .expect("TEST_DATABASE_URL is a postgres:// URL");
    PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(
            options
                .application_name(application_name)
                .disable_statement_logging(),
        )
        .await
        .unwrap_or_else(|error| {
            panic!(
                "cannot reach PostgreSQL ({error}); start it, or set TEST_DATABASE_URL to a \
                 database these tests may create schemas in"
            )
        })
}

/// A pool on the test database and a fresh schema name; [`drop_schema`](Self::drop_schema)
/// removes the schema.
///
/// The schema itself is created by the first migration of a store over it
/// ([`migrated_store`](Self::migrated_store)).
#[derive(Debug)]
pub struct TestSchema {
    /// The pool on the test database.
    pub pool: PgPool,
    /// The schema's name, `t_` and a UUID v7 in hex: a valid identifier, unique to the test.
    pub schema: String,
}

impl TestSchema {
    /// A pool of 8 connections named `application_name` (see [`connect`]) and a fresh schema.
    pub async fn new(application_name: &str) -> TestSchema {
        TestSchema::on(connect(application_name, 8).await)
    }

    /// A fresh schema on `pool`.
    pub fn on(pool: PgPool) -> TestSchema {
        TestSchema {
            pool,
            schema: format!("t_{}", Uuid::now_v7().simple()),
        }
    }

    /// A store over this schema on [`pool`](Self::pool), not migrated.
    pub fn store(&self) -> PgStore {
        self.store_on(self.pool.clone())
    }

    /// A store over this schema on another pool, not migrated.
    pub fn store_on(&self, pool: PgPool) -> PgStore {
        PgStore::new(pool, &self.schema).expect("valid schema name")
    }

    /// A store over this schema on [`pool`](Self::pool), migrated.
    pub async fn migrated_store(&self) -> PgStore {
        let store = self.store();
        store.migrate().await.expect("migrate");
        store
    }

    /// The rows in `table` of this schema.
    pub async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM \"{}\".{table}", self.schema))
            .fetch_one(&self.pool)
            .await
            .expect("count rows")
    }

    /// The rows of `tables` together, counted in one statement: one snapshot, so a row that a
    /// statement moves from one of them to another meanwhile is counted once (two counts could
    /// miss it, or see it twice).
    pub async fn count_together(&self, tables: &[&str]) -> i64 {
        let counts: Vec<String> = tables
            .iter()
            .map(|table| format!("(SELECT count(*) FROM \"{}\".{table})", self.schema))
            .collect();
        sqlx::query_scalar(&format!("SELECT {}", counts.join(" + ")))
            .fetch_one(&self.pool)
            .await
            .expect("count rows")
    }

    /// Drops the schema and everything in it.
    pub async fn drop_schema(self) {
        sqlx::query(&format!(
            "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.schema
        ))
        .execute(&self.pool)
        .await
        .expect("drop the test schema");
    }
}

/// A pool whose connections go through `proxy` (the chaos tests' fault proxy) to the test
/// database, named `application_name` so that `pg_stat_activity` tells them apart.
pub async fn connect_through(proxy: &crate::proxy::FaultProxy, application_name: &str) -> PgPool {
    connect_through_waiting(proxy, application_name, std::time::Duration::from_secs(5)).await
}

/// [`connect_through`] with a pool that waits up to `acquire_timeout` for a connection (a
/// silent path holds each acquire that long).
pub async fn connect_through_waiting(
    proxy: &crate::proxy::FaultProxy,
    application_name: &str,
    acquire_timeout: std::time::Duration,
) -> PgPool {
    let options: sqlx::postgres::PgConnectOptions = database_url()
        .parse()
        .expect("TEST_DATABASE_URL is a postgres:// URL");
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(acquire_timeout)
        .connect_with(
            options
                .host(&proxy.addr().ip().to_string())
                .port(proxy.addr().port())
                .application_name(application_name)
                .disable_statement_logging(),
        )
        .await
        .expect("connect to PostgreSQL through the proxy")
}

/// The address of the test database, for the fault proxy to forward to.
pub fn database_addr() -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    let options: sqlx::postgres::PgConnectOptions = database_url()
        .parse()
        .expect("TEST_DATABASE_URL is a postgres:// URL");
    (options.get_host(), options.get_port())
        .to_socket_addrs()
        .expect("TEST_DATABASE_URL names a reachable host")
        .next()
        .expect("an address for PostgreSQL")
}
