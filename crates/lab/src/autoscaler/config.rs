//! The mock autoscaler's settings. Defaults are the real cluster-autoscaler's flag defaults
//! (`config/flags/flags.go` at cluster-autoscaler-1.33.0 and 1.35.0) or, where there is no
//! flag, its constants; tests and the demo shrink the timers with
//! [`AutoscalerConfig::time_scaled`].

use std::time::Duration;

use super::wire::{NodeGroupOptions, WireGeneration};

/// The flag defaults of `--scale-down-utilization-threshold` and
/// `--scale-down-gpu-utilization-threshold` (0.5 both), which the client sends in NodeGroupGetOptions'
/// `defaults`; the mock does not model utilization otherwise.
const UTILIZATION_THRESHOLD: f64 = 0.5;

/// The newest cluster-autoscaler minor release whose core this mock follows by default.
pub const NEWEST_RELEASE: u32 = 36;

/// Settings of a [`MockAutoscaler`](super::MockAutoscaler).
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscalerConfig {
    /// Deadline of every RPC (`grpc_timeout` in the autoscaler's cloud-config, default 5 s). It is
    /// sent as `grpc-timeout` and enforced on the client side; a late answer is a failure.
    pub call_deadline: Duration,
    /// Pause between loops in [`MockAutoscaler::run_loops`](super::MockAutoscaler::run_loops)
    /// and friends (`--scan-interval`, 10 s).
    pub loop_interval: Duration,
    /// The cluster-autoscaler minor release (1.x) imitated where releases differ, 36 by
    /// default. From 35 the readiness pass asks NodeGroupGetOptions for every autoscaled node
    /// (its max node startup time); from 36 a timed-out scale-up is reverted with
    /// NodeGroupDecreaseTargetSize and failure paths no longer ask for the node template.
    /// It also chooses the wire generation, unless [`Self::wire`] does.
    pub release: u32,
    /// The externalgrpc message shapes the client speaks (which fields of
    /// NodeGroupGetOptions it sends and reads, which field of NodeGroupTemplateNodeInfo it
    /// reads). `None`, the default: those of [`Self::release`]'s first patch
    /// ([`Self::wire_generation`]). Set it for what a minor number cannot name (1.34.2 and
    /// later 1.34 patches: [`WireGeneration::V1_34_2`]).
    pub wire: Option<WireGeneration>,
    /// How long a Ready node must stay unneeded before it is removed
    /// (`--scale-down-unneeded-time`, 10 min; NodeGroupGetOptions may override it per group).
    pub scale_down_unneeded_time: Duration,
    /// How long a NotReady node must stay so before it is removed (`--scale-down-unready-time`,
    /// 20 min; per group through NodeGroupGetOptions).
    pub scale_down_unready_time: Duration,
    /// How long an instance may stay without a node before it is deleted, and how long a size
    /// mismatch or a scale-up may last (`--max-node-provision-time`, 15 min; per group through
    /// NodeGroupGetOptions).
    pub max_node_provision_time: Duration,
    /// How long a new NotReady node counts as starting rather than unready
    /// (`--max-node-startup-time`, 15 min; a constant before 1.35). From 1.35 an answered
    /// NodeGroupGetOptions makes it 0 for that group (the protocol has no field for it).
    pub max_node_startup_time: Duration,
    /// First backoff of a node group after a failed scale-up (5 min).
    pub initial_backoff: Duration,
    /// Longest backoff; each failure while backed off doubles it up to this (30 min).
    pub max_backoff: Duration,
    /// A group with no failure for this long starts again from the initial backoff (3 h).
    pub backoff_reset_timeout: Duration,
    /// No scale-down for this long after a scale-up (`--scale-down-delay-after-add`, 10 min).
    pub scale_down_delay_after_add: Duration,
    /// No scale-down for this long after scale-down started deleting nodes
    /// (`--scale-down-delay-after-delete`, 0).
    pub scale_down_delay_after_delete: Duration,
    /// No scale-down for this long after a failed scale-down
    /// (`--scale-down-delay-after-failure`, 3 min). With the global delays (the default) only a
    /// failure of the loop's own deletion start counts, which this mock never has; a failed
    /// NodeGroupDeleteNodes counts only with [`Self::scale_down_delay_type_local`].
    pub scale_down_delay_after_failure: Duration,
    /// Apply the three scale-down delays per node group instead of globally
    /// (`--scale-down-delay-type-local`, false): then a failed NodeGroupDeleteNodes keeps that
    /// group's nodes from scale-down for [`Self::scale_down_delay_after_failure`].
    pub scale_down_delay_type_local: bool,
    /// Nodes scale-down may be deleting at once, empty and drained
    /// (`--max-scale-down-parallelism`, 10).
    pub max_scale_down_parallelism: usize,
    /// Nodes needing a drain scale-down may be deleting at once (`--max-drain-parallelism`, 1).
    pub max_drain_parallelism: usize,
    /// How long scale-down waits after tainting its nodes before deleting them
    /// (`--node-delete-delay-after-taint`, 5 s).
    pub node_delete_delay_after_taint: Duration,
    /// How long scale-down gathers the nodes of a group into one NodeGroupDeleteNodes call
    /// (`--node-deletion-batcher-interval`, 0: one call per node, sent at once).
    pub node_deletion_batcher_interval: Duration,
    /// How long draining a node with pods to move takes in this mock (the real autoscaler
    /// evicts them and waits for them to terminate; no flag, 0 by default).
    pub drain_time: Duration,
    /// A node tainted for deletion counts as being deleted for this long; after it, a node
    /// still there is a scale-down candidate again (`MaxCloudProviderNodeDeletionTime`, 5 min).
    pub max_cloud_provider_node_deletion_time: Duration,
    /// Refresh period of the NodeGroupNodes cache (`CloudProviderNodeInstancesCacheRefreshInterval`,
    /// 2 min).
    pub instances_cache_refresh_interval: Duration,
    /// Write the status configmap (`--write-status-configmap`, true). Only then does
    /// [`MockAutoscaler::exit`](super::MockAutoscaler::exit) call `Cleanup`.
    pub write_status_configmap: bool,
    /// The cluster is unhealthy (no autoscaling) when more than this percentage of nodes are
    /// unready… (`--max-total-unready-percentage`, 45).
    pub max_total_unready_percentage: f64,
    /// …and more than this many (`--ok-total-unready-count`, 3).
    pub ok_total_unready_count: usize,
}

