//! Command-line interface: the flags of `serve` and `probe`, and `serve --config FILE`
//! folded into them. Parsing only: what the `serve` flags build and run is in `app`. Every
//! flag also reads an environment variable (`CKS_PROVIDER_…`). Secrets are never taken as
//! flags: they come from the cloud-config file, a file path, or an environment variable.

use crate::grammar::parse_duration;
use crate::provider::{AlertScalingMode, ExternalNodeScaleUp};
use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// cks-autoscaler-provider: the Kubernetes cluster-autoscaler's externalgrpc cloud provider
/// for Apache CloudStack Kubernetes Service (CKS).
#[derive(Debug, Parser)]
#[command(name = "cks-autoscaler-provider", version, about, long_about = None)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        env = "CKS_PROVIDER_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the externalgrpc CloudProvider service.
    Serve(Box<ServeArgs>),
    /// Show what the autoscaler sees through the provider's RPCs: node groups, target
    /// sizes, instances with their status and errors, why a group cannot scale.
    Probe(crate::probe::ProbeArgs),
    /// Check, before serving, which commands the CloudStack key allows: each cluster --nodes
    /// names is listed, and every command the provider sends is tried without changing
    /// anything. Takes serve's flags (the same cloud-config, keys and --nodes); prints a table
    /// and exits non-zero when a required command is refused or a cluster is not listed.
    Check(Box<ServeArgs>),
}

