//! `hexeract::run` on Kafka: the topics, then the relay and one consumer group per handler.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{AppConfig, Kafka};
use crate::error::Error;
use crate::health::Health;
use crate::kafka::{ensure_topics, KafkaConfig, KafkaError, KafkaRelay, KafkaWorkerBuilder};
use crate::retry::Backoff;
use crate::store::Store;

/// The client settings `hexeract::run` uses.
pub(crate) fn config(kafka: &Kafka) -> KafkaConfig {
    let mut config = KafkaConfig::new(kafka.brokers.clone(), kafka.topic_prefix.clone());
    if let Some(partitions) = kafka.partitions {
        config = config.partitions(partitions as i32);
    }
    if let Some(factor) = kafka.replication_factor {
        config = config.replication_factor(factor as i32);
    }
    for (key, value) in kafka.security.client_options(&kafka.brokers) {
        config = config.client_option(key, value);
    }
    config
}

/// Runs the relay and the consumers until `cancel`. Invalid handlers (a message type without an
/// aggregate) stop startup before any connection is made, and so does a cluster with fewer
/// brokers than `KAFKA_REPLICATION_FACTOR`; unreachable brokers are waited for, with the probes
/// failing meanwhile.
pub(crate) async fn run_on_kafka(
    kafka: &Kafka,
    settings: &AppConfig,
    registry: &crate::registry::Registry,
    store: Arc<dyn Store>,
    health: &Health,
    startup: crate::health::Probe,
    cancel: CancellationToken,
) -> Result<(), Error> {
    let config = config(kafka);
    let policy = settings.policy.clone();
    let worker = KafkaWorkerBuilder::new(config.clone(), store.clone())
        .policy(policy.clone())
        .registry(registry.clone())
        .health(health)
        .build()?;
    let relay_probe = health.probe("kafka relay");
    startup.pass();
    let aggregates = worker.aggregates();
    tracing::info!(
        brokers = %config.brokers(),
        prefix = %config.prefix(),
        groups = worker.groups().count(),
        "delivering through Kafka"
    );
    let relay = KafkaRelay::new(store, &config)?
        .batch_size(settings.policy.batch_size)
        .poll_interval(settings.relay_poll_interval)
        .store_timeout(policy.store_timeout)
        .health(relay_probe.clone());
    // The consumers subscribe once their topics exist; the relay creates the topics of other
    // aggregates as it meets them.
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(30));
    loop {
        match ensure_topics(&config, &aggregates).await {
            Ok(()) => break,
            // A cluster smaller than the replication factor is a setting to change, not an
            // outage to wait out.
            Err(error @ KafkaError::ReplicationFactor { .. }) => return Err(error.into()),
            Err(error) => {
                let delay = backoff.next_delay();
                tracing::error!(%error, retry_in = ?delay, "could not create the Kafka topics; trying again");
                relay_probe.fail(format!("cannot create the topics: {error}"));
                tokio::select! {
                    () = cancel.cancelled() => return Ok(()),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    let (relayed, consumed) = tokio::join!(relay.run(cancel.clone()), worker.run(cancel.clone()));
    relayed?;
    consumed?;
    Ok(())
}
