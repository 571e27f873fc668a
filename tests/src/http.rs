//! A minimal HTTP/1.1 client for the health and metrics endpoints and the orders example's API:
//! one request per connection, bodies with a `Content-Length` (no chunked encoding).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port nobody listens on right now, for `WORKER_PORT`.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// `GET path` on 127.0.0.1:`port`: the status code and the body, or `None` when nothing
/// answers (yet).
pub async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    request(port, "GET", path, None).await
}

/// `method path` on 127.0.0.1:`port`, with `json` as an `application/json` body when given:
/// the status code and the body, or `None` when nothing answers (yet) within 5 s.
pub async fn request(
    port: u16,
    method: &str,
    path: &str,
    json: Option<&str>,
) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let body = json.unwrap_or("");
        let content = match json {
            Some(_) => format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            ),
            None => String::new(),
        };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{content}\r\n{body}"
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let response = String::from_utf8_lossy(&response).into_owned();
        let status = response.split(' ').nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n")?.1.to_owned();
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .ok()
        .flatten()
}

/// Waits up to `limit` for `GET path` to answer `status`; returns the body.
///
/// # Panics
///
/// When it does not, with the last answer.
pub async fn wait_for_status(port: u16, path: &str, status: u16, limit: Duration) -> String {
    let deadline = tokio::time::Instant::now() + limit;
    let mut last = None;
    while tokio::time::Instant::now() < deadline {
        last = get(port, path).await;
        if let Some((got, body)) = &last {
            if *got == status {
                return body.clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("GET {path} did not answer {status} within {limit:?}; last answer: {last:?}")
}
