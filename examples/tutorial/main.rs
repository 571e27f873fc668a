//! The newsletter of docs/tutorial.md: an HTTP endpoint takes signups, two handlers welcome and
//! count each one, and a scheduled job purges the unconfirmed.
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/news cargo run --example tutorial
//! ```

mod api;
mod db;
mod news;
#[cfg(test)]
mod tests;

use hexeract::{App, AppConfig, CancellationToken};
use sqlx::postgres::PgPoolOptions;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .init();

    // One pool, for the endpoint, the handlers and Hexeract's own tables.
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL=postgres://…")?;
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .connect(&url)
        .await?;
    db::create_tables(&pool).await?;

    let app = App::new(AppConfig::from_env()?)
        .pool(pool.clone())
        .state(pool.clone())
        .listen(false);
    // The outbox must exist before the first signup enqueues into it.
    app.migrate().await?;

    // One port: the endpoint, and the app's /health, /health/ready and /metrics.
    let router = api::router(pool).merge(app.router());
    let port = std::env::var("HTTP_PORT").unwrap_or_else(|_| "8080".to_owned());
    let listener = tokio::net::TcpListener::bind(format!("0.0.0.0:{port}")).await?;
    tracing::info!("newsletter on http://{}", listener.local_addr()?);

    // The app stops on Ctrl-C or SIGTERM, lets running handlers finish, and returns; the
    // cancelled token then stops the HTTP server too.
    let cancel = CancellationToken::new();
    let server =
        axum::serve(listener, router).with_graceful_shutdown(cancel.clone().cancelled_owned());
    let http = tokio::spawn(async move { server.await });
    let ran = app.try_run(cancel.clone()).await;
    cancel.cancel();
    http.await??;
    ran?;
    tracing::info!("newsletter stopped");
    Ok(())
}
