//! The simulator against a real CloudStack 4.21.0.0: brought to the state of the recordings in
//! `shared/cloudstack-4.21/` (beside the repository; read in place through
//! `cks_testkit::recorded`), asked the recorded requests (their commands and parameters,
//! signed again with the keys the simulator gives the recorded user: `admin` its own key,
//! `alice` and `bob` accounts of the scenario), its answers compared with the recorded ones:
//! status line, the headers a client reads, the envelope's key, every field's name and JSON
//! type (recursively), the codes and states, the jobs' final shapes and the cluster's state
//! sequence. A difference is fixed in the simulator or named below with the reason it may stay.
//!
//! Every recorded exchange is compared (the phases below: `running`, `alert`, `errors`,
//! `throttle`, `project`, and `create_04`) or listed in [`NOT_COMPARED`] with the reason;
//! `every_recorded_exchange_is_compared_or_listed_with_its_reason` holds the two together.
//!
//! The recorded server, as [`recorded_sim`] brings the simulator to it: `admin` a root admin
//! (never throttled: throttle_03), `alice` a User account, `bob` a User account whose role
//! allows only `list*` (errors_13…15; denying every other command explicitly for errors_13b
//! and 13c), project `p1` whose one member is `admin`, API throttling on at 30 calls a window,
//! no Alert scaling (4.21), a cluster size limit of 10.

use cks_sim::{
    AccountSpec, ClusterSpec, ClusterState, JobFailure, KeyRole, NodesSpec, OfferingSpec,
    ProjectSpec, Scenario, SimHandle, VmState,
};
use cks_testkit::cs::{java_encode, sign};
use cks_testkit::recorded::{self, Exchange, Http};
use cks_testkit::{sim_config_with, start_sim, wait_until};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
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

/// The recorded exchanges not compared, with the reason each may stay so.
const NOT_COMPARED: &[(&str, &str)] = &[
    (
        "running_34_scale_down_nodeids_query_pending",
        "timing: under paused time the simulator's removal fails before the test can ask, its \
         timers running while the test waits on a socket; running_27 compares a pending job's \
         shape",
    ),
    ("create_01_createKubernetesCluster", CREATE),
    ("create_02_createKubernetesCluster_query_pending", CREATE),
    ("create_03_createKubernetesCluster_query_final", CREATE),
    ("project_01_createKubernetesCluster_in_project", CREATE),
    (
        "project_02_createKubernetesCluster_in_project_job_final",
        CREATE,
    ),
];

/// Why the `createKubernetesCluster` exchanges are not compared. What a creation whose job
/// failed leaves behind, a cluster in Error with its VMs Running, a scenario sets up: the
/// `create` (create_04) and `project` (project_03…) phases compare it.
const CREATE: &str = "createKubernetesCluster and its job (CreateKubernetesClusterCmd, \
    jobinstancetype KubernetesCluster): the provider never creates a cluster and the simulator \
    does not serve the command; the cluster it leaves is compared (create_04, project_03)";

