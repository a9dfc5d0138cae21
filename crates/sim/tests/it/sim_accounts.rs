//! Several accounts and projects (`Scenario::accounts`, `Scenario::projects`, a cluster's
//! `account` or `project`): what each key lists, what it may change, and where the refusal
//! comes (in the job, at the call, before the command); a root admin; `getApiLimit`; a VM's
//! pending job in its answers. The recorded 4.21 answers these follow are compared in
//! `sim_replay_4_21`; the rest comes from CloudStack's source, named in `accounts.rs`.

use cks_sim::{AccountSpec, ClusterSpec, KeyRole, ProjectSpec, Scenario, SimConfig, SimHandle};
use cks_testkit::cs::*;
use cks_testkit::{sim_config_with, start_sim};
use serde_json::{Value, json};

const TEAM: &str = "7d3e1f5a-9b2c-4d8e-a6f0-3c5b7e9d1a24";
const NO_PERMISSION: &str = "Caller does not have permission to operate with provided resource.";

/// `mine` (the key's own account, `admin`), `alices` (account `alice`), `teams` (project
/// `team`, whose one member is `alice`), and a root admin account `root` owning nothing.
fn accounts() -> SimConfig {
    sim_config_with(|c| {
        let mut alices = ClusterSpec::new("alices", 1, 2);
        alices.account = Some("alice".into());
        let mut teams = ClusterSpec::new("teams", 1, 1);
        teams.project = Some("team".into());
        let mut alice = AccountSpec::new("alice");
        alice.api_key = Some("alice-key".into());
        alice.secret_key = Some("alice-secret".into());
        let mut root = AccountSpec::new("root");
        root.role = Some("admin".into());
        c.scenario = Scenario {
            clusters: vec![ClusterSpec::new("mine", 1, 2), alices, teams],
            accounts: vec![alice, root],
            projects: vec![ProjectSpec {
                id: Some(TEAM.into()),
                name: "team".into(),
                members: vec!["alice".into()],
            }],
            ..Scenario::empty()
        };
    })
}

fn client(sim: &SimHandle, account: &str) -> Client {
    let (key, secret) = sim.account_keys(account).expect("an account");
    Client::with_keys(sim, &key, &secret)
}

