//! The read-only admin address (`serve --admin-listen`), as an operator reaches it with
//! `kubectl exec … cks-autoscaler-provider probe`: the real binary serving two clusters, each
//! bound to its autoscaler over mutual TLS, and the real `probe` given only the CA. Over the
//! admin address `probe` sees every group without a client certificate; every write is
//! PERMISSION_DENIED and reaches no CloudStack; a non-loopback address is refused at start;
//! the main address still asks for the client certificate.
//!
//! Processes keep their own clock: these tests run on real time and wait on conditions.

use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{ClusterSpec, Scenario, SimHandle};
use cks_testkit::certs::{TempDir, bound_tls};
use cks_testkit::process::{ProviderArgs, ProviderProcess};
use cks_testkit::*;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cks-autoscaler-provider"))
}

/// A simulator with clusters alpha and beta (1 control VM, 3 workers each) and the provider
/// binary serving them, alpha bound to `autoscaler.alpha` (the harness's client certificate)
/// and beta to `autoscaler.beta`, with the admin address on a free loopback port.
struct Setup {
    sim: SimHandle,
    provider: ProviderProcess,
    admin_port: u16,
    /// The CA that signed the provider's certificate, as the pod mounts it.
    ca: PathBuf,
    _dir: TempDir,
}

impl Setup {
    async fn start(name: &str) -> Setup {
        let scenario = Scenario {
            clusters: vec![
                ClusterSpec::new("alpha", 1, 3),
                ClusterSpec::new("beta", 1, 3),
            ],
            ..Scenario::empty()
        };
        let sim = start_sim(sim_config_with(|c| c.scenario = scenario)).await;
        let dir = TempDir::new(name);
        let tls = bound_tls("autoscaler.alpha");
        let ca = dir.write("ca.crt", &tls.ca);
        let mut args = ProviderArgs::new(
            &sim.api_url,
            &sim.api_key,
            &sim.secret_key,
            vec![
                "1:10:alpha@autoscaler.alpha".into(),
                "1:10:beta@autoscaler.beta".into(),
            ],
        )
        // Port 0: the kernel's choice, which no other test's provider can take; the start-up
        // log line says which port it is.
        .flag("--admin-listen", "127.0.0.1:0")
        .flag("--refresh-min-interval", "0s")
        .flag("--job-poll-interval", "50ms")
        .bound_to("autoscaler.alpha", tls);
        args.env.push((
            "RUST_LOG".into(),
            "warn,cks_autoscaler_provider::app=info".into(),
        ));
        let provider = ProviderProcess::spawn(bin(), &dir.path("provider"), args).await;
        provider.wait_serving(WAIT).await;
        let mut admin_port = None;
        wait_until("the provider logs its admin address", async || {
            admin_port = admin_port_in(&provider.log());
            admin_port.is_some()
        })
        .await;
        let admin_port = admin_port.expect("the admin port");
        Setup {
            sim,
            provider,
            admin_port,
            ca,
            _dir: dir,
        }
    }

    fn id(&self, cluster: &str) -> String {
        self.sim.cluster_id(cluster).expect("the cluster exists")
    }

    /// A client of the admin address: TLS checked against the CA as `localhost`, no client
    /// certificate.
    async fn admin_client(&self) -> CloudProviderClient<Channel> {
        let tls = cks_autoscaler_provider::tls::client_tls_config(&self.ca, None, "localhost")
            .expect("client TLS");
        let channel = Endpoint::from_shared(format!("https://localhost:{}", self.admin_port))
            .expect("endpoint")
            .tls_config(tls)
            .expect("TLS endpoint")
            .connect()
            .await
            .expect("the admin address answers TLS without a client certificate");
        CloudProviderClient::new(channel)
    }

    fn scale_requests(&self) -> usize {
        self.sim
            .requests()
            .iter()
            .filter(|r| r.command == "scaleKubernetesCluster")
            .count()
    }

    async fn shutdown(mut self) {
        self.provider.kill();
        self.sim.shutdown().await;
    }
}

