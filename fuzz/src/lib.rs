//! Shared pieces of the fuzz targets: the invariants ([`decision`], [`parsers`], also used by
//! the property tests in the main crate's `tests/`) and the decoding of fuzzer bytes into
//! clusters and requests ([`input`]).

pub mod decision;
pub mod input;
pub mod parsers;