fn names(v: &Value) -> Vec<String> {
    let mut n: Vec<String> = v["kubernetescluster"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|c| c["name"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default();
    n.sort();
    n
}

fn vm_count(v: &Value) -> usize {
    v["virtualmachine"].as_array().map_or(0, Vec::len)
}

#[tokio::test(start_paused = true)]
async fn each_account_lists_only_its_own_clusters_and_vms() {
    let sim = start_sim(accounts()).await;
    let key = Client::new(&sim);
    let alice = client(&sim, "alice");
    assert_eq!(sim.account_keys("alice").unwrap().0, "alice-key");
    let mine = sim.cluster_id("mine").unwrap();
    let alices = sim.cluster_id("alices").unwrap();
    for listall in [vec![], vec![("listall", "true")]] {
        let r = key.ok("listKubernetesClusters", &listall).await;
        assert_eq!(names(&r), ["mine"], "{listall:?}: {r}");
        let r = alice.ok("listKubernetesClusters", &listall).await;
        assert_eq!(names(&r), ["alices"], "{listall:?}: {r}");
        // VMs: 3 of `mine`, 3 of `alices`; the project's are not listed without projectid.
        assert_eq!(vm_count(&key.ok("listVirtualMachines", &listall).await), 3);
        assert_eq!(
            vm_count(&alice.ok("listVirtualMachines", &listall).await),
            3
        );
    }
    // Another account's cluster or VM by its id: an empty list, not an error.
    let r = alice.ok("listKubernetesClusters", &[("id", &mine)]).await;
    assert_eq!(r, json!({}));
    let theirs = sim.vms(&mine)[1].0.clone();
    assert_eq!(
        alice.ok("listVirtualMachines", &[("id", &theirs)]).await,
        json!({})
    );
    // A cluster answers with its owner's account and user.
    let c = alice.cluster(&alices).await;
    assert_eq!(c["account"], "alice", "{c}");
    assert_eq!(c["virtualmachines"][0]["username"], "alice", "{c}");
    assert_eq!(key.cluster(&mine).await["account"], "admin");
}

#[tokio::test(start_paused = true)]
async fn a_root_admin_lists_every_account_with_listall_or_by_id() {
    let sim = start_sim(accounts()).await;
    let root = client(&sim, "root");
    // Its own account's only (none) without listall; every account's with it, no project's.
    assert_eq!(root.ok("listKubernetesClusters", &[]).await, json!({}));
    let r = root
        .ok("listKubernetesClusters", &[("listall", "true")])
        .await;
    assert_eq!(names(&r), ["alices", "mine"], "{r}");
    // By id: any cluster, a project's included.
    let teams = sim.cluster_id("teams").unwrap();
    let r = root.ok("listKubernetesClusters", &[("id", &teams)]).await;
    assert_eq!(names(&r), ["teams"], "{r}");
    // projectid=-1: every project's; with listall, everything.
    let r = root
        .ok("listKubernetesClusters", &[("projectid", "-1")])
        .await;
    assert_eq!(names(&r), ["teams"], "{r}");
    let r = root
        .ok(
            "listKubernetesClusters",
            &[("projectid", "-1"), ("listall", "true")],
        )
        .await;
    assert_eq!(names(&r), ["alices", "mine", "teams"], "{r}");
    // A project it is no member of: a root admin passes the project role check.
    let r = root
        .ok("listKubernetesClusters", &[("projectid", TEAM)])
        .await;
    assert_eq!(names(&r), ["teams"], "{r}");
    // It may change another account's cluster.
    let alices = sim.cluster_id("alices").unwrap();
    let job = root.scale(&[("id", &alices), ("size", "3")]).await;
    assert_eq!(job["jobstatus"], 1, "{job}");
    assert_eq!(job["account"], "root", "{job}");
}

#[tokio::test(start_paused = true)]
async fn a_project_is_listed_for_its_members_and_refused_to_others() {
    let sim = start_sim(accounts()).await;
    let key = Client::new(&sim);
    let alice = client(&sim, "alice");
    let teams = sim.cluster_id("teams").unwrap();
    let r = alice
        .ok("listKubernetesClusters", &[("projectid", TEAM)])
        .await;
    assert_eq!(names(&r), ["teams"], "{r}");
    let c = &r["kubernetescluster"][0];
    assert_eq!(
        (c["projectid"].as_str(), c["project"].as_str()),
        (Some(TEAM), Some("team"))
    );
    assert!(c.get("account").is_none(), "{c}");
    assert_eq!(
        vm_count(
            &alice
                .ok("listVirtualMachines", &[("projectid", TEAM)])
                .await
        ),
        2
    );
    let r = alice
        .ok("listKubernetesClusters", &[("projectid", "-1")])
        .await;
    assert_eq!(names(&r), ["teams"], "{r}");
    let r = alice
        .ok(
            "listKubernetesClusters",
            &[("projectid", "-1"), ("listall", "true")],
        )
        .await;
    assert_eq!(names(&r), ["alices", "teams"], "{r}");
    // The key's account is no member: refused before the command runs, whatever the command.
    for command in ["listKubernetesClusters", "listVirtualMachines"] {
        let a = key.get(command, &[("projectid", TEAM)]).await;
        assert_eq!(a.status, 432, "{command}: {}", a.text);
        assert_eq!(
            a.json()["errorresponse"]["errortext"],
            format!(
                "The API [{command}] does not exist or is not available for this account/user in project [{TEAM}]."
            )
        );
    }
    // It is in no project: -1 lists nothing.
    assert_eq!(
        key.ok("listKubernetesClusters", &[("projectid", "-1")])
            .await,
        json!({})
    );
    // A member may change the project's cluster; the job is the member's.
    let job = alice.scale(&[("id", &teams), ("size", "2")]).await;
    assert_eq!(job["jobstatus"], 1, "{job}");
    assert_eq!(job["account"], "alice", "{job}");
    assert_eq!(job["jobresult"]["kubernetescluster"]["projectid"], TEAM);
}

#[tokio::test(start_paused = true)]
async fn another_accounts_resources_are_refused_where_cloudstack_refuses_them() {
    let sim = start_sim(accounts()).await;
    let key = Client::new(&sim);
    let alice = client(&sim, "alice");
    let alices = sim.cluster_id("alices").unwrap();
    let teams = sim.cluster_id("teams").unwrap();
    // A scale request is accepted, its job fails on the caller's right; nothing changes.
    for cluster in [&alices, &teams] {
        let job = key.scale(&[("id", cluster), ("size", "5")]).await;
        assert_eq!(failure_text(&job), NO_PERMISSION, "{job}");
        assert_eq!(job["account"], "admin", "{job}");
    }
    assert_eq!(sim.cluster_json(&alices)["size"], 2);
    // A stop is refused at the call: 531, PermissionDeniedException's 4365, no job.
    let vm = sim.vms(&alices)[1].0.clone();
    for command in ["stopVirtualMachine", "startVirtualMachine"] {
        let a = key.get(command, &[("id", &vm)]).await;
        assert_eq!(a.status, 531, "{command}: {}", a.text);
        let e = &a.json()[format!("{}response", command.to_ascii_lowercase())];
        assert_eq!(
            (e["errorcode"].as_u64(), e["cserrorcode"].as_u64()),
            (Some(531), Some(4365))
        );
        assert_eq!(e["errortext"], NO_PERMISSION);
    }
    // Jobs: each account lists and reads its own.
    let mine = sim.cluster_id("mine").unwrap();
    sim.configure(|s| s.job_failure = cks_sim::JobFailure::Never);
    let job = key
        .submit("scaleKubernetesCluster", &[("id", &mine), ("size", "3")])
        .await;
    let listed = key.ok("listAsyncJobs", &[]).await;
    assert_eq!(listed["asyncjobs"][0]["jobid"], job.as_str(), "{listed}");
    assert_eq!(alice.ok("listAsyncJobs", &[]).await, json!({}));
    let a = alice.get("queryAsyncJobResult", &[("jobid", &job)]).await;
    assert_eq!(a.status, 531, "{}", a.text);
    let e = &a.json()["queryasyncjobresultresponse"];
    assert_eq!(e["cserrorcode"], 4365, "{e}");
    assert!(
        e["errortext"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Account alice is not authorized to see job id="),
        "{e}"
    );
    // A root admin reads any account's job, and lists them with listall.
    let root = client(&sim, "root");
    assert_eq!(
        root.ok("queryAsyncJobResult", &[("jobid", &job)]).await["jobstatus"],
        0
    );
    assert_eq!(root.ok("listAsyncJobs", &[]).await, json!({}));
    let all = root.ok("listAsyncJobs", &[("listall", "true")]).await;
    assert_eq!(all["count"], 1, "{all}");
}

#[tokio::test(start_paused = true)]
async fn get_api_limit_tells_the_callers_window_and_refuses_without_throttling() {
    let sim = start_sim(accounts()).await;
    let key = Client::new(&sim);
    // Off: the command refuses (UNSUPPORTED_ACTION_ERROR, under errorresponse).
    let a = key.get("getApiLimit", &[]).await;
    assert_eq!(a.status, 432, "{}", a.text);
    assert_eq!(
        a.json()["errorresponse"]["errortext"],
        "This api is only available when api.throttling.enabled = true."
    );
    sim.configure(|s| {
        s.throttling = true;
        s.throttling_max = 10;
        s.throttling_interval = std::time::Duration::from_secs(60);
    });
    key.ok("listZones", &[]).await;
    let limit = key.ok("getApiLimit", &[]).await["apilimit"].clone();
    assert_eq!(limit["account"], "admin", "{limit}");
    assert_eq!(
        (limit["apiIssued"].as_u64(), limit["apiAllowed"].as_u64()),
        (Some(2), Some(8)),
        "its own call counted: {limit}"
    );
    let left = limit["expireAfter"].as_u64().unwrap();
    assert!(left > 0 && left <= 60_000, "{limit}");
    // A root admin is never counted: nothing issued, the whole limit allowed, `expireAfter`
    // the interval in seconds (`searchApiLimit` without an entry).
    let limit = client(&sim, "root").ok("getApiLimit", &[]).await["apilimit"].clone();
    assert_eq!(
        (
            limit["apiIssued"].as_u64(),
            limit["apiAllowed"].as_u64(),
            limit["expireAfter"].as_u64()
        ),
        (Some(0), Some(10), Some(60)),
        "{limit}"
    );
    // The project role does not include it.
    sim.configure(|s| s.key_role = KeyRole::ProjectKubernetes);
    assert_eq!(key.get("getApiLimit", &[]).await.status, 432);
}

#[tokio::test(start_paused = true)]
async fn a_vm_shows_its_job_while_the_job_runs() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.vm_op_duration = std::time::Duration::from_secs(5);
    }))
    .await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let worker = sim.vms(&id)[1].0.clone();
    let job = c.submit("stopVirtualMachine", &[("id", &worker)]).await;
    let listed = c.ok("listVirtualMachines", &[("id", &worker)]).await;
    let vm = &listed["virtualmachine"][0];
    assert_eq!(
        (vm["jobid"].as_str(), vm["jobstatus"].as_u64()),
        (Some(job.as_str()), Some(0)),
        "{vm}"
    );
    let in_cluster = c.cluster(&id).await;
    let entry = in_cluster["virtualmachines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == worker.as_str())
        .cloned()
        .unwrap();
    assert_eq!(entry["jobid"], job.as_str(), "{entry}");
    // The job's result was built while it ran (alert_04): its own id, status 0. Once it has
    // ended the VM shows no job.
    let ended = c.wait_job(&job).await;
    let result = &ended["jobresult"]["virtualmachine"];
    assert_eq!(
        (result["jobid"].as_str(), result["jobstatus"].as_u64()),
        (Some(job.as_str()), Some(0)),
        "{ended}"
    );
    assert_eq!(result["state"], "Stopped");
    let vm = &c.ok("listVirtualMachines", &[("id", &worker)]).await["virtualmachine"][0];
    assert!(
        vm.get("jobid").is_none() && vm.get("jobstatus").is_none(),
        "{vm}"
    );
}
