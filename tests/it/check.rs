//! `cks-autoscaler-provider check` against the simulator, as an operator runs it before
//! serving: with an account cluster's key (every command allowed), with the key CKS gives a
//! project cluster (the four required commands allowed, the optional ones refused, each with
//! what the provider loses), with a cluster the key does not list, and with a cluster in a
//! CloudStack project (listed only with `project-id`). Nothing it asks changes a cluster: no job
//! is started, the size stays.

use crate::faults::bin;
use cks_sim::{self as sim, KeyRole, Project, SimConfig};
use cks_testkit::*;
use std::process::Output;

/// Runs `check` with a cloud-config for `sim`'s keys (plus `extra` lines) and `--nodes`.
async fn run_check(sim: &sim::SimHandle, nodes: &str, extra: &str, tag: &str) -> Output {
    let config = temp_file(
        "check",
        &format!("cloud-config-{tag}.ini"),
        &format!(
            "[Global]\napi-url = {}\napi-key = {}\nsecret-key = {}\n{extra}",
            sim.api_url, sim.api_key, sim.secret_key
        ),
    );
    tokio::process::Command::new(bin())
        .arg("check")
        .arg("--cloud-config")
        .arg(&config)
        .arg("--nodes")
        .arg(nodes)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("running check")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The answer column of `command`'s row.
fn answer_of(out: &str, command: &str) -> String {
    let answer = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(command))
        .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| panic!("no row for {command} in:\n{out}"));
    // CloudStack checks the key's right to scale a cluster inside the job only: check says
    // it cannot know, and why.
    if command == "scaleKubernetesCluster" && answer == "accepted (the role is checked in the job)"
    {
        assert!(
            out.contains("check cannot know without scaling"),
            "the reason is said:\n{out}"
        );
        return "allowed".into();
    }
    answer
}

const REQUIRED: [&str; 4] = [
    "listKubernetesClusters",
    "scaleKubernetesCluster",
    "queryAsyncJobResult",
    "listVirtualMachines",
];
const OPTIONAL: [&str; 4] = [
    "listAsyncJobs",
    "listServiceOfferings",
    "listCapabilities",
    "stopVirtualMachine",
];

/// Nothing `check` sent changed the cluster: no job, the same size and state.
fn unchanged(sim: &sim::SimHandle, cluster: &str, before: &serde_json::Value) {
    let after = sim.cluster_json(cluster);
    assert_eq!(after["virtualmachines"], before["virtualmachines"]);
    assert_eq!(after["size"], before["size"]);
    assert_eq!(after["state"], before["state"]);
    assert_eq!(sim.running_jobs(cluster), 0);
}

#[tokio::test]
async fn an_account_clusters_key_may_call_every_command_and_check_passes() {
    let sim = sim::spawn(SimConfig::for_tests(API_KEY, SECRET_KEY))
        .await
        .expect("the simulator");
    let cluster = sim.cluster_id("demo").expect("the demo cluster");
    let before = sim.cluster_json(&cluster);
    let out = run_check(&sim, &format!("1:10:{cluster}"), "", "user").await;
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("listed as \"demo\""), "{t}");
    for c in REQUIRED.iter().chain(OPTIONAL.iter()) {
        assert_eq!(answer_of(&t, c), "allowed", "{c}:\n{t}");
    }
    assert!(t.contains("serve can run with this key"), "{t}");
    unchanged(&sim, &cluster, &before);
    let scaled: Vec<_> = sim
        .requests()
        .into_iter()
        .filter(|r| r.command == "scaleKubernetesCluster")
        .collect();
    assert_eq!(scaled.len(), 1, "one try, for an id that names nothing");
    assert_ne!(scaled[0].params.get("id"), Some(&cluster));
}

#[tokio::test]
async fn the_key_cks_gives_a_project_cluster_passes_and_each_refused_command_says_what_is_lost() {
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.key_role = KeyRole::ProjectKubernetes;
    let sim = sim::spawn(cfg).await.expect("the simulator");
    let cluster = sim.cluster_id("demo").expect("the demo cluster");
    let before = sim.cluster_json(&cluster);
    let out = run_check(&sim, "1:10:demo", "", "project").await;
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for c in REQUIRED {
        assert_eq!(answer_of(&t, c), "allowed", "{c}:\n{t}");
    }
    for c in OPTIONAL {
        assert_eq!(answer_of(&t, c), "refused (432)", "{c}:\n{t}");
        assert!(t.contains(&format!("without {c}: ")), "{c}:\n{t}");
    }
    assert!(t.contains("4 optional command(s) refused"), "{t}");
    unchanged(&sim, &cluster, &before);
}