impl Default for AutoscalerConfig {
    fn default() -> Self {
        const MIN: u64 = 60;
        Self {
            call_deadline: Duration::from_secs(5),
            loop_interval: Duration::from_secs(10),
            release: NEWEST_RELEASE,
            wire: None,
            scale_down_unneeded_time: Duration::from_secs(10 * MIN),
            scale_down_unready_time: Duration::from_secs(20 * MIN),
            max_node_provision_time: Duration::from_secs(15 * MIN),
            max_node_startup_time: Duration::from_secs(15 * MIN),
            initial_backoff: Duration::from_secs(5 * MIN),
            max_backoff: Duration::from_secs(30 * MIN),
            backoff_reset_timeout: Duration::from_secs(180 * MIN),
            scale_down_delay_after_add: Duration::from_secs(10 * MIN),
            scale_down_delay_after_delete: Duration::ZERO,
            scale_down_delay_after_failure: Duration::from_secs(3 * MIN),
            scale_down_delay_type_local: false,
            max_scale_down_parallelism: 10,
            max_drain_parallelism: 1,
            node_delete_delay_after_taint: Duration::from_secs(5),
            node_deletion_batcher_interval: Duration::ZERO,
            drain_time: Duration::ZERO,
            max_cloud_provider_node_deletion_time: Duration::from_secs(5 * MIN),
            instances_cache_refresh_interval: Duration::from_secs(2 * MIN),
            write_status_configmap: true,
            max_total_unready_percentage: 45.0,
            ok_total_unready_count: 3,
        }
    }
}

impl AutoscalerConfig {
    /// The defaults with every autoscaler timer divided by `divisor`, keeping the call deadline
    /// (it is about the provider's latency, not the autoscaler's pace). `time_scaled(600)` makes
    /// 15 min last 1.5 s and the 10 s loop interval about 17 ms.
    pub fn time_scaled(divisor: u32) -> Self {
        let d = divisor.max(1);
        let base = Self::default();
        Self {
            loop_interval: base.loop_interval / d,
            scale_down_unneeded_time: base.scale_down_unneeded_time / d,
            scale_down_unready_time: base.scale_down_unready_time / d,
            max_node_provision_time: base.max_node_provision_time / d,
            max_node_startup_time: base.max_node_startup_time / d,
            initial_backoff: base.initial_backoff / d,
            max_backoff: base.max_backoff / d,
            backoff_reset_timeout: base.backoff_reset_timeout / d,
            scale_down_delay_after_add: base.scale_down_delay_after_add / d,
            scale_down_delay_after_delete: base.scale_down_delay_after_delete / d,
            scale_down_delay_after_failure: base.scale_down_delay_after_failure / d,
            node_delete_delay_after_taint: base.node_delete_delay_after_taint / d,
            node_deletion_batcher_interval: base.node_deletion_batcher_interval / d,
            drain_time: base.drain_time / d,
            max_cloud_provider_node_deletion_time: base.max_cloud_provider_node_deletion_time / d,
            instances_cache_refresh_interval: base.instances_cache_refresh_interval / d,
            ..base
        }
    }

    /// The wire generation spoken: [`Self::wire`] if set, else that of release
    /// 1.[`Self::release`].0 ([`WireGeneration::of_minor`]; releases before 1.28 are not
    /// modelled and speak 1.28's).
    pub fn wire_generation(&self) -> WireGeneration {
        self.wire
            .unwrap_or_else(|| WireGeneration::of_minor(self.release))
    }

