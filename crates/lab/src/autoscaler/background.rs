//! What the real autoscaler does in goroutines, beside its loop: scale-down deletions and the
//! periodic refresh of the NodeGroupNodes cache. Tasks here send their RPCs on their own client
//! handles and leave what happened in an [`Outbox`]; the next loop collects it, as the real
//! loop learns deletion results from its `NodeDeletionTracker` at the start of `RunOnce`
//! (`scaleDownActuator.CheckStatus()` in `core/static_autoscaler.go`).
//!
//! Scale-down deletion follows `core/scaledown/actuation/` at cluster-autoscaler-1.33.0 and
//! 1.35.0 (the same code in both):
//!
//! - `actuator.go` `deleteAsyncEmpty` / `deleteAsyncDrain`: one goroutine per node group and
//!   kind (empty, drained) running `deleteNodesAsync`, which sleeps
//!   `--node-delete-delay-after-taint` (5 s) and then starts one goroutine per node
//!   (`ScheduleDeletion`);
//! - `group_deletion_scheduler.go` `scheduleDeletion`: `NodeGroupGetOptions` for the node's
//!   group (an error other than Unimplemented aborts that node's deletion; an answer the
//!   release's client would crash on crashes the process, which the next loop reports), the
//!   drain (drained nodes only), then the batcher;
//! - `delete_in_batch.go` `AddNodes`: with `--node-deletion-batcher-interval` 0 (the default)
//!   `deleteNodesAndRegisterStatus` runs at once in its own goroutine with that one node, so
//!   a loop removing several nodes sends one `NodeGroupDeleteNodes` per node, concurrently;
//!   with an interval the first node of a group starts a timer and every node of that group
//!   added before it fires goes in one call. `deleteNodesFromCloudProvider` asks
//!   `NodeGroupForNode` for the first node (through the client's cache, which the loop shares
//!   and each Refresh empties), then `DeleteNodes` on the group it answered. A failure untaints
//!   every node of the call (`CleanUpAndRecordFailedScaleDownEvent`) and ends its deletion with
//!   an error. A success keeps the ToBeDeleted taint (`RegisterAndRecordSuccessfulScaleDownEvent`
//!   does not clean it): the node stays unschedulable, and clusterstate counts it Deleted, until
//!   it leaves the cluster or a new autoscaler process starts (`cleanUpIfRequired`).
//! - `deleteNodesFromCloudProvider` up to 1.29 (cluster-autoscaler-1.28.0 … 1.29.5) has no
//!   check for a nil node group: a NodeGroupForNode error, or an answer with id "", makes
//!   `deleteNodesAndRegisterStatus` call a method on the nil group and the process dies. The
//!   check ("picked node that doesn't belong to a node group") came with commit 476b52442b
//!   ("fix deleteNodesFromCloudProvider panic"), first in cluster-autoscaler-1.30.0; from then
//!   both are a failed deletion.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::calls::{Finished, GroupOptions, nodes_call};
use super::client::{
    GroupForNodeCache, OptionsFailure, delete_nodes_call, get_options_call,
    node_group_for_node_cached,
};
use super::config::AutoscalerConfig;
use super::nodes::KubeNode;
use super::timeline::Reply;
use crate::pb;
use cks_proto::cloud_provider_client::CloudProviderClient;

pub(crate) use super::client::lock;

/// Something a background task finished.
#[derive(Debug)]
pub(crate) enum Done {
    /// An RPC, sent during or after loop `loop_no`.
    Call {
        loop_no: u64,
        finished: Box<Finished>,
    },
    /// The real autoscaler process would have crashed in a background task (a nil pointer
    /// dereference in `NodeGroup.GetOptions`).
    Crash { reason: String },
    /// The end of one node's scale-down deletion.
    Deletion {
        key: String,
        group: String,
        node: String,
        result: Result<(), String>,
        at: Instant,
    },
}

/// Where background tasks leave their results until a loop collects them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outbox {
    done: Arc<Mutex<Vec<Done>>>,
    loop_no: Arc<AtomicU64>,
    changed: Arc<Notify>,
}

