//! One provider for several CKS clusters, each autoscaler seeing and changing only its own:
//! groups bound with `--nodes MIN:MAX:CLUSTER@CLIENT` to the names of the autoscaler's client
//! certificate, over mutual TLS on loopback. Each client's view; another client's group not
//! found by any RPC, with nothing sent to CloudStack; Refresh and Cleanup limited to the
//! caller's groups; a rotated client CA; a node one autoscaler reports protecting its VM from
//! another's "unregistered" deletion; and the start refused when the setup would let one
//! autoscaler see another's group.

use cks_autoscaler_provider::app::App;
use cks_autoscaler_provider::cli::{Command, parse_args};
use cks_autoscaler_provider::provider::Settings;
use cks_autoscaler_provider::server::ServeOptions;
use cks_autoscaler_provider::tls::{ReloadingTls, TlsFiles, client_tls_config};
use cks_proto as pb;
use cks_proto::cloud_provider_client::CloudProviderClient;
use cks_sim::{ClusterSpec, RecordedRequest, Scenario, SimHandle};
use cks_testkit::certs::{Ca, Leaf, TempDir};
use cks_testkit::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

// ---------------------------------------------------------------------------------------------
// A provider for several clusters over mutual TLS.

/// The simulator's clusters: each 1 control VM and 3 Running workers.
fn clusters(names: &[&str]) -> Scenario {
    Scenario {
        clusters: names.iter().map(|n| ClusterSpec::new(n, 1, 3)).collect(),
        ..Scenario::empty()
    }
}

struct Fleet {
    sim: SimHandle,
    server: ProviderServer,
    /// Cluster name → id (= node group id).
    ids: BTreeMap<String, String>,
    dir: TempDir,
    server_ca: Ca,
    client_ca: Ca,
    tls: ReloadingTls,
    connections: AtomicU64,
}

impl Fleet {
    /// A simulator with `bindings`' clusters and a provider serving one group per cluster,
    /// bound to the client given (`None`: every client), over mutual TLS.
    async fn start(
        name: &str,
        bindings: &[(&str, Option<&str>)],
        tweak: impl FnOnce(&mut Settings),
    ) -> Fleet {
        cks_testkit::logs::capture();
        let names: Vec<&str> = bindings.iter().map(|(n, _)| *n).collect();
        let sim = start_sim(sim_config_with(|c| c.scenario = clusters(&names))).await;
        let ids: BTreeMap<String, String> = names
            .iter()
            .map(|n| (n.to_string(), sim.cluster_id(n).expect("cluster")))
            .collect();
        let mut settings = fast_settings(&ids[names[0]], 1, 10);
        settings.groups = names
            .iter()
            .map(|n| {
                let mut g = settings.groups[0].clone();
                g.cluster = cks_autoscaler_provider::config::ClusterRef::Id(ids[*n].clone());
                g
            })
            .collect();
        settings.clients = bindings
            .iter()
            .map(|(_, c)| c.map(str::to_string))
            .collect();
        tweak(&mut settings);

        let dir = TempDir::new(name);
        let server_ca = Ca::new("server CA");
        let client_ca = Ca::new("client CA");
        let server_leaf = server_ca.server();
        let files = TlsFiles {
            cert: dir.write("server.pem", &server_leaf.cert),
            key: dir.write("server-key.pem", &server_leaf.key),
            client_ca: Some(dir.write("client-ca.pem", &client_ca.pem)),
        };
        let tls = ReloadingTls::new(files, Duration::from_secs(1)).expect("TLS files");
        let options = ServeOptions {
            tls: Some(tls.clone()),
            ..ServeOptions::default()
        };
        let server = ProviderServer::start(&sim, settings, loopback(), options).await;
        Fleet {
            sim,
            server,
            ids,
            dir,
            server_ca,
            client_ca,
            tls,
            connections: AtomicU64::new(0),
        }
    }

    fn id(&self, cluster: &str) -> String {
        self.ids[cluster].clone()
    }

    /// A gRPC client presenting `leaf`, on a connection of its own.
    async fn client(&self, leaf: &Leaf) -> CloudProviderClient<Channel> {
        self.connect(leaf).await.expect("mutual TLS connection")
    }

