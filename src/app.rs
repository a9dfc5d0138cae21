//! The `serve` command's wiring: turns parsed [`ServeArgs`] into a running service (CloudStack
//! client, provider, optional-RPC extras, TLS, the metrics endpoint) and runs it on listeners
//! the caller bound until the caller's shutdown future completes. The binary binds the flags' addresses and passes SIGTERM/Ctrl-C; a test
//! can bind port 0 and pass any future.
//!
//! Also the one place that joins the leaves together: the cloud-config becomes the client's
//! settings here, and the provider is shown to the metrics endpoint through
//! [`MetricsSource`], so neither `config` nor `metrics` knows the types on the other side.

use crate::cli::{LogFormat, ServeArgs};
use crate::config::{self, BoundNodeGroup, CloudConfig};
use crate::keys::{KeyFiles, KeyOrigin, ReloadingKeys};
use crate::metrics::{ClientMismatch, GroupGauges, MetricsSource, Told, Worker};
use crate::provider::{Provider, Settings};
use crate::server::{ServeOptions, serve};
use anyhow::{Context, bail};
use cks_cloudstack::{Client, ClientConfig};
use cks_domain::instances::InstanceView;
use cks_domain::status::InstanceState;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Sets up tracing on stderr in `format` (`RUST_LOG`-style filter, else `default_filter`),
/// coloured only on a terminal (and without `NO_COLOR`). A
/// `RUST_LOG` that does not parse is reported through the new subscriber, in its format, and
/// `default_filter` applies.
pub fn init_tracing(format: LogFormat, default_filter: &str) {
    let rust_log = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let (filter, invalid) = match rust_log
        .as_deref()
        .map(tracing_subscriber::EnvFilter::try_new)
    {
        Some(Ok(filter)) => (filter, None),
        Some(Err(e)) => (tracing_subscriber::EnvFilter::new(default_filter), Some(e)),
        None => (tracing_subscriber::EnvFilter::new(default_filter), None),
    };
    // Colour only for a person at a terminal: files, pipes and log collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if let Some(e) = invalid {
        tracing::warn!(rust_log = rust_log.as_deref().unwrap_or_default(), error = %e,
            "RUST_LOG is not a valid filter; logging at {default_filter}");
    }
}

/// A service built from the `serve` flags, not yet listening.
pub struct App {
    provider: Provider,
    options: ServeOptions,
    /// How the admin address is served (`--admin-listen`): the server certificate without a
    /// client CA, every call the read-only admin caller's.
    admin: Option<ServeOptions>,
    shutdown_grace: Duration,
    election: Option<Election>,
}

/// Leader election as `serve` runs it (`--leader-elect`).
struct Election {
    lease: crate::leader::LeaseRef,
    leadership: crate::leader::Leadership,
    /// This replica's pod (POD_NAMESPACE, POD_NAME), labelled with its role for the Service.
    pod: Option<(String, String)>,
}

/// The pod label the provider's Service selects: `leader` on the replica that leads.
pub const ROLE_LABEL: &str = "cks-autoscaler-provider/role";

