//! Property tests of the CloudStack client through its public API, against a loopback server
//! that answers whatever the property chose: the response parser never panics and never leaks
//! the keys or the signature, only success reaches the caller, and a scale call puts nothing on
//! the wire but the cluster id and the size, or the cluster id and the node ids.
//!
//! Each property runs a bounded number of cases (`PROPTEST_CASES` raises it).

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use cks_cloudstack::sign::{parse_query, verify_query};
use cks_cloudstack::{Client, ClientConfig, CsError};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const API_KEY: &str = "pk-3mOMTVmjUVg-X-jlWlnfaUJ9GAbBbf9EdM";
const SECRET: &str = "sk-VDaACYb0LV9eNjTetIOElcVQkvJck_J_Ql";
/// Replaced, in a canned body, by the query string of the request being answered.
const ECHO: &str = "@QUERY@";

/// `cases` unless `PROPTEST_CASES` says otherwise; no regression files in the source tree.
fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        max_shrink_time: 30_000,
        ..Config::default()
    }
}

#[derive(Default)]
struct Canned {
    status: u16,
    body: Vec<u8>,
    /// Raw query strings received, in order.
    received: Vec<String>,
}

type Shared = Arc<Mutex<Canned>>;

async fn handle(State(state): State<Shared>, RawQuery(query): RawQuery) -> Response {
    let mut canned = state.lock().unwrap();
    let query = query.unwrap_or_default();
    // A server or proxy that quotes the request it refuses: the URL carries the key and the
    // signature.
    let body = match std::str::from_utf8(&canned.body) {
        Ok(text) if text.contains(ECHO) => text.replace(ECHO, &query).into_bytes(),
        _ => canned.body.clone(),
    };
    canned.received.push(query);
    let status = StatusCode::from_u16(canned.status).unwrap_or(StatusCode::OK);
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A runtime, a loopback server answering from `Canned`, and a client pointed at it.
struct Harness {
    rt: tokio::runtime::Runtime,
    state: Shared,
    client: Client,
}

impl Harness {
    fn start() -> Harness {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state: Shared = Arc::default();
        let client = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let app = Router::new()
                .route("/client/api", get(handle))
                .with_state(state.clone());
            tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            Client::new(ClientConfig {
                api_url: format!("http://{addr}/client/api"),
                api_key: API_KEY.into(),
                secret_key: SECRET.into(),
                ssl_no_verify: false,
                ca_bundle_pem: None,
                project_id: None,
                request_timeout: Duration::from_secs(30),
                max_rps: None,
                key_source: None,
            })
            .unwrap()
        });
        Harness { rt, state, client }
    }

    /// Sets the next answer and forgets earlier requests.
    fn answer(&self, status: u16, body: Vec<u8>) {
        let mut canned = self.state.lock().unwrap();
        canned.status = status;
        canned.body = body;
        canned.received.clear();
    }

    fn received(&self) -> Vec<String> {
        self.state.lock().unwrap().received.clone()
    }
}

/// Text that must never reach an error: the keys, and the signature of every request sent.
fn secrets_in(received: &[String]) -> Vec<String> {
    let mut secrets = vec![API_KEY.to_string(), SECRET.to_string()];
    for query in received {
        for (name, value) in parse_query(query) {
            if name == "signature" {
                secrets.push(value);
            }
        }
        for part in query.split('&') {
            if let Some(raw) = part.strip_prefix("signature=") {
                secrets.push(raw.to_string());
            }
        }
    }
    secrets
}

/// Strings a careless server (or a proxy) might send back.
fn echo() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        format!("unable to verify user credentials: apiKey={API_KEY}"),
        format!("bad request /client/api?command=x&apiKey={API_KEY}&signature=abcDEF%2B%3D"),
        format!("secret {SECRET} rejected"),
        format!("GET /client/api?{ECHO} failed"),
        format!("request {ECHO}"),
        "Invalid node ids".to_string(),
        String::new(),
    ])
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let text = prop_oneof![echo(), "\\PC{0,30}"].boxed();
    let json_body = (
        prop::sample::select(
            &[
                "listkubernetesclustersresponse",
                "queryasyncjobresultresponse",
                "scalekubernetesclusterresponse",
                "listserviceofferingsresponse",
                "listasyncjobsresponse",
                "errorresponse",
                "otherresponse",
            ][..],
        ),
        prop_oneof![
            Just(json!({})),
            Just(json!({"count": 1, "kubernetescluster": [{"id": "c", "name": "k8s", "state": "Running", "size": "2"}]})),
            Just(json!({"kubernetescluster": {"id": "c"}})),
            Just(json!({"kubernetescluster": [{"id": 5}]})),
            Just(json!({"jobid": "j-1"})),
            Just(json!({"jobid": ""})),
            Just(json!({"jobid": "j-1", "jobstatus": 2, "jobresult": {"errorcode": 530, "errortext": "nope"}})),
            Just(json!({"jobid": "j-1", "jobstatus": "x"})),
            Just(json!({"count": 1, "serviceoffering": [{"id": "so", "name": "small", "cpunumber": "2", "memory": 4096}]})),
            Just(json!({"serviceoffering": 7})),
            Just(json!({"count": 1, "asyncjobs": [{"jobid": "j-1", "jobstatus": "0", "jobinstanceid": "c"}]})),
            Just(json!({"asyncjobs": [{"jobstatus": 0}]})),
            (prop_oneof![Just(json!(431)), Just(json!("530")), Just(json!("x")), Just(json!(401))], text.clone())
                .prop_map(|(code, text)| json!({"uuidList": [], "errorcode": code, "cserrorcode": 9999, "errortext": text})),
        ],
    )
        .prop_map(|(key, inner)| json!({ key: inner }).to_string().into_bytes())
        .boxed();
    prop_oneof![
        4 => json_body.clone(),
        1 => text.prop_map(|t| format!("<html><body>{t}</body></html>").into_bytes()),
        1 => (json_body, any::<prop::sample::Index>()).prop_map(|(b, i)| b[..i.index(b.len())].to_vec()),
        1 => any::<Vec<u8>>(),
        1 => Just(Vec::new()),
    ]
}

