//! Integration and UI tests of Hexeract live in `tests/`.
