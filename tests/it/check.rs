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

/// Runs `check` against `api_url` (with `sim`'s keys, whatever answers there) and `--nodes`.
async fn run_check_at(api_url: &str, nodes: &str, tag: &str) -> Output {
    let config = temp_file(
        "check",
        &format!("cloud-config-{tag}.ini"),
        &format!("[Global]\napi-url = {api_url}\napi-key = {API_KEY}\nsecret-key = {SECRET_KEY}\n"),
    );
    tokio::process::Command::new(bin())
        .arg("check")
        .arg("--cloud-config")
        .arg(&config)
        .arg("--nodes")
        .arg(nodes)
        .arg("--cloudstack-timeout")
        .arg("20s")
        .env("RUST_LOG", "error")
        .output()
        .await
        .expect("running check")
}

#[tokio::test]
async fn a_typo_in_the_cluster_name_names_the_cluster_meant_and_blames_no_project() {
    let sim = sim::spawn(SimConfig::for_tests(API_KEY, SECRET_KEY))
        .await
        .expect("the simulator");
    let demo = sim.cluster_id("demo").expect("the demo cluster");
    for (typo, tag) in [("dmeo", "typo"), ("Demo", "case")] {
        let out = run_check(&sim, &format!("1:10:{typo}"), "", tag).await;
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        let line = t
            .lines()
            .find(|l| l.starts_with(&format!("cluster name={typo}: NOT LISTED")))
            .unwrap_or_else(|| panic!("no line for {typo}:\n{t}"));
        assert!(
            line.contains(&format!("did you mean \"demo\" (id {demo})?")),
            "{line}"
        );
        assert!(line.contains("write MIN:MAX:demo"), "{line}");
        assert!(
            !line.contains("project"),
            "the project is not blamed: {line}"
        );
    }
    // A name nothing listed is close to: the clusters are named, and then the project.
    let out = run_check(&sim, "1:10:payments", "", "far").await;
    let t = text(&out);
    assert!(
        t.contains("cluster name=payments: NOT LISTED: this API key lists"),
        "{t}"
    );
    assert!(t.contains("\"demo\""), "{t}");
    assert!(t.contains("set project-id in the cloud-config"), "{t}");
}

/// The one line check prints about the API URL, and that it said nothing else (no command
/// was tried, no error repeated).
fn url_line(out: &Output) -> String {
    let t = text(out);
    assert!(!out.status.success(), "{t}");
    let lines: Vec<&str> = t.lines().filter(|l| l.starts_with("api-url ")).collect();
    assert_eq!(lines.len(), 1, "one line about the URL:\n{t}");
    assert!(
        t.contains("nothing else was tried") && !t.contains("listKubernetesClusters"),
        "no command table, no repeated error:\n{t}"
    );
    assert!(
        lines[0].ends_with(cks_autoscaler_provider::check::API_URL_SHAPE),
        "the URL's shape is said:\n{t}"
    );
    lines[0].to_string()
}

/// A server on loopback answering every request with `response` (raw HTTP/1.1), or, with
/// `None`, closing each connection once it has read the request; it stops with the test.
async fn raw_server(
    response: Option<String>,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let response = std::sync::Arc::new(response);
    let task = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let response = response.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                if let Some(r) = response.as_deref() {
                    let _ = sock.write_all(r.as_bytes()).await;
                    let _ = sock.shutdown().await;
                }
            });
        }
    });
    (addr, task)
}

