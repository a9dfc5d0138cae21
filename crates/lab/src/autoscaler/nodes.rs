//! The mock autoscaler's Kubernetes view: the nodes it sees, and where it gets them from.
//!
//! The real autoscaler lists nodes from the API server. Here a [`NodeSource`] supplies them:
//! [`SimNodeSource`] reads the simulator's kubelet emulation over HTTP, [`StaticNodeSource`] is
//! an in-memory list a test edits directly.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use serde::Deserialize;

use super::pods::{NodeTaint, Resources};
use crate::pb;

/// The annotation upstream puts on the fake nodes it builds for unregistered or failed
/// instances (`cloudprovider/cloud_provider.go` `FakeNodeReasonAnnotation`).
pub const FAKE_NODE_REASON_ANNOTATION: &str = "k8s.io/cluster-autoscaler/fake-node-reason";
/// [`FAKE_NODE_REASON_ANNOTATION`] value for an instance that never registered.
pub const FAKE_NODE_UNREGISTERED: &str = "unregistered";
/// [`FAKE_NODE_REASON_ANNOTATION`] value for an instance whose creation failed.
pub const FAKE_NODE_CREATE_ERROR: &str = "create-error";

/// Why a node the autoscaler sent was faked ([`FAKE_NODE_REASON_ANNOTATION`]); `None` for a
/// real node.
pub fn fake_reason(node: &pb::ExternalGrpcNode) -> Option<&str> {
    node.annotations
        .get(FAKE_NODE_REASON_ANNOTATION)
        .map(String::as_str)
}

/// One Kubernetes node as the autoscaler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KubeNode {
    /// `metadata.name`.
    pub name: String,
    /// `spec.providerID`; may be empty (no cloud-controller-manager).
    pub provider_id: String,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// When the node registered, in the source's own clock (informational only: the autoscaler
    /// times nodes from when it first saw them).
    pub registered_ms: u64,
    /// `status.allocatable` (cpu, memory, pods), when the source reports it. Without it the
    /// node's room is unbounded for the mock's scheduling.
    pub allocatable: Option<Resources>,
    /// `spec.taints`.
    pub taints: Vec<NodeTaint>,
    /// Pods scale-down must evict before deleting the node (not DaemonSet or mirror pods):
    /// 0 is an empty node, more a node to drain.
    pub movable_pods: u32,
    /// `nvidia.com/gpu` allocatable.
    pub gpus: u64,
}

impl KubeNode {
    /// A Ready node with no labels or annotations.
    pub fn new(name: impl Into<String>, provider_id: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            provider_id: provider_id.into(),
            ready: true,
            ..Self::default()
        }
    }

    /// The same node, NotReady.
    #[must_use]
    pub fn not_ready(mut self) -> Self {
        self.ready = false;
        self
    }

    /// The same node with one more label.
    #[must_use]
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The same node with this allocatable.
    #[must_use]
    pub fn with_allocatable(mut self, allocatable: Resources) -> Self {
        self.allocatable = Some(allocatable);
        self
    }

    /// The same node with one more taint.
    #[must_use]
    pub fn with_taint(mut self, taint: NodeTaint) -> Self {
        self.taints.push(taint);
        self
    }

    /// The same node with `n` pods to move before it is deleted (a node to drain).
    #[must_use]
    pub fn with_movable_pods(mut self, n: u32) -> Self {
        self.movable_pods = n;
        self
    }

    /// The same node with `n` GPUs allocatable.
    #[must_use]
    pub fn with_gpus(mut self, n: u64) -> Self {
        self.gpus = n;
        self
    }

    /// The same node with one more annotation.
    #[must_use]
    pub fn with_annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// The fake node the autoscaler builds for an instance that has no Kubernetes node:
    /// name = providerID = instance id, one annotation giving the reason, no labels.
    pub fn fake(instance_id: &str, reason: &str) -> Self {
        Self {
            name: instance_id.to_owned(),
            provider_id: instance_id.to_owned(),
            ready: false,
            annotations: BTreeMap::from([(
                FAKE_NODE_REASON_ANNOTATION.to_owned(),
                reason.to_owned(),
            )]),
            ..Self::default()
        }
    }

    /// What the externalgrpc client sends for this node.
    pub fn to_grpc(&self) -> pb::ExternalGrpcNode {
        pb::ExternalGrpcNode {
            provider_id: self.provider_id.clone(),
            name: self.name.clone(),
            labels: self.labels.clone().into_iter().collect(),
            annotations: self.annotations.clone().into_iter().collect(),
        }
    }

    /// The externalgrpc client's NodeGroupForNode cache key: name followed by providerID.
    pub(crate) fn cache_key(&self) -> String {
        format!("{}{}", self.name, self.provider_id)
    }
}