impl Outbox {
    pub(crate) fn set_loop(&self, loop_no: u64) {
        self.loop_no.store(loop_no, Ordering::Relaxed);
    }

    pub(crate) fn call(&self, finished: Finished) {
        let loop_no = self.loop_no.load(Ordering::Relaxed);
        lock(&self.done).push(Done::Call {
            loop_no,
            finished: Box::new(finished),
        });
        self.changed.notify_waiters();
    }

    fn deletion(&self, key: String, group: &str, node: &str, result: Result<(), String>) {
        lock(&self.done).push(Done::Deletion {
            key,
            group: group.to_owned(),
            node: node.to_owned(),
            result,
            at: Instant::now(),
        });
        self.changed.notify_waiters();
    }

    fn crash(&self, reason: String) {
        lock(&self.done).push(Done::Crash { reason });
        self.changed.notify_waiters();
    }

    pub(crate) fn take(&self) -> Vec<Done> {
        std::mem::take(&mut *lock(&self.done))
    }

    /// Resolves after the next result arrives (create it before looking, so none is missed).
    pub(crate) fn changed(&self) -> Arc<Notify> {
        self.changed.clone()
    }
}

/// The NodeGroupNodes answers clusterstate keeps (`clusterstate/utils/node_instances_cache.go`
/// `CloudProviderNodeInstancesCache`): per group, the last listing and when it was fetched.
#[derive(Debug, Default)]
pub(crate) struct InstancesCache {
    entries: HashMap<String, (Vec<pb::Instance>, Instant)>,
}

impl InstancesCache {
    pub(crate) fn get(&self, group: &str) -> Option<&Vec<pb::Instance>> {
        self.entries.get(group).map(|(list, _)| list)
    }

    pub(crate) fn insert(&mut self, group: &str, instances: Vec<pb::Instance>) {
        self.entries
            .insert(group.to_owned(), (instances, Instant::now()));
    }

    /// `InvalidateCacheEntry`.
    pub(crate) fn invalidate(&mut self, group: &str) {
        self.entries.remove(group);
    }

    /// `removeEntriesForNonExistingNodeGroupsLocked`.
    fn retain_groups(&mut self, groups: &[String]) {
        self.entries.retain(|g, _| groups.contains(g));
    }
}

/// One node handed to scale-down actuation.
#[derive(Debug, Clone)]
pub(crate) struct Deletion {
    pub(crate) node: KubeNode,
    /// It has pods to move: drained before deletion (`deleteAsyncDrain`).
    pub(crate) drain: bool,
}

/// Everything background tasks share with the loop.
#[derive(Debug)]
pub(crate) struct Background {
    pub(crate) outbox: Outbox,
    pub(crate) instances: Arc<Mutex<InstancesCache>>,
    /// The node groups the last NodeGroups answer named; the periodic refresh lists these
    /// (the real one asks `NodeGroups()`, which the client answers from its cache).
    pub(crate) known_groups: Arc<Mutex<Vec<String>>>,
    /// `clusterStateRegistry.Start()` has run (the first refresh and the refresher).
    pub(crate) started: bool,
    /// Nodes waiting in the batcher per group (`NodeDeletionBatcher.deletionsPerNodeGroup`).
    batches: Arc<Mutex<HashMap<String, Vec<KubeNode>>>>,
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    stopped: AtomicBool,
}