/// `serve` flags.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// gRPC listen address.
    #[arg(long, env = "CKS_PROVIDER_LISTEN", default_value = "127.0.0.1:8086")]
    pub listen: SocketAddr,
    /// A read-only admin address, loopback only (127.0.0.0/8 or [::1]; a host name is
    /// refused): the same service, with the server certificate but no client certificate
    /// asked for, for `probe` run inside the provider's pod (`kubectl exec`). Its caller sees
    /// every node group and may change none (writes answer PERMISSION_DENIED). Off unless
    /// given.
    #[arg(long, env = "CKS_PROVIDER_ADMIN_LISTEN", value_name = "ADDR", value_parser = parse_loopback_address)]
    pub admin_listen: Option<SocketAddr>,
    /// CloudStack cloud-config (ini, `[Global]` api-url, api-key, secret-key, optional
    /// ssl-no-verify, project-id, zone): the file the in-tree cloudstack provider uses.
    #[arg(long, env = "CKS_PROVIDER_CLOUD_CONFIG")]
    pub cloud_config: Option<PathBuf>,
    /// A node group: MIN:MAX:CLUSTER (CKS cluster id or name), or MIN:MAX:CLUSTER@CLIENT to
    /// serve it only to the autoscaler whose client certificate names CLIENT (a DNS SAN, or
    /// the CN when it has none). Repeatable. With more than one, each must name its CLIENT
    /// and --tls-client-ca is required (client binding): an autoscaler never sees or changes
    /// another cluster's group. The cluster's own minsize/maxsize win when CKS autoscaling is
    /// enabled on it.
    #[arg(long = "nodes", env = "CKS_PROVIDER_NODES", value_delimiter = ';')]
    pub nodes: Vec<String>,
    /// Read the API key from this file instead of the cloud-config (env CKS_PROVIDER_API_KEY
    /// also works).
    #[arg(long, env = "CKS_PROVIDER_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Read the secret key from this file instead of the cloud-config (env
    /// CKS_PROVIDER_SECRET_KEY also works).
    #[arg(long, env = "CKS_PROVIDER_SECRET_KEY_FILE")]
    pub secret_key_file: Option<PathBuf>,
    /// Extra PEM CA bundle trusted for CloudStack's HTTPS certificate.
    #[arg(long, env = "CKS_PROVIDER_CLOUDSTACK_CA")]
    pub cloudstack_ca: Option<PathBuf>,
    /// Timeout of one CloudStack API call.
    #[arg(long, env = "CKS_PROVIDER_CLOUDSTACK_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub cloudstack_timeout: Duration,
    /// At most this many CloudStack API requests per second, all node groups together,
    /// spaced evenly and sent in the order asked (no limit unless given). Keep the key's
    /// account under CloudStack's api.throttling.max per api.throttling.interval (25 per
    /// second by default, when throttling is on), less what its other clients use.
    #[arg(long, env = "CKS_PROVIDER_CLOUDSTACK_MAX_RPS", value_parser = parse_rps)]
    pub cloudstack_max_rps: Option<f64>,
    /// How often a running scale job is polled (queryAsyncJobResult).
    #[arg(long, env = "CKS_PROVIDER_JOB_POLL_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub job_poll_interval: Duration,
    /// A Refresh within this time of the last fetch reuses it (no CloudStack call).
    #[arg(long, env = "CKS_PROVIDER_REFRESH_MIN_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub refresh_min_interval: Duration,
    /// How old a snapshot may be and still be served while CloudStack is unreachable;
    /// beyond it Refresh fails (UNAVAILABLE, naming CloudStack's error) and the CloudProvider
    /// service's gRPC health turns NOT_SERVING (readiness does not: the provider stays in its
    /// Service's endpoints). The provider refreshes every cluster on its own before it.
    #[arg(long, env = "CKS_PROVIDER_STALENESS_BOUND", default_value = "2m", value_parser = parse_duration)]
    pub staleness_bound: Duration,
    /// How long a scale RPC watches its new job for an immediate refusal (capped by the
    /// request's deadline).
    #[arg(long, env = "CKS_PROVIDER_SCALE_WATCH", default_value = "1500ms", value_parser = parse_duration)]
    pub scale_watch: Duration,
    /// How long a verdict "this CloudStack does not scale clusters in Alert", learned from one
    /// of its refusals, stands before CloudStack is asked again (a new cloudstackversion from
    /// listCapabilities drops it at once).
    #[arg(long, env = "CKS_PROVIDER_ALERT_RECHECK", default_value = "10m", value_parser = parse_duration)]
    pub alert_recheck: Duration,
    /// The longest DeleteNodes calls arriving together (the autoscaler sends one per node, in
    /// parallel) are collected into one scaleKubernetesCluster nodeids request; the
    /// collection ends sooner, 100 ms after the last call.
    #[arg(long, env = "CKS_PROVIDER_REMOVAL_WINDOW", default_value = "500ms", value_parser = parse_duration)]
    pub removal_window: Duration,
    /// How long a scale job is polled every --job-poll-interval; a job still running after
    /// this (CloudStack's own scale timeout is 1h) stays the cluster's operation and is polled
    /// 30 times less often. Also how far back listAsyncJobs is searched for a running job.
    #[arg(long, env = "CKS_PROVIDER_JOB_MAX_FOLLOW", default_value = "2h", value_parser = parse_duration)]
    pub job_max_follow: Duration,
    /// The autoscalers' --max-node-provision-time: for that long after an autoscaler that sees
    /// the VM's group reported its node (NodeGroupForNode), the VM is never deleted as
    /// "unregistered".
    /// Set it to the autoscalers' value (the deploy manifests use 25m).
    #[arg(long, env = "CKS_PROVIDER_MAX_NODE_PROVISION_TIME", default_value = "25m", value_parser = parse_duration)]
    pub max_node_provision_time: Duration,
    /// How long instances of a failed scale-up are reported before they are forgotten.
    #[arg(long, env = "CKS_PROVIDER_FAILED_INSTANCE_TTL", default_value = "30m", value_parser = parse_duration)]
    pub failed_instance_ttl: Duration,
    /// Whether this CloudStack scales clusters in Alert (auto: learn it from CloudStack's
    /// first refusal).
    #[arg(long, env = "CKS_PROVIDER_ALERT_SCALING", default_value = "auto")]
    pub alert_scaling: AlertScalingMode,
    /// Scale-ups of a cluster with external nodes: `refuse` (CloudStack fails them on an
    /// isolated or VPC network, apache/cloudstack#12633) or `allow` (the cluster's network is
    /// shared, or CloudStack has the fix).
    #[arg(
        long,
        env = "CKS_PROVIDER_EXTERNAL_NODE_SCALE_UP",
        default_value = "refuse"
    )]
    pub external_node_scale_up: ExternalNodeScaleUp,
    /// GPULabel answer (empty: no GPU label).
    #[arg(long, env = "CKS_PROVIDER_GPU_LABEL", default_value = "")]
    pub gpu_label: String,
    /// A GPU type for GetAvailableGPUTypes. Repeatable.
    #[arg(
        long = "gpu-type",
        env = "CKS_PROVIDER_GPU_TYPES",
        value_delimiter = ','
    )]
    pub gpu_types: Vec<String>,
    /// Pods per node in the template node (the kubelet's --max-pods on CKS workers).
    #[arg(long, env = "CKS_PROVIDER_MAX_PODS", default_value_t = 110)]
    pub max_pods: u64,
    /// CPU (millicores) reserved by the kubelet (system + kube reserved) on workers, left out
    /// of the template's allocatable.
    #[arg(long, env = "CKS_PROVIDER_RESERVED_CPU_MILLIS", default_value_t = 0)]
    pub reserved_cpu_millis: u64,
    /// Memory (MiB) reserved by the kubelet (system + kube reserved) on workers.
    #[arg(long, env = "CKS_PROVIDER_RESERVED_MEMORY_MIB", default_value_t = 0)]
    pub reserved_memory_mib: u64,
    /// A label KEY=VALUE added to every template node. Repeatable.
    #[arg(
        long = "template-label",
        env = "CKS_PROVIDER_TEMPLATE_LABELS",
        value_delimiter = ','
    )]
    pub template_labels: Vec<String>,
    /// A taint KEY[=VALUE]:EFFECT added to every template node. Repeatable.
    #[arg(
        long = "template-taint",
        env = "CKS_PROVIDER_TEMPLATE_TAINTS",
        value_delimiter = ';'
    )]
    pub template_taints: Vec<String>,
    /// Per-cluster autoscaling options (NodeGroupGetOptions), e.g.
    /// `CLUSTER:scale-down-unneeded=5m,max-node-provision=25m`. Repeatable. Without any, the
    /// autoscaler's own flags apply (recommended: see the warning printed when set).
    #[arg(
        long = "node-group-options",
        env = "CKS_PROVIDER_NODE_GROUP_OPTIONS",
        value_delimiter = ';'
    )]
    pub node_group_options: Vec<String>,
    /// Serve Prometheus `/metrics`, `/healthz` and `/readyz` over plain HTTP on this address.
    #[arg(long, env = "CKS_PROVIDER_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Server certificate (PEM) for gRPC TLS; re-read when the file changes.
    #[arg(long, env = "CKS_PROVIDER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Server private key (PEM) for gRPC TLS.
    #[arg(long, env = "CKS_PROVIDER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA (PEM) that client certificates must chain to: turns on mutual TLS (the autoscaler's
    /// cloud-config `cert`/`key`); clients without a valid certificate are refused at the
    /// handshake.
    #[arg(long, env = "CKS_PROVIDER_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// A client name (a DNS SAN or CN of client certificates) shut out: a caller whose
    /// certificate holds it sees no node group at all, whatever `--nodes` binds to it. For a
    /// client whose key leaked, until its certificate expires or the client CA is replaced.
    /// Repeatable; comma-separated in the environment variable.
    #[arg(
        long = "deny-client",
        env = "CKS_PROVIDER_DENY_CLIENTS",
        value_delimiter = ','
    )]
    pub deny_clients: Vec<String>,
    /// Where the provider records its promises (removals and increases answered OK and not
    /// done yet, the scale job in flight), replaced atomically on every change: a restarted
    /// provider reads it and carries them out. On a volume that outlives the process (one
    /// replica). Without it they end with the process.
    #[arg(long, env = "CKS_PROVIDER_STATE_FILE")]
    pub state_file: Option<PathBuf>,
    /// Record the promises in this ConfigMap instead, through the Kubernetes API with the
    /// pod's service account (in-cluster config): created if absent, written with optimistic
    /// concurrency, never overwritten when someone else changed it. Its Role needs get and
    /// update on this name and create on configmaps.
    #[arg(
        long,
        env = "CKS_PROVIDER_STATE_CONFIGMAP",
        conflicts_with = "state_file"
    )]
    pub state_configmap: Option<String>,
    /// Before trying an owed removal again, read its Node through the Kubernetes API (the
    /// pod's service account, in-cluster config) and withdraw the removal when the Node no
    /// longer carries the autoscaler's ToBeDeletedByClusterAutoscaler mark: an autoscaler that
    /// restarted without Cleanup removed every mark, and those nodes are schedulable again.
    /// Also reads the Node of a VM whose drain failed: once it is Ready and schedulable, a
    /// cordon no longer holds scale-ups. Only where the provider runs in the cluster its one
    /// node group scales; needs get on nodes (a ClusterRole).
    #[arg(long, env = "CKS_PROVIDER_CONFIRM_NODE_MARKS")]
    pub confirm_node_marks: bool,
    /// The namespace of `--state-configmap`; without it, the pod's own.
    #[arg(
        long,
        env = "CKS_PROVIDER_STATE_NAMESPACE",
        requires = "state_configmap"
    )]
    pub state_namespace: Option<String>,
    /// Run as one of several replicas: only the one holding a coordination.k8s.io Lease
    /// (the leader) submits to CloudStack, records and promises; the others answer every RPC
    /// UNAVAILABLE and take over when the leader stops renewing. Needs `--state-configmap`
    /// (the replicas share the ledger), get, create and update on leases, and the pod's
    /// name and namespace (POD_NAME, POD_NAMESPACE from the downward API): the leader labels
    /// its pod `cks-autoscaler-provider/role=leader`, which the Service selects.
    #[arg(long, env = "CKS_PROVIDER_LEADER_ELECT", requires = "state_configmap")]
    pub leader_elect: bool,
    /// How long a standby waits, after the Lease last changed, before it takes it over.
    #[arg(long, env = "CKS_PROVIDER_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps acting without a successful renewal (shorter than the lease
    /// duration: it stops before anyone can take over).
    #[arg(long, env = "CKS_PROVIDER_LEADER_ELECT_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often every replica reads (and the leader renews) the Lease.
    #[arg(long, env = "CKS_PROVIDER_LEADER_ELECT_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// The Lease's name.
    #[arg(
        long,
        env = "CKS_PROVIDER_LEADER_ELECT_RESOURCE_NAME",
        default_value = "cks-autoscaler-provider"
    )]
    pub leader_elect_resource_name: String,
    /// The Lease's namespace; without it, the pod's own.
    #[arg(long, env = "CKS_PROVIDER_LEADER_ELECT_RESOURCE_NAMESPACE")]
    pub leader_elect_resource_namespace: Option<String>,
    /// A YAML (.yaml/.yml) or TOML (.toml) file with any of these flags as keys (long names,
    /// e.g. `job-poll-interval: 2s`, `nodes: ["1:10:prod"]`). Flags and environment variables
    /// override it; an unknown key is an error that names it.
    #[arg(long, env = "CKS_PROVIDER_CONFIG")]
    pub config: Option<PathBuf>,
    /// On SIGTERM: after in-flight RPCs finish, keep following running scale jobs for at most
    /// this long, then exit. A job still running goes on in CloudStack and the next provider
    /// adopts it. Keep it well below the pod's terminationGracePeriodSeconds (60 s in the
    /// manifests).
    #[arg(long, env = "CKS_PROVIDER_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Allow plaintext gRPC on a non-loopback address.
    #[arg(long, env = "CKS_PROVIDER_INSECURE")]
    pub insecure: bool,
}

