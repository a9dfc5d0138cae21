//! `check`: what this key lets the provider do, before it serves. With the flags `serve` takes
//! (the same cloud-config, keys and `--nodes`), it lists each cluster as `serve` would, then
//! tries every command the provider sends, changing nothing: the read commands as they are,
//! the write commands (`scaleKubernetesCluster`, `stopVirtualMachine`) and
//! `queryAsyncJobResult` with an id that names nothing. CloudStack checks the command against
//! the key's role before it reads the parameters (`ApiServer.verifyRequest`, then the
//! dispatcher's parameter processing), so such a call is refused for its parameter (431) when
//! the command is allowed and for the command (432) when it is not. Prints one table; fails
//! (non-zero exit) when a required command is refused, a cluster is not listed, or CloudStack
//! could not be asked.
//!
//! Before the table: a cluster the key does not list is shown with what the key lists instead,
//! the closest first (`crate::suggest`); an API URL that does not reach CloudStack's API (no
//! answer, an HTML page, a 404) ends the check at once with one line naming the cause and the
//! URL's shape ([`url_problem_line`]), since every other try would fail the same way; and each
//! listed cluster's largest size (`--nodes`' MAX, or CKS's own `maxsize` when its autoscaling is
//! on) plus its control nodes is compared with CloudStack's `cloud.kubernetes.cluster.max.size`,
//! read where the key may ([`size_limit_line`]).

use crate::cli::ServeArgs;
use crate::config::ClusterRef;
use anyhow::bail;
use cks_cloudstack::{Client, CsError, Transport, UrlProblem};
use std::fmt::Write as _;
use std::time::Duration;

/// What the API URL looks like, said with every problem of the URL.
pub const API_URL_SHAPE: &str = "api-url looks like http://HOST:8080/client/api (the management server's own port) or https://HOST/client/api (behind a proxy that serves TLS)";

/// CloudStack's default `cloud.kubernetes.cluster.max.size`.
pub const DEFAULT_CLUSTER_MAX_SIZE: u64 = 10;

/// An id of the UUID form that names nothing: the write commands and `queryAsyncJobResult`
/// are asked about it, so CloudStack refuses them for the parameter (or the role) and changes
/// nothing.
const NO_SUCH_ID: &str = "00000000-0000-4000-8000-000000000000";

/// Why check cannot say whether the key may scale: a role whose rules do not name
/// `scaleKubernetesCluster` falls back to the command's annotated role types, so even a role
/// allowing only `list*` submits the request (200 and a job id) and its job then fails 530
/// "Caller does not have permission to operate with provided resource." (recorded from a
/// CloudStack 4.21.0.0: `errors_13_perm_bob_listonly_scale` and its `_job_final`); only an
/// explicit deny refuses the call (432). A real scale would tell, and check changes nothing.
pub const SCALE_ROLE_CHECKED_IN_JOB: &str = "whether this key's role may scale the cluster is checked by CloudStack only inside the scale job (a role whose rules do not name scaleKubernetesCluster still submits it, and the job fails \"Caller does not have permission to operate with provided resource.\"): check cannot know without scaling. Make sure the role allows scaleKubernetesCluster, or watch the first scale: the provider names such a failure as the key's permission";

/// A command the provider sends: whether it serves without it, and what it loses then.
#[derive(Debug, Clone, Copy)]
pub struct CommandUse {
    pub command: &'static str,
    pub required: bool,
    pub without: &'static str,
}

