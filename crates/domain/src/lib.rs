//! The domain core: everything the provider decides, with no I/O.
//!
//! - [`cluster`]: a CKS cluster snapshot and the classification of its VMs into control, etcd,
//!   worker and external nodes.
//! - [`rules`]: the scaling rules CloudStack applies (Alert included), as one pure decision
//!   function the provider runs before it sends anything to CloudStack.
//! - [`status`]: how a worker VM and what the provider is doing to it map onto the autoscaler's
//!   instance status.
//! - [`nodeid`]: providerID parsing and node-to-VM matching.
//! - [`machine`]: the per-cluster scale state machine: phases, queued work, the events that
//!   move it and the effects the provider carries out. Every rule about a scale operation's
//!   life is there, with its table of tests.
//! - [`instances`]: what the autoscaler is told, derived from the machine: target size,
//!   instances and their status, node resolution, bounds, the debug line.
//! - [`registry`]: the VMs whose nodes the autoscalers reported as registered, and when: what
//!   keeps a registered VM from being deleted as "unregistered".
//! - [`binding`]: whether a caller bound to some clusters (`--nodes …@CLIENT`) is clearly an
//!   autoscaler running in another cluster, from the nodes it reports (a client certificate
//!   given to the wrong cluster's autoscaler).
//! - [`jobs`]: which of the account's scale jobs is a cluster's (adoption, lost answers).
//! - [`verdict`]: whether this CloudStack scales clusters in Alert, as learned from its
//!   refusals, and when that stops being believed.
//! - [`removal`]: what CloudStack can finish when it removes VMs (one drain per request) and
//!   how an accepted removal is retried until its VM is gone.
//! - [`stranded`]: a cluster CloudStack has stranded (Alert rules 5 and 7: VMs and nodes that
//!   differ, Alert with no worker down), the VMs involved and the operator's fix.
//! - [`freshness`]: whether a snapshot may still be answered from (Refresh, a scale RPC's
//!   fallback to the cached snapshot, the health check).
//! - [`keeper`]: keeping every snapshot fresh without waiting for an RPC: when a refresh round
//!   is due (backoff and jitter after failures, the rate limit's pace), how a Refresh is
//!   answered, and when the provider is stuck in itself.
//! - [`lease`]: leader election on a Kubernetes Lease: which replica may act, and the fence
//!   that stops a leader before another can take over.
//! - [`timing`]: the shell's waits and retries that belong to no machine (deadline margin,
//!   throttled work, the scale watch, the store's write retries, offerings, shutdown).
//!
//! Nothing here touches the network, the clock or a lock; callers pass in what they observed
//! and the time they observed it.
pub mod binding;
pub mod cluster;
pub mod freshness;
pub mod instances;
pub mod jobs;
pub mod keeper;
pub mod lease;
pub mod machine;
pub mod nodeid;
pub mod registry;
pub mod removal;
pub mod rules;
pub mod status;
pub mod stranded;
pub mod timing;
pub mod verdict;