/// A loopback socket address (`127.0.0.1:8087`, `[::1]:8087`) for `--admin-listen`: it asks
/// callers for no certificate, so nothing outside the pod's network namespace may reach it.
pub fn parse_loopback_address(v: &str) -> Result<SocketAddr, String> {
    const WHY: &str = "the admin address asks for no client certificate, so it must be a \
                       loopback address (127.0.0.0/8 or [::1]) with a port, e.g. 127.0.0.1:8087; \
                       a host name is refused";
    match v.trim().parse::<SocketAddr>() {
        Ok(addr) if addr.ip().is_loopback() => Ok(addr),
        Ok(addr) => Err(format!("{addr} is not a loopback address: {WHY}")),
        Err(_) => Err(format!("{v:?} is not an IP address and port: {WHY}")),
    }
}

/// A request rate: a positive number of requests per second (`2`, `0.5`).
fn parse_rps(v: &str) -> Result<f64, String> {
    match v.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "{v:?} is not a rate: give a positive number of requests per second, e.g. 10 or 0.5"
        )),
    }
}

/// Parses the command line, folding in `serve --config FILE` (flags and environment variables
/// win over the file).
pub fn parse_args(argv: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let cmd = Cli::command();
    let matches = cmd.clone().try_get_matches_from(argv.clone())?;
    // `check` takes serve's flags, a config file's included.
    let Some((name @ ("serve" | "check"), sub)) = matches.subcommand() else {
        return Cli::from_arg_matches(&matches);
    };
    let Some(path) = sub.get_one::<PathBuf>("config").cloned() else {
        return Cli::from_arg_matches(&matches);
    };
    let serve_cmd = cmd.find_subcommand(name).cloned().unwrap_or_default();
    let tokens = config_tokens(&path, &serve_cmd, sub)
        .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{e}\n")))?;
    let pos = argv.iter().position(|a| a == name).unwrap_or(argv.len());
    let mut merged: Vec<std::ffi::OsString> =
        argv[..=pos.min(argv.len().saturating_sub(1))].to_vec();
    merged.extend(tokens.into_iter().map(Into::into));
    merged.extend(argv[pos + 1..].iter().cloned());
    let matches = cmd.try_get_matches_from(merged)?;
    Cli::from_arg_matches(&matches)
}

