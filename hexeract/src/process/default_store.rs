//! The process's default store: what `hexeract::run` and `hexeract::publish` share.

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::config::{AppConfig, Database};
use crate::envelope::Envelope;
use crate::error::Error;
use crate::message::Message;
use crate::publish::PublishError;
use crate::store::{DeliveryStore, Store, StoreError};

/// The store `hexeract::run` delivers from and `hexeract::publish` writes to: PostgreSQL when
/// `DATABASE_URL` is set, otherwise an SQLite file (`HEXERACT_SQLITE_PATH`, default
/// `hexeract.db` in the working directory, created on first use), unless a
/// [`App`](crate::App) whose settings name another database started first (then that
/// one). Opened and migrated once per process; later calls return the same store.
///
/// ```no_run
/// # async fn example() -> Result<(), hexeract::Error> {
/// let store = hexeract::store::default_store().await?;
/// for dead in store.dead_letters(100).await? {
///     println!("{} {}: {}", dead.envelope.message_type, dead.reason, dead.detail);
/// }
/// # Ok(())
/// # }
/// ```
pub async fn default_store() -> Result<Arc<dyn Store>, Error> {
    // The process's store, whichever database it is in: the environment's, unless an `App`
    // made its own the process's first (or is opening it now: this waits for it).
    let (_, store) = DEFAULT_STORE
        .get_or_try_init(|| async {
            let settings = AppConfig::from_env()?;
            let store = open(&settings.database).await?;
            Ok::<_, Error>((settings.database, store))
        })
        .await?;
    Ok(store.clone())
}

/// Creates Hexeract's tables in the process's database (the one [`default_store`] opens), or
/// brings them to this version's schema; nothing when they are there. Call it at startup,
/// before the application serves, when it writes to the outbox in its own transactions
/// ([`outbox::enqueue`](crate::outbox::enqueue),
/// [`mark_processed`](crate::outbox::inbox::mark_processed)): the workers create the tables
/// too, but only once they start, and a write before that fails with
/// [`StoreError::NotMigrated`]. An [`App`](crate::App) with settings in code has
/// [`App::migrate`](crate::App::migrate); a deploy step can run the `migrate` command of
/// [`hexeract::cli`](crate::cli) instead.
///
/// ```no_run
/// # async fn serve() {}
/// #[tokio::main]
/// async fn main() -> Result<(), hexeract::Error> {
///     hexeract::migrate().await?; // the outbox exists before the first checkout enqueues
///     serve().await;
///     Ok(())
/// }
/// ```
pub async fn migrate() -> Result<(), Error> {
    default_store().await.map(drop)
}

/// The process's store and the database it is in, once opened.
static DEFAULT_STORE: tokio::sync::OnceCell<(Database, Arc<dyn Store>)> =
    tokio::sync::OnceCell::const_new();

/// The store of `database`, made the process's store: what [`default_store`] returns from then
/// on, so that `hexeract::publish` and `schedule_*` write where an [`App`](crate::App)
/// whose settings name `database` reads. A process has one: when it already has another (a
/// publish came first, with the environment naming another database), this is an error naming
/// both, rather than messages written where nothing reads them.
pub(crate) async fn store_for(database: &Database) -> Result<Arc<dyn Store>, Error> {
    store_opened_by(database, open(database)).await
}

/// [`store_for`] with the tables on `pool` (the application's own) instead of a pool the store
/// opens: `database` is the database `pool` is on.
#[cfg(feature = "postgres")]
pub(crate) async fn store_on_pool(
    database: &Database,
    pool: sqlx::PgPool,
) -> Result<Arc<dyn Store>, Error> {
    store_opened_by(database, async move {
        let store: Arc<dyn Store> = Arc::new(super::postgres::PgStore::new(
            pool,
            super::postgres::DEFAULT_SCHEMA,
        )?);
        store.migrate().await?;
        tracing::info!(store = ?database, "outbox store ready, on the application's pool");
        Ok(store)
    })
    .await
}

