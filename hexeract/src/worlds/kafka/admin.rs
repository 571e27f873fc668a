//! [`ensure_topics`]: the aggregates' topics, created when the worker starts.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::metadata::Metadata;
use rdkafka::types::RDKafkaErrorCode;

use crate::kafka::{KafkaConfig, KafkaError};

/// Creates the topic of each of `aggregates` (`<prefix>.<aggregate>`) with the configured
/// partitions and replicas, and `min.insync.replicas` of 2 (1 with a replication factor of 1);
/// a topic that exists is left as it is (its partitions are not changed: adding partitions
/// would move keys to other partitions and break their order), with a warning when it has
/// fewer replicas than the configured factor. Returns once the brokers list every topic with
/// its partitions.
///
/// Fails with [`KafkaError::ReplicationFactor`] when the cluster lists fewer brokers than the
/// replication factor: a topic could not be created as configured, and an existing one would
/// keep fewer copies of each record than the deployment asked for.
///
/// ```no_run
/// # async fn example() -> Result<(), hexeract::kafka::KafkaError> {
/// use hexeract::kafka::{ensure_topics, KafkaConfig};
///
/// let config = KafkaConfig::new("localhost:9092", "shop").partitions(6);
/// ensure_topics(&config, &["order", "cart"]).await?;
/// # Ok(())
/// # }
/// ```
pub async fn ensure_topics(config: &KafkaConfig, aggregates: &[&str]) -> Result<(), KafkaError> {
    if aggregates.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = config
        .client()
        // An admin client is a producer to librdkafka, which lets its metadata requests create
        // the topics they name with the broker's defaults (often 1 partition and 1 replica)
        // before this function could create them as configured.
        .set("allow.auto.create.topics", "false")
        .create()
        .map_err(|error| KafkaError::client("creating the admin client", error))?;
    let names: Vec<String> = aggregates
        .iter()
        .map(|aggregate| config.topic(aggregate))
        .collect();
    let metadata = admin
        .inner()
        .fetch_metadata(Some(&names[0]), Duration::from_secs(10))
        .map_err(|error| KafkaError::client("reading the cluster's metadata", error))?;
    let brokers = metadata.brokers().len();
    if brokers < usize::try_from(config.replicas()).unwrap_or(0) {
        return Err(KafkaError::ReplicationFactor {
            factor: config.replicas(),
            brokers,
        });
    }
    // Only the topics the brokers do not list are created: creating needs rights that a
    // deployment whose topics are made by its operators may not grant.
    let (missing, listed) = listing(&admin, &names);
    for (topic, replicas) in listed {
        if replicas < config.replicas() {
            tracing::warn!(
                %topic,
                replicas,
                replication_factor = config.replicas(),
                "Kafka topic has fewer replicas than the replication factor \
                 (KAFKA_REPLICATION_FACTOR): one lost broker disk can lose records whose \
                 outbox rows are already deleted; add replicas with kafka-reassign-partitions"
            );
        }
    }
    if !missing.is_empty() {
        let min_insync = config.min_insync_replicas().to_string();
        let topics: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|name| new_topic(config, name, &min_insync))
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = admin
            .create_topics(&topics, &options)
            .await
            .map_err(|error| KafkaError::client("creating topics", error))?;
        for result in results {
            match result {
                Ok(topic) => tracing::info!(
                    %topic,
                    partitions = config.partition_count(),
                    replicas = config.replicas(),
                    min_insync_replicas = config.min_insync_replicas(),
                    "Kafka topic created"
                ),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(KafkaError::client(format!("creating topic {topic}"), code));
                }
            }
        }
    }
    // A topic just created may take a moment to show in the metadata; a consumer subscribing
    // before then would wait for its next metadata refresh.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (missing, _) = listing(&admin, &names);
        if missing.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(KafkaError::client(
                "waiting for the topics",
                format!("the brokers do not list {missing:?} 10 s after creating them"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The topic `name` as [`ensure_topics`] creates it: the configured partitions and
/// replication factor, and `min.insync.replicas` (`min_insync`): with `acks=all`, a record is
/// acknowledged (and its outbox row deleted) only once that many replicas have it.
fn new_topic<'a>(config: &KafkaConfig, name: &'a str, min_insync: &'a str) -> NewTopic<'a> {
    NewTopic::new(
        name,
        config.partition_count(),
        TopicReplication::Fixed(config.replicas()),
    )
    .set("min.insync.replicas", min_insync)
}

/// The topics of `names` the brokers do not list with partitions, and those they list, each
/// with the fewest replicas of its partitions.
fn listing<'a>(
    admin: &AdminClient<DefaultClientContext>,
    names: &'a [String],
) -> (Vec<&'a String>, Vec<(&'a String, i32)>) {
    let client = admin.inner();
    let mut missing = Vec::new();
    let mut listed = Vec::new();
    for name in names {
        match client
            .fetch_metadata(Some(name), Duration::from_secs(2))
            .ok()
            .and_then(|metadata| fewest_replicas(&metadata, name))
        {
            Some(replicas) => listed.push((name, replicas)),
            None => missing.push(name),
        }
    }
    (missing, listed)
}

/// The fewest replicas of a partition of `topic`, when `metadata` lists it with partitions.
fn fewest_replicas(metadata: &Metadata, topic: &str) -> Option<i32> {
    let topic = metadata
        .topics()
        .iter()
        .find(|listed| listed.name() == topic)?;
    if topic.error().is_some() {
        return None;
    }
    topic
        .partitions()
        .iter()
        .map(|partition| i32::try_from(partition.replicas().len()).unwrap_or(i32::MAX))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_are_created_with_the_factor_and_a_quorum_of_in_sync_replicas() {
        let cases = [
            // (replication factor, min.insync.replicas)
            (None, "2"),
            (Some(1), "1"),
            (Some(2), "2"),
            (Some(3), "2"),
            (Some(5), "2"),
        ];
        for (factor, min_insync) in cases {
            let mut config = KafkaConfig::new("localhost:9092", "shop").partitions(6);
            if let Some(factor) = factor {
                config = config.replication_factor(factor);
            }
            let insync = config.min_insync_replicas().to_string();
            assert_eq!(insync, min_insync, "factor {factor:?}");
            let topic = new_topic(&config, "shop.order", &insync);
            assert_eq!(topic.name, "shop.order");
            assert_eq!(topic.num_partitions, 6);
            let TopicReplication::Fixed(replicas) = topic.replication else {
                panic!("a fixed replication factor");
            };
            assert_eq!(replicas, factor.unwrap_or(3), "factor {factor:?}");
            assert_eq!(topic.config, [("min.insync.replicas", min_insync)]);
        }
    }
}