fn status() -> impl Strategy<Value = u16> {
    prop_oneof![
        6 => Just(200u16),
        1 => Just(401),
        1 => Just(431),
        1 => Just(530),
        1 => Just(502),
        1 => Just(429),
        1 => 200..600u16,
    ]
}

#[derive(Debug, Clone, Copy)]
enum Call {
    GetCluster,
    FindClusters,
    QueryJob,
    JobsPage,
    ScaleSize,
    RemoveNodes,
    ServiceOffering,
}

fn call() -> impl Strategy<Value = Call> {
    prop::sample::select(
        &[
            Call::GetCluster,
            Call::FindClusters,
            Call::QueryJob,
            Call::JobsPage,
            Call::ScaleSize,
            Call::RemoveNodes,
            Call::ServiceOffering,
        ][..],
    )
}

/// Runs `call`; `Ok(())` for any success, the error otherwise.
fn run(h: &Harness, call: Call) -> Result<(), CsError> {
    let c = &h.client;
    h.rt.block_on(async {
        match call {
            Call::GetCluster => c.get_cluster("c").await.map(drop),
            Call::FindClusters => c.find_clusters_by_name("k8s").await.map(drop),
            Call::QueryJob => c.query_job("j-1").await.map(drop),
            Call::JobsPage => c
                .list_async_jobs_page("2025-01-01T00:00:00+0000", 1)
                .await
                .map(drop),
            Call::ScaleSize => c.scale_cluster_size("c", 3).await.map(drop),
            Call::RemoveNodes => c
                .scale_cluster_remove_nodes("c", &["vm-1".to_string()])
                .await
                .map(drop),
            Call::ServiceOffering => c.get_service_offering("so").await.map(drop),
        }
    })
}

#[test]
fn any_response_is_parsed_without_panic_or_leak() {
    let h = Harness::start();
    let mut runner = TestRunner::new(config(192));
    runner
        .run(&(status(), body(), call()), |(status, body, call)| {
            h.answer(status, body.clone());
            let result = run(&h, call);
            let received = h.received();
            prop_assert!(!received.is_empty(), "nothing sent for {:?}", call);
            match &result {
                Ok(()) => {
                    prop_assert!((200..300).contains(&status), "success on HTTP {}", status);
                }
                Err(e) => {
                    let message = e.to_string();
                    for secret in secrets_in(&received) {
                        prop_assert!(
                            !message.contains(&secret),
                            "{:?} leaks {:?}: {}",
                            call,
                            secret,
                            message
                        );
                    }
                    let command = match call {
                        Call::GetCluster | Call::FindClusters => "listKubernetesClusters",
                        Call::QueryJob => "queryAsyncJobResult",
                        Call::JobsPage => "listAsyncJobs",
                        Call::ScaleSize | Call::RemoveNodes => "scaleKubernetesCluster",
                        Call::ServiceOffering => "listServiceOfferings",
                    };
                    prop_assert!(message.contains(command), "{}", message);
                    prop_assert!(!matches!(e, CsError::Config(_)), "{}", message);
                    if status == 401 {
                        prop_assert!(matches!(e, CsError::Unauthorized { .. }), "{}", message);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn scale_calls_send_only_the_cluster_id_and_the_size_or_node_ids() {
    let h = Harness::start();
    let mut runner = TestRunner::new(config(128));
    let strategy = (
        "[0-9a-f-]{1,36}",
        any::<u32>(),
        prop::collection::vec(prop_oneof!["[0-9a-f-]{1,36}", "\\PC{0,12}"], 0..4),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(cluster, size, vm_ids, by_size)| {
            h.answer(
                200,
                br#"{"scalekubernetesclusterresponse":{"jobid":"j-9"}}"#.to_vec(),
            );
            let c = &h.client;
            let result = h.rt.block_on(async {
                if by_size {
                    c.scale_cluster_size(&cluster, size).await
                } else {
                    c.scale_cluster_remove_nodes(&cluster, &vm_ids).await
                }
            });
            let received = h.received();
            if !by_size
                && (vm_ids.is_empty()
                    || vm_ids
                        .iter()
                        .any(|id| id.trim().is_empty() || id.contains(',')))
            {
                prop_assert!(matches!(result, Err(CsError::Config(_))), "{:?}", result);
                prop_assert!(received.is_empty(), "sent {:?}", received);
                return Ok(());
            }
            prop_assert_eq!(result.ok(), Some("j-9".to_string()));
            prop_assert_eq!(received.len(), 1);
            let query = &received[0];
            prop_assert!(verify_query(query, SECRET), "bad signature: {}", query);
            let mut params = parse_query(query);
            params.sort();
            let names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
            let (extra, value) = if by_size {
                ("size", size.to_string())
            } else {
                ("nodeids", vm_ids.join(","))
            };
            let mut expected = vec![
                "apiKey",
                "command",
                "expires",
                "id",
                "response",
                "signature",
                "signatureversion",
                extra,
            ];
            expected.sort_unstable();
            prop_assert_eq!(names, expected, "{}", query);
            let get = |name: &str| {
                params
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            prop_assert_eq!(get("command"), Some("scaleKubernetesCluster".to_string()));
            prop_assert_eq!(get("id"), Some(cluster));
            prop_assert_eq!(get(extra), Some(value));
            Ok(())
        })
        .unwrap();
}
