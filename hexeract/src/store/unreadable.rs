//! Stored messages Hexeract did not write: what can be read of such a row, and what was wrong
//! with it. A row one program wrote by hand must not stop a relay or a worker for every row
//! behind it: each store reads its rows through [`Problems`], and a row with a problem is
//! dead-lettered alone as [`Reason::MESSAGE_UNREADABLE`](crate::Reason::MESSAGE_UNREADABLE),
//! with what could be read of it.

use std::collections::BTreeMap;

/// What was wrong with one stored message, collected while reading the rest of it.
#[derive(Debug, Default)]
pub(crate) struct Problems(Vec<String>);

impl Problems {
    /// `value` when it could be read; `fallback`, with the problem noted, when it could not.
    pub(crate) fn or<T, E: std::fmt::Display>(
        &mut self,
        column: &str,
        value: Result<T, E>,
        fallback: T,
    ) -> T {
        value.unwrap_or_else(|error| {
            self.0.push(format!("{column}: {error}"));
            fallback
        })
    }

    /// Notes a problem.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) fn note(&mut self, problem: String) {
        self.0.push(problem);
    }

    /// The headers of a row whose `headers` column did not read as a JSON object of strings:
    /// every string value kept, any other value kept as its JSON text (the bytes are not lost,
    /// and a person reading the dead letter sees what was there), each noted.
    pub(crate) fn headers(&mut self, value: serde_json::Value) -> BTreeMap<String, String> {
        match value {
            serde_json::Value::Object(entries) => entries
                .into_iter()
                .map(|(name, value)| match value {
                    serde_json::Value::String(text) => (name, text),
                    other => {
                        let text = other.to_string();
                        self.0.push(format!(
                            "header {name:?} is not a string ({}); kept as its JSON text",
                            crate::dead_letter::truncate(&text, 64)
                        ));
                        (name, text)
                    }
                })
                .collect(),
            other => {
                self.0.push(format!(
                    "headers are not a JSON object: {}",
                    crate::dead_letter::truncate(&other.to_string(), 200)
                ));
                BTreeMap::new()
            }
        }
    }

    /// The `headers` column: `strict`, as Hexeract writes them (a JSON object of strings), or
    /// else what [`headers`](Problems::headers) makes of the JSON `lenient` reads.
    pub(crate) fn headers_column<E1, E2: std::fmt::Display>(
        &mut self,
        strict: Result<sqlx::types::Json<BTreeMap<String, String>>, E1>,
        lenient: impl FnOnce() -> Result<sqlx::types::Json<serde_json::Value>, E2>,
    ) -> BTreeMap<String, String> {
        match strict {
            Ok(headers) => headers.0,
            Err(_) => match lenient() {
                Ok(value) => self.headers(value.0),
                Err(error) => self.or("headers", Err(error), BTreeMap::new()),
            },
        }
    }

    /// Everything noted, as a dead letter's detail; `None` when the row read cleanly.
    pub(crate) fn into_detail(self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        Some(format!(
            "the stored message could not be read as Hexeract writes it: {}",
            self.0.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::Problems;

    #[test]
    fn string_headers_read_cleanly() {
        let mut problems = Problems::default();
        let headers = problems.headers(serde_json::json!({"tenant": "acme"}));
        assert_eq!(headers["tenant"], "acme");
        assert_eq!(problems.into_detail(), None);
    }

    #[test]
    fn a_header_that_is_not_a_string_is_kept_as_json_and_noted() {
        let mut problems = Problems::default();
        let headers = problems.headers(serde_json::json!({"retries": 3, "tenant": "acme"}));
        assert_eq!(headers["retries"], "3");
        assert_eq!(headers["tenant"], "acme");
        let detail = problems.into_detail().expect("a problem");
        assert!(
            detail.contains("header \"retries\" is not a string"),
            "{detail}"
        );
        assert!(!detail.contains("tenant"), "{detail}");
    }

    #[test]
    fn headers_that_are_not_an_object_are_dropped_and_noted() {
        for value in [
            serde_json::json!([1, 2]),
            serde_json::json!(null),
            serde_json::json!("x"),
        ] {
            let mut problems = Problems::default();
            assert!(problems.headers(value.clone()).is_empty());
            let detail = problems.into_detail().expect("a problem");
            assert!(detail.contains("not a JSON object"), "{value}: {detail}");
        }
    }

    #[test]
    fn a_column_that_fails_falls_back_and_is_noted() {
        let mut problems = Problems::default();
        let read: Result<i32, &str> = Err("not an integer");
        assert_eq!(problems.or("attempts", read, 0), 0);
        assert_eq!(problems.or("kept", Ok::<_, &str>(7), 0), 7);
        let detail = problems.into_detail().expect("a problem");
        assert!(detail.contains("attempts: not an integer"), "{detail}");
    }
}
