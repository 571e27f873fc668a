//! Compile-error tests of `#[handler]`, `#[scheduled]` and `#[derive(Message)]`.
//!
//! Each `fail/*.rs` must fail to compile with exactly the committed `.stderr`; regenerate
//! them with `TRYBUILD=overwrite cargo test -p hexeract-ui-tests --test ui` on the pinned toolchain
//! and read every changed file before committing it.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("pass/*.rs");
    cases.compile_fail("fail/*.rs");
}
