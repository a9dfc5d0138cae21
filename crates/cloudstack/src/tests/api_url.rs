//! What a failed call says about the API URL itself ([`CsError::api_url_problem`]), one cause
//! per test, each against a loopback server of its own (or, for DNS, a resolver of the test's
//! own: no name is looked up beyond this process): nothing listening, a port that closes
//! without answering, `https://` to a plain-HTTP port, an HTML page (the UI's address, a
//! proxy's page), a 404 for a wrong path, an untrusted certificate, and CloudStack's own
//! answers, which say nothing about the URL.

use super::*;
use crate::{Transport, UrlProblem};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A server that answers every request on its port with `response` (raw HTTP/1.1 bytes), or,
/// with `None`, closes each connection as soon as it has read the request.
async fn raw_server(response: Option<String>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let response = Arc::new(response);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let response = response.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = sock.read(&mut buf).await;
                if let Some(response) = response.as_deref() {
                    let _ = sock.write_all(response.as_bytes()).await;
                    let _ = sock.shutdown().await;
                }
            });
        }
    });
    addr
}

fn html(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn problem_at(url: &str) -> (CsError, Option<UrlProblem>) {
    let err = Client::new(test_config(url))
        .unwrap()
        .list_clusters()
        .await
        .expect_err("no CloudStack there");
    assert_no_secrets(&err, &[]);
    let problem = err.api_url_problem();
    (err, problem)
}

#[tokio::test]
async fn nothing_listening_is_a_refused_connection() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let (err, problem) = problem_at(&format!("http://{addr}/client/api")).await;
    assert_eq!(
        problem,
        Some(UrlProblem::Unreachable(Transport::Refused)),
        "{err}"
    );
}

#[tokio::test]
async fn a_host_that_does_not_resolve_is_dns() {
    /// Resolves no name, as a resolver answering NXDOMAIN does.
    struct NoSuchHost;
    impl reqwest::dns::Resolve for NoSuchHost {
        fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
            let name = name.as_str().to_string();
            Box::pin(async move {
                Err(format!(
                    "failed to lookup address information: {name}: Name or service not known"
                )
                .into())
            })
        }
    }
    let client = Client::new_with(
        test_config("http://cloudstack.invalid:8080/client/api"),
        |b| b.dns_resolver(std::sync::Arc::new(NoSuchHost)),
    )
    .unwrap();
    let err = client.list_clusters().await.unwrap_err();
    assert_eq!(
        err.api_url_problem(),
        Some(UrlProblem::Unreachable(Transport::Dns)),
        "{err}"
    );
}

#[tokio::test]
async fn https_to_a_plain_http_port_is_told_apart() {
    let cs = MockCs::start(|_| json(200, "{}")).await;
    let (err, problem) = problem_at(&format!("https://{}/client/api", cs.addr)).await;
    assert_eq!(
        problem,
        Some(UrlProblem::Unreachable(Transport::TlsToPlainPort)),
        "{err}"
    );
    assert!(err.to_string().contains("InvalidContentType"), "{err}");
}

