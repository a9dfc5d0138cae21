//! `cks-sim`: the CloudStack (CKS) API simulator on its own. Parses flags, builds a
//! [`SimConfig`], binds the listen address and serves until Ctrl-C.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cks_sim::{self as sim, JobFailure, KeyRole, Project, Scenario, SimConfig, SimSettings};
use clap::Parser;

/// A CloudStack API simulator that behaves like CloudStack Kubernetes Service (CKS), Alert
/// rules included. Serves the CloudStack query API (response=json) at /client/api, plus the
/// unsigned simulator-only commands simListNodes, simConfigure, simRequests, simResetRequests,
/// simSetVmState and simSetNode.
#[derive(Debug, Parser)]
#[command(name = "cks-sim", version)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080", env = "CKS_SIM_LISTEN")]
    listen: SocketAddr,
    /// API key requests must carry; generated (and printed) when absent.
    #[arg(long, env = "CKS_SIM_API_KEY")]
    api_key: Option<String>,
    /// Secret key requests are signed with; generated (and printed) when absent.
    #[arg(long, env = "CKS_SIM_SECRET_KEY")]
    secret_key: Option<String>,
    /// Scenario file (.yaml, .yml or .toml) describing zone, offerings and clusters. Without it,
    /// the demo cluster "demo" (1 control, 3 workers, Running, autoscaling 1..10).
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Seed of every generated id (zone, offerings, clusters, VMs, jobs) and of fault decisions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// on: CloudStack with Alert scaling (a cluster in Alert may be scaled under seven rules).
    /// off: an older CloudStack that refuses every scale request in Alert.
    #[arg(long, default_value = "on", value_name = "on|off", action = clap::ArgAction::Set, value_parser = cks_sim::config::parse_switch)]
    alert_scaling: bool,
    /// The version listCapabilities reports.
    #[arg(long, default_value = "4.22.0.0")]
    cloudstack_version: String,
    /// Duration of a scale job (provisioning or removal), in milliseconds.
    #[arg(long, default_value_t = 3000)]
    job_duration_ms: u64,
    /// Delay between a VM reaching Running and its Kubernetes node being Ready, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    kubelet_delay_ms: u64,
    /// Period of the status scanner (Running <-> Alert), in milliseconds (CloudStack: 30000).
    #[arg(long, default_value_t = 5000)]
    scanner_interval_ms: u64,
    /// Duration of startVirtualMachine/stopVirtualMachine jobs, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    vm_op_ms: u64,
    /// How often a scale-up job checks for Ready nodes, in milliseconds (CloudStack: 15000).
    #[arg(long, default_value_t = 250)]
    ready_poll_ms: u64,
    /// How long a scale-up job waits for Ready nodes before failing, in milliseconds.
    #[arg(long, default_value_t = 3_600_000)]
    scale_timeout_ms: u64,
    /// cloud.kubernetes.cluster.max.size: largest worker count plus control nodes.
    #[arg(long, default_value_t = 50)]
    max_cluster_size: u64,
    /// Time from scaleKubernetesCluster returning its jobid to a worker picking the job up, in
    /// milliseconds. 0: the request is validated and the cluster moved to Scaling before the
    /// answer. Above 0, CloudStack's order: the job validates against the cluster as it is
    /// when picked up, and until then listings show the old state and size.
    #[arg(long, default_value_t = 0)]
    pickup_delay_ms: u64,
    /// Time a removal job spends on each node it removes, in milliseconds. 0: a removal job
    /// takes --job-duration-ms whatever the number of nodes. Above 0: --job-duration-ms plus
    /// this per node.
    #[arg(long, default_value_t = 0)]
    removal_per_node_ms: u64,
    /// The next this many node drains of removal jobs fail (an injected transient kubectl/SSH
    /// failure); each such failure fails its job and puts the cluster in Alert.
    #[arg(long, default_value_t = 0)]
    fail_drains: u32,
    /// The role of the API key's account: user (every command served but the administrators'
    /// listConfigurations), project-kubernetes (CKS's Project Kubernetes Service Role: only
    /// listKubernetesClusters, scaleKubernetesCluster, queryAsyncJobResult and
    /// listVirtualMachines; any other command is answered 432), list-only (list* only; scale
    /// jobs fail on the caller's right) or admin (the Root Admin: every command, never
    /// throttled, every account's resources).
    #[arg(
        long,
        default_value = "user",
        value_name = "user|project-kubernetes|list-only|admin"
    )]
    key_role: KeyRole,
    /// Put every cluster (and its VMs) in the CloudStack project with this id (a UUID), as a
    /// CKS cluster created in a project is: listKubernetesClusters and listVirtualMachines then
    /// list them only with projectid=<this id> (or -1), answer an empty list without projectid,
    /// refuse another id, and show projectid/project instead of account.
    #[arg(long, value_name = "UUID", value_parser = project_id)]
    project_id: Option<String>,
    /// The project's name (what list answers show as `project`); needs --project-id.
    #[arg(long, requires = "project_id", default_value = Project::DEFAULT_NAME)]
    project_name: String,
    /// CloudStack's default.page.size: the most items a list answer holds without pagesize,
    /// and the largest pagesize accepted (a larger one is answered 431).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    default_page_size: u64,
    /// CloudStack's API throttling (api.throttling.enabled): per account, at most
    /// --throttling-max calls per --throttling-interval-ms window; the next are answered 429
    /// "The given user has reached his/her account api limit, please retry after [N] ms."
    #[arg(long, default_value = "off", value_name = "on|off", action = clap::ArgAction::Set, value_parser = cks_sim::config::parse_switch)]
    throttling: bool,
    /// api.throttling.max: calls an account may make per window.
    #[arg(long, default_value_t = 25)]
    throttling_max: u32,
    /// api.throttling.interval, in milliseconds (CloudStack: whole seconds, default 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    throttling_interval_ms: u64,
    /// Latency added to every CloudStack command, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Share (0..1) of requests answered with an HTML HTTP 5xx page (not executed).
    #[arg(long, default_value_t = 0.0, value_parser = rate)]
    error_rate: f64,
    /// Share (0..1) of requests executed whose connection is then closed without an answer.
    #[arg(long, default_value_t = 0.0, value_parser = rate)]
    drop_rate: f64,
    /// Share (0..1) of requests executed whose JSON answer is cut in half.
    #[arg(long, default_value_t = 0.0, value_parser = rate)]
    malformed_rate: f64,
    /// Forced failure of scale-up jobs: none, capacity (no host, before any VM is created),
    /// partial (the last new VM ends in Error) or never (the job never finishes).
    #[arg(long, default_value = "none")]
    job_failure: JobFailure,
}