/// Every command the provider sends, the four of the key CKS gives a project cluster first.
pub const COMMANDS: [CommandUse; 8] = [
    CommandUse {
        command: "listKubernetesClusters",
        required: true,
        without: "the provider sees no cluster: nothing is served",
    },
    CommandUse {
        command: "scaleKubernetesCluster",
        required: true,
        without: "no scale-up and no removal can be sent",
    },
    CommandUse {
        command: "queryAsyncJobResult",
        required: true,
        without: "no scale job is followed to its end: every scale-up and removal stays in flight",
    },
    CommandUse {
        command: "listVirtualMachines",
        required: true,
        without: "where listServiceOfferings is refused too, the template node has no CPUs or memory (scale-up from zero and the expanders cannot size a node)",
    },
    CommandUse {
        command: "listAsyncJobs",
        required: false,
        without: crate::provider::WITHOUT_LIST_ASYNC_JOBS,
    },
    CommandUse {
        command: "listServiceOfferings",
        required: false,
        without: crate::provider::WITHOUT_LIST_SERVICE_OFFERINGS,
    },
    CommandUse {
        command: "listCapabilities",
        required: false,
        without: crate::provider::WITHOUT_LIST_CAPABILITIES,
    },
    CommandUse {
        command: "stopVirtualMachine",
        required: false,
        without: crate::provider::WITHOUT_STOP_VIRTUAL_MACHINE,
    },
];

/// How CloudStack answered one command's try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The key may call it; what the answer showed.
    Allowed(String),
    /// 432: not available to the key's role.
    Refused,
    /// The command passed the call's checks, but CloudStack checks the key's right to use it on
    /// a cluster only inside the job it starts (`scaleKubernetesCluster`): what check cannot
    /// know without scaling.
    CheckedInJob(String),
    /// Neither: unreachable, a bad signature, an answer that cannot be read.
    Failed(String),
}

impl Answer {
    fn of<T>(result: Result<T, CsError>, ok: impl FnOnce(T) -> String) -> Answer {
        match result {
            Ok(v) => Answer::Allowed(ok(v)),
            Err(e) if e.is_not_permitted() => Answer::Refused,
            // Refused for its parameter: CloudStack got past the role's check.
            Err(CsError::Api { errorcode, .. }) if (430..=431).contains(&errorcode) => {
                Answer::Allowed("refused for the id that names nothing, as asked".into())
            }
            Err(e) => Answer::Failed(e.to_string()),
        }
    }

    fn shown(&self) -> String {
        match self {
            Answer::Allowed(_) => "allowed".into(),
            Answer::Refused => "refused (432)".into(),
            Answer::CheckedInJob(_) => "accepted (the role is checked in the job)".into(),
            Answer::Failed(_) => "not answered".into(),
        }
    }
}

/// One cluster `--nodes` names, as the key lists it.
#[derive(Debug)]
enum Listed {
    Found(Box<cks_cloudstack::types::KubernetesCluster>),
    NotFound,
    Ambiguous(usize),
    /// CloudStack refused the `projectid` sent with the list (the command itself passed the
    /// role's check): what it said.
    BadProject(String),
    Failed(CsError),
}

async fn list_cluster(cs: &Client, cluster: &ClusterRef) -> Listed {
    let found = match cluster {
        ClusterRef::Id(id) => match cs.get_cluster(id).await {
            Ok(c) => c.into_iter().collect::<Vec<_>>(),
            Err(e) if e.is_bad_project() => return Listed::BadProject(e.to_string()),
            // CloudStack's lookup of the id parameter found no such entity.
            Err(CsError::Api { errorcode: 431, .. }) => Vec::new(),
            Err(e) => return Listed::Failed(e),
        },
        ClusterRef::Name(name) => match cs.find_clusters_by_name(name).await {
            Ok(c) => c,
            Err(e) if e.is_bad_project() => return Listed::BadProject(e.to_string()),
            Err(e) => return Listed::Failed(e),
        },
    };
    let mut found = found;
    if found.len() > 1 {
        return Listed::Ambiguous(found.len());
    }
    match found.pop() {
        Some(c) => Listed::Found(Box::new(c)),
        None => Listed::NotFound,
    }
}