/// The future a [`NodeSource`] returns.
pub type NodeListFuture<'a> =
    Pin<Box<dyn Future<Output = anyhow::Result<Vec<KubeNode>>> + Send + 'a>>;

/// Where the mock autoscaler gets its Kubernetes node list from, once per loop.
pub trait NodeSource: Send + Sync {
    /// Every node of the cluster, control-plane nodes included.
    fn list_nodes(&self) -> NodeListFuture<'_>;
}

/// A shared, mutable, in-memory node list. Clones share the same list, so a test keeps one
/// clone and edits nodes while the autoscaler holds another.
#[derive(Debug, Clone, Default)]
pub struct StaticNodeSource {
    inner: Arc<Mutex<StaticInner>>,
}

#[derive(Debug, Default)]
struct StaticInner {
    nodes: Vec<KubeNode>,
    error: Option<String>,
}

impl StaticNodeSource {
    /// A source listing `nodes`.
    pub fn new(nodes: Vec<KubeNode>) -> Self {
        Self {
            inner: Arc::new(Mutex::new(StaticInner { nodes, error: None })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StaticInner> {
        // A panic while holding this lock can only come from a failing test; keep the data.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Replaces the whole list.
    pub fn set_nodes(&self, nodes: Vec<KubeNode>) {
        self.lock().nodes = nodes;
    }

    /// Adds a node, replacing any node of the same name.
    pub fn add(&self, node: KubeNode) {
        let mut inner = self.lock();
        inner.nodes.retain(|n| n.name != node.name);
        inner.nodes.push(node);
    }

    /// Removes the node called `name`; false if there was none.
    pub fn remove(&self, name: &str) -> bool {
        let mut inner = self.lock();
        let before = inner.nodes.len();
        inner.nodes.retain(|n| n.name != name);
        inner.nodes.len() != before
    }

    /// Sets the Ready condition of the node called `name`; false if there is none.
    pub fn set_ready(&self, name: &str, ready: bool) -> bool {
        let mut inner = self.lock();
        match inner.nodes.iter_mut().find(|n| n.name == name) {
            Some(node) => {
                node.ready = ready;
                true
            }
            None => false,
        }
    }

    /// Makes every following listing fail with `message` (`None` to recover).
    pub fn set_error(&self, message: Option<String>) {
        self.lock().error = message;
    }

    /// The current list.
    pub fn nodes(&self) -> Vec<KubeNode> {
        self.lock().nodes.clone()
    }
}

impl NodeSource for StaticNodeSource {
    fn list_nodes(&self) -> NodeListFuture<'_> {
        let result = {
            let inner = self.lock();
            match &inner.error {
                Some(message) => Err(anyhow!("{message}")),
                None => Ok(inner.nodes.clone()),
            }
        };
        Box::pin(async move { result })
    }
}

/// Reads the nodes of the simulator's kubelet emulation through its simulator-only, unsigned
/// `simListNodes` command.
#[derive(Debug, Clone)]
pub struct SimNodeSource {
    http: reqwest::Client,
    api_url: url::Url,
    cluster_id: Option<String>,
}

impl SimNodeSource {
    /// A source reading from the simulator's API endpoint (for example
    /// `http://127.0.0.1:8080/client/api`), listing the nodes of every cluster.
    pub fn new(api_url: &str) -> anyhow::Result<Self> {
        let api_url = url::Url::parse(api_url)
            .with_context(|| format!("simulator API URL {api_url:?} is not a valid URL"))?;
        if !matches!(api_url.scheme(), "http" | "https") {
            bail!("simulator API URL {api_url} must be http or https");
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("building the HTTP client for the simulator")?;
        Ok(Self {
            http,
            api_url,
            cluster_id: None,
        })
    }

    /// The same source restricted to one CKS cluster.
    #[must_use]
    pub fn for_cluster(mut self, cluster_id: impl Into<String>) -> Self {
        self.cluster_id = Some(cluster_id.into());
        self
    }

    async fn fetch(&self) -> anyhow::Result<Vec<KubeNode>> {
        let mut query = vec![("command", "simListNodes"), ("response", "json")];
        if let Some(id) = &self.cluster_id {
            query.push(("clusterid", id));
        }
        let response = self
            .http
            .get(self.api_url.clone())
            .query(&query)
            .send()
            .await
            .with_context(|| format!("simListNodes request to {} failed", self.api_url))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .with_context(|| format!("reading the simListNodes answer from {}", self.api_url))?;
        parse_sim_list_nodes(status, &body)
    }
}

impl NodeSource for SimNodeSource {
    fn list_nodes(&self) -> NodeListFuture<'_> {
        Box::pin(self.fetch())
    }
}

#[derive(Deserialize)]
struct SimEnvelope {
    simlistnodesresponse: SimListNodes,
}

#[derive(Deserialize, Default)]
struct SimListNodes {
    #[serde(default)]
    node: Vec<SimNode>,
    errorcode: Option<i64>,
    errortext: Option<String>,
}

#[derive(Deserialize)]
struct SimNode {
    name: String,
    #[serde(default)]
    providerid: String,
    #[serde(default)]
    ready: bool,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    registeredms: u64,
    /// `cpu`, `memory`, `pods` as Kubernetes quantities.
    #[serde(default)]
    allocatable: BTreeMap<String, String>,
}

fn parse_sim_list_nodes(status: reqwest::StatusCode, body: &str) -> anyhow::Result<Vec<KubeNode>> {
    let parsed: Result<SimEnvelope, _> = serde_json::from_str(body);
    let list = match parsed {
        Ok(envelope) => envelope.simlistnodesresponse,
        Err(err) if status.is_success() => {
            return Err(anyhow!(err).context(format!(
                "simListNodes answer is not the expected JSON: {}",
                snippet(body)
            )));
        }
        Err(_) => bail!("simListNodes failed with HTTP {status}: {}", snippet(body)),
    };
    if let Some(code) = list.errorcode {
        bail!(
            "simListNodes failed with HTTP {status}, error {code}: {}",
            list.errortext.as_deref().unwrap_or("(no errortext)")
        );
    }
    if !status.is_success() {
        bail!("simListNodes failed with HTTP {status}: {}", snippet(body));
    }
    list.node
        .into_iter()
        .map(|n| {
            let allocatable = sim_allocatable(&n.allocatable)
                .with_context(|| format!("simListNodes: node {}", n.name))?;
            Ok(KubeNode {
                name: n.name,
                provider_id: n.providerid,
                ready: n.ready,
                labels: n.labels,
                annotations: n.annotations,
                registered_ms: n.registeredms,
                allocatable,
                ..KubeNode::default()
            })
        })
        .collect()
}

/// The simulator's allocatable map; none when it reports none.
fn sim_allocatable(map: &BTreeMap<String, String>) -> anyhow::Result<Option<Resources>> {
    if map.is_empty() {
        return Ok(None);
    }
    let get = |k: &str| {
        map.get(k)
            .map(String::as_str)
            .ok_or_else(|| anyhow!("allocatable has no {k}: {map:?}"))
    };
    Resources::from_quantities(get("cpu")?, get("memory")?, get("pods")?)
        .map(Some)
        .map_err(|e| anyhow!("allocatable {e}"))
}

fn snippet(body: &str) -> String {
    const MAX: usize = 200;
    match body.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &body[..cut]),
        None => body.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::Query;
    use std::collections::HashMap;

    #[test]
    fn sim_answer_with_nodes_is_parsed() {
        let body = r#"{"simlistnodesresponse":{"count":1,"node":[{"name":"w-1","providerid":"external-cloudstack://abc",
            "vmid":"abc","clusterid":"c1","ready":true,"role":"worker","labels":{"a":"b"},"registeredms":123}]}}"#;
        let nodes = parse_sim_list_nodes(reqwest::StatusCode::OK, body).unwrap();
        assert_eq!(
            nodes,
            vec![
                KubeNode::new("w-1", "external-cloudstack://abc")
                    .with_label("a", "b")
                    .registered(123)
            ]
        );
    }

    #[test]
    fn sim_allocatable_is_parsed_and_a_bad_one_named() {
        let body = r#"{"simlistnodesresponse":{"node":[{"name":"w-1","providerid":"p","ready":true,
            "allocatable":{"cpu":"2","memory":"3996Mi","pods":"110"}}]}}"#;
        let nodes = parse_sim_list_nodes(reqwest::StatusCode::OK, body).unwrap();
        assert_eq!(
            nodes[0].allocatable,
            Some(Resources::new(2000, 3996 << 20, 110))
        );
        let body = r#"{"simlistnodesresponse":{"node":[{"name":"w-1","providerid":"p",
            "allocatable":{"cpu":"2","memory":"lots","pods":"110"}}]}}"#;
        let err = parse_sim_list_nodes(reqwest::StatusCode::OK, body).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("w-1") && text.contains("memory"), "{text}");
        let body = r#"{"simlistnodesresponse":{"node":[{"name":"w-1","providerid":"p",
            "allocatable":{"cpu":"2"}}]}}"#;
        assert!(parse_sim_list_nodes(reqwest::StatusCode::OK, body).is_err());
    }

    #[test]
    fn empty_sim_answer_is_an_empty_list() {
        let nodes = parse_sim_list_nodes(reqwest::StatusCode::OK, r#"{"simlistnodesresponse":{}}"#)
            .unwrap();
        assert!(nodes.is_empty());
    }

    #[test]
    fn sim_error_answer_names_the_error() {
        let body =
            r#"{"simlistnodesresponse":{"errorcode":431,"errortext":"Unable to find cluster c9"}}"#;
        let err =
            parse_sim_list_nodes(reqwest::StatusCode::from_u16(431).unwrap(), body).unwrap_err();
        assert!(
            err.to_string().contains("431")
                && err.to_string().contains("Unable to find cluster c9"),
            "{err}"
        );
    }

    #[test]
    fn garbage_answer_is_a_clear_error() {
        let err = parse_sim_list_nodes(reqwest::StatusCode::OK, "<html>").unwrap_err();
        assert!(
            format!("{err:#}").contains("not the expected JSON"),
            "{err:#}"
        );
    }

    #[test]
    fn bad_url_is_refused() {
        assert!(SimNodeSource::new("not a url").is_err());
        assert!(SimNodeSource::new("ftp://x/").is_err());
    }

    #[tokio::test]
    async fn sim_node_source_queries_the_simulator() {
        async fn handler(Query(q): Query<HashMap<String, String>>) -> String {
            assert_eq!(q.get("command").map(String::as_str), Some("simListNodes"));
            assert_eq!(q.get("response").map(String::as_str), Some("json"));
            let cluster = q.get("clusterid").cloned().unwrap_or_default();
            format!(
                r#"{{"simlistnodesresponse":{{"count":1,"node":[{{"name":"n-{cluster}","providerid":"p","ready":false}}]}}}}"#
            )
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/client/api", axum::routing::get(handler));
        tokio::spawn(async move { axum::serve(listener, app).await });

        let source = SimNodeSource::new(&format!("http://{addr}/client/api")).unwrap();
        let all = source.list_nodes().await.unwrap();
        assert_eq!(all, vec![KubeNode::new("n-", "p").not_ready()]);
        let one = source.for_cluster("c7").list_nodes().await.unwrap();
        assert_eq!(one[0].name, "n-c7");
    }

    #[tokio::test]
    async fn static_source_edits_are_seen_by_clones() {
        let source = StaticNodeSource::new(vec![KubeNode::new("a", "pa")]);
        let view = source.clone();
        source.add(KubeNode::new("b", "pb"));
        assert!(source.set_ready("a", false));
        assert!(!source.set_ready("zz", false));
        let nodes = view.list_nodes().await.unwrap();
        assert_eq!(
            nodes,
            vec![
                KubeNode::new("a", "pa").not_ready(),
                KubeNode::new("b", "pb")
            ]
        );
        source.set_error(Some("apiserver down".into()));
        assert!(
            view.list_nodes()
                .await
                .unwrap_err()
                .to_string()
                .contains("apiserver down")
        );
        assert!(source.remove("a"));
    }

    impl KubeNode {
        fn registered(mut self, ms: u64) -> Self {
            self.registered_ms = ms;
            self
        }
    }
}
