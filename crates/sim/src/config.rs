//! The simulator's settings: what a run starts with ([`super::SimConfig`]) and the part a
//! running test may change through `simConfigure` or [`super::SimHandle::configure`]
//! ([`SimSettings`]).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// How scale-up jobs fail, for reliability tests. Applies to every scale-up job accepted while
/// it is set; scale-down jobs are not affected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JobFailure {
    /// Jobs run normally.
    #[default]
    None,
    /// The capacity plan fails before any VM is created, as when CloudStack finds no host: the
    /// job fails with CloudStack's "insufficient capacity" text and the cluster state is kept.
    Capacity,
    /// Provisioning fails part-way: the VMs before the last start, the last one ends in `Error`,
    /// the cluster goes to `Alert` and `size` is not updated.
    Partial,
    /// The job never finishes (the cluster stays in `Scaling`).
    Never,
}

impl JobFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Capacity => "capacity",
            Self::Partial => "partial",
            Self::Never => "never",
        }
    }
}

impl fmt::Display for JobFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobFailure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(Self::None),
            "capacity" => Ok(Self::Capacity),
            "partial" => Ok(Self::Partial),
            "never" => Ok(Self::Never),
            _ => Err(format!(
                "unknown job failure {s:?}: expected none, capacity, partial or never"
            )),
        }
    }
}

/// The role of the account the simulator's API key belongs to: which commands it may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyRole {
    /// A User-role account's key (an account cluster's `cloudstack-secret`): every command the
    /// simulator serves but the administrators' ([`ADMIN_COMMANDS`]).
    #[default]
    User,
    /// The Project Kubernetes Service Role CKS gives a project cluster's key from 4.19.3 /
    /// 4.20.1 on (`KubernetesClusterManagerImpl.PROJECT_KUBERNETES_ACCOUNT_ROLE_ALLOWED_APIS`):
    /// of the commands served, only `listKubernetesClusters`, `scaleKubernetesCluster`,
    /// `queryAsyncJobResult` and `listVirtualMachines`. Any other is answered 432.
    ProjectKubernetes,
    /// A role whose rules allow only `list*` (recorded from a CloudStack 4.21.0.0:
    /// `errors_13_perm_bob_listonly_scale`, its `_job_final`, and `errors_14`): a command its
    /// rules do not name falls back to the command's annotated role types, so
    /// `scaleKubernetesCluster` and `queryAsyncJobResult` are accepted at the call, but the
    /// scale job fails 530 "Caller does not have permission to operate with provided
    /// resource."; `stopVirtualMachine` is answered 432 at once.
    ListOnly,
    /// A role allowing `list*` and denying every other command by an explicit rule (`*`
    /// deny; recorded: `errors_13b_perm_bob_listonly_plus_deny_star_scale`, `errors_13c`): an
    /// explicit deny refuses a command at once, `scaleKubernetesCluster` included (432), so
    /// no job is ever queued; `queryAsyncJobResult` is refused too.
    ListOnlyDenyRest,
    /// The Root Admin role (the `admin` account a CloudStack is installed with: the recorded
    /// server's `admin`): every command; exempt from the API rate limit
    /// (`ApiRateLimitServiceImpl.checkAccess` returns before counting a root admin's call;
    /// recorded: `throttle_03_throttle_admin_exempt`); sees and changes every account's and
    /// every project's resources (`AccountManagerImpl.buildACLSearchParameters` and
    /// `checkAccess`, see `accounts`).
    Admin,
}

impl KeyRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::ProjectKubernetes => "project-kubernetes",
            Self::ListOnly => "list-only",
            Self::ListOnlyDenyRest => "list-only-deny",
            Self::Admin => "admin",
        }
    }

    /// Whether the role is the Root Admin's (see [`KeyRole::Admin`]).
    pub fn is_root_admin(self) -> bool {
        self == Self::Admin
    }

    /// Whether a key of this role may call `command`.
    pub fn allows(self, command: &str) -> bool {
        match self {
            Self::User => !ADMIN_COMMANDS.contains(&command),
            Self::Admin => true,
            Self::ProjectKubernetes => PROJECT_KUBERNETES_ROLE_COMMANDS.contains(&command),
            Self::ListOnly => {
                command.starts_with("list")
                    || command == "queryAsyncJobResult"
                    || command == "scaleKubernetesCluster"
            }
            Self::ListOnlyDenyRest => command.starts_with("list"),
        }
    }

    /// Whether a scale job of this key may operate on the cluster (checked inside the job).
    pub fn may_scale(self) -> bool {
        !matches!(self, Self::ListOnly | Self::ListOnlyDenyRest)
    }
}

