//! `compose.yaml` (the repository's root) runs PostgreSQL, RabbitMQ and Kafka for the tests and
//! the examples. These tests read it and check that what it starts is what the tests' defaults
//! (`tests/src/pg.rs`, `amqp.rs`, `kafka.rs`) connect to, and what README.md and
//! docs/getting-started.md tell people to export: the ports, the credentials and the database.
//! Docker itself is not needed: nothing is started.

use std::collections::BTreeMap;

use serde_norway::Value;
use url::Url;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/{path}"))
        .unwrap_or_else(|error| panic!("cannot read {path}: {error}"))
}

/// `compose.yaml`'s service `name`.
fn service(name: &str) -> Value {
    let compose: Value =
        serde_norway::from_str(&read("compose.yaml")).expect("compose.yaml is YAML");
    compose["services"][name].clone()
}

fn image(service: &Value) -> &str {
    service["image"]
        .as_str()
        .expect("the service names an image")
}

/// A service's environment, written as a map or as a list of `KEY=value`.
fn environment(service: &Value) -> BTreeMap<String, String> {
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        Value::Number(number) => number.to_string(),
        Value::Bool(flag) => flag.to_string(),
        other => panic!("an environment value that is not a scalar: {other:?}"),
    };
    match &service["environment"] {
        Value::Mapping(map) => map
            .iter()
            .map(|(key, value)| (text(key), text(value)))
            .collect(),
        Value::Sequence(list) => list
            .iter()
            .map(|entry| {
                let entry = text(entry);
                let (key, value) = entry.split_once('=').unwrap_or((&entry, ""));
                (key.to_owned(), value.to_owned())
            })
            .collect(),
        Value::Null => BTreeMap::new(),
        other => panic!("environment is neither a map nor a list: {other:?}"),
    }
}

/// The container port published on the host's `host_port` (`"5432:5432"`,
/// `"127.0.0.1:5432:5432"`), or `None`.
fn published(service: &Value, host_port: u16) -> Option<u16> {
    let ports = service["ports"]
        .as_sequence()
        .expect("the service publishes ports");
    ports.iter().find_map(|entry| {
        let entry = match entry {
            Value::String(text) => text.clone(),
            other => panic!("use the short \"host:container\" form for ports, not {other:?}"),
        };
        let parts: Vec<&str> = entry.split(':').collect();
        assert!(
            parts.len() >= 2,
            "port {entry:?} is not published on the host"
        );
        if parts.len() == 3 {
            assert!(
                ["127.0.0.1", "0.0.0.0", "localhost"].contains(&parts[0]),
                "port {entry:?} is bound to an address the tests do not connect to"
            );
        }
        let host: u16 = parts[parts.len() - 2].parse().expect("a host port");
        let container: u16 = parts[parts.len() - 1].parse().expect("a container port");
        (host == host_port).then_some(container)
    })
}

fn has_healthcheck(service: &Value) -> bool {
    match &service["healthcheck"]["test"] {
        Value::Sequence(command) => command.len() >= 2,
        Value::String(command) => !command.trim().is_empty(),
        _ => false,
    }
}

