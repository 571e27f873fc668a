//! The Grafana dashboard and the alerting rules of docs/observability/ against a real
//! Prometheus: `promtool` checks and unit-tests the rules, then a Prometheus on loopback scrapes
//! a worker (outbox relay and bus worker on RabbitMQ, dead letters in SQLite) that handled,
//! retried and dead-lettered messages, and evaluates every panel query and every rule. A
//! series renamed in hexeract/src/engine/metrics.rs, and not in the dashboard or the rules, fails here.
//!
//! Needs Debian's `prometheus` package (`prometheus` and `promtool` on the `PATH`, or
//! `PROMETHEUS_BIN` and `PROMTOOL_BIN`), and RabbitMQ (`TEST_AMQP_URL`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hexeract::config::{Amqp, Database};
use hexeract::store::sqlite::SqliteStore;
use hexeract::store::DeliveryStore;
use hexeract::{handler, App, AppConfig, CancellationToken, Context, Envelope, Message};
use hexeract_tests::amqp::TestBroker;
use hexeract_tests::temp::TempDir;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "observed.Job")]
struct Job {
    n: u32,
    fail_first: bool,
}

#[handler(message = "observed.Job", name = "observed.work")]
async fn work(job: Job, ctx: &Context) -> Result<(), String> {
    if job.fail_first && ctx.attempt() == 1 {
        return Err(format!("job {} failed on its first call", job.n));
    }
    Ok(())
}

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/observability")
}

/// `variable` if set, else `default`: the program to run.
fn program(variable: &str, default: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| default.to_owned())
}

fn promtool(args: &[&str]) -> String {
    let promtool = program("PROMTOOL_BIN", "promtool");
    let output = Command::new(&promtool)
        .args(args)
        .current_dir(docs())
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run `{promtool}` ({error}): install Debian's prometheus package \
                 (apt-get install prometheus) or set PROMTOOL_BIN"
            )
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {}: {text}",
        args.join(" ")
    );
    text
}