fn project_id(s: &str) -> Result<String, String> {
    Project::new(s, Project::DEFAULT_NAME).map(|p| p.id)
}

fn rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("expected a number between 0 and 1, got {s:?}")),
    }
}

impl Cli {
    fn config(self) -> anyhow::Result<(SocketAddr, SimConfig)> {
        let scenario = match &self.scenario {
            Some(path) => Scenario::load(path)?,
            None => Scenario::demo(),
        };
        let ms = Duration::from_millis;
        let settings = SimSettings {
            latency: ms(self.latency_ms),
            // Set at run time through `simConfigure` (`commandlatency`).
            command_latency: None,
            error_rate: self.error_rate,
            drop_rate: self.drop_rate,
            malformed_rate: self.malformed_rate,
            // Set at run time through `simConfigure` (`lateerrorrate`).
            late_error_rate: 0.0,
            job_duration: ms(self.job_duration_ms),
            job_failure: self.job_failure,
            alert_scaling: self.alert_scaling,
            kubelet_delay: ms(self.kubelet_delay_ms),
            scanner_interval: ms(self.scanner_interval_ms.max(1)),
            vm_op_duration: ms(self.vm_op_ms),
            ready_poll: ms(self.ready_poll_ms.max(1)),
            scale_timeout: ms(self.scale_timeout_ms),
            max_cluster_size: self.max_cluster_size,
            pickup_delay: ms(self.pickup_delay_ms),
            removal_per_node: ms(self.removal_per_node_ms),
            fail_drains: self.fail_drains,
            // Set at run time through `simConfigure` (`sizedefaultoffering`, `sizejobreturnsearly`).
            size_default_offering: false,
            size_job_returns_early: false,
            key_role: self.key_role,
            project: match &self.project_id {
                Some(id) => Some(Project::new(id, &self.project_name).map_err(anyhow::Error::msg)?),
                None => None,
            },
            default_page_size: self.default_page_size,
            throttling: self.throttling,
            throttling_max: self.throttling_max,
            throttling_interval: ms(self.throttling_interval_ms),
        };
        let config = SimConfig {
            api_key: self.api_key.unwrap_or_default(),
            secret_key: self.secret_key.unwrap_or_default(),
            seed: self.seed,
            settings,
            scenario,
            cloudstack_version: self.cloudstack_version,
        };
        Ok((self.listen, config))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let (listen, config) = Cli::parse().config()?;
    let (api_key, secret_key) = sim::resolve_keys(&config);
    let mut config = SimConfig {
        api_key: api_key.clone(),
        secret_key: secret_key.clone(),
        ..config
    };
    sim::resolve_account_keys(&mut config);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    // Written without println!: a closed stdout must not stop the simulator.
    let mut out = std::io::stdout();
    let _ = writeln!(out, "cks-sim listening on http://{addr}/client/api");
    let _ = writeln!(out, "api-key:    {api_key}");
    let _ = writeln!(out, "secret-key: {secret_key}");
    for a in &config.scenario.accounts {
        let _ = writeln!(
            out,
            "account {}: api-key {} secret-key {}",
            a.name,
            a.api_key.as_deref().unwrap_or_default(),
            a.secret_key.as_deref().unwrap_or_default()
        );
    }
    let _ = out.flush();
    sim::serve(listener, config, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
