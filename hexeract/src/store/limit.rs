//! The largest payload written into the outbox (or kept as a delayed message): what the workers
//! take, so that a message nobody would decode is refused when it is written, while its writer
//! can still hear of it, and a take of a full batch stays bounded (no row over the limit, no
//! batch over `batch_size` times it).

use crate::envelope::Envelope;
use crate::policy::payload_limit;
use crate::store::StoreError;

/// `Ok` when every payload of `envelopes` is within the process's limit ([`payload_limit`]); otherwise the first that
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
    use crate::policy::accept_payloads_up_to;

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
