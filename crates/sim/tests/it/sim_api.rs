//! The simulator's CloudStack surface: signing, errors, and response shapes.

use cks_sim::{ClusterSpec, NodesSpec, Scenario, SimConfig, VmState};
use cks_testkit::cs::*;
use cks_testkit::{API_KEY, SECRET_KEY, sim_config, sim_config_with, start_sim};

#[tokio::test(start_paused = true)]
async fn good_signature_is_accepted_by_get_and_post() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    assert_eq!(c.get("listZones", &[]).await.status, 200);
    let a = c.post("listZones", &[("name", "zone1")]).await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json()["listzonesresponse"]["count"], 1);
    // Values needing encoding (space, brackets, tilde) sign the way CloudStack rebuilds them.
    let a = c
        .get("listKubernetesClusters", &[("keyword", "de mo~[x]")])
        .await;
    assert_eq!(a.status, 200, "{}", a.text);
}

#[tokio::test(start_paused = true)]
async fn bad_missing_and_wrong_key_signatures_get_401() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let expect_401 = |a: Answer| {
        assert_eq!(a.status, 401, "{}", a.text);
        let j = a.json();
        assert_eq!(j["listzonesresponse"]["errorcode"], 401, "{j}");
        assert_eq!(
            j["listzonesresponse"]["errortext"],
            "unable to verify user credentials and/or request signature"
        );
        assert_eq!(j["listzonesresponse"]["uuidList"], serde_json::json!([]));
    };
    // Wrong secret.
    expect_401(
        Client::with_keys(&sim, API_KEY, "not-the-secret")
            .get("listZones", &[])
            .await,
    );
    // Unknown API key.
    expect_401(
        Client::with_keys(&sim, "someone-else", SECRET_KEY)
            .get("listZones", &[])
            .await,
    );
    // Missing signature.
    let url = format!(
        "{}?command=listZones&response=json&apiKey={API_KEY}",
        sim.api_url
    );
    expect_401(c.raw(&url).await.unwrap());
    // Tampered parameters: signature computed for other values.
    let q = c
        .signed_query("listZones", &[("name", "zone1")])
        .replace("name=zone1", "name=zone2");
    expect_401(c.raw(&format!("{}?{q}", sim.api_url)).await.unwrap());
    // Signature version 3 without `expires`, and with an expired one.
    expect_401(c.get("listZones", &[("signatureVersion", "3")]).await);
    expect_401(
        c.get(
            "listZones",
            &[
                ("signatureVersion", "3"),
                ("expires", "2020-01-01T00:00:00+0000"),
            ],
        )
        .await,
    );
    assert_eq!(
        c.get(
            "listZones",
            &[
                ("signatureVersion", "3"),
                ("expires", "2999-01-01T00:00:00Z")
            ]
        )
        .await
        .status,
        200
    );
}

#[tokio::test(start_paused = true)]
async fn unknown_command_is_401_and_malformed_parameters_431() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    // 4.21 answers an unknown command as any authentication failure (errors_12).
    let a = c.get("deployVirtualMachine", &[]).await;
    assert_eq!(a.status, 401);
    let e = &a.json()["errorresponse"];
    assert_eq!(e["errorcode"], 401);
    assert_eq!(e.get("cserrorcode"), None);
    assert_eq!(
        e["errortext"],
        "unable to verify user credentials and/or request signature"
    );

    let a = c
        .get(
            "scaleKubernetesCluster",
            &[("id", "not-a-uuid"), ("size", "3")],
        )
        .await;
    assert_eq!(a.status, 431, "{}", a.text);
    let e = &a.json()["scalekubernetesclusterresponse"];
    assert_eq!(e["errorcode"], 431);
    assert_eq!(e["cserrorcode"], 9999);
    assert!(
        e["errortext"]
            .as_str()
            .unwrap()
            .contains("Invalid parameter id value=not-a-uuid"),
        "{e}"
    );

    let id = sim.cluster_ids()[0].clone();
    let a = c
        .get("scaleKubernetesCluster", &[("id", &id), ("size", "three")])
        .await;
    assert_eq!(a.status, 431);
    assert!(
        a.text.contains("Invalid parameter size value=three"),
        "{}",
        a.text
    );

    let a = c.get("scaleKubernetesCluster", &[("size", "3")]).await;
    assert_eq!(a.status, 431);
    assert!(a.text.contains("due to missing parameter id"), "{}", a.text);

    // A well-formed id that names nothing is refused the same way.
    let a = c
        .get(
            "listVirtualMachines",
            &[("id", "00000000-0000-4000-8000-000000000000")],
        )
        .await;
    assert_eq!(a.status, 431, "{}", a.text);
    let a = c
        .get(
            "queryAsyncJobResult",
            &[("jobid", "00000000-0000-4000-8000-000000000000")],
        )
        .await;
    assert_eq!(a.status, 431, "{}", a.text);
}

