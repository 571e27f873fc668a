//! [`RabbitMqConnection`]: a named AMQP connection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lapin::tcp::OwnedTLSConfig;
use lapin::{Connection, ConnectionProperties};

use crate::rabbitmq::BusError;

/// An AMQP connection with a name the broker shows (`connection_name`), so that operators and
/// tests can find and close exactly this one (`rabbitmqctl list_connections client_properties`).
///
/// The URL may carry TLS (`amqps://`; `?cacertfile=/path/to/ca.pem` trusts a private
/// certificate authority besides the web roots), a vhost and a heartbeat (`?heartbeat=10`,
/// seconds; the broker's default applies otherwise). The password in it never reaches a log line or an
/// error: see [`redact_url`].
///
/// ```no_run
/// # async fn example() -> Result<(), hexeract::rabbitmq::BusError> {
/// use std::time::Duration;
/// use hexeract::rabbitmq::RabbitMqConnection;
///
/// let connection = RabbitMqConnection::connect_with_retry(
///     "amqp://guest:guest@127.0.0.1:5672/%2f",
///     5,
///     Duration::from_millis(500),
/// )
/// .await?;
/// assert!(connection.name().starts_with("hexeract"));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RabbitMqConnection {
    inner: Arc<Connection>,
    name: Arc<str>,
    url: Arc<str>,
    recovering: bool,
}

/// How long opening a connection (TCP, TLS and the AMQP handshake) may take.
const CONNECT_DEADLINE: Duration = Duration::from_secs(30);

/// How long [`RabbitMqConnection::close`] waits for the broker's `close-ok`.
const CLOSE_DEADLINE: Duration = Duration::from_secs(5);

impl RabbitMqConnection {
    /// Connects once, naming the connection after the executable (`orders-service` for
    /// `target/release/orders-service`), so that the broker's list of connections tells which
    /// program holds each; `hexeract` when the executable's name cannot be read.
    pub async fn connect(url: &str) -> Result<RabbitMqConnection, BusError> {
        RabbitMqConnection::connect_named(url, &default_name()).await
    }

    /// Connects once, with `name` as the connection's name on the broker.
    pub async fn connect_named(url: &str, name: &str) -> Result<RabbitMqConnection, BusError> {
        RabbitMqConnection::open(url, name, false).await
    }

