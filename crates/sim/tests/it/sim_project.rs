//! Clusters in a CloudStack project: the project's resources are listed only for a call that
//! names the project (`projectid` = its id, or `-1`), an empty list otherwise; an id naming no
//! project is refused; answers name the project instead of an account; commands on one entity
//! (scale, job query, VM stop) need no `projectid`. Without a project nothing changes.

use cks_sim::{KeyRole, Project, SimConfig};
use cks_testkit::cs::*;
use cks_testkit::{sim_config, start_sim};
use serde_json::{Value, json};

const PROJECT: &str = "4a7d0c9e-52b1-4f6e-8d3a-19c2e7b5f604";
const OTHER: &str = "4a7d0c9e-52b1-4f6e-8d3a-19c2e7b5f605";

fn in_project() -> SimConfig {
    let mut cfg = sim_config();
    cfg.settings.project = Some(Project::new(PROJECT, "team-a").expect("a project"));
    cfg
}

fn clusters(v: &Value) -> Vec<Value> {
    v["kubernetescluster"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn vms(v: &Value) -> Vec<Value> {
    v["virtualmachine"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_projects_clusters_and_vms_are_listed_only_with_its_projectid() {
    let sim = start_sim(in_project()).await;
    let c = Client::new(&sim);
    let id = sim.cluster_id("demo").expect("demo cluster");

    // Without projectid: an empty list, no error (with or without an id).
    for params in [vec![], vec![("id", id.as_str())], vec![("name", "demo")]] {
        let r = c.ok("listKubernetesClusters", &params).await;
        assert_eq!(r, json!({}), "{params:?}: {r}");
    }
    assert_eq!(c.ok("listVirtualMachines", &[]).await, json!({}));

    // With the project's id (in any case) or -1: listed, owned by the project.
    for p in [
        PROJECT.to_string(),
        PROJECT.to_ascii_uppercase(),
        "-1".into(),
    ] {
        let r = c
            .ok("listKubernetesClusters", &[("projectid", &p), ("id", &id)])
            .await;
        let list = clusters(&r);
        assert_eq!(list.len(), 1, "projectid={p}: {r}");
        let cl = &list[0];
        assert_eq!(cl["projectid"], PROJECT, "{cl}");
        assert_eq!(cl["project"], "team-a", "{cl}");
        assert!(
            cl.get("account").is_none(),
            "a project's cluster names no account: {cl}"
        );
        let members = cl["virtualmachines"].as_array().expect("its VMs");
        assert!(!members.is_empty());
        for vm in members {
            assert_eq!(vm["projectid"], PROJECT, "{vm}");
            assert!(vm.get("account").is_none(), "{vm}");
        }
        let listed = vms(&c.ok("listVirtualMachines", &[("projectid", &p)]).await);
        assert_eq!(listed.len(), members.len(), "projectid={p}");
        assert!(
            listed.iter().all(|v| v["project"] == "team-a"),
            "{listed:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_projectid_naming_no_project_is_refused_as_cloudstack_does() {
    let sim = start_sim(in_project()).await;
    let c = Client::new(&sim);
    for command in ["listKubernetesClusters", "listVirtualMachines"] {
        let lower = command.to_ascii_lowercase();
        // An unknown UUID (or a word): the parameter names no entity.
        for bad in [OTHER, "p-1"] {
            let a = c.get(command, &[("projectid", bad)]).await;
            assert_eq!(a.status, 431, "{command} projectid={bad}: {}", a.text);
            let e = &a.json()[format!("{lower}response")];
            assert_eq!(e["cserrorcode"], 9999, "{e}");
            assert_eq!(
                e["errortext"],
                format!(
                    "Unable to execute API command {lower} due to invalid value. Invalid parameter projectid value={bad} due to incorrect long value format, or entity does not exist or due to incorrect parameter annotation for the field in api cmd class."
                ),
            );
        }
        // A number: taken as an internal id, and no project has it.
        let a = c.get(command, &[("projectid", "42")]).await;
        assert_eq!(a.status, 431, "{}", a.text);
        let e = &a.json()[format!("{lower}response")];
        assert_eq!(e["errortext"], "Unable to find project by id 42", "{e}");
        assert_eq!(e["cserrorcode"], 9999, "{e}");
    }
}

#[tokio::test(start_paused = true)]
async fn commands_on_one_entity_need_no_projectid() {
    let mut cfg = in_project();
    cfg.settings.key_role = KeyRole::ProjectKubernetes;
    let sim = start_sim(cfg).await;
    let c = Client::new(&sim);
    let id = sim.cluster_id("demo").expect("demo cluster");
    let job = c.scale(&[("id", id.as_str()), ("size", "4")]).await;
    assert_eq!(job["jobstatus"], 1, "{job}");
    assert_eq!(job["jobresult"]["kubernetescluster"]["size"], 4, "{job}");
    assert_eq!(
        job["jobresult"]["kubernetescluster"]["projectid"], PROJECT,
        "{job}"
    );
    assert_eq!(sim.cluster_json(&id)["size"], 4);

    // stopVirtualMachine is outside the project key's role; an account key in the project may.
    sim.configure(|s| s.key_role = KeyRole::User);
    let worker = sim.vms(&id).last().expect("a worker").0.clone();
    let stopped = c
        .wait_job(&c.submit("stopVirtualMachine", &[("id", &worker)]).await)
        .await;
    assert_eq!(stopped["jobstatus"], 1, "{stopped}");
    assert_eq!(
        stopped["jobresult"]["virtualmachine"]["state"], "Stopped",
        "{stopped}"
    );
}

#[tokio::test(start_paused = true)]
async fn sim_configure_moves_the_clusters_into_and_out_of_a_project() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    // No project: listed without projectid, owned by the account; `-1` (project resources
    // only) lists none of them, and an id naming no project is refused.
    let r = c.ok("listKubernetesClusters", &[]).await;
    assert_eq!(clusters(&r).len(), 1, "{r}");
    assert!(clusters(&r)[0]["account"].is_string(), "{r}");
    assert!(clusters(&r)[0].get("projectid").is_none(), "{r}");
    let all_projects = c.ok("listKubernetesClusters", &[("projectid", "-1")]).await;
    assert!(clusters(&all_projects).is_empty(), "{all_projects}");
    let bad = c
        .get("listKubernetesClusters", &[("projectid", OTHER)])
        .await;
    assert_eq!(bad.status, 431, "{}", bad.text);

    let echo = c
        .sim(
            "simConfigure",
            &[("projectname", "team-b"), ("projectid", PROJECT)],
        )
        .await;
    assert_eq!(
        (echo["projectid"].as_str(), echo["projectname"].as_str()),
        (Some(PROJECT), Some("team-b"))
    );
    assert_eq!(c.ok("listKubernetesClusters", &[]).await, json!({}));
    let r = c
        .ok("listKubernetesClusters", &[("projectid", PROJECT)])
        .await;
    assert_eq!(clusters(&r)[0]["project"], "team-b", "{r}");

    let bad = c
        .raw(&format!(
            "{}?command=simConfigure&response=json&projectid=p-1",
            sim.api_url
        ))
        .await
        .expect("transport");
    assert_eq!(bad.status, 431, "{}", bad.text);
    assert!(bad.text.contains("not a UUID"), "{}", bad.text);

    c.sim("simConfigure", &[("projectid", "none")]).await;
    assert_eq!(
        clusters(&c.ok("listKubernetesClusters", &[]).await).len(),
        1
    );
}
