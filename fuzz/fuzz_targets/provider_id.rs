//! A string as a Kubernetes node's providerID.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|provider_id: &str| {
    cks_fuzz::parsers::check_provider_id(provider_id);
});