/// The served commands of the API's admin package, which the User role's rules do not allow
/// (answered 432). A role whose own rules allow `list*` ([`KeyRole::ListOnly`],
/// [`KeyRole::ListOnlyDenyRest`]) matches `listConfigurations` too, and is let through
/// (*unverified* what a real non-admin caller is then shown).
pub const ADMIN_COMMANDS: &[&str] = &["listConfigurations"];

/// The served commands in `KubernetesClusterManagerImpl.PROJECT_KUBERNETES_ACCOUNT_ROLE_ALLOWED_APIS`
/// (`QueryAsyncJobResultCmd`, `ListVMsCmd`, `ListKubernetesClustersCmd`,
/// `ScaleKubernetesClusterCmd`; the rest of that list is networking the simulator does not serve).
pub const PROJECT_KUBERNETES_ROLE_COMMANDS: &[&str] = &[
    "listKubernetesClusters",
    "scaleKubernetesCluster",
    "queryAsyncJobResult",
    "listVirtualMachines",
];

impl fmt::Display for KeyRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KeyRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "user" => Ok(Self::User),
            "project-kubernetes" | "projectkubernetes" => Ok(Self::ProjectKubernetes),
            "list-only" | "listonly" => Ok(Self::ListOnly),
            "list-only-deny" | "listonlydeny" => Ok(Self::ListOnlyDenyRest),
            "admin" | "root-admin" => Ok(Self::Admin),
            _ => Err(format!(
                "unknown key role {s:?}: expected user, project-kubernetes, list-only, list-only-deny or admin"
            )),
        }
    }
}

/// The CloudStack project that owns every simulated cluster, its VMs included (a CKS cluster
/// created in a project, whose key CKS 4.19.3 / 4.20.1 on makes a member of it).
///
/// CloudStack leaves a project's resources out of a list unless the call names the project
/// (`AccountManagerImpl.buildACLSearchParameters`: without `projectid`,
/// `ListProjectResourcesCriteria.SkipProjectResources`, or only the caller's own account when
/// an `id` is given), so with a project set `listKubernetesClusters` and `listVirtualMachines`
/// answer an empty list unless `projectid` is this project's id or `-1`; see `api::project_scope`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    /// The project's UUID (what `projectid` takes and list answers show as `projectid`).
    pub id: String,
    /// Its name (list answers show it as `project`).
    pub name: String,
}

impl Project {
    /// The name a project gets when none is given.
    pub const DEFAULT_NAME: &'static str = "cks-project";

    /// A project with id `id` (a UUID: CloudStack's ids are) and `name`.
    pub fn new(id: &str, name: &str) -> Result<Self, String> {
        let id = id.trim();
        if !crate::ids::is_uuid(id) {
            return Err(format!(
                "project id {id:?} is not a UUID (8-4-4-4-12 hex digits, as CloudStack's ids are)"
            ));
        }
        let name = name.trim();
        if name.is_empty() {
            return Err("a project name cannot be empty".into());
        }
        Ok(Self {
            id: id.to_ascii_lowercase(),
            name: name.to_string(),
        })
    }
}

