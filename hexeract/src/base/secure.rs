//! Connections that leave the machine are encrypted and verified, or refused: the one decision,
//! a pure function of the URL, that the configuration check and the stores apply.
//!
//! A database or broker on this machine (a loopback address, `localhost`, a Unix socket) may be
//! reached in plain text: nothing crosses a network. Any other host must be reached over TLS
//! whose certificate is verified against the host name: PostgreSQL with `sslmode=verify-full`
//! (what an unset `sslmode` becomes) or `verify-ca`, RabbitMQ with `amqps://`. sqlx's own default
//! (`sslmode=prefer`) verifies nothing and falls back to plain text without a word, and an
//! `amqp://` URL sends the broker's password in the clear: both are refused at startup unless
//! `HEXERACT_ALLOW_INSECURE_CONNECTIONS=1` says the network is trusted, which is logged.

use std::net::IpAddr;

/// What a connection URL asks for, as far as the network is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Security {
    /// The server is on this machine: plain text is fine.
    Local,
    /// TLS with the server's certificate verified.
    Verified,
    /// Plain text, or TLS that does not verify the server, to another machine: why.
    Insecure(String),
}

/// `text` with its `%XX` escapes decoded (a Unix socket's directory is written
/// `%2Fvar%2Frun%2Fpostgresql` in a URL's host, as sqlx reads it).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|b| (*b as char).to_digit(16));
        match (bytes[index], hex(index + 1), hex(index + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                index += 3;
            }
            (byte, ..) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `host` (a URL's host, brackets removed, percent-escapes decoded) is this machine.
pub(crate) fn is_local(host: &str) -> bool {
    let host = percent_decoded(host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.starts_with('/') || host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The host of a `scheme://[user[:password]@]host[:port][/path][?query]` URL, without parsing
/// anything a password may hold.
fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // The credentials end at the last `@`: a password may hold an unencoded `@`.
    let host_and_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if let Some(bracketed) = host_and_port.strip_prefix('[') {
        return bracketed.split(']').next().unwrap_or("");
    }
    // Several hosts (`host1:5432,host2:5432`): the first decides (all should be alike).
    let first = host_and_port.split(',').next().unwrap_or("");
    first.split(':').next().unwrap_or("")
}

/// A query parameter of `url`, last one wins (as libpq reads them).
fn parameter<'a>(url: &'a str, name: &str) -> Option<&'a str> {
    let query = url.split_once('?')?.1.split('#').next().unwrap_or("");
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| *key == name)
        .map(|(_, value)| value)
        .next_back()
}

/// The security of a `postgres://` URL. An unset `sslmode` is `verify-full` to another machine
/// (see [`postgres_ssl_mode`]); a `host=` parameter (a Unix socket's directory, or a host)
/// overrides the URL's host, as in libpq.
pub(crate) fn postgres(url: &str) -> Security {
    let host = parameter(url, "host").unwrap_or_else(|| host_of(url));
    if is_local(host) {
        return Security::Local;
    }
    match parameter(url, "sslmode") {
        None | Some("verify-full") | Some("verify-ca") => Security::Verified,
        Some(mode) => Security::Insecure(format!(
            "sslmode={mode} to {host} does not verify the server's certificate{}",
            match mode {
                "disable" => " (and sends everything in plain text)",
                "allow" | "prefer" => " (and falls back to plain text without a word)",
                _ => "",
            }
        )),
    }
}

/// The `sslmode` a connection to `url` gets when its URL sets none: `verify-full` to another
/// machine, where sqlx would pick `prefer`; `None` where the URL's own (or sqlx's) stands.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn postgres_ssl_mode(url: &str) -> Option<&'static str> {
    (parameter(url, "sslmode").is_none() && postgres(url) == Security::Verified)
        .then_some("verify-full")
}

/// The security of an `amqp://` or `amqps://` URL: `amqps://` verifies the broker's
/// certificate (against the web roots, or the `cacertfile` given).
pub(crate) fn amqp(url: &str) -> Security {
    let host = host_of(url);
    if url.starts_with("amqps://") {
        Security::Verified
    } else if is_local(host) {
        Security::Local
    } else {
        Security::Insecure(format!(
            "amqp:// to {host} sends the broker's password and every message in plain text; \
             use amqps://"
        ))
    }
}

