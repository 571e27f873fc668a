//! A Kafka record with any key, headers and payload, read as the Kafka worker reads it: never a
//! panic, an envelope or one known reason, an oversized payload refused first
//! (`hexeract_fuzz::record::check` lists the invariants). Needs `--features kafka`.
#![no_main]

use hexeract_fuzz::record::{check, RecordInput};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: RecordInput| check(&input));