#[tokio::test]
async fn a_cluster_the_key_does_not_list_fails_the_check_and_names_project_id() {
    let sim = sim::spawn(SimConfig::for_tests(API_KEY, SECRET_KEY))
        .await
        .expect("the simulator");
    let missing = "6f1d2c1e-0000-4000-8000-00000000abcd";
    let out = run_check(&sim, &format!("1:10:{missing}"), "", "missing").await;
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains(&format!("cluster id={missing}: NOT LISTED")),
        "{t}"
    );
    assert!(t.contains("set project-id in the cloud-config"), "{t}");
    // A project-id naming no project: CloudStack refuses the list for its projectid, and
    // check says so, the command itself allowed.
    let out = run_check(&sim, "1:10:nosuchname", "project-id = p-1\n", "missing-p").await;
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("cluster name=nosuchname: NOT LISTED: CloudStack refuses project-id p-1: it names no project this key is a member of"),
        "{t}"
    );
    assert!(
        t.lines()
            .any(|l| l.starts_with("listKubernetesClusters") && l.ends_with("allowed")),
        "{t}"
    );
    assert!(
        t.contains("project-id p-1 names no project this key can use"),
        "{t}"
    );
}

#[tokio::test]
async fn a_cluster_missing_from_the_configured_project_asks_whether_it_is_the_right_one() {
    let project = "2b9f6d1c-4e7a-4c35-9d08-a1f3e5b7c962";
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.project = Some(Project::new(project, "team-a").expect("a project"));
    let sim = sim::spawn(cfg).await.expect("the simulator");
    let out = run_check(
        &sim,
        "1:10:nosuchname",
        &format!("project-id = {project}\n"),
        "missing-in-p",
    )
    .await;
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains(&format!("project-id is {project}")), "{t}");
}

#[tokio::test]
async fn a_project_cluster_is_not_listed_without_project_id_and_passes_with_it() {
    let project = "2b9f6d1c-4e7a-4c35-9d08-a1f3e5b7c962";
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.key_role = KeyRole::ProjectKubernetes;
    cfg.settings.project = Some(Project::new(project, "team-a").expect("a project"));
    let sim = sim::spawn(cfg).await.expect("the simulator");
    let cluster = sim.cluster_id("demo").expect("the demo cluster");
    let before = sim.cluster_json(&cluster);

    let out = run_check(&sim, "1:10:demo", "", "in-project").await;
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("no project-id"), "{t}");
    assert!(t.contains("cluster name=demo: NOT LISTED"), "{t}");
    assert!(t.contains("set project-id in the cloud-config"), "{t}");

    sim.reset_requests();
    let out = run_check(
        &sim,
        "1:10:demo",
        &format!("project-id = {project}\n"),
        "in-project-p",
    )
    .await;
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains(&format!("project-id {project}")), "{t}");
    assert!(
        t.contains(&format!("listed as \"demo\" ({cluster})")),
        "{t}"
    );
    for c in REQUIRED {
        assert_eq!(answer_of(&t, c), "allowed", "{c}:\n{t}");
    }
    assert!(!t.contains("NOT LISTED"), "{t}");
    unchanged(&sim, &cluster, &before);
    // The list calls named the project; the others did not need to.
    for r in sim.requests() {
        let scoped = r.params.get("projectid").map(String::as_str);
        match r.command.as_str() {
            "listKubernetesClusters" | "listVirtualMachines" => {
                assert_eq!(scoped, Some(project), "{r:?}")
            }
            "scaleKubernetesCluster" | "queryAsyncJobResult" => assert_eq!(scoped, None, "{r:?}"),
            _ => {}
        }
    }
}

/// A key of another account than the cluster's: the cluster is not listed (CloudStack answers
/// an empty list, recorded: `errors_16`); with the project-id of a project the key's account is
/// not a member of, CloudStack refuses the project before the command (432, `errors_25`), and
/// check names the project-id, not a command the key may not call.
#[tokio::test]
async fn a_key_of_another_account_or_outside_the_project_is_named_as_such() {
    let project = "2b9f6d1c-4e7a-4c35-9d08-a1f3e5b7c962";
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    let mut teams = sim::ClusterSpec::new("teams", 1, 2);
    teams.project = Some("team".into());
    let mut alices = sim::ClusterSpec::new("alices", 1, 2);
    alices.account = Some("alice".into());
    cfg.scenario.clusters.extend([teams, alices]);
    cfg.scenario.accounts = vec![sim::AccountSpec::new("alice")];
    cfg.scenario.projects = vec![sim::ProjectSpec {
        id: Some(project.into()),
        name: "team".into(),
        members: vec!["alice".into()],
    }];
    let sim = sim::spawn(cfg).await.expect("the simulator");
    let out = run_check(&sim, "1:10:alices", "", "other-account").await;
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("cluster name=alices: NOT LISTED for this key"),
        "{t}"
    );
    let out = run_check(
        &sim,
        "1:10:teams",
        &format!("project-id = {project}\n"),
        "not-member",
    )
    .await;
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains(&format!(
            "cluster name=teams: NOT LISTED: CloudStack refuses project-id {project}: it names no project this key is a member of"
        )),
        "{t}"
    );
    assert_eq!(answer_of(&t, "listKubernetesClusters"), "allowed", "{t}");
    assert!(
        !t.contains("listKubernetesClusters (required) is refused"),
        "not a command the key may not call:\n{t}"
    );
}
