//! The store in a ConfigMap (`--state-configmap`) against a real Kubernetes API server
//! (`cks_testkit::kube`: etcd and kube-apiserver built by `tools/kube-testenv/build.sh`, found
//! through `CKS_KUBE_BIN_DIR`, or built on first use: `cks_testkit::tools`).
//!
//! The provider's identity is a ServiceAccount token bound to exactly the Role the kustomize
//! base deploys (`deploy/kustomize/base/provider-rbac.yaml`; the chart's is checked equal to it
//! by `deploy_manifests`): what passes here is what the deployed Role allows. These tests run
//! on real time: the API server is a process whose answers take real time.

use cks_autoscaler_provider::kube::{ConfigMapRef, KubeConfig, Token};
use cks_autoscaler_provider::provider::{Provider, Settings};
use cks_proto as pb;
use cks_proto::instance_status::InstanceState;
use cks_testkit::kube::KubeApiServer;
use cks_testkit::stack::*;
use cks_testkit::*;
use serde_json::{Value, json};
use std::time::Duration;

/// The ConfigMap the deployed Role names.
const CONFIGMAP: &str = "cks-autoscaler-provider-state";
/// Its data key.
const KEY: &str = "state.json";

/// Starts the API server (its binaries set up on first use: `cks_testkit::tools`).
async fn kube() -> KubeApiServer {
    KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"))
}

/// The provider's Role as the kustomize base deploys it.
fn deployed_role() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/kustomize/base/provider-rbac.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the base's provider-rbac.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    docs.into_iter()
        .find(|d| d["kind"] == "Role")
        .expect("a Role in provider-rbac.yaml")
}

/// The deployed Role without `verb`.
fn role_without(verb: &str) -> Value {
    let mut role = deployed_role();
    for rule in role["rules"].as_array_mut().expect("rules") {
        if let Some(verbs) = rule["verbs"].as_array_mut() {
            verbs.retain(|v| v != verb);
        }
    }
    role["rules"]
        .as_array_mut()
        .expect("rules")
        .retain(|r| r["verbs"].as_array().is_some_and(|v| !v.is_empty()));
    role
}

/// A token of the ServiceAccount `provider` in `ns`, bound to `role`.
async fn provider_token(kube: &KubeApiServer, ns: &str, role: &Value) -> String {
    kube.service_account_token(ns, "cks-autoscaler-provider", role)
        .await
        .expect("the provider's identity")
}

fn target(kube: &KubeApiServer, ns: &str, token: Token) -> ConfigMapRef {
    ConfigMapRef {
        namespace: ns.to_string(),
        name: CONFIGMAP.to_string(),
        api: KubeConfig {
            url: kube.url(),
            ca_pem: kube.ca_pem().as_bytes().to_vec(),
            token,
        },
    }
}