    async fn connect(&self, leaf: &Leaf) -> Result<CloudProviderClient<Channel>, String> {
        let n = self.connections.fetch_add(1, Ordering::Relaxed);
        let ca = self.dir.write(&format!("c{n}-ca.pem"), &self.server_ca.pem);
        let cert = self.dir.write(&format!("c{n}.pem"), &leaf.cert);
        let key = self.dir.write(&format!("c{n}-key.pem"), &leaf.key);
        let tls = client_tls_config(&ca, Some((&cert, &key)), "localhost").expect("client TLS");
        let endpoint =
            Endpoint::from_shared(format!("https://127.0.0.1:{}", self.server.addr.port()))
                .unwrap()
                .tls_config(tls)
                .map_err(|e| format!("{e:?}"))?;
        let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
        Ok(CloudProviderClient::new(channel))
    }

    /// (VM id, name) of a cluster's workers.
    fn workers(&self, cluster: &str) -> Vec<(String, String)> {
        self.sim
            .vms(&self.id(cluster))
            .into_iter()
            .filter(|(_, name, _)| name.contains("-node-"))
            .map(|(id, name, _)| (id, name))
            .collect()
    }

    /// Every CloudStack request since the last [`Fleet::forget_requests`].
    fn requests(&self) -> Vec<RecordedRequest> {
        self.sim.requests()
    }

    fn forget_requests(&self) {
        self.sim.reset_requests();
    }

    fn scale_requests(&self) -> Vec<BTreeMap<String, String>> {
        self.requests()
            .into_iter()
            .filter(|r| r.command == "scaleKubernetesCluster")
            .map(|r| r.params)
            .collect()
    }

    /// Waits until a `nodeids` request naming `vm` reached CloudStack.
    async fn wait_removal_sent(&self, vm: &str) {
        wait_until("the removal sent", async || {
            self.scale_requests()
                .iter()
                .any(|p| p.get("nodeids").map(String::as_str) == Some(vm))
        })
        .await;
    }

    /// Clusters alpha and beta, each bound to its autoscaler (`autoscaler.alpha`,
    /// `autoscaler.beta`), and a client of each that has refreshed once.
    async fn alpha_beta(
        name: &str,
    ) -> (
        Fleet,
        CloudProviderClient<Channel>,
        CloudProviderClient<Channel>,
    ) {
        let fleet = Fleet::start(
            name,
            &[
                ("alpha", Some("autoscaler.alpha")),
                ("beta", Some("autoscaler.beta")),
            ],
            |_| {},
        )
        .await;
        let mut a = fleet
            .client(&fleet.client_ca.client("a", &["autoscaler.alpha"]))
            .await;
        let mut b = fleet
            .client(&fleet.client_ca.client("b", &["autoscaler.beta"]))
            .await;
        refresh(&mut a).await.expect("Refresh alpha");
        refresh(&mut b).await.expect("Refresh beta");
        (fleet, a, b)
    }

    async fn shutdown(mut self) {
        self.server.stop().await;
        self.sim.shutdown().await;
    }
}

// The RPCs, each under a 5 s deadline.

async fn refresh(c: &mut CloudProviderClient<Channel>) -> Result<(), Status> {
    c.refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(5)))
        .await
        .map(|_| ())
}

async fn group_ids(c: &mut CloudProviderClient<Channel>) -> Vec<String> {
    c.node_groups(pb::NodeGroupsRequest {})
        .await
        .expect("NodeGroups")
        .into_inner()
        .node_groups
        .into_iter()
        .map(|g| g.id)
        .collect()
}

/// The debug line of group `id` in the caller's NodeGroups.
async fn debug_of(c: &mut CloudProviderClient<Channel>, id: &str) -> String {
    c.node_groups(pb::NodeGroupsRequest {})
        .await
        .expect("NodeGroups")
        .into_inner()
        .node_groups
        .into_iter()
        .find(|g| g.id == id)
        .map(|g| g.debug)
        .unwrap_or_else(|| panic!("{id} not among the caller's groups"))
}

async fn group_for(c: &mut CloudProviderClient<Channel>, n: pb::ExternalGrpcNode) -> String {
    c.node_group_for_node(pb::NodeGroupForNodeRequest { node: Some(n) })
        .await
        .expect("NodeGroupForNode")
        .into_inner()
        .node_group
        .unwrap_or_default()
        .id
}

async fn target(c: &mut CloudProviderClient<Channel>, id: &str) -> Result<i32, Status> {
    c.node_group_target_size(pb::NodeGroupTargetSizeRequest { id: id.into() })
        .await
        .map(|r| r.into_inner().target_size)
}

