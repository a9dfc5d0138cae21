//! The mock autoscaler's settings. Defaults are the real cluster-autoscaler's flag defaults;
//! tests and the demo shrink the timers with [`AutoscalerConfig::time_scaled`].

use std::time::Duration;

/// How scale-down groups the nodes it removes into `NodeGroupDeleteNodes` calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeleteBatching {
    /// One call per node group carrying every node removed from it in the loop (the real
    /// autoscaler's behaviour for empty nodes).
    #[default]
    PerGroup,
    /// One call per node (the real autoscaler's behaviour for drained nodes).
    PerNode,
}

/// Settings of a [`MockAutoscaler`](super::MockAutoscaler).
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscalerConfig {
    /// Deadline of every RPC (`grpc_timeout` in the autoscaler's cloud-config, default 5 s). It is
    /// sent as `grpc-timeout` and enforced on the client side; a late answer is a failure.
    pub call_deadline: Duration,
    /// Pause between loops in [`MockAutoscaler::run_loops`](super::MockAutoscaler::run_loops)
    /// and friends (`--scan-interval`, 10 s).
    pub loop_interval: Duration,
    /// How long a Ready node must stay unneeded before it is removed
    /// (`--scale-down-unneeded-time`, 10 min).
    pub scale_down_unneeded_time: Duration,
    /// How long a NotReady node must stay so before it is removed (`--scale-down-unready-time`,
    /// 20 min).
    pub scale_down_unready_time: Duration,
    /// How long an instance may stay without a node before it is deleted, and how long a size
    /// mismatch or a scale-up may last (`--max-node-provision-time`, 15 min).
    pub max_node_provision_time: Duration,
    /// How long a new NotReady node counts as starting rather than unready
    /// (`--max-node-startup-time`, 15 min).
    pub max_node_startup_time: Duration,
    /// First backoff of a node group after a failed scale-up (5 min).
    pub initial_backoff: Duration,
    /// Longest backoff; each failure while backed off doubles it up to this (30 min).
    pub max_backoff: Duration,
    /// A group with no failure for this long starts again from the initial backoff (3 h).
    pub backoff_reset_timeout: Duration,
    /// No scale-down for this long after a scale-up (`--scale-down-delay-after-add`, 10 min).
    pub scale_down_delay_after_add: Duration,
    /// No scale-down for this long after a failed deletion
    /// (`--scale-down-delay-after-failure`, 3 min).
    pub scale_down_delay_after_failure: Duration,
    /// The cluster is unhealthy (no autoscaling) when more than this percentage of nodes are
    /// unready… (`--max-total-unready-percentage`, 45).
    pub max_total_unready_percentage: f64,
    /// …and more than this many (`--ok-total-unready-count`, 3).
    pub ok_total_unready_count: usize,
    /// After a scale-up that never completed within the provision time, give the capacity
    /// back with `NodeGroupDecreaseTargetSize` (the current autoscaler does).
    pub revert_timed_out_scale_ups: bool,
    /// How scale-down deletions are grouped into calls.
    pub delete_batching: DeleteBatching,
    /// Issue the scale-down `NodeGroupDeleteNodes` calls of a loop concurrently, as the real
    /// autoscaler does from goroutines. The loop still waits for all of them before it ends.
    pub parallel_deletes: bool,
}

impl Default for AutoscalerConfig {
    fn default() -> Self {
        const MIN: u64 = 60;
        Self {
            call_deadline: Duration::from_secs(5),
            loop_interval: Duration::from_secs(10),
            scale_down_unneeded_time: Duration::from_secs(10 * MIN),
            scale_down_unready_time: Duration::from_secs(20 * MIN),
            max_node_provision_time: Duration::from_secs(15 * MIN),
            max_node_startup_time: Duration::from_secs(15 * MIN),
            initial_backoff: Duration::from_secs(5 * MIN),
            max_backoff: Duration::from_secs(30 * MIN),
            backoff_reset_timeout: Duration::from_secs(180 * MIN),
            scale_down_delay_after_add: Duration::from_secs(10 * MIN),
            scale_down_delay_after_failure: Duration::from_secs(3 * MIN),
            max_total_unready_percentage: 45.0,
            ok_total_unready_count: 3,
            revert_timed_out_scale_ups: true,
            delete_batching: DeleteBatching::PerGroup,
            parallel_deletes: false,
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
            scale_down_delay_after_failure: base.scale_down_delay_after_failure / d,
            ..base
        }
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
    }

    #[test]
    fn time_scaling_keeps_the_call_deadline() {
        let c = AutoscalerConfig::time_scaled(600);
        assert_eq!(c.call_deadline, Duration::from_secs(5));
        assert_eq!(c.max_node_provision_time, Duration::from_millis(1500));
        assert_eq!(c.initial_backoff, Duration::from_millis(500));
    }
}
