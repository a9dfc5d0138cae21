//! Every exchange recorded with a real CloudStack 4.21.0.0 (`shared/cloudstack-4.21/`, beside
//! the repository, read in place through `cks_testkit::recorded`), replayed through the client: each recorded answer (status line, headers
//! and body, byte for byte) is served from a loopback socket to the client's real path
//! (transport, envelope, error mapping, typed parsing), and each recorded request's signature
//! is recomputed with the recorded server's throwaway keys. The recordings are the authority:
//! where the client reads them otherwise, the client is wrong.

use super::*;
use crate::jobs::{LIST_ASYNC_JOBS, job_id};
use crate::paging::ListSpec;
use crate::types::{KubernetesCluster, ListedJob, ServiceOffering, VirtualMachine};
use cks_testkit::recorded::{self, Exchange};
use std::collections::HashMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The recorded request's parameters, decoded by the client's own parser (a servlet
/// container's rules), and what the call sends besides what the client adds itself.
trait Sent {
    fn decoded(&self) -> Vec<(String, String)>;
    fn call_params(&self) -> Vec<(String, String)>;
}

impl Sent for Exchange {
    fn decoded(&self) -> Vec<(String, String)> {
        sign::parse_query(&self.raw_params())
    }

    fn call_params(&self) -> Vec<(String, String)> {
        const ADDED: [&str; 6] = [
            "command",
            "response",
            "apikey",
            "signature",
            "signatureversion",
            "expires",
        ];
        self.decoded()
            .into_iter()
            .filter(|(k, _)| !ADDED.contains(&k.to_ascii_lowercase().as_str()))
            .collect()
    }
}

/// The recorded server's keys by API key: (user, secret).
fn recorded_keys() -> HashMap<String, (String, String)> {
    recorded::users()
        .into_values()
        .map(|u| (u.api_key, (u.name, u.secret_key)))
        .collect()
}

#[test]
fn every_recorded_signature_is_recomputed_with_the_recorded_keys() {
    let keys = recorded_keys();
    // The one request signed wrongly on purpose (its answer is the 401 of a bad signature).
    const TAMPERED: &str = "errors_01_err_bad_signature";
    let (mut v2, mut v3) = (0, 0);
    for ex in recorded::exchanges() {
        let params = ex.decoded();
        let api_key = ex.param("apiKey").expect("apiKey");
        let (user, secret) = keys
            .get(&api_key)
            .unwrap_or_else(|| panic!("{}: key of no recorded user", ex.name));
        let received = ex.param("signature").expect("signature");
        let rest: Vec<(String, String)> = params
            .into_iter()
            .filter(|(k, _)| k != "signature")
            .collect();
        let ours = sign::signature(&rest, secret);
        if ex.name == TAMPERED {
            assert_ne!(ours, received, "{}: signed rightly", ex.name);
            continue;
        }
        assert_eq!(ours, received, "{} (as {user})", ex.name);
        match (ex.param("signatureVersion"), ex.param("expires")) {
            (Some(v), Some(_)) if v == "3" => v3 += 1,
            (None, None) => v2 += 1,
            // `signatureversion=3` without `expires`: its 401 is the server's check of the
            // version, not of the signature, which is right.
            (Some(_), None) => assert_eq!(ex.name, "errors_04_err_sigver3_without_expires"),
            other => panic!("{}: {other:?}", ex.name),
        }
    }
    assert_eq!(v2, 1, "the one v2 request (running_06)");
    assert!(v3 > 90, "v3 requests: {v3}");
}

/// Serves `response`, byte for byte, to every connection on a loopback port (a retried
/// request, as after a 429, gets the same bytes again).
async fn serve_bytes(responses: Vec<Vec<u8>>) -> (String, Arc<Mutex<Vec<tokio::time::Instant>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut socket, _)) = listener.accept().await {
            seen.lock().unwrap().push(tokio::time::Instant::now());
            let bytes = responses[n.min(responses.len() - 1)].clone();
            n += 1;
            tokio::spawn(async move {
                // Read the request head, then answer as Jetty did (`Connection: close`).
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => head.extend_from_slice(&buf[..k]),
                    }
                }
                let _ = socket.write_all(&bytes).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    (format!("http://{addr}/client/api"), arrivals)
}

