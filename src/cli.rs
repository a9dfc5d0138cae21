//! Command-line interface: `serve`, `demo`, `probe`. Every flag also reads an environment
//! variable (`CKS_PROVIDER_…`). Secrets are never taken as flags: they come from the
//! cloud-config file, a file path, or an environment variable.

use crate::cloudstack::{Client, ClientConfig};
use crate::config::{self, NodeGroupSpec};
use crate::grammar::parse_duration;
use crate::provider::{AlertScalingMode, Provider, Settings};
use crate::server::{ServeOptions, serve};
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
    /// Run the simulator, the provider and a mock autoscaler in one process and play the
    /// scale-up, down-worker and failed-scale-up scenarios live.
    Demo(crate::demo::DemoArgs),
    /// Show what the autoscaler sees through the provider's RPCs: node groups, target
    /// sizes, instances with their status and errors, why a group cannot scale.
    Probe(crate::probe::ProbeArgs),
}

/// `serve` flags.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// gRPC listen address.
    #[arg(long, env = "CKS_PROVIDER_LISTEN", default_value = "127.0.0.1:8086")]
    pub listen: SocketAddr,
    /// CloudStack cloud-config (ini, `[Global]` api-url, api-key, secret-key, optional
    /// ssl-no-verify, project-id, zone): the file the in-tree cloudstack provider uses.
    #[arg(long, env = "CKS_PROVIDER_CLOUD_CONFIG")]
    pub cloud_config: Option<PathBuf>,
    /// A node group: MIN:MAX:CLUSTER (CKS cluster id or name). Repeatable. The cluster's own
    /// minsize/maxsize win when CKS autoscaling is enabled on it.
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
    /// How often a running scale job is polled (queryAsyncJobResult).
    #[arg(long, env = "CKS_PROVIDER_JOB_POLL_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub job_poll_interval: Duration,
    /// A Refresh within this time of the last fetch reuses it (no CloudStack call).
    #[arg(long, env = "CKS_PROVIDER_REFRESH_MIN_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub refresh_min_interval: Duration,
    /// How old a snapshot may be and still be served while CloudStack is unreachable;
    /// beyond it Refresh fails (UNAVAILABLE) and health turns NOT_SERVING.
    #[arg(long, env = "CKS_PROVIDER_STALENESS_BOUND", default_value = "2m", value_parser = parse_duration)]
    pub staleness_bound: Duration,
    /// How long a scale RPC watches its new job for an immediate refusal (capped by the
    /// request's deadline).
    #[arg(long, env = "CKS_PROVIDER_SCALE_WATCH", default_value = "1500ms", value_parser = parse_duration)]
    pub scale_watch: Duration,
    /// How long a scale job is polled every --job-poll-interval; a job still running after
    /// this (CloudStack's own scale timeout is 1h) stays the cluster's operation and is polled
    /// 30 times less often. Also how far back listAsyncJobs is searched for a running job.
    #[arg(long, env = "CKS_PROVIDER_JOB_MAX_FOLLOW", default_value = "2h", value_parser = parse_duration)]
    pub job_max_follow: Duration,
    /// How long instances of a failed scale-up are reported before they are forgotten.
    #[arg(long, env = "CKS_PROVIDER_FAILED_INSTANCE_TTL", default_value = "30m", value_parser = parse_duration)]
    pub failed_instance_ttl: Duration,
    /// Whether this CloudStack scales clusters in Alert (auto: learn it from CloudStack's
    /// first refusal).
    #[arg(long, env = "CKS_PROVIDER_ALERT_SCALING", default_value = "auto")]
    pub alert_scaling: AlertScalingMode,
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
    /// Run against an embedded CloudStack simulator (no cloud-config needed) and print the
    /// cloud-config a cluster-autoscaler would use to connect.
    #[arg(long, env = "CKS_PROVIDER_SIMULATE")]
    pub simulate: bool,
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
    /// A YAML (.yaml/.yml) or TOML (.toml) file with any of these flags as keys (long names,
    /// e.g. `job-poll-interval: 2s`, `nodes: ["1:10:prod"]`). Flags and environment variables
    /// override it; an unknown key is an error that names it.
    #[arg(long, env = "CKS_PROVIDER_CONFIG")]
    pub config: Option<PathBuf>,
    /// On SIGTERM: after in-flight RPCs finish, keep following running scale jobs for at most
    /// this long.
    #[arg(long, env = "CKS_PROVIDER_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Allow plaintext gRPC on a non-loopback address.
    #[arg(long, env = "CKS_PROVIDER_INSECURE")]
    pub insecure: bool,
}

