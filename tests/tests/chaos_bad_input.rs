//! The bad-input matrix: a plain AMQP client (lapin's `basic_publish` on a channel of the test's
//! own, not Hexeract's publisher) feeds a running RabbitMQ worker every kind of delivery a
//! foreign producer can get wrong, each case several times with a good message before each bad
//! one. Every bad delivery must end in the handler queue's parking queue (and the
//! `dead_letters` table) with its own reason and a detail a person can act on; every good one
//! must be handled; the worker must still be consuming at the end, with its queue empty.
//!
//! Deliveries that look odd but are valid by the wire format (docs/wire-format.md: only
//! `message_id`, `type` and the body are needed) are "tolerated" cases: they must be handled
//! like good ones, not parked.
//!
//! A second test gives the worker a message whose headers fill the AMQP frame, so that the
//! parked copy (the same headers plus Hexeract's reason) does not fit in one.
//!
//! Needs RabbitMQ at `TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`). The test
//! declares its own exchange and queues (a prefix of its own) and deletes them at the end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hexeract::rabbitmq::{headers, RabbitMqWorker, RabbitMqWorkerBuilder, Topology};
use hexeract::store::DeadLetterStore;
use hexeract::store::DeliveryStore;
use hexeract::{CancellationToken, Context, Handler, HandlerOptions, Message, Reason, Registry};
use hexeract_tests::amqp::{amqp_url, TestBroker};
use hexeract_tests::ledger::{self, Call, DeadLettered};
use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, ConnectionProperties};
use uuid::Uuid;

const MESSAGE_TYPE: &str = "chaos.Order";
const HANDLER: &str = "matrix";
/// The worker's `max_payload_bytes`.
const MAX_PAYLOAD: usize = 64 * 1024;
const MAX_ATTEMPTS: u32 = 3;
/// How many times each case is published.
const ROUNDS: u32 = 3;
/// Header naming the message for the test: parked copies keep every header.
const TAG: &str = "chaos-tag";
/// The header of the huge-header cases.
const NOTE: &str = "chaos-note";
const HUGE_HEADER_BYTES: usize = 64 * 1024;
const DEPTH: usize = 10_000;

#[derive(Debug, serde::Serialize, serde::Deserialize, Message)]
#[message(type = "chaos.Order")]
struct Order {
    order_id: u32,
    #[serde(default)]
    note: String,
    /// Free-form JSON, as many message types carry: decoded recursively.
    #[serde(default)]
    meta: serde_json::Value,
}

/// What the handler saw: every call, and the length of the huge header when it had one.
#[derive(Clone, Default)]
struct Seen {
    calls: Arc<Mutex<Vec<Call>>>,
    notes: Arc<Mutex<HashMap<u32, usize>>>,
}

impl Seen {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

struct Record(Seen);

impl Handler<Order> for Record {
    type Error = String;
    async fn handle(&self, order: Order, ctx: &Context) -> Result<(), Self::Error> {
        if let Some(note) = ctx.envelope().header(NOTE) {
            self.0
                .notes
                .lock()
                .unwrap()
                .insert(order.order_id, note.len());
        }
        self.0.calls.lock().unwrap().push(Call {
            message_id: key_id(order.order_id),
            handler: HANDLER.to_owned(),
            attempt: i32::try_from(ctx.attempt()).unwrap_or(i32::MAX),
            ok: true,
            pid: i32::try_from(std::process::id()).unwrap_or(-1),
        });
        Ok(())
    }
}

/// The ledger's id for the message the test calls `key` (also its body's `order_id`).
fn key_id(key: u32) -> Uuid {
    Uuid::from_u128(u128::from(key))
}

/// How a case must end.
#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Handled,
    Parked(Reason),
}

/// One delivery as the plain client publishes it.
struct Outgoing {
    /// `None`: the test's message exchange; `Some("")`: straight into the handler queue.
    exchange: Option<&'static str>,
    routing_key: String,
    body: Vec<u8>,
    properties: BasicProperties,
}

impl Outgoing {
    /// What Hexeract itself would send: id, type, content type and a tag header.
    fn good(key: u32, body: Vec<u8>) -> Outgoing {
        Outgoing {
            exchange: None,
            routing_key: MESSAGE_TYPE.to_owned(),
            body,
            properties: BasicProperties::default()
                .with_message_id(Uuid::now_v7().to_string().as_str().into())
                .with_type(MESSAGE_TYPE.into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2)
                .with_headers(tagged(key, [])),
        }
    }

    fn order(key: u32) -> Outgoing {
        Outgoing::good(key, order_json(key))
    }