/// The phases, in the order they were recorded (the recorded jobs' `created` times: create,
/// running, alert, errors, throttle, project).
const RUNNING: &[&str] = &[
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

/// The scale-down by nodeids, once the cluster was set Running again (without running_34).
const RUNNING_SCALE_DOWN: &[&str] = &[
    "running_32_listKubernetesClusters_before_scale_down",
    "running_33_scale_down_nodeids",
    "running_35_scale_down_nodeids_query_final",
    "running_36_listKubernetesClusters_after_scale_down",
    "running_37_listVirtualMachines_after_scale_down",
];

const ALERT_BEFORE_SCAN: &[&str] = &[
    "alert_01_listKubernetesClusters_before_stop",
    "alert_02_stopVirtualMachine_worker",
    "alert_03_stopVirtualMachine_worker_query_pending",
    "alert_04_stopVirtualMachine_worker_query_final",
];

const ALERT_AFTER_SCAN: &[&str] = &[
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

/// Bad requests (admin), then `bob`'s role allowing only `list*`: his scale request accepted,
/// its job failing on his right.
const ERRORS: &[&str] = &[
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
    "errors_13_perm_bob_listonly_scale",
    "errors_13_perm_bob_listonly_scale_job_final",
];

/// `bob`'s role once it also denies every other command explicitly: the scale request refused
/// at once (432), his lists still allowed.
const ERRORS_DENY_REST: &[&str] = &[
    "errors_13b_perm_bob_listonly_plus_deny_star_scale",
    "errors_13c_perm_bob_listonly_plus_deny_star_list",
];

/// `bob` back on `list*` only (14, 15), `alice` on `admin`'s cluster and VM (16…20), the empty
/// project `p1` (admin: 21…24), `alice` naming `p1`, of which she is no member (25).
const ERRORS_OTHER_ACCOUNTS: &[&str] = &[
    "errors_14_perm_bob_listonly_stopvm",
    "errors_15_perm_bob_listonly_listKubernetesClusters",
    "errors_16_perm_alice_listKubernetesClusters_other_account_id",
    "errors_17_perm_alice_scale_other_account_cluster",
    "errors_17_perm_alice_scale_other_account_cluster_job_final",
    "errors_18_perm_alice_stop_other_account_vm",
    "errors_19_perm_alice_listVirtualMachines_other_account_vm",
    "errors_20_perm_alice_listall_vms",
    "errors_21_project_listKubernetesClusters_projectid",
    "errors_22_project_listKubernetesClusters_projectid_minus1",
    "errors_23_project_listVirtualMachines_projectid",
    "errors_24_project_listKubernetesClusters_nonexistent_projectid",
    "errors_25_project_alice_not_member",
];

/// After 30 calls of `alice` in the window: her next call and her `getApiLimit` are refused,
/// the root admin's call is not.
const THROTTLE: &[&str] = &[
    "throttle_01_throttle_alice_over_limit",
    "throttle_02_throttle_getApiLimit_alice",
    "throttle_03_throttle_admin_exempt",
];

/// The project's cluster `cksp` (its creation failed: Error), listed with and without
/// `projectid`, scaled (refused in Error), and `alice`'s `getApiLimit` in a new window.
const PROJECT: &[&str] = &[
    "project_03_listKubernetesClusters_projectid",
    "project_04_listKubernetesClusters_no_projectid",
    "project_05_listKubernetesClusters_projectid_minus1",
    "project_06_listVirtualMachines_projectid",
    "project_07_listVirtualMachines_no_projectid_listall",
    "project_08_scale_project_cluster_in_error_state",
    "project_09_scale_project_cluster_in_error_state_job_final",
    "project_10_getApiLimit_alice_after_window",
];

/// What a creation that failed left (create_03): the cluster in Error, its VMs Running.
const CREATE_AFTER: &[&str] = &["create_04_listKubernetesClusters_after_create"];

/// The recorded project `p1` (errors_21, project_03).
const PROJECT_ID: &str = "cf4bc2ef-d062-427f-8a2e-45f73d41d6a6";
/// Its cluster `cksp` (project_03).
const PROJECT_CLUSTER_ID: &str = "55844d78-464d-4f0f-ac41-27380f882f28";

/// The recorded server's state, as a scenario: one Running cluster of 1 control node and 2
/// workers on the recorded offering (the recorded ids for what a scenario can name), the
/// accounts `alice` and `bob` with keys of their own, the project `p1` of `admin`.
fn recorded_scenario() -> Scenario {
    let keys = recorded::keys();
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
    cluster.kubernetes_version = "v1.28.4".into();
    let mut bob = AccountSpec::new("bob");
    bob.role = Some("list-only".into());
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
        accounts: vec![AccountSpec::new("alice"), bob],
        projects: vec![ProjectSpec {
            id: Some(PROJECT_ID.into()),
            name: "p1".into(),
            members: vec!["admin".into()],
        }],
        ..Scenario::demo()
    };
    scenario.zone.id = keys["zoneid"].as_str().map(str::to_string);
    scenario.zone.name = "Sandbox-simulator".into();
    scenario
}

/// The cluster as the alert phase left it, where the errors, throttle and project phases
/// found it: 1 control and 3 worker VMs (the failed scale-up's VM kept) for `size` 2, the
/// first worker Stopped, the cluster in Alert (throttle_03, project_04).
fn after_alert(mut scenario: Scenario) -> Scenario {
    let c = &mut scenario.clusters[0];
    c.workers = NodesSpec::States(vec![VmState::Stopped, VmState::Running, VmState::Running]);
    c.size = Some(2);
    c.state = Some(ClusterState::Alert);
    scenario
}

/// The simulator brought to the recorded server (see the module doc), with `scenario`.
async fn recorded_sim(scenario: Scenario) -> SimHandle {
    start_sim(sim_config_with(|c| {
        c.scenario = scenario;
        c.settings.key_role = KeyRole::Admin;
        c.settings.alert_scaling = false;
        // api.throttling: 30 calls a window as recorded. The window is an hour, not 10 s:
        // under paused time the clock jumps to the simulator's next timer whenever the test
        // waits on a socket, so a 10 s window could end between two calls. The length only
        // changes the N of "retry after [N] ms." and `expireAfter`, whose values are not
        // compared.
        c.settings.throttling = true;
        c.settings.throttling_max = 30;
        c.settings.throttling_interval = std::time::Duration::from_secs(3600);
        // "Maximum cluster size can not exceed 10" (running_15).
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

/// The keys the simulator gives the recorded user who sent `ex`: `admin`'s are its own,
/// `alice`'s and `bob`'s its accounts', and the recorded unknown key (`bogus`, errors_05) stays
/// unknown.
fn keys_for(sim: &SimHandle, ex: &Exchange) -> (String, String) {
    let user = recorded::user_of(ex).unwrap_or_else(|| panic!("{}: no recorded user", ex.name));
    match user.name.as_str() {
        "admin" => (sim.api_key.clone(), sim.secret_key.clone()),
        "bogus" => ("AAAA-unknown".into(), "BBBB".into()),
        other => sim
            .account_keys(other)
            .unwrap_or_else(|| panic!("{}: the simulator has no account {other}", ex.name)),
    }
}

/// The recorded request sent to the simulator: the same method, command and parameters, its
/// ids replaced by the simulator's, signed with the keys the simulator gives its user; the
/// ones whose point is a broken signature broken the same way.
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
    let (key, secret) = keys_for(sim, ex);
    let mut params: Vec<(String, String)> = Vec::new();
    for (k, v) in ex.params() {
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
                params.push((k, fresh_expires.clone()))
            }
            _ => {
                let v = swap(&v);
                params.push((k, v))
            }
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
    let request = if ex.method() == "POST" {
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
        let recorded = ex.answer();
        if let (Some(rec), Some(got)) = (
            recorded.inner()["jobid"].as_str(),
            answer.inner()["jobid"].as_str(),
        ) {
            ids.insert(rec.to_string(), got.to_string());
        }
        if ex.command() == "listKubernetesClusters" {
            let state = |h: &Http| {
                h.inner()["kubernetescluster"][0]["state"]
                    .as_str()
                    .unwrap_or("-")
                    .to_string()
            };
            states.push((state(&recorded), state(&answer)));
        }
        let mut diffs = differences(&recorded, &answer);
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
    let keys = recorded::keys();
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

fn no_differences(found: &BTreeMap<String, BTreeSet<String>>) {
    assert!(
        found.is_empty(),
        "differences from 4.21:\n{}",
        report(found)
    );
}

#[test]
fn every_recorded_exchange_is_compared_or_listed_with_its_reason() {
    let compared: Vec<&str> = [
        RUNNING,
        RUNNING_SCALE_DOWN,
        ALERT_BEFORE_SCAN,
        ALERT_AFTER_SCAN,
        ERRORS,
        ERRORS_DENY_REST,
        ERRORS_OTHER_ACCOUNTS,
        THROTTLE,
        PROJECT,
        CREATE_AFTER,
    ]
    .concat();
    let listed: Vec<&str> = NOT_COMPARED.iter().map(|(n, _)| *n).collect();
    let all: BTreeSet<String> = recorded::exchanges().into_iter().map(|e| e.name).collect();
    let mut seen = BTreeSet::new();
    for name in compared.iter().chain(&listed) {
        assert!(all.contains(*name), "{name} is not a recorded exchange");
        assert!(seen.insert(*name), "{name} is compared or listed twice");
    }
    let left: Vec<&String> = all.iter().filter(|n| !seen.contains(n.as_str())).collect();
    assert!(left.is_empty(), "neither compared nor listed: {left:?}");
}

/// The position of running_25 among the running phase's cluster listings.
const RIGHT_AFTER_SCALE_CALL: usize = 6;

#[tokio::test(start_paused = true)]
async fn the_running_phase_answers_as_cloudstack_4_21_did() {
    let all = recorded::by_name();
    let sim = recorded_sim(recorded_scenario()).await;
    let cluster_id = sim.cluster_ids()[0].clone();
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    replay(&sim, &all, RUNNING, &mut ids, &mut found, &mut states).await;
    // The scale-up's VM, now listed, is the one the scale-down names; the recording's cluster
    // was set Running again before it (its README), as here.
    ids.extend(vm_ids(&sim, &cluster_id));
    assert!(sim.set_cluster_state(&cluster_id, ClusterState::Running));
    replay(
        &sim,
        &all,
        RUNNING_SCALE_DOWN,
        &mut ids,
        &mut found,
        &mut states,
    )
    .await;
    no_differences(&found);
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

/// Where the alert phase began: the cluster set Running again with the VM the failed
/// scale-up left (1 control and 3 worker VMs, `size` 2; alert_01); then a worker stopped,
/// CloudStack's scanner moving the cluster to Alert, and scale requests refused in Alert
/// (4.21 has no Alert scaling).
#[tokio::test(start_paused = true)]
async fn the_alert_phase_answers_as_cloudstack_4_21_did() {
    let all = recorded::by_name();
    let mut scenario = recorded_scenario();
    scenario.clusters[0].workers = NodesSpec::Count(3);
    scenario.clusters[0].size = Some(2);
    scenario.clusters[0].state = Some(ClusterState::Running);
    let sim = recorded_sim(scenario).await;
    let cluster_id = sim.cluster_ids()[0].clone();
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    replay(
        &sim,
        &all,
        ALERT_BEFORE_SCAN,
        &mut ids,
        &mut found,
        &mut states,
    )
    .await;
    // CloudStack's state scanner found the stopped VM about 100 s later (README fact 9).
    sim.scan_now();
    replay(
        &sim,
        &all,
        ALERT_AFTER_SCAN,
        &mut ids,
        &mut found,
        &mut states,
    )
    .await;
    sim.shutdown().await;
    no_differences(&found);
    let (recorded, simulated): (Vec<_>, Vec<_>) = states.into_iter().unzip();
    assert_eq!(
        simulated, recorded,
        "the cluster's states, request by request"
    );
}

/// Bad requests of `admin`, then the other accounts: `bob`'s scale request accepted and its
/// job failed on his role, then refused at once when his role denies it; `alice` seeing
/// nothing of `admin`'s, her scale job failed, her stop refused 531; the empty project; a
/// non-member naming it refused 432.
#[tokio::test(start_paused = true)]
async fn the_errors_phase_answers_as_cloudstack_4_21_did() {
    let all = recorded::by_name();
    let sim = recorded_sim(after_alert(recorded_scenario())).await;
    let cluster_id = sim.cluster_ids()[0].clone();
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    replay(&sim, &all, ERRORS, &mut ids, &mut found, &mut states).await;
    assert!(sim.set_account_role("bob", KeyRole::ListOnlyDenyRest));
    replay(
        &sim,
        &all,
        ERRORS_DENY_REST,
        &mut ids,
        &mut found,
        &mut states,
    )
    .await;
    assert!(sim.set_account_role("bob", KeyRole::ListOnly));
    replay(
        &sim,
        &all,
        ERRORS_OTHER_ACCOUNTS,
        &mut ids,
        &mut found,
        &mut states,
    )
    .await;
    // Nothing another account asked changed admin's cluster.
    assert_eq!(sim.cluster_state(&cluster_id), Some(ClusterState::Alert));
    assert_eq!(sim.cluster_json(&cluster_id)["size"], 2);
    sim.shutdown().await;
    no_differences(&found);
}

#[tokio::test(start_paused = true)]
async fn the_throttle_phase_answers_as_cloudstack_4_21_did() {
    let all = recorded::by_name();
    let sim = recorded_sim(after_alert(recorded_scenario())).await;
    let cluster_id = sim.cluster_ids()[0].clone();
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    // The calls of alice's window before it: her list of admin's cluster (an empty list).
    let call = &all["errors_16_perm_alice_listKubernetesClusters_other_account_id"];
    for n in 0..30 {
        assert_eq!(send(&sim, call, &ids).await.status, 200, "call {n}");
    }
    replay(&sim, &all, THROTTLE, &mut ids, &mut found, &mut states).await;
    assert_eq!(
        sim.throttled(),
        ["listKubernetesClusters", "getApiLimit"],
        "alice's two calls over the limit, not admin's"
    );
    sim.shutdown().await;
    no_differences(&found);
}

/// The project phase: `admin` created `cksp` in `p1` and the creation failed (project_01, 02:
/// not compared, see [`CREATE`]), leaving it in Error with its VMs Running.
#[tokio::test(start_paused = true)]
async fn the_project_phase_answers_as_cloudstack_4_21_did() {
    let all = recorded::by_name();
    let mut scenario = after_alert(recorded_scenario());
    let mut cksp = ClusterSpec::new("cksp", 1, 1);
    cksp.id = Some(PROJECT_CLUSTER_ID.into());
    cksp.offering = Some("cks-2c2g".into());
    cksp.kubernetes_version = "v1.28.4".into();
    cksp.state = Some(ClusterState::Error);
    cksp.project = Some("p1".into());
    scenario.clusters.push(cksp);
    let sim = recorded_sim(scenario).await;
    let cluster_id = sim.cluster_id("cks1").expect("cks1");
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    replay(&sim, &all, PROJECT, &mut ids, &mut found, &mut states).await;
    let (recorded, simulated): (Vec<_>, Vec<_>) = states.into_iter().unzip();
    assert_eq!(
        simulated, recorded,
        "the listed cluster's state, request by request"
    );
    // alice's getApiLimit opened her window, and counted itself (project_10: 1 issued, 29
    // allowed); asked again, it counts the two.
    let limit = send(
        &sim,
        &all["project_10_getApiLimit_alice_after_window"],
        &ids,
    )
    .await;
    let limit = &limit.inner()["apilimit"];
    assert_eq!(
        (limit["apiIssued"].as_u64(), limit["apiAllowed"].as_u64()),
        (Some(2), Some(28)),
        "{limit}"
    );
    sim.shutdown().await;
    no_differences(&found);
}

/// What `createKubernetesCluster` left when its job failed (create_03): the cluster in Error,
/// its control node and two workers Running, `size` 2 (create_04).
#[tokio::test(start_paused = true)]
async fn a_cluster_whose_creation_failed_lists_as_cloudstack_4_21_listed_it() {
    let all = recorded::by_name();
    let mut scenario = recorded_scenario();
    scenario.clusters[0].state = Some(ClusterState::Error);
    let sim = recorded_sim(scenario).await;
    let cluster_id = sim.cluster_ids()[0].clone();
    let mut ids = vm_ids(&sim, &cluster_id);
    let (mut found, mut states) = (BTreeMap::new(), Vec::new());
    replay(&sim, &all, CREATE_AFTER, &mut ids, &mut found, &mut states).await;
    assert_eq!(states, [("Error".to_string(), "Error".to_string())]);
    sim.shutdown().await;
    no_differences(&found);
}