/// The one line that says why `api_url` does not reach CloudStack's API (`problem`, read from
/// `error`), and how the URL should look; `timeout` is the request timeout a silent peer
/// outlasted.
pub fn url_problem_line(
    api_url: &str,
    problem: UrlProblem,
    error: &CsError,
    timeout: Duration,
) -> String {
    let parsed = url::Url::parse(api_url).ok();
    let host = parsed
        .as_ref()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| api_url.to_string());
    let port = parsed
        .as_ref()
        .and_then(url::Url::port_or_known_default)
        .map_or_else(String::new, |p| format!(":{p}"));
    let path = parsed
        .as_ref()
        .map_or_else(|| "/".to_string(), |u| u.path().to_string());
    let at = format!("{host}{port}");
    let cause = match problem {
        UrlProblem::Unreachable(Transport::Refused) => format!(
            "connection refused: nothing listens on {at}. Fix the host or port in api-url, or start the management server. {API_URL_SHAPE}"
        ),
        UrlProblem::Unreachable(Transport::Dns) => format!(
            "the host {host} does not resolve (DNS). Fix the host in api-url, or make the name resolvable where the provider runs (the pod's DNS). {API_URL_SHAPE}"
        ),
        UrlProblem::Unreachable(Transport::TlsToPlainPort) => format!(
            "api-url says https://, but {at} answers in plain HTTP (the TLS handshake read an HTTP answer: \"InvalidContentType\"). Write http://{at}{path}, or name the port where TLS is served. {API_URL_SHAPE}"
        ),
        UrlProblem::Unreachable(Transport::Certificate) => format!(
            "CloudStack's TLS certificate is not trusted ({error}). Give the CA that signed it (--cloudstack-ca; the chart's cloudstackCA), or write in api-url the host name the certificate names; ssl-no-verify = true in the cloud-config skips the check (not recommended)"
        ),
        UrlProblem::Unreachable(Transport::Timeout) => format!(
            "no answer from {at} within {timeout:?}: a firewall or an egress NetworkPolicy drops the connection, or the port is wrong. Check that the provider's pod can reach the management server there. {API_URL_SHAPE}"
        ),
        UrlProblem::Unreachable(Transport::Closed) => format!(
            "{at} closed the connection without an HTTP answer: that port serves something else than HTTP(S). Fix the port in api-url. {API_URL_SHAPE}"
        ),
        UrlProblem::Unreachable(Transport::Other) => format!("{error}. {API_URL_SHAPE}"),
        UrlProblem::Page {
            http_status,
            html: true,
        } if (200..300).contains(&http_status) => format!(
            "{path} answers with an HTML page, not CloudStack's API (the UI's address, a login page or a proxy's page). The API is at /client/api. {API_URL_SHAPE}"
        ),
        UrlProblem::Page {
            http_status,
            html: true,
        } => format!(
            "{path} answers HTTP {http_status} with an HTML page, not CloudStack's API: a proxy or another web server answered. If a proxy is in front of CloudStack, check that the management server is up and that the proxy forwards /client/api. {API_URL_SHAPE}"
        ),
        UrlProblem::Page {
            http_status,
            html: false,
        } => format!(
            "{path} answers HTTP {http_status} with something else than CloudStack's API ({error}). {API_URL_SHAPE}"
        ),
        UrlProblem::NotFound => format!(
            "{at} has no page at {path} (HTTP 404): CloudStack's API is at /client/api. {API_URL_SHAPE}"
        ),
    };
    format!("api-url {api_url}: {cause}")
}

/// How check could read CloudStack's `cloud.kubernetes.cluster.max.size`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeLimit {
    /// The global value, read with `listConfigurations`.
    Read(u64),
    /// The key may not read it (432), or CloudStack did not say: why.
    Unknown(String),
}

/// Where a group's largest size comes from, as `serve` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxFrom {
    /// MAX in `--nodes MIN:MAX:CLUSTER`.
    Nodes,
    /// The cluster's own `maxsize`: CKS's autoscaling is on, and its bounds win.
    Cks,
}