impl App {
    /// Checks the flags, reads the files they name and builds the provider. Nothing listens yet
    /// and CloudStack is not called.
    pub async fn build(args: &ServeArgs) -> anyhow::Result<App> {
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
        let admin = admin_options(args, tls.as_ref())?;
        let extras = extras(args)?;
        let (client_cfg, groups) = (client_config(args)?, groups(args)?);
        if groups.is_empty() {
            bail!("no node groups: give at least one --nodes MIN:MAX:CLUSTER");
        }
        // Before anything listens: no autoscaler may see another's groups.
        config::check_client_binding(&groups, args.tls_client_ca.is_some())?;
        config::check_distinct_clusters(&groups)?;
        let client_cfg = match reloading_keys(args)? {
            Some(keys) => client_cfg.with_key_source(Arc::new(keys)),
            None => client_cfg,
        };
        let client = Client::new(client_cfg).context("building the CloudStack client")?;
        if let Some(max_rps) = client.max_rps() {
            tracing::info!(
                max_rps,
                "CloudStack requests limited (--cloudstack-max-rps)"
            );
        }
        let mut settings = settings(args, groups);
        if let Some(name) = &args.state_configmap {
            settings.state_configmap = Some(
                crate::kube::ConfigMapRef::in_cluster(name, args.state_namespace.as_deref())
                    .context("--state-configmap")?,
            );
        }
        if args.confirm_node_marks {
            if settings.groups.len() != 1 {
                bail!(
                    "--confirm-node-marks reads the Nodes of the cluster the provider runs in: it serves exactly one node group, got {}",
                    settings.groups.len()
                );
            }
            settings.node_marks =
                Some(crate::kube::KubeConfig::in_cluster().context("--confirm-node-marks")?);
        }
        let election = if args.leader_elect {
            let e = election(args)?;
            settings.leadership = Some(e.leadership.clone());
            Some(e)
        } else {
            None
        };
        let provider = Provider::new(client, settings);
        // Before anything is served: the promises an earlier process made are kept. With
        // leader election the leader reads them when it takes over, not before.
        if election.is_none() {
            provider
                .load_state()
                .await
                .context("taking over the recorded promises (--state-file or --state-configmap)")?;
        }
        let extras = Arc::new(extras);
        Ok(App {
            provider,
            admin: admin.map(|admin| ServeOptions {
                extras: extras.clone(),
                ..admin
            }),
            options: ServeOptions {
                extras,
                tls,
                ..ServeOptions::default()
            },
            shutdown_grace: args.shutdown_grace,
            election,
        })
    }

    /// Serves gRPC on `listener` (and `/metrics`, `/healthz`, `/readyz` on `metrics` when
    /// given) until `shutdown` completes; then finishes in-flight RPCs and keeps following
    /// running scale jobs for at most `--shutdown-grace`.
    pub async fn run(
        self,
        listener: TcpListener,
        metrics: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        self.run_with_admin(listener, metrics, None, shutdown).await
    }