fn html(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/html;charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn a_wrong_api_url_is_one_line_naming_the_cause_and_the_urls_shape() {
    let sim = sim::spawn(SimConfig::for_tests(API_KEY, SECRET_KEY))
        .await
        .expect("the simulator");

    // Nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let free = closed.local_addr().expect("addr");
    drop(closed);
    let line =
        url_line(&run_check_at(&format!("http://{free}/client/api"), "1:10:demo", "refused").await);
    assert!(
        line.contains(&format!("connection refused: nothing listens on {free}")),
        "{line}"
    );

    // https:// to the simulator's plain-HTTP port.
    let https = sim.api_url.replacen("http://", "https://", 1);
    let line = url_line(&run_check_at(&https, "1:10:demo", "tls-to-http").await);
    assert!(
        line.contains("api-url says https://, but")
            && line.contains("InvalidContentType")
            && line.contains(&format!("Write {}", sim.api_url)),
        "{line}"
    );

    // A port that is no HTTP server.
    let (tcp, tcp_task) = raw_server(None).await;
    let line =
        url_line(&run_check_at(&format!("http://{tcp}/client/api"), "1:10:demo", "tcp").await);
    assert!(
        line.contains(&format!(
            "{tcp} closed the connection without an HTTP answer"
        )),
        "{line}"
    );

    // The UI's address: an HTML page.
    let (ui, ui_task) = raw_server(Some(html(
        "200 OK",
        "<!DOCTYPE html><html><head><title>Apache CloudStack</title></head><body><div id=\"app\"></div></body></html>",
    )))
    .await;
    let line = url_line(&run_check_at(&format!("http://{ui}/client"), "1:10:demo", "ui").await);
    assert!(
        line.contains("/client answers with an HTML page, not CloudStack's API (the UI's address"),
        "{line}"
    );

    // A proxy's error page.
    let (proxy, proxy_task) = raw_server(Some(html(
        "502 Bad Gateway",
        "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center></body></html>",
    )))
    .await;
    let line =
        url_line(&run_check_at(&format!("http://{proxy}/client/api"), "1:10:demo", "proxy").await);
    assert!(
        line.contains("answers HTTP 502 with an HTML page")
            && line.contains("proxy forwards /client/api"),
        "{line}"
    );

    // The simulator's host and port, the wrong path.
    let wrong_path = sim.api_url.replace("/client/api", "/api");
    let line = url_line(&run_check_at(&wrong_path, "1:10:demo", "404").await);
    assert!(
        line.contains("has no page at /api (HTTP 404): CloudStack's API is at /client/api"),
        "{line}"
    );
    for task in [tcp_task, ui_task, proxy_task] {
        task.abort();
    }
}

#[tokio::test]
async fn max_plus_the_control_nodes_is_compared_with_cloudstacks_cluster_size_limit() {
    // An administrator's key reads the limit. The cluster without CKS's autoscaling, so
    // --nodes' MAX is the group's largest size.
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.key_role = KeyRole::Admin;
    cfg.settings.max_cluster_size = 10;
    cfg.scenario = cks_sim::Scenario::with_cluster(cks_sim::ClusterSpec::new("web", 1, 2));
    let sim = sim::spawn(cfg).await.expect("the simulator");
    let out = run_check(&sim, "1:10:web", "", "limit-over").await;
    let t = text(&out);
    assert!(out.status.success(), "a warning, not a failure: {t}");
    assert!(
        t.contains(
            "size limit: MAX 10 + 1 control node = 11 nodes > cloud.kubernetes.cluster.max.size 10"
        ),
        "{t}"
    );
    assert!(
        t.contains("CloudStack refuses to scale the cluster past 9 workers (its scale job fails \"Maximum cluster size can not exceed 10. Please contact your administrator\"): lower MAX in --nodes to 9, or have a CloudStack administrator set cloud.kubernetes.cluster.max.size to 11 or more"),
        "{t}"
    );
    assert!(t.contains("serve can run with this key, but:"), "{t}");
    let out = run_check(&sim, "1:9:web", "", "limit-within").await;
    let t = text(&out);
    assert!(
        t.contains("size limit: MAX 9 + 1 control node = 10 nodes, within cloud.kubernetes.cluster.max.size 10"),
        "{t}"
    );
    assert!(!t.contains(", but:"), "{t}");

    // The key CKS gives a project cluster may not read it: check says so, and what to verify.
    sim.configure(|s| s.key_role = KeyRole::ProjectKubernetes);
    let out = run_check(&sim, "1:10:web", "", "limit-unknown").await;
    let t = text(&out);
    assert!(
        t.contains("size limit: MAX 10 + 1 control node = 11 nodes > 10, CloudStack's default cloud.kubernetes.cluster.max.size (it counts control nodes); check cannot read the setting (this key may not call listConfigurations, an administrator's command): unless an administrator raised it to 11 or more"),
        "{t}"
    );
}

#[tokio::test]
async fn with_cks_autoscaling_on_its_maxsize_is_the_one_compared() {
    // The demo cluster: CKS's autoscaling on, maxsize 10, one control node.
    let mut cfg = SimConfig::for_tests(API_KEY, SECRET_KEY);
    cfg.settings.key_role = KeyRole::Admin;
    cfg.settings.max_cluster_size = 10;
    let sim = sim::spawn(cfg).await.expect("the simulator");
    let out = run_check(&sim, "1:5:demo", "", "limit-cks").await;
    let t = text(&out);
    assert!(
        t.contains("size limit: CKS's maxsize (its autoscaling is on, so its bounds win) 10 + 1 control node = 11 nodes > cloud.kubernetes.cluster.max.size 10"),
        "{t}"
    );
    assert!(t.contains("lower the cluster's maxsize in CKS"), "{t}");
}

/// `serve` says the same as `check`: the group's error (its log line and the autoscaler's
/// Refresh error carry it) names the cluster meant; asked a second time, it lists the key's
/// clusters no more (the listing is kept a while).
#[tokio::test(start_paused = true)]
async fn serve_names_the_cluster_meant_in_the_groups_error() {
    use cks_autoscaler_provider::config::{ClusterRef, NodeGroupSpec};
    use cks_autoscaler_provider::provider::{Provider, Settings};
    let sim = sim::spawn(SimConfig::for_tests(API_KEY, SECRET_KEY))
        .await
        .expect("the simulator");
    let demo = sim.cluster_id("demo").expect("the demo cluster");
    let client = cks_cloudstack::Client::new(cks_cloudstack::ClientConfig::new(
        &sim.api_url,
        API_KEY,
        SECRET_KEY,
    ))
    .expect("client");
    let provider = Provider::new(
        client,
        Settings::with_groups(vec![NodeGroupSpec {
            min: 1,
            max: 10,
            cluster: ClusterRef::Name("Demo".into()),
        }]),
    );
    let err = provider.refresh().await.expect_err("Demo is not demo");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "cluster named \"Demo\" is not listed by CloudStack: did you mean \"demo\" (id {demo})?"
        )),
        "{text}"
    );
    assert!(!text.contains("project"), "{text}");
    let lists = |sim: &sim::SimHandle, by_name: bool| {
        sim.requests()
            .into_iter()
            .filter(|r| {
                r.command == "listKubernetesClusters" && r.params.contains_key("name") == by_name
            })
            .count()
    };
    assert_eq!(lists(&sim, false), 1, "one listing of every cluster");
    // Past the failed group's backoff, a Refresh looks the name up again.
    let looked_up = lists(&sim, true);
    tokio::time::advance(std::time::Duration::from_secs(60)).await;
    let again = provider.refresh().await.expect_err("still not listed");
    assert!(
        again.to_string().contains("did you mean \"demo\""),
        "{again}"
    );
    assert!(
        lists(&sim, true) > looked_up,
        "the name was looked up again"
    );
    assert_eq!(
        lists(&sim, false),
        1,
        "the listing of every cluster is reused"
    );
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
        t.contains("cluster name=alices: NOT LISTED: this API key lists"),
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
