//! Scale-up requests and backoff, as cluster state keeps them: requests completed or timed out
//! (reverted from 1.36), requests registered and updated, failed creations counted against a
//! group scaling up, and the exponential backoff of a group. Follows
//! `clusterstate/clusterstate.go` (`updateScaleRequests`, `registerOrUpdateScaleUpNoLock`,
//! `handleInstanceCreationErrorsForNodeGroup`, `IsNodeGroupScalingUp`) and
//! `utils/backoff/exponential_backoff.go` at cluster-autoscaler-1.33.0 and 1.35.0 (1.36.0
//! where it differs).

use std::collections::HashSet;

use tokio::time::Instant;

use super::cluster_state::is_create_error;
use super::{Backoff, CoreState, MockAutoscaler, ScaleUpRequest, Snapshot, to_u32};
use crate::autoscaler::timeline::{Decision, EventKind};

/// Error class the autoscaler records for a failed IncreaseSize and a scale-up timeout.
pub(super) const OTHER_ERROR_CLASS: i32 = 99;

impl MockAutoscaler {
    pub(super) fn back_off(
        &mut self,
        group: &str,
        error_class: i32,
        error_code: &str,
        message: String,
        now: Instant,
    ) {
        let duration = match self.state.backoffs.get(group) {
            Some(b) if b.last_failure + self.config.backoff_reset_timeout > now => {
                (b.duration * 2).min(self.config.max_backoff)
            }
            _ => self.config.initial_backoff,
        };
        self.state.backoffs.insert(
            group.to_owned(),
            Backoff {
                until: now + duration,
                duration,
                last_failure: now,
            },
        );
        self.rec.record(EventKind::Decided(Decision::BackOff {
            group: group.to_owned(),
            error_class,
            error_code: error_code.to_owned(),
            message,
            duration,
        }));
    }

    /// clusterstate's `updateScaleRequests`: a request whose group has no node left to come
    /// (`areThereUpcomingNodesInNodeGroup`: target ≤ registered − not started) is done; one
    /// past its expected add time has timed out: the group backs off (`timeout`); up to 1.35
    /// the failure asks for GetAvailableGPUTypes and the group's template (for metrics), from
    /// 1.36 the request's increase is given back with NodeGroupDecreaseTargetSize, whose
    /// error is only logged. Either way the request is dropped.
    pub(super) async fn update_scale_requests(&mut self, snap: &Snapshot) {
        let mut ids: Vec<String> = self.state.scale_ups.keys().cloned().collect();
        ids.sort();
        for id in ids {
            let Some(request) = self.state.scale_ups.get(&id).copied() else {
                continue;
            };
            let finished = snap
                .group(&id)
                .is_none_or(|view| view.target <= view.provisioned());
            if finished {
                self.state.scale_ups.remove(&id);
                self.rec
                    .record(EventKind::Decided(Decision::ScaleUpCompleted { group: id }));
                continue;
            }
            if request.expected_add_time >= snap.now {
                continue;
            }
            self.state.scale_ups.remove(&id);
            self.rec
                .record(EventKind::Decided(Decision::ScaleUpTimedOut {
                    group: id.clone(),
                    increase: request.increase,
                }));
            if self.config.failures_ask_for_template() {
                self.gpu_types().await;
                if !request.template_cached {
                    let _ = self.client.template_node_info(&id, &mut self.rec).await;
                }
            }
            let message = format!(
                "scale-up of {} node(s) did not complete in time",
                request.increase
            );
            self.back_off(&id, OTHER_ERROR_CLASS, "timeout", message, snap.now);
            if self.config.reverts_timed_out_scale_ups() && request.increase > 0 {
                let _ = self
                    .client
                    .decrease_target_size(&id, -request.increase, &mut self.rec)
                    .await;
            }
        }
    }

    /// `registerOrUpdateScaleUpNoLock`: the group's max provision time from
    /// NodeGroupGetOptions (an error leaves the request as it was), then a new request, or the
    /// existing one changed by `delta` (gone at 0; a positive delta moves its expected time).
    pub(super) async fn register_or_update_scale_up(
        &mut self,
        id: &str,
        delta: i32,
        now: Instant,
        template_cached: bool,
    ) {
        let Ok(options) = self.options(id).await else {
            return;
        };
        let expected_add_time = now + options.max_node_provision_time;
        match self.state.scale_ups.get_mut(id) {
            None if delta > 0 => {
                self.state.scale_ups.insert(
                    id.to_owned(),
                    ScaleUpRequest {
                        increase: delta,
                        expected_add_time,
                        template_cached,
                    },
                );
            }
            None => {}
            Some(r) if r.increase + delta <= 0 => {
                self.state.scale_ups.remove(id);
            }
            Some(r) => {
                r.increase += delta;
                if delta > 0 {
                    r.expected_add_time = expected_add_time;
                }
            }
        }
    }

    /// clusterstate's `handleInstanceCreationErrorsForNodeGroup`: instances Creating with an
    /// errorInfo not seen failed in the previous listing, by (code, class), count only while
    /// the group `IsNodeGroupScalingUp` (a scale-up request and nodes still to come): then the
    /// request shrinks by their number and the group backs off with their class and code. A
    /// group not scaling up (its request timed out or done, or an instance failed outside any
    /// scale-up) is not backed off.
    pub(super) async fn handle_creation_errors(&mut self, snap: &Snapshot) {
        let mut current = HashSet::new();
        for v in &snap.groups {
            let mut unseen: Vec<(String, i32, String, i32)> = Vec::new();
            for inst in v.instances.iter().filter(|i| is_create_error(i)) {
                current.insert(inst.id.clone());
                if self.state.known_create_errors.contains(&inst.id) {
                    continue;
                }
                let Some(info) = inst.status.as_ref().and_then(|s| s.error_info.as_ref()) else {
                    continue;
                };
                match unseen.iter_mut().find(|(code, class, ..)| {
                    *code == info.error_code && *class == info.instance_error_class
                }) {
                    Some(entry) => entry.3 += 1,
                    None => unseen.push((
                        info.error_code.clone(),
                        info.instance_error_class,
                        info.error_message.clone(),
                        1,
                    )),
                }
            }
            let id = &v.group.id;
            for (code, class, message, count) in unseen {
                let scaling_up =
                    self.state.scale_ups.contains_key(id) && v.target > v.provisioned();
                if !scaling_up {
                    self.rec
                        .record(EventKind::Decided(Decision::FailedCreationsNotCounted {
                            group: id.clone(),
                            error_code: code,
                            instances: to_u32(usize::try_from(count).unwrap_or(0)),
                        }));
                    continue;
                }
                if self.config.failures_ask_for_template() {
                    self.gpu_types().await;
                    let _ = self.client.template_node_info(id, &mut self.rec).await;
                }
                self.register_or_update_scale_up(id, -count, snap.now, false)
                    .await;
                self.back_off(id, class, &code, message, snap.now);
            }
        }
        self.state.known_create_errors = current;
    }
}

impl CoreState {
    pub(super) fn backed_off(&self, group: &str, now: Instant) -> bool {
        self.backoffs.get(group).is_some_and(|b| b.until > now)
    }

    /// `IsNodeGroupScalingUp` between two cluster-state updates: a scale-up request, and a
    /// target (as last updated or recalculated) above the provisioned nodes of the last update.
    pub(super) fn was_scaling_up(&self, group: &str) -> bool {
        self.scale_ups.contains_key(group)
            && self
                .last_sizes
                .get(group)
                .is_some_and(|(target, provisioned)| target > provisioned)
    }
}
