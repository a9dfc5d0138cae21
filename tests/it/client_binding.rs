//! One provider for several CKS clusters, each autoscaler seeing and changing only its own:
//! groups bound with `--nodes MIN:MAX:CLUSTER@CLIENT` to the names of the autoscaler's client
//! certificate, over mutual TLS on loopback. Each client's view; another client's group not
//! found by any RPC, with nothing sent to CloudStack; Refresh and Cleanup limited to the
//! caller's groups; a rotated client CA; a node one autoscaler reports protecting its VM from
//! another's "unregistered" deletion; an autoscaler holding another cluster's certificate told
//! by the nodes it reports and refused its writes, and what a right autoscaler reports never
//! refusing its own; and the start refused when the setup would let one autoscaler see
//! another's group.

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
            .all_groups()
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
// An autoscaler holding another cluster's certificate.

/// Every VM of a cluster (its control VM included) as the real node its autoscaler reports:
/// CloudStack's CCM providerID and the VM's name.
fn real_nodes(fleet: &Fleet, cluster: &str) -> Vec<pb::ExternalGrpcNode> {
    fleet
        .sim
        .vms(&fleet.id(cluster))
        .into_iter()
        .map(|(id, name, _)| node(&format!("external-cloudstack://{id}"), &name))
        .collect()
}

/// The fake "unregistered" nodes an autoscaler makes of the instances of group `id` that it
/// sees no node for (name = providerID = instance id).
async fn fake_nodes_of(
    c: &mut CloudProviderClient<Channel>,
    id: &str,
) -> Vec<pb::ExternalGrpcNode> {
    c.node_group_nodes(pb::NodeGroupNodesRequest { id: id.into() })
        .await
        .expect("NodeGroupNodes")
        .into_inner()
        .instances
        .into_iter()
        .map(|i| fake_node(&i.id, "unregistered"))
        .collect()
}

/// NodeGroupForNode of each node, as one autoscaler loop asks it: the group ids answered.
async fn ask_about(
    c: &mut CloudProviderClient<Channel>,
    nodes: Vec<pb::ExternalGrpcNode>,
) -> Vec<String> {
    let mut answers = Vec::new();
    for n in nodes {
        answers.push(group_for(c, n).await);
    }
    answers
}

async fn decrease(c: &mut CloudProviderClient<Channel>, id: &str) -> Result<(), Status> {
    c.node_group_decrease_target_size(pb::NodeGroupDecreaseTargetSizeRequest {
        delta: -1,
        id: id.into(),
    })
    .await
    .map(|_| ())
}

/// The requests that change anything in CloudStack since the last `forget_requests`.
fn writes(fleet: &Fleet) -> Vec<RecordedRequest> {
    fleet
        .requests()
        .into_iter()
        .filter(|r| r.command == "scaleKubernetesCluster" || r.command == "stopVirtualMachine")
        .collect()
}

/// IncreaseSize of group `id` by one is accepted and sent; returns once the job has ended.
async fn scales(fleet: &Fleet, c: &mut CloudProviderClient<Channel>, id: &str, why: &str) {
    let before = target(c, id).await.expect("target size");
    fleet.forget_requests();
    increase(c, id, 1)
        .await
        .unwrap_or_else(|s| panic!("{why}: {s:?}"));
    assert_eq!(fleet.scale_requests().len(), 1, "{why}");
    let provider = fleet.server.provider.clone();
    let after = usize::try_from(before + 1).expect("a size");
    wait_until("the scale-up done", async || {
        provider
            .all_groups()
            .snapshot(id)
            .is_some_and(|s| s.state.as_str() == "Running" && s.workers().count() == after)
    })
    .await;
}

