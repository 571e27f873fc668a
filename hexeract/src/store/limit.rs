//! The largest payload written into the outbox (or kept as a delayed message): what the workers
//! take, so that a message nobody would decode is refused when it is written, while its writer
//! can still hear of it, and a take of a full batch stays bounded (no row over the limit, no
//! batch over `batch_size` times it).

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::envelope::Envelope;
use crate::store::StoreError;

/// The limit unless `MAX_PAYLOAD_BYTES` says otherwise: the workers' default,
/// [`Policy::library`](crate::Policy::library)'s `max_payload_bytes`.
const DEFAULT: usize = 1024 * 1024;

/// The largest `MAX_PAYLOAD_BYTES` the configuration accepts.
const MOST: usize = 1 << 30;

/// This process's limit; 0 until first read.
static LIMIT: AtomicUsize = AtomicUsize::new(0);

/// The largest payload this process writes into the outbox: `MAX_PAYLOAD_BYTES` (the variable
/// the workers read; its default, 1 MiB, when it is unset or invalid, which the workers report),
/// or more where a worker of this process was built to take larger ones.
pub(crate) fn payload_limit() -> usize {
    match LIMIT.load(Ordering::Relaxed) {
        0 => {
            let configured = std::env::var("MAX_PAYLOAD_BYTES")
                .ok()
                .and_then(|value| value.trim().parse::<usize>().ok())
                .filter(|max| (1..=MOST).contains(max))
                .unwrap_or(DEFAULT);
            // A worker built meanwhile may have raised it: keep the larger.
            LIMIT
                .fetch_max(configured, Ordering::Relaxed)
                .max(configured)
        }
        limit => limit,
    }
}

/// A worker of this process takes payloads of up to `max` bytes: this process may write them.
/// A `max` over the largest `MAX_PAYLOAD_BYTES` accepts (the scheduler's "no cap" on its own
/// small payloads) is no limit on what others write, and changes nothing.
pub(crate) fn accept_payloads_up_to(max: usize) {
    let current = payload_limit();
    if max > current && max <= MOST {
        LIMIT.fetch_max(max, Ordering::Relaxed);
    }
}

/// `Ok` when every payload of `envelopes` is within [`payload_limit`]; otherwise the first that
/// is not, as [`StoreError::PayloadTooLarge`], before anything is written.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
pub(crate) fn check(envelopes: &[Envelope]) -> Result<(), StoreError> {
    let max = payload_limit();
    match envelopes
        .iter()
        .find(|envelope| envelope.payload.len() > max)
    {
        None => Ok(()),
        Some(envelope) => Err(StoreError::PayloadTooLarge {
            id: envelope.id,
            message_type: envelope.message_type.clone(),
            bytes: envelope.payload.len(),
            max,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(bytes: usize) -> Envelope {
        Envelope::from_raw("test.Big".to_owned(), bytes::Bytes::from(vec![b'x'; bytes]))
    }

    #[test]
    fn a_payload_over_the_limit_is_refused_with_what_it_is() {
        let max = payload_limit();
        assert!(check(&[envelope(max)]).is_ok());
        let refused = check(&[envelope(1), envelope(max + 1)]).unwrap_err();
        match &refused {
            StoreError::PayloadTooLarge {
                message_type,
                bytes,
                max: said,
                ..
            } => {
                assert_eq!(message_type, "test.Big");
                assert_eq!(*bytes, max + 1);
                assert_eq!(*said, max);
            }
            other => panic!("{other:?}"),
        }
        let text = refused.to_string();
        assert!(text.contains("MAX_PAYLOAD_BYTES"), "{text}");
        assert!(text.contains("nothing was written"), "{text}");
    }

    #[test]
    fn a_worker_that_takes_more_raises_the_limit_never_lowers_it() {
        let before = payload_limit();
        accept_payloads_up_to(10);
        assert_eq!(payload_limit(), before);
        accept_payloads_up_to(before * 4);
        assert_eq!(payload_limit(), before * 4);
        assert!(check(&[envelope(before * 2)]).is_ok());
        // The scheduler's engine takes any size of its own payloads: no limit for others.
        accept_payloads_up_to(usize::MAX);
        assert_eq!(payload_limit(), before * 4);
    }
}