async fn increase(
    c: &mut CloudProviderClient<Channel>,
    id: &str,
    delta: i32,
) -> Result<(), Status> {
    let req = pb::NodeGroupIncreaseSizeRequest {
        delta,
        id: id.into(),
    };
    c.node_group_increase_size(with_deadline(req, Duration::from_secs(5)))
        .await
        .map(|_| ())
}

async fn delete(
    c: &mut CloudProviderClient<Channel>,
    id: &str,
    nodes: Vec<pb::ExternalGrpcNode>,
) -> Result<(), Status> {
    let req = pb::NodeGroupDeleteNodesRequest {
        nodes,
        id: id.into(),
    };
    c.node_group_delete_nodes(with_deadline(req, Duration::from_secs(5)))
        .await
        .map(|_| ())
}

/// Every RPC that names a node group, against `id`: the status of each that failed (by RPC
/// name), `None` for one that succeeded.
async fn every_group_rpc(
    c: &mut CloudProviderClient<Channel>,
    id: &str,
    worker: &(String, String),
) -> Vec<(&'static str, Option<Status>)> {
    let instance = format!("external-cloudstack://{}", worker.0);
    let err = |r: Result<(), Status>| r.err();
    vec![
        ("NodeGroupTargetSize", err(target(c, id).await.map(|_| ()))),
        (
            "NodeGroupNodes",
            err(c
                .node_group_nodes(pb::NodeGroupNodesRequest { id: id.into() })
                .await
                .map(|_| ())),
        ),
        ("NodeGroupIncreaseSize", err(increase(c, id, 1).await)),
        (
            "NodeGroupDeleteNodes (real node)",
            err(delete(c, id, vec![node(&instance, &worker.1)]).await),
        ),
        (
            "NodeGroupDeleteNodes (fake unregistered node)",
            err(delete(c, id, vec![fake_node(&instance, "unregistered")]).await),
        ),
        (
            "NodeGroupDeleteNodes (fake create-error node)",
            err(delete(c, id, vec![fake_node(&instance, "create-error")]).await),
        ),
        (
            "NodeGroupDecreaseTargetSize",
            err(c
                .node_group_decrease_target_size(pb::NodeGroupDecreaseTargetSizeRequest {
                    delta: -1,
                    id: id.into(),
                })
                .await
                .map(|_| ())),
        ),
        (
            "NodeGroupTemplateNodeInfo",
            err(c
                .node_group_template_node_info(pb::NodeGroupTemplateNodeInfoRequest {
                    id: id.into(),
                })
                .await
                .map(|_| ())),
        ),
        (
            "NodeGroupGetOptions",
            err(c
                .node_group_get_options(pb::NodeGroupAutoscalingOptionsRequest {
                    id: id.into(),
                    defaults: None,
                })
                .await
                .map(|_| ())),
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[tokio::test(start_paused = true)]
async fn each_autoscaler_sees_only_the_groups_bound_to_it() {
    let fleet = Fleet::start(
        "view",
        &[
            ("alpha", Some("autoscaler.alpha")),
            // Names compare without regard to ASCII case, as DNS names do.
            ("beta", Some("AUTOSCALER.Beta")),
            // Bound to a CN: matched only for a certificate without DNS SANs.
            ("gamma", Some("gamma autoscaler")),
        ],
        |_| {},
    )
    .await;
    let ca = &fleet.client_ca;
    let mut a = fleet
        .client(&ca.client("cn-of-a", &["autoscaler.alpha"]))
        .await;
    let mut b = fleet
        .client(&ca.client("cn-of-b", &["other.example", "autoscaler.beta"]))
        .await;
    let mut c = fleet.client(&ca.client("gamma autoscaler", &[])).await;
    // Its CN names alpha's client, but a certificate with DNS SANs is known by those only.
    let mut stranger = fleet
        .client(&ca.client("autoscaler.alpha", &["autoscaler.nobody"]))
        .await;

    for (client, cluster) in [(&mut a, "alpha"), (&mut b, "beta"), (&mut c, "gamma")] {
        refresh(client).await.expect("Refresh");
        assert_eq!(
            group_ids(client).await,
            vec![fleet.id(cluster)],
            "{cluster}"
        );
        assert_eq!(
            target(client, &fleet.id(cluster))
                .await
                .map_err(|s| s.code()),
            Ok(3),
            "{cluster}"
        );
        let (vm, name) = fleet.workers(cluster)[0].clone();
        let own = node(&format!("external-cloudstack://{vm}"), &name);
        assert_eq!(group_for(client, own).await, fleet.id(cluster), "{cluster}");
    }

    // A client matching no group sees an empty provider, told once in the log.
    refresh(&mut stranger).await.expect("Refresh of nothing");
    assert!(group_ids(&mut stranger).await.is_empty());
    assert!(group_ids(&mut stranger).await.is_empty());
    let (vm, name) = fleet.workers("alpha")[0].clone();
    let alpha_node = node(&format!("external-cloudstack://{vm}"), &name);
    assert_eq!(group_for(&mut stranger, alpha_node).await, "");
    let told =
        cks_testkit::logs::lines_mentioning("client autoscaler.nobody matches no node group");
    assert_eq!(told.len(), 1, "logged once: {told:#?}");
    assert!(
        told[0].contains("autoscaler.alpha") && told[0].contains("@CLIENT"),
        "the log says what groups are bound to and how to bind: {}",
        told[0]
    );
    fleet.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn another_clients_group_is_not_found_and_nothing_reaches_cloudstack() {
    let (fleet, mut a, mut b) = Fleet::alpha_beta("cross").await;
    let (alpha, beta) = (fleet.id("alpha"), fleet.id("beta"));
    let alpha_worker = fleet.workers("alpha")[0].clone();
    let (control, control_name) = fleet
        .sim
        .vms(&alpha)
        .into_iter()
        .find(|(_, n, _)| n.contains("-control-"))
        .map(|(id, n, _)| (id, n))
        .expect("a control VM");
    let unknown = "00000000-0000-4000-8000-000000000000";

    fleet.forget_requests();
    let answers = every_group_rpc(&mut b, &alpha, &alpha_worker).await;
    let unknown_answers = every_group_rpc(&mut b, unknown, &alpha_worker).await;
    for ((rpc, got), (_, for_unknown)) in answers.iter().zip(&unknown_answers) {
        let got = got
            .as_ref()
            .unwrap_or_else(|| panic!("{rpc} of alpha by beta's client succeeded"));
        let for_unknown = for_unknown.as_ref().expect("an unknown group fails");
        assert_eq!(got.code(), Code::NotFound, "{rpc}: {got:?}");
        // Word for word what a group that does not exist gets: nothing tells them apart.
        assert_eq!(
            got.message().replace(&alpha, "ID"),
            for_unknown.message().replace(unknown, "ID"),
            "{rpc}"
        );
        assert!(
            got.message().contains(&beta),
            "lists the caller's own group: {}",
            got.message()
        );
    }
    // Alpha's nodes named in beta's own group are no node of it.
    let instance = format!("external-cloudstack://{}", alpha_worker.0);
    let in_own_group = delete(&mut b, &beta, vec![node(&instance, &alpha_worker.1)]).await;
    assert_eq!(in_own_group.map_err(|s| s.code()), Err(Code::NotFound));
    // Alpha's nodes belong to no group of beta's client.
    for n in [
        node(&instance, &alpha_worker.1),
        node("", &alpha_worker.1),
        node(&format!("external-cloudstack://{control}"), &control_name),
    ] {
        assert_eq!(group_for(&mut b, n.clone()).await, "", "{n:?}");
    }
    assert!(
        fleet.requests().is_empty(),
        "nothing was sent to CloudStack: {:?}",
        fleet.requests()
    );

    // Alpha was never touched, and its own autoscaler still sees and scales it.
    assert_eq!(target(&mut a, &alpha).await.map_err(|s| s.code()), Ok(3));
    increase(&mut a, &alpha, 1)
        .await
        .expect("alpha's own scale-up");
    let sent = fleet.scale_requests();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].get("id"), Some(&alpha));
    assert_eq!(target(&mut a, &alpha).await.map_err(|s| s.code()), Ok(4));
    assert_eq!(target(&mut b, &beta).await.map_err(|s| s.code()), Ok(3));
    fleet.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn refresh_and_cleanup_touch_only_the_callers_groups() {
    let fleet = Fleet::start(
        "refresh",
        &[
            ("alpha", Some("autoscaler.alpha")),
            ("beta", Some("autoscaler.beta")),
            ("gamma", Some("autoscaler.gamma")),
        ],
        |_| {},
    )
    .await;
    fleet
        .sim
        .configure(|s| s.job_duration = Duration::from_secs(3));
    let mut a = fleet
        .client(&fleet.client_ca.client("a", &["autoscaler.alpha"]))
        .await;
    let mut b = fleet
        .client(&fleet.client_ca.client("b", &["autoscaler.beta"]))
        .await;
    let (alpha, beta) = (fleet.id("alpha"), fleet.id("beta"));

    fleet.forget_requests();
    refresh(&mut b).await.expect("beta's Refresh");
    let listed: Vec<String> = fleet
        .requests()
        .into_iter()
        .filter(|r| r.command == "listKubernetesClusters")
        .filter_map(|r| r.params.get("id").cloned())
        .collect();
    assert_eq!(listed, vec![beta.clone()], "only beta's cluster is fetched");
    for other in [&alpha, &fleet.id("gamma")] {
        assert!(
            fleet
                .requests()
                .iter()
                .all(|r| !r.params.values().any(|v| v == other)),
            "no request names another client's cluster"
        );
    }
    // Alpha has no snapshot yet: only its own Refresh fetches it.
    assert_eq!(
        target(&mut a, &alpha).await.map_err(|s| s.code()),
        Err(Code::Unavailable)
    );
    refresh(&mut a).await.expect("alpha's Refresh");
    assert_eq!(target(&mut a, &alpha).await.map_err(|s| s.code()), Ok(3));

    // Beta's Cleanup leaves alpha's running scale-up followed: it stays alpha's operation and
    // its end reaches the provider with no Refresh.
    increase(&mut a, &alpha, 2).await.expect("alpha's scale-up");
    assert!(debug_of(&mut a, &alpha).await.contains("scale-up 3->5"));
    b.cleanup(pb::CleanupRequest {})
        .await
        .expect("beta's Cleanup");
    let line = debug_of(&mut a, &alpha).await;
    assert!(
        line.contains("scale-up 3->5"),
        "alpha's job still followed: {line}"
    );
    let provider = fleet.server.provider.clone();
    wait_until("alpha's job followed to its end", async || {
        provider
            .snapshot(&alpha)
            .is_some_and(|s| s.state.as_str() == "Running" && s.workers().count() == 5)
    })
    .await;
    assert_eq!(target(&mut a, &alpha).await.map_err(|s| s.code()), Ok(5));

    // Alpha's own Cleanup does stop following its job.
    increase(&mut a, &alpha, 1).await.expect("another scale-up");
    assert!(debug_of(&mut a, &alpha).await.contains("scale-up 5->6"));
    a.cleanup(pb::CleanupRequest {})
        .await
        .expect("alpha's Cleanup");
    let line = debug_of(&mut a, &alpha).await;
    assert!(!line.contains("scale-up"), "no longer followed: {line}");
    fleet.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_rotated_client_certificate_keeps_its_groups() {
    let fleet = Fleet::start(
        "rotate",
        &[
            ("alpha", Some("autoscaler.alpha")),
            ("beta", Some("autoscaler.beta")),
        ],
        |_| {},
    )
    .await;
    let alpha = fleet.id("alpha");
    let old_leaf = fleet.client_ca.client("a", &["autoscaler.alpha"]);
    let mut old = fleet.client(&old_leaf).await;
    refresh(&mut old).await.expect("Refresh");
    assert_eq!(group_ids(&mut old).await, vec![alpha.clone()]);

    // cert-manager rotates the client CA: for a while both are trusted, then the new one only.
    let new_ca = Ca::new("client CA 2");
    let new_leaf = new_ca.client("a", &["autoscaler.alpha"]);
    let both = format!("{}{}", fleet.client_ca.pem, new_ca.pem);
    fleet.dir.write("client-ca.pem", &both);
    let tls = fleet.tls.clone();
    wait_until("the CA bundle reloaded", async || tls.reloads() == 1).await;
    let mut renewed = fleet.client(&new_leaf).await;
    assert_eq!(group_ids(&mut renewed).await, vec![alpha.clone()]);
    assert_eq!(
        group_ids(&mut fleet.client(&old_leaf).await).await,
        vec![alpha.clone()]
    );

    fleet.dir.write("client-ca.pem", &new_ca.pem);
    wait_until("the new CA alone reloaded", async || tls.reloads() == 2).await;
    // TLS 1.3: the client may finish its handshake before the server refuses its
    // certificate, so the refusal shows on the first call.
    let answered = match fleet.connect(&old_leaf).await {
        Err(_) => None,
        Ok(mut c) => c.node_groups(pb::NodeGroupsRequest {}).await.ok(),
    };
    assert!(
        answered.is_none(),
        "the old certificate is refused: {answered:?}"
    );
    let mut renewed = fleet.client(&new_leaf).await;
    assert_eq!(group_ids(&mut renewed).await, vec![alpha.clone()]);
    assert_eq!(
        target(&mut renewed, &alpha).await.map_err(|s| s.code()),
        Ok(3)
    );
    // A certificate of the new CA for beta's client still sees beta only.
    let mut b = fleet
        .client(&new_ca.client("b", &["autoscaler.beta"]))
        .await;
    refresh(&mut b).await.expect("Refresh");
    assert_eq!(group_ids(&mut b).await, vec![fleet.id("beta")]);
    fleet.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_one_client_reports_protects_its_vm_from_anothers_unregistered_deletion() {
    // One group served to every client: two autoscalers may see it, and one may have no node
    // for a VM the other has registered.
    const PROVISION: Duration = Duration::from_secs(30);
    let fleet = Fleet::start("registered", &[("solo", None)], |s| {
        s.max_node_provision_time = PROVISION;
    })
    .await;
    let solo = fleet.id("solo");
    let mut a = fleet
        .client(&fleet.client_ca.client("a", &["autoscaler.a"]))
        .await;
    let mut b = fleet
        .client(&fleet.client_ca.client("b", &["autoscaler.b"]))
        .await;
    refresh(&mut a).await.expect("Refresh");
    let workers = fleet.workers("solo");
    let (w1, w1_name) = workers[0].clone();
    let (w2, _) = workers[1].clone();
    // A's node for w1 carries CloudStack's default providerID: nothing to learn from it.
    let instance = |vm: &str| format!("external-cloudstack://{vm}");
    assert_eq!(
        group_for(&mut a, node(&instance(&w1), &w1_name)).await,
        solo
    );

    fleet.forget_requests();
    let refused = delete(
        &mut b,
        &solo,
        vec![fake_node(&instance(&w1), "unregistered")],
    )
    .await
    .expect_err("w1's node is registered");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains(&w1_name) && refused.message().contains(&instance(&w1)),
        "names the node and the instance: {}",
        refused.message()
    );
    assert!(fleet.requests().is_empty(), "{:?}", fleet.requests());
    assert_eq!(target(&mut b, &solo).await.map_err(|s| s.code()), Ok(3));

    // A VM whose node nobody reported is B's to delete.
    delete(
        &mut b,
        &solo,
        vec![fake_node(&instance(&w2), "unregistered")],
    )
    .await
    .expect("w2 is unregistered as far as anyone said");
    // Its VM runs: stopped first (its drain would fail), then removed as a down VM.
    fleet.wait_removal_sent(&w2).await;
    let sent = fleet.scale_requests();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].get("nodeids"), Some(&w2));

    // Once w1's node has not been reported for the max-node-provision-time, the deletion is
    // the autoscaler's to make.
    elapse(PROVISION).await;
    delete(
        &mut b,
        &solo,
        vec![fake_node(&instance(&w1), "unregistered")],
    )
    .await
    .expect("w1's registration expired");
    fleet.wait_removal_sent(&w1).await;
    fleet.shutdown().await;
}

/// A caller's reports count only for its own groups: an autoscaler that reports another
/// cluster's VM as its node (by mistake, or to veto that cluster's deletions) protects nothing,
/// and the cluster's own autoscaler deletes the VM as unregistered.
#[tokio::test(start_paused = true)]
async fn another_clients_report_of_a_vm_does_not_veto_its_own_autoscaler() {
    let (fleet, mut a, mut b) = Fleet::alpha_beta("veto").await;
    let beta = fleet.id("beta");
    let (w, w_name) = fleet.workers("beta")[0].clone();
    let instance = format!("external-cloudstack://{w}");
    assert_eq!(
        group_for(&mut a, node(&instance, &w_name)).await,
        "",
        "beta's node is in no group of alpha's"
    );
    fleet.forget_requests();
    delete(&mut b, &beta, vec![fake_node(&instance, "unregistered")])
        .await
        .expect("beta's autoscaler deletes its unregistered VM");
    fleet.wait_removal_sent(&w).await;
    fleet.shutdown().await;
}

/// `--deny-client`: a client shut out sees no group, whatever binds groups to it, and says so
/// in the log once.
#[tokio::test(start_paused = true)]
async fn a_denied_client_sees_no_group() {
    let fleet = Fleet::start(
        "deny",
        &[
            ("alpha", Some("autoscaler.denied-alpha")),
            ("beta", Some("autoscaler.beta")),
        ],
        |s| s.denied_clients = vec!["AUTOSCALER.denied-alpha".into()],
    )
    .await;
    let mut a = fleet
        .client(&fleet.client_ca.client("a", &["autoscaler.denied-alpha"]))
        .await;
    let mut b = fleet
        .client(&fleet.client_ca.client("b", &["autoscaler.beta"]))
        .await;
    assert_eq!(group_ids(&mut a).await, Vec::<String>::new());
    assert_eq!(group_ids(&mut b).await, vec![fleet.id("beta")]);
    let alpha = fleet.id("alpha");
    assert_eq!(
        target(&mut a, &alpha).await.map_err(|s| s.code()),
        Err(Code::NotFound)
    );
    assert_eq!(
        cks_testkit::logs::lines_mentioning("autoscaler.denied-alpha is denied").len(),
        1,
        "logged once"
    );
    fleet.shutdown().await;
}

/// The real `probe`, presenting `leaf`, against the fleet's provider: its report.
async fn probe_as(fleet: &Fleet, leaf: &Leaf, tag: &str) -> String {
    let ca = fleet
        .dir
        .write(&format!("probe-{tag}-ca.pem"), &fleet.server_ca.pem);
    let cert = fleet.dir.write(&format!("probe-{tag}.pem"), &leaf.cert);
    let key = fleet.dir.write(&format!("probe-{tag}-key.pem"), &leaf.key);
    let out =
        crate::deploy_certs::probe_localhost(fleet.server.addr.port(), &ca, Some((&cert, &key)))
            .await;
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    report
}

/// `probe` with a client certificate no group is bound to says so, with the names the
/// provider read from it and how to bind it, instead of "no CloudStack snapshot yet"; a
/// denied client hears it is denied; a bound client sees its group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_says_when_its_client_is_bound_to_no_group_and_which_names_it_presented() {
    let fleet = Fleet::start(
        "probe-unbound",
        &[
            ("alpha", Some("autoscaler.alpha")),
            ("beta", Some("autoscaler.denied-beta")),
        ],
        |s| s.denied_clients = vec!["autoscaler.denied-beta".into()],
    )
    .await;
    let unbound = probe_as(
        &fleet,
        &fleet.client_ca.client("gamma", &["autoscaler.gamma"]),
        "gamma",
    )
    .await;
    assert!(
        unbound.contains(
            "No node groups for this client: it presented a certificate naming autoscaler.gamma \
             (its DNS names, or its CN when it has none), and no node group is bound to any of \
             these names. Bind its group with --nodes MIN:MAX:CLUSTER@autoscaler.gamma"
        ),
        "{unbound}"
    );
    assert!(!unbound.contains("snapshot"), "{unbound}");
    let denied = probe_as(
        &fleet,
        &fleet.client_ca.client("beta", &["autoscaler.denied-beta"]),
        "denied",
    )
    .await;
    assert!(
        denied.contains("--deny-client shuts one of these names out"),
        "{denied}"
    );
    let bound = probe_as(
        &fleet,
        &fleet.client_ca.client("alpha", &["autoscaler.alpha"]),
        "alpha",
    )
    .await;
    assert!(
        bound.contains(&format!("node group {}", fleet.id("alpha")))
            && !bound.contains("No node groups"),
        "{bound}"
    );
    fleet.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// The start.

fn serve_args(argv: &[&str]) -> cks_autoscaler_provider::cli::ServeArgs {
    let mut all = vec!["cks-autoscaler-provider", "serve"];
    all.extend_from_slice(argv);
    let argv: Vec<std::ffi::OsString> = all.iter().map(Into::into).collect();
    match parse_args(argv).expect("parses").command {
        Command::Serve(s) => *s,
        other => panic!("not serve: {other:?}"),
    }
}

#[tokio::test]
async fn a_start_that_would_let_an_autoscaler_see_another_clusters_group_is_refused() {
    let dir = TempDir::new("start");
    let cloud_config = dir.write(
        "cloud-config",
        "[Global]\napi-url = http://127.0.0.1:9/client/api\napi-key = k\nsecret-key = s\n",
    );
    let server_ca = Ca::new("server CA");
    let leaf = server_ca.server();
    let cert = dir.write("tls.pem", &leaf.cert);
    let key = dir.write("tls-key.pem", &leaf.key);
    let client_ca = dir.write("client-ca.pem", Ca::new("client CA").pem);
    let (cc, cert, key, client_ca) = (
        cloud_config.to_string_lossy().to_string(),
        cert.to_string_lossy().to_string(),
        key.to_string_lossy().to_string(),
        client_ca.to_string_lossy().to_string(),
    );
    let mtls = [
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &client_ca,
    ];
    let base = ["--cloud-config", cc.as_str()];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };

    let refused: [(Vec<String>, &[&str]); 4] = [
        (
            with(&["--nodes", "1:3:alpha", "--nodes", "1:3:beta"]),
            &[
                "2 name(s) no client (name=alpha, name=beta)",
                "--tls-client-ca is not set",
            ],
        ),
        (
            with(
                &[
                    &["--nodes", "1:3:alpha@a", "--nodes", "1:3:beta"][..],
                    &mtls[..],
                ]
                .concat(),
            ),
            &["1 name(s) no client (name=beta)"],
        ),
        (
            with(&["--nodes", "1:3:alpha@a", "--nodes", "1:3:beta@b"]),
            &["2 node group(s) name a client but --tls-client-ca is not set"],
        ),
        (
            with(&["--nodes", "1:3:alpha@a"]),
            &["1 node group(s) name a client but --tls-client-ca is not set"],
        ),
    ];
    for (argv, says) in &refused {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let err = match App::build(&serve_args(&argv)).await {
            Ok(_) => panic!("{argv:?} builds"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.starts_with("client binding: "), "{argv:?}: {err}");
        for s in *says {
            assert!(err.contains(s), "{argv:?}: {err}");
        }
    }
    for ok in [
        with(&["--nodes", "1:3:alpha"]),
        with(&[&["--nodes", "1:3:alpha"][..], &mtls[..]].concat()),
        with(
            &[
                &["--nodes", "1:3:alpha@a", "--nodes", "1:3:beta@b"][..],
                &mtls[..],
            ]
            .concat(),
        ),
    ] {
        let argv: Vec<&str> = ok.iter().map(String::as_str).collect();
        if let Err(e) = App::build(&serve_args(&argv)).await {
            panic!("{argv:?}: {e:#}");
        }
    }

    // The config file's `nodes:` list takes the same strings.
    let file = dir.write(
        "serve.yaml",
        format!(
            "cloud-config: {cc}\ntls-cert: {cert}\ntls-key: {key}\ntls-client-ca: {client_ca}\n\
             nodes: [\"1:3:alpha@autoscaler.alpha\", \"1:3:beta\"]\n"
        ),
    );
    let file = file.to_string_lossy().to_string();
    let err = match App::build(&serve_args(&["--config", &file])).await {
        Ok(_) => panic!("beta unbound in the config file"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("1 name(s) no client (name=beta)"), "{err}");
    let fixed = dir.write(
        "fixed.yaml",
        format!(
            "cloud-config: {cc}\ntls-cert: {cert}\ntls-key: {key}\ntls-client-ca: {client_ca}\n\
             nodes: [\"1:3:alpha@autoscaler.alpha\", \"1:3:beta@autoscaler.beta\"]\n"
        ),
    );
    if let Err(e) = App::build(&serve_args(&["--config", &fixed.to_string_lossy()])).await {
        panic!("bound in the config file: {e:#}");
    }

    // The binary exits non-zero before it listens, saying why.
    let port = cks_testkit::process::free_port().to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cks-autoscaler-provider"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--cloud-config",
            &cc,
            "--nodes",
            "1:3:alpha",
            "--nodes",
            "1:3:beta",
        ])
        .env_remove("RUST_LOG")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("client binding: "), "{stderr}");
    assert!(!stderr.contains("serving externalgrpc"), "{stderr}");
}