    /// [`App::run`], also serving the read-only admin address on `admin` (bound to the
    /// `--admin-listen` address the app was built with).
    pub async fn run_with_admin(
        self,
        listener: TcpListener,
        metrics: Option<TcpListener>,
        admin: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let App {
            provider,
            options,
            admin: admin_options,
            shutdown_grace,
            election,
        } = self;
        let admin = match (admin, admin_options) {
            (None, _) => None,
            (Some(_), None) => bail!("an admin listener was given but --admin-listen was not"),
            (Some(l), Some(o)) => {
                let addr = l
                    .local_addr()
                    .context("reading the admin listener's address")?;
                if !addr.ip().is_loopback() {
                    bail!("--admin-listen: {addr} is not a loopback address");
                }
                Some((l, o, addr))
            }
        };
        if metrics.is_some() {
            // Before anything is recorded: the first refresh's CloudStack calls count too.
            crate::metrics::install();
        }
        // With leader election the replica starts as a standby: it reads nothing from
        // CloudStack and writes nothing until it leads ([`lead`]).
        let (lease_stop, lease_stop_rx) = tokio::sync::watch::channel(false);
        let (ended_tx, ended) = tokio::sync::watch::channel(None::<String>);
        let lease_task = match &election {
            None => {
                provider.resume_followers();
                provider.spawn_state_writer();
                provider.spawn_keeper();
                None
            }
            Some(e) => {
                crate::metrics::record_standby_start();
                tokio::spawn(lead(provider.clone(), e.clone_parts(), ended_tx.clone()));
                let (lease, leadership) = (e.lease.clone(), e.leadership.clone());
                let ended_tx = ended_tx.clone();
                Some(tokio::spawn(async move {
                    let why = match crate::leader::run(lease, leadership, lease_stop_rx).await {
                        Ok(crate::leader::Role::Lost) => Some("lost the leader lease".to_string()),
                        Ok(_) => None,
                        Err(e) => Some(format!("leader election cannot run: {e}")),
                    };
                    if why.is_some() {
                        let _ = ended_tx.send(why);
                    }
                }))
            }
        };
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        if let Some(http) = metrics {
            let addr = http
                .local_addr()
                .context("reading the metrics listener's address")?;
            let mut rx = stop_rx;
            let source = Arc::new(ProviderMetrics(provider.clone()));
            tokio::spawn(async move {
                let stop = async move {
                    let _ = rx.wait_for(|s| *s).await;
                };
                if let Err(e) = crate::metrics::serve_http(http, source, stop).await {
                    tracing::error!(error = %e, "metrics endpoint failed");
                }
            });
            tracing::info!(metrics = %addr, "serving /metrics, /healthz, /readyz");
        }
        let listen = listener
            .local_addr()
            .context("reading the gRPC listener's address")?;
        tracing::info!(listen = %listen, "serving externalgrpc CloudProvider");
        // The admin address stops with the main one: on the signal, or when the main one
        // ends for any other reason (the sender is dropped).
        let (admin_stop_tx, mut admin_stop) = tokio::sync::watch::channel(false);
        let admin_task = admin.map(|(l, o, addr)| {
            tracing::info!(admin = %addr, tls = o.tls.is_some(),
                "serving the read-only admin address (every node group, no write)");
            let stop = async move {
                let _ = admin_stop.wait_for(|s| *s).await;
            };
            tokio::spawn(serve(l, provider.clone(), o, stop))
        });
        let mut ended_rx = ended.clone();
        let signal = async move {
            tokio::select! {
                () = shutdown => tracing::info!("shutdown requested: finishing in-flight requests"),
                _ = ended_rx.wait_for(Option::is_some) => {}
            }
            let _ = stop_tx.send(true);
            let _ = admin_stop_tx.send(true);
        };
        let served = serve(listener, provider.clone(), options, signal).await;
        if let Some(task) = admin_task {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "the admin address failed"),
                Err(e) => tracing::error!(error = %e, "the admin address's task ended abnormally"),
            }
        }
        served?;
        let ended = ended.borrow().clone();
        let led = election.as_ref().is_none_or(|e| e.leadership.taken_over());
        if led {
            if ended.is_none() {
                provider.wait_idle(shutdown_grace).await;
            }
            // The last record, before the lease is released: the next leader reads it.
            provider.finish_state().await;
        }
        provider.cleanup().await;
        if let Some(task) = lease_task {
            let _ = lease_stop.send(true);
            let _ = task.await;
        }
        match ended {
            Some(why) => bail!("{why}: this replica stops so that it starts again as a standby"),
            None => Ok(()),
        }
    }
}

impl Election {
    fn clone_parts(
        &self,
    ) -> (
        crate::leader::Leadership,
        Option<(String, String)>,
        crate::leader::LeaseRef,
    ) {
        (
            self.leadership.clone(),
            self.pod.clone(),
            self.lease.clone(),
        )
    }
}

/// How `--admin-listen` is served, when given: a loopback address only (checked again here
/// for arguments built without the command line), with the server certificate and no client
/// CA (a caller inside the pod has no client certificate), or plaintext when the provider
/// serves plaintext anyway.
fn admin_options(
    args: &ServeArgs,
    tls: Option<&crate::tls::ReloadingTls>,
) -> anyhow::Result<Option<ServeOptions>> {
    let Some(addr) = args.admin_listen else {
        return Ok(None);
    };
    crate::cli::parse_loopback_address(&addr.to_string())
        .map_err(|e| anyhow::anyhow!("--admin-listen: {e}"))?;
    let tls = match tls {
        Some(main) => Some(crate::tls::ReloadingTls::new(
            crate::tls::TlsFiles {
                client_ca: None,
                ..main.files().clone()
            },
            main.check_interval(),
        )?),
        None => None,
    };
    Ok(Some(ServeOptions {
        tls,
        admin: true,
        ..ServeOptions::default()
    }))
}

