//! Examples live in the folders beside `src/`; run one with `cargo run --example <name>`.