#[tokio::test(start_paused = true)]
async fn cluster_listing_has_cloudstack_shapes() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let all = c.ok("listKubernetesClusters", &[]).await;
    assert_eq!(all["count"], 1);
    let cl = &all["kubernetescluster"][0];
    assert_eq!(cl["name"], "demo");
    assert_eq!(cl["state"], "Running");
    assert_eq!(cl["size"], 3);
    assert_eq!(cl["controlnodes"], 1);
    assert_eq!(cl["masternodes"], 1);
    assert_eq!(cl["minsize"], 1);
    assert_eq!(cl["maxsize"], 10);
    assert_eq!(cl["autoscalingenabled"], true);
    assert!(
        cl["cpunumber"].is_string() && cl["memory"].is_string(),
        "{cl}"
    );
    assert_eq!(cl["cpunumber"], "8");
    assert_eq!(cl["memory"], "16384");
    assert_eq!(cl["serviceofferingname"], "cks-medium");
    // 0 without etcd nodes, as 4.21 lists it (running_01).
    assert_eq!(cl["etcdnodes"], 0);
    assert_eq!(cl["etcdips"], serde_json::json!({}));
    let vms = cl["virtualmachines"].as_array().unwrap();
    assert_eq!(vms.len(), 4);
    for (i, vm) in vms.iter().enumerate() {
        let name = vm["name"].as_str().unwrap();
        let (prefix, hex) = name.rsplit_once('-').unwrap();
        assert_eq!(prefix, if i == 0 { "demo-control" } else { "demo-node" });
        assert_eq!(hex.len(), 11, "{name}");
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(vm["displayname"], vm["name"]);
        assert_eq!(vm["isexternalnode"], false);
        assert_eq!(vm["isetcdnode"], false);
        assert!(vm["kubernetesnodeversion"].is_string());
        assert!(vm.get("iscontrolnode").is_none());
        assert!(
            vm.get("serviceofferingid").is_none(),
            "cluster VMs carry nics details only"
        );
        assert_eq!(vm["state"], "Running");
    }
    // By name, and the empty list form.
    assert_eq!(
        c.ok("listKubernetesClusters", &[("name", "demo")]).await["count"],
        1
    );
    assert_eq!(
        c.ok("listKubernetesClusters", &[("name", "nope")]).await,
        serde_json::json!({})
    );
}