/// The `--flag=value` tokens a config file stands for, leaving out flags already given on
/// the command line or in the environment.
fn config_tokens(
    path: &std::path::Path,
    serve_cmd: &clap::Command,
    given: &clap::ArgMatches,
) -> anyhow::Result<Vec<String>> {
    use clap::parser::ValueSource;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --config {}", path.display()))?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let value: serde_json::Value = match ext.as_str() {
        "yaml" | "yml" => serde_saphyr::from_str(&text)
            .with_context(|| format!("parsing YAML in {}", path.display()))?,
        "toml" => {
            toml::from_str(&text).with_context(|| format!("parsing TOML in {}", path.display()))?
        }
        _ => bail!(
            "--config {}: the file must end in .yaml, .yml or .toml",
            path.display()
        ),
    };
    let Some(table) = value.as_object() else {
        bail!(
            "--config {}: expected a mapping of flag names to values",
            path.display()
        );
    };
    let mut tokens = Vec::new();
    for (key, v) in table {
        let Some(arg) = serve_cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()) && key != "config")
        else {
            let known: Vec<&str> = serve_cmd
                .get_arguments()
                .filter_map(|a| a.get_long())
                .filter(|l| *l != "config")
                .collect();
            bail!(
                "--config {}: unknown key {key:?} (known keys: {})",
                path.display(),
                known.join(", ")
            );
        };
        let id = arg.get_id().as_str();
        if matches!(
            given.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        let scalar = |v: &serde_json::Value| -> anyhow::Result<String> {
            Ok(match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                _ => bail!(
                    "--config {}: key {key:?} must be a string, number or boolean",
                    path.display()
                ),
            })
        };
        let takes_value = arg.get_action().takes_values();
        match v {
            serde_json::Value::Bool(b) if !takes_value => {
                if *b {
                    tokens.push(format!("--{key}"));
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    tokens.push(format!("--{key}={}", scalar(item)?));
                }
            }
            other => tokens.push(format!("--{key}={}", scalar(other)?)),
        }
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_temp(name: &str, text: &str) -> PathBuf {
        cks_testkit::temp_file("cli", name, text)
    }

    fn serve_args(argv: &[&str]) -> Result<ServeArgs, String> {
        let argv: Vec<std::ffi::OsString> = argv.iter().map(Into::into).collect();
        match parse_args(argv).map_err(|e| e.to_string())?.command {
            Command::Serve(s) => Ok(*s),
            _ => Err("not serve".into()),
        }
    }

    #[test]
    fn config_file_values_apply_and_flags_override_them() {
        let yaml = write_temp(
            "c.yaml",
            "listen: 127.0.0.1:9000\njob-poll-interval: 3s\nnodes: [\"1:4:alpha\", \"0:2:beta\"]\ninsecure: true\n",
        );
        let y = yaml.to_string_lossy().to_string();
        let s = serve_args(&["p", "serve", "--config", &y]).expect("parses");
        assert_eq!(s.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(s.job_poll_interval, Duration::from_secs(3));
        assert_eq!(s.nodes, vec!["1:4:alpha", "0:2:beta"]);
        assert!(s.insecure);
        let s = serve_args(&[
            "p",
            "serve",
            "--config",
            &y,
            "--job-poll-interval",
            "250ms",
            "--nodes",
            "2:3:gamma",
        ])
        .expect("parses");
        assert_eq!(
            s.job_poll_interval,
            Duration::from_millis(250),
            "the flag wins"
        );
        assert_eq!(s.nodes, vec!["2:3:gamma"], "the flag wins");
        assert_eq!(
            s.listen.to_string(),
            "127.0.0.1:9000",
            "the file still applies"
        );
        let toml = write_temp("c.toml", "staleness-bound = \"5m\"\nmax-pods = 64\n");
        let s = serve_args(&["p", "serve", "--config", &toml.to_string_lossy()]).expect("parses");
        assert_eq!(s.staleness_bound, Duration::from_secs(300));
        assert_eq!(s.max_pods, 64);
    }

    #[test]
    fn config_file_unknown_keys_and_bad_values_are_named() {
        let bad = write_temp("bad.yaml", "listen: 127.0.0.1:9000\njob-pol-interval: 3s\n");
        let e = serve_args(&["p", "serve", "--config", &bad.to_string_lossy()]).unwrap_err();
        assert!(e.contains("unknown key \"job-pol-interval\""), "{e}");
        let bad = write_temp("bad2.yaml", "job-poll-interval: soon\n");
        let e = serve_args(&["p", "serve", "--config", &bad.to_string_lossy()]).unwrap_err();
        assert!(e.contains("soon"), "{e}");
        let bad = write_temp("bad.json", "{}");
        let e = serve_args(&["p", "serve", "--config", &bad.to_string_lossy()]).unwrap_err();
        assert!(e.contains(".yaml"), "{e}");
    }

    #[test]
    fn cli_parses_serve_flags() {
        let cli = Cli::try_parse_from([
            "cks-autoscaler-provider",
            "serve",
            "--nodes",
            "1:5:abc",
            "--nodes",
            "0:3:def",
            "--job-poll-interval",
            "250ms",
        ])
        .expect("parses");
        let Command::Serve(s) = cli.command else {
            panic!("expected serve")
        };
        assert_eq!(s.nodes, vec!["1:5:abc", "0:3:def"]);
        assert_eq!(s.job_poll_interval, Duration::from_millis(250));
    }

    #[test]
    fn cloudstack_max_rps_is_off_unless_given_and_a_positive_rate() {
        let s = serve_args(&["p", "serve", "--nodes", "1:5:abc"]).expect("parses");
        assert_eq!(s.cloudstack_max_rps, None, "no limit by default");
        let s = serve_args(&["p", "serve", "--cloudstack-max-rps", "2.5"]).expect("parses");
        assert_eq!(s.cloudstack_max_rps, Some(2.5));
        let yaml = write_temp("rps.yaml", "cloudstack-max-rps: 20\n");
        let s = serve_args(&["p", "serve", "--config", &yaml.to_string_lossy()]).expect("parses");
        assert_eq!(s.cloudstack_max_rps, Some(20.0));
        for bad in ["0", "-1", "fast", "inf", "NaN"] {
            let flag = format!("--cloudstack-max-rps={bad}");
            let e = serve_args(&["p", "serve", &flag]).unwrap_err();
            assert!(e.contains("requests per second"), "{bad}: {e}");
        }
    }

    #[test]
    fn admin_listen_is_off_unless_given_and_only_a_loopback_address() {
        let s = serve_args(&["p", "serve"]).expect("parses");
        assert_eq!(s.admin_listen, None, "off by default");
        for good in ["127.0.0.1:8087", "127.8.9.10:1", "[::1]:8087"] {
            let s = serve_args(&["p", "serve", "--admin-listen", good]).expect(good);
            assert_eq!(s.admin_listen.map(|a| a.to_string()).as_deref(), Some(good));
        }
        let yaml = write_temp("admin.yaml", "admin-listen: 127.0.0.1:9087\n");
        let s = serve_args(&["p", "serve", "--config", &yaml.to_string_lossy()]).expect("parses");
        assert_eq!(s.admin_listen.map(|a| a.port()), Some(9087));
        for bad in [
            "0.0.0.0:8087",
            "10.0.0.1:8087",
            "[::]:8087",
            "localhost:8087",
            "example.com:8087",
            "127.0.0.1",
        ] {
            let e = serve_args(&["p", "serve", "--admin-listen", bad]).unwrap_err();
            assert!(
                e.contains("--admin-listen") && e.contains("loopback"),
                "{bad}: {e}"
            );
        }
        let yaml = write_temp("admin-bad.yaml", "admin-listen: 0.0.0.0:8087\n");
        let e = serve_args(&["p", "serve", "--config", &yaml.to_string_lossy()]).unwrap_err();
        assert!(e.contains("loopback"), "{e}");
    }

    #[test]
    fn job_max_follow_is_a_flag_and_a_config_key() {
        let s = serve_args(&["p", "serve", "--nodes", "1:5:abc"]).expect("parses");
        assert_eq!(s.job_max_follow, Duration::from_secs(2 * 3600), "default");
        let s = serve_args(&["p", "serve", "--job-max-follow", "90m"]).expect("parses");
        assert_eq!(s.job_max_follow, Duration::from_secs(90 * 60));
        let yaml = write_temp("follow.yaml", "job-max-follow: 3h\n");
        let s = serve_args(&["p", "serve", "--config", &yaml.to_string_lossy()]).expect("parses");
        assert_eq!(s.job_max_follow, Duration::from_secs(3 * 3600));
        let e = serve_args(&["p", "serve", "--job-max-follow", "forever"]).unwrap_err();
        assert!(e.contains("forever"), "{e}");
    }
}