/// The leader election `--leader-elect` asks for: the timings checked, the Lease, this
/// replica's identity (POD_NAME, else the host name) and pod.
fn election(args: &ServeArgs) -> anyhow::Result<Election> {
    let timings = cks_domain::lease::LeaseTimings {
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    };
    timings
        .check()
        .map_err(|e| anyhow::anyhow!("--leader-elect-*: {e}"))?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let pod_name = env("POD_NAME");
    let identity = match pod_name.clone().or_else(|| env("HOSTNAME")) {
        Some(id) => id,
        None => bail!(
            "--leader-elect needs this replica's name: set POD_NAME (the downward API's metadata.name)"
        ),
    };
    crate::kube::check_name(
        "--leader-elect-resource-name",
        &args.leader_elect_resource_name,
    )?;
    let namespace = match &args.leader_elect_resource_namespace {
        Some(ns) => {
            crate::kube::check_name("--leader-elect-resource-namespace", ns)?;
            ns.clone()
        }
        None => crate::kube::in_cluster_namespace().context("--leader-elect")?,
    };
    let api = crate::kube::KubeConfig::in_cluster().context("--leader-elect")?;
    let pod = match (env("POD_NAMESPACE"), pod_name) {
        (Some(ns), Some(name)) => Some((ns, name)),
        _ => {
            tracing::warn!(
                "--leader-elect without POD_NAME and POD_NAMESPACE: the pod is not labelled {ROLE_LABEL}=leader, so a Service selecting that label reaches no replica"
            );
            None
        }
    };
    Ok(Election {
        lease: crate::leader::LeaseRef {
            namespace,
            name: args.leader_elect_resource_name.clone(),
            api,
        },
        leadership: crate::leader::Leadership::new(&identity, timings),
        pod,
    })
}

/// A standby's life until it leads, then the leader's take-over: the pod labelled standby
/// (so a Service selecting the leader's label does not reach it), the Lease won, the ledger
/// read and claimed, followers resumed, the writer and the first refresh started, RPCs
/// answered, the pod labelled leader. A take-over that fails ends the process (`ended`):
/// another replica takes the Lease.
async fn lead(
    provider: Provider,
    (leadership, pod, lease): (
        crate::leader::Leadership,
        Option<(String, String)>,
        crate::leader::LeaseRef,
    ),
    ended: tokio::sync::watch::Sender<Option<String>>,
) {
    let client = match crate::kube::KubeClient::new(&lease.api) {
        Ok(c) => c,
        Err(e) => {
            let _ = ended.send(Some(format!(
                "leader election cannot reach the Kubernetes API: {e}"
            )));
            return;
        }
    };
    let label = |role: &'static str| {
        let (client, pod) = (client.clone(), pod.clone());
        async move {
            let Some((ns, name)) = pod else { return true };
            match client.label_pod(&ns, &name, ROLE_LABEL, role).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(pod = %name, error = %e, "could not label the pod {ROLE_LABEL}={role}");
                    false
                }
            }
        }
    };
    // Not Ready before this: after a restart the pod may still carry the `leader` label of its
    // previous life, and a Ready pod with it is an endpoint of the leader's Service.
    while !label("standby").await {
        if leadership.leading() {
            break;
        }
        tokio::time::sleep(lease_retry(&leadership)).await;
    }
    leadership.set_labelled_standby();
    // The ledger kept loaded: read and parsed every lease duration, as the take-over will read
    // it, so a standby that could not take over says so (not Ready, the gauge, the log) while
    // the leader still runs. Only the take-over's own read counts for what it takes over: the
    // leader writes until its last moment.
    let mut role = leadership.watch();
    let mut failing: Option<String> = None;
    loop {
        let look = provider.check_state().await;
        crate::metrics::record_standby_ledger(look.is_ok());
        leadership.set_ledger_readable(look.is_ok());
        match look {
            Ok(promises) => {
                if failing.take().is_some() {
                    tracing::info!(
                        promises,
                        "the standby reads the recorded promises again: ready to take over"
                    );
                }
            }
            Err(e) => {
                let text = e.to_string();
                if failing.as_deref() != Some(text.as_str()) {
                    tracing::error!(error = %text, "the standby cannot read the recorded promises: it could not take over, and is not Ready until it can");
                }
                failing = Some(text);
            }
        }
        tokio::select! {
            r = role.wait_for(|r| *r == crate::leader::Role::Leader) => {
                if r.is_err() {
                    return;
                }
                break;
            }
            () = tokio::time::sleep(leadership.timings().lease_duration) => {}
        }
    }
    let writer = format!(
        "{} at {:?}",
        leadership.identity(),
        std::time::SystemTime::now()
    );
    match provider.take_over_state(writer).await {
        Ok(taken) => {
            tracing::info!(
                promises = taken,
                "the leader took over the recorded promises"
            );
        }
        Err(e) => {
            let _ = ended.send(Some(format!(
                "the new leader could not take over the recorded promises: {e}"
            )));
            return;
        }
    }
    provider.resume_followers();
    provider.spawn_state_writer();
    provider.spawn_keeper();
    leadership.set_taken_over();
    // The Service reaches this replica once labelled: tried until it is, while leading.
    while !label("leader").await && leadership.leading() {
        tokio::time::sleep(lease_retry(&leadership)).await;
    }
}