/// A client whose every request gets `ex`'s recorded answer.
async fn client_for(ex: &Exchange) -> Client {
    let (url, _) = serve_bytes(vec![ex.response.clone()]).await;
    Client::new(test_config(&url)).unwrap()
}

/// What the client made of one answer, in a form the recording's own fields can be compared
/// with.
#[derive(Debug, PartialEq)]
enum Read {
    /// A list: its items' ids (the page's; `count` is the caller's business).
    Listed(Vec<String>),
    JobId(String),
    Job {
        jobstatus: i64,
        outcome: String,
    },
    Other,
}

const LIST_CLUSTERS: ListSpec = ListSpec {
    command: "listKubernetesClusters",
    field: "kubernetescluster",
};
const LIST_VMS: ListSpec = ListSpec {
    command: "listVirtualMachines",
    field: "virtualmachine",
};
const LIST_OFFERINGS: ListSpec = ListSpec {
    command: "listServiceOfferings",
    field: "serviceoffering",
};

/// Sends the recorded command with its recorded parameters through the client's own path for
/// that command, the answer being the recorded bytes.
async fn replay(ex: &Exchange, client: &Client) -> Result<Read, CsError> {
    let owned = ex.call_params();
    let params: Vec<(&str, String)> = owned.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let ids = |items: Vec<String>| Ok(Read::Listed(items));
    match ex.command().as_str() {
        "listKubernetesClusters" => ids(client
            .list_one_page::<KubernetesCluster>(&LIST_CLUSTERS, params)
            .await?
            .into_iter()
            .map(|c| c.id)
            .collect()),
        "listVirtualMachines" => ids(client
            .list_one_page::<VirtualMachine>(&LIST_VMS, params)
            .await?
            .into_iter()
            .map(|v| v.id)
            .collect()),
        "listServiceOfferings" => ids(client
            .list_one_page::<ServiceOffering>(&LIST_OFFERINGS, params)
            .await?
            .into_iter()
            .map(|o| o.id)
            .collect()),
        "listAsyncJobs" => ids(client
            .list_one_page::<ListedJob>(&LIST_ASYNC_JOBS, params)
            .await?
            .into_iter()
            .map(|j| j.jobid)
            .collect()),
        "queryAsyncJobResult" => {
            let job = client
                .query_job(&ex.param("jobid").unwrap_or_default())
                .await?;
            let outcome = match job.outcome() {
                JobOutcome::Pending => "pending".to_string(),
                JobOutcome::Succeeded(_) => "succeeded".to_string(),
                JobOutcome::Failed { errorcode, .. } => format!("failed {errorcode}"),
                JobOutcome::Cancelled => "cancelled".to_string(),
            };
            Ok(Read::Job {
                jobstatus: job.jobstatus,
                outcome,
            })
        }
        command @ ("scaleKubernetesCluster" | "stopVirtualMachine" | "createKubernetesCluster") => {
            let id = client.call_with(command, &params, |a| job_id(command, a));
            Ok(Read::JobId(id.await?))
        }
        // getApiLimit and the unknown command: no typed call; the envelope and error mapping
        // alone.
        other => client.call_with(other, &params, |_| Ok(Read::Other)).await,
    }
}