    /// Connects once, with lapin's automatic recovery on: after a network failure, a missed
    /// heartbeat or a connection the broker closed, lapin connects again (16 tries, 0.1 s
    /// apart at first, then up to 5 s apart: about a minute) and replays what was declared on
    /// this connection (exchanges, queues, bindings, QoS, confirm mode, consumers) on the same
    /// channels.
    ///
    /// This is what [`RabbitMqTransport`](crate::rabbitmq::RabbitMqTransport) publishes on.
    /// The bus worker does not consume on it: a recovered channel starts its delivery tags
    /// again, so the acks of calls that were running would then go to the wrong deliveries
    /// (lapin's `Acker::ack` answers `Ok(false)` for those); the worker's supervisor opens a
    /// fresh connection instead, and the broker redelivers what was not acked.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), hexeract::rabbitmq::BusError> {
    /// use hexeract::rabbitmq::RabbitMqConnection;
    ///
    /// let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
    /// let connection = RabbitMqConnection::connect_recovering(url, "billing.publisher").await?;
    /// assert!(connection.is_recovering());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_recovering(url: &str, name: &str) -> Result<RabbitMqConnection, BusError> {
        RabbitMqConnection::open(url, name, true).await
    }

    async fn open(url: &str, name: &str, recovering: bool) -> Result<RabbitMqConnection, BusError> {
        let mut properties = ConnectionProperties::default().with_connection_name(name.into());
        if recovering {
            // 0.1 s, 0.2 s … then every 5 s: about a minute in all.
            properties = properties
                .enable_auto_recover()
                .configure_backoff(|backoff| {
                    backoff
                        .with_min_delay(Duration::from_millis(100))
                        .with_max_delay(Duration::from_secs(5))
                        .with_max_times(16)
                });
        }
        let (lapin_url, tls) = tls_settings(url)?;
        let runtime = lapin::runtime::default_runtime()
            .map_err(|error| BusError::Connection(format!("no tokio runtime: {error}")))?;
        // A broker that accepts the TCP connection and then never answers the handshake (a
        // proxy with nothing behind it, a node stuck at boot) would hold this call for good.
        let connecting = Connection::connect_with_config(&lapin_url, properties, tls, runtime);
        let inner = tokio::time::timeout(CONNECT_DEADLINE, connecting)
            .await
            .map_err(|_| {
                BusError::Connection(format!(
                    "cannot connect to {}: no answer to the AMQP handshake within \
                     {CONNECT_DEADLINE:?}",
                    redact_url(url)
                ))
            })?
            .map_err(|error| {
                let error = error.to_string();
                let hint = if error.contains("UnknownIssuer") {
                    " (the broker's certificate is from an authority not trusted here: add \
                     cacertfile=/path/to/ca.pem to the URL's query)"
                } else {
                    ""
                };
                BusError::Connection(format!(
                    "cannot connect to {}: {error}{hint}",
                    redact_url(url)
                ))
            })?;
        Ok(RabbitMqConnection {
            inner: Arc::new(inner),
            name: name.into(),
            url: url.into(),
            recovering,
        })
    }

    /// Connects, trying up to `attempts` times with `delay` between tries (doubling, at most
    /// 30 s), naming the connection after the executable as
    /// [`connect`](RabbitMqConnection::connect) does. Returns the last error when every try
    /// failed.
    pub async fn connect_with_retry(
        url: &str,
        attempts: u32,
        delay: Duration,
    ) -> Result<RabbitMqConnection, BusError> {
        RabbitMqConnection::connect_named_with_retry(url, &default_name(), attempts, delay).await
    }

    /// [`connect_with_retry`](RabbitMqConnection::connect_with_retry) with a connection name.
    pub async fn connect_named_with_retry(
        url: &str,
        name: &str,
        attempts: u32,
        delay: Duration,
    ) -> Result<RabbitMqConnection, BusError> {
        let mut backoff = crate::retry::Backoff::new(delay, Duration::from_secs(30));
        let mut tries = 0;
        loop {
            tries += 1;
            match RabbitMqConnection::connect_named(url, name).await {
                Ok(connection) => return Ok(connection),
                Err(error) if tries >= attempts.max(1) => return Err(error),
                Err(error) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(%error, attempt = tries, retry_in = ?delay, "RabbitMQ connection failed");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// A new connection to the same broker with the same name: what a supervisor uses after a
    /// connection loss.
    pub async fn reconnect(&self) -> Result<RabbitMqConnection, BusError> {
        RabbitMqConnection::open(&self.url, &self.name, self.recovering).await
    }

    /// `true` when lapin's automatic recovery is on for this connection
    /// ([`connect_recovering`](RabbitMqConnection::connect_recovering)).
    pub fn is_recovering(&self) -> bool {
        self.recovering
    }

    /// `true` while lapin is connecting this connection again after a failure.
    pub fn is_reconnecting(&self) -> bool {
        self.inner.status().reconnecting()
    }

    /// `true` once the connection is closed or failed for good (lapin's recovery, if on, gave
    /// up or cannot help).
    pub fn is_closed(&self) -> bool {
        let status = self.inner.status();
        status.closed() || status.errored()
    }

    /// The connection's name on the broker.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// `true` while the connection is open.
    pub fn is_connected(&self) -> bool {
        self.inner.status().connected()
    }

    /// `true` while the broker blocks this connection's publishes (`connection.blocked`: a
    /// memory or disk alarm).
    pub fn is_blocked(&self) -> bool {
        self.inner.status().blocked()
    }

    /// The lapin connection, for what Hexeract does not wrap.
    pub fn lapin(&self) -> &Connection {
        &self.inner
    }

    pub(crate) async fn channel(&self) -> Result<lapin::Channel, BusError> {
        self.inner
            .create_channel()
            .await
            .map_err(|error| BusError::transport("channel.open", error))
    }

    /// A second connection to the same broker, named `<name>.<suffix>`: for work whose
    /// refused passive declares (each closes its channel) should not touch this one's
    /// channels.
    pub(crate) async fn sibling(&self, suffix: &str) -> Result<RabbitMqConnection, BusError> {
        RabbitMqConnection::open(&self.url, &format!("{}.{suffix}", self.name), false).await
    }

    /// Closes the connection (200, "closed by the application"), waiting at most 5 s for the
    /// broker to confirm. A connection whose socket is gone, or
    /// whose broker stopped answering, never confirms: past the deadline the close is given up
    /// on with an error (the socket is let go all the same), so that a program's shutdown does
    /// not wait for it.
    pub async fn close(&self) -> Result<(), BusError> {
        let closing = self.inner.close(200, "closed by the application".into());
        match tokio::time::timeout(CLOSE_DEADLINE, closing).await {
            Ok(closed) => closed.map_err(|error| BusError::transport("connection.close", error)),
            Err(_) => Err(BusError::Transport {
                operation: "connection.close".to_owned(),
                detail: format!(
                    "the broker did not confirm the close within {CLOSE_DEADLINE:?} (the \
                     connection is lost or the broker stopped answering)"
                ),
            }),
        }
    }
}

impl fmt::Debug for RabbitMqConnection {
    // The URL holds the password: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqConnection")
            .field("name", &self.name)
            .field("url", &redact_url(&self.url))
            .field("connected", &self.is_connected())
            .field("recovering", &self.recovering)
            .finish()
    }
}

/// Splits the TLS parameters Hexeract reads from an AMQP URL off it: `cacertfile=<path>`, a PEM
/// file of the certificate authorities to trust besides the built-in web roots (a broker with a
/// certificate of a private CA), as RabbitMQ's own clients name it. The rest of the URL is
/// lapin's.
pub(crate) fn tls_settings(url: &str) -> Result<(String, OwnedTLSConfig), BusError> {
    let Ok(mut parsed) = url::Url::parse(url) else {
        // lapin reports what is wrong with it.
        return Ok((url.to_owned(), OwnedTLSConfig::default()));
    };
    let mut ca_file = None;
    let rest: Vec<(String, String)> = parsed
        .query_pairs()
        .filter_map(|(key, value)| {
            if key == "cacertfile" {
                ca_file = Some(value.into_owned());
                None
            } else {
                Some((key.into_owned(), value.into_owned()))
            }
        })
        .collect();
    let Some(ca_file) = ca_file else {
        return Ok((url.to_owned(), OwnedTLSConfig::default()));
    };
    if parsed.scheme() != "amqps" {
        return Err(BusError::Connection(format!(
            "{} names a cacertfile, which only an amqps:// URL uses",
            redact_url(url)
        )));
    }
    let cert_chain = std::fs::read_to_string(&ca_file).map_err(|error| {
        BusError::Connection(format!(
            "cannot read the certificate authorities of {} (cacertfile {ca_file:?}): {error}",
            redact_url(url)
        ))
    })?;
    if rest.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(rest);
    }
    let tls = OwnedTLSConfig {
        identity: None,
        cert_chain: Some(cert_chain),
    };
    Ok((parsed.into(), tls))
}

/// `url` with the password (if any) replaced by `***`: what Hexeract prints of a connection URL.
///
/// ```
/// use hexeract::rabbitmq::redact_url;
///
/// assert_eq!(redact_url("amqp://app:s3cret@broker:5672/%2f"), "amqp://app:***@broker:5672/%2f");
/// assert_eq!(redact_url("amqp://broker"), "amqp://broker");
/// ```
pub fn redact_url(url: &str) -> String {
    crate::redact::redact_url(url)
}

/// The executable's name (`hexeract` when it cannot be read).
fn default_name() -> String {
    crate::knobs::executable_name()
}