fn lease_retry(leadership: &crate::leader::Leadership) -> Duration {
    leadership.timings().retry_period
}

/// The provider as the metrics endpoint sees it, through the provider's public API only
/// (public so that tests can serve the gauges of a provider they run).
pub struct ProviderMetrics(pub Provider);

impl MetricsSource for ProviderMetrics {
    fn ready(&self) -> bool {
        self.0.health().ready_for_traffic()
    }

    fn stalled(&self) -> Option<String> {
        self.0.health().stalled()
    }

    fn alert_verdict(&self) -> Option<(&'static str, Option<Duration>)> {
        let v = self.0.health().alert_verdict();
        Some((v.verdict.as_str(), v.age))
    }

    fn client_mismatches(&self) -> Vec<ClientMismatch> {
        self.0.health().client_cluster_mismatches()
    }

    fn group_gauges(&self) -> Vec<GroupGauges> {
        let p = &self.0;
        let all = p.all_groups();
        all.node_groups()
            .into_iter()
            .map(|g| GroupGauges {
                target_size: all.target_size(&g.id).ok(),
                min_size: g.min,
                max_size: g.max,
                workers: all
                    .nodes(&g.id)
                    .unwrap_or_default()
                    .iter()
                    .map(gauge_worker)
                    .collect(),
                cluster_state: all.snapshot(&g.id).map(|s| s.state.as_str().to_string()),
                blocked: all.cluster_blocked(&g.id).map(|s| s.rule.as_str()),
                since_refresh: all.snapshot_age(&g.id),
                stale: all.snapshot_stale(&g.id),
                refresh_failures: all.refresh_failures(&g.id),
                id: g.id,
            })
            .collect()
    }
}

/// An instance as the worker gauges count it. Its VM is down as the provider sees it
/// (`InstanceView::vm_down`; a failed creation is a creation, not a down VM), whatever the
/// autoscaler is told.
fn gauge_worker(i: &InstanceView) -> Worker {
    Worker {
        told: match i.state {
            InstanceState::Running => Told::Running,
            InstanceState::Creating => Told::Creating,
            InstanceState::Deleting => Told::Deleting,
        },
        down: i.vm_down,
    }
}

/// The provider settings the flags describe.
fn settings(args: &ServeArgs, groups: Vec<BoundNodeGroup>) -> Settings {
    let mut s = Settings::with_bound_groups(groups);
    s.max_node_provision_time = args.max_node_provision_time;
    s.job_poll_interval = args.job_poll_interval;
    s.refresh_min_interval = args.refresh_min_interval;
    s.staleness_bound = args.staleness_bound;
    s.scale_watch = args.scale_watch;
    s.removal_window = args.removal_window;
    s.alert_recheck = args.alert_recheck;
    s.failed_instance_ttl = args.failed_instance_ttl;
    s.job_max_follow = args.job_max_follow;
    s.alert_scaling = args.alert_scaling;
    s.external_node_scale_up = args.external_node_scale_up;
    s.gpu_label = args.gpu_label.clone();
    s.gpu_types = args.gpu_types.clone();
    s.denied_clients = args.deny_clients.clone();
    s.state_file = args.state_file.clone();
    s
}

