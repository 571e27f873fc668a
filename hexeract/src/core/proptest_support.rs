//! Strategies the wire formats' property tests share.

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use uuid::Uuid;

use crate::envelope::Envelope;

pub(crate) fn uuid() -> impl Strategy<Value = Uuid> {
    any::<u128>().prop_map(Uuid::from_u128)
}

prop_compose! {
    /// Any envelope whose extra header names match `names` (a regex: the names a format
    /// carries as they are), created between 1970 and 2100 at a whole millisecond.
    pub(crate) fn envelope(names: &'static str)(
        message_type in "[A-Za-z][A-Za-z0-9._-]{0,60}",
        payload in vec(any::<u8>(), 0..2048),
        id in uuid(),
        correlation in proptest::option::of(uuid()),
        causation in proptest::option::of(uuid()),
        headers in btree_map(names, "\\PC{0,80}", 0..6),
        millis in 0i64..4_102_444_800_000,
    ) -> Envelope {
        let mut envelope = Envelope::from_raw(message_type, payload);
        envelope.id = id;
        envelope.correlation_id = correlation;
        envelope.causation_id = causation;
        envelope.headers = headers;
        envelope.created_at =
            chrono::DateTime::<chrono::Utc>::from_timestamp_millis(millis).expect("in range");
        envelope
    }
}
