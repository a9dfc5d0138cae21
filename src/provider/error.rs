//! The provider's one error type. Every failure a provider call can end in is a variant here,
//! carrying what the message needs, and what its caller can do about it ([`Error::reason`]),
//! read here from CloudStack's and the machine's errors; which gRPC status code each
//! [`Reason`] becomes is decided in one place, `crate::grpc::status`, and nowhere else.

use cks_cloudstack::{Class, CsError};
use cks_domain::machine::{Ask, ScaleError};
use std::time::Duration;

/// What a scale job failing its check of the caller's right says about the key.
pub const KEY_NOT_PERMITTED_TO_SCALE: &str = ". CloudStack refused this provider's API key the scale, not the request: the key's role \
     does not allow scaleKubernetesCluster on this cluster (a role whose rules do not name the command still \
     submits it, and CloudStack checks it inside the job), or the cluster belongs to another account: allow \
     scaleKubernetesCluster in the key's role, or use a key of the cluster's owner";

/// Why a provider call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is malformed (a delta of the wrong sign, no nodes, an empty id).
    #[error("{0}")]
    InvalidArgument(String),
    /// No configured group has this id.
    #[error("node group {id:?} is not configured in this provider (configured: {configured})")]
    UnknownGroup { id: String, configured: String },
    /// The group has no snapshot from CloudStack yet.
    #[error("node group {group}: no CloudStack snapshot yet{}", last_error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default())]
    NoSnapshot {
        group: String,
        last_error: Option<String>,
        /// The last error is CloudStack refusing the key ([`CsError::Unauthorized`]).
        key_refused: bool,
    },
    /// The scale state machine refused the request (bounds, rules, busy, unknown node…).
    #[error("node group {group}: {source}")]
    Scale {
        group: String,
        #[source]
        source: ScaleError,
    },
    /// The configured cluster is not listed (a typo, deleted, or not visible to the API key):
    /// the hint says which, naming what the key lists instead (`crate::suggest`).
    #[error("cluster {cluster} is not listed by CloudStack: {hint}")]
    ClusterNotFound { cluster: String, hint: String },
    /// `--nodes` names, by name, a cluster another group serves (by id, or by another name).
    #[error(
        "cluster {name:?} is {id}, which node group {other} serves already: one node group per \
         cluster (remove one of the two --nodes entries)"
    )]
    DuplicateCluster {
        name: String,
        id: String,
        other: String,
    },
    /// `--nodes` names a cluster by a name no cluster, or several, carry.
    #[error("{count} clusters are named {name:?}; name the cluster by id in --nodes")]
    AmbiguousName { name: String, count: usize },
    /// A CloudStack call failed.
    #[error("{}", cloudstack_message(.0))]
    CloudStack(#[from] CsError),
    /// CloudStack did not answer in time for the request's deadline.
    #[error(
        "node group {group}: CloudStack did not answer {command} within the request's deadline"
    )]
    Deadline {
        group: String,
        command: &'static str,
    },
    /// The answer to a scale submission was lost: CloudStack may still have accepted it.
    #[error(
        "node group {group}: {detail}; CloudStack may still have accepted the request, so nothing \
         more is sent for this cluster until the next refresh tells"
    )]
    AnswerLost { group: String, detail: String },
    /// CloudStack failed the job while validating it (nothing changed).
    #[error("node group {group}: CloudStack refused the scale request (job {job}, code {code}): {text}{}",
        if *key_not_permitted {
            KEY_NOT_PERMITTED_TO_SCALE.to_string()
        } else if *alert_unsupported {
            ". This CloudStack does not scale clusters in Alert (it predates the Alert-scaling change): \
             start the down VM so the cluster returns to Running, or upgrade CloudStack".to_string()
        } else { cks_domain::status::cluster_max_size_note(text) })]
    JobRefused {
        group: String,
        job: String,
        code: i64,
        text: String,
        alert_unsupported: bool,
        /// The job failed its check of the key's right to scale the cluster.
        key_not_permitted: bool,
    },
    /// CloudStack cancelled the job before it changed anything.
    #[error("node group {group}: CloudStack cancelled scale job {job}")]
    JobCancelled { group: String, job: String },
    /// A removal job failed part-way.
    #[error("node group {group}: CloudStack scale job {job} failed (code {code}): {text}")]
    JobFailed {
        group: String,
        job: String,
        code: i64,
        text: String,
    },
    /// Refresh: some groups have no snapshot within the staleness bound.
    #[error("no CloudStack snapshot newer than {bound:?} for: {}", failures.join("; "))]
    Stale {
        bound: Duration,
        failures: Vec<String>,
        /// The last error of a group named is CloudStack refusing the key
        /// ([`CsError::Unauthorized`]): the snapshots are old because of the key, not because
        /// CloudStack is out of reach.
        key_refused: bool,
    },
    /// The durable store's last write failed: no new promise is made until one succeeds.
    #[error(
        "the provider cannot record promises now ({store}: {error}); nothing was accepted, try again once the store can be written"
    )]
    StoreUnavailable { store: String, error: String },
    /// With leader election: this replica does not lead (it is a standby, or it lost the
    /// lease); nothing was sent or promised.
    #[error(
        "this provider replica does not hold the leader lease{}: nothing was sent or promised; the leader answers",
        .leader.as_deref().map(|l| format!(" (the leader is {l})")).unwrap_or_default()
    )]
    NotLeader { leader: Option<String> },
    /// A write asked on the admin address (`--admin-listen`), which only reads.
    #[error(
        "the admin address is read-only: it shows node groups and refreshes, but scales, \
         deletes, cancels and cleans up nothing; the autoscaler changes them on the main address"
    )]
    ReadOnly,
    /// A write of a caller bound to one cluster whose node reports show it runs in another
    /// (`cks_domain::binding`): another cluster's autoscaler holding this cluster's client
    /// certificate.
    #[error(
        "client {client} is bound to cluster {bound}, but the nodes it reports (NodeGroupForNode) \
         are VMs of cluster {seen}: it is an autoscaler running in {seen} with {bound}'s client \
         certificate. Its scale requests are refused and nothing was sent to CloudStack; reads \
         still answer. Give the autoscaler of {seen} the client certificate of {seen}, or, if \
         this identity is meant for {seen}, bind it there (--nodes MIN:MAX:{seen}@{client})"
    )]
    ClientInAnotherCluster {
        /// The names the caller's groups are bound to (`--nodes …@CLIENT`).
        client: String,
        /// The clusters it is bound to.
        bound: String,
        /// The cluster its nodes are VMs of.
        seen: String,
    },
    /// NodeGroupTemplateNodeInfo cannot build a template for the group.
    #[error("no template node for node group {group}: {reason}")]
    NoTemplate { group: String, reason: String },
    /// NodeGroupGetOptions has no overrides for the group (the autoscaler's flags apply).
    #[error("{0}")]
    NoOptions(String),
    /// The merged removal request a DeleteNodes joined failed (every caller of the window
    /// hears the one outcome).
    #[error("{0}")]
    Batch(std::sync::Arc<Error>),
    /// A bug or a task that ended abnormally.
    #[error("{0}")]
    Internal(String),
}

