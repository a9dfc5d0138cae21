//! A cluster, a scale request and the Alert capability, decoded from the fuzzer's bytes, through
//! the classification and `check_scale`, with every invariant of `cks_fuzz::decision` asserted.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cks_fuzz::targets::scale_decision(data);
});
