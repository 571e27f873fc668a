//! Secrets out of logs, errors and pages: the one redaction of URLs the whole crate uses.
//! (sqlx and amq-protocol print passwords in the `Debug` of their options: never show those.)

/// `url` with its password replaced by `***` and its query and fragment left out (they may
/// carry a password too: `?password=…`), for logs and errors. Not a URL: `(not a URL)`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not a URL)".to_owned();
    };
    // The credentials end at the last `@`: a password may hold an unencoded `/`, `@`, `?` or
    // `#` (a query holding an `@` hides a little more than the password: the safe side).
    match rest.rsplit_once('@') {
        Some((credentials, host_and_path)) => {
            let host_and_path = host_and_path.split(['?', '#']).next().unwrap_or("");
            let user = credentials.split(':').next().unwrap_or("");
            let hidden = if credentials.contains(':') {
                ":***"
            } else {
                ""
            };
            format!("{scheme}://{user}{hidden}@{host_and_path}")
        }
        None => format!("{scheme}://{}", rest.split(['?', '#']).next().unwrap_or("")),
    }
}

/// `text` with every URL in it (a word with `://`) passed through [`redact_url`]: for messages
/// that quote a URL somewhere, such as errors in logs.
pub(crate) fn redact_text(text: &str) -> String {
    replace_words(text, |word| match word.find("://") {
        // What stands before the scheme (a quote, a parenthesis) stays.
        Some(at) => {
            let start = scheme_start(word, at);
            Some(format!("{}{}", &word[..start], redact_url(&word[start..])))
        }
        None => None,
    })
}

/// `text` as anyone who reaches the health port may read it (`/health/ready`): every URL in it
/// replaced by the kind of server it names ([`server_kind`]: `rabbitmq`, `postgresql`, …) and
/// every network address (`db.internal:5432`, `10.0.0.7:9092`) by `(address)`, so that
/// neither credentials nor user, host, port, vhost or database name show. The server's kind
/// and the error itself stay, which is what a reader of a readiness page acts on; the log line
/// of the same failure keeps the address ([`redact_text`]).
pub(crate) fn anonymize_text(text: &str) -> String {
    replace_words(text, |word| {
        if let Some(at) = word.find("://") {
            let start = scheme_start(word, at);
            // The rest of the word is the URL (a password may hold any character), but for
            // the punctuation that closes it: a quote, a parenthesis, `:` before the error.
            let url = word.trim_end_matches(|c: char| "\"')],;:.".contains(c));
            let kind = server_kind(&word[start..at]);
            return Some(format!("{}{kind}{}", &word[..start], &word[url.len()..]));
        }
        is_address(word.trim_matches(|c: char| "\"'(),;:".contains(c)))
            .then(|| "(address)".to_owned())
    })
}

/// What a URL's scheme connects to, by name: `rabbitmq` for `amqp`/`amqps`, `postgresql`,
/// `sqlite`, `kafka`; `(a server)` for any other.
pub(crate) fn server_kind(scheme: &str) -> &'static str {
    match scheme.to_ascii_lowercase().as_str() {
        "amqp" | "amqps" => "rabbitmq",
        "postgres" | "postgresql" => "postgresql",
        "sqlite" => "sqlite",
        "kafka" | "kafka+ssl" => "kafka",
        _ => "(a server)",
    }
}

/// Where the scheme of the URL whose `://` is at `at` in `word` starts: after what stands
/// before it (a quote, a parenthesis).
fn scheme_start(word: &str, at: usize) -> usize {
    word[..at]
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
        .map_or(0, |before| before + 1)
}

/// `host:port` with a dotted host or an IP (`db.internal:5432`, `[::1]:5672`, librdkafka's
/// `ipv4#10.0.0.7:9092`, `broker:9092/bootstrap`): not `attempt:3` or a time of day.
fn is_address(word: &str) -> bool {
    let word = word.split('/').next().unwrap_or("");
    let Some((host, port)) = word.rsplit_once(':') else {
        return false;
    };
    let port_like = !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    let host = host.rsplit('#').next().unwrap_or(host);
    let host_like = host.starts_with('[')
        || host == "localhost"
        || (host.contains('.')
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)));
    port_like && host_like
}

/// `text` with each space-separated word that `replace` gives a replacement for replaced.
fn replace_words(text: &str, replace: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    for (index, word) in text.split(' ').enumerate() {
        if index > 0 {
            out.push(' ');
        }
        match replace(word) {
            Some(replaced) => out.push_str(&replaced),
            None => out.push_str(word),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords_only() {
        assert_eq!(
            redact_url("postgres://u:p@h:5432/d"),
            "postgres://u:***@h:5432/d"
        );
        assert_eq!(redact_url("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(redact_url("postgres://h/d?password=p"), "postgres://h/d");
        assert_eq!(redact_url("postgres://u:p@h"), "postgres://u:***@h");
        assert_eq!(redact_url("nonsense"), "(not a URL)");
        // Unencoded `/` and `@` in a password stay hidden.
        assert_eq!(
            redact_url("amqp://app:pa/ss@host/%2f"),
            "amqp://app:***@host/%2f"
        );
        assert_eq!(redact_url("amqp://app:p@ss@host"), "amqp://app:***@host");
        // A `?` or `#` in the password is no query: nothing of the password shows.
        assert_eq!(
            redact_url("amqp://app:pa?ss@broker/"),
            "amqp://app:***@broker/"
        );
        assert_eq!(
            redact_url("amqp://app:pa#ss@broker/v?x=1"),
            "amqp://app:***@broker/v"
        );
    }

    #[test]
    fn anonymized_text_names_the_server_kind_and_hides_every_address() {
        for (text, shown) in [
            (
                "cannot connect to amqp://app:s3cret@broker.internal:5672/prod-vhost: refused",
                "cannot connect to rabbitmq: refused",
            ),
            (
                "cannot reach (postgres://billing@db-7.internal/ledger?sslmode=require) now",
                "cannot reach (postgresql) now",
            ),
            (
                "url=\"amqps://u:p@h/%2f\" refused",
                "url=\"rabbitmq\" refused",
            ),
            ("redis://cache:6379 down", "(a server) down"),
            // Whatever a password holds, nothing of the URL but its kind shows.
            ("amqp://u:pa)s,s@host.internal/v: gone", "rabbitmq: gone"),
            (
                "broker.internal:9092/bootstrap: Connect to ipv4#10.0.0.7:9092 failed",
                "(address) Connect to (address) failed",
            ),
            (
                "connect to 127.0.0.1:5432, [::1]:5432",
                "connect to (address) (address)",
            ),
            ("attempt:3 at 12:30 for 5s", "attempt:3 at 12:30 for 5s"),
            ("plain reason", "plain reason"),
        ] {
            assert_eq!(anonymize_text(text), shown, "{text}");
        }
    }

    #[test]
    fn urls_in_text_lose_user_info_and_query_passwords() {
        assert_eq!(
            redact_text("cannot reach amqp://app:s3cr:et@broker:5672/%2f: refused"),
            "cannot reach amqp://app:***@broker:5672/%2f: refused"
        );
        assert_eq!(
            redact_text("connecting to (postgres://db/app?user=x&password=hunter2) failed"),
            "connecting to (postgres://db/app failed"
        );
        assert_eq!(
            redact_text("url=\"amqps://u:hunter2@h/%2f\" refused"),
            "url=\"amqps://u:***@h/%2f\" refused"
        );
        assert_eq!(redact_text("no url here"), "no url here");
        assert!(!redact_text("x postgres://h/d?password=hunter2#y").contains("hunter2"));
    }
}
