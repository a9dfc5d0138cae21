//! Bytes as a CloudStack response body: every response type, the way the client reads them,
//! and job outcomes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cks_fuzz::targets::cloudstack_json(data);
});
