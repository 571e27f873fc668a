//! [`ensure_topics`]: the aggregates' topics, created when the worker starts.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use crate::kafka::{KafkaConfig, KafkaError};

/// Creates the topic of each of `aggregates` (`<prefix>.<aggregate>`) with the configured
/// partitions and replicas; a topic that exists is left as it is (its partitions are not
/// changed: adding partitions would move keys to other partitions and break their order).
/// Returns once the brokers list every topic with its partitions.
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
        .create()
        .map_err(|error| KafkaError::client("creating the admin client", error))?;
    let names: Vec<String> = aggregates
        .iter()
        .map(|aggregate| config.topic(aggregate))
        .collect();
    // Only the topics the brokers do not list are created: creating needs rights that a
    // deployment whose topics are made by its operators may not grant.
    let missing = unlisted(&admin, &names);
    if !missing.is_empty() {
        let topics: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|name| {
                NewTopic::new(
                    name,
                    config.partition_count(),
                    TopicReplication::Fixed(config.replicas()),
                )
            })
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
        let missing = unlisted(&admin, &names);
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

/// The topics of `names` the brokers do not list with partitions.
fn unlisted<'a>(admin: &AdminClient<DefaultClientContext>, names: &'a [String]) -> Vec<&'a String> {
    let client = admin.inner();
    names
        .iter()
        .filter(|name| {
            client
                .fetch_metadata(Some(name), Duration::from_secs(2))
                .ok()
                .and_then(|metadata| {
                    metadata
                        .topics()
                        .iter()
                        .find(|topic| topic.name() == name.as_str())
                        .map(|topic| topic.error().is_none() && !topic.partitions().is_empty())
                })
                != Some(true)
        })
        .collect()
}