/// What a failed CloudStack call tells the autoscaler and the operator: the client's error,
/// and for CloudStack's throttling what to do about it here (the client already waited and
/// sent the call again for as long as `--cloudstack-timeout` allowed); for a refused key, that
/// it is the key (not CloudStack out of reach) and that a rotated key needs no restart.
fn cloudstack_message(e: &CsError) -> String {
    match e {
        CsError::Unauthorized { .. } => format!("{e}. {KEY_REFUSED}"),
        CsError::Throttled { .. } => format!(
            "{e}. CloudStack is throttling this provider's API key: its account made more than \
             api.throttling.max calls within api.throttling.interval (CloudStack's defaults: 25 \
             per second). Nothing was changed; try again later. Slow the provider down \
             (--cloudstack-max-rps below that rate, fewer clusters or other clients on the key's \
             account) or raise the limit"
        ),
        other => other.to_string(),
    }
}

/// What an operator reads when CloudStack refuses the key.
pub const KEY_REFUSED: &str = "CloudStack refused this provider's API key: it does not verify \
     the key or its signature (a key generated again in CloudStack, a disabled user or \
     account, a wrong secret key). Nothing was changed. A rotated key is taken from the mounted \
     files (--api-key-file and --secret-key-file, or the cloud-config's api-key and secret-key) \
     as soon as they change, without a restart: put the new key pair in the Secret they come \
     from";

/// What the caller of a failed provider call can do about it, in the provider's own words:
/// the one reading of every [`Error`] that the gRPC layer turns into a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The request itself is malformed: the same request gets the same answer.
    Invalid,
    /// The group, cluster or node it names is not there.
    NotFound,
    /// A later call may get past it: nothing is known yet, CloudStack was slow, out of reach
    /// or throttling, or this replica cannot promise anything now.
    Later,
    /// Past the group's maximum: ask for less.
    AskLess,
    /// A refusal an operator must look at: the request cannot be carried out as things are.
    Operator,
    /// The key, or who asks (the caller's identity, a write on the read-only admin address),
    /// is refused: not the request's fault, and not mended by waiting.
    Denied,
    /// CloudStack cancelled the job before it changed anything.
    Cancelled,
    /// An optional RPC has nothing to give: the caller's own defaults apply.
    NothingToGive,
    /// A bug, or the provider's own configuration: neither the request nor CloudStack.
    Internal,
}

