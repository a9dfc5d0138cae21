//! A cluster, a scale request and the Alert capability, decoded from the fuzzer's bytes, through
//! the classification and `check_scale`, with every invariant of `cks_fuzz::decision` asserted.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|case: cks_fuzz::input::ScaleCase| {
    let (input, request, alert) = case.build();
    let _ = cks_fuzz::decision::check_decision(&input, &request, &alert);
});
