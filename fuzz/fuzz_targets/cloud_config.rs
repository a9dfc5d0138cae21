//! Bytes as a cloud-config file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    cks_fuzz::parsers::check_cloud_config(&text, "fuzz.conf");
});