/// The docs that tell people how to use compose.yaml.
fn docs() -> [(&'static str, String); 2] {
    [
        ("README.md", read("README.md")),
        ("docs/getting-started.md", read("docs/getting-started.md")),
    ]
}

#[test]
fn postgres_is_the_test_database() {
    let url = Url::parse(hexeract_tests::pg::DEFAULT_URL).expect("pg::DEFAULT_URL is a URL");
    let postgres = service("postgres");
    assert!(
        image(&postgres).starts_with("postgres:15"),
        "PostgreSQL 15, as the docs and benchmarks say: {}",
        image(&postgres)
    );
    assert!(has_healthcheck(&postgres), "postgres has no healthcheck");
    let port = url.port().expect("the URL names its port");
    assert_eq!(port, 5432);
    assert_eq!(
        published(&postgres, port),
        Some(5432),
        "5432 is PostgreSQL's port in the container"
    );

    let env = environment(&postgres);
    let user = env.get("POSTGRES_USER").map_or("postgres", String::as_str);
    assert_eq!(user, url.username());
    let database = env.get("POSTGRES_DB").map_or(user, String::as_str);
    assert_eq!(database, "test");
    assert_eq!(format!("/{database}"), url.path());
    match url.password() {
        None => assert_eq!(
            env.get("POSTGRES_HOST_AUTH_METHOD").map(String::as_str),
            Some("trust"),
            "the tests connect without a password: trust auth"
        ),
        Some(password) => assert_eq!(
            env.get("POSTGRES_PASSWORD").map(String::as_str),
            Some(password)
        ),
    }

    // What compose starts, as a URL: the tests' default, and what the docs export.
    let compose_url = format!("postgres://{user}@127.0.0.1:{port}/{database}");
    assert_eq!(compose_url, hexeract_tests::pg::DEFAULT_URL);
    for (path, text) in docs() {
        assert!(
            text.contains(&format!("DATABASE_URL={compose_url}")),
            "{path} does not export DATABASE_URL={compose_url}"
        );
    }
}

#[test]
fn rabbitmq_is_the_test_broker() {
    let url = Url::parse(hexeract_tests::amqp::DEFAULT_URL).expect("amqp::DEFAULT_URL is a URL");
    let rabbitmq = service("rabbitmq");
    let image = image(&rabbitmq);
    assert!(
        image.starts_with("rabbitmq:3.") && image.ends_with("-management"),
        "RabbitMQ 3.x with the management plugin: {image}"
    );
    assert!(has_healthcheck(&rabbitmq), "rabbitmq has no healthcheck");
    let port = url.port().expect("the URL names its port");
    assert_eq!(port, 5672);
    assert_eq!(published(&rabbitmq, port), Some(5672));
    assert_eq!(
        published(&rabbitmq, 15672),
        Some(15672),
        "the management UI"
    );

    let env = environment(&rabbitmq);
    let user = env
        .get("RABBITMQ_DEFAULT_USER")
        .map_or("guest", String::as_str);
    let password = env
        .get("RABBITMQ_DEFAULT_PASS")
        .map_or("guest", String::as_str);
    assert_eq!((user, password), ("guest", "guest"));
    assert_eq!(url.username(), user);
    assert_eq!(url.password(), Some(password));

    let compose_url = format!("amqp://{user}:{password}@127.0.0.1:{port}/%2f");
    assert_eq!(compose_url, hexeract_tests::amqp::DEFAULT_URL);
    for (path, text) in docs() {
        assert!(
            text.contains(&format!("AMQP_URL={compose_url}")),
            "{path} does not export AMQP_URL={compose_url}"
        );
    }
}

#[test]
fn kafka_is_the_test_broker() {
    let brokers = hexeract_tests::kafka::DEFAULT_BROKERS;
    let port: u16 = brokers
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .expect("kafka::DEFAULT_BROKERS is host:port");
    assert_eq!(port, 9092);
    let kafka = service("kafka");
    assert!(has_healthcheck(&kafka), "kafka has no healthcheck");
    let container_port = published(&kafka, port).expect("the brokers' port is published");

    let env = environment(&kafka);
    // One node in KRaft mode, broker and controller: no ZooKeeper service.
    let roles = env
        .get("KAFKA_PROCESS_ROLES")
        .or_else(|| env.get("KAFKA_CFG_PROCESS_ROLES"));
    let roles: Vec<&str> = roles
        .expect("KRaft: process roles set")
        .split(',')
        .collect();
    assert!(
        roles.contains(&"broker") && roles.contains(&"controller"),
        "{roles:?}"
    );
    assert!(service("zookeeper").is_null(), "KRaft needs no ZooKeeper");

    // The client listener: bound on the published container port, and advertised as the
    // address the tests reach it at.
    let listener = |variable: &str| -> (String, u16) {
        let value = env
            .get(variable)
            .or_else(|| env.get(&variable.replacen("KAFKA_", "KAFKA_CFG_", 1)))
            .unwrap_or_else(|| panic!("{variable} is set"));
        let plaintext = value
            .split(',')
            .find_map(|listener| listener.strip_prefix("PLAINTEXT://"))
            .unwrap_or_else(|| panic!("{variable} has a PLAINTEXT listener: {value}"));
        let (host, port) = plaintext.rsplit_once(':').expect("host:port");
        (host.to_owned(), port.parse().expect("a port"))
    };
    assert_eq!(listener("KAFKA_LISTENERS").1, container_port);
    let (advertised_host, advertised_port) = listener("KAFKA_ADVERTISED_LISTENERS");
    assert_eq!(
        advertised_port, port,
        "the advertised port is the one published"
    );
    assert!(
        ["localhost", "127.0.0.1"].contains(&advertised_host.as_str()),
        "advertised as {advertised_host}: the tests connect from the host"
    );
    for (path, text) in docs() {
        assert!(
            text.contains(&format!("KAFKA_BROKERS={brokers}")),
            "{path} does not export KAFKA_BROKERS={brokers}"
        );
    }
}

#[test]
fn every_service_has_a_healthcheck() {
    let compose: Value =
        serde_norway::from_str(&read("compose.yaml")).expect("compose.yaml is YAML");
    let services = compose["services"].as_mapping().expect("services");
    let names: Vec<&str> = services.keys().filter_map(Value::as_str).collect();
    assert_eq!(names, ["postgres", "rabbitmq", "kafka"]);
    for name in names {
        assert!(has_healthcheck(&service(name)), "{name} has no healthcheck");
    }
}
