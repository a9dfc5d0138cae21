//! The simulator against a real CloudStack 4.21.0.0: brought to the state of the recordings in
//! `shared/cloudstack-4.21/` (beside the repository), asked the recorded requests (their
//! commands and parameters, signed again with the simulator's keys), its answers compared with
//! the recorded ones: status line, the headers a client reads, the envelope's key, every
//! field's name and JSON type (recursively), the codes and states, the jobs' final shapes and
//! the cluster's state sequence. A difference is fixed in the simulator or named below with the
//! reason it may stay.
//!
//! Compared: the `running` phase but running_34 (timing, see there), `errors` 01…14 and 24,
//! `throttle_01`, the `alert` phase. Not compared, for now:
//! - errors 15…23 and 25, `throttle_02/03`, the `project` and `create` phases: they need
//!   several accounts (alice, bob, admin) or roles the simulator does not have (one key, one
//!   account: a `User` or the project role), `createKubernetesCluster` or `getApiLimit`, which
//!   it does not serve.

use cks_sim::{ClusterSpec, JobFailure, KeyRole, NodesSpec, OfferingSpec, Scenario, SimHandle};
use cks_testkit::cs::{java_encode, sign};
use cks_testkit::{sim_config_with, start_sim, wait_until};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Fields that differ by nature or that the simulator cannot show, by name wherever they
/// appear, with the reason they may stay.
const MAY_DIFFER: &[(&str, &str)] = &[
    // A real hypervisor host and its agent: the simulator has no hosts.
    ("hostid", "no hosts in the simulator"),
    ("hostname", "no hosts in the simulator"),
    ("hostcontrolstate", "no hosts in the simulator"),
    // VM statistics appear only once CloudStack's stats collector has run (README fact 12).
    ("receivedbytes", "statistics, by time"),
    ("sentbytes", "statistics, by time"),
    ("cpuused", "statistics, by time"),
    ("diskioread", "statistics, by time"),
    ("diskiowrite", "statistics, by time"),
    ("diskkbsread", "statistics, by time"),
    ("diskkbswrite", "statistics, by time"),
    ("networkkbsread", "statistics, by time"),
    ("networkkbswrite", "statistics, by time"),
    ("memorykbs", "statistics, by time"),
    ("memoryintfreekbs", "statistics, by time"),
    ("memorytargetkbs", "statistics, by time"),
    (
        "lastupdated",
        "set on the VM's first state change after creation",
    ),
    (
        "controlNodeLoginUser",
        "4.21 adds it to the details of a VM a scale-up created (running_29); not modelled",
    ),
    (
        "gpudisplay",
        "4.21 shows it on offerings created through the API, not on its built-in ones \
         (running_11); the simulator's offerings are all of one kind",
    ),
    // Which management server ran the job.
    ("managementserverid", "the management server's own id"),
    ("managementservername", "the management server's own name"),
];

/// Single differences of one answer that may stay: (exchange, difference, reason).
const ACCEPTED: &[(&str, &str, &str)] = &[(
    "running_25_listKubernetesClusters_while_scaling",
    ".listkubernetesclustersresponse.kubernetescluster[].state: \"Running\" recorded, \"Scaling\" simulated",
    "timing: 4.21's job had not yet moved the cluster to Scaling; the simulator's starts at once, \
     and under paused time its timers run whenever the test waits on a socket",
)];

fn recordings() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/cloudstack-4.21");
    assert!(
        dir.join("recorded/INDEX.txt").is_file(),
        "the CloudStack 4.21 recordings are missing: expected {} (shared/cloudstack-4.21 \
         beside the repository's clone)",
        dir.display()
    );
    dir
}

/// An HTTP answer, recorded or the simulator's.
#[derive(Debug, Clone)]
struct Http {
    status: u16,
    reason: String,
    headers: BTreeMap<String, String>,
    body: Value,
}