/// The port of the admin address, from the provider's start-up log line
/// (`serving the read-only admin address … admin=127.0.0.1:PORT`).
fn admin_port_in(log: &str) -> Option<u16> {
    let line = log
        .lines()
        .find(|l| l.contains("serving the read-only admin address"))?;
    let (_, rest) = line.split_once("admin=")?;
    let addr: std::net::SocketAddr = rest.split_whitespace().next()?.parse().ok()?;
    assert!(addr.ip().is_loopback(), "{line}");
    Some(addr.port())
}

/// The binary's `probe` against `localhost:port` with only `--cacert`, as in the pod.
async fn probe(port: u16, ca: &Path) -> Output {
    crate::deploy_certs::probe_localhost(port, ca, None).await
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_in_the_pod_sees_every_group_over_the_admin_address_without_a_client_certificate() {
    let s = Setup::start("admin-probe").await;
    let _log = crate::faults::LogOnFailure::of(&s.provider);
    let (alpha, beta) = (s.id("alpha"), s.id("beta"));

    let out = probe(s.admin_port, &s.ca).await;
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("Refresh: ok"), "{shown}");
    for id in [&alpha, &beta] {
        assert!(
            shown.contains(&format!("node group {id} (min 1, max 10)")),
            "{id}: {shown}"
        );
    }
    assert!(shown.contains("target size: 3"), "{shown}");
    assert!(shown.contains("instances: 3"), "{shown}");

    // The autoscaler bound to alpha still sees alpha alone on the main address.
    let mut main = s.provider.client();
    let ids: Vec<String> = main
        .node_groups(pb::NodeGroupsRequest {})
        .await
        .expect("NodeGroups on the main address")
        .into_inner()
        .node_groups
        .into_iter()
        .map(|g| g.id)
        .collect();
    assert_eq!(ids, vec![alpha.clone()]);

    // The admin caller reads beta's node through NodeGroupForNode too.
    let mut admin = s.admin_client().await;
    let worker = s
        .sim
        .vms(&beta)
        .into_iter()
        .find(|(_, name, _)| name.contains("-node-"))
        .expect("a beta worker");
    let found = admin
        .node_group_for_node(pb::NodeGroupForNodeRequest {
            node: Some(node(
                &format!("external-cloudstack://{}", worker.0),
                &worker.1,
            )),
        })
        .await
        .expect("NodeGroupForNode on the admin address")
        .into_inner()
        .node_group
        .map(|g| g.id);
    assert_eq!(found, Some(beta));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_on_the_admin_address_is_permission_denied_and_reaches_no_cloudstack() {
    let s = Setup::start("admin-writes").await;
    let _log = crate::faults::LogOnFailure::of(&s.provider);
    let alpha = s.id("alpha");
    let mut admin = s.admin_client().await;
    admin
        .refresh(with_deadline(
            pb::RefreshRequest {},
            Duration::from_secs(20),
        ))
        .await
        .expect("Refresh is a read on the admin address");
    s.sim.reset_requests();
    let worker = s
        .sim
        .vms(&alpha)
        .into_iter()
        .find(|(_, name, _)| name.contains("-node-"))
        .expect("an alpha worker");
    let instance = format!("external-cloudstack://{}", worker.0);
    let deadline = Duration::from_secs(20);
    let refusals = [
        (
            "NodeGroupIncreaseSize",
            admin
                .node_group_increase_size(with_deadline(
                    pb::NodeGroupIncreaseSizeRequest {
                        delta: 1,
                        id: alpha.clone(),
                    },
                    deadline,
                ))
                .await
                .err(),
        ),
        (
            "NodeGroupDeleteNodes",
            admin
                .node_group_delete_nodes(with_deadline(
                    pb::NodeGroupDeleteNodesRequest {
                        nodes: vec![node(&instance, &worker.1)],
                        id: alpha.clone(),
                    },
                    deadline,
                ))
                .await
                .err(),
        ),
        (
            "NodeGroupDecreaseTargetSize",
            admin
                .node_group_decrease_target_size(pb::NodeGroupDecreaseTargetSizeRequest {
                    delta: -1,
                    id: alpha.clone(),
                })
                .await
                .err(),
        ),
        ("Cleanup", admin.cleanup(pb::CleanupRequest {}).await.err()),
    ];
    for (rpc, refused) in refusals {
        let status = refused.unwrap_or_else(|| panic!("{rpc} succeeded on the admin address"));
        assert_eq!(status.code(), Code::PermissionDenied, "{rpc}: {status:?}");
        assert!(
            status.message().contains("admin address is read-only"),
            "{rpc}: {}",
            status.message()
        );
    }
    let target = |c: &mut CloudProviderClient<Channel>| {
        let id = alpha.clone();
        let mut c = c.clone();
        async move {
            c.node_group_target_size(pb::NodeGroupTargetSizeRequest { id })
                .await
                .expect("NodeGroupTargetSize")
                .into_inner()
                .target_size
        }
    };
    assert_eq!(target(&mut admin).await, 3, "nothing was queued");
    let nodes = admin
        .node_group_nodes(pb::NodeGroupNodesRequest { id: alpha.clone() })
        .await
        .expect("NodeGroupNodes")
        .into_inner()
        .instances;
    assert!(
        nodes
            .iter()
            .all(|i| state_of(i) == pb::instance_status::InstanceState::InstanceRunning),
        "nothing is being deleted: {nodes:?}"
    );
    assert_eq!(s.scale_requests(), 0, "{:?}", s.sim.requests());

    // The same increase from the bound autoscaler on the main address reaches CloudStack:
    // the simulator records it when it happens.
    let mut main = s.provider.client();
    main.node_group_increase_size(with_deadline(
        pb::NodeGroupIncreaseSizeRequest {
            delta: 1,
            id: alpha.clone(),
        },
        deadline,
    ))
    .await
    .expect("IncreaseSize on the main address");
    wait_until("the autoscaler's scale-up reached CloudStack", async || {
        s.scale_requests() == 1
    })
    .await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_address_still_asks_for_the_client_certificate() {
    let s = Setup::start("admin-main-mtls").await;
    let _log = crate::faults::LogOnFailure::of(&s.provider);
    // The main address is this provider's: with alpha's client certificate it shows alpha.
    let groups = s
        .provider
        .client()
        .node_groups(pb::NodeGroupsRequest {})
        .await
        .expect("NodeGroups with the client certificate")
        .into_inner()
        .node_groups;
    assert_eq!(groups.len(), 1, "{groups:?}");
    let out = probe(s.provider.addr.port(), &s.ca).await;
    let shown = text(&out);
    assert!(!out.status.success(), "{shown}");
    assert!(!shown.contains("node group "), "{shown}");
    // The same probe on the admin address of the same process succeeds.
    let out = probe(s.admin_port, &s.ca).await;
    assert!(out.status.success(), "{}", text(&out));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_address_other_than_loopback_is_refused_at_start() {
    for addr in [
        "0.0.0.0:8087",
        "example.com:8087",
        "[::]:8087",
        "10.1.2.3:8087",
    ] {
        let mut cmd = tokio::process::Command::new(bin());
        for (k, _) in std::env::vars() {
            if k.starts_with("CKS_PROVIDER_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd.args(["serve", "--nodes", "1:3:alpha", "--admin-listen", addr])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
            .await
            .expect("serve ends at once")
            .expect("its output");
        let shown = text(&out);
        assert!(!out.status.success(), "{addr}: {shown}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--admin-listen") && stderr.contains("loopback"),
            "{addr}: {shown}"
        );
    }
    // The same variable from the environment is refused the same way.
    let mut cmd = tokio::process::Command::new(bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("CKS_PROVIDER_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args(["serve", "--nodes", "1:3:alpha"])
        .env("CKS_PROVIDER_ADMIN_LISTEN", "0.0.0.0:8087")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("serve runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("loopback"), "{stderr}");
}
