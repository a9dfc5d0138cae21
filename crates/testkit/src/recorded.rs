//! The exchanges recorded with a real CloudStack 4.21.0.0, read in place from
//! `shared/cloudstack-4.21/` beside the repository (never copied into it): each
//! `recorded/<name>.request.http` and `.response.http` as the bytes sent and received, and the
//! recorded server's throwaway keys (`keys.json`). The client's replay
//! (`crates/cloudstack/src/tests/replay_4_21.rs`) and the simulator's differential test
//! (`crates/sim/tests/it/sim_replay_4_21.rs`) both read them through this module.
//!
//! Only `std`, `serde_json` and `url` types cross it, so a crate that this kit itself depends
//! on (the client) can use it as a dev-dependency.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// At least this many exchanges are recorded; fewer means some went missing, and a test over
/// them would silently cover less.
pub const RECORDED: usize = 103;

/// `shared/cloudstack-4.21/` beside the repository (CI puts `shared/` beside the clone).
/// Missing, it panics naming the path: a replay over nothing would prove nothing.
pub fn dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/cloudstack-4.21");
    assert!(
        dir.join("recorded/INDEX.txt").is_file(),
        "the CloudStack 4.21 recordings are missing: expected {} (shared/cloudstack-4.21 \
         beside the repository's clone)",
        dir.display()
    );
    dir
}

/// One recorded exchange: the request and the answer, byte for byte.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// `PHASE_NN_NAME`, the files' common stem.
    pub name: String,
    pub request: Vec<u8>,
    pub response: Vec<u8>,
}

impl Exchange {
    fn request_text(&self) -> (String, String) {
        let text = String::from_utf8_lossy(&self.request).into_owned();
        match text.split_once("\r\n\r\n") {
            Some((head, body)) => (head.to_string(), body.to_string()),
            None => (text, String::new()),
        }
    }

    /// `GET` or `POST`.
    pub fn method(&self) -> String {
        let (head, _) = self.request_text();
        head.split(' ').next().unwrap_or_default().to_string()
    }

    /// The parameters as sent, still encoded: the query (GET) or the form body (POST).
    pub fn raw_params(&self) -> String {
        let (head, body) = self.request_text();
        let target = head
            .lines()
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .unwrap_or_default();
        match target.split_once('?') {
            Some((_, query)) => query.to_string(),
            None => body.trim().to_string(),
        }
    }

    /// The parameters, decoded as a servlet container decodes them, in the order sent.
    pub fn params(&self) -> Vec<(String, String)> {
        url::form_urlencoded::parse(self.raw_params().as_bytes())
            .into_owned()
            .collect()
    }

    /// The first value of parameter `name` (any case).
    pub fn param(&self, name: &str) -> Option<String> {
        self.params()
            .into_iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    }

    /// The `command` parameter.
    pub fn command(&self) -> String {
        self.param("command").unwrap_or_default()
    }

    fn response_text(&self) -> (String, String) {
        let text = String::from_utf8_lossy(&self.response).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("{}: no head and body", self.name));
        (head.to_string(), body.to_string())
    }

    /// The answer, parsed.
    pub fn answer(&self) -> Http {
        Http::parse(&self.response)
    }

    /// The status code of the recorded status line.
    pub fn status(&self) -> u16 {
        self.answer().status
    }

    /// The recorded body as JSON.
    pub fn body(&self) -> Value {
        let (_, body) = self.response_text();
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{}: body: {e}", self.name))
    }

    /// The object under the answer's only key.
    pub fn inner(&self) -> Value {
        let body = self.body();
        let obj = body.as_object().expect("an object");
        assert_eq!(obj.len(), 1, "{}: one top-level key", self.name);
        obj.values().next().cloned().unwrap_or_default()
    }
}

/// An HTTP answer, recorded or another server's: status line, headers (names lower-cased) and
/// JSON body (`null` when it is not JSON).
#[derive(Debug, Clone)]
pub struct Http {
    pub status: u16,
    pub reason: String,
    pub headers: BTreeMap<String, String>,
    pub body: Value,
}

impl Http {
    pub fn parse(bytes: &[u8]) -> Http {
        let text = String::from_utf8_lossy(bytes);
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        let mut lines = head.lines();
        let status_line = lines.next().expect("status line");
        let mut parts = status_line.splitn(3, ' ');
        parts.next();
        let status = parts.next().and_then(|s| s.parse().ok()).expect("status");
        let reason = parts.next().unwrap_or_default().to_string();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let body = serde_json::from_str(body).unwrap_or(Value::Null);
        Http {
            status,
            reason,
            headers,
            body,
        }
    }

    /// The envelope's key (`<command>response`, `errorresponse`).
    pub fn top_key(&self) -> String {
        self.body
            .as_object()
            .and_then(|o| o.keys().next().cloned())
            .unwrap_or_default()
    }

    /// The object under the envelope's key.
    pub fn inner(&self) -> &Value {
        self.body
            .as_object()
            .and_then(|o| o.values().next())
            .unwrap_or(&Value::Null)
    }
}

/// Every recorded exchange, sorted by name.
pub fn exchanges() -> Vec<Exchange> {
    let recorded = dir().join("recorded");
    let mut names: Vec<String> = std::fs::read_dir(&recorded)
        .expect("the recorded/ directory")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".request.http").map(str::to_string)
        })
        .collect();
    names.sort();
    let all: Vec<Exchange> = names
        .into_iter()
        .map(|name| Exchange {
            request: std::fs::read(recorded.join(format!("{name}.request.http")))
                .unwrap_or_else(|e| panic!("{name}: request: {e}")),
            response: std::fs::read(recorded.join(format!("{name}.response.http")))
                .unwrap_or_else(|e| panic!("{name}: response: {e}")),
            name,
        })
        .collect();
    assert!(
        all.len() >= RECORDED,
        "only {} recorded exchanges",
        all.len()
    );
    all
}

/// Every recorded exchange by name.
pub fn by_name() -> HashMap<String, Exchange> {
    exchanges()
        .into_iter()
        .map(|e| (e.name.clone(), e))
        .collect()
}

/// `keys.json`: the recorded server's users and their keys, the cluster's and VMs' ids, the
/// zone and the offering.
pub fn keys() -> Value {
    let text = std::fs::read_to_string(dir().join("keys.json")).expect("keys.json");
    serde_json::from_str(&text).expect("keys.json is JSON")
}

/// A recorded user's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedUser {
    pub name: String,
    pub api_key: String,
    pub secret_key: String,
}

/// The recorded users (`admin`, `alice`, `bob` and the unknown `bogus`), by name.
pub fn users() -> BTreeMap<String, RecordedUser> {
    keys()["users"]
        .as_object()
        .expect("keys.json: users")
        .iter()
        .map(|(name, k)| {
            let text = |f: &str| {
                k[f].as_str()
                    .unwrap_or_else(|| panic!("keys.json: {name}.{f}"))
                    .to_string()
            };
            (
                name.clone(),
                RecordedUser {
                    name: name.clone(),
                    api_key: text("apikey"),
                    secret_key: text("secretkey"),
                },
            )
        })
        .collect()
}

/// The recorded user an exchange's `apiKey` belongs to.
pub fn user_of(ex: &Exchange) -> Option<RecordedUser> {
    let key = ex.param("apiKey")?;
    users().into_values().find(|u| u.api_key == key)
}
