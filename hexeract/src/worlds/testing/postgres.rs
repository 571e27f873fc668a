//! A database of its own for each test whose handlers need PostgreSQL.

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use uuid::Uuid;

use crate::store::Identifier;

/// A fresh PostgreSQL database for one test: created on the server `TEST_DATABASE_URL` (or a
/// URL given) names, with a pool on it, and dropped by
/// [`drop_database`](TestDatabase::drop_database).
///
/// A database rather than a schema, so that tables written with their schema (`shop.orders`)
/// and Hexeract's own schema (`hexeract`) are the test's alone: tests run in parallel and
/// again without cleaning up after each other. Creating one takes a few tens of
/// milliseconds (`CREATE DATABASE` copies `template1`).
///
/// ```no_run
/// use hexeract::testing::TestDatabase;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let database = TestDatabase::create_from_env().await?;
/// sqlx::query("CREATE TABLE points (id uuid PRIMARY KEY, points int NOT NULL)")
///     .execute(database.pool())
///     .await?;
/// // ... run the handlers against database.pool() ...
/// database.drop_database().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TestDatabase {
    pool: PgPool,
    name: String,
    options: PgConnectOptions,
    /// Where the database was created from, and is dropped from.
    admin: PgConnectOptions,
}

impl TestDatabase {
    /// The variable [`create_from_env`](TestDatabase::create_from_env) reads.
    pub const VARIABLE: &'static str = "TEST_DATABASE_URL";

    /// [`create`](TestDatabase::create) on the server `TEST_DATABASE_URL` names (a
    /// `postgres://` URL of a database whose user may create databases).
    ///
    /// # Errors
    ///
    /// When the variable is unset, with a message naming it, and as
    /// [`create`](TestDatabase::create).
    pub async fn create_from_env() -> Result<TestDatabase, sqlx::Error> {
        let url = std::env::var(Self::VARIABLE).map_err(|_| {
            sqlx::Error::Configuration(
                format!(
                    "{} is not set: set it to a postgres:// URL of a database whose user may \
                     create databases (for instance postgres://postgres@127.0.0.1:5432/postgres)",
                    Self::VARIABLE
                )
                .into(),
            )
        })?;
        TestDatabase::create(&url).await
    }

    /// Creates a database named `test_<UUID v7>` on the server `url` names, connecting to
    /// `url`'s own database to do it, and opens a pool of up to 8 connections on it.
    ///
    /// # Errors
    ///
    /// When `url` is not a `postgres://` URL, the server cannot be reached, or its user may
    /// not create databases.
    pub async fn create(url: &str) -> Result<TestDatabase, sqlx::Error> {
        let admin: PgConnectOptions = url.parse()?;
        let name = format!("test_{}", Uuid::now_v7().simple());
        let admin = admin.disable_statement_logging();
        let mut connection = admin.connect().await?;
        sqlx::query(&format!("CREATE DATABASE {}", quoted(&name)))
            .execute(&mut connection)
            .await?;
        drop(connection);
        let options = admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options.clone())
            .await?;
        Ok(TestDatabase {
            pool,
            name,
            options,
            admin,
        })
    }

    /// The pool on the test's database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A `postgres://` URL of the test's database, for what takes a URL (`DATABASE_URL`,
    /// [`PgStore::connect`](crate::store::postgres::PgStore::connect)).
    pub fn url(&self) -> String {
        self.options.to_url_lossy().to_string()
    }

    /// Closes the pool and drops the database, ending any connection still open to it.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached.
    pub async fn drop_database(self) -> Result<(), sqlx::Error> {
        self.pool.close().await;
        let mut connection = self.admin.connect().await?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quoted(&self.name)
        ))
        .execute(&mut connection)
        .await?;
        Ok(())
    }
}

fn quoted(name: &str) -> String {
    Identifier::new(name)
        .expect("test_ and a UUID in hex is an identifier")
        .quoted()
}
