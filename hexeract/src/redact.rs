//! Secrets out of logs, errors and pages: the one redaction of URLs the whole crate uses.
//! (sqlx and amq-protocol print passwords in the `Debug` of their options: never show those.)

/// `url` with its password replaced by `***` and its query and fragment left out (they may
/// carry a password too: `?password=…`), for logs and errors. Not a URL: `(not a URL)`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(not a URL)".to_owned();
    };
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    // The credentials end at the last `@`: a password may hold an unencoded `/` or `@`.
    match rest.rsplit_once('@') {
        Some((credentials, host_and_path)) => {
            let user = credentials.split(':').next().unwrap_or("");
            let hidden = if credentials.contains(':') {
                ":***"
            } else {
                ""
            };
            format!("{scheme}://{user}{hidden}@{host_and_path}")
        }
        None => format!("{scheme}://{rest}"),
    }
}

/// `text` with every URL in it (a word with `://`) passed through [`redact_url`]: for messages
/// that quote a URL somewhere, such as errors shown on `/health/ready`.
pub(crate) fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (index, word) in text.split(' ').enumerate() {
        if index > 0 {
            out.push(' ');
        }
        match word.find("://") {
            // What stands before the scheme (a quote, a parenthesis) stays.
            Some(at) => {
                let start = word[..at]
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
                    .map_or(0, |before| before + 1);
                out.push_str(&word[..start]);
                out.push_str(&redact_url(&word[start..]));
            }
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
