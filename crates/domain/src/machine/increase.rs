//! IncreaseSize: admitted on the cached state (refused past the group's maximum, or queued
//! behind the operation in flight), then started on a snapshot fresh from CloudStack; and the
//! placeholder ids of the nodes it asks for.

use super::error::ScaleError;
use super::{Hold, OpKind, Origin, Phase, ScaleMachine};
use crate::cluster::ClusterState;
use crate::rules::{AlertScaling, Refusal, ScaleRequest, check_scale};
use std::time::Instant;

/// The second step of a scale request, once a fresh snapshot is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Send this request (the phase is `Submitting`).
    Submit(ScaleRequest),
    /// Merged into the request sent when the operation in flight ends (what its caller's
    /// promise holds, for [`ScaleMachine::reply_ok`]).
    Queued(Hold),
}

/// The first step of IncreaseSize, on the cached state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Merged into the request sent when the operation in flight ends (what its caller's
    /// promise holds, for [`ScaleMachine::reply_ok`]).
    Queued(Hold),
    /// Nothing in flight: decide on a snapshot fresh from CloudStack
    /// ([`ScaleMachine::start_increase`]).
    NeedsFreshSnapshot,
}

impl ScaleMachine {
    pub(super) fn placeholder(&mut self) -> String {
        self.next_placeholder += 1;
        format!(
            "cks-placeholder://{}/{}",
            self.cluster_id.as_deref().unwrap_or("unknown"),
            self.next_placeholder
        )
    }

    /// IncreaseSize, first step on the cached state: refuses, queues behind the operation in
    /// flight, or asks for a fresh snapshot.
    pub fn admit_increase(
        &mut self,
        delta: u32,
        max: u32,
        alert: &AlertScaling,
    ) -> Result<Admission, ScaleError> {
        self.max_size = Some(max);
        let target = self.target().ok_or(ScaleError::NoSnapshot)?;
        check_max(target, delta, max)?;
        self.refuse_in_alert(alert)?;
        self.refuse_broken_size_scaling()?;
        self.refuse_external_scale_up()?;
        match &self.phase {
            Phase::Idle if !self.queue.remove.is_empty() => {
                Ok(Admission::Queued(self.enqueue(delta)))
            }
            Phase::Idle => Ok(Admission::NeedsFreshSnapshot),
            // Queued, never sent while the lost answer is unsettled: once a snapshot settles
            // it, the request is computed from what CloudStack then shows.
            Phase::Submitting { .. }
            | Phase::AnswerLost { .. }
            | Phase::Running { .. }
            | Phase::Adopted { .. } => Ok(Admission::Queued(self.enqueue(delta))),
        }
    }

    /// IncreaseSize, second step on a fresh snapshot: checks the maximum and CloudStack's rules
    /// and starts the submission (or queues, when an operation started meanwhile).
    pub fn start_increase(
        &mut self,
        delta: u32,
        max: u32,
        alert: &AlertScaling,
        now: Instant,
    ) -> Result<Started, ScaleError> {
        self.max_size = Some(max);
        let target = self.target().ok_or(ScaleError::NoSnapshot)?;
        check_max(target, delta, max)?;
        self.refuse_in_alert(alert)?;
        self.refuse_broken_size_scaling()?;
        self.refuse_external_scale_up()?;
        match &self.phase {
            Phase::Idle if self.queue.remove.is_empty() => {}
            _ => return Ok(Started::Queued(self.enqueue(delta))),
        }
        let snap = self.snap.clone().ok_or(ScaleError::NoSnapshot)?;
        let suspects = self.cordon_suspects();
        if !suspects.is_empty() {
            return Err(ScaleError::CordonSuspected { vms: suspects });
        }
        let from = snap.snap.size;
        if u64::from(from) + u64::from(delta) > u64::from(max) {
            return Err(ScaleError::SizeAboveMax {
                size: from,
                delta,
                max,
            });
        }
        let request = ScaleRequest::Resize {
            new_size: from.saturating_add(delta),
        };
        check_scale(&snap.snap, &request, alert).map_err(ScaleError::Refused)?;
        let placeholders = (0..delta).map(|_| self.placeholder()).collect();
        self.begin(
            OpKind::Increase {
                from,
                to: from.saturating_add(delta),
                vms_before: snap.snap.workers().map(|v| v.id.clone()).collect(),
                placeholders,
            },
            Origin::Rpc,
            now,
        );
        Ok(Started::Submit(request))
    }

    /// A cluster listed Alert on a CloudStack without Alert scaling refuses every request, so
    /// an increase queued now (behind a removal retry, say) would be answered OK and then
    /// reported as a failed creation once CloudStack refused it: it is refused before any
    /// promise instead (`recorded/alert_08_scale_err_alert_size_job_final`). The autoscaler
    /// asks again on a later loop, when the cluster may be Running again.
    fn refuse_in_alert(&self, alert: &AlertScaling) -> Result<(), ScaleError> {
        let Some(snap) = &self.snap else {
            return Ok(());
        };
        match alert {
            AlertScaling::Unsupported { cloudstack_error }
                if snap.snap.state == ClusterState::Alert =>
            {
                Err(ScaleError::Refused(Refusal::AlertUnsupported {
                    cluster: snap.snap.name.clone(),
                    cloudstack_error: cloudstack_error.clone(),
                }))
            }
            _ => Ok(()),
        }
    }

    /// Queues `delta` nodes; what their caller's promise holds.
    fn enqueue(&mut self, delta: u32) -> Hold {
        let placeholders: Vec<String> = (0..delta).map(|_| self.placeholder()).collect();
        self.queue.increase.extend(placeholders.iter().cloned());
        Hold::increase(placeholders)
    }
}

/// IncreaseSize may not take the target above the group's maximum.
fn check_max(target: u32, delta: u32, max: u32) -> Result<(), ScaleError> {
    if u64::from(target) + u64::from(delta) > u64::from(max) {
        return Err(ScaleError::OutOfRange { target, delta, max });
    }
    Ok(())
}
