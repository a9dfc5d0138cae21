//! Which VMs have a registered Kubernetes node, as the autoscalers report them: a real node
//! named in NodeGroupForNode (by any client, whatever its providerID) is its VM's proof of
//! registration, kept with the time it was last seen.
//!
//! The autoscaler deletes an instance it matched to no node as "unregistered" once it has
//! been so for its max-node-provision-time (`static_autoscaler.go`,
//! `removeOldUnregisteredNodes`: `UnregisteredSince + MaxNodeProvisionTime` before now). A
//! node reported within that time existed when that deletion's clock started, so a fake
//! "unregistered" node for its VM is a mistake: the autoscaler that sends it does not see the
//! node (another cluster's autoscaler, a providerID mismatch). `ScaleMachine::accept_removal`
//! refuses it ([`super::machine::ScaleError::RecentlyRegistered`]). Once the node has not been
//! reported for that long, the deletion is the autoscaler's to make.
//!
//! No clock is read: callers pass the time they observed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The last report of a VM's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The node's name.
    pub node: String,
    /// The node's providerID as reported (possibly empty).
    pub provider_id: String,
    /// When it was last reported.
    pub seen: Instant,
}

/// Registered nodes by VM id, forgotten once older than `window`.
#[derive(Debug, Clone)]
pub struct Registrations {
    by_vm: HashMap<String, Registration>,
    /// How long a report protects its VM: the autoscaler's max-node-provision-time.
    window: Duration,
    /// The number of entries after the last pruning: the map is pruned again when it doubles,
    /// so its size stays within twice the VMs reported in the last `window`.
    pruned_len: usize,
}

impl Registrations {
    /// No registrations; each report protects its VM for `window`.
    pub fn new(window: Duration) -> Self {
        Registrations {
            by_vm: HashMap::new(),
            window,
            pruned_len: 0,
        }
    }

    /// How long a report protects its VM.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Records that `node` (with `provider_id`) was reported for VM `vm_id` at `now`.
    pub fn record(&mut self, vm_id: &str, node: &str, provider_id: &str, now: Instant) {
        if let Some(r) = self.by_vm.get_mut(vm_id) {
            if r.node != node {
                r.node = node.to_string();
            }
            if r.provider_id != provider_id {
                r.provider_id = provider_id.to_string();
            }
            r.seen = r.seen.max(now);
            return;
        }
        self.by_vm.insert(
            vm_id.to_string(),
            Registration {
                node: node.to_string(),
                provider_id: provider_id.to_string(),
                seen: now,
            },
        );
        if self.by_vm.len() > 2 * self.pruned_len + 16 {
            let window = self.window;
            self.by_vm
                .retain(|_, r| now.saturating_duration_since(r.seen) < window);
            self.pruned_len = self.by_vm.len();
        }
    }

    /// The report of `vm_id`'s node if it is less than `window` old at `now`.
    pub fn recent(&self, vm_id: &str, now: Instant) -> Option<&Registration> {
        self.by_vm
            .get(vm_id)
            .filter(|r| now.saturating_duration_since(r.seen) < self.window)
    }

    /// How many VMs are remembered (some possibly expired, not pruned yet).
    pub fn len(&self) -> usize {
        self.by_vm.len()
    }

    /// Whether no VM is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_vm.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(25 * 60);

    #[test]
    fn a_report_protects_its_vm_for_the_window_from_its_last_sighting() {
        let t0 = Instant::now();
        let mut r = Registrations::new(WINDOW);
        assert!(r.recent("vm-1", t0).is_none());
        r.record("vm-1", "node-1", "external-cloudstack://vm-1", t0);
        let seen = r.recent("vm-1", t0 + WINDOW - Duration::from_secs(1));
        assert_eq!(seen.map(|s| s.node.as_str()), Some("node-1"));
        assert!(
            r.recent("vm-1", t0 + WINDOW).is_none(),
            "expires after the window"
        );
        assert!(
            r.recent("vm-2", t0).is_none(),
            "another VM is not protected"
        );
        // Seen again: the window starts over; an older report does not move it back.
        r.record("vm-1", "node-1b", "", t0 + WINDOW);
        r.record("vm-1", "node-1b", "", t0);
        let again = r.recent("vm-1", t0 + 2 * WINDOW - Duration::from_secs(1));
        assert_eq!(
            again.map(|s| (s.node.as_str(), s.provider_id.as_str())),
            Some(("node-1b", ""))
        );
    }

    #[test]
    fn expired_reports_are_pruned_as_the_map_grows() {
        let t0 = Instant::now();
        let mut r = Registrations::new(WINDOW);
        for i in 0..100 {
            r.record(&format!("old-{i}"), "n", "", t0);
        }
        let later = t0 + WINDOW;
        for i in 0..100 {
            r.record(&format!("new-{i}"), "n", "", later);
        }
        assert!(r.len() < 150, "expired entries pruned: {}", r.len());
        assert!((0..100).all(|i| r.recent(&format!("new-{i}"), later).is_some()));
    }
}