/// A Prometheus server of the test's own, stopped on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(target_port: u16) -> Prometheus {
        let dir =
            std::env::temp_dir().join(format!("hexeract-prometheus-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files: [{:?}]\n\
                 scrape_configs:\n  - job_name: shop\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{target_port}']\n",
                docs().join("alerts.yml").display().to_string()
            ),
        )
        .unwrap();
        promtool(&["check", "config", config.to_str().unwrap()]);
        let port = hexeract_tests::http::free_port();
        let prometheus = program("PROMETHEUS_BIN", "prometheus");
        let child = Command::new(&prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot run `{prometheus}` ({error}): install Debian's prometheus package \
                     (apt-get install prometheus) or set PROMETHEUS_BIN"
                )
            });
        Prometheus { child, port, dir }
    }

    /// `GET path` of the HTTP API, as JSON (HTTP/1.0: the body is never chunked).
    async fn api(&self, path: &str) -> Option<Value> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let response = String::from_utf8_lossy(&response);
        serde_json::from_str(response.split_once("\r\n\r\n")?.1).ok()
    }

    /// The instant result of `query`; panics with Prometheus's error when it does not evaluate.
    async fn query(&self, query: &str) -> Vec<Value> {
        let answer = self
            .api(&format!("/api/v1/query?query={}", encode(query)))
            .await
            .unwrap_or_else(|| panic!("no answer to {query}"));
        assert_eq!(answer["status"], "success", "{query}: {answer}");
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits up to 60 s for `query` to give a value of `expected` (and Prometheus to start).
    async fn wait_for(&self, query: &str, expected: f64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let result = if self.api("/api/v1/status/buildinfo").await.is_some() {
                self.query(query).await
            } else {
                Vec::new()
            };
            let value = result
                .first()
                .and_then(|sample| sample["value"][1].as_str())
                .and_then(|value| value.parse::<f64>().ok());
            if value == Some(expected) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{query} is {result:?}, not {expected}, after 60 s; Prometheus's log: {}",
                std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `query` as a URL's query value.
fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// Every `hexeract_…` series `expr` reads, without a histogram's `_bucket`, `_sum`, `_count`.
fn series_of(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(start) = rest.find("hexeract_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        names.insert(name.to_owned());
        rest = &tail[end..];
    }
    names
}

/// Every panel query of the dashboard, as Prometheus runs it once Grafana filled in its
/// variables, with its panel's title.
fn panel_queries() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(docs().join("grafana-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("every target has an expr");
            queries.push((
                panel["title"].as_str().unwrap().to_owned(),
                expr.replace("$__rate_interval", "30s")
                    .replace("$__range", "10m")
                    .replace("$job", ".*"),
            ));
        }
    }
    queries
}

/// Every rule's expression in alerts.yml, with the alert's name.
fn rule_queries() -> Vec<(String, String)> {
    let rules = std::fs::read_to_string(docs().join("alerts.yml")).unwrap();
    let mut queries = Vec::new();
    let mut alert = None;
    for line in rules.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("- alert: ") {
            alert = Some(name.to_owned());
        } else if let Some(expr) = line.strip_prefix("expr: ") {
            queries.push((alert.clone().expect("expr after alert"), expr.to_owned()));
        }
    }
    queries
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let checked = promtool(&["check", "rules", "alerts.yml"]);
    assert!(checked.contains("SUCCESS: 5 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    assert_eq!(rule_queries().len(), 5, "one expression read per rule");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_query_and_rule_reads_series_a_scraped_worker_serves() {
    let broker = TestBroker::new().await;
    let dir = TempDir::new("hexeract-observed");
    let file = dir.join("outbox.db");
    let port = hexeract_tests::http::free_port();
    let mut config = AppConfig {
        database: Database::Sqlite(file.clone()),
        worker_port: port,
        worker_addr: [127, 0, 0, 1].into(),
        relay_poll_interval: Duration::from_millis(50),
        amqp: Some(Amqp {
            url: hexeract_tests::amqp::amqp_url(),
            exchange: broker.exchange.clone(),
            queue_prefix: broker.prefix.clone(),
            ..Amqp::new("")
        }),
        ..AppConfig::default()
    };
    config.policy.shutdown_grace = Duration::from_secs(2);
    let cancel = CancellationToken::new();
    let running = tokio::spawn(App::new(config).try_run(cancel.clone()));
    hexeract_tests::http::wait_for_status(port, "/health/ready", 200, Duration::from_secs(30))
        .await;
    let prometheus = Prometheus::start(port);
    // Scraped once before anything happens: the counters' first samples are 0, so the alert on
    // their increase sees the first dead letter.
    prometheus
        .wait_for(
            "hexeract_messages_dead_lettered_total{handler=\"observed.work\",reason=\"payload_invalid\"}",
            0.0,
        )
        .await;

    let store = SqliteStore::open(&file).await.unwrap();
    let mut undecodable = Envelope::new(&Job {
        n: 3,
        fail_first: false,
    })
    .unwrap();
    undecodable.payload = b"[3]".to_vec().into();
    let jobs = [(1, false), (2, true)]
        .into_iter()
        .map(|(n, fail_first)| Envelope::new(&Job { n, fail_first }).unwrap());
    store
        .publish(jobs.chain([undecodable]).collect())
        .await
        .unwrap();
    prometheus
        .wait_for(
            "sum(hexeract_messages_handled_total{handler=\"observed.work\"})",
            2.0,
        )
        .await;
    prometheus
        .wait_for(
            "sum(hexeract_messages_dead_lettered_total{handler=\"observed.work\",reason=\"payload_invalid\"})",
            1.0,
        )
        .await;
    prometheus
        .wait_for(
            "sum(hexeract_messages_retried_total{handler=\"observed.work\",reason=\"handler_failed\"})",
            1.0,
        )
        .await;
    // Three scrapes at least since, so that a rate over 30 s has two samples.
    prometheus
        .wait_for(
            "count_over_time(hexeract_messages_handled_total{handler=\"observed.work\"}[30s]) >= bool 3",
            1.0,
        )
        .await;

    // Every series the dashboard and the rules read is one the worker serves (Kafka's lag is
    // served by a Kafka worker only: it is checked against the name the code records).
    let served: BTreeSet<String> = prometheus
        .api("/api/v1/label/__name__/values")
        .await
        .expect("label values")["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|name| name.as_str().unwrap().to_owned())
        .collect();
    let mut read = BTreeSet::new();
    let panels = panel_queries()
        .into_iter()
        .map(|(title, query)| (true, title, query));
    let rules = rule_queries()
        .into_iter()
        .map(|(alert, query)| (false, alert, query));
    for (panel, title, query) in panels.chain(rules) {
        let result = prometheus.query(&query).await;
        let names = series_of(&query);
        assert!(
            !names.is_empty(),
            "{title}: {query} reads no hexeract series"
        );
        for name in &names {
            if name == hexeract::metrics::CONSUMER_LAG {
                continue;
            }
            let histogram = format!("{name}_bucket");
            assert!(
                served.contains(name) || served.contains(&histogram),
                "{title}: {query} reads {name}, which the worker does not serve; it serves {served:?}"
            );
        }
        if panel && !names.contains(hexeract::metrics::CONSUMER_LAG) {
            assert!(!result.is_empty(), "panel {title}: {query} gives no series");
        }
        read.extend(names);
    }
    // The dashboard shows every series the code records.
    for name in [
        hexeract::metrics::HANDLED,
        hexeract::metrics::RETRIED,
        hexeract::metrics::DEAD_LETTERED,
        hexeract::metrics::HANDLER_DURATION,
        hexeract::metrics::IN_FLIGHT,
        hexeract::metrics::HANDLER_PENDING,
        hexeract::metrics::HANDLER_OLDEST_PENDING,
        hexeract::metrics::OUTBOX_BACKLOG,
        hexeract::metrics::OUTBOX_OLDEST_PENDING,
        hexeract::metrics::QUEUE_DEPTH,
        hexeract::metrics::CONSUMER_LAG,
        hexeract::metrics::RELAY_PUBLISHED,
        hexeract::metrics::RELAY_PUBLISH_DURATION,
        hexeract::metrics::COMPONENT_READY,
    ] {
        assert!(read.contains(name), "no panel or rule reads {name}");
    }
    // The dead letter fires its alert, with the reason as a label.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let alerts = prometheus.api("/api/v1/alerts").await.unwrap_or_default();
        let firing = alerts["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|alert| {
                alert["labels"]["alertname"] == "HexeractDeadLettersRising"
                    && alert["labels"]["handler"] == "observed.work"
                    && alert["labels"]["reason"] == "payload_invalid"
                    && alert["state"] == "firing"
            });
        if firing {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "HexeractDeadLettersRising not firing within 30 s: {alerts}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(prometheus);
    cancel.cancel();
    running.await.unwrap().unwrap();
    hexeract_tests::amqp::delete_queues_with_prefix(&broker.prefix).await;
}
