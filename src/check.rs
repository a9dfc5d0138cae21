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

use crate::cli::ServeArgs;
use crate::config::ClusterRef;
use anyhow::bail;
use cks_cloudstack::{Client, CsError};
use std::fmt::Write as _;

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
            }
            Listed::NotFound => {
                let _ = writeln!(
                    out,
                    "cluster {name}: NOT LISTED for this key; {}",
                    crate::provider::not_listed_hint(project)
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
            "serve can run with this key{}",
            if refused == 0 {
                String::new()
            } else {
                format!(" ({refused} optional command(s) refused: see above)")
            }
        );
    } else {
        let _ = writeln!(out, "serve would not work with this key:");
        for p in &problems {
            let _ = writeln!(out, "  - {p}");
        }
    }
    (out, problems)
}