/// The autoscaler of cluster north given south's client certificate by mistake (one CA
/// issues both): it sees south's group, and the nodes it asks about are north's VMs, none of
/// south's. Once that is clear, its writes are refused naming both clusters and the fix
/// before anything is sent, one ERROR line and the gauge say so, and its reads still answer.
/// North's own autoscaler is unaffected. Once nothing has called under south's name for the
/// window (the autoscaler was given north's certificate), south's own autoscaler scales again.
#[tokio::test(start_paused = true)]
async fn an_autoscaler_holding_another_clusters_certificate_is_refused_its_writes() {
    let fleet = Fleet::start(
        "crossed",
        &[
            ("north", Some("autoscaler.north")),
            ("south", Some("autoscaler.south")),
        ],
        |_| {},
    )
    .await;
    let (north, south) = (fleet.id("north"), fleet.id("south"));
    let south_leaf = fleet.client_ca.client("s", &["autoscaler.south"]);
    let mut crossed = fleet.client(&south_leaf).await;
    let mut north_own = fleet
        .client(&fleet.client_ca.client("n", &["autoscaler.north"]))
        .await;
    refresh(&mut crossed).await.expect("Refresh");
    refresh(&mut north_own).await.expect("Refresh");
    assert_eq!(group_ids(&mut crossed).await, vec![south.clone()]);

    // Its first loop: its nodes (north's control VM and workers) are in no group of its; one
    // alone is not enough to tell.
    let north_nodes = real_nodes(&fleet, "north");
    assert_eq!(north_nodes.len(), 4);
    ask_about(&mut crossed, north_nodes[..1].to_vec()).await;
    fleet.forget_requests();
    assert_eq!(
        decrease(&mut crossed, &south).await.map_err(|s| s.code()),
        Err(Code::FailedPrecondition),
        "not judged on one VM: the request is looked at (nothing to cancel)"
    );
    let answers = ask_about(&mut crossed, north_nodes.clone()).await;
    assert!(answers.iter().all(String::is_empty), "{answers:?}");
    // Then the fake nodes it makes of south's instances, which it sees no node for: they are
    // south's, and say nothing of where it runs.
    let fakes = fake_nodes_of(&mut crossed, &south).await;
    assert_eq!(fakes.len(), 3);
    assert_eq!(ask_about(&mut crossed, fakes).await, vec![south.clone(); 3]);

    fleet.forget_requests();
    let (w, w_name) = fleet.workers("south")[0].clone();
    let instance = format!("external-cloudstack://{w}");
    let answers = [
        (
            "NodeGroupIncreaseSize",
            increase(&mut crossed, &south, 2).await,
        ),
        (
            "NodeGroupDeleteNodes (fake unregistered node)",
            delete(
                &mut crossed,
                &south,
                vec![fake_node(&instance, "unregistered")],
            )
            .await,
        ),
        (
            "NodeGroupDeleteNodes (real node)",
            delete(&mut crossed, &south, vec![node(&instance, &w_name)]).await,
        ),
        (
            "NodeGroupDecreaseTargetSize",
            decrease(&mut crossed, &south).await,
        ),
        (
            "Cleanup",
            crossed.cleanup(pb::CleanupRequest {}).await.map(|_| ()),
        ),
    ];
    for (rpc, answer) in answers {
        let refused = answer.expect_err(rpc);
        assert_eq!(refused.code(), Code::PermissionDenied, "{rpc}: {refused:?}");
        for says in [
            "client autoscaler.south is bound to cluster south",
            "are VMs of cluster north",
            "nothing was sent to CloudStack",
            "Give the autoscaler of north the client certificate of north",
            "--nodes MIN:MAX:north@autoscaler.south",
        ] {
            assert!(
                refused.message().contains(says),
                "{rpc}: {says:?} in {}",
                refused.message()
            );
        }
    }
    assert!(
        writes(&fleet).is_empty(),
        "nothing sent: {:?}",
        writes(&fleet)
    );
    // Its reads still answer, from a group that did not change.
    assert_eq!(
        target(&mut crossed, &south).await.map_err(|s| s.code()),
        Ok(3)
    );
    assert_eq!(group_ids(&mut crossed).await, vec![south.clone()]);
    // Said once, naming both clusters.
    let said: Vec<String> =
        cks_testkit::logs::lines_mentioning("client autoscaler.south is bound to cluster south")
            .into_iter()
            .filter(|l| l.contains("ERROR"))
            .collect();
    assert_eq!(said.len(), 1, "{said:#?}");
    assert!(said[0].contains("seen_cluster=north"), "{}", said[0]);
    let provider = fleet.server.provider.clone();
    let judged = cks_autoscaler_provider::metrics::ClientMismatch {
        client: "autoscaler.south".into(),
        bound_cluster: "south".into(),
        seen_cluster: "north".into(),
        active: true,
    };
    assert_eq!(
        provider.health().client_cluster_mismatches(),
        vec![judged.clone()]
    );
    let page = cks_testkit::scrape_metrics(std::sync::Arc::new(
        cks_autoscaler_provider::app::ProviderMetrics(provider.clone()),
    ))
    .await;
    let series = r#"cks_provider_client_cluster_mismatch{client="autoscaler.south",bound_cluster="south",seen_cluster="north"}"#;
    assert!(
        page.lines().any(|l| l == format!("{series} 1")),
        "{series} 1 in:\n{page}"
    );

    // North's own autoscaler is unaffected.
    ask_about(&mut north_own, real_nodes(&fleet, "north")).await;
    increase(&mut north_own, &north, 1)
        .await
        .expect("north's own scale-up");
    let sent = fleet.scale_requests();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].get("id"), Some(&north));

    // The autoscaler of north is given north's certificate: nothing reports under south's name
    // any more, and after the window the judgment ends, said once.
    drop(crossed);
    elapse(cks_autoscaler_provider::provider::SIGHTING_WINDOW).await;
    assert_eq!(
        provider.health().client_cluster_mismatches(),
        vec![cks_autoscaler_provider::metrics::ClientMismatch {
            active: false,
            ..judged
        }]
    );
    let ended = cks_testkit::logs::lines_mentioning(
        "client autoscaler.south is no longer taken for an autoscaler running in cluster north",
    );
    assert_eq!(ended.len(), 1, "{ended:#?}");
    // South's own autoscaler, with the same certificate, scales south.
    let mut south_own = fleet.client(&south_leaf).await;
    ask_about(&mut south_own, real_nodes(&fleet, "south")).await;
    fleet.forget_requests();
    increase(&mut south_own, &south, 1)
        .await
        .expect("south's own scale-up");
    let sent = fleet.scale_requests();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].get("id"), Some(&south));
    fleet.shutdown().await;
}