impl Default for Background {
    fn default() -> Self {
        Self {
            outbox: Outbox::default(),
            instances: Arc::default(),
            known_groups: Arc::default(),
            started: false,
            batches: Arc::default(),
            tasks: Arc::default(),
            stopped: AtomicBool::new(false),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a deletion task needs from the autoscaler.
#[derive(Debug, Clone)]
struct Actuation {
    grpc: CloudProviderClient<Channel>,
    config: AutoscalerConfig,
    outbox: Outbox,
    batches: Arc<Mutex<HashMap<String, Vec<KubeNode>>>>,
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    /// The client's NodeGroupForNode cache, shared with the loop.
    group_for_node: GroupForNodeCache,
}

impl Actuation {
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle.abort_handle());
    }

    /// `Actuator.deleteNodesAsync` for one node group and kind: wait the delay after taint,
    /// then one `ScheduleDeletion` per node, each in its own task.
    async fn delete_nodes_async(self, group: String, nodes: Vec<Deletion>) {
        tokio::time::sleep(self.config.node_delete_delay_after_taint).await;
        for d in nodes {
            let this = self.clone();
            let group = group.clone();
            self.spawn(async move { this.schedule_deletion(group, d).await });
        }
    }

    /// `GroupDeletionScheduler.scheduleDeletion`: the group's options, the drain, the batcher.
    async fn schedule_deletion(self, group: String, d: Deletion) {
        let (finished, answer) = get_options_call(
            self.grpc.clone(),
            self.config.call_deadline,
            self.config.wire_generation(),
            &group,
            &self.config.node_group_defaults(),
        )
        .await;
        let options = GroupOptions::resolve(&self.config, answer);
        self.outbox.call(finished);
        match options {
            Ok(_) => {}
            Err(OptionsFailure::Rpc(e)) => {
                // `AbortNodeDeletionDueToError`: untainted, a failed deletion.
                let error = format!("NodeGroupGetOptions failed: {e}");
                self.outbox
                    .deletion(d.node.cache_key(), &group, &d.node.name, Err(error));
                return;
            }
            Err(OptionsFailure::Crash(why)) => {
                // The goroutine's panic ends the process: this deletion, like every other,
                // stops here (on restart, `cleanUpIfRequired` untaints the node).
                self.outbox.crash(why.clone());
                let error = format!("the autoscaler process crashed: {why}");
                self.outbox
                    .deletion(d.node.cache_key(), &group, &d.node.name, Err(error));
                return;
            }
        }
        if d.drain {
            // `prepareNodeForDeletion`: evict the pods and wait for them to go.
            tokio::time::sleep(self.config.drain_time).await;
        }
        self.add_to_batcher(group, d.node).await;
    }

    /// `NodeDeletionBatcher.AddNodes`.
    async fn add_to_batcher(self, group: String, node: KubeNode) {
        let interval = self.config.node_deletion_batcher_interval;
        if interval.is_zero() {
            self.delete_and_register(group, vec![node]).await;
            return;
        }
        let first = {
            let mut batches = lock(&self.batches);
            let list = batches.entry(group.clone()).or_default();
            list.push(node);
            list.len() == 1
        };
        if first {
            let this = self.clone();
            self.spawn(async move {
                tokio::time::sleep(interval).await;
                let nodes = lock(&this.batches).remove(&group).unwrap_or_default();
                if !nodes.is_empty() {
                    this.delete_and_register(group, nodes).await;
                }
            });
        }
    }

    /// `deleteNodesAndRegisterStatus` / `remove` with `deleteNodesFromCloudProvider`
    /// (`core/scaledown/actuation/delete_in_batch.go`): NodeGroupForNode for the first node
    /// (from the cache when the loop asked since the last Refresh), then one
    /// NodeGroupDeleteNodes for `nodes` on the group it named, and every node's deletion ends
    /// with the outcome. Up to 1.29 a failed or empty NodeGroupForNode answer crashes the
    /// process (nil node group); from 1.30 it fails the deletion.
    async fn delete_and_register(&self, group: String, nodes: Vec<KubeNode>) {
        let Some(first) = nodes.first() else {
            return;
        };
        let (answer, call) = node_group_for_node_cached(
            &self.grpc,
            self.config.call_deadline,
            &self.group_for_node,
            first,
        )
        .await;
        if let Some(call) = call {
            self.outbox.call(call);
        }
        let node_group = match answer {
            Ok(Some(g)) => Ok(g),
            Ok(None) => Err(format!(
                "NodeGroupForNode({}) answered no node group",
                first.name
            )),
            Err(e) => Err(format!("NodeGroupForNode({}) failed: {e}", first.name)),
        };
        let node_group = match node_group {
            Ok(g) => g,
            Err(why) if !self.config.deletion_checks_nil_node_group() => {
                let why = format!(
                    "cluster-autoscaler 1.{} deleting {}: {why}, and deleteNodesAndRegisterStatus \
                     uses the nil node group: nil pointer dereference",
                    self.config.release, first.name
                );
                self.outbox.crash(why.clone());
                let error = format!("the autoscaler process crashed: {why}");
                for n in &nodes {
                    self.outbox
                        .deletion(n.cache_key(), &group, &n.name, Err(error.clone()));
                }
                return;
            }
            Err(why) => {
                let error = format!("picked node that doesn't belong to a node group: {why}");
                for n in &nodes {
                    self.outbox
                        .deletion(n.cache_key(), &group, &n.name, Err(error.clone()));
                }
                return;
            }
        };
        let finished = delete_nodes_call(
            self.grpc.clone(),
            self.config.call_deadline,
            &node_group.id,
            &nodes,
        )
        .await;
        let result = match &finished.2.outcome {
            Ok(_) => Ok(()),
            Err(e) => Err(format!("NodeGroupDeleteNodes failed: {e}")),
        };
        self.outbox.call(finished);
        for n in &nodes {
            self.outbox
                .deletion(n.cache_key(), &group, &n.name, result.clone());
        }
    }
}

impl Background {
    /// Starts the deletion of `nodes` of `group` (already tainted by the caller), as
    /// `deleteAsyncEmpty` / `deleteAsyncDrain` start one goroutine per group and kind.
    pub(crate) fn start_deletion(
        &self,
        (grpc, group_for_node): (CloudProviderClient<Channel>, GroupForNodeCache),
        config: &AutoscalerConfig,
        group: &str,
        nodes: Vec<Deletion>,
    ) {
        let actuation = Actuation {
            grpc,
            config: config.clone(),
            outbox: self.outbox.clone(),
            batches: self.batches.clone(),
            tasks: self.tasks.clone(),
            group_for_node,
        };
        let (drained, empty): (Vec<Deletion>, Vec<Deletion>) =
            nodes.into_iter().partition(|d| d.drain);
        for bucket in [empty, drained] {
            if bucket.is_empty() {
                continue;
            }
            let a = actuation.clone();
            let group = group.to_owned();
            actuation.spawn(async move { a.delete_nodes_async(group, bucket).await });
        }
    }

