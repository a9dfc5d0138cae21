//! A string as a `--nodes MIN:MAX:CLUSTER` value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|spec: &str| {
    cks_fuzz::parsers::check_nodes_spec(spec);
});
