//! What a command answers: an HTTP status and JSON bytes, CloudStack's error envelope among
//! them. Its own module, so that the modules building answers (`api`, `access`, `throttle`,
//! `control`) share it without importing each other.

use serde::Serialize;
use serde_json::json;

/// An HTTP answer: status and JSON bytes.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn ok<T: Serialize + ?Sized>(value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => Self { status: 200, body },
            Err(e) => Self::error(
                "errorresponse",
                530,
                9999,
                &format!("serialization failed: {e}"),
            ),
        }
    }

    /// CloudStack's error envelope; the HTTP status is the error code.
    pub fn error(response_name: &str, code: u16, cs_code: u32, text: &str) -> Self {
        let mut inner = serde_json::Map::new();
        inner.insert("uuidList".into(), json!([]));
        inner.insert("errorcode".into(), json!(code));
        if cs_code != 0 {
            inner.insert("cserrorcode".into(), json!(cs_code));
        }
        inner.insert("errortext".into(), json!(text));
        let body = serde_json::to_vec(&json!({ response_name: inner })).unwrap_or_default();
        Self { status: code, body }
    }
}