/// A judged identity that reports a node of its own cluster is no longer judged, at once:
/// south's own autoscaler, under the same name as the crossed one.
#[tokio::test(start_paused = true)]
async fn a_node_of_its_own_cluster_ends_the_judgment_at_once() {
    let fleet = Fleet::start(
        "crossed-back",
        &[
            ("upper", Some("autoscaler.upper")),
            ("lower", Some("autoscaler.lower")),
        ],
        |_| {},
    )
    .await;
    let lower = fleet.id("lower");
    let mut crossed = fleet
        .client(&fleet.client_ca.client("l", &["autoscaler.lower"]))
        .await;
    refresh(&mut crossed).await.expect("Refresh");
    // Upper's VMs are known once upper's group has a snapshot (its own autoscaler's Refresh,
    // or the provider's own round).
    let mut upper_own = fleet
        .client(&fleet.client_ca.client("u", &["autoscaler.upper"]))
        .await;
    refresh(&mut upper_own).await.expect("Refresh");
    ask_about(&mut crossed, real_nodes(&fleet, "upper")).await;
    let refused = increase(&mut crossed, &lower, 1).await.expect_err("judged");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    ask_about(&mut crossed, real_nodes(&fleet, "lower")[..1].to_vec()).await;
    fleet.forget_requests();
    increase(&mut crossed, &lower, 1)
        .await
        .expect("no longer judged");
    assert_eq!(fleet.scale_requests().len(), 1);
    assert_eq!(
        cks_testkit::logs::lines_mentioning(
            "client autoscaler.lower is no longer taken for an autoscaler running in cluster upper"
        )
        .len(),
        1
    );
    fleet.shutdown().await;
}

