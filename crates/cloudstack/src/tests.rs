//! Client tests against a canned CloudStack on 127.0.0.1:0 that checks every request's
//! signature the way the management server does and answers like a real one (shapes from
//! CloudStack's own responses).

use super::client::warn_plain_http;
use super::paging::page_limit_in;
use super::types::{AsyncJob, JobOutcome};
use super::*;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod replay_4_21;
mod throttling;

const API_KEY: &str =
    "plgWJfZK4gyS3mOMTVmjUVg-X-jlWlnfaUJ9GAbBbf9EdM-kAYMmAiLqzzq1ElZLYq_u38zCm0bewzGUdP66mg";
const SECRET: &str =
    "VDaACYb0LV9eNjTetIOElcVQkvJck_J_QljX_FcHRj87ZKiy0z0ty0ZsYBkoXkY9b7eq1EhwJaw7FF3akA3KBQ";
const CLUSTER_ID: &str = "177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4";

type Params = BTreeMap<String, String>;

#[derive(Clone)]
struct Reply {
    status: u16,
    body: String,
    content_type: &'static str,
    delay: Duration,
}

fn json(status: u16, body: impl Into<String>) -> Reply {
    Reply {
        status,
        body: body.into(),
        content_type: "application/json",
        delay: Duration::ZERO,
    }
}

type Responder = Arc<dyn Fn(&Params) -> Reply + Send + Sync>;

/// One request as the canned server saw it.
#[derive(Clone, Debug)]
struct Received {
    params: Params,
    signature_ok: bool,
}

#[derive(Clone)]
struct MockState {
    responder: Responder,
    log: Arc<Mutex<Vec<Received>>>,
}

struct MockCs {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Received>>>,
}

impl MockCs {
    async fn start(responder: impl Fn(&Params) -> Reply + Send + Sync + 'static) -> MockCs {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let state = MockState {
            responder: Arc::new(responder),
            log: log.clone(),
        };
        let app = Router::new()
            .route("/client/api", get(handle))
            .with_state(state);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockCs { addr, log }
    }

    fn config(&self) -> ClientConfig {
        test_config(&format!("http://{}/client/api", self.addr))
    }

    fn client(&self) -> Client {
        Client::new(self.config()).unwrap()
    }

    fn requests(&self) -> Vec<Received> {
        self.log.lock().unwrap().clone()
    }

    /// Every signature the server received, to check none leaks into errors.
    fn signatures(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter_map(|r| r.params.get("signature").cloned())
            .collect()
    }
}

fn test_config(api_url: &str) -> ClientConfig {
    ClientConfig {
        api_url: api_url.to_string(),
        api_key: API_KEY.to_string(),
        secret_key: SECRET.to_string(),
        ssl_no_verify: false,
        ca_bundle_pem: None,
        project_id: None,
        request_timeout: Duration::from_secs(20),
        max_rps: None,
        key_source: None,
    }
}

