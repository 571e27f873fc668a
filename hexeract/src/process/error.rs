//! The runtime's error types, one per boundary.

pub use crate::config::{ConfigError, ConfigProblem};
use crate::registry::RegistryError;

/// Why [`hexeract::run`](crate::run) or [`App::try_run`](crate::App::try_run) stopped or could
/// not start: every error of the crate turns into it with `?` (a builder's
/// [`BuildError`](crate::BuildError), a worker's store, broker or Kafka error, [`StoreBusy`](crate::StoreBusy)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration is invalid; nothing was started.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The handlers cannot be registered together; nothing was started.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Another runtime is already running on this store. A runtime fans messages out to the
    /// handlers it knows, so two runtimes with different handlers on one store would each
    /// deliver only part of the messages.
    #[error(
        "another runtime is already running on this store: run one runtime per store, or give \
         each runtime a store of its own"
    )]
    StoreBusy,
    /// The outbox store failed (it could not be opened, migrated or read).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The configuration asks for something this build cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// The broker failed (it could not be reached, or refused a publish).
    #[cfg(feature = "rabbitmq")]
    #[error(transparent)]
    Broker(#[from] crate::rabbitmq::BusError),
    /// Kafka failed (a client could not be created, a topic could not be created), or a
    /// handler cannot be used with it.
    #[cfg(feature = "kafka")]
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaError),
}

impl From<crate::worker::BuildError> for Error {
    fn from(error: crate::worker::BuildError) -> Error {
        use crate::worker::BuildError;
        match error {
            BuildError::Config(error) => Error::Config(error),
            BuildError::Registry(error) => Error::Registry(error),
            BuildError::Unsupported(problem) => Error::Unsupported(problem),
            BuildError::World(error) => {
                #[cfg(feature = "kafka")]
                let error = match error.downcast::<crate::kafka::KafkaError>() {
                    Ok(error) => return Error::Kafka(*error),
                    Err(error) => error,
                };
                #[cfg(feature = "rabbitmq")]
                let error = match error.downcast::<crate::rabbitmq::BusError>() {
                    Ok(error) => return Error::Broker(*error),
                    Err(error) => error,
                };
                Error::Unsupported(error.to_string())
            }
        }
    }
}

impl From<crate::memory::StoreBusy> for Error {
    fn from(_: crate::memory::StoreBusy) -> Error {
        Error::StoreBusy
    }
}