/// The process's store, opened by `opening` unless it is open already; an error when it is
/// open on another database than `database`.
async fn store_opened_by(
    database: &Database,
    opening: impl std::future::Future<Output = Result<Arc<dyn Store>, Error>>,
) -> Result<Arc<dyn Store>, Error> {
    let (opened, store) = DEFAULT_STORE
        .get_or_try_init(|| async {
            let store = opening.await?;
            Ok::<_, Error>((database.clone(), store))
        })
        .await?;
    if opened != database {
        return Err(Error::Unsupported(format!(
            "this process's store is already open on {opened:?} (`hexeract::publish` or \
             `default_store()` opened it from the environment), but the worker's settings name \
             {database:?}: messages published with `hexeract::publish` would wait where this \
             worker does not read. Give the worker the environment's database, or start it \
             before anything publishes"
        )));
    }
    Ok(store.clone())
}

/// [`default_store`], under the name it had while the scheduler's part of the store was a type
/// apart: the same store (schedules, occurrences and delayed messages live beside the outbox).
#[deprecated(
    since = "0.1.0",
    note = "default_store returns the same store, with every capability"
)]
pub async fn default_schedule_store() -> Result<Arc<dyn Store>, Error> {
    default_store().await
}

/// Opens and migrates the store `database` names.
pub(crate) async fn open(database: &Database) -> Result<Arc<dyn Store>, Error> {
    let store = match database {
        Database::Postgres(url) => open_postgres(url).await?,
        Database::Sqlite(path) => open_sqlite(path).await?,
    };
    store.migrate().await?;
    tracing::info!(store = ?database, "outbox store ready");
    Ok(store)
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str) -> Result<Arc<dyn Store>, Error> {
    Ok(Arc::new(super::postgres::PgStore::connect(url).await?))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_url: &str) -> Result<Arc<dyn Store>, Error> {
    Err(Error::Unsupported(
        "DATABASE_URL is set, but this build of hexeract lacks its `postgres` feature".to_owned(),
    ))
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(path: &std::path::Path) -> Result<Arc<dyn Store>, Error> {
    Ok(Arc::new(super::sqlite::SqliteStore::open(path).await?))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(_path: &std::path::Path) -> Result<Arc<dyn Store>, Error> {
    Err(Error::Unsupported(
        "no DATABASE_URL is set and this build of hexeract lacks its `sqlite` feature: set \
         DATABASE_URL or enable the feature"
            .to_owned(),
    ))
}

/// Waits until `store` owes nothing ([`DeliveryStore::backlog`] is zero), checking every
/// `poll`: for tools, tests and examples that publish, then stop once everything is settled.
pub async fn wait_until_drained(
    store: &dyn DeliveryStore,
    poll: Duration,
) -> Result<(), StoreError> {
    while store.backlog().await? > 0 {
        tokio::time::sleep(poll).await;
    }
    Ok(())
}

/// Publishes `message` through the process's outbox store
/// ([`default_store`](crate::store::default_store)), in a transaction of its own, and wakes the
/// worker of this process. Returns the message id. [`hexeract::run`](crate::run) delivers it to
/// every handler of its type, in this process or another one sharing the database.
///
/// To publish together with your own data, atomically, use
/// [`outbox::enqueue`](crate::outbox::enqueue) inside your transaction instead.
///
/// ```no_run
/// # use hexeract::Message;
/// # #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// # #[message(type = "OrderPlaced")]
/// # struct OrderPlaced { order_id: u64 }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), hexeract::PublishError> {
/// let id = hexeract::publish(&OrderPlaced { order_id: 7 }).await?;
/// println!("published {id}");
/// # Ok(())
/// # }
/// ```
pub async fn publish<M: Message>(message: &M) -> Result<Uuid, PublishError> {
    let mut envelope = Envelope::new(message)?;
    crate::trace::produce(&mut envelope);
    let id = envelope.id;
    let store = default_store()
        .await
        .map_err(|error| PublishError::Store(error.into()))?;
    store
        .publish(vec![envelope])
        .await
        .map_err(|error| PublishError::Store(error.into()))?;
    Ok(id)
}
