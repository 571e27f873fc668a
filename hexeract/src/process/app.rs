//! [`App`]: the application builder, and [`run`], its shorthand. Everything [`hexeract::run`](crate::run) does (the store
//! and the transport from the configuration, the scheduler, the relays, health and metrics,
//! retention, SIGTERM), plus what an application adds in code: state, middleware, handlers
//! registered as types, and settings.

use tokio_util::sync::CancellationToken;

use crate::config::AppConfig;
use crate::error::Error;
use crate::registry::{HandlerSet, RegistryError};
use crate::run::{Application, Endpoints};
use crate::schedule::jobs_from_inventory;

/// The application builder: [`AppConfig`] (from the environment, from a file or from code)
/// and what the application gives its handlers.
///
/// ```no_run
/// use hexeract::{handler, CancellationToken, Context, HandlerOutcome, Message, Middleware, Next, State, App, AppConfig};
///
/// #[derive(Clone)]
/// struct Shop { warehouse: String }
///
/// #[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
/// #[message(type = "OrderPlaced")]
/// struct OrderPlaced { order_id: u64 }
///
/// #[handler(message = "OrderPlaced")]
/// async fn reserve_stock(event: OrderPlaced, _ctx: &Context, shop: State<Shop>) -> Result<(), std::io::Error> {
///     println!("{}: reserve order {}", shop.warehouse, event.order_id);
///     Ok(())
/// }
///
/// /// Messages without a tenant are dead-lettered, never handled.
/// struct RequireTenant;
///
/// impl Middleware for RequireTenant {
///     async fn handle(&self, ctx: &Context, next: Next<'_>) -> HandlerOutcome {
///         match ctx.header("tenant") {
///             Some(_) => next.run(ctx).await,
///             None => HandlerOutcome::dead_letter("tenant_missing", "no `tenant` header"),
///         }
///     }
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), hexeract::Error> {
///     let config = AppConfig::from_env()?;
///     hexeract::App::new(config)
///         .state(Shop { warehouse: "eu-west".into() })
///         .middleware(RequireTenant)
///         .try_run(CancellationToken::new())
///         .await
/// }
/// ```
///
/// Handlers are every `#[handler]` of the program, plus those registered with
/// [`register_handler`](App::register_handler); scheduled jobs are every `#[scheduled]` job.
/// `try_run` checks everything before it starts anything: the settings, the handlers' names,
/// and the state each handler and job takes (one error lists every handler and type missing).
#[must_use = "an app does nothing until `.try_run(cancel).await`"]
pub struct App {
    config: AppConfig,
    handlers: HandlerSet,
    endpoints: Endpoints,
    /// The application's pool, when it gave one ([`App::pool`]).
    #[cfg(feature = "postgres")]
    pool: Option<sqlx::PgPool>,
}

impl App {
    /// A worker with these settings, every `#[handler]` and `#[scheduled]` job of the program,
    /// no state and no middleware yet.
    ///
    /// Installs the Prometheus recorder `/metrics` renders
    /// ([`metrics::prometheus`](crate::metrics::prometheus)) unless the process installed a
    /// recorder of its own before: install yours first and it gets every series.
    pub fn new(config: AppConfig) -> App {
        let _ = crate::metrics::prometheus();
        App {
            config,
            handlers: HandlerSet::program(),
            endpoints: Endpoints::new(),
            #[cfg(feature = "postgres")]
            pool: None,
        }
    }

    /// Keeps Hexeract's tables (schema `hexeract`) on the application's own PostgreSQL pool,
    /// instead of a pool of 10 connections the worker opens on `DATABASE_URL`: one pool per
    /// process, and the application's connection settings (TLS, timeouts) for both. The
    /// database is `pool`'s; `DATABASE_URL`, when it is set, must name the same one (it is
    /// not connected to).
    ///
    /// Size the pool for both: the worker holds a connection per claim, settle and poll
    /// (about `CONSUMER_CONCURRENCY` / 8 + 3 at a time under load), beside what the
    /// application's requests take; a pool the application exhausts delays deliveries, and the
    /// worker's statements give up after `STORE_TIMEOUT_MS`.
    ///
    /// ```no_run
    /// use hexeract::{App, AppConfig, CancellationToken};
    ///
    /// #[tokio::main]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let pool = sqlx::postgres::PgPoolOptions::new()
    ///         .max_connections(20)
    ///         .connect(&std::env::var("DATABASE_URL")?)
    ///         .await?;
    ///     let app = App::new(AppConfig::from_env()?).pool(pool.clone()).state(pool);
    ///     app.migrate().await?;
    ///     app.try_run(CancellationToken::new()).await?;
    ///     Ok(())
    /// }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn pool(mut self, pool: sqlx::PgPool) -> App {
        if !matches!(self.config.database, crate::config::Database::Postgres(_)) {
            self.config.database = crate::config::Database::Postgres(
                sqlx::ConnectOptions::to_url_lossy(&*pool.connect_options()).to_string(),
            );
        }
        self.pool = Some(pool);
        self
    }

    /// This worker's `/health`, `/health/ready` and `/metrics` as an [`axum::Router`], to nest
    /// in the application's own router and serve on its port (give
    /// [`listen(false)`](App::listen) then, or the worker also serves them on
    /// `WORKER_PORT`). The router reads this worker's loops: it answers `503` until they are
    /// all started, and keeps answering for this worker after [`try_run`](App::try_run)
    /// took it.
    ///
    /// ```no_run
    /// use hexeract::{CancellationToken, App, AppConfig};
    ///
    /// #[tokio::main]
    /// async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ///     let worker = App::new(AppConfig::from_env()?).listen(false);
    ///     let app = axum::Router::new()
    ///         .route("/orders", axum::routing::get(|| async { "[]" }))
    ///         .merge(worker.router()); // /health, /health/ready, /metrics
    ///     let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
    ///     let cancel = CancellationToken::new();
    ///     let server = axum::serve(listener, app)
    ///         .with_graceful_shutdown(cancel.clone().cancelled_owned());
    ///     let http = tokio::spawn(async move { server.await });
    ///     worker.try_run(cancel.clone()).await?;
    ///     cancel.cancel();
    ///     http.await??;
    ///     Ok(())
    /// }
    /// ```
    pub fn router(&self) -> axum::Router {
        crate::health::server::routes(self.endpoints.health.clone(), self.endpoints.store.clone())
    }

    /// Whether the worker serves its endpoints on a listener of its own, on `WORKER_ADDR` and
    /// `WORKER_PORT` (default `true`). Give `false` when the application serves
    /// [`router`](App::router) itself.
    pub fn listen(mut self, on: bool) -> App {
        self.endpoints.listen = on;
        self
    }

    crate::registry::handler_registration!(App);

    /// Its settings.
    pub fn config(&self) -> &AppConfig {
        &self.config
    }

    /// Creates Hexeract's tables in the database these settings name (or brings them to this
    /// version's schema), and makes that database the process's store, which
    /// [`try_run`](App::try_run) then uses: [`hexeract::migrate`](crate::migrate) for
    /// settings given in code. Call it before the application serves when it enqueues in its
    /// own transactions.
    ///
    /// ```no_run
    /// use hexeract::{App, AppConfig, CancellationToken};
    ///
    /// # async fn serve() {}
    /// #[tokio::main]
    /// async fn main() -> Result<(), hexeract::Error> {
    ///     let app = App::new(AppConfig::from_env()?);
    ///     app.migrate().await?;
    ///     let cancel = CancellationToken::new();
    ///     let worker = tokio::spawn(app.try_run(cancel.clone()));
    ///     serve().await; // checkouts enqueue in their transactions from here on
    ///     cancel.cancel();
    ///     worker.await.expect("the worker's task")
    /// }
    /// ```
    pub async fn migrate(&self) -> Result<(), Error> {
        self.store_opener().open().await.map(drop)
    }

    /// What opens the process's store on this app's database: on its pool when it gave one.
    pub(crate) fn store_opener(&self) -> StoreOpener {
        StoreOpener {
            database: self.config.database.clone(),
            #[cfg(feature = "postgres")]
            pool: self.pool.clone(),
        }
    }

    /// Runs every handler and scheduled job until `cancel` fires (or SIGTERM / Ctrl-C
    /// arrives), as [`hexeract::run`](crate::run) describes; returns once the handlers running
    /// have finished (up to the shutdown grace). An invalid setting, a missing state, two
    /// handlers with the same name or an unreachable database are an error before anything
    /// starts.
    pub async fn try_run(self, cancel: CancellationToken) -> Result<(), Error> {
        let store = self.store_opener();
        let (config, application) = self.prepare()?;
        // Opened here (on the app's pool, when it gave one), `start` finds it open.
        store.open().await?;
        crate::run::start(config, application, cancel).await
    }

    /// The settings, checked, and the handlers built with their state and middleware beside
    /// what the scheduler shares with them; every missing state of handlers and jobs is
    /// reported at once.
    pub(crate) fn prepare(self) -> Result<(AppConfig, Application), Error> {
        self.config.check()?;
        let jobs = jobs_from_inventory()?;
        let mut handlers = self.handlers;
        let job_middleware = handlers
            .middleware
            .split_off(|name| jobs.iter().any(|job| job.name() == name));
        let mut missing = Vec::new();
        for job in &jobs {
            let _ = job.provide(&handlers.states, &mut missing);
        }
        let states = handlers.states.clone();
        let registry = match handlers.build(None) {
            Ok(registry) => registry,
            Err(RegistryError::MissingState(mut of_handlers)) => {
                of_handlers.append(&mut missing);
                return Err(RegistryError::MissingState(of_handlers).into());
            }
            Err(other) => return Err(other.into()),
        };
        if !missing.is_empty() {
            return Err(RegistryError::MissingState(missing).into());
        }
        Ok((
            self.config,
            Application {
                registry,
                states,
                job_middleware,
                endpoints: self.endpoints,
            },
        ))
    }
}