/// 4.21 shows the bounds only with autoscaling on (running_01 has neither).
#[tokio::test(start_paused = true)]
async fn minsize_and_maxsize_show_only_with_autoscaling_on() {
    for autoscaling in [false, true] {
        let mut spec = ClusterSpec::new("bounded", 1, 2);
        spec.min_size = Some(1);
        spec.max_size = Some(5);
        spec.autoscaling = autoscaling;
        let sim = start_sim(SimConfig {
            scenario: Scenario::with_cluster(spec),
            ..SimConfig::for_tests(API_KEY, SECRET_KEY)
        })
        .await;
        let cl = Client::new(&sim).cluster(&sim.cluster_ids()[0]).await;
        let bounds = (cl.get("minsize").cloned(), cl.get("maxsize").cloned());
        let want = autoscaling.then(|| (Some(1.into()), Some(5.into())));
        assert_eq!(bounds, want.unwrap_or((None, None)), "{cl}");
        sim.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn minsize_and_maxsize_are_omitted_when_unset_and_etcd_vms_are_flagged() {
    let mut spec = ClusterSpec::new("plain", 1, 2);
    spec.etcd = NodesSpec::Count(1);
    spec.external = NodesSpec::Count(1);
    let sim = start_sim(SimConfig {
        scenario: Scenario::with_cluster(spec),
        ..SimConfig::for_tests(API_KEY, SECRET_KEY)
    })
    .await;
    let c = Client::new(&sim);
    let cl = c.cluster(&sim.cluster_ids()[0]).await;
    assert!(
        cl.get("minsize").is_none() && cl.get("maxsize").is_none(),
        "{cl}"
    );
    assert_eq!(cl["autoscalingenabled"], false);
    assert_eq!(cl["etcdnodes"], 1);
    assert_eq!(cl["size"], 3, "external nodes count in size");
    let etcd: Vec<_> = cl["virtualmachines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["isetcdnode"] == true)
        .collect();
    assert_eq!(etcd.len(), 1);
    assert!(
        etcd[0]["name"]
            .as_str()
            .unwrap()
            .starts_with("plain-etcd-1-")
    );
    assert!(etcd[0].get("kubernetesnodeversion").is_none());
    let ext: Vec<_> = cl["virtualmachines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["isexternalnode"] == true)
        .collect();
    assert_eq!(ext.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn vms_offerings_zones_and_capabilities() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let cl = c.cluster(&sim.cluster_ids()[0]).await;
    let ids = vm_ids(&cl, "-node-");
    let one = c.ok("listVirtualMachines", &[("id", &ids[0])]).await;
    assert_eq!(one["count"], 1);
    let vm = &one["virtualmachine"][0];
    assert_eq!(vm["id"], ids[0].as_str());
    assert_eq!(vm["serviceofferingname"], "cks-medium");
    assert_eq!(vm["cpunumber"], 2);
    let joined = format!("{},{}", ids[0], ids[1]);
    assert_eq!(
        c.ok("listVirtualMachines", &[("ids", &joined)]).await["count"],
        2
    );
    assert_eq!(c.ok("listVirtualMachines", &[]).await["count"], 4);

    let offerings = c.ok("listServiceOfferings", &[]).await;
    assert!(offerings["count"].as_u64().unwrap() >= 3);
    let medium = offerings["serviceoffering"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "cks-medium")
        .unwrap();
    assert_eq!(medium["cpunumber"], 2);
    assert_eq!(medium["memory"], 4096);
    let by_id = c
        .ok(
            "listServiceOfferings",
            &[("id", medium["id"].as_str().unwrap())],
        )
        .await;
    assert_eq!(by_id["count"], 1);

    let zones = c.ok("listZones", &[]).await;
    assert_eq!(zones["zone"][0]["name"], "zone1");
    let caps = c.ok("listCapabilities", &[]).await;
    assert_eq!(caps["capability"]["cloudstackversion"], "4.22.0.0");
}

#[tokio::test(start_paused = true)]
async fn stop_and_start_virtual_machine_are_async_jobs() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let cid = sim.cluster_ids()[0].clone();
    let worker = vm_ids(&c.cluster(&cid).await, "-node-")[0].clone();
    let job = c.submit("stopVirtualMachine", &[("id", &worker)]).await;
    let r = c.wait_job(&job).await;
    assert_eq!(r["jobstatus"], 1, "{r}");
    assert_eq!(
        r["cmd"],
        "org.apache.cloudstack.api.command.user.vm.StopVMCmd"
    );
    assert_eq!(r["jobinstancetype"], "VirtualMachine");
    assert_eq!(r["jobresult"]["virtualmachine"]["state"], "Stopped");
    assert!(
        sim.vms(&cid)
            .iter()
            .any(|(id, _, s)| id == &worker && *s == VmState::Stopped)
    );
    let job = c.submit("startVirtualMachine", &[("id", &worker)]).await;
    assert_eq!(
        c.wait_job(&job).await["jobresult"]["virtualmachine"]["state"],
        "Running"
    );
    // Both jobs ended: a real 4.21 lists neither (`recorded/running_30_listAsyncJobs_after`),
    // and still answers queryAsyncJobResult for them.
    let jobs = c.ok("listAsyncJobs", &[]).await;
    assert!(
        jobs["asyncjobs"].as_array().is_none_or(|a| a.is_empty()),
        "{jobs}"
    );
    assert_eq!(c.wait_job(&job).await["jobstatus"], 1);
}

#[tokio::test(start_paused = true)]
async fn requests_are_recorded_without_secrets() {
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    c.get("listKubernetesClusters", &[("id", &id)]).await;
    let recorded = c.sim("simRequests", &[]).await;
    assert_eq!(
        recorded["count"], 1,
        "sim commands are not recorded: {recorded}"
    );
    let r = &recorded["request"][0];
    assert_eq!(r["command"], "listKubernetesClusters");
    assert_eq!(r["params"]["id"], id.as_str());
    assert_eq!(r["params"]["response"], "json");
    assert!(
        r["params"].get("apiKey").is_none() && r["params"].get("signature").is_none(),
        "{r}"
    );
    assert!(r["atms"].is_u64());
    assert_eq!(sim.requests().len(), 1);
    assert_eq!(c.sim("simResetRequests", &[]).await["count"], 1);
    assert!(sim.requests().is_empty());
}

#[tokio::test(start_paused = true)]
async fn list_async_jobs_keeps_running_jobs_created_since_startdate_oldest_first() {
    use std::time::Duration;
    let sim = start_sim(sim_config()).await;
    let c = Client::new(&sim);
    let cid = sim.cluster_ids()[0].clone();
    let worker = vm_ids(&c.cluster(&cid).await, "-node-")[0].clone();
    let ended = c.submit("stopVirtualMachine", &[("id", &worker)]).await;
    let ended_job = c.wait_job(&ended).await;
    // History of two days ago, ordered before the recent jobs (CloudStack orders jobs by id):
    // five ended, four still running.
    sim.add_past_jobs(&cid, 5, Duration::from_secs(48 * 3600));
    sim.add_running_jobs(&cid, 4, Duration::from_secs(48 * 3600));
    sim.configure(|s| s.job_failure = cks_sim::JobFailure::Never);
    let recent = c
        .submit("scaleKubernetesCluster", &[("id", &cid), ("size", "4")])
        .await;
    // Only running jobs are listed: an ended job is marked removed
    // (`recorded/running_26_listAsyncJobs_while_scaling` vs `running_30_listAsyncJobs_after`).
    let all = c.ok("listAsyncJobs", &[]).await;
    assert_eq!(all["count"], 5, "{all}");
    assert_eq!(
        all["asyncjobs"][4]["jobid"],
        recent.as_str(),
        "oldest first"
    );
    assert!(
        all["asyncjobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["jobstatus"] == 0 && j["jobid"] != ended.as_str()),
        "{all}"
    );
    assert_eq!(
        all["asyncjobs"][0]["cmd"],
        "org.apache.cloudstack.api.command.user.kubernetes.cluster.ScaleKubernetesClusterCmd"
    );
    // startdate is a DATE (yyyy-MM-dd): the time part is dropped, so the last second of
    // today still keeps every job of today.
    let today = &ended_job["created"].as_str().unwrap()[..10];
    for startdate in [today.to_string(), format!("{today}T23:59:59+0000")] {
        let since = c.ok("listAsyncJobs", &[("startdate", &startdate)]).await;
        assert_eq!(since["count"], 1, "{startdate}: {since}");
        assert_eq!(since["asyncjobs"][0]["jobid"], recent.as_str());
    }
    // Paging applies after the filter; count is the number matched before paging.
    let page2 = c
        .ok(
            "listAsyncJobs",
            &[
                ("startdate", "2000-01-01"),
                ("page", "2"),
                ("pagesize", "3"),
            ],
        )
        .await;
    assert_eq!(page2["count"], 5, "{page2}");
    assert_eq!(page2["asyncjobs"].as_array().unwrap().len(), 2);
    assert_eq!(page2["asyncjobs"][1]["jobid"], recent.as_str());
    // A date CloudStack cannot parse is a parameter error.
    for bad_date in ["yesterday", "2024-13-01", "20240101"] {
        let bad = c.get("listAsyncJobs", &[("startdate", bad_date)]).await;
        assert_eq!(bad.status, 431, "{}", bad.text);
        let text = bad.json()["listasyncjobsresponse"]["errortext"].clone();
        assert_eq!(
            text,
            format!(
                "Unable to parse date {bad_date} for command listasyncjobs, please pass dates in the format mentioned in the api documentation"
            ),
        );
    }
}

#[tokio::test(start_paused = true)]
async fn list_async_jobs_lists_the_jobs_of_other_clients_of_the_account() {
    let mut second = ClusterSpec::new("other", 1, 2);
    second.autoscaling = true;
    second.min_size = Some(1);
    second.max_size = Some(5);
    let sim = start_sim(sim_config_with(|c| {
        c.scenario.clusters.push(second);
    }))
    .await;
    let c = Client::new(&sim);
    let (mine, other) = (sim.cluster_ids()[0].clone(), sim.cluster_ids()[1].clone());
    let theirs = sim
        .scale_as_other_client(&other, &[("size", "3")])
        .expect("accepted");
    let own = c
        .submit("scaleKubernetesCluster", &[("id", &mine), ("size", "4")])
        .await;
    // Not a request of this client...
    assert!(
        sim.requests()
            .iter()
            .all(|r| r.params.get("id") != Some(&other)),
        "{:?}",
        sim.requests()
    );
    // ...but a job of the account, listed with this client's own, oldest first.
    let jobs = c.ok("listAsyncJobs", &[]).await;
    let ids: Vec<_> = jobs["asyncjobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["jobid"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec![theirs.clone(), own.clone()]);
    assert_eq!(c.wait_job(&theirs).await["jobstatus"], 1);
    assert_eq!(c.cluster(&other).await["size"], 3);
    // A refusal in the call itself is returned as its text.
    let refused = sim.scale_as_other_client(&other, &[("size", "many")]);
    assert!(
        refused
            .as_ref()
            .is_err_and(|t| t.contains("Invalid parameter size value=many")),
        "{refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn pagesize_above_the_default_page_size_is_refused_and_unpaged_lists_are_cut_to_it() {
    let sim = start_sim(sim_config_with(|c| {
        c.scenario = Scenario::with_cluster(ClusterSpec::new("wide", 1, 7));
        c.settings.default_page_size = 5;
    }))
    .await;
    let c = Client::new(&sim);
    for command in [
        "listKubernetesClusters",
        "listVirtualMachines",
        "listAsyncJobs",
        "listServiceOfferings",
        "listZones",
    ] {
        let a = c.get(command, &[("page", "1"), ("pagesize", "6")]).await;
        assert_eq!(a.status, 431, "{command}: {}", a.text);
        let e = &a.json()[format!("{}response", command.to_lowercase())];
        assert_eq!(e["errorcode"], 431);
        assert_eq!(e["cserrorcode"], 9999);
        assert_eq!(
            e["errortext"],
            "Page size can't exceed max allowed page size value: 5"
        );
        // page and pagesize come together (BaseListCmd.validateSpecificParameters).
        let a = c.get(command, &[("pagesize", "5")]).await;
        assert_eq!(a.status, 431, "{command}: {}", a.text);
        assert!(
            a.text
                .contains("\\\"page\\\" parameter is required when \\\"pagesize\\\" is specified"),
            "{}",
            a.text
        );
        let a = c.get(command, &[("page", "1")]).await;
        assert_eq!(a.status, 431, "{command}: {}", a.text);
        assert!(a.text.contains("parameter is required when"), "{}", a.text);
        assert_eq!(
            c.get(command, &[("page", "1"), ("pagesize", "5")])
                .await
                .status,
            200
        );
    }
    // Without pagesize a list holds default.page.size items; count says how many matched.
    let vms = c.ok("listVirtualMachines", &[]).await;
    assert_eq!(vms["virtualmachine"].as_array().unwrap().len(), 5);
    assert_eq!(vms["count"], 8);
    let rest = c
        .ok("listVirtualMachines", &[("page", "2"), ("pagesize", "5")])
        .await;
    assert_eq!(rest["virtualmachine"].as_array().unwrap().len(), 3);
    // pagesize=-1 is unlimited, but not with a page.
    let all = c.ok("listVirtualMachines", &[("pagesize", "-1")]).await;
    assert_eq!(all["virtualmachine"].as_array().unwrap().len(), 8);
    let a = c
        .get("listVirtualMachines", &[("page", "1"), ("pagesize", "-1")])
        .await;
    assert_eq!(a.status, 431);
    assert!(
        a.text
            .contains("Can't specify page parameter when pagesize is -1")
    );
    // The default is CloudStack's 500, and simConfigure changes it.
    assert_eq!(
        c.sim("simConfigure", &[("defaultpagesize", "100")]).await["defaultpagesize"],
        100
    );
    let a = c
        .get(
            "listKubernetesClusters",
            &[("page", "1"), ("pagesize", "500")],
        )
        .await;
    assert!(
        a.text.contains("max allowed page size value: 100"),
        "{}",
        a.text
    );
}

#[tokio::test(start_paused = true)]
async fn a_project_kubernetes_key_may_call_only_the_roles_commands() {
    let sim = start_sim(sim_config_with(|c| {
        c.settings.key_role = cks_sim::KeyRole::ProjectKubernetes;
    }))
    .await;
    let c = Client::new(&sim);
    let id = sim.cluster_ids()[0].clone();
    let worker = vm_ids(&c.cluster(&id).await, "-node-")[0].clone();
    assert_eq!(
        c.get("listVirtualMachines", &[("id", &worker)])
            .await
            .status,
        200
    );
    let job = c
        .submit("scaleKubernetesCluster", &[("id", &id), ("size", "4")])
        .await;
    let ended = c.wait_job(&job).await;
    assert_eq!(ended["jobstatus"], 1);
    let user = ended["userid"]
        .as_str()
        .expect("the job's user")
        .to_string();
    for command in [
        "listAsyncJobs",
        "listServiceOfferings",
        "listZones",
        "listCapabilities",
        "stopVirtualMachine",
        "startVirtualMachine",
    ] {
        let a = c.get(command, &[("id", &worker)]).await;
        assert_eq!(a.status, 432, "{command}: {}", a.text);
        // UNSUPPORTED_ACTION_ERROR is always answered under errorresponse.
        let e = &a.json()["errorresponse"];
        assert_eq!(e["errorcode"], 432, "{}", a.text);
        assert_eq!(e["cserrorcode"], 9999);
        // As 4.21 words it (errors_14): the key's user by its id.
        assert_eq!(
            e["errortext"],
            format!(
                "The API [{command}] does not exist or is not available for the account for user id [{user}]."
            )
        );
    }
    // Refused before the signature is checked, after the key is found.
    let bad_sig = Client::with_keys(&sim, API_KEY, "wrong-secret");
    assert_eq!(bad_sig.get("listZones", &[]).await.status, 432);
    assert_eq!(bad_sig.get("listVirtualMachines", &[]).await.status, 401);
    let other_key = Client::with_keys(&sim, "other-key", SECRET_KEY);
    assert_eq!(other_key.get("listZones", &[]).await.status, 401);
    // Nothing ran: the VM still runs.
    assert!(
        sim.vms(&id)
            .iter()
            .any(|(v, _, s)| v == &worker && *s == VmState::Running)
    );
    // simConfigure switches the role back.
    c.sim("simConfigure", &[("keyrole", "user")]).await;
    assert_eq!(c.get("listZones", &[]).await.status, 200);
}