/// Parses the command line, folding in `serve --config FILE` (flags and environment variables
/// win over the file).
pub fn parse_args(argv: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let cmd = Cli::command();
    let matches = cmd.clone().try_get_matches_from(argv.clone())?;
    let Some(("serve", sub)) = matches.subcommand() else {
        return Cli::from_arg_matches(&matches);
    };
    let Some(path) = sub.get_one::<PathBuf>("config").cloned() else {
        return Cli::from_arg_matches(&matches);
    };
    let serve_cmd = cmd.find_subcommand("serve").cloned().unwrap_or_default();
    let tokens = config_tokens(&path, &serve_cmd, sub)
        .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, format!("{e}\n")))?;
    let pos = argv.iter().position(|a| a == "serve").unwrap_or(argv.len());
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

/// Sets up tracing (`RUST_LOG`-style filter, else `default_filter`).
pub fn init_tracing(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

fn read_secret_file(path: &PathBuf, what: &str) -> anyhow::Result<String> {
    let s = std::fs::read_to_string(path)
        .with_context(|| format!("reading the {what} from {}", path.display()))?;
    let s = s.trim().to_string();
    if s.is_empty() {
        bail!("the {what} file {} is empty", path.display());
    }
    Ok(s)
}

impl ServeArgs {
    /// The provider settings these flags describe.
    pub fn settings(&self, groups: Vec<NodeGroupSpec>) -> Settings {
        let mut s = Settings::with_groups(groups);
        s.job_poll_interval = self.job_poll_interval;
        s.refresh_min_interval = self.refresh_min_interval;
        s.staleness_bound = self.staleness_bound;
        s.scale_watch = self.scale_watch;
        s.failed_instance_ttl = self.failed_instance_ttl;
        s.job_max_follow = self.job_max_follow;
        s.alert_scaling = self.alert_scaling;
        s.gpu_label = self.gpu_label.clone();
        s.gpu_types = self.gpu_types.clone();
        s
    }

    /// The optional-RPC configuration (template node, option overrides) these flags describe.
    pub fn extras(&self) -> anyhow::Result<crate::extras::ProviderExtras> {
        use crate::template::{Reserved, TemplateSettings, parse_taint};
        let mut t = TemplateSettings {
            pods: self.max_pods,
            ..TemplateSettings::default()
        };
        t.kube_reserved = Reserved {
            cpu_millis: self.reserved_cpu_millis,
            memory_mib: self.reserved_memory_mib,
            ephemeral_gib: 0,
        };
        for l in &self.template_labels {
            let Some((k, v)) = l.split_once('=') else {
                bail!("--template-label {l:?}: expected KEY=VALUE");
            };
            crate::template::validate_label_key(k)
                .map_err(|e| anyhow::anyhow!("--template-label {l:?}: {e}"))?;
            crate::template::validate_label_value(v)
                .map_err(|e| anyhow::anyhow!("--template-label {l:?}: {e}"))?;
            t.extra_labels.insert(k.to_string(), v.to_string());
        }
        for taint in &self.template_taints {
            t.extra_taints.push(
                parse_taint(taint)
                    .map_err(|e| anyhow::anyhow!("--template-taint {taint:?}: {e}"))?,
            );
        }
        if !self.gpu_label.is_empty() {
            t.gpu_label = Some(self.gpu_label.clone());
        }
        let mut overrides = std::collections::HashMap::new();
        for spec in &self.node_group_options {
            let (cluster, o) = crate::options::parse_overrides_spec(spec)
                .map_err(|e| anyhow::anyhow!("--node-group-options {spec:?}: {e}"))?;
            overrides.insert(cluster, o);
        }
        let mut names: Vec<String> = overrides.keys().cloned().collect();
        names.sort();
        if let Some(w) = crate::options::startup_warning(&names) {
            tracing::warn!("{w}");
        }
        Ok(crate::extras::ProviderExtras {
            template: t,
            overrides,
        })
    }

    fn groups(&self) -> anyhow::Result<Vec<NodeGroupSpec>> {
        self.nodes
            .iter()
            .map(|n| config::parse_nodes_spec(n).map_err(|e| anyhow::anyhow!("--nodes: {e}")))
            .collect()
    }

    fn client_config(&self) -> anyhow::Result<ClientConfig> {
        let Some(path) = &self.cloud_config else {
            bail!(
                "--cloud-config is required (or --simulate to run against the built-in simulator)"
            );
        };
        let api_key = match (
            &self.api_key_file,
            std::env::var("CKS_PROVIDER_API_KEY").ok(),
        ) {
            (Some(p), _) => Some(read_secret_file(p, "API key")?),
            (None, Some(v)) if !v.is_empty() => Some(v),
            _ => None,
        };
        let secret_key = match (
            &self.secret_key_file,
            std::env::var("CKS_PROVIDER_SECRET_KEY").ok(),
        ) {
            (Some(p), _) => Some(read_secret_file(p, "secret key")?),
            (None, Some(v)) if !v.is_empty() => Some(v),
            _ => None,
        };
        // Keys given elsewhere need not be in the file (and a file's key they replace is not
        // checked or warned about).
        let cc = config::load_cloud_config_with_keys(path, api_key, secret_key)?;
        let mut client = cc.client_config(self.cloudstack_timeout);
        if let Some(ca) = &self.cloudstack_ca {
            client.ca_bundle_pem = Some(
                std::fs::read(ca)
                    .with_context(|| format!("reading --cloudstack-ca {}", ca.display()))?,
            );
        }
        if client.ssl_no_verify {
            tracing::warn!("ssl-no-verify is set: CloudStack's TLS certificate is NOT verified");
        }
        Ok(client)
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown requested: finishing in-flight requests");
}

/// `serve`.
pub async fn run_serve(args: ServeArgs) -> anyhow::Result<()> {
    crate::tls::ensure_crypto_provider();
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(crate::tls::ReloadingTls::new(
            crate::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
            },
            crate::tls::DEFAULT_CHECK_INTERVAL,
        )?),
        _ => None,
    };
    if tls.is_none() && !args.insecure && !args.listen.ip().is_loopback() {
        bail!(
            "refusing to serve plaintext gRPC on non-loopback address {}: give --tls-cert and \
             --tls-key (and --tls-client-ca for mutual TLS), or --insecure",
            args.listen
        );
    }
    if tls.as_ref().is_some_and(|_| args.tls_client_ca.is_none()) {
        tracing::warn!(
            "TLS without --tls-client-ca: any client can call the provider; the autoscaler's cloud-config supports mutual TLS (cert/key/cacert)"
        );
    }
    if tls.is_none() && !args.listen.ip().is_loopback() {
        tracing::warn!(listen = %args.listen, "serving plaintext gRPC on a non-loopback address (--insecure)");
    }
    let extras = args.extras()?;
    let mut _sim = None;
    let (client_cfg, groups) = if args.simulate {
        let sim = crate::sim::spawn(crate::sim::SimConfig::default()).await?;
        let mut groups = args.groups()?;
        if groups.is_empty() {
            groups = sim
                .cluster_ids()
                .into_iter()
                .map(|id| NodeGroupSpec {
                    min: 1,
                    max: 10,
                    cluster: config::ClusterRef::Id(id),
                })
                .collect();
        }
        let cfg = ClientConfig {
            api_url: sim.api_url.clone(),
            api_key: sim.api_key.clone(),
            secret_key: sim.secret_key.clone(),
            ssl_no_verify: false,
            ca_bundle_pem: None,
            project_id: None,
            request_timeout: args.cloudstack_timeout,
        };
        println!("Embedded CloudStack simulator at {}", sim.api_url);
        println!(
            "cluster-autoscaler cloud-config (--cloud-provider=externalgrpc --cloud-config=FILE):\n"
        );
        println!("address: \"{}\"\ngrpc_timeout: 5s\n", args.listen);
        for g in &groups {
            println!("node group (--nodes): {}:{}:{}", g.min, g.max, g.cluster);
        }
        _sim = Some(sim);
        (cfg, groups)
    } else {
        (args.client_config()?, args.groups()?)
    };
    if groups.is_empty() {
        bail!("no node groups: give at least one --nodes MIN:MAX:CLUSTER");
    }
    let client = Client::new(client_cfg).context("building the CloudStack client")?;
    let provider = Provider::new(client, args.settings(groups));
    provider.spawn_initial_refresh();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(addr) = args.metrics_listen {
        crate::metrics::install();
        let http = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding --metrics-listen {addr}"))?;
        let mut rx = stop_rx.clone();
        let p = provider.clone();
        tokio::spawn(async move {
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            if let Err(e) = crate::metrics::serve_http(http, p, stop).await {
                tracing::error!(error = %e, "metrics endpoint failed");
            }
        });
        tracing::info!(metrics = %addr, "serving /metrics, /healthz, /readyz");
    }
    tracing::info!(listen = %args.listen, "serving externalgrpc CloudProvider");
    let signal = async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    };
    let options = ServeOptions {
        extras: std::sync::Arc::new(extras),
        tls,
        ..ServeOptions::default()
    };
    serve(listener, provider.clone(), options, signal).await?;
    provider.wait_idle(args.shutdown_grace).await;
    provider.cleanup();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_temp(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cks-cli-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    fn serve_args(argv: &[&str]) -> Result<ServeArgs, String> {
        let argv: Vec<std::ffi::OsString> = argv.iter().map(Into::into).collect();
        match parse_args(argv).map_err(|e| e.to_string())?.command {
            Command::Serve(s) => Ok(*s),
            _ => Err("not serve".into()),
        }
    }

    #[test]
    fn keys_from_files_need_not_be_in_the_cloud_config() {
        let cc = write_temp(
            "keys-elsewhere.ini",
            "[Global]\napi-url = http://127.0.0.1:1/client/api\n",
        );
        let key = write_temp("api.key", "the-api-key\n");
        let secret = write_temp("secret.key", "the-secret;with-semicolon\n");
        let (c, k, sk) = (
            cc.to_string_lossy().to_string(),
            key.to_string_lossy().to_string(),
            secret.to_string_lossy().to_string(),
        );
        let s = serve_args(&[
            "p",
            "serve",
            "--cloud-config",
            &c,
            "--api-key-file",
            &k,
            "--secret-key-file",
            &sk,
            "--nodes",
            "1:3:demo",
        ])
        .expect("parses");
        let client = s
            .client_config()
            .expect("keys from the files complete the config");
        assert_eq!(client.api_key, "the-api-key");
        assert_eq!(client.secret_key, "the-secret;with-semicolon");
        // Without them the file's missing keys are an error naming the key.
        let s = serve_args(&["p", "serve", "--cloud-config", &c, "--nodes", "1:3:demo"])
            .expect("parses");
        let e = s.client_config().expect_err("no keys anywhere");
        assert!(e.to_string().contains("api-key"), "{e}");
    }

    #[test]
    fn config_file_values_apply_and_flags_override_them() {
        let yaml = write_temp(
            "c.yaml",
            "listen: 127.0.0.1:9000\njob-poll-interval: 3s\nnodes: [\"1:4:alpha\", \"0:2:beta\"]\nsimulate: true\n",
        );
        let y = yaml.to_string_lossy().to_string();
        let s = serve_args(&["p", "serve", "--config", &y]).expect("parses");
        assert_eq!(s.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(s.job_poll_interval, Duration::from_secs(3));
        assert_eq!(s.nodes, vec!["1:4:alpha", "0:2:beta"]);
        assert!(s.simulate);
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
    fn job_max_follow_is_a_flag_and_a_config_key() {
        let s = serve_args(&["p", "serve", "--nodes", "1:5:abc"]).expect("parses");
        assert_eq!(s.job_max_follow, Duration::from_secs(2 * 3600), "default");
        assert_eq!(
            s.settings(Vec::new()).job_max_follow,
            Duration::from_secs(2 * 3600)
        );
        let s = serve_args(&["p", "serve", "--job-max-follow", "90m"]).expect("parses");
        assert_eq!(s.job_max_follow, Duration::from_secs(90 * 60));
        assert_eq!(
            s.settings(Vec::new()).job_max_follow,
            Duration::from_secs(90 * 60),
            "reaches the provider's settings"
        );
        let yaml = write_temp("follow.yaml", "job-max-follow: 3h\n");
        let s = serve_args(&["p", "serve", "--config", &yaml.to_string_lossy()]).expect("parses");
        assert_eq!(s.job_max_follow, Duration::from_secs(3 * 3600));
        let e = serve_args(&["p", "serve", "--job-max-follow", "forever"]).unwrap_err();
        assert!(e.contains("forever"), "{e}");
    }
}
