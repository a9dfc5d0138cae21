//! A string as a `--nodes MIN:MAX:CLUSTER` value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cks_fuzz::targets::nodes_spec(data);
});