/// What the recording says the client must make of it.
fn expected(ex: &Exchange) -> Result<Read, (&'static str, i64, i64)> {
    let inner = ex.inner();
    let code = |k: &str| inner[k].as_i64().unwrap_or(0);
    match ex.status() {
        200 => {}
        401 => return Err(("unauthorized", 401, 0)),
        429 => return Err(("throttled", 429, code("cserrorcode"))),
        // The project role's 432 refuses the projectid sent, not the command (errors_25).
        432 if inner["errortext"]
            .as_str()
            .is_some_and(|t| t.contains("for this account/user in project")) =>
        {
            return Err(("api", 432, code("cserrorcode")));
        }
        432 => return Err(("not permitted", 432, code("cserrorcode"))),
        status => return Err(("api", i64::from(status), code("cserrorcode"))),
    }
    let listed = |field: &str, id: &str| {
        Ok(Read::Listed(
            inner[field]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .map(|i| i[id].as_str().unwrap().to_string())
                        .collect()
                })
                .unwrap_or_default(),
        ))
    };
    match ex.command().as_str() {
        "listKubernetesClusters" => listed("kubernetescluster", "id"),
        "listVirtualMachines" => listed("virtualmachine", "id"),
        "listServiceOfferings" => listed("serviceoffering", "id"),
        "listAsyncJobs" => listed("asyncjobs", "jobid"),
        "queryAsyncJobResult" => {
            let jobstatus = code("jobstatus");
            let outcome = match jobstatus {
                0 => "pending".to_string(),
                1 => "succeeded".to_string(),
                2 => format!(
                    "failed {}",
                    inner["jobresult"]["errorcode"].as_i64().unwrap()
                ),
                s => panic!("{}: jobstatus {s}", ex.name),
            };
            Ok(Read::Job { jobstatus, outcome })
        }
        "scaleKubernetesCluster" | "stopVirtualMachine" | "createKubernetesCluster" => {
            Ok(Read::JobId(inner["jobid"].as_str().unwrap().to_string()))
        }
        _ => Ok(Read::Other),
    }
}