/// The optional-RPC configuration (template node, option overrides) the flags describe.
fn extras(args: &ServeArgs) -> anyhow::Result<crate::optional_rpcs::ProviderExtras> {
    use crate::template::{Reserved, TemplateSettings, parse_taint};
    let mut t = TemplateSettings {
        pods: args.max_pods,
        ..TemplateSettings::default()
    };
    t.kube_reserved = Reserved {
        cpu_millis: args.reserved_cpu_millis,
        memory_mib: args.reserved_memory_mib,
        ephemeral_gib: 0,
    };
    for l in &args.template_labels {
        let Some((k, v)) = l.split_once('=') else {
            bail!("--template-label {l:?}: expected KEY=VALUE");
        };
        crate::template::validate_label_key(k)
            .map_err(|e| anyhow::anyhow!("--template-label {l:?}: {e}"))?;
        crate::template::validate_label_value(v)
            .map_err(|e| anyhow::anyhow!("--template-label {l:?}: {e}"))?;
        t.extra_labels.insert(k.to_string(), v.to_string());
    }
    for taint in &args.template_taints {
        t.extra_taints.push(
            parse_taint(taint).map_err(|e| anyhow::anyhow!("--template-taint {taint:?}: {e}"))?,
        );
    }
    if !args.gpu_label.is_empty() {
        t.gpu_label = Some(args.gpu_label.clone());
    }
    let mut overrides = std::collections::HashMap::new();
    for spec in &args.node_group_options {
        let (cluster, o) = crate::options::parse_overrides_spec(spec)
            .map_err(|e| anyhow::anyhow!("--node-group-options {spec:?}: {e}"))?;
        overrides.insert(cluster, o);
    }
    let mut names: Vec<String> = overrides.keys().cloned().collect();
    names.sort();
    if let Some(w) = crate::options::startup_warning(&names) {
        tracing::warn!("{w}");
    }
    Ok(crate::optional_rpcs::ProviderExtras {
        template: Some(t),
        overrides,
    })
}

pub(crate) fn groups(args: &ServeArgs) -> anyhow::Result<Vec<BoundNodeGroup>> {
    args.nodes
        .iter()
        .map(|n| config::parse_nodes(n).map_err(|e| anyhow::anyhow!("--nodes: {e}")))
        .collect()
}

/// Where each CloudStack key comes from: `--api-key-file`/`--secret-key-file`, else
/// `CKS_PROVIDER_API_KEY`/`CKS_PROVIDER_SECRET_KEY`, else the cloud-config.
pub(crate) fn key_files(args: &ServeArgs) -> anyhow::Result<KeyFiles> {
    let Some(path) = &args.cloud_config else {
        bail!("--cloud-config is required: the file naming CloudStack's API URL and keys");
    };
    let origin = |file: &Option<std::path::PathBuf>, var: &str| match (file, std::env::var(var)) {
        (Some(p), _) => KeyOrigin::File(p.clone()),
        (None, Ok(v)) if !v.trim().is_empty() => KeyOrigin::Given(v.trim().to_string()),
        _ => KeyOrigin::CloudConfig,
    };
    Ok(KeyFiles {
        cloud_config: path.clone(),
        api_key: origin(&args.api_key_file, "CKS_PROVIDER_API_KEY"),
        secret_key: origin(&args.secret_key_file, "CKS_PROVIDER_SECRET_KEY"),
    })
}