async fn handle(State(state): State<MockState>, RawQuery(query): RawQuery) -> Response {
    let raw = query.unwrap_or_default();
    // The server-side check: rebuild the string to sign from the decoded parameters, as
    // ApiServer does (sign::verify_query is pinned to an independently computed vector).
    let params: Params = sign::parse_query(&raw).into_iter().collect();
    let signature_ok = sign::verify_query(&raw, SECRET) && unexpired(&params);
    state.log.lock().unwrap().push(Received {
        params: params.clone(),
        signature_ok,
    });
    let command = params
        .get("command")
        .cloned()
        .unwrap_or_default()
        .to_lowercase();
    if !signature_ok {
        let body = format!(
            r#"{{"{command}response":{{"uuidList":[],"errorcode":401,"errortext":"unable to verify user credentials and/or request signature"}}}}"#
        );
        return (
            StatusCode::UNAUTHORIZED,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
    }
    let reply = (state.responder)(&params);
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let status = StatusCode::from_u16(reply.status).unwrap();
    (
        status,
        [(header::CONTENT_TYPE, reply.content_type)],
        reply.body,
    )
        .into_response()
}

/// `ApiServer.verifyRequest`'s check of signature version 3: `expires` present, in the form
/// `DateUtil.parseTZDateString` reads on every release (`yyyy-MM-dd'T'HH:mm:ss'Z'Z`), and not
/// past.
fn unexpired(params: &Params) -> bool {
    if params.get("signatureversion").map(String::as_str) != Some("3") {
        return true;
    }
    expires_unix(params).is_some_and(|at| at >= wall_now())
}

/// The `expires` of a request, read as the oldest `DateUtil.parseTZDateString` reads it (a
/// literal `Z` between the time and the offset).
fn expires_unix(params: &Params) -> Option<u64> {
    let expires = params.get("expires")?;
    let (date_time, rest) = (expires.get(..19)?, expires.get(19..)?);
    types::parse_cloudstack_date(&format!("{date_time}{}", rest.strip_prefix('Z')?))
}

fn wall_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A cluster as CloudStack 4.21 lists it: numbers as strings for `cpunumber`/`memory`, one
/// control node, two workers, one dedicated etcd node, one external node.
fn realistic_cluster(id: &str, name: &str) -> serde_json::Value {
    let mut cluster = serde_json::json!({
        "id": id,
        "name": name,
        "description": name,
        "zoneid": "2b61ed5d-e8bd-431d-bf52-d127655dffab",
        "zonename": "zone1",
        "serviceofferingid": "4a3c36a6-5ff9-4ea1-b0df-8d5a9d8bbb3d",
        "serviceofferingname": "cks",
        "workerofferingid": "9c3e8f8e-0e3f-4c8b-9a3b-6f5f3c0b1e22",
        "workerofferingname": "cks-worker",
        "templateid": "b3c5e6a0-3d7e-11ec-8b2a-0242ac120002",
        "networkid": "e8d9b9a4-0e5a-4b8e-8f63-8b8f2c1a9e10",
        "associatednetworkname": "cks-cluster-network",
        "kubernetesversionid": "1d3a8b1e-4c8e-4a8b-9d5e-2f3b4c5d6e7f",
        "kubernetesversionname": "v1.28.4",
        "account": "admin",
        "domainid": "f3b7a2c4-3d7e-11ec-8b2a-0242ac120002",
        "domain": "ROOT",
        "masternodes": 1,
        "controlnodes": 1,
        "etcdnodes": 1,
        "size": "2",
        "minsize": 1,
        "maxsize": "5",
        "state": "Running",
        "cpunumber": "8",
        "memory": "8192",
        "endpoint": "https://10.0.57.163:6443/",
        "ipaddress": "10.0.57.163",
        "ipaddressid": "7a1e2b3c-4d5e-6f70-8192-a3b4c5d6e7f8",
        "autoscalingenabled": false,
        "clustertype": "CloudManaged",
        "hasannotations": false,
        "created": "2025-04-18T06:21:58+0000"
    });
    let vms = vec![
        serde_json::json!({"id": "a0000000-0000-4000-8000-000000000001", "name": format!("{name}-control-1803b55c32d"),
             "displayname": format!("{name}-control-1803b55c32d"), "state": "Running",
             "created": "2025-04-18T06:21:58+0000", "hypervisor": "KVM", "isexternalnode": false,
             "isetcdnode": false, "kubernetesnodeversion": "1.28.4",
             "nic": [{"id": "n1", "ipaddress": "10.1.1.10", "isdefault": true}],
             "details": {"controlNodeLoginUser": "cloud"}}),
        serde_json::json!({"id": "a0000000-0000-4000-8000-000000000002", "name": format!("{name}-etcd-1803b55c400"),
             "state": "Running", "isexternalnode": false, "isetcdnode": true}),
        serde_json::json!({"id": "a0000000-0000-4000-8000-000000000003", "name": format!("{name}-node-1803b55f08c"),
             "state": "Running", "isexternalnode": false, "isetcdnode": false,
             "kubernetesnodeversion": "1.28.4", "created": "2025-04-18T06:25:01+0000"}),
        serde_json::json!({"id": "a0000000-0000-4000-8000-000000000004", "name": format!("{name}-node-1803b560a11"),
             "state": "Stopped", "isexternalnode": false, "isetcdnode": false,
             "kubernetesnodeversion": "1.28.4"}),
        serde_json::json!({"id": "a0000000-0000-4000-8000-000000000005", "name": "byo-worker-1",
             "state": "Running", "isexternalnode": true, "isetcdnode": false,
             "kubernetesnodeversion": "1.28.4"}),
    ];
    cluster["virtualmachines"] = serde_json::Value::Array(vms);
    cluster
}

fn clusters_body(clusters: &[serde_json::Value], count: Option<usize>) -> String {
    let mut inner = serde_json::json!({ "kubernetescluster": clusters });
    if let Some(count) = count {
        inner["count"] = serde_json::json!(count);
    }
    serde_json::json!({ "listkubernetesclustersresponse": inner }).to_string()
}

fn error_body(command: &str, errorcode: i64, cserrorcode: i64, text: &str) -> String {
    serde_json::json!({
        format!("{}response", command.to_lowercase()): {
            "uuidList": [], "errorcode": errorcode, "cserrorcode": cserrorcode, "errortext": text
        }
    })
    .to_string()
}

/// Neither the key, the secret nor any signature the server saw may appear in `err`.
fn assert_no_secrets(err: &CsError, signatures: &[String]) {
    let shown = format!("{err} {err:?}");
    // Any 12-character piece counts, so a truncated key is caught too.
    for secret in [SECRET, API_KEY] {
        for piece in secret.as_bytes().windows(12) {
            let piece = std::str::from_utf8(piece).unwrap();
            assert!(
                !shown.contains(piece),
                "part of a key leaked ({piece}): {shown}"
            );
        }
    }
    for sig in signatures {
        assert!(!shown.contains(sig.as_str()), "signature leaked: {shown}");
        assert!(
            !shown.contains(&sign::encode_value(sig)),
            "signature leaked: {shown}"
        );
    }
}

#[tokio::test]
async fn get_cluster_parses_a_realistic_cluster_with_string_numbers() {
    let cs = MockCs::start(|p| {
        assert_eq!(
            p.get("command").map(String::as_str),
            Some("listKubernetesClusters")
        );
        json(
            200,
            clusters_body(&[realistic_cluster(CLUSTER_ID, "cks-cluster")], Some(1)),
        )
    })
    .await;
    let cluster = cs
        .client()
        .get_cluster(CLUSTER_ID)
        .await
        .unwrap()
        .expect("cluster listed");

    assert_eq!(cluster.id, CLUSTER_ID);
    assert_eq!(cluster.state, "Running");
    assert_eq!(cluster.size, 2);
    assert_eq!(cluster.controlnodes, 1);
    assert_eq!(cluster.etcdnodes, Some(1));
    assert_eq!((cluster.minsize, cluster.maxsize), (Some(1), Some(5)));
    assert_eq!(
        cluster.workerofferingid.as_deref(),
        Some("9c3e8f8e-0e3f-4c8b-9a3b-6f5f3c0b1e22")
    );
    assert_eq!(cluster.kubernetesversionname.as_deref(), Some("v1.28.4"));
    let vms = &cluster.virtualmachines;
    assert_eq!(vms.len(), 5);
    assert!(vms[0].name.contains("-control-") && !vms[0].isetcdnode && !vms[0].isexternalnode);
    assert!(vms[1].isetcdnode && vms[1].kubernetesnodeversion.is_none());
    assert_eq!(vms[3].state, "Stopped");
    assert!(vms[4].isexternalnode);
    assert_eq!(vms[2].created.as_deref(), Some("2025-04-18T06:25:01+0000"));

    let reqs = cs.requests();
    assert_eq!(reqs.len(), 1);
    assert!(reqs[0].signature_ok);
    let p = &reqs[0].params;
    assert_eq!(p.get("id").map(String::as_str), Some(CLUSTER_ID));
    assert_eq!(p.get("response").map(String::as_str), Some("json"));
    assert_eq!(p.get("apiKey").map(String::as_str), Some(API_KEY));
    assert!(!p.contains_key("projectid"));
}

#[tokio::test]
async fn project_id_is_sent_on_list_calls_but_not_on_scale() {
    let cs = MockCs::start(|p| match p.get("command").map(String::as_str) {
        Some("scaleKubernetesCluster") => {
            json(200, r#"{"scalekubernetesclusterresponse":{"jobid":"j-1"}}"#)
        }
        _ => json(200, r#"{"listkubernetesclustersresponse":{}}"#),
    })
    .await;
    let mut config = cs.config();
    config.project_id = Some("p-123".into());
    let client = Client::new(config).unwrap();
    client.find_clusters_by_name("demo").await.unwrap();
    client.get_cluster(CLUSTER_ID).await.unwrap();
    client.scale_cluster_size(CLUSTER_ID, 3).await.unwrap();
    let reqs = cs.requests();
    assert_eq!(
        reqs[0].params.get("projectid").map(String::as_str),
        Some("p-123")
    );
    assert_eq!(
        reqs[1].params.get("projectid").map(String::as_str),
        Some("p-123")
    );
    assert!(!reqs[2].params.contains_key("projectid"));
    assert!(reqs.iter().all(|r| r.signature_ok));
    // Cluster lists ask for every account's clusters the key may see; scale requests do not.
    for r in &reqs[..2] {
        assert_eq!(r.params.get("listall").map(String::as_str), Some("true"));
    }
    assert!(!reqs[2].params.contains_key("listall"));
}

#[tokio::test]
async fn empty_list_responses_are_empty_not_errors() {
    for body in [
        r#"{"listkubernetesclustersresponse":{}}"#,
        r#"{"listkubernetesclustersresponse":{"count":0}}"#,
        r#"{"listkubernetesclustersresponse":{"count":0,"kubernetescluster":[]}}"#,
    ] {
        let cs = MockCs::start(move |_| json(200, body)).await;
        let client = cs.client();
        assert!(
            client
                .find_clusters_by_name("demo")
                .await
                .unwrap()
                .is_empty(),
            "{body}"
        );
        assert_eq!(
            client.get_cluster(CLUSTER_ID).await.unwrap(),
            None,
            "{body}"
        );
        assert!(
            client.find_clusters_by_name("x").await.unwrap().is_empty(),
            "{body}"
        );
    }
}

#[tokio::test]
async fn find_by_name_keeps_exact_matches_only() {
    let cs = MockCs::start(|_| {
        json(
            200,
            clusters_body(
                &[
                    realistic_cluster(CLUSTER_ID, "prod"),
                    realistic_cluster("00000000-0000-4000-8000-0000000000ff", "prod-2"),
                ],
                Some(2),
            ),
        )
    })
    .await;
    let found = cs.client().find_clusters_by_name("prod").await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, CLUSTER_ID);
    assert_eq!(
        cs.requests()[0].params.get("name").map(String::as_str),
        Some("prod")
    );
}

#[tokio::test]
async fn error_envelopes_become_api_errors_naming_the_command() {
    let cs = MockCs::start(|p| match p.get("command").map(String::as_str) {
        Some("scaleKubernetesCluster") => json(
            431,
            error_body("scaleKubernetesCluster", 431, 4350, "Unable to execute API command scalekubernetescluster due to invalid value. Invalid parameter id value=nope due to incorrect long value format, or entity does not exist or due to incorrect parameter annotation for the field in api cmd class."),
        ),
        _ => json(530, error_body("listKubernetesClusters", 530, 4250, "Command failed due to Internal Server Error")),
    })
    .await;
    let client = cs.client();

    let err = client.scale_cluster_size("nope", 3).await.unwrap_err();
    match &err {
        CsError::Api {
            command,
            http_status,
            errorcode,
            cserrorcode,
            errortext,
        } => {
            assert_eq!(command, "scaleKubernetesCluster");
            assert_eq!((*http_status, *errorcode, *cserrorcode), (431, 431, 4350));
            assert!(errortext.contains("invalid value"));
        }
        other => panic!("expected Api, got {other:?}"),
    }
    assert!(!err.is_transient());
    assert!(err.to_string().contains("scaleKubernetesCluster"));
    assert_no_secrets(&err, &cs.signatures());

    let err = client.get_cluster(CLUSTER_ID).await.unwrap_err();
    assert!(
        matches!(
            &err,
            CsError::Api {
                errorcode: 530,
                cserrorcode: 4250,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("listKubernetesClusters"));
    assert_no_secrets(&err, &cs.signatures());
}

#[tokio::test]
async fn refused_signature_is_unauthorized() {
    let cs = MockCs::start(|_| json(200, r#"{"listkubernetesclustersresponse":{}}"#)).await;
    let mut config = cs.config();
    config.secret_key = "not-the-secret-the-server-knows".into();
    let err = Client::new(config)
        .unwrap()
        .get_cluster(CLUSTER_ID)
        .await
        .unwrap_err();
    match &err {
        CsError::Unauthorized {
            command,
            http_status,
            detail,
        } => {
            assert_eq!(command, "listKubernetesClusters");
            assert_eq!(*http_status, 401);
            assert!(detail.contains("unable to verify user credentials"));
        }
        other => panic!("expected Unauthorized, got {other:?}"),
    }
    assert!(!err.is_transient());
    assert_no_secrets(&err, &cs.signatures());
    assert!(!err.to_string().contains("not-the-secret"));
}

#[tokio::test]
async fn auth_text_in_an_error_envelope_is_unauthorized() {
    let cs = MockCs::start(|_| {
        json(
            432,
            error_body(
                "listServiceOfferings",
                432,
                9999,
                "unable to verify user credentials and/or request signature",
            ),
        )
    })
    .await;
    let err = cs.client().get_service_offering("so").await.unwrap_err();
    assert!(
        matches!(
            err,
            CsError::Unauthorized {
                http_status: 432,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn html_error_page_is_http_error_with_a_short_redacted_snippet() {
    let cs = MockCs::start(|_| Reply {
        status: 502,
        body: format!(
            "<html>\n<head><title>502 Bad Gateway</title></head>\n<body>\n<center><h1>502 Bad Gateway</h1></center>\n\
             <p>upstream failed for /client/api?apiKey={API_KEY}&amp;signature=abc%2Bdef%3D</p>{}</body></html>",
            "padding ".repeat(200)
        ),
        content_type: "text/html",
        delay: Duration::ZERO,
    })
    .await;
    let err = cs.client().get_cluster(CLUSTER_ID).await.unwrap_err();
    match &err {
        CsError::Http {
            command,
            http_status,
            snippet,
        } => {
            assert_eq!(command, "listKubernetesClusters");
            assert_eq!(*http_status, 502);
            assert!(snippet.contains("502 Bad Gateway"), "{snippet}");
            assert!(
                snippet.chars().count() <= 201,
                "snippet too long: {}",
                snippet.len()
            );
            assert!(!snippet.contains('\n'));
        }
        other => panic!("expected Http, got {other:?}"),
    }
    assert!(err.is_transient());
    assert_no_secrets(&err, &cs.signatures());
    assert!(!err.to_string().contains("abc%2Bdef"));
}

#[tokio::test]
async fn truncated_or_wrong_shaped_json_is_malformed() {
    let cases: [(&str, &str); 4] = [
        (
            r#"{"listkubernetesclustersresponse":{"count":1,"kubernetescluster":[{"id":"a","name""#,
            "invalid JSON",
        ),
        (
            r#"{"listkubernetesclustersresponse":{"count":1,"kubernetescluster":[{"name":"x","state":"Running"}]}}"#,
            "missing field `id`",
        ),
        (
            r#"{"listkubernetesclustersresponse":{"kubernetescluster":{"id":"a"}}}"#,
            "not an array",
        ),
        (
            r#"{"somethingelse":true}"#,
            "listkubernetesclustersresponse",
        ),
    ];
    for (body, expected) in cases {
        let cs = MockCs::start(move |_| json(200, body)).await;
        let err = cs.client().get_cluster(CLUSTER_ID).await.unwrap_err();
        match &err {
            CsError::Malformed { command, detail } => {
                assert_eq!(command, "listKubernetesClusters");
                assert!(detail.contains(expected), "{detail} lacks {expected}");
            }
            other => panic!("expected Malformed for {body}, got {other:?}"),
        }
        assert_no_secrets(&err, &cs.signatures());
    }
}

#[tokio::test]
async fn html_with_200_is_malformed() {
    let cs = MockCs::start(|_| Reply {
        status: 200,
        body: "<html><body>Please log in</body></html>".into(),
        content_type: "text/html",
        delay: Duration::ZERO,
    })
    .await;
    let err = cs.client().get_service_offering("so-1").await.unwrap_err();
    assert!(
        matches!(&err, CsError::Malformed { detail, .. } if detail.contains("Please log in")),
        "{err:?}"
    );
}

#[tokio::test]
async fn connection_refused_is_unreachable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = Client::new(test_config(&format!("http://{addr}/client/api"))).unwrap();
    let err = client.get_cluster(CLUSTER_ID).await.unwrap_err();
    match &err {
        CsError::Unreachable { command, detail } => {
            assert_eq!(command, "listKubernetesClusters");
            assert!(
                !detail.contains("apiKey") && !detail.contains("signature"),
                "{detail}"
            );
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    assert!(err.is_transient());
    assert_no_secrets(&err, &[]);
}

/// On paused time: the client's timeout and the server's delay are both timers of the test's
/// clock, so the 300 ms timeout fires first whatever the machine's speed.
#[tokio::test(start_paused = true)]
async fn slow_server_times_out_as_unreachable() {
    let cs = MockCs::start(|_| Reply {
        delay: Duration::from_secs(30),
        ..json(200, "{}")
    })
    .await;
    let mut config = cs.config();
    config.request_timeout = Duration::from_millis(300);
    let client = Client::new(config).unwrap();
    let started = tokio::time::Instant::now();
    let err = client.get_cluster(CLUSTER_ID).await.unwrap_err();
    // The server would answer only after 30 s.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(1),
        "took {took:?}"
    );
    match &err {
        CsError::Unreachable { detail, .. } => {
            assert!(detail.contains("no response within"), "{detail}")
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    assert_no_secrets(&err, &cs.signatures());
}

#[tokio::test]
async fn connection_dropped_mid_body_is_unreachable() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{\"listkube")
                .await;
            // Dropping the socket cuts the body short of its announced length.
        }
    });
    let client = Client::new(test_config(&format!("http://{addr}/client/api"))).unwrap();
    let err = client.get_cluster(CLUSTER_ID).await.unwrap_err();
    assert!(
        matches!(&err, CsError::Unreachable { command, .. } if command == "listKubernetesClusters"),
        "{err:?}"
    );
    assert_no_secrets(&err, &[]);
}

fn page_of(params: &Params, total: usize, with_count: bool) -> Reply {
    let page: usize = params.get("page").and_then(|p| p.parse().ok()).unwrap_or(0);
    let size: usize = params
        .get("pagesize")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    assert!(page >= 1 && size >= 1, "paging params missing: {params:?}");
    let clusters: Vec<_> = ((page - 1) * size..(page * size).min(total))
        .map(|i| {
            // One name for all: clusters of different accounts may share it.
            realistic_cluster(&format!("00000000-0000-4000-8000-{i:012}"), "paged")
        })
        .collect();
    if clusters.is_empty() {
        return json(200, r#"{"listkubernetesclustersresponse":{}}"#);
    }
    json(200, clusters_body(&clusters, with_count.then_some(total)))
}

#[tokio::test]
async fn cluster_lists_follow_pages_until_a_short_page() {
    let cs = MockCs::start(|p| page_of(p, 5, false)).await;
    let clusters = cs
        .client()
        .with_page_size(2)
        .find_clusters_by_name("paged")
        .await
        .unwrap();
    let ids: Vec<_> = clusters.iter().map(|c| &c.id[c.id.len() - 1..]).collect();
    assert_eq!(ids, ["0", "1", "2", "3", "4"]);
    let pages: Vec<_> = cs
        .requests()
        .iter()
        .map(|r| r.params["page"].clone())
        .collect();
    assert_eq!(pages, ["1", "2", "3"]);
    assert!(
        cs.requests()
            .iter()
            .all(|r| r.params["pagesize"] == "2" && r.signature_ok)
    );
}

#[tokio::test]
async fn paging_on_an_exact_multiple_ends_on_the_empty_page_or_the_count() {
    let cs = MockCs::start(|p| page_of(p, 4, false)).await;
    assert_eq!(
        cs.client()
            .with_page_size(2)
            .find_clusters_by_name("paged")
            .await
            .unwrap()
            .len(),
        4
    );
    assert_eq!(cs.requests().len(), 3, "third, empty page ends the listing");

    let cs = MockCs::start(|p| page_of(p, 4, true)).await;
    assert_eq!(
        cs.client()
            .with_page_size(2)
            .find_clusters_by_name("paged")
            .await
            .unwrap()
            .len(),
        4
    );
    assert_eq!(cs.requests().len(), 2, "count reached after two pages");
}

fn job_json(
    jobid: &str,
    status: i64,
    resultcode: i64,
    result: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut job = serde_json::json!({
        "accountid": "acc", "userid": "usr",
        "cmd": "org.apache.cloudstack.api.command.user.kubernetes.cluster.ScaleKubernetesClusterCmd",
        "jobid": jobid, "jobstatus": status, "jobprocstatus": 0, "jobresultcode": resultcode,
        "created": "2025-07-01T10:00:00+0000"
    });
    if let Some(result) = result {
        job["jobresulttype"] = serde_json::json!("object");
        job["jobresult"] = result;
    }
    job
}

#[tokio::test]
async fn query_job_reports_pending_success_and_the_alert_failure() {
    let cs = MockCs::start(|p| {
        let jobid = p.get("jobid").cloned().unwrap_or_default();
        let job = match jobid.as_str() {
            "pending" => job_json("pending", 0, 0, None),
            "done" => job_json(
                "done",
                1,
                0,
                Some(serde_json::json!({ "kubernetescluster": realistic_cluster(CLUSTER_ID, "test") })),
            ),
            _ => job_json(
                "failed",
                2,
                530,
                Some(serde_json::json!({
                    "errorcode": 530,
                    "errortext": "Kubernetes cluster test is in Alert state and can not be scaled"
                })),
            ),
        };
        json(200, serde_json::json!({ "queryasyncjobresultresponse": job }).to_string())
    })
    .await;
    let client = cs.client();

    let pending = client.query_job("pending").await.unwrap();
    assert_eq!(pending.outcome(), JobOutcome::Pending);

    match client.query_job("done").await.unwrap().outcome() {
        JobOutcome::Succeeded(Some(cluster)) => {
            assert_eq!(cluster.id, CLUSTER_ID);
            assert_eq!(cluster.size, 2);
        }
        other => panic!("expected success with cluster, got {other:?}"),
    }

    assert_eq!(
        client.query_job("failed").await.unwrap().outcome(),
        JobOutcome::Failed {
            errorcode: 530,
            errortext: "Kubernetes cluster test is in Alert state and can not be scaled".into()
        }
    );
    assert_eq!(
        cs.requests()[0].params.get("command").map(String::as_str),
        Some("queryAsyncJobResult")
    );
}

#[tokio::test]
async fn query_job_with_missing_jobstatus_is_malformed() {
    let cs = MockCs::start(|_| json(200, r#"{"queryasyncjobresultresponse":{"jobid":"j"}}"#)).await;
    let err = cs.client().query_job("j").await.unwrap_err();
    assert!(
        matches!(&err, CsError::Malformed { detail, .. } if detail.contains("jobstatus")),
        "{err:?}"
    );
}

#[tokio::test]
async fn async_jobs_are_listed_one_page_at_a_time() {
    let cs = MockCs::start(|p| {
        let page: usize = p["page"].parse().unwrap();
        let jobs: Vec<_> = match page {
            1 => vec![job_json("j1", 0, 0, None), job_json("j2", 1, 0, None)],
            2 => vec![job_json("j3", 2, 530, None)],
            _ => vec![],
        };
        json(
            200,
            serde_json::json!({ "listasyncjobsresponse": { "count": 3, "asyncjobs": jobs } })
                .to_string(),
        )
    })
    .await;
    let client = cs.client().with_page_size(2);
    let since = "2025-07-01T09:00:00+0000";
    let (jobs, more) = client.list_async_jobs_page(since, 1).await.unwrap();
    let ids: Vec<_> = jobs.iter().map(|j| j.jobid.as_str()).collect();
    assert_eq!((ids.as_slice(), more), (["j1", "j2"].as_slice(), true));
    assert!(jobs[0].is_running_scale());
    assert!(!jobs[1].is_running_scale(), "finished");
    assert_eq!(jobs[0].jobinstanceid, None, "scale jobs name no instance");
    assert_eq!(jobs[0].created_unix(), Some(1_751_364_000));
    let (jobs, more) = client.list_async_jobs_page(since, 2).await.unwrap();
    let ids: Vec<_> = jobs.iter().map(|j| j.jobid.as_str()).collect();
    assert_eq!((ids.as_slice(), more), (["j3"].as_slice(), false));
    let reqs = cs.requests();
    assert_eq!(reqs.len(), 2, "one request per page asked for");
    for (r, page) in reqs.iter().zip(["1", "2"]) {
        // A DATE: the day alone, 12 hours earlier for a server in any time zone.
        assert_eq!(r.params["startdate"], "2025-06-30");
        assert_eq!(
            (r.params["page"].as_str(), r.params["pagesize"].as_str()),
            (page, "2")
        );
        assert!(r.signature_ok);
    }
}

#[tokio::test]
async fn scale_calls_send_only_their_parameters_and_return_the_job_id() {
    let cs = MockCs::start(|_| {
        json(
            200,
            r#"{"scalekubernetesclusterresponse":{"jobid":"5a4f7c1e-job"}}"#,
        )
    })
    .await;
    let client = cs.client();
    assert_eq!(
        client.scale_cluster_size(CLUSTER_ID, 4).await.unwrap(),
        "5a4f7c1e-job"
    );
    let ids = vec!["vm-1".to_string(), "vm-2".to_string()];
    assert_eq!(
        client
            .scale_cluster_remove_nodes(CLUSTER_ID, &ids)
            .await
            .unwrap(),
        "5a4f7c1e-job"
    );

    let reqs = cs.requests();
    let keys = |r: &Received| r.params.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(&reqs[0]),
        [
            "apiKey",
            "command",
            "expires",
            "id",
            "response",
            "signature",
            "signatureversion",
            "size"
        ]
    );
    assert_eq!(reqs[0].params["size"], "4");
    assert_eq!(
        keys(&reqs[1]),
        [
            "apiKey",
            "command",
            "expires",
            "id",
            "nodeids",
            "response",
            "signature",
            "signatureversion"
        ]
    );
    assert_eq!(reqs[1].params["nodeids"], "vm-1,vm-2");
    assert!(
        reqs.iter()
            .all(|r| r.signature_ok && r.params["command"] == "scaleKubernetesCluster")
    );
}

#[tokio::test]
async fn remove_nodes_without_ids_is_refused_before_calling_cloudstack() {
    let cs =
        MockCs::start(|_| json(200, r#"{"scalekubernetesclusterresponse":{"jobid":"j"}}"#)).await;
    let err = cs
        .client()
        .scale_cluster_remove_nodes(CLUSTER_ID, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, CsError::Config(_)));
    assert!(cs.requests().is_empty());
}

#[tokio::test]
async fn scale_response_without_jobid_is_malformed() {
    let cs = MockCs::start(|_| json(200, r#"{"scalekubernetesclusterresponse":{}}"#)).await;
    let err = cs
        .client()
        .scale_cluster_size(CLUSTER_ID, 2)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CsError::Malformed { command, .. } if command == "scaleKubernetesCluster")
    );
}

#[tokio::test]
async fn offerings_parse_numbers_written_as_strings() {
    let cs = MockCs::start(|_| {
        json(
            200,
            r#"{"listserviceofferingsresponse":{"count":1,"serviceoffering":[{"id":"so-1","name":"gpu.large",
               "cpunumber":"4","memory":8192,"cpuspeed":"2000","rootdisksize":50,"gpucount":"1","gpucardname":"A10",
               "serviceofferingdetails":{"pciDevice":"Group of NVIDIA A10"}}]}}"#,
        )
    })
    .await;
    let client = cs.client();
    let offering = client.get_service_offering("so-1").await.unwrap().unwrap();
    assert_eq!(
        (offering.cpunumber, offering.memory, offering.cpuspeed),
        (Some(4), Some(8192), Some(2000))
    );
    assert_eq!(
        (offering.rootdisksize, offering.gpucount),
        (Some(50), Some(1))
    );
    assert_eq!(
        offering
            .serviceofferingdetails
            .unwrap()
            .get("pciDevice")
            .map(String::as_str),
        Some("Group of NVIDIA A10")
    );
    assert_eq!(
        cs.requests()[0].params.get("command").map(String::as_str),
        Some("listServiceOfferings")
    );
}

#[test]
fn client_construction_rejects_bad_settings() {
    for url in [
        "not a url",
        "ftp://cloud/client/api",
        "http://cloud/client/api?x=1",
    ] {
        let err = Client::new(test_config(url)).unwrap_err();
        assert!(matches!(err, CsError::Config(_)), "{url}: {err:?}");
    }
    let mut config = test_config("https://cloud.example.com/client/api");
    config.ca_bundle_pem = Some(b"this is not pem".to_vec());
    assert!(
        matches!(Client::new(config).unwrap_err(), CsError::Config(m) if m.contains("CA bundle"))
    );
    let mut config = test_config("https://cloud.example.com/client/api");
    config.request_timeout = Duration::ZERO;
    assert!(Client::new(config).is_err());
}

#[test]
fn debug_output_hides_secrets() {
    let config = test_config("https://cloud.example.com/client/api");
    let shown = format!("{config:?} {:?}", Client::new(config.clone()).unwrap());
    assert!(
        !shown.contains(SECRET) && !shown.contains(API_KEY),
        "{shown}"
    );
    assert!(shown.contains("plgW…"));
}

#[test]
fn job_outcome_falls_back_to_result_code_and_flags_unknown_status() {
    let job = |status, code, result: Option<serde_json::Value>| -> AsyncJob {
        serde_json::from_value(job_json("j", status, code, result)).unwrap()
    };
    match job(2, 533, None).outcome() {
        JobOutcome::Failed {
            errorcode,
            errortext,
        } => {
            assert_eq!(errorcode, 533);
            assert!(errortext.contains("without an error text"), "{errortext}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        job(2, 530, Some(serde_json::json!("plain text failure"))).outcome(),
        JobOutcome::Failed {
            errorcode: 530,
            errortext: "plain text failure".into()
        }
    );
    assert_eq!(job(3, 0, None).outcome(), JobOutcome::Cancelled);
    assert_eq!(job(1, 0, None).outcome(), JobOutcome::Succeeded(None));
    match job(7, 0, None).outcome() {
        JobOutcome::Failed { errortext, .. } => {
            assert!(errortext.contains("unknown status 7"), "{errortext}")
        }
        other => panic!("{other:?}"),
    }
    // jobstatus sent as a string still parses.
    let mut raw = job_json("j", 0, 0, None);
    raw["jobstatus"] = serde_json::json!("1");
    let parsed: AsyncJob = serde_json::from_value(raw).unwrap();
    assert_eq!(parsed.jobstatus, 1);
}

#[test]
fn lenient_numbers_reject_garbage() {
    let bad = serde_json::json!({"id": "x", "name": "n", "state": "Running", "size": "two"});
    let err = serde_json::from_value::<types::KubernetesCluster>(bad).unwrap_err();
    assert!(
        err.to_string().contains("\"two\" is not an integer"),
        "{err}"
    );
    let negative = serde_json::json!({"id": "x", "name": "n", "state": "Running", "size": -1});
    assert!(serde_json::from_value::<types::KubernetesCluster>(negative).is_err());
    let empty = serde_json::json!({"id": "x", "name": "n", "state": "Running", "minsize": "", "maxsize": null});
    let parsed = serde_json::from_value::<types::KubernetesCluster>(empty).unwrap();
    assert_eq!(
        (parsed.size, parsed.minsize, parsed.maxsize),
        (0, None, None)
    );
}

const TEST_CA: &str = include_str!("testdata/test-ca.pem");
const TEST_SERVER_CERT: &str = include_str!("testdata/test-server.pem");
const TEST_SERVER_KEY: &str = include_str!("testdata/test-server.key");

/// An HTTPS CloudStack stand-in whose certificate is signed by the test CA only: rustls over
/// TCP, answering every request with one service offering (HTTP/1.1, one request per
/// connection).
async fn start_tls_server() -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(TEST_SERVER_CERT.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    let key = PrivateKeyDer::from_pem_slice(TEST_SERVER_KEY.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let body = r#"{"listserviceofferingsresponse":{"count":1,"serviceoffering":[{"id":"so-1","name":"small"}]}}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn https_verifies_certificates_unless_told_otherwise() {
    let addr = start_tls_server().await;
    let url = format!("https://{addr}/client/api");

    let err = Client::new(test_config(&url))
        .unwrap()
        .get_service_offering("so-1")
        .await
        .unwrap_err();
    match &err {
        CsError::Unreachable { command, detail } => {
            assert_eq!(command, "listServiceOfferings");
            assert!(detail.to_lowercase().contains("certificate"), "{detail}");
        }
        other => panic!("an untrusted certificate must fail, got {other:?}"),
    }
    assert_no_secrets(&err, &[]);

    let mut with_ca = test_config(&url);
    with_ca.ca_bundle_pem = Some(TEST_CA.as_bytes().to_vec());
    let offering = Client::new(with_ca)
        .unwrap()
        .get_service_offering("so-1")
        .await
        .unwrap();
    assert_eq!(offering.map(|o| o.name).as_deref(), Some("small"));

    let mut no_verify = test_config(&url);
    no_verify.ssl_no_verify = true;
    let offering = Client::new(no_verify)
        .unwrap()
        .get_service_offering("so-1")
        .await
        .unwrap();
    assert_eq!(offering.map(|o| o.name).as_deref(), Some("small"));
}

#[test]
fn cloudstack_dates_read_back_as_written_whatever_the_offset() {
    use crate::types::{cloudstack_date, parse_cloudstack_date};
    for secs in [0u64, 86_399, 951_782_400, 1_751_364_000, 4_102_444_799] {
        assert_eq!(parse_cloudstack_date(&cloudstack_date(secs)), Some(secs));
    }
    assert_eq!(
        parse_cloudstack_date("2025-07-01T12:00:00+0200"),
        Some(1_751_364_000)
    );
    for bad in [
        "",
        "2025-07-01",
        "2025-13-01T10:00:00+0000",
        "2025-07-01T10:00:00Z",
    ] {
        assert_eq!(parse_cloudstack_date(bad), None, "{bad}");
    }
}

/// A 431 as `BaseListCmd.getPageSize` sends it when `pagesize` exceeds `default.page.size`.
fn page_size_refusal(command: &str, limit: usize) -> Reply {
    json(
        431,
        error_body(
            command,
            431,
            9999,
            &format!("Page size can't exceed max allowed page size value: {limit}"),
        ),
    )
}

fn pagesize(params: &Params) -> usize {
    params["pagesize"].parse().unwrap()
}

#[tokio::test]
async fn a_refused_page_size_is_learned_once_and_used_by_every_list_call() {
    let cs = MockCs::start(|p| {
        let command = p["command"].as_str();
        if pagesize(p) > 3 {
            return page_size_refusal(command, 3);
        }
        match command {
            "listAsyncJobs" => json(200, r#"{"listasyncjobsresponse":{}}"#),
            _ => page_of(p, 7, false),
        }
    })
    .await;
    let client = cs.client();
    assert_eq!(client.page_size(), 500);
    let clusters = client.find_clusters_by_name("paged").await.unwrap();
    assert_eq!(clusters.len(), 7);
    let sizes_and_pages = |from: usize| {
        cs.requests()[from..]
            .iter()
            .map(|r| (pagesize(&r.params), r.params["page"].clone()))
            .collect::<Vec<_>>()
    };
    // Refused at 500, the same page again at once with 3, then pages of 3.
    assert_eq!(
        sizes_and_pages(0),
        [
            (500, "1".to_string()),
            (3, "1".to_string()),
            (3, "2".to_string()),
            (3, "3".to_string())
        ]
    );
    assert_eq!(client.page_size(), 3);

    // A clone (the provider hands clones around) and another command use the limit at once.
    let clone = client.clone();
    let (jobs, more) = clone
        .list_async_jobs_page("2025-07-01T09:00:00+0000", 1)
        .await
        .unwrap();
    assert!(jobs.is_empty() && !more);
    assert_eq!(sizes_and_pages(4), [(3, "1".to_string())]);
    assert!(cs.requests().iter().all(|r| r.signature_ok));
}

#[tokio::test]
async fn a_job_page_refused_for_its_size_is_asked_again_at_the_limit() {
    let cs = MockCs::start(|p| {
        if pagesize(p) > 2 {
            return page_size_refusal("listAsyncJobs", 2);
        }
        let jobs = vec![job_json("j1", 0, 0, None), job_json("j2", 0, 0, None)];
        json(
            200,
            serde_json::json!({ "listasyncjobsresponse": { "count": 5, "asyncjobs": jobs } })
                .to_string(),
        )
    })
    .await;
    let (jobs, more) = cs
        .client()
        .list_async_jobs_page("2025-07-01T09:00:00+0000", 1)
        .await
        .unwrap();
    assert_eq!(jobs.len(), 2);
    assert!(
        more,
        "a full page of the learned size may be followed by another"
    );
    let sizes: Vec<_> = cs.requests().iter().map(|r| pagesize(&r.params)).collect();
    assert_eq!(sizes, [500, 2]);
}

#[tokio::test]
async fn a_limit_lowered_mid_listing_starts_the_listing_again() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    let cs = MockCs::start(move |p| {
        // The first page is accepted at 2; then the server only takes 1 (restarted with a
        // lower default.page.size).
        if seen.fetch_add(1, Ordering::SeqCst) > 0 && pagesize(p) > 1 {
            return page_size_refusal("listKubernetesClusters", 1);
        }
        page_of(p, 3, false)
    })
    .await;
    let clusters = cs
        .client()
        .with_page_size(2)
        .find_clusters_by_name("paged")
        .await
        .unwrap();
    let ids: Vec<_> = clusters.iter().map(|c| &c.id[c.id.len() - 1..]).collect();
    assert_eq!(ids, ["0", "1", "2"], "nothing twice, nothing missed");
    let asked: Vec<_> = cs
        .requests()
        .iter()
        .map(|r| (pagesize(&r.params), r.params["page"].clone()))
        .collect();
    assert_eq!(
        asked,
        [
            (2, "1".to_string()),
            (2, "2".to_string()),
            (1, "2".to_string()),
            (1, "1".to_string()),
            (1, "2".to_string()),
            (1, "3".to_string()),
            (1, "4".to_string())
        ]
    );
}

#[tokio::test]
async fn other_431s_and_limits_no_lower_are_errors_without_a_retry() {
    let cs = MockCs::start(|p| {
        if p.get("name").map(String::as_str) == Some("bad") {
            return json(
                431,
                error_body(
                    "listKubernetesClusters",
                    431,
                    4350,
                    "Unable to execute API command listkubernetesclusters due to invalid value.",
                ),
            );
        }
        // Names a limit the request already kept to.
        page_size_refusal("listKubernetesClusters", 500)
    })
    .await;
    let client = cs.client();
    let err = client.find_clusters_by_name("bad").await.unwrap_err();
    assert!(
        matches!(err, CsError::Api { errorcode: 431, .. }),
        "{err:?}"
    );
    let err = client.find_clusters_by_name("other").await.unwrap_err();
    assert!(
        matches!(err, CsError::Api { errorcode: 431, .. }),
        "{err:?}"
    );
    assert_eq!(cs.requests().len(), 2, "no retries");
    assert_eq!(client.page_size(), 500);
}

#[test]
fn page_limits_are_read_from_cloudstacks_text() {
    assert_eq!(
        page_limit_in("Page size can't exceed max allowed page size value: 100"),
        Some(100)
    );
    assert_eq!(
        page_limit_in("page size can't exceed max allowed page size value:250."),
        Some(250)
    );
    assert_eq!(
        page_limit_in("Page size can't exceed max allowed page size value: 0"),
        None
    );
    assert_eq!(
        page_limit_in("Page size can't exceed max allowed page size value: 99999999999"),
        Some(u32::MAX)
    );
    assert_eq!(page_limit_in("Unable to execute API command"), None);
}

#[tokio::test]
async fn commands_the_key_lacks_are_not_permitted_and_never_retried() {
    let cs = MockCs::start(|p| match p["command"].as_str() {
        // ApiServer / the role checker (UnavailableCommandException).
        "listAsyncJobs" => json(
            432,
            error_body(
                "listAsyncJobs",
                432,
                9999,
                "The given command does not exist or it is not available for user",
            ),
        ),
        // ApiServer.verifyRequest when the role check throws PermissionDeniedException.
        "stopVirtualMachine" => json(
            401,
            error_body(
                "stopVirtualMachine",
                401,
                9999,
                "The given command 'stopVirtualMachine' either does not exist, is not available for user.",
            ),
        ),
        _ => json(
            401,
            error_body(
                "listKubernetesClusters",
                401,
                9999,
                "unable to verify user credentials and/or request signature",
            ),
        ),
    })
    .await;
    let client = cs.client();
    let err = client
        .list_async_jobs_page("2025-07-01T09:00:00+0000", 1)
        .await
        .unwrap_err();
    match &err {
        CsError::NotPermitted { command, detail } => {
            assert_eq!(command, "listAsyncJobs");
            assert!(detail.contains("errorcode 432"), "{detail}");
        }
        other => panic!("expected NotPermitted, got {other:?}"),
    }
    assert!(err.is_not_permitted() && !err.is_transient());
    assert_no_secrets(&err, &cs.signatures());

    let err = client
        .stop_virtual_machine("vm-1", false)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CsError::NotPermitted { command, .. } if command == "stopVirtualMachine"),
        "{err:?}"
    );
    assert!(!err.is_transient());

    // A refused key stays Unauthorized.
    let err = client.get_cluster(CLUSTER_ID).await.unwrap_err();
    assert!(matches!(err, CsError::Unauthorized { .. }), "{err:?}");
    assert!(!err.is_not_permitted());
    assert_eq!(cs.requests().len(), 3, "one request each");
}

fn vm_json(id: &str, state: &str) -> serde_json::Value {
    serde_json::json!({
        "id": id, "name": format!("test-node-{id}"), "state": state,
        "displayname": "x", "account": "acc", "zoneid": "z", "cpunumber": 2, "memory": 4096,
        "nic": [], "tags": []
    })
}

#[tokio::test]
async fn virtual_machines_are_listed_by_ids_in_bounded_requests() {
    let cs = MockCs::start(|p| {
        let ids: Vec<&str> = p["ids"].split(',').collect();
        // CloudStack lists only what it knows: every id but those ending in 7.
        let vms: Vec<_> = ids
            .iter()
            .filter(|id| !id.ends_with('7'))
            .map(|id| vm_json(id, "Running"))
            .chain(std::iter::once(vm_json("not-asked", "Running")))
            .collect();
        json(
            200,
            serde_json::json!({ "listvirtualmachinesresponse": { "count": vms.len(), "virtualmachine": vms } })
                .to_string(),
        )
    })
    .await;
    let mut config = cs.config();
    config.project_id = Some("p-1".into());
    let client = Client::new(config).unwrap();

    assert!(client.list_virtual_machines(&[]).await.unwrap().is_empty());
    assert!(cs.requests().is_empty(), "no ids, no request");

    let ids: Vec<String> = (0..120).map(|i| format!("vm-{i:03}")).collect();
    let vms = client.list_virtual_machines(&ids).await.unwrap();
    assert_eq!(vms.len(), 108, "12 ids end in 7");
    assert!(
        vms.iter()
            .all(|vm| vm.state == "Running" && vm.name.starts_with("test-node-"))
    );
    assert!(!vms.iter().any(|vm| vm.id == "not-asked"));
    let reqs = cs.requests();
    let per_request: Vec<_> = reqs
        .iter()
        .map(|r| r.params["ids"].split(',').count())
        .collect();
    assert_eq!(per_request, [50, 50, 20]);
    for r in &reqs {
        assert_eq!(r.params["command"], "listVirtualMachines");
        assert_eq!(r.params["listall"], "true");
        assert_eq!(r.params["projectid"], "p-1");
        assert_eq!(r.params["page"], "1");
        assert!(r.signature_ok);
    }

    let err = client
        .list_virtual_machines(&["a,b".to_string()])
        .await
        .unwrap_err();
    assert!(matches!(err, CsError::Config(_)), "{err:?}");
    assert_eq!(cs.requests().len(), 3);
}

#[tokio::test]
async fn stop_virtual_machine_sends_forced_only_when_asked_and_returns_the_job() {
    let cs = MockCs::start(|p| match p["command"].as_str() {
        "stopVirtualMachine" => json(
            200,
            r#"{"stopvirtualmachineresponse":{"jobid":"stop-job","id":"vm-1"}}"#,
        ),
        _ => {
            let mut job = job_json(
                "stop-job",
                1,
                0,
                Some(serde_json::json!({ "virtualmachine": vm_json("vm-1", "Stopped") })),
            );
            job["cmd"] = serde_json::json!("org.apache.cloudstack.api.command.user.vm.StopVMCmd");
            json(
                200,
                serde_json::json!({ "queryasyncjobresultresponse": job }).to_string(),
            )
        }
    })
    .await;
    let client = cs.client();
    assert_eq!(
        client.stop_virtual_machine("vm-1", false).await.unwrap(),
        "stop-job"
    );
    assert_eq!(
        client.stop_virtual_machine("vm-1", true).await.unwrap(),
        "stop-job"
    );
    let reqs = cs.requests();
    assert!(!reqs[0].params.contains_key("forced"));
    assert_eq!(reqs[1].params["forced"], "true");
    for r in &reqs {
        assert_eq!(r.params["id"], "vm-1");
        assert!(!r.params.contains_key("projectid"));
        assert!(r.signature_ok);
    }
    assert!(client.stop_virtual_machine(" ", false).await.is_err());
    assert_eq!(cs.requests().len(), 2);

    let job = client.query_job("stop-job").await.unwrap();
    let vm = job.result_virtual_machine().unwrap();
    assert_eq!((vm.id.as_str(), vm.state.as_str()), ("vm-1", "Stopped"));
    assert!(!job.outcome().eq(&JobOutcome::Pending));
}

#[tokio::test]
async fn job_searches_send_a_date_and_keep_jobs_created_since_the_instant() {
    let cs = MockCs::start(|_| {
        let mut early = job_json("early", 0, 0, None);
        early["created"] = serde_json::json!("2025-07-01T08:59:59+0000");
        let mut no_date = job_json("no-date", 0, 0, None);
        no_date.as_object_mut().unwrap().remove("created");
        let jobs = vec![early, job_json("late", 0, 0, None), no_date];
        json(
            200,
            serde_json::json!({ "listasyncjobsresponse": { "count": 3, "asyncjobs": jobs } })
                .to_string(),
        )
    })
    .await;
    let client = cs.client().with_page_size(3);
    // 2025-07-01T09:00:00Z
    let (jobs, more) = client
        .list_async_jobs_since(1_751_360_400, 1)
        .await
        .unwrap();
    let ids: Vec<_> = jobs.iter().map(|j| j.jobid.as_str()).collect();
    assert_eq!(ids, ["late", "no-date"]);
    assert!(more, "the page CloudStack sent was full before filtering");
    // Just after midnight UTC: the date goes back a day, to cover servers west of UTC.
    client
        .list_async_jobs_since(1_751_328_060, 1)
        .await
        .unwrap();
    // Any other startdate is sent as it is, unfiltered.
    let (jobs, _) = client.list_async_jobs_page("2025-07-01", 1).await.unwrap();
    assert_eq!(jobs.len(), 3);
    let dates: Vec<_> = cs
        .requests()
        .iter()
        .map(|r| r.params["startdate"].clone())
        .collect();
    assert_eq!(dates, ["2025-06-30", "2025-06-30", "2025-07-01"]);
}

#[tokio::test]
async fn requests_are_signed_to_expire_shortly() {
    let cs = MockCs::start(|_| json(200, r#"{"listkubernetesclustersresponse":{}}"#)).await;
    let client = cs.client();
    assert_eq!(client.signature_expiry(), DEFAULT_SIGNATURE_EXPIRY);
    let before = wall_now();
    client.get_cluster(CLUSTER_ID).await.unwrap();
    let short = client
        .clone()
        .with_signature_expiry(Duration::from_secs(30));
    short.get_cluster(CLUSTER_ID).await.unwrap();
    let after = wall_now();
    let reqs = cs.requests();
    for (r, window) in reqs.iter().zip([300, 30]) {
        assert_eq!(r.params["signatureversion"], "3");
        let at = expires_unix(&r.params).expect("expires in the legacy TZDATE form");
        assert!(
            (before + window..=after + window).contains(&at),
            "{at} not {window}s after [{before}, {after}]"
        );
        // Both are signed: the server's check fails when either is changed.
        assert!(r.signature_ok);
    }
    let mut tampered = reqs[0].params.clone();
    tampered.insert("expires".into(), sign::expires_value(after + 86_400));
    let query: Vec<(String, String)> = tampered.into_iter().collect();
    let raw = query
        .iter()
        .map(|(k, v)| format!("{k}={}", sign::encode_value(v)))
        .collect::<Vec<_>>()
        .join("&");
    assert!(!sign::verify_query(&raw, SECRET));
    // At least a second, whatever is asked.
    assert_eq!(
        client
            .clone()
            .with_signature_expiry(Duration::ZERO)
            .signature_expiry(),
        Duration::from_secs(1)
    );
}

#[test]
fn plain_http_is_warned_about_once_per_process() {
    Client::new(test_config("http://127.0.0.1:1/client/api")).unwrap();
    Client::new(test_config("http://127.0.0.1:2/client/api")).unwrap();
    assert!(!warn_plain_http("127.0.0.1"), "already warned");
}

#[test]
fn a_refused_projectid_is_told_from_other_parameter_errors() {
    let api = |errorcode: i64, errortext: &str| CsError::Api {
        command: "listKubernetesClusters".into(),
        http_status: 431,
        errorcode,
        cserrorcode: 4350,
        errortext: errortext.into(),
    };
    for (code, text, bad) in [
        (
            431,
            "Unable to execute API command listkubernetesclusters due to invalid value. Invalid parameter projectid value=p-1 due to incorrect long value format, or entity does not exist or due to incorrect parameter annotation for the field in api cmd class.",
            true,
        ),
        (431, "Unable to find project by id 42", true),
        (531, "Account Acct[x] can't access project id=42", true),
        (
            432,
            "The API [listKubernetesClusters] does not exist or is not available for this account/user in project [cf4bc2ef-d062-427f-8a2e-45f73d41d6a6].",
            true,
        ),
        (
            432,
            "The API [stopVirtualMachine] does not exist or is not available for the account for user id [dba16e42-49e7-4abe-af92-8142a19d64fe].",
            false,
        ),
        (
            431,
            "Unable to execute API command listkubernetesclusters due to invalid value. Invalid parameter id value=x due to incorrect long value format, or entity does not exist or due to incorrect parameter annotation for the field in api cmd class.",
            false,
        ),
        (
            431,
            "Page size can't exceed max allowed page size value: 500",
            false,
        ),
        (530, "Unable to find project by id 42", false),
    ] {
        assert_eq!(api(code, text).is_bad_project(), bad, "{code} {text}");
    }
}