/// Timings and faults: everything `simConfigure` can change while the simulator runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSettings {
    /// Added to every CloudStack command before it is handled (not to `sim*` commands).
    pub latency: Duration,
    /// Added, on top of `latency`, to one command (its name, any case): a management server
    /// slow on one command while it answers the others at once (*unverified*: no recording
    /// shows one; a loaded server's async-job table, or a VM's lock held by another job, are
    /// the plausible causes). `simConfigure commandlatency=stopVirtualMachine:5000`.
    pub command_latency: Option<(String, Duration)>,
    /// Share (0..=1) of requests answered with an HTTP 5xx HTML page, as a proxy in front of
    /// CloudStack would; such a request is not executed.
    pub error_rate: f64,
    /// Share (0..=1) of requests executed whose connection is then closed without a response
    /// (the client cannot know whether the command ran).
    pub drop_rate: f64,
    /// Share (0..=1) of requests executed whose JSON answer is cut in half.
    pub malformed_rate: f64,
    /// Share (0..=1) of requests executed and then answered with a proxy's HTML 504 page, as
    /// a proxy whose read timeout ran out while CloudStack carried the command out answers
    /// (*unverified* for any given proxy; nginx's `proxy_read_timeout` behaves so).
    pub late_error_rate: f64,
    /// How long a scale job takes (provisioning or removal), before waiting for nodes.
    pub job_duration: Duration,
    /// Forced failure of scale-up jobs.
    pub job_failure: JobFailure,
    /// `true`: CloudStack with the change that lets a cluster in Alert be scaled under seven
    /// rules. `false`: an older CloudStack that refuses every request in Alert.
    pub alert_scaling: bool,
    /// Delay between a VM reaching `Running` and its Kubernetes node being registered and Ready.
    pub kubelet_delay: Duration,
    /// Period of the status scanner (Running -> Alert on a down VM, Alert -> Running on recovery).
    /// CloudStack runs it every 30 s.
    pub scanner_interval: Duration,
    /// Duration of `startVirtualMachine` / `stopVirtualMachine` jobs.
    pub vm_op_duration: Duration,
    /// How often a scale-up job checks whether the nodes are Ready (CloudStack: 15 s).
    pub ready_poll: Duration,
    /// How long a scale-up job waits for Ready nodes before failing
    /// (`cloud.kubernetes.cluster.scale.timeout`, 3600 s on CloudStack).
    pub scale_timeout: Duration,
    /// `cloud.kubernetes.cluster.max.size`: the largest worker count plus control nodes allowed.
    pub max_cluster_size: u64,
    /// Time from `scaleKubernetesCluster` returning its jobid to a worker picking the job up.
    /// Zero: the job validates and moves the cluster to Scaling inside the API call (the
    /// simulator's historical shortcut). Above zero, CloudStack's real order: the call only
    /// parses parameters and queues the job; after this delay the job validates against the
    /// cluster as it is *then*, fails (530) or moves it to Scaling and runs. Until then
    /// listings show the old state and size, and two queued jobs on one cluster can both be
    /// accepted, the later one failing at its pick-up (see `jobs::run_pickup`).
    pub pickup_delay: Duration,
    /// Time a removal job spends on each node it removes (drain, VM destroyed and expunged:
    /// CloudStack removes them one after another, `KubernetesClusterScaleWorker
    /// .scaleDownKubernetesClusterSize`). Zero: a removal job takes `job_duration` whatever the
    /// number of nodes, shared among them. Above zero: `job_duration` (the job's own part)
    /// plus this for every node.
    pub removal_per_node: Duration,
    /// Injected transient drain failures: the next this many drains of a removal job fail (as
    /// `kubectl drain` failing over SSH would), one per drain, whatever the node's state. Each
    /// failure fails its job. Drains of down VMs (not drained) do not count.
    pub fail_drains: u32,
    /// A size-only request is given the cluster's own offering for every node type
    /// (`KubernetesClusterManagerImpl.createNodeTypeToServiceOfferingMap` puts it under
    /// DEFAULT when the request names none; apache/cloudstack#11994), so a node type whose VMs
    /// run another offering is "scaled" to it, and on KVM with running VMs the job fails
    /// "scaling Kubernetes cluster with running VMs on hypervisor KVM is not supported!"
    /// (`KubernetesClusterScaleWorker.validateKubernetesClusterScaleOfferingParameters`). Off
    /// by default: scenarios with per-type offerings on the default KVM scale as before.
    pub size_default_offering: bool,
    /// A stored version of `KubernetesClusterScaleWorker.scaleCluster` returns `true` from its
    /// node-type loop at the first type that needs neither an offering nor a size change: with
    /// DEFAULT in the offering map (above) that is CONTROL, before WORKER is reached, so a
    /// size-only job ends successfully with nothing changed, the cluster not even moved to
    /// Scaling. Off by default.
    pub size_job_returns_early: bool,
    /// The role of the API key's account (see [`KeyRole`]).
    pub key_role: KeyRole,
    /// The project owning every cluster and VM (see [`Project`]). `None`: they are the key's
    /// account's own, and `projectid` is ignored (no project exists to name).
    pub project: Option<Project>,
    /// CloudStack's `default.page.size` (500 by default): the most items a list answer holds
    /// when no `pagesize` is given, and the largest `pagesize` accepted
    /// (`BaseListCmd.getPageSize`: a larger one is a 431).
    pub default_page_size: u64,
    /// `api.throttling.enabled` (CloudStack's default: off): CloudStack's API rate limit, per
    /// account, in fixed windows (see `throttle`). Off here too unless a test turns it on.
    pub throttling: bool,
    /// `api.throttling.max` (25): calls an account may make per window; the next ones are
    /// answered 429 until the window ends.
    pub throttling_max: u32,
    /// `api.throttling.interval` (1 s; whole seconds on CloudStack, any number of milliseconds
    /// here): a window's length, from the first call that opens it.
    pub throttling_interval: Duration,
}