/// What the ConfigMap holds now (admin's read): its `resourceVersion` and the recorded text.
async fn stored(kube: &KubeApiServer, ns: &str) -> Option<(String, String)> {
    let (code, cm) = kube
        .request(
            reqwest::Method::GET,
            &format!("/api/v1/namespaces/{ns}/configmaps/{CONFIGMAP}"),
            None,
        )
        .await
        .expect("GET the ConfigMap");
    (code == 200).then(|| {
        (
            cm["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            cm["data"][KEY].as_str().unwrap_or_default().to_string(),
        )
    })
}

/// The store's lines of the captured log naming `ns` and containing `needle`.
fn store_lines(ns: &str, needle: &str) -> Vec<String> {
    cks_testkit::logs::lines_mentioning(&format!("configmap {ns}/{CONFIGMAP}"))
        .into_iter()
        .filter(|l| l.contains(needle))
        .collect()
}

/// `cks_provider_state_write_failures_total` now.
fn write_failures() -> f64 {
    cks_testkit::metric("cks_provider_state_write_failures_total")
}

/// A pool of 4 workers whose scale-ups run for an hour: a removal asked meanwhile stays owed
/// (recorded) while the test looks.
async fn stack(store: ConfigMapRef) -> Stack {
    let mut cfg = pool(4);
    cfg.settings.job_duration = Duration::from_secs(3600);
    cfg.settings.scale_timeout = Duration::from_secs(7200);
    Stack::refreshed(cfg, "pool", move |s| {
        s.groups[0].min = 1;
        s.state_configmap = Some(store);
    })
    .await
}

/// NodeGroupDeleteNodes of `nodes` under a long deadline, as a task the test can watch.
fn delete_later(
    env: &Stack,
    nodes: Vec<pb::ExternalGrpcNode>,
) -> tokio::task::JoinHandle<Result<(), tonic::Status>> {
    let mut client = env.client.clone();
    let req = with_deadline(
        pb::NodeGroupDeleteNodesRequest {
            nodes,
            id: env.cluster_id.clone(),
        },
        Duration::from_secs(300),
    );
    tokio::spawn(async move { client.node_group_delete_nodes(req).await.map(|_| ()) })
}

/// A removal answered OK is in the ConfigMap before the answer; a new provider reading the
/// ConfigMap (the token re-read from its file, as in a pod) takes it over: the VM stays
/// Deleting and out of the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promises_in_the_configmap_are_taken_over_by_the_next_provider() {
    let kube = kube().await;
    logs::capture();
    let ns = "store-restart";
    let token = provider_token(&kube, ns, &deployed_role()).await;
    let token_file = kube.path("provider-token");
    std::fs::write(&token_file, &token).expect("token file");
    let mut env = stack(target(&kube, ns, Token::File(token_file))).await;
    let victim = env.workers().remove(0);
    env.increase(1).await.expect("scale-up accepted");
    env.delete(vec![worker_node(&victim)])
        .await
        .expect("owed behind the scale-up");
    let (_, text) = stored(&kube, ns).await.expect("created at the first write");
    assert!(text.contains(&victim.0), "recorded before OK: {text}");

    env.restart_provider().await;
    env.refresh()
        .await
        .expect("first Refresh of the new provider");
    assert_eq!(env.target().await, 4, "no phantom node after the restart");
    let instances = env.instances().await;
    let listed = instances
        .iter()
        .find(|i| i.id.contains(&victim.0))
        .expect("the owed VM is listed");
    assert_eq!(state_of(listed), InstanceState::InstanceDeleting);
    env.shutdown().await;
}

/// Someone else writes the ConfigMap between two writes of the provider: the next write gets
/// 409 Conflict, the ConfigMap is read again, the other writer's content is left as it is, the
/// failure is logged loudly and counted, and the promise that write held is not answered OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_writer_is_reported_and_never_overwritten() {
    let kube = kube().await;
    logs::capture();
    let ns = "store-conflict";
    let token = provider_token(&kube, ns, &deployed_role()).await;
    let mut env = stack(target(&kube, ns, Token::Fixed(token))).await;
    let workers = env.workers();
    env.increase(1).await.expect("scale-up accepted");
    env.delete(vec![worker_node(&workers[0])])
        .await
        .expect("owed behind the scale-up");
    assert!(stored(&kube, ns).await.is_some(), "recorded");

    // The other writer: a PUT at the version it read (again if the provider wrote meanwhile).
    let theirs = r#"{"version": 1, "groups": {}, "written_by": "another provider"}"#;
    let mut overwritten = false;
    for _ in 0..20 {
        let (version, _) = stored(&kube, ns).await.expect("recorded");
        let (code, answer) = kube
            .request(
                reqwest::Method::PUT,
                &format!("/api/v1/namespaces/{ns}/configmaps/{CONFIGMAP}"),
                Some(&json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": CONFIGMAP, "namespace": ns, "resourceVersion": version},
                    "data": {KEY: theirs},
                })),
            )
            .await
            .expect("PUT");
        assert!(code == 200 || code == 409, "{code} {answer}");
        overwritten = code == 200;
        if overwritten {
            break;
        }
    }
    assert!(overwritten, "the other writer's PUT went through");

    let failures = write_failures();
    let pending = delete_later(&env, vec![worker_node(&workers[1])]);
    wait_until("the conflict to be logged", async || {
        !store_lines(ns, "ANOTHER WRITER").is_empty()
    })
    .await;
    assert!(write_failures() > failures, "counted");
    let line = &store_lines(ns, "ANOTHER WRITER")[0];
    assert!(
        line.contains("ERROR") && line.contains("NOT overwritten"),
        "{line}"
    );
    let (_, text) = stored(&kube, ns).await.expect("still there");
    assert_eq!(text, theirs, "the other writer's content is left as it is");
    assert!(
        !pending.is_finished(),
        "no OK for a promise it could not record"
    );
    pending.abort();
    env.shutdown().await;
}