/// The class of a client error and the codes it carries, to compare with [`expected`].
fn class(err: &CsError) -> (&'static str, i64, i64) {
    let codes_in = |detail: &str| {
        let after = |needle: &str| {
            detail
                .split(needle)
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        (after("errorcode "), after("cserrorcode "))
    };
    match err {
        CsError::Unauthorized { http_status, .. } => ("unauthorized", i64::from(*http_status), 0),
        CsError::Throttled { detail, .. } => {
            let (code, cs) = codes_in(detail);
            ("throttled", code, cs)
        }
        CsError::NotPermitted { detail, .. } => {
            let (code, cs) = codes_in(detail);
            ("not permitted", code, cs)
        }
        CsError::Api {
            errorcode,
            cserrorcode,
            ..
        } => ("api", *errorcode, *cserrorcode),
        other => panic!("an error of no CloudStack class: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn every_recorded_answer_reads_as_its_result_or_error_class() {
    let mut checked = 0;
    for ex in recorded::exchanges() {
        let got = replay(&ex, &client_for(&ex).await).await;
        match (expected(&ex), got) {
            (Ok(want), Ok(read)) => assert_eq!(read, want, "{}", ex.name),
            (Err(want), Err(err)) => {
                assert_eq!(class(&err), want, "{}: {err}", ex.name);
                // Only a throttled request is worth sending again; never a refused key.
                assert_eq!(err.is_transient(), want.0 == "throttled", "{}", ex.name);
            }
            (want, got) => panic!("{}: expected {want:?}, the client read {got:?}", ex.name),
        }
        checked += 1;
    }
    assert!(checked >= recorded::RECORDED);
}

/// The classes the recordings show, named one by one, so that a change of the mapping of one
/// of them reads as what it means to a user and not only as a table mismatch.
#[tokio::test(start_paused = true)]
async fn the_recorded_refusals_mean_what_the_provider_acts_on() {
    let by_name = recorded::by_name();
    let refusal = async |name: &str| {
        let ex = &by_name[name];
        replay(ex, &client_for(ex).await).await.expect_err(name)
    };
    // An unknown command is 4.21's one authentication answer: a refused key, not a missing
    // command (errors_12).
    assert!(matches!(
        refusal("errors_12_err_unknown_command").await,
        CsError::Unauthorized {
            http_status: 401,
            ..
        }
    ));
    // A role without stopVirtualMachine: the key may not call it, never retried (errors_14).
    let denied = refusal("errors_14_perm_bob_listonly_stopvm").await;
    assert!(denied.is_not_permitted(), "{denied}");
    // Another account's VM: a refusal of the request with PermissionDenied's code (errors_18).
    assert!(matches!(
        refusal("errors_18_perm_alice_stop_other_account_vm").await,
        CsError::Api {
            errorcode: 531,
            cserrorcode: 4365,
            ..
        }
    ));
    // A projectid naming a project the key's account is not a member of: a bad project, not a
    // command the key may not call (errors_25).
    let not_member = refusal("errors_25_project_alice_not_member").await;
    assert!(
        not_member.is_bad_project() && !not_member.is_not_permitted(),
        "{not_member}"
    );
    // An unknown projectid is a bad project (errors_24), an unknown cluster id is not
    // (errors_06).
    assert!(
        refusal("errors_24_project_listKubernetesClusters_nonexistent_projectid")
            .await
            .is_bad_project()
    );
    assert!(
        !refusal("errors_06_err_nonexistent_cluster_id")
            .await
            .is_bad_project()
    );
}

/// The recorded scale-up job's end (running_28): a failure with CloudStack's text, which the
/// provider shows the autoscaler; and the stop job's end (alert_04): the stopped VM.
#[tokio::test(start_paused = true)]
async fn recorded_job_results_parse_into_their_typed_values() {
    let by_name = recorded::by_name();
    let job = async |name: &str| {
        let ex = &by_name[name];
        let client = client_for(ex).await;
        client.query_job(&ex.param("jobid").unwrap()).await.unwrap()
    };
    match job("running_28_scale_up_size3_query_final").await.outcome() {
        JobOutcome::Failed {
            errorcode,
            errortext,
        } => {
            assert_eq!(errorcode, 530);
            assert!(
                errortext.contains("does not have desired number of nodes"),
                "{errortext}"
            );
        }
        other => panic!("{other:?}"),
    }
    let stopped = job("alert_04_stopVirtualMachine_worker_query_final").await;
    let vm = stopped.result_virtual_machine().expect("the VM");
    assert_eq!(vm.state, "Stopped");
    assert_eq!(vm.id, "72ad6fe9-ad79-4442-b413-69cac083efab");
    // Scaling to the same size is a successful job holding the cluster (running_17).
    match job("running_17_scale_err_same_size_job_final")
        .await
        .outcome()
    {
        JobOutcome::Succeeded(Some(cluster)) => assert_eq!(cluster.size, 2),
        other => panic!("{other:?}"),
    }
    // The cluster as listed: strings for numbers, no minsize/maxsize without autoscaling.
    let client = client_for(&by_name["running_01_listKubernetesClusters_running_byid"]).await;
    let cluster = client
        .get_cluster("2740365f-39d9-4f95-913a-5dbdefe47374")
        .await
        .unwrap()
        .expect("listed");
    assert_eq!(
        (cluster.state.as_str(), cluster.size, cluster.controlnodes),
        ("Running", 2, 1)
    );
    assert_eq!((cluster.minsize, cluster.maxsize), (None, None));
    assert_eq!(cluster.virtualmachines.len(), 3);
}

/// CloudStack's 429 names what is left of its window ("please retry after [9679] ms.",
/// throttle_01); the client waits that long before sending again, within its timeout, and then
/// reads the answer that follows.
#[tokio::test(start_paused = true)]
async fn a_recorded_429_is_sent_again_once_its_window_has_passed() {
    let by_name = recorded::by_name();
    let throttled = &by_name["throttle_01_throttle_alice_over_limit"];
    let listed = &by_name["running_01_listKubernetesClusters_running_byid"];
    let (url, arrivals) =
        serve_bytes(vec![throttled.response.clone(), listed.response.clone()]).await;
    let client = Client::new(test_config(&url)).unwrap();
    let cluster = client
        .get_cluster("2740365f-39d9-4f95-913a-5dbdefe47374")
        .await
        .expect("read after the wait")
        .expect("listed");
    assert_eq!(cluster.name, "cks1");
    let times = arrivals.lock().unwrap().clone();
    assert_eq!(times.len(), 2, "one try, then one as the window ended");
    assert!(
        times[1] - times[0] >= Duration::from_millis(9679),
        "sent again after {:?}",
        times[1] - times[0]
    );
    // A window longer than the timeout: the throttled answer stands, without a retry that
    // CloudStack would refuse again.
    let (url, arrivals) = serve_bytes(vec![throttled.response.clone()]).await;
    let client = Client::new(test_config(&url).with_timeout(Duration::from_secs(5))).unwrap();
    let err = client.get_cluster("x").await.unwrap_err();
    assert!(matches!(err, CsError::Throttled { .. }), "{err}");
    // Without CloudStack's word the client would have tried again after 250 ms, to be
    // refused again.
    assert_eq!(arrivals.lock().unwrap().len(), 1);
}