impl Default for SimSettings {
    fn default() -> Self {
        Self {
            latency: Duration::ZERO,
            command_latency: None,
            error_rate: 0.0,
            drop_rate: 0.0,
            malformed_rate: 0.0,
            late_error_rate: 0.0,
            job_duration: Duration::from_secs(3),
            job_failure: JobFailure::None,
            alert_scaling: true,
            kubelet_delay: Duration::from_secs(2),
            scanner_interval: Duration::from_secs(5),
            vm_op_duration: Duration::from_secs(1),
            ready_poll: Duration::from_millis(250),
            scale_timeout: Duration::from_secs(3600),
            max_cluster_size: 50,
            pickup_delay: Duration::ZERO,
            removal_per_node: Duration::ZERO,
            fail_drains: 0,
            size_default_offering: false,
            size_job_returns_early: false,
            key_role: KeyRole::User,
            project: None,
            default_page_size: 500,
            throttling: false,
            throttling_max: 25,
            throttling_interval: Duration::from_secs(1),
        }
    }
}

impl SimSettings {
    /// Millisecond-scale timings for tests: jobs of 40 ms, nodes Ready 20 ms after their VM
    /// runs, a 20 ms status scanner, 10 ms VM operations.
    pub fn fast() -> Self {
        Self {
            job_duration: Duration::from_millis(40),
            kubelet_delay: Duration::from_millis(20),
            scanner_interval: Duration::from_millis(20),
            vm_op_duration: Duration::from_millis(10),
            ready_poll: Duration::from_millis(5),
            scale_timeout: Duration::from_secs(30),
            ..Self::default()
        }
    }