/// The deployed Role is enough: the provider reads, creates and writes its ConfigMap. An
/// identity missing one of its verbs stops the start with an error naming the verb and the
/// resource, before anything is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_role_is_enough_and_a_missing_verb_is_named_at_start() {
    let kube = kube().await;
    let sim = start_sim(pool(2)).await;
    let cluster = sim.cluster_id("pool").expect("cluster");
    let provider = |store: ConfigMapRef| {
        let mut s: Settings = fast_settings(&cluster, 1, 5);
        s.state_configmap = Some(store);
        Provider::new(
            cks_cloudstack::Client::new(client_config(&sim)).expect("client"),
            s,
        )
    };

    let ns = "store-role";
    let token = provider_token(&kube, ns, &deployed_role()).await;
    let p = provider(target(&kube, ns, Token::Fixed(token)));
    assert_eq!(
        p.load_state().await.expect("the Role is enough to start"),
        0
    );
    p.spawn_state_writer();
    p.all_groups()
        .refresh_within(None)
        .await
        .expect("a refresh");
    // The last write, as at SIGTERM: it creates the ConfigMap.
    p.finish_state().await;
    assert!(stored(&kube, ns).await.is_some(), "created by the provider");

    for verb in ["get", "create", "update"] {
        let ns = format!("store-without-{verb}");
        let token = provider_token(&kube, &ns, &role_without(verb)).await;
        let e = provider(target(&kube, &ns, Token::Fixed(token)))
            .load_state()
            .await
            .expect_err("refused at start")
            .to_string();
        assert!(
            e.contains(&format!("may not {verb} configmaps"))
                && e.contains(&format!("{ns}/{CONFIGMAP}")),
            "{e}"
        );
    }
    sim.shutdown().await;
}

/// The API server is down when a promise must be recorded: the write fails, is counted and
/// tried again; DeleteNodes is not answered OK meanwhile, and is once the API server is back
/// and the write went through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_api_server_down_ok_waits_for_the_write() {
    let mut kube = kube().await;
    logs::capture();
    let ns = "store-down";
    let token = provider_token(&kube, ns, &deployed_role()).await;
    let mut env = stack(target(&kube, ns, Token::Fixed(token))).await;
    let victim = env.workers().remove(0);
    env.increase(1)
        .await
        .expect("scale-up accepted (and recorded)");

    kube.stop_apiserver();
    let failures = write_failures();
    let pending = delete_later(&env, vec![worker_node(&victim)]);
    wait_until("two failed writes", async || {
        store_lines(ns, "recording the promises failed").len() >= 2
    })
    .await;
    assert!(write_failures() >= failures + 2.0, "each failure counted");
    assert!(!pending.is_finished(), "no OK before the write succeeds");

    kube.restart_apiserver().await.expect("the API server back");
    let answered = tokio::time::timeout(WAIT, pending)
        .await
        .expect("answered once the write succeeds")
        .expect("the task");
    answered.expect("OK");
    let (_, text) = stored(&kube, ns).await.expect("recorded");
    assert!(text.contains(&victim.0), "{text}");
    env.shutdown().await;
}
