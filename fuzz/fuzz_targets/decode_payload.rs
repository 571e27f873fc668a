//! Any payload bytes decoded into a message type with `Envelope::decode`: the message or
//! `InvalidPayload`, another type refused before parsing, never a panic or a stack overflow
//! (`hexeract_fuzz::payload::check` lists the invariants).
#![no_main]

use hexeract_fuzz::payload::{check, PayloadInput};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: PayloadInput| check(&input));
