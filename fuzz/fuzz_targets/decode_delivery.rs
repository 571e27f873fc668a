//! An AMQP delivery with any properties, headers and body, read as the RabbitMQ worker reads
//! it: never a panic, an envelope or one known reason, an oversized body refused first
//! (`hexeract_fuzz::delivery::check` lists the invariants).
#![no_main]

use hexeract_fuzz::delivery::{check, DeliveryInput};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: DeliveryInput| check(&input));
