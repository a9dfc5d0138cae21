//! Shared pieces of the fuzz targets: the invariants ([`decision`], [`parsers`], also used by
//! the property tests of the workspace), the decoding of fuzzer bytes into clusters and
//! requests ([`input`]), and each target's body ([`targets`]), which the `fuzz_targets/`
//! binaries run under libFuzzer and `tests/replay.rs` runs on seeded inputs on stable Rust.

pub mod decision;
pub mod input;
pub mod parsers;
pub mod targets;