    /// Applies one `simConfigure` parameter (`latencyms=250`, `jobfailure=capacity`, ...).
    /// Returns `Ok(false)` when `name` is not a setting.
    pub fn apply(&mut self, name: &str, value: &str) -> Result<bool, String> {
        let ms = |v: &str| -> Result<Duration, String> {
            v.trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| format!("{name} must be a whole number of milliseconds, got {v:?}"))
        };
        let rate = |v: &str| -> Result<f64, String> {
            match v.trim().parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                _ => Err(format!(
                    "{name} must be a number between 0 and 1, got {v:?}"
                )),
            }
        };
        match name {
            "latencyms" => self.latency = ms(value)?,
            "commandlatency" => {
                self.command_latency = match value.trim() {
                    "none" => None,
                    v => {
                        let (command, delay) = v.split_once(':').ok_or_else(|| {
                            format!(
                                "commandlatency must be COMMAND:MILLISECONDS or none, got {v:?}"
                            )
                        })?;
                        if command.is_empty() {
                            return Err(format!("commandlatency names no command: {v:?}"));
                        }
                        Some((command.to_string(), ms(delay)?))
                    }
                }
            }
            "errorrate" => self.error_rate = rate(value)?,
            "droprate" => self.drop_rate = rate(value)?,
            "malformedrate" => self.malformed_rate = rate(value)?,
            "lateerrorrate" => self.late_error_rate = rate(value)?,
            "jobdurationms" => self.job_duration = ms(value)?,
            "jobfailure" => self.job_failure = value.parse()?,
            "alertscaling" => {
                self.alert_scaling =
                    parse_switch(value).map_err(|e| format!("alertscaling: {e}"))?
            }
            "kubeletdelayms" => self.kubelet_delay = ms(value)?,
            "sizedefaultoffering" => {
                self.size_default_offering =
                    parse_switch(value).map_err(|e| format!("sizedefaultoffering: {e}"))?
            }
            "sizejobreturnsearly" => {
                self.size_job_returns_early =
                    parse_switch(value).map_err(|e| format!("sizejobreturnsearly: {e}"))?
            }
            "scannerintervalms" => {
                let d = ms(value)?;
                if d.is_zero() {
                    return Err("scannerintervalms must be at least 1".into());
                }
                self.scanner_interval = d;
            }
            "vmopms" => self.vm_op_duration = ms(value)?,
            "readypollms" => {
                let d = ms(value)?;
                if d.is_zero() {
                    return Err("readypollms must be at least 1".into());
                }
                self.ready_poll = d;
            }
            "scaletimeoutms" => self.scale_timeout = ms(value)?,
            "pickupdelayms" => self.pickup_delay = ms(value)?,
            "removalpernodems" => self.removal_per_node = ms(value)?,
            "faildrains" => {
                self.fail_drains = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("faildrains must be a whole number, got {value:?}"))?
            }
            "keyrole" => self.key_role = value.parse()?,
            // `projectid=<uuid>` puts every cluster in that project (keeping a name given
            // before); `projectid=none` (or empty) takes them out of any project.
            "projectid" => {
                let v = value.trim();
                self.project = if v.is_empty() || v.eq_ignore_ascii_case("none") {
                    None
                } else {
                    let name = self
                        .project
                        .as_ref()
                        .map_or(Project::DEFAULT_NAME, |p| p.name.as_str());
                    Some(Project::new(v, name).map_err(|e| format!("projectid: {e}"))?)
                };
            }
            "projectname" => match &mut self.project {
                Some(p) => {
                    p.name = Project::new(&p.id, value)
                        .map_err(|e| format!("projectname: {e}"))?
                        .name
                }
                None => {
                    return Err(
                        "projectname needs a project: set projectid too (simConfigure applies projectid first)"
                            .into(),
                    );
                }
            },
            "defaultpagesize" => {
                let n: u64 = value.trim().parse().map_err(|_| {
                    format!("defaultpagesize must be a whole number, got {value:?}")
                })?;
                if n == 0 {
                    return Err("defaultpagesize must be at least 1".into());
                }
                self.default_page_size = n;
            }
            "throttling" => {
                self.throttling = parse_switch(value).map_err(|e| format!("throttling: {e}"))?
            }
            "throttlingmax" => {
                self.throttling_max = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("throttlingmax must be a whole number, got {value:?}"))?
            }
            "throttlingintervalms" => {
                let d = ms(value)?;
                if d.is_zero() {
                    return Err("throttlingintervalms must be at least 1".into());
                }
                self.throttling_interval = d;
            }
            "maxclustersize" => {
                self.max_cluster_size = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("maxclustersize must be a whole number, got {value:?}"))?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The settings as `simConfigure` echoes them.
    pub fn to_json(&self) -> serde_json::Value {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        serde_json::json!({
            "latencyms": ms(self.latency),
            "commandlatency": self
                .command_latency
                .as_ref()
                .map_or("none".to_string(), |(c, d)| format!("{c}:{}", ms(*d))),
            "errorrate": self.error_rate,
            "droprate": self.drop_rate,
            "malformedrate": self.malformed_rate,
            "lateerrorrate": self.late_error_rate,
            "jobdurationms": ms(self.job_duration),
            "jobfailure": self.job_failure.as_str(),
            "alertscaling": if self.alert_scaling { "on" } else { "off" },
            "kubeletdelayms": ms(self.kubelet_delay),
            "sizedefaultoffering": if self.size_default_offering { "on" } else { "off" },
            "sizejobreturnsearly": if self.size_job_returns_early { "on" } else { "off" },
            "scannerintervalms": ms(self.scanner_interval),
            "vmopms": ms(self.vm_op_duration),
            "readypollms": ms(self.ready_poll),
            "scaletimeoutms": ms(self.scale_timeout),
            "maxclustersize": self.max_cluster_size,
            "pickupdelayms": ms(self.pickup_delay),
            "removalpernodems": ms(self.removal_per_node),
            "faildrains": self.fail_drains,
            "keyrole": self.key_role.as_str(),
            "projectid": self.project.as_ref().map_or("none", |p| p.id.as_str()),
            "projectname": self.project.as_ref().map(|p| p.name.as_str()),
            "defaultpagesize": self.default_page_size,
            "throttling": if self.throttling { "on" } else { "off" },
            "throttlingmax": self.throttling_max,
            "throttlingintervalms": ms(self.throttling_interval),
        })
    }
}

