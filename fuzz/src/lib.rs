//! The fuzz targets' inputs and the invariants they check, in a library so that the corpus
//! seeds and the checks also run on stable (`cargo test --manifest-path fuzz/Cargo.toml`).
//!
//! Each input is read from the raw bytes libFuzzer gives in one documented layout, with no
//! input ever rejected (past the end a [`bytes::Reader`] yields zeros), and can be written back
//! into that layout: the corpus seeds are made that way, not by hand.

pub mod bytes;
pub mod delivery;
pub mod payload;
#[cfg(feature = "kafka")]
pub mod record;

/// Implements `Arbitrary` for an input read with `from_bytes`: the fuzz targets take it
/// typed, and `cargo fuzz fmt` prints a crash as the input's `Debug`.
macro_rules! arbitrary_from_bytes {
    ($input:ty) => {
        impl<'a> arbitrary::Arbitrary<'a> for $input {
            fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
                let len = u.len();
                Ok(Self::from_bytes(u.bytes(len)?))
            }

            fn arbitrary_take_rest(u: arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
                Ok(Self::from_bytes(u.take_rest()))
            }
        }
    };
}
pub(crate) use arbitrary_from_bytes;
