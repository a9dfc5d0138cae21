//! What the operator chose (the `serve` flags) and the defaults a test or the demo starts
//! from. Kept apart from the machinery that reads it so that every knob, and why it exists,
//! is documented in one place; nothing here acts on a setting.

use crate::config::{BoundNodeGroup, NodeGroupSpec};
use std::time::Duration;

/// Whether the CloudStack behind the provider scales clusters in Alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AlertScalingMode {
    /// Assume it does until CloudStack refuses a request because the cluster is in Alert; from
    /// then on refuse such requests locally with CloudStack's text.
    Auto,
    /// This CloudStack has the Alert-scaling change.
    On,
    /// This CloudStack refuses every scale request in Alert.
    Off,
}

/// Whether a scale-up of a cluster with external nodes is sent (`machine::external`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExternalNodeScaleUp {
    /// Refused before any promise: CloudStack fails it on an isolated or VPC network
    /// (apache/cloudstack#12633) after creating the VMs, and strands the cluster.
    Refuse,
    /// Sent: the cluster's network is shared (CloudStack writes no rules) or CloudStack has
    /// the fix. A failure on the network rules is remembered for the cluster.
    Allow,
}

/// Provider behaviour settings (the `serve` flags).
#[derive(Debug, Clone)]
pub struct Settings {
    pub groups: Vec<NodeGroupSpec>,
    /// The client each group of `groups` is served to (`--nodes …@CLIENT`), by position; a
    /// group without an entry, or with `None`, is served to every client.
    pub clients: Vec<Option<String>>,
    /// The autoscaler's max-node-provision-time: for that long after an autoscaler reported
    /// a VM's node (NodeGroupForNode), the VM is not deleted through a fake "unregistered"
    /// node.
    pub max_node_provision_time: Duration,
    /// How often a followed job is polled with `queryAsyncJobResult`.
    pub job_poll_interval: Duration,
    /// A Refresh within this time of the last successful fetch reuses it (several autoscaler
    /// loops, or a Refresh right after a job finished, cost no extra CloudStack call).
    pub refresh_min_interval: Duration,
    /// How old a snapshot may be and still be served when CloudStack cannot be reached.
    pub staleness_bound: Duration,
    /// How many refresh rounds (one cluster each) may ask CloudStack at once; the others
    /// wait their turn in the order they came.
    pub refresh_concurrency: usize,
    /// How long a scale RPC watches the job it submitted for an immediate refusal
    /// (CloudStack validates inside the job). Capped by the request's own deadline.
    pub scale_watch: Duration,
    /// The deadline assumed when a request carries no `grpc-timeout` (the autoscaler's
    /// default is 5 s).
    pub default_rpc_deadline: Duration,
    pub alert_scaling: AlertScalingMode,
    pub external_node_scale_up: ExternalNodeScaleUp,
    /// How long instances of a failed scale-up are reported (so the autoscaler deletes them
    /// and backs off) before they are forgotten.
    pub failed_instance_ttl: Duration,
    /// How long a job is polled every `job_poll_interval` (CloudStack's own scale timeout is
    /// one hour by default); a job still running after it is polled rarely, and stays the
    /// group's operation. Also how far back `listAsyncJobs` is searched for a running job.
    pub job_max_follow: Duration,
    /// How long a verdict "this CloudStack does not scale in Alert", learned from one of its
    /// refusals, stands before CloudStack is asked again (a changed `cloudstackversion` drops
    /// it at once).
    pub alert_recheck: Duration,
    /// How long DeleteNodes calls arriving at rest are collected into one `nodeids` request
    /// (the autoscaler sends one call per node, in parallel). Capped by the first call's
    /// deadline.
    pub removal_window: Duration,
    /// GPULabel answer.
    pub gpu_label: String,
    /// GetAvailableGPUTypes answer.
    pub gpu_types: Vec<String>,
    /// Client names shut out (`--deny-client`): a caller holding one sees no group.
    pub denied_clients: Vec<String>,
    /// Where every group's promises are recorded (`--state-file`); `None`: nowhere, they end
    /// with the process.
    pub state_file: Option<std::path::PathBuf>,
    /// The ConfigMap every group's promises are recorded in instead (`--state-configmap`).
    pub state_configmap: Option<crate::kube::ConfigMapRef>,
    /// The API server of the cluster the one node group scales (`--confirm-node-marks`): an
    /// owed removal is tried again only while its Node still carries the autoscaler's mark.
    pub node_marks: Option<crate::kube::KubeConfig>,
    /// Leader election (`--leader-elect`): only while this replica leads does it submit to
    /// CloudStack or stop VMs; `None`: it always may.
    pub leadership: Option<crate::leader::Leadership>,
}

impl Settings {
    /// Groups bound to their clients (`--nodes MIN:MAX:CLUSTER[@CLIENT]`), defaults for
    /// everything else.
    pub fn with_bound_groups(groups: Vec<BoundNodeGroup>) -> Self {
        let (groups, clients) = groups.into_iter().map(|b| (b.group, b.client)).unzip();
        Settings {
            clients,
            ..Settings::with_groups(groups)
        }
    }

    /// Defaults for everything but the groups, which are served to every client.
    pub fn with_groups(groups: Vec<NodeGroupSpec>) -> Self {
        Settings {
            groups,
            clients: Vec::new(),
            // What the deploy manifests give the autoscaler (docs/operations.md §1).
            max_node_provision_time: Duration::from_secs(25 * 60),
            job_poll_interval: Duration::from_secs(2),
            refresh_min_interval: Duration::from_secs(5),
            staleness_bound: Duration::from_secs(120),
            refresh_concurrency: 16,
            scale_watch: Duration::from_millis(1500),
            default_rpc_deadline: Duration::from_secs(5),
            alert_scaling: AlertScalingMode::Auto,
            external_node_scale_up: ExternalNodeScaleUp::Refuse,
            failed_instance_ttl: Duration::from_secs(30 * 60),
            job_max_follow: Duration::from_secs(2 * 3600),
            removal_window: Duration::from_millis(500),
            alert_recheck: Duration::from_secs(10 * 60),
            gpu_label: String::new(),
            gpu_types: Vec::new(),
            denied_clients: Vec::new(),
            state_file: None,
            state_configmap: None,
            node_marks: None,
            leadership: None,
        }
    }
}