/// Opens the process's store on an app's database, on the app's pool when it gave one.
pub(crate) struct StoreOpener {
    database: crate::config::Database,
    #[cfg(feature = "postgres")]
    pool: Option<sqlx::PgPool>,
}

impl StoreOpener {
    /// The process's store, opened and migrated the first time.
    pub(crate) async fn open(&self) -> Result<std::sync::Arc<dyn crate::store::Store>, Error> {
        #[cfg(feature = "postgres")]
        if let Some(pool) = &self.pool {
            return crate::store::process::store_on_pool(&self.database, pool.clone()).await;
        }
        crate::store::process::store_for(&self.database).await
    }
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("config", &self.config)
            .field("states", &self.handlers.states)
            .field("middleware", &self.handlers.middleware)
            .finish_non_exhaustive()
    }
}

/// Runs every registered handler until `cancel` fires (or SIGTERM / Ctrl-C arrives), with the
/// configuration taken from the environment.
///
/// Messages come from the process's outbox store ([`default_store`](crate::store::default_store)):
/// an SQLite file unless `DATABASE_URL` names a PostgreSQL database. An
/// [`OutboxWorker`](crate::outbox::OutboxWorker) delivers them to every handler, with the process
/// defaults of `docs/configuration.md` (batches of 100, polls every 500 ms when idle, woken at
/// once by publishes).
///
/// With `AMQP_URL` set, the broker does the fan-out instead: an
/// [`RabbitMqRelay`](crate::rabbitmq::RabbitMqRelay) publishes the outbox to the exchange (a row is
/// deleted once the broker confirmed it), and a [`RabbitMqWorker`](crate::rabbitmq::RabbitMqWorker)
/// consumes every handler's queue; both are restarted after a lost connection
/// (`docs/rabbitmq.md`).
///
/// Returns `Ok(())` after a cancellation, once the handlers running have finished (up to the
/// shutdown grace, 8 s), and only then; an invalid configuration, an unreachable database or
/// two handlers with the same name are an error before anything starts.
///
/// ```no_run
/// use hexeract::CancellationToken;
///
/// #[tokio::main]
/// async fn main() -> Result<(), hexeract::Error> {
///     hexeract::run(CancellationToken::new()).await
/// }
/// ```
///
/// `run` is [`App`](crate::App)'s shorthand for a program that gives its handlers no state
/// and no middleware: `App::new(AppConfig::from_env()?).try_run(cancel)`.
pub async fn run(cancel: CancellationToken) -> Result<(), Error> {
    App::new(AppConfig::from_env()?).try_run(cancel).await
}