/// The `security.protocol` a Kafka client gets, and its security: `protocol` as set
/// (`KAFKA_SECURITY_PROTOCOL`, any case), or where unset `plaintext` when every broker of
/// `brokers` (`host:port,…`) is on this machine and `ssl` when one is not. librdkafka verifies
/// a broker's certificate and name by default.
pub(crate) fn kafka(brokers: &str, protocol: Option<&str>) -> (String, Security) {
    let hosts: Vec<&str> = brokers
        .split(',')
        .map(str::trim)
        .filter(|broker| !broker.is_empty())
        .map(|broker| {
            let broker = broker.split_once("://").map_or(broker, |(_, rest)| rest);
            host_of(broker)
        })
        .collect();
    let remote = hosts.iter().find(|host| !is_local(host));
    let protocol = match protocol {
        Some(protocol) => protocol.to_ascii_lowercase(),
        None if remote.is_some() => "ssl".to_owned(),
        None => "plaintext".to_owned(),
    };
    let security = if protocol.ends_with("ssl") {
        Security::Verified
    } else {
        match remote {
            None => Security::Local,
            Some(host) => Security::Insecure(format!(
                "security.protocol {protocol} to {host} sends {} every record in plain text; use \
                 ssl or sasl_ssl",
                if protocol.starts_with("sasl") {
                    "the SASL credentials (with PLAIN) and"
                } else {
                    ""
                }
            )),
        }
    };
    (protocol, security)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_urls() {
        let insecure = |url: &str| matches!(postgres(url), Security::Insecure(_));
        let table: &[(&str, Security)] = &[
            ("postgres://app:pw@127.0.0.1:5432/app", Security::Local),
            (
                "postgres://app:pw@127.0.0.2/app?sslmode=disable",
                Security::Local,
            ),
            ("postgres://app@localhost/app", Security::Local),
            ("postgres://app@[::1]:5432/app", Security::Local),
            ("postgres:///app?host=/var/run/postgresql", Security::Local),
            ("postgres://%2Fvar%2Frun%2Fpostgresql/app", Security::Local),
            (
                "postgres://app@db.internal/app?host=%2Fvar%2Frun%2Fpostgresql",
                Security::Local,
            ),
            ("postgres://app:p@ss@db.internal/app", Security::Verified),
            (
                "postgres://app@db.internal/app?sslmode=verify-full",
                Security::Verified,
            ),
            (
                "postgres://app@10.0.0.5/app?sslmode=verify-ca",
                Security::Verified,
            ),
            ("postgres://app@db1:5432,db2:5432/app", Security::Verified),
        ];
        for (url, expected) in table {
            assert_eq!(&postgres(url), expected, "{url}");
        }
        for url in [
            "postgres://app@db.internal/app?sslmode=prefer",
            "postgres://app@db.internal/app?sslmode=require",
            "postgres://app@db.internal/app?sslmode=disable",
            "postgres://app@db.internal/app?sslmode=allow",
            "postgres://app@127.0.0.1/app?host=db.internal&sslmode=require",
            "postgres://app@db.internal/app?sslmode=verify-full&sslmode=prefer",
        ] {
            assert!(insecure(url), "{url}");
        }
        let Security::Insecure(why) = postgres("postgres://app:s3cret@db/app?sslmode=prefer")
        else {
            unreachable!()
        };
        assert!(why.contains("sslmode=prefer to db"), "{why}");
        assert!(!why.contains("s3cret"), "{why}");
    }

    #[test]
    fn an_unset_sslmode_to_another_machine_becomes_verify_full() {
        assert_eq!(
            postgres_ssl_mode("postgres://app@db.internal/app"),
            Some("verify-full")
        );
        assert_eq!(postgres_ssl_mode("postgres://app@127.0.0.1/app"), None);
        assert_eq!(
            postgres_ssl_mode("postgres://app@db.internal/app?sslmode=verify-ca"),
            None
        );
    }

    #[test]
    fn kafka_brokers() {
        let table: &[(&str, Option<&str>, &str, Security)] = &[
            ("127.0.0.1:9092", None, "plaintext", Security::Local),
            (
                "localhost:9092,127.0.0.1:9093",
                None,
                "plaintext",
                Security::Local,
            ),
            ("kafka-1.internal:9093", None, "ssl", Security::Verified),
            (
                "127.0.0.1:9092,kafka-1.internal:9093",
                None,
                "ssl",
                Security::Verified,
            ),
            (
                "kafka-1.internal:9093",
                Some("SASL_SSL"),
                "sasl_ssl",
                Security::Verified,
            ),
            ("127.0.0.1:9092", Some("ssl"), "ssl", Security::Verified),
            (
                "127.0.0.1:9092",
                Some("sasl_plaintext"),
                "sasl_plaintext",
                Security::Local,
            ),
        ];
        for (brokers, protocol, effective, security) in table {
            assert_eq!(
                kafka(brokers, *protocol),
                (effective.to_string(), security.clone()),
                "{brokers} {protocol:?}"
            );
        }
        for protocol in ["plaintext", "sasl_plaintext"] {
            let (_, security) = kafka("kafka-1.internal:9092", Some(protocol));
            let Security::Insecure(why) = security else {
                panic!("{protocol} to another machine is insecure")
            };
            assert!(why.contains("kafka-1.internal"), "{why}");
        }
    }

    #[test]
    fn amqp_urls() {
        let table: &[(&str, Security)] = &[
            ("amqp://guest:guest@127.0.0.1:5672/%2f", Security::Local),
            ("amqp://guest:guest@localhost/%2f", Security::Local),
            ("amqps://app:pw@broker.internal/%2f", Security::Verified),
            (
                "amqps://app:pw@127.0.0.1/%2f?cacertfile=/ca.pem",
                Security::Verified,
            ),
        ];
        for (url, expected) in table {
            assert_eq!(&amqp(url), expected, "{url}");
        }
        let Security::Insecure(why) = amqp("amqp://app:s3cret@broker.internal:5672/%2f") else {
            panic!("plain amqp to another machine is insecure")
        };
        assert!(why.contains("broker.internal"), "{why}");
        assert!(!why.contains("s3cret"), "{why}");
    }
}