/// What check says about a cluster's size limit: its largest size (`max` workers, from
/// `from`) plus its `control` nodes against `limit`; the line, and whether it is a warning
/// (CloudStack would refuse growing the cluster to `max`, or may).
pub fn size_limit_line(max: u64, from: MaxFrom, control: u64, limit: &SizeLimit) -> (String, bool) {
    let nodes = max + control;
    let counted = format!(
        "{} {max} + {control} control node{} = {nodes} nodes",
        match from {
            MaxFrom::Nodes => "MAX",
            MaxFrom::Cks => "CKS's maxsize (its autoscaling is on, so its bounds win)",
        },
        if control == 1 { "" } else { "s" }
    );
    let lower = |to: u64| match from {
        MaxFrom::Nodes => format!("lower MAX in --nodes to {to}"),
        MaxFrom::Cks => format!(
            "lower the cluster's maxsize in CKS to {to} (or turn CKS's autoscaling off and set MAX in --nodes to {to})"
        ),
    };
    let refusal = |n: u64| {
        format!(
            "CloudStack refuses to scale the cluster past {} workers (its scale job fails \"Maximum cluster size can not exceed {n}. Please contact your administrator\")",
            n.saturating_sub(control)
        )
    };
    let raise = |n: u64| {
        format!(
            "{}, or have a CloudStack administrator set cloud.kubernetes.cluster.max.size to {nodes} or more for the cluster's account (an account setting: Accounts > the account > Settings)",
            lower(n.saturating_sub(control))
        )
    };
    match limit {
        SizeLimit::Read(n) if nodes > *n => (
            format!(
                "size limit: {counted} > cloud.kubernetes.cluster.max.size {n} (the global value; the cluster's account may override it): {}: {}",
                refusal(*n),
                raise(*n)
            ),
            true,
        ),
        SizeLimit::Read(n) => (
            format!(
                "size limit: {counted}, within cloud.kubernetes.cluster.max.size {n} (the global value; the cluster's account may override it)"
            ),
            false,
        ),
        SizeLimit::Unknown(why) if nodes > DEFAULT_CLUSTER_MAX_SIZE => (
            format!(
                "size limit: {counted} > {DEFAULT_CLUSTER_MAX_SIZE}, CloudStack's default cloud.kubernetes.cluster.max.size (it counts control nodes); check cannot read the setting ({why}): unless an administrator raised it to {nodes} or more for the cluster's account, {}: {}",
                refusal(DEFAULT_CLUSTER_MAX_SIZE),
                raise(DEFAULT_CLUSTER_MAX_SIZE)
            ),
            true,
        ),
        SizeLimit::Unknown(why) => (
            format!(
                "size limit: {counted}, within CloudStack's default cloud.kubernetes.cluster.max.size {DEFAULT_CLUSTER_MAX_SIZE}; check cannot read the setting ({why}): ask an administrator whether it was set below {nodes} for the cluster's account"
            ),
            false,
        ),
    }
}

/// Reads `cloud.kubernetes.cluster.max.size` where the key may.
async fn size_limit(cs: &Client) -> SizeLimit {
    match cs.cluster_max_size().await {
        Ok(Some(n)) => SizeLimit::Read(u64::from(n)),
        Ok(None) => SizeLimit::Unknown("CloudStack lists no value for it".into()),
        Err(e) if e.is_not_permitted() => SizeLimit::Unknown(
            "this key may not call listConfigurations, an administrator's command".into(),
        ),
        Err(e) => SizeLimit::Unknown(format!("listConfigurations failed: {e}")),
    }
}

/// Runs `check`: prints the report, and fails when `serve` could not work with this key.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = crate::app::client_config(&args)?;
    let groups = crate::app::groups(&args)?;
    if groups.is_empty() {
        bail!("--nodes: name the clusters to check, as serve takes them (MIN:MAX:CLUSTER)");
    }
    let project = config.project_id.clone().filter(|p| !p.is_empty());
    let cs = Client::new(config)?;
    let (report, problems) = check(&cs, &groups, project.as_deref()).await;
    print!("{report}");
    if problems.is_empty() {
        return Ok(());
    }
    bail!("{}", problems.join("; "))
}

