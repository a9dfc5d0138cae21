//! A string as a Kubernetes node's providerID.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cks_fuzz::targets::provider_id(data);
});
