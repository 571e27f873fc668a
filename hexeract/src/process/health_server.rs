//! The HTTP endpoints on `WORKER_PORT`: `/health`, `/health/ready`, `/metrics`.

use std::sync::{Arc, OnceLock};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::store::Store;
use crate::store::StoreGauges;
use metrics_exporter_prometheus::PrometheusHandle;

/// The gauges of the store whose backlog `/metrics` reports, set once the store is open: a
/// [`App`](crate::App) hands out its router before it opens its store.
pub(crate) type StoreSlot = Arc<OnceLock<Arc<StoreGauges>>>;

/// What the endpoints read.
#[derive(Clone)]
struct Served {
    health: Health,
    /// The recorder `/metrics` renders: `None` when the application installed its own.
    prometheus: Option<&'static PrometheusHandle>,
    store: StoreSlot,
}

/// The endpoints of [`serve`] as an [`axum::Router`], to nest in an application's own router
/// and serve on its own port, behind its own authentication if it likes.
///
/// ```no_run
/// # async fn example() -> std::io::Result<()> {
/// use hexeract::health::{router, Health};
///
/// let health = Health::new();
/// let app = axum::Router::new()
///     .route("/orders", axum::routing::get(|| async { "[]" }))
///     .nest("/ops", router(health.clone(), None)); // /ops/health/ready, /ops/metrics
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await
/// # }
/// ```
///
/// An [`App`](crate::App) gives its own with [`App::router`](crate::App::router).
pub fn router(health: Health, store: Option<Arc<dyn Store>>) -> Router {
    let slot = StoreSlot::default();
    if let Some(store) = store {
        let _ = slot.set(Arc::new(StoreGauges::new(store)));
    }
    routes(health, slot)
}

/// The endpoints, reading the store from `store` once it is set.
pub(crate) fn routes(health: Health, store: StoreSlot) -> Router {
    Router::new()
        .route("/health", get(alive))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .with_state(Served {
            health,
            prometheus: crate::metrics::prometheus(),
            store,
        })
}

/// Serves the health and metrics endpoints on `listener` until `cancel` fires:
///
/// - `GET /health`: `200 ok` while the process runs;
/// - `GET /health/ready`: `200` when every component of `health` is ready, else `503`; the body
///   has one line per component (`bus worker: failing for 3s (2 in a row): …`), never a
///   connection string;
/// - `GET /metrics`: the Prometheus text format: every series of
///   [`hexeract::metrics`](crate::metrics) from the recorder
///   [`metrics::prometheus`](crate::metrics::prometheus) installed, with each component's
///   readiness read just before, and the backlog (when a `store` is given) read at most every
///   5 s, on a connection of its own: scrapes in between, however many, render the last
///   sample; `404` when the application installed a recorder of its own.
///
/// `hexeract::run` serves them on `WORKER_PORT` (8081). For a process of your own:
///
/// ```no_run
/// # async fn example() -> std::io::Result<()> {
/// use hexeract::health::{serve, Health};
/// use hexeract::CancellationToken;
///
/// let health = Health::new();
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:8081").await?;
/// serve(listener, health.clone(), None, CancellationToken::new()).await?;
/// # Ok(())
/// # }
/// ```
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Health,
    store: Option<Arc<dyn Store>>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(health, store))
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}

async fn alive() -> &'static str {
    "ok\n"
}

async fn ready(State(served): State<Served>) -> impl IntoResponse {
    let readiness = served.health.readiness();
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = if readiness.components.is_empty() {
        "ready\n".to_owned()
    } else {
        readiness.to_string()
    };
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
}

async fn metrics(State(served): State<Served>) -> impl IntoResponse {
    let Some(prometheus) = served.prometheus else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "this process installed a metrics recorder of its own: Hexeract's series go to it\n"
                .to_owned(),
        );
    };
    crate::metrics::sample_health(&served.health);
    if let Some(gauges) = served.store.get() {
        gauges.sample().await;
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        prometheus.render(),
    )
}