impl Error {
    /// What the caller can do about this failure.
    pub fn reason(&self) -> Reason {
        match self {
            // Every caller of a merged removal hears its one outcome as its own.
            Error::Batch(inner) => inner.reason(),
            // The snapshots are missing or old because CloudStack refuses the key, which
            // waiting does not mend: the key's refusal, not an outage.
            Error::NoSnapshot {
                key_refused: true, ..
            }
            | Error::Stale {
                key_refused: true, ..
            } => Reason::Denied,
            // The key may not scale the cluster: the operator's to fix, not a refusal of the
            // request by CloudStack's rules.
            Error::JobRefused {
                key_not_permitted: true,
                ..
            } => Reason::Denied,
            Error::InvalidArgument(_) => Reason::Invalid,
            Error::UnknownGroup { .. } | Error::ClusterNotFound { .. } => Reason::NotFound,
            Error::ReadOnly => Reason::Denied,
            // The caller is another cluster's autoscaler: its identity's, not the request's,
            // fault.
            Error::ClientInAnotherCluster { .. } => Reason::Denied,
            Error::NoSnapshot { .. }
            | Error::Deadline { .. }
            | Error::AnswerLost { .. }
            | Error::Stale { .. }
            | Error::StoreUnavailable { .. }
            | Error::NotLeader { .. } => Reason::Later,
            Error::Scale { source, .. } => match source.ask() {
                Ask::Later => Reason::Later,
                Ask::Less => Reason::AskLess,
                Ask::Existing => Reason::NotFound,
                Ask::Operator => Reason::Operator,
            },
            Error::AmbiguousName { .. }
            | Error::DuplicateCluster { .. }
            | Error::JobRefused { .. }
            | Error::JobFailed { .. } => Reason::Operator,
            Error::JobCancelled { .. } => Reason::Cancelled,
            Error::CloudStack(cs) => match cs.class() {
                // A throttled call did nothing (CloudStack refuses it before the command
                // runs): try again later, as for no answer at all; never a refused key or
                // request.
                Class::Unknown | Class::Throttled => Reason::Later,
                Class::Unauthorized | Class::NotPermitted => Reason::Denied,
                Class::Refused => Reason::Operator,
                // Nothing reached CloudStack: the client could not be built from the
                // provider's own configuration.
                Class::NotSent => Reason::Internal,
            },
            Error::NoTemplate { .. } | Error::NoOptions(_) => Reason::NothingToGive,
            Error::Internal(_) => Reason::Internal,
        }
    }

    /// CloudStack refused the key this error came from: directly, or as the last error of a
    /// group with no snapshot, or no fresh one, to answer from.
    pub fn is_key_refused(&self) -> bool {
        match self {
            Error::CloudStack(CsError::Unauthorized { .. }) => true,
            Error::NoSnapshot { key_refused, .. } | Error::Stale { key_refused, .. } => {
                *key_refused
            }
            Error::Batch(inner) => inner.is_key_refused(),
            _ => false,
        }
    }
}

/// A provider result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Longest caller-supplied value (a node group id, a node name) an error message repeats whole.
pub const ECHO_MAX_CHARS: usize = 128;

/// A caller-supplied value as an error message repeats it: whole when short; else its start,
/// cut at [`ECHO_MAX_CHARS`], and how long it was. gRPC carries the message in a header, so a
/// huge id repeated whole would make the answer itself fail (the client would see
/// RESOURCE_EXHAUSTED or INTERNAL instead of what was wrong).
pub fn echo(value: &str) -> String {
    if value.chars().count() <= ECHO_MAX_CHARS {
        return value.to_string();
    }
    let head: String = value.chars().take(ECHO_MAX_CHARS).collect();
    format!("{head}… (cut: {} bytes in all)", value.len())
}

/// What an operator reads when CloudStack refuses the configured `project-id`.
pub fn bad_project_hint(project_id: Option<&str>, said: &str) -> String {
    format!(
        "CloudStack refuses project-id {}: it names no project this key is a member of (the project's id is in the UI's project view, or `cmk list projects`); CloudStack said: {said}",
        project_id.unwrap_or("(none)")
    )
}

/// What an operator reads when a cluster is not listed for the key.
pub fn not_listed_hint(project_id: Option<&str>) -> String {
    match project_id {
        // A user's key lists only its own account's clusters: another account's is not
        // refused, just absent (recorded from a CloudStack 4.21.0.0:
        // `errors_16_perm_alice_listKubernetesClusters_other_account_id`).
        None => "a cluster in a CloudStack project is listed only with the project's id: set project-id in the cloud-config (CKS 4.19.3 and later write it into the cluster's cloudstack-secret; the project's id is in the UI's project view, or `cmk list projects`); a cluster of another account is never listed to this key: use the key of the cluster's own account (or of its project)".into(),
        Some(p) => format!("project-id is {p}: is the cluster in that project, and is this key a member of it (a key of another account lists none of its clusters)?"),
    }
}