/// The CloudStack client's settings: the cloud-config, with the keys replaced by
/// `--api-key-file`/`--secret-key-file` or `CKS_PROVIDER_API_KEY`/`CKS_PROVIDER_SECRET_KEY`,
/// and `--cloudstack-ca` and `--cloudstack-max-rps` added. The keys are those of the files
/// now; [`reloading_keys`] keeps them current.
pub(crate) fn client_config(args: &ServeArgs) -> anyhow::Result<ClientConfig> {
    // Keys given elsewhere need not be in the file (and a file's key they replace is not
    // checked or warned about).
    let cc = key_files(args)?.load()?;
    let mut client =
        cloudstack_settings(&cc, args.cloudstack_timeout).with_max_rps(args.cloudstack_max_rps);
    if let Some(ca) = &args.cloudstack_ca {
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

/// The client settings for a cloud-config's credentials (no extra CA bundle).
fn cloudstack_settings(cc: &CloudConfig, request_timeout: Duration) -> ClientConfig {
    ClientConfig {
        api_url: cc.api_url.clone(),
        api_key: cc.api_key.clone(),
        secret_key: cc.secret_key.clone(),
        ssl_no_verify: cc.ssl_no_verify,
        ca_bundle_pem: None,
        project_id: cc.project_id.clone(),
        request_timeout,
        max_rps: None,
        key_source: None,
    }
}

/// The key pair re-read from its files when they change (a rotated key taken without a
/// restart), or `None` when every key was given in the environment.
pub(crate) fn reloading_keys(args: &ServeArgs) -> anyhow::Result<Option<ReloadingKeys>> {
    let files = key_files(args)?;
    if files.watched().is_empty() {
        return Ok(None);
    }
    Ok(Some(ReloadingKeys::new(files)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Command, parse_args};
    use std::path::PathBuf;

    fn write_temp(name: &str, text: &str) -> PathBuf {
        cks_testkit::temp_file("app", name, text)
    }

    fn serve_args(argv: &[&str]) -> ServeArgs {
        let argv: Vec<std::ffi::OsString> = argv.iter().map(Into::into).collect();
        match parse_args(argv).expect("parses").command {
            Command::Serve(s) => *s,
            other => panic!("not serve: {other:?}"),
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
        ]);
        let client = client_config(&s).expect("keys from the files complete the config");
        assert_eq!(client.api_key, "the-api-key");
        assert_eq!(client.secret_key, "the-secret;with-semicolon");
        // Without them the file's missing keys are an error naming the key.
        let s = serve_args(&["p", "serve", "--cloud-config", &c, "--nodes", "1:3:demo"]);
        let e = client_config(&s).expect_err("no keys anywhere");
        assert!(e.to_string().contains("api-key"), "{e}");
    }

    #[test]
    fn the_cloud_configs_settings_reach_the_client() {
        let cc = write_temp(
            "settings.ini",
            "[Global]\napi-url = https://cloud.example.com/client/api\napi-key = APIKEY123\n\
             secret-key = TOPSECRET\nssl-no-verify = true\nproject-id = p\n",
        );
        let s = serve_args(&[
            "p",
            "serve",
            "--cloud-config",
            &cc.to_string_lossy(),
            "--cloudstack-timeout",
            "7s",
        ]);
        let client = client_config(&s).expect("complete config");
        assert_eq!(client.api_url, "https://cloud.example.com/client/api");
        assert_eq!(
            (client.api_key.as_str(), client.secret_key.as_str()),
            ("APIKEY123", "TOPSECRET")
        );
        assert!(client.ssl_no_verify);
        assert_eq!(client.project_id.as_deref(), Some("p"));
        assert_eq!(client.request_timeout, Duration::from_secs(7));
        assert!(client.ca_bundle_pem.is_none());
        assert_eq!(client.max_rps, None, "no rate limit unless asked");
        let s = serve_args(&[
            "p",
            "serve",
            "--cloud-config",
            &cc.to_string_lossy(),
            "--cloudstack-max-rps",
            "12.5",
        ]);
        let client = client_config(&s).expect("complete config");
        assert_eq!(client.max_rps, Some(12.5));
    }

    #[test]
    fn job_max_follow_reaches_the_provider_settings() {
        let s = serve_args(&["p", "serve", "--nodes", "1:5:abc"]);
        assert_eq!(
            settings(&s, Vec::new()).job_max_follow,
            Duration::from_secs(2 * 3600),
            "default"
        );
        let s = serve_args(&["p", "serve", "--job-max-follow", "90m"]);
        assert_eq!(
            settings(&s, Vec::new()).job_max_follow,
            Duration::from_secs(90 * 60)
        );
    }

    #[test]
    fn a_worker_is_down_for_the_gauges_exactly_when_its_vm_is_down_and_it_stays() {
        use cks_domain::cluster::{NodeRole, Vm, VmState};
        use cks_domain::status::{VmActivity, scale_up_failure, vm_status};
        let states = [
            VmState::Starting,
            VmState::Running,
            VmState::Stopping,
            VmState::Stopped,
            VmState::Destroyed,
            VmState::Expunging,
            VmState::Migrating,
            VmState::Error,
            VmState::Unknown,
            VmState::Shutdown,
            VmState::Restoring,
            VmState::Other("Hibernated".into()),
        ];
        let activities = [
            VmActivity::Idle,
            VmActivity::BeingCreated,
            VmActivity::BeingRemoved,
            VmActivity::RemovalTroubled(cks_domain::status::InstanceError {
                code: "removal-retrying".into(),
                message: "scale job failed".into(),
                class: cks_domain::status::ErrorClass::Other,
            }),
            VmActivity::CreateFailed(scale_up_failure("job-1", 530, "boom")),
        ];
        for state in states {
            for activity in &activities {
                let vm = Vm {
                    id: "vm-1".into(),
                    name: "k8s-node-1".into(),
                    state: state.clone(),
                    role: NodeRole::Worker,
                };
                let (told, error) = vm_status(&vm, activity);
                // Down: a worker the provider neither removes nor saw fail to be created, whose
                // VM is Stopped, Shutdown or Error (the autoscaler is told Running or Creating).
                let down = matches!(activity, VmActivity::Idle | VmActivity::BeingCreated)
                    && matches!(state, VmState::Stopped | VmState::Shutdown | VmState::Error);
                let w = gauge_worker(&InstanceView {
                    id: "cloudstack:///vm-1".into(),
                    state: told,
                    error,
                    vm_down: cks_domain::status::reported_down(&vm, activity),
                });
                assert_eq!(w.down, down, "{state} {activity:?}");
                let expected = match told {
                    InstanceState::Deleting => "deleting",
                    _ if down => "down",
                    InstanceState::Running => "running",
                    InstanceState::Creating => "creating",
                };
                assert_eq!(w.state(), expected, "{state} {activity:?}");
            }
        }
    }

    #[tokio::test]
    async fn runs_on_bound_listeners_until_the_shutdown_future_completes() {
        use cks_proto::cloud_provider_client::CloudProviderClient;
        let sim = cks_sim::spawn(cks_sim::SimConfig::for_tests("key", "secret"))
            .await
            .expect("simulator");
        let cloud_config = write_temp(
            "run.conf",
            &format!(
                "[Global]\napi-url = {}\napi-key = key\nsecret-key = secret\n",
                sim.api_url
            ),
        );
        let cluster = format!("1:10:{}", sim.cluster_ids()[0]);
        let c = cloud_config.to_string_lossy().to_string();
        let args = serve_args(&[
            "p",
            "serve",
            "--cloud-config",
            &c,
            "--nodes",
            &cluster,
            "--shutdown-grace",
            "1s",
        ]);
        let app = App::build(&args).await.expect("builds");
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let metrics = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let (grpc_addr, metrics_addr) = (grpc.local_addr().unwrap(), metrics.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(app.run(grpc, Some(metrics), async {
            let _ = stopped.await;
        }));

        let mut client = CloudProviderClient::connect(format!("http://{grpc_addr}"))
            .await
            .expect("gRPC answers");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let groups = client
                .node_groups(cks_proto::NodeGroupsRequest {})
                .await
                .expect("NodeGroups")
                .into_inner()
                .node_groups;
            let ready = reqwest::get(format!("http://{metrics_addr}/readyz"))
                .await
                .expect("readyz answers")
                .status();
            if !groups.is_empty() && ready == 200 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "never ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let page = reqwest::get(format!("http://{metrics_addr}/metrics"))
            .await
            .expect("metrics answers")
            .text()
            .await
            .expect("body");
        assert!(
            page.contains("cks_provider_node_group_workers{"),
            "the provider's groups reach the gauges:\n{page}"
        );

        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(20), running)
            .await
            .expect("stops after the shutdown future completes")
            .expect("joins")
            .expect("serves without error");
    }
}