    /// Starts the periodic refresh of the NodeGroupNodes cache: every `interval`, every known
    /// group listed again (`CloudProviderNodeInstancesCache.Start`, `wait.Until` with
    /// `CloudProviderNodeInstancesCacheRefreshInterval`). The first refresh is the caller's.
    pub(crate) fn start_refresher(
        &self,
        grpc: CloudProviderClient<Channel>,
        config: &AutoscalerConfig,
    ) {
        let instances = self.instances.clone();
        let groups = self.known_groups.clone();
        let outbox = self.outbox.clone();
        let interval = config.instances_cache_refresh_interval;
        let deadline = config.call_deadline;
        let handle = tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let ids = lock(&groups).clone();
                lock(&instances).retain_groups(&ids);
                for id in ids {
                    let finished = nodes_call(grpc.clone(), deadline, &id).await;
                    // `Refresh` stores whatever came, an empty list when the call failed.
                    let list = match &finished.2.outcome {
                        Ok(Reply::Instances(list)) => list.clone(),
                        _ => Vec::new(),
                    };
                    lock(&instances).insert(&id, list);
                    outbox.call(finished);
                }
            }
        });
        lock(&self.tasks).push(handle.abort_handle());
    }

    /// Stops every background task (the process exits).
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }

    /// [`Self::stop`] ran.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }
}

/// A duration helper for the engine: `since + d < now`, the comparisons upstream writes as
/// `since.Add(d).Before(now)`.
pub(crate) fn passed(since: Instant, d: Duration, now: Instant) -> bool {
    since + d < now
}
