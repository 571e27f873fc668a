//! [`Logged`]: the client context of every Kafka client Hexeract creates: librdkafka's logs and
//! errors go to `tracing`, and errors that mean the brokers are out of reach to a probe.

use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::health::Probe;

/// Logs for one component (`kafka relay`, `kafka consumer <handler>`) and reports to its probe.
pub(crate) struct Logged {
    component: String,
    probe: ProbeSlot,
}

/// Where a client's context reports; set after the client is created, when a builder is given
/// its probe.
pub(crate) type ProbeSlot = Arc<Mutex<Option<Probe>>>;

impl Logged {
    pub(crate) fn new(component: impl Into<String>, probe: Option<Probe>) -> Logged {
        Logged {
            component: component.into(),
            probe: Arc::new(Mutex::new(probe)),
        }
    }

    /// A context reporting to `probe`, a slot shared with an earlier client's context.
    pub(crate) fn with_slot(component: impl Into<String>, probe: ProbeSlot) -> Logged {
        Logged {
            component: component.into(),
            probe,
        }
    }

    /// The slot this context reports to.
    pub(crate) fn probe_slot(&self) -> ProbeSlot {
        self.probe.clone()
    }

    pub(crate) fn component(&self) -> &str {
        &self.component
    }
}

impl ClientContext for Logged {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        let component = &self.component;
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(component, facility, "librdkafka: {message}");
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(component, facility, "librdkafka: {message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(component, facility, "librdkafka: {message}");
            }
            RDKafkaLogLevel::Debug => tracing::debug!(component, facility, "librdkafka: {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let component = &self.component;
        // librdkafka reconnects by itself; these say the brokers cannot be reached now.
        let unreachable = matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::AllBrokersDown | RDKafkaErrorCode::BrokerTransportFailure)
        );
        if unreachable {
            tracing::warn!(component, %error, "Kafka brokers unreachable: {reason}");
            if let Some(probe) = &*self
                .probe
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
            {
                probe.fail(format!("Kafka brokers unreachable: {reason}"));
            }
        } else {
            tracing::error!(component, %error, "Kafka client error: {reason}");
        }
    }
}