/// The report and the problems that make `serve` fail or not work.
pub async fn check(
    cs: &Client,
    groups: &[crate::config::BoundNodeGroup],
    project: Option<&str>,
) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut problems = Vec::new();
    let _ = writeln!(
        out,
        "CloudStack {}, {}",
        cs.api_url(),
        project.map_or("no project-id".to_string(), |p| format!("project-id {p}"))
    );
    let mut list_answer = None;
    let mut worker = None;
    let mut warnings = Vec::new();
    let mut limit = None;
    let mut seen = None;
    for g in groups {
        let name = &g.group.cluster;
        match list_cluster(cs, name).await {
            Listed::Found(c) => {
                let workers: Vec<_> = c
                    .virtualmachines
                    .iter()
                    .filter(|v| !v.isexternalnode)
                    .collect();
                let _ = writeln!(
                    out,
                    "cluster {name}: listed as {:?} ({}), {}, size {}, {} VMs",
                    c.name,
                    c.id,
                    c.state,
                    c.size,
                    workers.len()
                );
                if worker.is_none() {
                    worker = c.virtualmachines.last().map(|v| v.id.clone());
                }
                list_answer.get_or_insert(Answer::Allowed(String::new()));
                // CKS's own bounds win when its autoscaling is on (as serve takes them).
                let (max, from) = match (c.autoscalingenabled, c.maxsize) {
                    (true, Some(m)) => (m, MaxFrom::Cks),
                    _ => (u64::from(g.group.max), MaxFrom::Nodes),
                };
                if limit.is_none() {
                    limit = Some(size_limit(cs).await);
                }
                if let Some(limit) = &limit {
                    let (line, warn) = size_limit_line(max, from, c.controlnodes, limit);
                    let _ = writeln!(out, "  {line}");
                    if warn {
                        warnings.push(format!(
                            "cluster {name}: CloudStack's cloud.kubernetes.cluster.max.size refuses, or may refuse, its largest size (its size limit line above says what to change)"
                        ));
                    }
                }
            }
            Listed::NotFound => {
                if seen.is_none() {
                    seen = Some(crate::suggest::clusters_seen(cs).await.ok());
                }
                let _ = writeln!(
                    out,
                    "cluster {name}: NOT LISTED: {}",
                    crate::suggest::not_listed(
                        name,
                        seen.as_ref().and_then(Option::as_deref),
                        &crate::provider::not_listed_hint(project),
                    )
                );
                problems.push(format!("cluster {name} is not listed for this key"));
                list_answer.get_or_insert(Answer::Allowed(String::new()));
            }
            Listed::Ambiguous(n) => {
                let _ = writeln!(
                    out,
                    "cluster {name}: {n} clusters have that name; name it by id"
                );
                problems.push(format!("cluster {name} names {n} clusters"));
                list_answer.get_or_insert(Answer::Allowed(String::new()));
            }
            Listed::BadProject(said) => {
                let _ = writeln!(
                    out,
                    "cluster {name}: NOT LISTED: {}",
                    crate::provider::bad_project_hint(project, &said)
                );
                problems.push(format!(
                    "project-id {} names no project this key can use",
                    project.unwrap_or("(none)")
                ));
                list_answer.get_or_insert(Answer::Allowed(String::new()));
            }
            Listed::Failed(e) if e.is_not_permitted() => {
                list_answer = Some(Answer::Refused);
            }
            // Not CloudStack's API at that URL: every other try would fail the same way.
            Listed::Failed(e) if e.api_url_problem().is_some() => {
                let problem = e.api_url_problem().unwrap_or(UrlProblem::NotFound);
                let _ = writeln!(
                    out,
                    "{}",
                    url_problem_line(cs.api_url(), problem, &e, cs.request_timeout())
                );
                let _ = writeln!(out);
                let _ = writeln!(
                    out,
                    "serve would not work: CloudStack's API cannot be asked at this api-url (nothing else was tried)"
                );
                problems.push(format!(
                    "api-url {} does not reach CloudStack's API (see above)",
                    cs.api_url()
                ));
                return (out, problems);
            }
            Listed::Failed(e) => {
                let _ = writeln!(out, "cluster {name}: CloudStack did not answer: {e}");
                list_answer.get_or_insert(Answer::Failed(e.to_string()));
            }
        }
    }
    let vm = worker.unwrap_or_else(|| NO_SUCH_ID.to_string());
    let mut answers = Vec::new();
    for u in COMMANDS {
        let answer = match u.command {
            "listKubernetesClusters" => list_answer.clone().unwrap_or(Answer::Refused),
            "scaleKubernetesCluster" => {
                match Answer::of(cs.scale_cluster_size(NO_SUCH_ID, 1).await, |job| {
                    format!(
                        "CloudStack accepted a job ({job}) for a cluster id that names nothing; it fails on its own"
                    )
                }) {
                    Answer::Allowed(detail) => Answer::CheckedInJob(detail),
                    other => other,
                }
            }
            "queryAsyncJobResult" => Answer::of(cs.query_job(NO_SUCH_ID).await, |_| String::new()),
            "listVirtualMachines" => Answer::of(
                cs.list_virtual_machines(std::slice::from_ref(&vm)).await,
                |_| String::new(),
            ),
            "listAsyncJobs" => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                Answer::of(cs.list_async_jobs_since(now, 1).await, |_| String::new())
            }
            "listServiceOfferings" => {
                Answer::of(cs.get_service_offering(NO_SUCH_ID).await, |_| String::new())
            }
            "listCapabilities" => {
                Answer::of(cs.cloudstack_version().await, |v| format!("CloudStack {v}"))
            }
            "stopVirtualMachine" => {
                Answer::of(cs.stop_virtual_machine(NO_SUCH_ID, false).await, |job| {
                    format!(
                        "CloudStack accepted a job ({job}) for a VM id that names nothing; it fails on its own"
                    )
                })
            }
            other => Answer::Failed(format!("no try written for {other}")),
        };
        answers.push((u, answer));
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "{:<24} {:<9} answer", "command", "needed");
    for (u, a) in &answers {
        let needed = if u.required { "required" } else { "optional" };
        let _ = writeln!(out, "{:<24} {needed:<9} {}", u.command, a.shown());
    }
    let mut notes = String::new();
    for (u, a) in &answers {
        match a {
            Answer::Refused => {
                let _ = writeln!(notes, "without {}: {}", u.command, u.without);
                if u.required {
                    problems.push(format!("{} (required) is refused to this key", u.command));
                }
            }
            Answer::Failed(e) => {
                let _ = writeln!(notes, "{}: {e}", u.command);
                problems.push(format!("{} could not be tried: {e}", u.command));
            }
            Answer::CheckedInJob(detail) => {
                let _ = writeln!(
                    notes,
                    "{}: {detail}; {SCALE_ROLE_CHECKED_IN_JOB}",
                    u.command
                );
            }
            Answer::Allowed(detail) if !detail.is_empty() => {
                let _ = writeln!(notes, "{}: {detail}", u.command);
            }
            Answer::Allowed(_) => {}
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(out);
        out.push_str(&notes);
    }
    let _ = writeln!(out);
    if problems.is_empty() {
        let refused = answers
            .iter()
            .filter(|(_, a)| *a == Answer::Refused)
            .count();
        let _ = writeln!(
            out,
            "serve can run with this key{}{}",
            if refused == 0 {
                String::new()
            } else {
                format!(" ({refused} optional command(s) refused: see above)")
            },
            if warnings.is_empty() { "" } else { ", but:" }
        );
        for w in &warnings {
            let _ = writeln!(out, "  - {w}");
        }
    } else {
        let _ = writeln!(out, "serve would not work with this key:");
        for p in problems.iter().chain(&warnings) {
            let _ = writeln!(out, "  - {p}");
        }
    }
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable(cause: Transport, detail: &str) -> CsError {
        CsError::Unreachable {
            command: "listKubernetesClusters".into(),
            detail: detail.into(),
            cause,
        }
    }

    /// The causes the loopback tests of `check` cannot stage (no DNS server is asked, no
    /// certificate is served, no packet is dropped), each one line with its fix; the others
    /// are run against loopback servers in `tests/it/check.rs`.
    #[test]
    fn each_url_problem_is_one_line_with_its_fix() {
        let url = "https://cloudstack.example.com/client/api";
        let timeout = Duration::from_secs(10);
        let cases: [(UrlProblem, CsError, &str); 5] = [
            (
                UrlProblem::Unreachable(Transport::Dns),
                unreachable(Transport::Dns, "dns error"),
                "the host cloudstack.example.com does not resolve (DNS). Fix the host in api-url",
            ),
            (
                UrlProblem::Unreachable(Transport::Certificate),
                unreachable(
                    Transport::Certificate,
                    "invalid peer certificate: UnknownIssuer",
                ),
                "CloudStack's TLS certificate is not trusted (CloudStack unreachable (listKubernetesClusters): invalid peer certificate: UnknownIssuer). Give the CA that signed it (--cloudstack-ca",
            ),
            (
                UrlProblem::Unreachable(Transport::Timeout),
                unreachable(Transport::Timeout, "no response within 10s"),
                "no answer from cloudstack.example.com:443 within 10s: a firewall or an egress NetworkPolicy drops the connection, or the port is wrong",
            ),
            (
                UrlProblem::Unreachable(Transport::Other),
                unreachable(Transport::Other, "something else"),
                "CloudStack unreachable (listKubernetesClusters): something else.",
            ),
            (
                UrlProblem::Page {
                    http_status: 503,
                    html: false,
                },
                CsError::Http {
                    command: "listKubernetesClusters".into(),
                    http_status: 503,
                    snippet: "Service Unavailable".into(),
                },
                "/client/api answers HTTP 503 with something else than CloudStack's API",
            ),
        ];
        for (problem, error, want) in cases {
            let line = url_problem_line(url, problem, &error, timeout);
            assert!(
                line.starts_with(&format!("api-url {url}: {want}")),
                "{line}"
            );
            // A certificate's fix is its CA, not the URL's shape.
            let certificate = problem == UrlProblem::Unreachable(Transport::Certificate);
            assert_eq!(line.ends_with(API_URL_SHAPE), !certificate, "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn the_size_limit_is_a_warning_only_when_cloudstack_would_or_may_refuse() {
        let read = SizeLimit::Read(10);
        let unknown = SizeLimit::Unknown("this key may not call listConfigurations".into());
        let cases = [
            (9, MaxFrom::Nodes, 1, &read, false),
            (10, MaxFrom::Nodes, 1, &read, true),
            (7, MaxFrom::Nodes, 3, &read, false),
            (8, MaxFrom::Cks, 3, &read, true),
            (9, MaxFrom::Nodes, 1, &unknown, false),
            (10, MaxFrom::Nodes, 1, &unknown, true),
        ];
        for (max, from, control, limit, warn) in cases {
            let (line, warned) = size_limit_line(max, from, control, limit);
            assert_eq!(warned, warn, "{line}");
            assert!(line.starts_with("size limit: "), "{line}");
        }
        let (line, _) = size_limit_line(8, MaxFrom::Nodes, 3, &read);
        assert!(
            line.contains(
                "MAX 8 + 3 control nodes = 11 nodes > cloud.kubernetes.cluster.max.size 10"
            ) && line.contains("past 7 workers")
                && line.contains("lower MAX in --nodes to 7"),
            "{line}"
        );
    }
}
