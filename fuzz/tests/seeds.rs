//! On stable, without libFuzzer: the corpus seeds are what the inputs' encoders make, each
//! reaches the outcome it is named after, and seeded random mutations of them hold the
//! invariants the targets check. `HEXERACT_FUZZ_SEEDS=overwrite cargo test --manifest-path
//! fuzz/Cargo.toml` writes the seeds again.

use std::fmt::Debug;
use std::path::Path;

use hexeract::Reason;
use hexeract_fuzz::{delivery, payload};

/// Compares (or, with `HEXERACT_FUZZ_SEEDS=overwrite`, writes) one target's seed files.
fn corpus(target: &str, seeds: &[(&str, Vec<u8>)]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let overwrite = std::env::var("HEXERACT_FUZZ_SEEDS").as_deref() == Ok("overwrite");
    if overwrite {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (name, bytes) in seeds {
        let path = dir.join(name);
        if overwrite {
            std::fs::write(&path, bytes).unwrap();
        } else {
            let on_disk = std::fs::read(&path).unwrap_or_else(|error| {
                panic!(
                    "{}: {error} (HEXERACT_FUZZ_SEEDS=overwrite writes it)",
                    path.display()
                )
            });
            assert_eq!(
                &on_disk,
                bytes,
                "{} is stale (HEXERACT_FUZZ_SEEDS=overwrite writes it again)",
                path.display()
            );
        }
    }
}

fn round_trip<I: Debug + PartialEq>(input: &I, to: fn(&I) -> Vec<u8>, from: fn(&[u8]) -> I) {
    assert_eq!(&from(&to(input)), input);
}

/// A small xorshift: the same mutations at every run, no dependency.
struct Mutator(u64);

impl Mutator {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// `seed` with a few bytes flipped, set, inserted or cut off; sometimes random bytes.
    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut bytes = seed.to_vec();
        if self.below(8) == 0 {
            let len = self.below(256);
            return (0..len).map(|_| self.next() as u8).collect();
        }
        for _ in 0..=self.below(4) {
            let at = self.below(bytes.len() + 1);
            match self.below(4) {
                0 if at < bytes.len() => bytes[at] ^= 1 << self.below(8),
                1 if at < bytes.len() => bytes[at] = self.next() as u8,
                2 => bytes.insert(at, self.next() as u8),
                _ => bytes.truncate(at.max(3)),
            }
        }
        bytes
    }
}

fn mutations(seeds: &[Vec<u8>], runs: usize, check: impl Fn(&[u8])) {
    let mut mutator = Mutator(0x9e37_79b9_7f4a_7c15);
    for run in 0..runs {
        let seed = &seeds[run % seeds.len()];
        check(&mutator.mutate(seed));
    }
}

#[test]
fn delivery_seeds_reach_their_outcomes() {
    let seeds = delivery::seeds();
    for (name, input) in &seeds {
        round_trip(
            input,
            delivery::DeliveryInput::to_bytes,
            delivery::DeliveryInput::from_bytes,
        );
        delivery::check(input);
        let result = hexeract::fuzzing::read_delivery(
            &input.to_delivery(),
            delivery::EXCHANGE,
            usize::from(input.max_payload_bytes),
        );
        match result {
            Ok(_) => assert!(
                name.starts_with("envelope"),
                "{name} was read as an envelope"
            ),
            Err((reason, detail)) => assert_eq!(reason, Reason::from(*name), "{name}: {detail}"),
        }
    }
    let bytes: Vec<_> = seeds.iter().map(|(n, i)| (*n, i.to_bytes())).collect();
    corpus("decode_delivery", &bytes);
}

#[test]
fn mutated_deliveries_hold_the_invariants() {
    let seeds: Vec<_> = delivery::seeds()
        .iter()
        .map(|(_, i)| i.to_bytes())
        .collect();
    mutations(&seeds, 20_000, |bytes| {
        delivery::check(&delivery::DeliveryInput::from_bytes(bytes));
    });
}

#[test]
fn payload_seeds_reach_their_outcomes() {
    let seeds = payload::seeds();
    for (name, input) in &seeds {
        round_trip(
            input,
            payload::PayloadInput::to_bytes,
            payload::PayloadInput::from_bytes,
        );
        payload::check(input);
        let envelope = hexeract::Envelope::from_raw("fuzz.Order", input.payload.clone());
        let decoded = envelope.decode::<payload::Order>();
        assert_eq!(*name == "order", decoded.is_ok(), "{name}: {decoded:?}");
    }
    let bytes: Vec<_> = seeds.iter().map(|(n, i)| (*n, i.to_bytes())).collect();
    corpus("decode_payload", &bytes);
}

#[test]
fn mutated_payloads_hold_the_invariants() {
    let seeds: Vec<_> = payload::seeds().iter().map(|(_, i)| i.to_bytes()).collect();
    mutations(&seeds, 20_000, |bytes| {
        payload::check(&payload::PayloadInput::from_bytes(bytes));
    });
}

#[test]
fn deeply_nested_payloads_are_errors_not_stack_overflows() {
    for selector in [0, 1, 2] {
        let mut nested = vec![selector];
        nested.extend(std::iter::repeat_n(b'[', 100_000));
        payload::check(&payload::PayloadInput::from_bytes(&nested));
        let mut branches = vec![selector];
        for _ in 0..10_000 {
            branches.extend_from_slice(br#"{"Branch":["#);
        }
        payload::check(&payload::PayloadInput::from_bytes(&branches));
    }
}

#[cfg(feature = "kafka")]
mod kafka {
    use super::*;
    use hexeract_fuzz::record;

    #[test]
    fn record_seeds_reach_their_outcomes() {
        let seeds = record::seeds();
        for (name, input) in &seeds {
            round_trip(
                input,
                record::RecordInput::to_bytes,
                record::RecordInput::from_bytes,
            );
            record::check(input);
            let result = hexeract::fuzzing::read_record(
                &input.to_record(),
                record::AGGREGATE,
                usize::from(input.max_payload_bytes),
            );
            match result {
                Ok(_) => assert!(
                    name.starts_with("envelope"),
                    "{name} was read as an envelope"
                ),
                Err((reason, detail)) => {
                    assert_eq!(reason, Reason::from(*name), "{name}: {detail}")
                }
            }
        }
        let bytes: Vec<_> = seeds.iter().map(|(n, i)| (*n, i.to_bytes())).collect();
        corpus("decode_record", &bytes);
    }

    #[test]
    fn mutated_records_hold_the_invariants() {
        let seeds: Vec<_> = record::seeds().iter().map(|(_, i)| i.to_bytes()).collect();
        mutations(&seeds, 20_000, |bytes| {
            record::check(&record::RecordInput::from_bytes(bytes));
        });
    }
}