/// An on/off value of the simulator's own flags and `simConfigure` parameters: `on`, `off`,
/// `true`, `false`, `yes`, `no`, `1` or `0`, in any case.
pub fn parse_switch(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(format!(
            "{v:?} is not on/off: use on, off, true, false, yes, no, 1 or 0"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_parses_and_rejects() {
        let mut s = SimSettings::default();
        assert_eq!(s.apply("latencyms", "250"), Ok(true));
        assert_eq!(s.latency, Duration::from_millis(250));
        assert_eq!(
            s.apply("commandlatency", "stopVirtualMachine:5000"),
            Ok(true)
        );
        assert_eq!(
            s.command_latency,
            Some(("stopVirtualMachine".into(), Duration::from_millis(5000)))
        );
        assert_eq!(s.to_json()["commandlatency"], "stopVirtualMachine:5000");
        assert!(s.apply("commandlatency", "stopVirtualMachine").is_err());
        assert!(s.apply("commandlatency", ":5").is_err());
        assert_eq!(s.apply("commandlatency", "none"), Ok(true));
        assert_eq!(s.command_latency, None);
        assert_eq!(s.apply("jobfailure", "Capacity"), Ok(true));
        assert_eq!(s.job_failure, JobFailure::Capacity);
        assert_eq!(s.apply("alertscaling", "off"), Ok(true));
        assert!(!s.alert_scaling);
        assert!(
            s.apply("errorrate", "1.5")
                .unwrap_err()
                .contains("between 0 and 1")
        );
        assert!(
            s.apply("jobdurationms", "-3")
                .unwrap_err()
                .contains("milliseconds")
        );
        assert_eq!(s.apply("colour", "red"), Ok(false));
        assert_eq!(s.to_json()["latencyms"], 250);
        assert_eq!(SimSettings::default().pickup_delay, Duration::ZERO);
        assert_eq!(s.apply("pickupdelayms", "100"), Ok(true));
        assert_eq!(s.pickup_delay, Duration::from_millis(100));
        assert_eq!(s.to_json()["pickupdelayms"], 100);
        assert_eq!(s.apply("faildrains", "2"), Ok(true));
        assert_eq!(s.fail_drains, 2);
        assert_eq!(s.apply("keyrole", "project-kubernetes"), Ok(true));
        assert_eq!(s.key_role, KeyRole::ProjectKubernetes);
        assert_eq!(s.apply("keyrole", "admin"), Ok(true));
        assert!(s.key_role.is_root_admin());
        assert!(s.apply("keyrole", "superuser").is_err());
        assert_eq!(SimSettings::default().project, None);
        assert!(s.apply("projectname", "p").is_err(), "no project yet");
        let id = "0f3c5a2e-1b7d-4c8e-9a6f-2d4b8e1c7a90";
        assert_eq!(s.apply("projectid", &id.to_ascii_uppercase()), Ok(true));
        assert_eq!(
            s.project,
            Some(Project::new(id, Project::DEFAULT_NAME).unwrap())
        );
        assert_eq!(s.apply("projectname", "team-a"), Ok(true));
        assert_eq!(s.to_json()["projectid"], id);
        assert_eq!(s.to_json()["projectname"], "team-a");
        assert!(
            s.apply("projectid", "p-1")
                .unwrap_err()
                .contains("not a UUID")
        );
        assert!(s.apply("projectname", " ").is_err());
        assert_eq!(s.project.as_ref().map(|p| p.name.as_str()), Some("team-a"));
        assert_eq!(s.apply("projectid", "none"), Ok(true));
        assert_eq!(s.project, None);
        assert_eq!(s.to_json()["projectid"], "none");
        assert_eq!(SimSettings::default().default_page_size, 500);
        assert_eq!(s.apply("defaultpagesize", "100"), Ok(true));
        assert_eq!(s.to_json()["defaultpagesize"], 100);
        assert!(s.apply("defaultpagesize", "0").is_err());
        // CloudStack's defaults: off, 25 calls per 1 s window.
        let d = SimSettings::default();
        assert!(!d.throttling);
        assert_eq!(
            (d.throttling_max, d.throttling_interval),
            (25, Duration::from_secs(1))
        );
        assert_eq!(s.apply("throttling", "on"), Ok(true));
        assert_eq!(s.apply("throttlingmax", "3"), Ok(true));
        assert_eq!(s.apply("throttlingintervalms", "250"), Ok(true));
        assert!(s.throttling);
        assert_eq!(s.throttling_max, 3);
        assert_eq!(s.throttling_interval, Duration::from_millis(250));
        assert_eq!(s.to_json()["throttling"], "on");
        assert_eq!(s.to_json()["throttlingintervalms"], 250);
        assert!(s.apply("throttlingintervalms", "0").is_err());
        assert!(s.apply("throttlingmax", "-1").is_err());
    }
}