    fn properties(mut self, change: impl FnOnce(BasicProperties) -> BasicProperties) -> Outgoing {
        self.properties = change(self.properties);
        self
    }
}

fn order_json(key: u32) -> Vec<u8> {
    format!(r#"{{"order_id":{key}}}"#).into_bytes()
}

fn tagged(key: u32, more: impl IntoIterator<Item = (&'static str, AMQPValue)>) -> FieldTable {
    let mut table = FieldTable::default();
    table.insert(TAG.into(), long_string(key.to_string().as_bytes()));
    for (name, value) in more {
        table.insert(name.into(), value);
    }
    table
}

fn long_string(bytes: &[u8]) -> AMQPValue {
    AMQPValue::LongString(LongString::from(bytes.to_vec()))
}

fn huge_note() -> AMQPValue {
    long_string(&vec![b'n'; HUGE_HEADER_BYTES])
}

fn garbage() -> Vec<u8> {
    // A NUL first: never the start of a JSON value.
    let mut bytes = vec![0u8];
    bytes.extend((0..255).map(|_| fastrand::u8(..)));
    bytes
}

fn nested(depth: usize, inside: &str) -> String {
    format!("{}{inside}{}", "[".repeat(depth), "]".repeat(depth))
}

/// One row of the matrix.
struct Case {
    name: &'static str,
    expect: Expect,
    /// What the parked message's detail must say (unused for handled cases).
    detail: &'static str,
    make: fn(u32, &str) -> Outgoing,
}

fn parked(reason: Reason) -> Expect {
    Expect::Parked(reason)
}

/// Every case; `make` gets the message's key and the handler queue's name.
fn cases() -> Vec<Case> {
    vec![
        // Bad: the body.
        Case {
            name: "garbage_bytes",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "payload is not a valid chaos.Order",
            make: |key, _| Outgoing::good(key, garbage()),
        },
        Case {
            name: "empty_body",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "EOF while parsing",
            make: |key, _| Outgoing::good(key, Vec::new()),
        },
        Case {
            name: "invalid_utf8_body",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "payload is not a valid chaos.Order",
            make: |key, _| Outgoing::good(key, vec![0xff, 0xfe, 0xfd, 0x80]),
        },
        Case {
            name: "invalid_utf8_in_a_field",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "invalid unicode code point",
            make: |key, _| {
                let mut body = format!(r#"{{"order_id":{key},"note":""#).into_bytes();
                body.extend([0xff, 0xfe, b'"', b'}']);
                Outgoing::good(key, body)
            },
        },
        Case {
            name: "deeply_nested_json",
            expect: parked(Reason::PAYLOAD_INVALID),
            // A struct read from a sequence fails at its first field: no recursion at all.
            detail: "invalid type: sequence, expected u32",
            make: |key, _| Outgoing::good(key, "[".repeat(DEPTH).into_bytes()),
        },
        Case {
            name: "deeply_nested_in_a_json_value_field",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "recursion limit exceeded",
            make: |key, _| {
                let body = format!(r#"{{"order_id":{key},"meta":{}}}"#, nested(DEPTH, "1"));
                Outgoing::good(key, body.into_bytes())
            },
        },
        Case {
            name: "deeply_nested_unclosed_in_a_json_value_field",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "recursion limit exceeded",
            make: |key, _| {
                let body = format!(r#"{{"order_id":{key},"meta":{}"#, "[".repeat(DEPTH));
                Outgoing::good(key, body.into_bytes())
            },
        },
        Case {
            name: "wrong_field_type",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "invalid type: string \"seven\", expected u32",
            make: |key, _| Outgoing::good(key, br#"{"order_id":"seven"}"#.to_vec()),
        },
        Case {
            name: "field_out_of_range",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "invalid value: integer `-1`, expected u32",
            make: |key, _| Outgoing::good(key, br#"{"order_id":-1,"note":7}"#.to_vec()),
        },
        Case {
            name: "missing_field",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "missing field `order_id`",
            make: |key, _| Outgoing::good(key, br#"{"note":"no id"}"#.to_vec()),
        },
        Case {
            name: "json_null",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "invalid type: null",
            make: |key, _| Outgoing::good(key, b"null".to_vec()),
        },
        Case {
            name: "oversize_payload",
            expect: parked(Reason::PAYLOAD_TOO_LARGE),
            detail: "more than max_payload_bytes (65536)",
            make: |key, _| {
                // Valid JSON of the right type: only its size is wrong.
                let mut body = format!(r#"{{"order_id":{key},"note":""#).into_bytes();
                body.resize(MAX_PAYLOAD - 1, b'x');
                body.extend(br#""}"#);
                Outgoing::good(key, body)
            },
        },
        // Bad: the properties.
        Case {
            name: "xml_content_type",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "content type \"application/xml\" is not application/json",
            make: |key, _| {
                Outgoing::good(key, format!("<order><id>{key}</id></order>").into_bytes())
                    .properties(|p| p.with_content_type("application/xml".into()))
            },
        },
        Case {
            name: "text_content_type_on_valid_json",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "content type \"text/plain\" is not application/json",
            make: |key, _| {
                Outgoing::order(key).properties(|p| p.with_content_type("text/plain".into()))
            },
        },
        Case {
            name: "no_message_id",
            expect: parked(Reason::MESSAGE_ID_MISSING),
            detail: "no message_id property",
            make: |key, _| Outgoing {
                properties: BasicProperties::default()
                    .with_type(MESSAGE_TYPE.into())
                    .with_content_type("application/json".into())
                    .with_headers(tagged(key, [])),
                ..Outgoing::order(key)
            },
        },
        Case {
            name: "empty_message_id",
            expect: parked(Reason::MESSAGE_ID_MISSING),
            detail: "no message_id property",
            make: |key, _| Outgoing::order(key).properties(|p| p.with_message_id("".into())),
        },
        Case {
            name: "no_properties_at_all",
            expect: parked(Reason::MESSAGE_ID_MISSING),
            detail: "no message_id property",
            // No headers either: the parked copy is known by its body.
            make: |key, _| Outgoing {
                properties: BasicProperties::default(),
                ..Outgoing::order(key)
            },
        },
        Case {
            name: "oversize_without_message_id",
            expect: parked(Reason::PAYLOAD_TOO_LARGE),
            detail: "more than max_payload_bytes (65536)",
            make: |key, _| Outgoing {
                body: vec![b' '; MAX_PAYLOAD + 1],
                properties: BasicProperties::default().with_headers(tagged(key, [])),
                ..Outgoing::order(key)
            },
        },
        Case {
            name: "unknown_type_property",
            expect: parked(Reason::UNKNOWN_MESSAGE_TYPE),
            detail: "no handler is registered for message type \"chaos.Nobody\"",
            // Routed by the handler's type, but says it is another.
            make: |key, _| Outgoing::order(key).properties(|p| p.with_type("chaos.Nobody".into())),
        },
        Case {
            name: "untyped_straight_into_the_queue",
            expect: parked(Reason::UNKNOWN_MESSAGE_TYPE),
            detail: "no handler is registered for message type \"\"",
            make: |key, queue| {
                let mut out = Outgoing::order(key);
                out.exchange = Some("");
                out.routing_key = queue.to_owned();
                out.properties = BasicProperties::default()
                    .with_message_id(Uuid::now_v7().to_string().as_str().into())
                    .with_content_type("application/json".into())
                    .with_headers(tagged(key, []));
                out
            },
        },
        Case {
            name: "forged_attempt_count",
            expect: parked(Reason::MAX_DELIVERIES_EXCEEDED),
            detail: "never finished",
            make: |key, _| {
                Outgoing::order(key).properties(|p| {
                    p.with_headers(tagged(
                        key,
                        [(headers::ATTEMPTS, AMQPValue::LongLongInt(1000))],
                    ))
                })
            },
        },
        Case {
            name: "huge_header_and_garbage_body",
            expect: parked(Reason::PAYLOAD_INVALID),
            detail: "payload is not a valid chaos.Order",
            make: |key, _| {
                Outgoing::good(key, garbage())
                    .properties(|p| p.with_headers(tagged(key, [(NOTE, huge_note())])))
            },
        },
        // Tolerated: odd, but valid by the wire format.
        Case {
            name: "only_message_id_and_body",
            expect: Expect::Handled,
            detail: "",
            // No type (the routing key gives it), content type or headers: known by its body.
            make: |key, _| Outgoing {
                properties: BasicProperties::default()
                    .with_message_id(Uuid::now_v7().to_string().as_str().into()),
                ..Outgoing::order(key)
            },
        },
        Case {
            name: "message_id_not_a_uuid",
            expect: Expect::Handled,
            detail: "",
            make: |key, _| {
                Outgoing::order(key)
                    .properties(|p| p.with_message_id(format!("order-{key}-placed").into()))
            },
        },
        Case {
            name: "json_with_charset",
            expect: Expect::Handled,
            detail: "",
            make: |key, _| {
                Outgoing::order(key)
                    .properties(|p| p.with_content_type("application/json; charset=utf-8".into()))
            },
        },
        Case {
            name: "huge_header_value",
            expect: Expect::Handled,
            detail: "",
            make: |key, _| {
                Outgoing::order(key)
                    .properties(|p| p.with_headers(tagged(key, [(NOTE, huge_note())])))
            },
        },
        Case {
            name: "headers_that_are_not_strings",
            expect: Expect::Handled,
            detail: "",
            make: |key, _| {
                let mut inner = FieldTable::default();
                inner.insert("deep".into(), AMQPValue::Boolean(true));
                Outgoing::order(key).properties(|p| {
                    p.with_headers(tagged(
                        key,
                        [
                            ("a-table", AMQPValue::FieldTable(inner)),
                            ("a-bool", AMQPValue::Boolean(false)),
                            ("a-number", AMQPValue::LongLongInt(-5)),
                            (
                                "an-array",
                                AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::Void])),
                            ),
                            ("not-utf8", long_string(&[0xff, 0xfe])),
                            (headers::ATTEMPTS, long_string(b"not a number")),
                        ],
                    ))
                })
            },
        },
        Case {
            name: "deep_nesting_in_an_ignored_field",
            expect: Expect::Handled,
            detail: "",
            // Valid JSON: serde skips unknown fields without recursing, so no limit applies.
            make: |key, _| {
                let body = format!(r#"{{"order_id":{key},"extra":{}}}"#, nested(DEPTH, ""));
                Outgoing::good(key, body.into_bytes())
            },
        },
    ]
}

/// A plain AMQP producer: a lapin connection and a confirming channel of the test's own.
struct Producer {
    connection: lapin::Connection,
    channel: lapin::Channel,
}

impl Producer {
    async fn open(name: &str) -> Producer {
        let connection = lapin::Connection::connect(
            &amqp_url(),
            ConnectionProperties::default().with_connection_name(name.into()),
        )
        .await
        .unwrap_or_else(|error| {
            panic!(
                "cannot reach RabbitMQ ({error}); start it (rabbitmq-server -detached), or set \
                 TEST_AMQP_URL to a broker these tests may declare queues on"
            )
        });
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Producer {
            connection,
            channel,
        }
    }

    /// Publishes with `mandatory` and waits for the confirm; the message back if the broker
    /// returned it (no queue bound for it).
    async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Option<BasicReturnMessage> {
        let confirm = self
            .channel
            .basic_publish(
                ShortString::from(exchange),
                ShortString::from(routing_key),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                properties,
            )
            .await
            .unwrap_or_else(|error| panic!("publish to {exchange:?}/{routing_key}: {error}"))
            .await
            .unwrap_or_else(|error| panic!("confirm of {exchange:?}/{routing_key}: {error}"));
        assert!(confirm.is_ack(), "the broker confirmed the publish");
        confirm.take_message()
    }

    async fn close(self) {
        let _ = self.channel.close(200, "done".into()).await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// One message the test published, and how it must end.
struct Sent {
    key: u32,
    case: &'static str,
    expect: Expect,
    detail: &'static str,
    body: Vec<u8>,
}

/// A parked copy, as read from the parking queue.
#[derive(Debug)]
struct ParkedCopy {
    key: Option<u32>,
    reason: String,
    detail: String,
    handler: String,
    queue: String,
    body: Vec<u8>,
}

fn header_text(properties: &BasicProperties, name: &str) -> Option<String> {
    match properties.headers().as_ref()?.inner().get(name)? {
        AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into_owned()),
        AMQPValue::ShortString(text) => Some(text.to_string()),
        _ => None,
    }
}

fn worker(
    broker: &TestBroker,
    connection: hexeract::rabbitmq::RabbitMqConnection,
) -> RabbitMqWorkerBuilder {
    RabbitMqWorkerBuilder::new(connection)
        .registry(Registry::new())
        .exchange(broker.exchange.clone())
        .prefix(broker.prefix.clone())
        .wait_tiers([
            Duration::from_millis(50),
            Duration::from_millis(100),
            Duration::from_millis(200),
        ])
        .retry_delays(Duration::from_millis(50), Duration::from_millis(200))
        .max_attempts(MAX_ATTEMPTS)
        .max_payload_bytes(MAX_PAYLOAD)
        // The scenarios that count rows give a store; the others read the parking queues.
        .park_without_rows()
}

/// Waits until the worker consumes `queue` (it declares its topology first).
async fn consuming(broker: &TestBroker, queue: &str) {
    for _ in 0..800 {
        if broker.consumers(queue).await.unwrap_or(0) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the worker did not start consuming {queue}");
}

fn start(
    worker: RabbitMqWorker,
) -> (
    CancellationToken,
    Topology,
    tokio::task::JoinHandle<Result<(), hexeract::rabbitmq::BusError>>,
) {
    let topology = worker.topology().clone();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(worker.run(cancel.clone()));
    (cancel, topology, task)
}

/// Publishes every case `ROUNDS` times, a good message before each bad one and one at the end:
/// good, bad, good, bad … good.
async fn publish_matrix(producer: &Producer, exchange: &str, queue: &str) -> Vec<Sent> {
    let cases = cases();
    let mut sent = Vec::new();
    let mut next_good = 1;
    let mut next_odd = 1_000_000;
    let good = |key| (key, "good", Expect::Handled, "", Outgoing::order(key));
    for _round in 0..ROUNDS {
        for case in &cases {
            let odd = (
                next_odd,
                case.name,
                case.expect.clone(),
                case.detail,
                (case.make)(next_odd, queue),
            );
            for (key, case, expect, detail, outgoing) in [good(next_good), odd] {
                let returned = producer
                    .publish(
                        outgoing.exchange.unwrap_or(exchange),
                        &outgoing.routing_key,
                        &outgoing.body,
                        outgoing.properties,
                    )
                    .await;
                assert!(returned.is_none(), "{case} was routed to the handler queue");
                sent.push(Sent {
                    key,
                    case,
                    expect,
                    detail,
                    body: outgoing.body,
                });
            }
            next_good += 1;
            next_odd += 1;
        }
    }
    let (key, case, expect, detail, last) = good(next_good);
    producer
        .publish(exchange, &last.routing_key, &last.body, last.properties)
        .await;
    sent.push(Sent {
        key,
        case,
        expect,
        detail,
        body: last.body,
    });
    sent
}

/// A type no handler is bound for never reaches the worker: the broker returns it to a
/// `mandatory` publisher (and drops it for one that is not). Returns how many came back.
async fn publish_unroutable(producer: &Producer, exchange: &str) -> usize {
    let mut returned = 0;
    for key in 2_000_000..2_000_000 + ROUNDS {
        let properties = Outgoing::order(key)
            .properties(|p| p.with_type("chaos.Nobody".into()))
            .properties;
        let back = producer
            .publish(exchange, "chaos.Nobody", &order_json(key), properties)
            .await;
        returned += usize::from(back.is_some());
    }
    returned
}

/// The parked copies, each with the key of the message it is a copy of: from its tag header,
/// or, for the cases sent without headers, from its body.
fn read_copies(copies: &[lapin::message::BasicGetMessage], sent: &[Sent]) -> Vec<ParkedCopy> {
    let by_body: HashMap<&[u8], u32> = sent
        .iter()
        .filter(|sent| {
            sent.case == "no_properties_at_all" || sent.case == "only_message_id_and_body"
        })
        .map(|sent| (sent.body.as_slice(), sent.key))
        .collect();
    copies
        .iter()
        .map(|copy| {
            let properties = &copy.delivery.properties;
            let body = copy.delivery.data.clone();
            ParkedCopy {
                key: header_text(properties, TAG)
                    .and_then(|tag| tag.parse().ok())
                    .or_else(|| by_body.get(body.as_slice()).copied()),
                reason: header_text(properties, headers::REASON).unwrap_or_default(),
                detail: header_text(properties, headers::DETAIL).unwrap_or_default(),
                handler: header_text(properties, headers::HANDLER).unwrap_or_default(),
                queue: header_text(properties, headers::QUEUE).unwrap_or_default(),
                body,
            }
        })
        .collect()
}

/// Checks each message sent against how it must end; returns, per case, (sent, as expected).
fn check_each_message<'a>(
    sent: &'a [Sent],
    copies: &[ParkedCopy],
    calls: &[Call],
    queue: &str,
    problems: &mut Vec<String>,
) -> BTreeMap<&'a str, (usize, usize)> {
    let mut parked_by_key: HashMap<u32, Vec<&ParkedCopy>> = HashMap::new();
    for copy in copies {
        match copy.key {
            Some(key) => parked_by_key.entry(key).or_default().push(copy),
            None => problems.push(format!("a parked copy of no message sent: {copy:?}")),
        }
    }
    let mut calls_by_key: HashMap<Uuid, usize> = HashMap::new();
    for call in calls {
        *calls_by_key.entry(call.message_id).or_default() += 1;
    }
    let mut per_case: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for message in sent {
        let called = calls_by_key.get(&key_id(message.key)).copied().unwrap_or(0);
        let parked = parked_by_key
            .get(&message.key)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let what = format!("{} (key {})", message.case, message.key);
        let before = problems.len();
        match &message.expect {
            Expect::Handled => {
                if called == 0 {
                    problems.push(format!("{what}: never handled"));
                }
                if !parked.is_empty() {
                    problems.push(format!("{what}: parked, not handled: {parked:?}"));
                }
            }
            Expect::Parked(reason) => {
                if called > 0 {
                    problems.push(format!("{what}: reached the handler {called} time(s)"));
                }
                match parked {
                    [] => problems.push(format!("{what}: not parked (lost, or still queued)")),
                    [copy] => {
                        if copy.reason != reason.as_str() {
                            problems.push(format!(
                                "{what}: parked as {:?}, expected {reason} (detail {:?})",
                                copy.reason, copy.detail
                            ));
                        }
                        if copy.detail.trim().is_empty() || !copy.detail.contains(message.detail) {
                            problems.push(format!(
                                "{what}: detail {:?} does not say {:?}",
                                copy.detail, message.detail
                            ));
                        }
                        if copy.handler != HANDLER || copy.queue != queue {
                            problems.push(format!(
                                "{what}: parked with handler {:?} and queue {:?}",
                                copy.handler, copy.queue
                            ));
                        }
                        if copy.body != message.body {
                            problems.push(format!("{what}: the parked body is not the one sent"));
                        }
                    }
                    more => problems.push(format!("{what}: parked {} times", more.len())),
                }
            }
        }
        let entry = per_case.entry(message.case).or_default();
        entry.0 += 1;
        entry.1 += usize::from(problems.len() == before);
    }
    per_case
}

/// Checks that the `dead_letters` table got what the parking queue got; returns the parking
/// queue's count per reason.
fn check_store(
    copies: &[ParkedCopy],
    letters: &[hexeract::DeadLetter],
    problems: &mut Vec<String>,
) -> BTreeMap<String, usize> {
    let mut parked: BTreeMap<String, usize> = BTreeMap::new();
    for copy in copies {
        *parked.entry(copy.reason.clone()).or_default() += 1;
    }
    let mut stored: BTreeMap<String, usize> = BTreeMap::new();
    for letter in letters {
        *stored.entry(letter.reason.to_string()).or_default() += 1;
        if letter.detail.trim().is_empty() || letter.handler.as_deref() != Some(HANDLER) {
            problems.push(format!(
                "dead letter {} ({}) has detail {:?} and handler {:?}",
                letter.id, letter.reason, letter.detail, letter.handler
            ));
        }
    }
    if stored != parked {
        problems.push(format!(
            "dead_letters holds {stored:?}, the parking queue {parked:?}"
        ));
    }
    parked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_matrix() {
    let broker = TestBroker::new().await;
    let dir = std::env::temp_dir().join(format!("hexeract-chaos-bad-input-{}", broker.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let store = hexeract::store::sqlite::SqliteStore::open(dir.join("dead.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);
    let seen = Seen::default();
    let worker = worker(
        &broker,
        broker
            .connect(&format!("hexeract-tests-{}-worker", broker.prefix))
            .await,
    )
    .register_handler_with::<Order, _>(Record(seen.clone()), HandlerOptions::new().name(HANDLER))
    .dead_letters(store.clone())
    .build()
    .unwrap();
    let (cancel, topology, task) = start(worker);
    let queue = topology.queue_for(HANDLER);
    let parking = topology.parking_queue_for(HANDLER);
    consuming(&broker, &queue).await;

    let producer = Producer::open(&format!("hexeract-tests-{}-producer", broker.prefix)).await;
    let sent = publish_matrix(&producer, &broker.exchange, &queue).await;
    let unroutable_returned = publish_unroutable(&producer, &broker.exchange).await;
    producer.close().await;
    let bad = sent
        .iter()
        .filter(|sent| matches!(sent.expect, Expect::Parked(_)))
        .count();
    let to_handle: Vec<Uuid> = sent
        .iter()
        .filter(|sent| sent.expect == Expect::Handled)
        .map(|sent| key_id(sent.key))
        .collect();

    // Until every bad one is parked and every good one handled, then a little longer to catch
    // a second copy of anything.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut copies = Vec::new();
    loop {
        copies.extend(broker.drain(&parking).await);
        let handled: HashSet<Uuid> = seen.calls().iter().map(|call| call.message_id).collect();
        let all_handled = to_handle.iter().all(|id| handled.contains(id));
        if (copies.len() >= bad && all_handled) || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    copies.extend(broker.drain(&parking).await);

    let still_running = !task.is_finished();
    let consumers_at_end = broker.consumers(&queue).await;
    let ready_before_stop = broker.ready(&queue).await;
    cancel.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), task).await;
    let ready_after_stop = broker.ready(&queue).await;
    let mut waiting = 0;
    for tier in topology.tiers() {
        waiting += broker.ready(&topology.wait_queue(*tier)).await;
    }
    let letters = store.dead_letters(10_000).await.unwrap();
    broker.delete(&topology).await;
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);

    let copies = read_copies(&copies, &sent);
    let calls = seen.calls();
    let mut problems = Vec::new();
    let per_case = check_each_message(&sent, &copies, &calls, &queue, &mut problems);
    let parked_reasons = check_store(&copies, &letters, &mut problems);
    let notes = seen.notes.lock().unwrap().clone();
    if notes.len() != ROUNDS as usize || notes.values().any(|len| *len != HUGE_HEADER_BYTES) {
        problems.push(format!(
            "the handler saw huge headers of these lengths: {notes:?}, {ROUNDS} of \
             {HUGE_HEADER_BYTES} bytes were sent"
        ));
    }
    if !still_running || consumers_at_end != Some(1) {
        problems.push(format!(
            "the worker is not consuming at the end: running {still_running}, \
             {consumers_at_end:?} consumers on {queue}"
        ));
    }
    if !matches!(stopped, Ok(Ok(Ok(())))) {
        problems.push(format!(
            "the worker did not stop cleanly on cancel: {stopped:?}"
        ));
    }
    if ready_before_stop != 0 || ready_after_stop != 0 || waiting != 0 {
        problems.push(format!(
            "messages left: {ready_before_stop} ready in {queue} before the stop, \
             {ready_after_stop} after, {waiting} in wait queues"
        ));
    }
    if unroutable_returned != ROUNDS as usize {
        problems.push(format!(
            "the broker returned {unroutable_returned} of {ROUNDS} unroutable messages"
        ));
    }

    // The ledger's classification: each message in exactly one terminal state.
    let ids: Vec<Uuid> = sent.iter().map(|sent| key_id(sent.key)).collect();
    let dead: Vec<DeadLettered> = copies
        .iter()
        .filter_map(|copy| {
            Some(DeadLettered {
                message_id: key_id(copy.key?),
                handler: HANDLER.to_owned(),
                reason: copy.reason.clone(),
            })
        })
        .collect();
    let verdict = ledger::classify(&ids, &[HANDLER], &calls, &dead);
    if !verdict.passed() {
        problems.push(format!(
            "ledger: lost {:?}, unexpected {:?}, both {:?}, dead-lettered twice {:?}",
            verdict.lost, verdict.unexpected, verdict.both, verdict.dead_lettered_twice
        ));
    }

    let tolerated = sent
        .iter()
        .filter(|sent| sent.case != "good" && sent.expect == Expect::Handled)
        .count();
    let mut line = format!(
        "scenario=bad_input_matrix published={} bad={bad} parked={} handled={} lost={} \
         tolerated={tolerated} duplicates={} unexpected={} unroutable_returned={unroutable_returned}",
        sent.len(),
        copies.len(),
        verdict.handled,
        verdict.lost.len(),
        verdict.duplicates,
        verdict.unexpected.len(),
    );
    for (reason, count) in &parked_reasons {
        line.push_str(&format!(" parked[{reason}]={count}"));
    }
    println!("{line}");
    for (case, (total, as_expected)) in &per_case {
        println!("  case={case} sent={total} as_expected={as_expected}");
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert_eq!(copies.len(), bad, "every bad message parked, once");
}

/// A header the broker accepts from a producer can leave no room for what Hexeract adds when it
/// parks the message (`x-hexeract-reason`, `-detail`, `-handler`, `-queue`, `-attempts`: about
/// 250 bytes). Parking must still work, and must not cost the worker its connection: a
/// content-header frame over the connection's `frame_max` is a connection error on the broker
/// (`frame_too_large`), which would take every queue of the worker down with it, and bring the
/// message back to do it again after each restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_headers_fill_the_frame_is_parked_and_the_worker_keeps_going() {
    let broker = TestBroker::new().await;
    let seen = Seen::default();
    let worker = worker(
        &broker,
        broker
            .connect(&format!("hexeract-tests-{}-worker", broker.prefix))
            .await,
    )
    .register_handler_with::<Order, _>(Record(seen.clone()), HandlerOptions::new().name(HANDLER))
    .build()
    .unwrap();
    let (cancel, topology, mut task) = start(worker);
    let queue = topology.queue_for(HANDLER);
    let parking = topology.parking_queue_for(HANDLER);
    consuming(&broker, &queue).await;

    let producer = Producer::open(&format!("hexeract-tests-{}-producer", broker.prefix)).await;
    let frame_max = producer.connection.configuration().frame_max() as usize;
    // The properties of `Outgoing::good` with a 1-digit tag take 116 bytes of the header frame
    // besides the note; the frame's payload may be `frame_max - 8`. 100 bytes to spare for the
    // producer, none for the parked copy.
    let note = frame_max - 8 - 116 - 100;
    let poison_key = 7;
    let poison = Outgoing::good(poison_key, b"\0not json".to_vec()).properties(|p| {
        p.with_headers(tagged(poison_key, [(NOTE, long_string(&vec![b'n'; note]))]))
    });
    let goods: Vec<u32> = (100..110).collect();
    let first = Outgoing::order(99);
    producer
        .publish(
            &broker.exchange,
            MESSAGE_TYPE,
            &first.body,
            first.properties,
        )
        .await;
    producer
        .publish(
            &broker.exchange,
            MESSAGE_TYPE,
            &poison.body,
            poison.properties,
        )
        .await;
    for key in &goods {
        let good = Outgoing::order(*key);
        producer
            .publish(&broker.exchange, MESSAGE_TYPE, &good.body, good.properties)
            .await;
    }
    producer.close().await;

    let mut copies = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let expected_handled = goods.len() + 1;
    loop {
        // A copy over frame_max would make the test's own client fail on it: never wait long.
        if let Ok(more) = tokio::time::timeout(Duration::from_secs(5), broker.drain(&parking)).await
        {
            copies.extend(more);
        }
        let handled = seen.calls().len();
        if (copies.len() == 1 && handled >= expected_handled)
            || task.is_finished()
            || tokio::time::Instant::now() > deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let still_running = !task.is_finished();
    cancel.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(30), &mut task).await;
    let ready = broker.ready(&queue).await;
    broker.delete(&topology).await;

    let mut handled: Vec<u32> = seen
        .calls()
        .iter()
        .map(|call| u32::try_from(call.message_id.as_u128()).unwrap())
        .collect();
    handled.sort_unstable();
    handled.dedup();
    let reasons: Vec<(Option<String>, Option<String>, String)> = copies
        .iter()
        .map(|copy| {
            let properties = &copy.delivery.properties;
            (
                header_text(properties, TAG),
                header_text(properties, headers::REASON),
                header_text(properties, headers::DETAIL).unwrap_or_default(),
            )
        })
        .collect();
    println!(
        "scenario=bad_input_frame_max frame_max={frame_max} note_bytes={note} parked={} \
         handled={} ready_at_end={ready} worker_running={still_running} stopped={stopped:?}",
        copies.len(),
        handled.len(),
    );
    assert!(
        still_running && matches!(stopped, Ok(Ok(Ok(())))),
        "the worker stopped on a message with a {note}-byte header (frame_max {frame_max}): \
         {stopped:?}; the parked copy does not fit in a frame (the broker logs \
         frame_too_large on the worker's connection), parked so far {reasons:?}"
    );
    // The reason a parked copy over the limit would get is the body's (garbage), or the size's
    // if the worker checks headers before the body as it checks the payload.
    assert!(
        matches!(
            reasons.as_slice(),
            [(Some(tag), Some(reason), detail)]
                if *tag == poison_key.to_string()
                    && (*reason == Reason::PAYLOAD_INVALID.as_str()
                        || *reason == Reason::PAYLOAD_TOO_LARGE.as_str())
                    && !detail.trim().is_empty()
        ),
        "the message with a header filling the frame is parked once with its reason: {reasons:?}"
    );
    let dropped: Vec<Option<String>> = copies
        .iter()
        .map(|copy| header_text(&copy.delivery.properties, headers::DROPPED_HEADERS))
        .collect();
    assert_eq!(
        dropped,
        [Some(NOTE.to_owned())],
        "the parked copy says which header it left out to fit in a frame"
    );
    let mut owed = goods.clone();
    owed.insert(0, 99);
    assert_eq!(handled, owed, "every good message handled");
    assert_eq!(ready, 0, "the handler queue is empty at the end");
}