#[tokio::test]
async fn a_port_that_closes_without_answering_is_closed() {
    let addr = raw_server(None).await;
    let (err, problem) = problem_at(&format!("http://{addr}/client/api")).await;
    assert_eq!(
        problem,
        Some(UrlProblem::Unreachable(Transport::Closed)),
        "{err}"
    );
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_certificate_problem() {
    let addr = start_tls_server().await;
    let (err, problem) = problem_at(&format!("https://{addr}/client/api")).await;
    assert_eq!(
        problem,
        Some(UrlProblem::Unreachable(Transport::Certificate)),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn no_answer_in_time_is_a_timeout() {
    let cs = MockCs::start(|_| Reply {
        delay: Duration::from_secs(30),
        ..json(200, "{}")
    })
    .await;
    let mut config = cs.config();
    config.request_timeout = Duration::from_millis(300);
    let err = Client::new(config)
        .unwrap()
        .list_clusters()
        .await
        .unwrap_err();
    assert_eq!(
        err.api_url_problem(),
        Some(UrlProblem::Unreachable(Transport::Timeout)),
        "{err}"
    );
}

#[tokio::test]
async fn an_html_page_is_a_page_whatever_its_status() {
    let ui = html(
        "200 OK",
        "<!DOCTYPE html><html><head><title>Apache CloudStack</title></head><body></body></html>",
    );
    let addr = raw_server(Some(ui)).await;
    let (err, problem) = problem_at(&format!("http://{addr}/client")).await;
    assert_eq!(
        problem,
        Some(UrlProblem::Page {
            http_status: 200,
            html: true
        }),
        "{err}"
    );
    assert!(err.to_string().contains("<!DOCTYPE html>"), "{err}");

    let proxy = html(
        "502 Bad Gateway",
        "<html><body><h1>502 Bad Gateway</h1></body></html>",
    );
    let addr = raw_server(Some(proxy)).await;
    let (err, problem) = problem_at(&format!("http://{addr}/client/api")).await;
    assert_eq!(
        problem,
        Some(UrlProblem::Page {
            http_status: 502,
            html: true
        }),
        "{err}"
    );
}

#[tokio::test]
async fn a_404_is_a_wrong_path() {
    // The canned CloudStack serves /client/api only: any other path is axum's empty 404.
    let cs = MockCs::start(|_| json(200, "{}")).await;
    let (err, problem) = problem_at(&format!("http://{}/api", cs.addr)).await;
    assert_eq!(problem, Some(UrlProblem::NotFound), "{err}");
}

#[tokio::test]
async fn cloudstacks_own_answers_say_nothing_about_the_url() {
    let cs = MockCs::start(|_| {
        json(
            401,
            r#"{"listkubernetesclustersresponse":{"uuidList":[],"errorcode":401,"errortext":"unable to verify user credentials and/or request signature"}}"#,
        )
    })
    .await;
    let err = cs.client().list_clusters().await.unwrap_err();
    assert!(matches!(err, CsError::Unauthorized { .. }), "{err:?}");
    assert_eq!(err.api_url_problem(), None);
    let malformed = CsError::Malformed {
        command: "listKubernetesClusters".into(),
        detail: "invalid JSON (EOF while parsing)".into(),
    };
    assert_eq!(malformed.api_url_problem(), None);
}

#[tokio::test]
async fn every_cluster_is_listed_and_the_size_limit_read_where_the_key_may() {
    let cs = MockCs::start(|p| match p.get("command").map(String::as_str) {
        Some("listKubernetesClusters") => json(
            200,
            r#"{"listkubernetesclustersresponse":{"count":2,"kubernetescluster":[
                {"id":"c-1","name":"demo","state":"Running","size":1,"controlnodes":1},
                {"id":"c-2","name":"prod","state":"Running","size":3,"controlnodes":3}]}}"#,
        ),
        Some("listConfigurations") => {
            assert_eq!(
                p.get("name").map(String::as_str),
                Some("cloud.kubernetes.cluster.max.size")
            );
            json(
                200,
                r#"{"listconfigurationsresponse":{"count":1,"configuration":[
                    {"category":"Advanced","name":"cloud.kubernetes.cluster.max.size","value":"25","defaultvalue":"10","isdynamic":true}]}}"#,
            )
        }
        other => panic!("unexpected {other:?}"),
    })
    .await;
    let names: Vec<_> = cs
        .client()
        .list_clusters()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["demo", "prod"]);
    assert_eq!(cs.client().cluster_max_size().await.unwrap(), Some(25));
    let listed = cs.requests();
    assert!(listed.iter().all(|r| r.signature_ok));
    assert!(
        listed.iter().all(|r| r.params.contains_key("listall")
            == (r.params["command"] == "listKubernetesClusters")),
        "{listed:?}"
    );
}