/// What a right autoscaler reports never has its writes refused: its control node (no
/// group), nodes of a cluster the provider does not serve and of no cluster, the fake nodes it
/// makes of its instances, two VMs of another cluster joined to it by mistake beside its own;
/// an identity bound to two clusters reporting nodes of both; and, on a provider serving one
/// cluster, whatever it reports.
#[tokio::test(start_paused = true)]
async fn what_a_right_autoscaler_reports_never_refuses_its_writes() {
    // "outside" is in CloudStack, not served by this provider.
    let fleet = Fleet::start(
        "rightful",
        &[
            ("east", Some("autoscaler.east")),
            ("west", Some("autoscaler.west")),
            ("wide", Some("autoscaler.west")),
            ("outside", None),
        ],
        |s| {
            s.groups.truncate(3);
            s.clients.truncate(3);
        },
    )
    .await;
    let (east, west, wide) = (fleet.id("east"), fleet.id("west"), fleet.id("wide"));
    let mut e = fleet
        .client(&fleet.client_ca.client("e", &["autoscaler.east"]))
        .await;
    let mut w = fleet
        .client(&fleet.client_ca.client("w", &["autoscaler.west"]))
        .await;
    refresh(&mut e).await.expect("Refresh");
    refresh(&mut w).await.expect("Refresh");
    let others = [
        node(
            "external-cloudstack://00000000-0000-4000-8000-00000000e0e0",
            "edge-1",
        ),
        node("aws:///eu-west-1a/i-0123", "ip-10-0-0-1"),
        node("", "laptop"),
    ];
    // Before any node of its own: the nodes of no served cluster, and fake nodes.
    ask_about(&mut e, real_nodes(&fleet, "outside")).await;
    ask_about(&mut e, others.to_vec()).await;
    let fakes = fake_nodes_of(&mut e, &east).await;
    ask_about(&mut e, fakes).await;
    scales(
        &fleet,
        &mut e,
        &east,
        "only nodes of no served cluster and fake ones",
    )
    .await;
    // Its own nodes, control VM first, then two of west's VMs joined to it by mistake.
    ask_about(&mut e, real_nodes(&fleet, "east")).await;
    ask_about(&mut e, real_nodes(&fleet, "west")[..2].to_vec()).await;
    scales(
        &fleet,
        &mut e,
        &east,
        "its own nodes beside two of another cluster's",
    )
    .await;
    // An identity bound to two clusters, reporting nodes of both.
    ask_about(&mut w, real_nodes(&fleet, "west")).await;
    ask_about(&mut w, real_nodes(&fleet, "wide")).await;
    scales(&fleet, &mut w, &west, "bound to both").await;
    scales(&fleet, &mut w, &wide, "bound to both").await;
    assert_eq!(
        fleet.server.provider.health().client_cluster_mismatches(),
        vec![]
    );
    assert!(
        cks_testkit::logs::lines_mentioning("client autoscaler.east is bound to cluster")
            .is_empty()
    );
    // Its reports of its own cluster beside two of west's VMs are said once, as the mark of
    // one certificate in use by both clusters' autoscalers; the identity bound to both
    // clusters is never suspected.
    let shared = cks_testkit::logs::lines_mentioning(
        "client autoscaler.east reports nodes of its own cluster east and of cluster west",
    );
    assert_eq!(shared.len(), 1, "{shared:?}");
    assert!(cks_testkit::logs::lines_mentioning("client autoscaler.west reports nodes").is_empty());
    fleet.shutdown().await;

    // One cluster served: there is no other cluster to be seen in.
    let solo = Fleet::start(
        "rightful-solo",
        &[("alone", Some("autoscaler.alone")), ("aside", None)],
        |s| {
            s.groups.truncate(1);
            s.clients.truncate(1);
        },
    )
    .await;
    let alone = solo.id("alone");
    let mut c = solo
        .client(&solo.client_ca.client("a", &["autoscaler.alone"]))
        .await;
    refresh(&mut c).await.expect("Refresh");
    ask_about(&mut c, real_nodes(&solo, "aside")).await;
    solo.forget_requests();
    increase(&mut c, &alone, 1)
        .await
        .expect("one cluster served");
    assert_eq!(solo.scale_requests().len(), 1);
    assert_eq!(
        solo.server.provider.health().client_cluster_mismatches(),
        vec![]
    );
    solo.shutdown().await;
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
