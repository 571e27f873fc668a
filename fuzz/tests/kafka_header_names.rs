//! A Kafka record whose header *name* is not UTF-8. rdkafka 0.38 panics reading such a name
//! (`CStr::to_str().unwrap()` in its header reader); any producer writing raw bytes can send
//! one, and rdkafka's safe API cannot build one, so neither the fuzz target nor the product's
//! own tests (which forbid `unsafe`) can: this test adds the header through librdkafka's C API.
//! Run with `cargo test --manifest-path fuzz/Cargo.toml --features kafka`.
#![cfg(feature = "kafka")]

use hexeract::Reason;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

fn record_with_a_header_name_that_is_not_utf8() -> OwnedMessage {
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "ce_id",
            value: Some("0190b3a2-7c1e-7d2a-9f00-000000000001"),
        })
        .insert(Header {
            key: "ce_type",
            value: Some("OrderPlaced"),
        });
    let name = [0xff_u8, 0xfe];
    let value = b"v";
    // `BorrowedHeaders` is a view of librdkafka's headers list: its address is the list's.
    let list = std::ptr::from_ref(headers.as_borrowed())
        .cast::<rdkafka::bindings::rd_kafka_headers_t>()
        .cast_mut();
    // SAFETY: `list` is the live headers list owned by `headers`; librdkafka copies the name
    // and the value, whose pointers and lengths are those of the two arrays above.
    let error = unsafe {
        rdkafka::bindings::rd_kafka_header_add(
            list,
            name.as_ptr().cast(),
            isize::try_from(name.len()).unwrap(),
            value.as_ptr().cast(),
            isize::try_from(value.len()).unwrap(),
        )
    };
    assert_eq!(
        error,
        rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
    );
    OwnedMessage::new(
        Some(br#"{"order_id":7}"#.to_vec()),
        Some(b"order-7".to_vec()),
        "shop.order".to_owned(),
        Timestamp::CreateTime(1_700_000_000_000),
        2,
        41,
        Some(headers),
    )
}

#[test]
fn a_header_name_that_is_not_utf8_is_a_dead_letter_reason_not_a_panic() {
    let record = record_with_a_header_name_that_is_not_utf8();
    let (reason, detail) =
        hexeract::fuzzing::read_record(&record, "order", 1024).expect_err("refused");
    assert_eq!(reason, Reason::PAYLOAD_INVALID);
    assert!(detail.contains("not valid UTF-8"), "{detail}");
    // What the dead letter keeps: the payload, under an id stable across reads.
    let salvaged = hexeract::fuzzing::salvage_record(&record, "order");
    assert_eq!(&salvaged.payload[..], br#"{"order_id":7}"#);
    assert_eq!(
        salvaged.id,
        hexeract::fuzzing::salvage_record(&record, "order").id
    );
}
