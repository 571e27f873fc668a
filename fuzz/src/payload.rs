//! `decode_payload`: a payload decoded into a message type with [`Envelope::decode`], as a
//! handler's adapter does before calling it.
//!
//! Layout of the input: one byte, then the payload. The byte's low two bits choose the message
//! type ([`Order`]: structs, enums, options, maps; [`Tree`]: recursion; [`Anything`]: any JSON),
//! and bit 7 puts another message type in the envelope.

use std::collections::BTreeMap;
use std::fmt::Debug;

use hexeract::{DecodeError, Envelope, Message};
use serde::{Deserialize, Serialize};

/// A message type like the ones handlers take.
#[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
#[message(type = "fuzz.Order")]
pub struct Order {
    pub id: u64,
    pub customer: String,
    pub note: Option<String>,
    pub lines: Vec<Line>,
    pub status: Status,
    pub tags: BTreeMap<String, i64>,
    #[serde(default)]
    pub gift: bool,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub sku: String,
    pub quantity: u32,
    pub unit_cents: i64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Status {
    Placed,
    Shipped { tracking: String },
    Cancelled { reason: Option<String> },
}

/// A recursive message type: nesting is bounded by serde_json's recursion limit (128), not by
/// the stack.
#[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
#[message(type = "fuzz.Tree")]
pub struct Tree {
    pub root: Node,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub enum Node {
    Leaf(u32),
    Branch(Vec<Node>),
}

/// Any JSON at all. Not compared after a round trip: serde_json reads floats back to within
/// one unit in the last place, not always exactly.
#[derive(Debug, PartialEq, Serialize, Deserialize, Message)]
#[message(type = "fuzz.Anything")]
#[serde(transparent)]
pub struct Anything(pub serde_json::Value);

const OTHER_TYPE: &str = "fuzz.Other";

#[derive(Clone, Debug, PartialEq)]
pub struct PayloadInput {
    pub selector: u8,
    pub payload: Vec<u8>,
}

crate::arbitrary_from_bytes!(PayloadInput);

impl PayloadInput {
    pub fn from_bytes(data: &[u8]) -> PayloadInput {
        let (selector, payload) = data.split_first().map_or((0, &[][..]), |(s, p)| (*s, p));
        PayloadInput {
            selector,
            payload: payload.to_vec(),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![self.selector];
        bytes.extend_from_slice(&self.payload);
        bytes
    }
}

/// Decodes the input's payload and panics if an invariant does not hold: an envelope of
/// another type is `WrongType`, before any parsing; otherwise the payload is the message or
/// `InvalidPayload` naming the type, never a panic or a stack overflow; a decoded message
/// encodes again and (floats aside) decodes back equal.
pub fn check(input: &PayloadInput) {
    match input.selector & 0x03 {
        1 => check_as::<Tree>(input, true),
        2 => check_as::<Anything>(input, false),
        _ => check_as::<Order>(input, true),
    }
}

fn check_as<M: Message + Debug + PartialEq>(input: &PayloadInput, compare: bool) {
    let other_type = input.selector & 0x80 != 0;
    let message_type = if other_type {
        OTHER_TYPE
    } else {
        M::MESSAGE_TYPE
    };
    let envelope = Envelope::from_raw(message_type, input.payload.clone());
    match envelope.decode::<M>() {
        Err(DecodeError::WrongType { expected, found }) => {
            assert!(
                other_type,
                "{found} refused as another type than {expected}"
            );
            assert_eq!(expected, M::MESSAGE_TYPE);
            assert_eq!(found, OTHER_TYPE);
        }
        Err(DecodeError::InvalidPayload {
            message_type,
            source,
        }) => {
            assert!(
                !other_type,
                "a {OTHER_TYPE} envelope parsed as {message_type}"
            );
            assert_eq!(message_type, M::MESSAGE_TYPE);
            assert!(!source.to_string().is_empty());
        }
        Err(other) => panic!("an error of no known kind: {other}"),
        Ok(message) => {
            assert!(
                !other_type,
                "a {OTHER_TYPE} envelope decoded as {}",
                M::MESSAGE_TYPE
            );
            let again = Envelope::new(&message).expect("a decoded message encodes again");
            let back = again.decode::<M>().expect("and decodes again");
            if compare {
                assert_eq!(back, message, "the same message after a round trip");
            }
        }
    }
}

/// The corpus seeds of `decode_payload` (`fuzz/corpus/decode_payload/`), by file name.
pub fn seeds() -> Vec<(&'static str, PayloadInput)> {
    let seed = |selector, payload: &str| PayloadInput {
        selector,
        payload: payload.as_bytes().to_vec(),
    };
    vec![
        (
            "order",
            seed(
                0,
                r#"{"id":7,"customer":"ada","note":null,"lines":[{"sku":"a-1","quantity":2,"unit_cents":999}],"status":{"state":"shipped","tracking":"Z1\u00e9"},"tags":{"vip":1},"gift":true}"#,
            ),
        ),
        (
            "tree",
            seed(
                1,
                r#"{"root":{"Branch":[{"Leaf":1},{"Branch":[{"Leaf":2}]}]}}"#,
            ),
        ),
        (
            "anything",
            seed(
                2,
                r#"[1,-2.5e-3,"\ud83d\ude00",{"a":[true,null]},18446744073709551616]"#,
            ),
        ),
        ("other_type", seed(0x80, r#"{"id":7}"#)),
    ]
}
