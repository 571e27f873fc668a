//! The process's stop signals: SIGTERM (what an orchestrator sends) and Ctrl-C.

use tokio_util::sync::CancellationToken;

/// Cancels `stop` on SIGTERM or Ctrl-C; returns when `stop` is cancelled either way.
pub(crate) async fn stop_on_signal(stop: CancellationToken) {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    let interrupt = async {
        match tokio::signal::ctrl_c().await {
            Ok(()) => {}
            Err(error) => {
                tracing::warn!(%error, "cannot listen for Ctrl-C");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = stop.cancelled() => return,
        () = interrupt => tracing::info!("Ctrl-C received, shutting down"),
        () = terminate => tracing::info!("SIGTERM received, shutting down"),
    }
    stop.cancel();
}