impl Http {
    fn parse(bytes: &[u8]) -> Http {
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

    fn top_key(&self) -> String {
        self.body
            .as_object()
            .and_then(|o| o.keys().next().cloned())
            .unwrap_or_default()
    }

    fn inner(&self) -> &Value {
        self.body
            .as_object()
            .and_then(|o| o.values().next())
            .unwrap_or(&Value::Null)
    }
}

struct Exchange {
    name: String,
    method: String,
    params: Vec<(String, String)>,
    answer: Http,
}

impl Exchange {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn load() -> HashMap<String, Exchange> {
    let dir = recordings().join("recorded");
    let mut all = HashMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let Some(name) = file.strip_suffix(".request.http") else {
            continue;
        };
        let request = std::fs::read_to_string(dir.join(&file)).unwrap();
        let (head, body) = request.split_once("\r\n\r\n").unwrap();
        let line = head.lines().next().unwrap();
        let method = line.split(' ').next().unwrap().to_string();
        let target = line.split(' ').nth(1).unwrap();
        let raw = target.split_once('?').map_or(body.trim(), |(_, q)| q);
        let params = url::form_urlencoded::parse(raw.as_bytes())
            .into_owned()
            .collect();
        let answer =
            Http::parse(&std::fs::read(dir.join(format!("{name}.response.http"))).unwrap());
        all.insert(
            name.to_string(),
            Exchange {
                name: name.to_string(),
                method,
                params,
                answer,
            },
        );
    }
    assert!(all.len() >= 103, "only {} recorded exchanges", all.len());
    all
}

/// The recorded server's state, as a scenario: one Running cluster of 1 control node and 2
/// workers on the recorded offering, the recorded ids for what a scenario can name.
fn recorded_scenario() -> Scenario {
    let keys: Value =
        serde_json::from_str(&std::fs::read_to_string(recordings().join("keys.json")).unwrap())
            .unwrap();
    let offerings = [
        (
            "dbf42321-f4bd-442a-8745-6c11f25c1e05",
            "Small Instance",
            1,
            512,
            500,
        ),
        (
            "1df58f85-95ee-4184-ab19-e1b69051a433",
            "Medium Instance",
            1,
            1024,
            1000,
        ),
        (
            "6efcfe5e-61ca-48e5-bc38-7d8b78294463",
            "cks-2c2g",
            2,
            2048,
            1000,
        ),
    ];
    let mut cluster = ClusterSpec::new("cks1", 1, 2);
    cluster.id = keys["cluster"]["id"].as_str().map(str::to_string);
    cluster.description = Some("autoscaler wire test".into());
    cluster.offering = Some("cks-2c2g".into());
    cluster.workers = NodesSpec::Count(2);
    cluster.kubernetes_version = "v1.28.4".into();
    let mut scenario = Scenario {
        hypervisor: "Simulator".into(),
        offerings: offerings
            .iter()
            .map(|(id, name, cpu, memory, speed)| OfferingSpec {
                id: Some((*id).into()),
                name: (*name).into(),
                cpu: *cpu,
                memory: *memory,
                speed: *speed,
                customized: false,
            })
            .collect(),
        clusters: vec![cluster],
        ..Scenario::demo()
    };
    scenario.zone.id = keys["zoneid"].as_str().map(str::to_string);
    scenario.zone.name = "Sandbox-simulator".into();
    scenario
}

async fn recorded_sim(role: KeyRole) -> SimHandle {
    start_sim(sim_config_with(|c| {
        c.scenario = recorded_scenario();
        c.settings.key_role = role;
        // The recorded server: api.throttling 30 calls per 10 s, which the recorded root admin
        // was exempt from (throttle_03), as this test's key is by having it off here; a
        // maximum cluster size of 10 ("Maximum cluster size can not exceed 10", running_15).
        c.settings.throttling = false;
        c.settings.throttling_max = 30;
        c.settings.throttling_interval = std::time::Duration::from_secs(10);
        c.settings.max_cluster_size = 10;
        // The recorded nodes were unreachable: a scale-up's new node never became ready, so
        // the job failed on CKS's readiness timeout with its VM left Running and the cluster
        // in Alert (running_28, running_29). The nodes of the starting VMs are registered.
        c.settings.job_failure = JobFailure::None;
        c.settings.kubelet_delay = std::time::Duration::from_secs(3600);
        c.settings.scale_timeout = std::time::Duration::from_secs(5);
    }))
    .await
}

/// The recorded request sent to the simulator: the same method, command and parameters, its
/// ids replaced by the simulator's, signed with the simulator's keys; the ones whose point is
/// a broken signature broken the same way.
async fn send(sim: &SimHandle, ex: &Exchange, ids: &HashMap<String, String>) -> Http {
    let swap = |v: &str| {
        v.split(',')
            .map(|part| ids.get(part).cloned().unwrap_or_else(|| part.to_string()))
            .collect::<Vec<_>>()
            .join(",")
    };
    let fresh_expires = {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        stamp(at)
    };
    let (mut key, mut secret) = (sim.api_key.clone(), sim.secret_key.clone());
    if ex.name == "errors_05_err_unknown_apikey" {
        key = "AAAA-unknown".into();
        secret = "BBBB".into();
    }
    let mut params: Vec<(String, String)> = Vec::new();
    for (k, v) in &ex.params {
        match k.as_str() {
            "apiKey" | "signature" => {}
            // Recorded long ago: a fresh `expires`, unless the point is that it is expired or
            // malformed.
            "expires"
                if !matches!(
                    ex.name.as_str(),
                    "errors_02_err_expired_signature" | "errors_03_err_expires_bad_format"
                ) =>
            {
                params.push((k.clone(), fresh_expires.clone()))
            }
            _ => params.push((k.clone(), swap(v))),
        }
    }
    params.push(("apiKey".into(), key));
    let mut signature = sign(&params, &secret);
    if ex.name == "errors_01_err_bad_signature" {
        signature = format!("x{signature}");
    }
    params.push(("signature".into(), signature));
    let query = params
        .iter()
        .map(|(k, v)| format!("{k}={}", java_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let addr = sim.api_url.trim_start_matches("http://");
    let (host, path) = addr.split_once('/').unwrap();
    let request = if ex.method == "POST" {
        format!(
            "POST /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{query}",
            query.len()
        )
    } else {
        format!("GET /{path}?{query} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    };
    let mut socket = tokio::net::TcpStream::connect(host).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut bytes = Vec::new();
    socket.read_to_end(&mut bytes).await.unwrap();
    Http::parse(&bytes)
}

/// `yyyy-MM-ddTHH:mm:ss+0000`, the form the recorded requests' `expires` has.
fn stamp(unix: u64) -> String {
    let days = unix / 86_400;
    let secs = unix % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}+0000",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Field names and JSON types, recursively; arrays element by element.
fn shape(rec: &Value, sim: &Value, path: &str, out: &mut BTreeSet<String>) {
    if kind(rec) != kind(sim) {
        out.insert(format!(
            "{path}: {} recorded, {} simulated",
            kind(rec),
            kind(sim)
        ));
        return;
    }
    match (rec, sim) {
        (Value::Object(r), Value::Object(s)) => {
            for (k, rv) in r {
                let at = format!("{path}.{k}");
                if MAY_DIFFER.iter().any(|(f, _)| f == k) {
                    continue;
                }
                match s.get(k) {
                    Some(sv) => shape(rv, sv, &at, out),
                    None => {
                        out.insert(format!("{at}: missing"));
                    }
                }
            }
            for k in s.keys().filter(|k| !r.contains_key(*k)) {
                if !MAY_DIFFER.iter().any(|(f, _)| f == k) {
                    out.insert(format!("{path}.{k}: not recorded"));
                }
            }
        }
        (Value::Array(r), Value::Array(s)) => {
            for (rv, sv) in r.iter().zip(s) {
                shape(rv, sv, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// The values whose meaning a client acts on.
const COMPARED_VALUES: &[&str] = &[
    "errorcode",
    "cserrorcode",
    "jobstatus",
    "jobresultcode",
    "jobresulttype",
    "count",
    "state",
    "size",
    "controlnodes",
    "autoscalingenabled",
];

fn values(rec: &Value, sim: &Value, path: &str, out: &mut BTreeSet<String>) {
    match (rec, sim) {
        (Value::Object(r), Value::Object(s)) => {
            for (k, rv) in r {
                let Some(sv) = s.get(k) else { continue };
                let at = format!("{path}.{k}");
                if COMPARED_VALUES.contains(&k.as_str()) && !rv.is_object() && rv != sv {
                    out.insert(format!("{at}: {rv} recorded, {sv} simulated"));
                }
                values(rv, sv, &at, out);
            }
        }
        (Value::Array(r), Value::Array(s)) => {
            for (rv, sv) in r.iter().zip(s) {
                values(rv, sv, &format!("{path}[]"), out);
            }
        }
        _ => {}
    }
}

/// Every difference between a recorded answer and the simulator's.
fn differences(rec: &Http, sim: &Http) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if (rec.status, rec.reason.as_str()) != (sim.status, sim.reason.as_str()) {
        out.insert(format!(
            "status line: {} {} recorded, {} {} simulated",
            rec.status, rec.reason, sim.status, sim.reason
        ));
    }
    let header = |h: &Http, name: &str| h.headers.get(name).cloned();
    if header(rec, "content-type") != header(sim, "content-type") {
        out.insert(format!(
            "Content-Type: {:?} recorded, {:?} simulated",
            header(rec, "content-type"),
            header(sim, "content-type")
        ));
    }
    match (header(rec, "x-description"), header(sim, "x-description")) {
        (Some(_), None) => {
            out.insert("X-Description: missing".into());
        }
        (None, Some(_)) => {
            out.insert("X-Description: not recorded".into());
        }
        (Some(r), Some(s))
            if (r == rec.inner()["errortext"]) != (s == sim.inner()["errortext"]) =>
        {
            out.insert("X-Description: not the errortext".into());
        }
        _ => {}
    }
    if rec.top_key() != sim.top_key() {
        out.insert(format!(
            "envelope: {} recorded, {} simulated",
            rec.top_key(),
            sim.top_key()
        ));
    }
    shape(&rec.body, &sim.body, "", &mut out);
    values(&rec.body, &sim.body, "", &mut out);
    out
}

/// The simulator's job `job` once it has ended, as `queryAsyncJobResult` answers it.
async fn ended(sim: &SimHandle, ex: &Exchange, ids: &HashMap<String, String>) -> Http {
    let mut last = None;
    wait_until("the simulator's job to end", async || {
        let answer = send(sim, ex, ids).await;
        let done = answer.inner()["jobstatus"].as_i64() != Some(0);
        last = Some(answer);
        done
    })
    .await;
    last.unwrap()
}

/// Compares `names` in order, keeping the ids the simulator hands out (jobs) for the requests
/// that follow; a `_job_final` exchange is compared once the simulator's job has ended.
async fn replay(
    sim: &SimHandle,
    all: &HashMap<String, Exchange>,
    names: &[&str],
    ids: &mut HashMap<String, String>,
    found: &mut BTreeMap<String, BTreeSet<String>>,
    states: &mut Vec<(String, String)>,
) {
    for name in names {
        let ex = all
            .get(*name)
            .unwrap_or_else(|| panic!("no recorded exchange {name}"));
        let ended_job = name.ends_with("_job_final") || name.ends_with("_query_final");
        let answer = if ended_job {
            ended(sim, ex, ids).await
        } else {
            send(sim, ex, ids).await
        };
        if let (Some(rec), Some(got)) = (
            ex.answer.inner()["jobid"].as_str(),
            answer.inner()["jobid"].as_str(),
        ) {
            ids.insert(rec.to_string(), got.to_string());
        }
        if ex.param("command") == Some("listKubernetesClusters") {
            let state = |h: &Http| {
                h.inner()["kubernetescluster"][0]["state"]
                    .as_str()
                    .unwrap_or("-")
                    .to_string()
            };
            states.push((state(&ex.answer), state(&answer)));
        }
        let mut diffs = differences(&ex.answer, &answer);
        for (_, line, _) in ACCEPTED.iter().filter(|(n, _, _)| n == name) {
            assert!(
                diffs.remove(*line),
                "{name}: the accepted difference is gone: {line}"
            );
        }
        if !diffs.is_empty() {
            found.insert(name.to_string(), diffs);
        }
    }
}

/// The recorded VM ids mapped to the simulator's, by role and order.
fn vm_ids(sim: &SimHandle, cluster_id: &str) -> HashMap<String, String> {
    let keys: Value =
        serde_json::from_str(&std::fs::read_to_string(recordings().join("keys.json")).unwrap())
            .unwrap();
    let vms = sim.vms(cluster_id);
    let control: Vec<&String> = vms
        .iter()
        .filter(|(_, name, _)| name.contains("-control-"))
        .map(|(id, _, _)| id)
        .collect();
    let workers: Vec<&String> = vms
        .iter()
        .filter(|(_, name, _)| !name.contains("-control-"))
        .map(|(id, _, _)| id)
        .collect();
    let recorded = |role: &str| -> Vec<String> {
        keys["cluster"][role]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let mut ids = HashMap::new();
    for (rec, ours) in recorded("control").into_iter().zip(control) {
        ids.insert(rec, ours.clone());
    }
    for (rec, ours) in recorded("workers").into_iter().zip(workers) {
        ids.insert(rec, ours.clone());
    }
    ids
}

fn report(found: &BTreeMap<String, BTreeSet<String>>) -> String {
    found
        .iter()
        .map(|(name, diffs)| {
            format!(
                "{name}:\n  {}",
                diffs.iter().cloned().collect::<Vec<_>>().join("\n  ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The position of running_25 among the running phase's cluster listings.
const RIGHT_AFTER_SCALE_CALL: usize = 6;

#[tokio::test(start_paused = true)]
async fn the_running_phase_answers_as_cloudstack_4_21_did() {
    let all = load();
    let sim = recorded_sim(KeyRole::User).await;
    let cluster_id = sim.cluster_ids()[0].clone();
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    let names = [
        "running_01_listKubernetesClusters_running_byid",
        "running_02_listKubernetesClusters_all",
        "running_03_listKubernetesClusters_listall_page1_size1",
        "running_04_listKubernetesClusters_page2_size1",
        "running_05_listKubernetesClusters_POST",
        "running_06_listKubernetesClusters_v2_signature_no_expires",
        "running_07_listVirtualMachines_cluster_ids",
        "running_08_listVirtualMachines_one_worker",
        "running_09_listVirtualMachines_page1_size2",
        "running_10_listVirtualMachines_page2_size2",
        "running_11_listServiceOfferings_all",
        "running_12_listServiceOfferings_byid",
        "running_13_scale_err_no_size_no_nodeids",
        "running_13_scale_err_no_size_no_nodeids_job_final",
        "running_14_scale_err_size_and_nodeids",
        "running_14_scale_err_size_and_nodeids_job_final",
        "running_15_scale_err_size_over_max",
        "running_15_scale_err_size_over_max_job_final",
        "running_16_scale_err_size_zero",
        "running_16_scale_err_size_zero_job_final",
        "running_17_scale_err_same_size",
        "running_17_scale_err_same_size_job_final",
        "running_18_scale_err_nodeids_control",
        "running_18_scale_err_nodeids_control_job_final",
        "running_19_scale_err_nodeids_all_workers",
        "running_19_scale_err_nodeids_all_workers_job_final",
        "running_20_scale_err_nodeids_nonexistent",
        "running_21_scale_err_cluster_nonexistent",
        "running_22_scale_err_missing_id",
        "running_23_scale_err_size_not_a_number",
        "running_24_scale_up_size3",
        "running_25_listKubernetesClusters_while_scaling",
        "running_26_listAsyncJobs_while_scaling",
        "running_27_scale_up_size3_query_pending",
        "running_28_scale_up_size3_query_final",
        "running_29_listKubernetesClusters_after_scale_up_failed",
        "running_30_listAsyncJobs_after",
        "running_31_listAsyncJobs_page1_size2",
    ];
    replay(&sim, &all, &names, &mut ids, &mut found, &mut states).await;
    // The scale-up's VM, now listed, is the one the scale-down names; the recording's cluster
    // was set Running again before it (its README), as here.
    ids.extend(vm_ids(&sim, &cluster_id));
    assert!(sim.set_cluster_state(&cluster_id, cks_sim::ClusterState::Running));
    // Not running_34 (the removal's job still pending): under paused time the simulator's
    // removal fails before the test can ask, its timers running while the test waits on a
    // socket; running_27 compares a pending job's shape.
    let names = [
        "running_32_listKubernetesClusters_before_scale_down",
        "running_33_scale_down_nodeids",
        "running_35_scale_down_nodeids_query_final",
        "running_36_listKubernetesClusters_after_scale_down",
        "running_37_listVirtualMachines_after_scale_down",
    ];
    replay(&sim, &all, &names, &mut ids, &mut found, &mut states).await;
    assert!(
        found.is_empty(),
        "differences from 4.21:\n{}",
        report(&found)
    );
    let (recorded, mut simulated): (Vec<_>, Vec<_>) = states.into_iter().unzip();
    // Right after the scale call (running_25): see `ACCEPTED`.
    assert_eq!(simulated[RIGHT_AFTER_SCALE_CALL], "Scaling");
    simulated[RIGHT_AFTER_SCALE_CALL] = "Running".into();
    assert_eq!(
        simulated, recorded,
        "the cluster's states, request by request"
    );
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_errors_phase_answers_as_cloudstack_4_21_did() {
    let all = load();
    let sim = recorded_sim(KeyRole::User).await;
    let cluster_id = sim.cluster_ids()[0].clone();
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    let names = [
        "errors_01_err_bad_signature",
        "errors_02_err_expired_signature",
        "errors_03_err_expires_bad_format",
        "errors_04_err_sigver3_without_expires",
        "errors_05_err_unknown_apikey",
        "errors_06_err_nonexistent_cluster_id",
        "errors_07_err_malformed_cluster_id",
        "errors_08_err_nonexistent_vm_id",
        "errors_09_err_nonexistent_so_id",
        "errors_10_err_nonexistent_jobid",
        "errors_11_err_stop_nonexistent_vm",
        "errors_12_err_unknown_command",
        "errors_24_project_listKubernetesClusters_nonexistent_projectid",
    ];
    replay(&sim, &all, &names, &mut ids, &mut found, &mut states).await;
    sim.shutdown().await;
    // Bob's role allowing only list*: a scale request is accepted and its job fails the
    // permission check; stopVirtualMachine is refused at once.
    let sim = recorded_sim(KeyRole::ListOnly).await;
    let mut ids = vm_ids(&sim, &cluster_id);
    let names = [
        "errors_13_perm_bob_listonly_scale",
        "errors_13_perm_bob_listonly_scale_job_final",
        "errors_14_perm_bob_listonly_stopvm",
    ];
    replay(&sim, &all, &names, &mut ids, &mut found, &mut states).await;
    sim.shutdown().await;
    assert!(
        found.is_empty(),
        "differences from 4.21:\n{}",
        report(&found)
    );
}

#[tokio::test(start_paused = true)]
async fn the_throttle_phase_answers_as_cloudstack_4_21_did() {
    let all = load();
    let sim = recorded_sim(KeyRole::User).await;
    // 30 calls a window as recorded, the window an hour long: under paused time the clock
    // jumps to the simulator's next timer whenever the test waits on a socket, so a 10 s
    // window could end between two calls. The length only changes the N of "retry after [N]
    // ms.", which is not compared.
    sim.configure(|s| {
        s.throttling = true;
        s.throttling_max = 30;
        s.throttling_interval = std::time::Duration::from_secs(3600);
    });
    let cluster_id = sim.cluster_ids()[0].clone();
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    // The calls of the window before it, as alice's were.
    let call = &all["running_01_listKubernetesClusters_running_byid"];
    for n in 0..30 {
        assert_eq!(send(&sim, call, &ids).await.status, 200, "call {n}");
    }
    let names = ["throttle_01_throttle_alice_over_limit"];
    replay(&sim, &all, &names, &mut ids, &mut found, &mut states).await;
    sim.shutdown().await;
    assert!(
        found.is_empty(),
        "differences from 4.21:\n{}",
        report(&found)
    );
}

/// Where the alert phase began: the cluster set Running again with the VM the failed
/// scale-up left (1 control and 3 worker VMs, `size` 2; alert_01); then a worker stopped,
/// CloudStack's scanner moving the cluster to Alert, and scale requests refused in Alert
/// (4.21 has no Alert scaling: `alert_scaling` off).
#[tokio::test(start_paused = true)]
async fn the_alert_phase_answers_as_cloudstack_4_21_did() {
    let all = load();
    let mut scenario = recorded_scenario();
    scenario.clusters[0].workers = NodesSpec::Count(3);
    scenario.clusters[0].size = Some(2);
    scenario.clusters[0].state = Some(cks_sim::ClusterState::Running);
    let sim = start_sim(sim_config_with(|c| {
        c.scenario = scenario;
        c.settings.alert_scaling = false;
        c.settings.max_cluster_size = 10;
    }))
    .await;
    let cluster_id = sim.cluster_ids()[0].clone();
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    let before = [
        "alert_01_listKubernetesClusters_before_stop",
        "alert_02_stopVirtualMachine_worker",
        "alert_03_stopVirtualMachine_worker_query_pending",
        "alert_04_stopVirtualMachine_worker_query_final",
    ];
    replay(&sim, &all, &before, &mut ids, &mut found, &mut states).await;
    // CloudStack's state scanner found the stopped VM about 100 s later (README fact 9).
    sim.scan_now();
    let after = [
        "alert_05_listKubernetesClusters_alert_byid",
        "alert_06_listVirtualMachines_alert_cluster",
        "alert_07_listVirtualMachines_stopped_worker",
        "alert_08_scale_err_alert_size",
        "alert_08_scale_err_alert_size_job_final",
        "alert_09_scale_err_alert_nodeids",
        "alert_09_scale_err_alert_nodeids_job_final",
        "alert_10_stopVirtualMachine_already_stopped",
        "alert_10_stopVirtualMachine_already_stopped_job_final",
    ];
    replay(&sim, &all, &after, &mut ids, &mut found, &mut states).await;
    sim.shutdown().await;
    assert!(
        found.is_empty(),
        "differences from 4.21:\n{}",
        report(&found)
    );
    let (recorded, simulated): (Vec<_>, Vec<_>) = states.into_iter().unzip();
    assert_eq!(
        simulated, recorded,
        "the cluster's states, request by request"
    );
}
