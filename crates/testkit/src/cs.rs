//! A small CloudStack client for the simulator's tests, with its own request signer (written
//! here, independently of the simulator's verifier and of the provider's client), and the
//! helpers the `sim_*` tests share.

use super::{WAIT, wait_until};
use base64::Engine;
use cks_sim::SimHandle;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;

/// Encodes like Java's URLEncoder (letters, digits, `.-*_` kept), with space as `%20`.
pub fn java_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'*' | b'_') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// CloudStack's signature over `params` (which must include apiKey, not signature).
pub fn sign(params: &[(String, String)], secret: &str) -> String {
    let mut sorted = params.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let text: Vec<String> = sorted
        .iter()
        .map(|(k, v)| format!("{k}={}", java_encode(v)))
        .collect();
    let text = text.join("&").to_lowercase();
    let mut mac =
        Hmac::<sha1::Sha1>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(text.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
    pub key: String,
    pub secret: String,
}

pub struct Answer {
    pub status: u16,
    pub text: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

impl Client {
    pub fn new(sim: &SimHandle) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(WAIT)
                .build()
                .expect("HTTP client"),
            url: sim.api_url.clone(),
            key: sim.api_key.clone(),
            secret: sim.secret_key.clone(),
        }
    }

    pub fn with_keys(sim: &SimHandle, key: &str, secret: &str) -> Self {
        Self {
            key: key.into(),
            secret: secret.into(),
            ..Self::new(sim)
        }
    }

    /// The signed query string for `command` with `params`.
    pub fn signed_query(&self, command: &str, params: &[(&str, &str)]) -> String {
        let mut all: Vec<(String, String)> = vec![
            ("command".into(), command.into()),
            ("response".into(), "json".into()),
            ("apiKey".into(), self.key.clone()),
        ];
        all.extend(params.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let sig = sign(&all, &self.secret);
        all.push(("signature".into(), sig));
        all.iter()
            .map(|(k, v)| format!("{k}={}", java_encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// Signed GET; panics on transport errors.
    pub async fn get(&self, command: &str, params: &[(&str, &str)]) -> Answer {
        self.try_get(command, params).await.expect("transport")
    }

    pub async fn try_get(
        &self,
        command: &str,
        params: &[(&str, &str)],
    ) -> Result<Answer, reqwest::Error> {
        let url = format!("{}?{}", self.url, self.signed_query(command, params));
        self.raw(&url).await
    }

    pub async fn raw(&self, url: &str) -> Result<Answer, reqwest::Error> {
        let r = self.http.get(url).send().await?;
        let status = r.status().as_u16();
        Ok(Answer {
            status,
            text: r.text().await?,
        })
    }

    /// Signed POST with a form body.
    pub async fn post(&self, command: &str, params: &[(&str, &str)]) -> Answer {
        let r = self
            .http
            .post(&self.url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(self.signed_query(command, params))
            .send()
            .await
            .expect("transport");
        let status = r.status().as_u16();
        Answer {
            status,
            text: r.text().await.expect("reading the answer"),
        }
    }

    /// Signed GET expecting HTTP 200; returns the inner object of `<command>response`.
    pub async fn ok(&self, command: &str, params: &[(&str, &str)]) -> Value {
        let a = self.get(command, params).await;
        assert_eq!(a.status, 200, "{command}: {}", a.text);
        a.json()[format!("{}response", command.to_lowercase())].clone()
    }

    /// Unsigned simulator-only command; returns the inner object.
    pub async fn sim(&self, command: &str, params: &[(&str, &str)]) -> Value {
        let mut q = format!("command={command}&response=json");
        for (k, v) in params {
            q.push_str(&format!("&{k}={}", java_encode(v)));
        }
        let a = self
            .raw(&format!("{}?{q}", self.url))
            .await
            .expect("transport");
        assert_eq!(a.status, 200, "{command}: {}", a.text);
        a.json()[format!("{}response", command.to_lowercase())].clone()
    }

    pub async fn cluster(&self, id: &str) -> Value {
        self.ok("listKubernetesClusters", &[("id", id)]).await["kubernetescluster"][0].clone()
    }

    /// Submits an async command and returns its job id.
    pub async fn submit(&self, command: &str, params: &[(&str, &str)]) -> String {
        let r = self.ok(command, params).await;
        r["jobid"]
            .as_str()
            .unwrap_or_else(|| panic!("no jobid: {r}"))
            .to_string()
    }

    /// Polls queryAsyncJobResult until the job is no longer in progress.
    pub async fn wait_job(&self, job_id: &str) -> Value {
        let mut last = Value::Null;
        wait_until(&format!("job {job_id} to finish"), async || {
            last = self.ok("queryAsyncJobResult", &[("jobid", job_id)]).await;
            last["jobstatus"] != 0
        })
        .await;
        last
    }

    /// Submits a scale request and waits for its job.
    pub async fn scale(&self, params: &[(&str, &str)]) -> Value {
        let job = self.submit("scaleKubernetesCluster", params).await;
        self.wait_job(&job).await
    }
}

/// The failure text of a failed job, asserting CloudStack's failure shape.
pub fn failure_text(job: &Value) -> String {
    assert_eq!(job["jobstatus"], 2, "expected a failed job: {job}");
    assert_eq!(job["jobresult"]["errorcode"], job["jobresultcode"], "{job}");
    job["jobresult"]["errortext"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// VM ids of a cluster, by role name pattern (`-control-`, `-node-`, ...), in creation order.
pub fn vm_ids(cluster: &Value, pattern: &str) -> Vec<String> {
    cluster["virtualmachines"]
        .as_array()
        .expect("virtualmachines")
        .iter()
        .filter(|v| v["name"].as_str().unwrap_or_default().contains(pattern))
        .map(|v| v["id"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// States of a cluster's VMs by id, from the API view.
pub fn vm_state(cluster: &Value, id: &str) -> Option<String> {
    cluster["virtualmachines"]
        .as_array()
        .expect("virtualmachines")
        .iter()
        .find(|v| v["id"] == id)
        .map(|v| v["state"].as_str().unwrap_or_default().to_string())
}
