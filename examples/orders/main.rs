//! A small shop on Hexeract: an HTTP API takes orders, handlers reserve stock and mail a
//! confirmation, and a scheduled job expires stale carts. See docs/orders.md.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//! AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f \
//! cargo run --example orders
//! ```
//!
//! With arguments, the binary is the operations tool of `hexeract::cli` instead:
//! `cargo run --example orders -- handlers`, `… -- dead-letters list`.

mod api;
mod db;
mod shop;
#[cfg(test)]
mod tests;

use std::process::ExitCode;
use std::time::Duration;

use hexeract::CancellationToken;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// The port of the shop's API unless `HTTP_PORT` says otherwise.
const DEFAULT_HTTP_PORT: u16 = 8080;
/// How long a cart lives without a change unless `CART_TTL_SECS` says otherwise.
pub(crate) const DEFAULT_CART_TTL: Duration = Duration::from_secs(15 * 60);

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] | ["run"] => serve().await,
        ["migrate"] => migrate().await,
        // `orders handlers`, `orders dead-letters list`, …: the operations commands, on the
        // app the shop runs (its handlers, state and middleware).
        _ => return operations().await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The shop's own settings, checked all at once like Hexeract's.
struct Settings {
    database_url: String,
    http_port: u16,
    cart_ttl: Duration,
    shop_id: String,
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let mut problems = Vec::new();
        let database_url = match std::env::var("DATABASE_URL") {
            Ok(url) => url,
            Err(_) => {
                problems.push(
                    "DATABASE_URL is not set: the shop keeps its orders in PostgreSQL, e.g. \
                     DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"
                        .to_owned(),
                );
                String::new()
            }
        };
        let mut number = |name: &str, default: u64, max: u64| match std::env::var(name) {
            Err(_) => default,
            Ok(text) => match text.parse::<u64>() {
                Ok(value) if (1..=max).contains(&value) => value,
                _ => {
                    problems.push(format!("{name} = {text:?}: a whole number from 1 to {max}"));
                    default
                }
            },
        };
        let http_port = number("HTTP_PORT", u64::from(DEFAULT_HTTP_PORT), 65_535) as u16;
        let cart_ttl = Duration::from_secs(number(
            "CART_TTL_SECS",
            DEFAULT_CART_TTL.as_secs(),
            86_400 * 365,
        ));
        let shop_id = std::env::var("SHOP_ID").unwrap_or_else(|_| "main".to_owned());
        if shop_id.is_empty() || shop_id.len() > 100 {
            problems.push(format!(
                "SHOP_ID = {shop_id:?}: a name of 1 to 100 characters"
            ));
        }
        if problems.is_empty() {
            Ok(Settings {
                database_url,
                http_port,
                cart_ttl,
                shop_id,
            })
        } else {
            Err(format!(
                "invalid configuration, nothing was started:\n  {}",
                problems.join("\n  ")
            ))
        }
    }
}

/// Connects to `DATABASE_URL` and creates the shop's tables and Hexeract's (outbox, inbox,
/// dead letters, schedules), which must exist before the first checkout writes to them; this
/// also checks every Hexeract variable.
async fn connect(settings: &Settings) -> Result<sqlx::PgPool, Box<dyn std::error::Error>> {
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&settings.database_url)
        .await
        .map_err(|error| format!("cannot connect to DATABASE_URL: {error}"))?;
    db::migrate(&pool).await?;
    hexeract::migrate().await?;
    Ok(pool)
}

/// `orders migrate`: the tables, then exit.
async fn migrate() -> Result<(), Box<dyn std::error::Error>> {
    connect(&Settings::from_env()?).await?;
    println!("the shop's tables and Hexeract's are up to date");
    Ok(())
}

/// The shop's app: every handler and the scheduled job, with the pool and the settings as
/// their state and the shop check around every handler call.
fn shop_app(settings: &Settings, pool: PgPool) -> Result<hexeract::App, hexeract::Error> {
    Ok(hexeract::App::new(hexeract::AppConfig::from_env()?)
        .state(pool)
        .state(shop::ShopSettings {
            shop_id: settings.shop_id.clone(),
            cart_ttl: settings.cart_ttl,
        })
        .middleware(shop::RequireShop {
            shop_id: settings.shop_id.clone(),
        }))
}

/// `orders handlers`, `orders dead-letters …`: Hexeract's operations commands on the shop's
/// app.
async fn operations() -> ExitCode {
    let ready = async {
        let settings = Settings::from_env()?;
        let pool = connect(&settings).await?;
        Ok::<_, Box<dyn std::error::Error>>(shop_app(&settings, pool)?)
    };
    match ready.await {
        Ok(app) => hexeract::cli::main_with(app).await,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    let settings = Settings::from_env()?;
    let pool = connect(&settings).await?;
    // One port for everything: the API, and the app's /health, /health/ready and /metrics
    // (the app binds no port of its own).
    let app = shop_app(&settings, pool.clone())?.listen(false);
    let router = api::router(pool, api::ShopId(settings.shop_id.clone())).merge(app.router());

    let listener = tokio::net::TcpListener::bind(("0.0.0.0", settings.http_port))
        .await
        .map_err(|error| format!("cannot listen on HTTP_PORT {}: {error}", settings.http_port))?;
    tracing::info!(
        "shop API on http://{}; try: curl -s localhost:{}/products (health: /health/ready, \
         metrics: /metrics)",
        listener.local_addr()?,
        settings.http_port
    );

    // The app stops on SIGTERM and Ctrl-C, lets running handlers finish (8 s), and
    // returns; the API stops with it.
    let cancel = CancellationToken::new();
    let server =
        axum::serve(listener, router).with_graceful_shutdown(cancel.clone().cancelled_owned());
    let http = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            let served = server.await;
            cancel.cancel(); // a server that failed stops the handlers too
            served
        }
    });
    let ran = app.try_run(cancel.clone()).await;
    cancel.cancel();
    http.await??;
    ran?;
    tracing::info!("shop stopped");
    Ok(())
}
