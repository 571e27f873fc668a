//! Compile-error tests of `#[handler]` and `#[derive(Message)]`.
//!
//! Each `ui/fail/*.rs` must fail to compile with exactly the committed `.stderr`; regenerate
//! them with `TRYBUILD=overwrite cargo test -p hexeract-tests --test ui` on the pinned toolchain
//! and read every changed file before committing it.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
