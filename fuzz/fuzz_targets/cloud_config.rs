//! Bytes as a cloud-config file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cks_fuzz::targets::cloud_config(data);
});