    /// The autoscaler's own per-group options, sent as NodeGroupGetOptions' `defaults` and
    /// applied when the provider gives none (`--scale-down-*`, `--max-node-provision-time`;
    /// `zeroOrMaxNodeScaling` and `ignoreDaemonSetsUtilization` at their false defaults).
    pub(crate) fn node_group_defaults(&self) -> NodeGroupOptions {
        NodeGroupOptions {
            scale_down_utilization_threshold: UTILIZATION_THRESHOLD,
            scale_down_gpu_utilization_threshold: UTILIZATION_THRESHOLD,
            scale_down_unneeded_time: self.scale_down_unneeded_time,
            scale_down_unready_time: self.scale_down_unready_time,
            max_node_provision_time: self.max_node_provision_time,
            zero_or_max_node_scaling: false,
            ignore_daemonsets_utilization: false,
        }
    }

    /// From 1.35 the readiness pass takes each autoscaled node's startup time from
    /// NodeGroupGetOptions (`clusterstate.go` `updateReadinessStats`).
    pub(crate) fn startup_time_from_options(&self) -> bool {
        self.release >= 35
    }

    /// From 1.30 a scale-down deletion whose NodeGroupForNode fails or answers "" fails;
    /// up to 1.29 the process dereferences the nil node group
    /// (`core/scaledown/actuation/delete_in_batch.go` `deleteNodesFromCloudProvider`; the
    /// check came with commit 476b52442b, first tagged cluster-autoscaler-1.30.0).
    pub(crate) fn deletion_checks_nil_node_group(&self) -> bool {
        self.release >= 30
    }

    /// From 1.36 `GetUpcomingNodes` counts a group's upcoming nodes only while it has a
    /// scale-up request and no backoff (`clusterstate.go`, commit 251652c2ee, first tagged
    /// cluster-autoscaler-1.36.0); before, whatever the target leaves.
    pub(crate) fn upcoming_needs_scale_up_request(&self) -> bool {
        self.release >= 36
    }

    /// From 1.36 a timed-out scale-up is reverted (`clusterstate.go` `updateScaleRequests`).
    pub(crate) fn reverts_timed_out_scale_ups(&self) -> bool {
        self.release >= 36
    }

    /// Up to 1.35 a failed scale-up (timeout, creation errors) asks the group for its node
    /// template for metrics (`clusterstate.go` `updateScaleRequests`,
    /// `handleInstanceCreationErrorsForNodeGroup`); 1.36 takes it from its own registry.
    pub(crate) fn failures_ask_for_template(&self) -> bool {
        self.release <= 35
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_autoscaler_flag_defaults() {
        let c = AutoscalerConfig::default();
        assert_eq!(c.call_deadline, Duration::from_secs(5));
        assert_eq!(c.initial_backoff, Duration::from_secs(300));
        assert_eq!(c.max_backoff, Duration::from_secs(1800));
        assert_eq!(c.max_node_provision_time, Duration::from_secs(900));
        assert_eq!(c.node_deletion_batcher_interval, Duration::ZERO);
        assert_eq!(c.node_delete_delay_after_taint, Duration::from_secs(5));
        assert_eq!(
            (c.max_scale_down_parallelism, c.max_drain_parallelism),
            (10, 1)
        );
        assert!(!c.scale_down_delay_type_local);
        assert!(c.write_status_configmap);
        assert_eq!(c.instances_cache_refresh_interval, Duration::from_secs(120));
    }

    #[test]
    fn time_scaling_keeps_the_call_deadline() {
        let c = AutoscalerConfig::time_scaled(600);
        assert_eq!(c.call_deadline, Duration::from_secs(5));
        assert_eq!(c.max_node_provision_time, Duration::from_millis(1500));
        assert_eq!(c.initial_backoff, Duration::from_millis(500));
        assert_eq!(
            c.instances_cache_refresh_interval,
            Duration::from_millis(200)
        );
    }

    #[test]
    fn release_differences() {
        let mut c = AutoscalerConfig::default();
        assert!(c.reverts_timed_out_scale_ups() && c.startup_time_from_options());
        assert!(!c.failures_ask_for_template());
        c.release = 35;
        assert!(!c.reverts_timed_out_scale_ups() && c.startup_time_from_options());
        assert!(c.failures_ask_for_template());
        c.release = 33;
        assert!(!c.startup_time_from_options());
    }

    #[test]
    fn the_release_chooses_the_wire_generation_unless_overridden() {
        let mut c = AutoscalerConfig::default();
        assert_eq!(c.wire_generation(), WireGeneration::V1_35);
        for (release, want) in [
            (27, WireGeneration::V1_28),
            (28, WireGeneration::V1_28),
            (29, WireGeneration::V1_29),
            (32, WireGeneration::V1_29),
            (33, WireGeneration::V1_33),
            (34, WireGeneration::V1_33),
            (35, WireGeneration::V1_35),
            (36, WireGeneration::V1_35),
        ] {
            c.release = release;
            assert_eq!(c.wire_generation(), want, "1.{release}");
        }
        c.release = 34;
        c.wire = Some(WireGeneration::V1_34_2);
        assert_eq!(c.wire_generation(), WireGeneration::V1_34_2);
    }
}
