//! Whether a caller bound to some clusters (`--nodes …@CLIENT`) is clearly an autoscaler
//! running in another cluster: a client certificate of cluster B given by mistake to the
//! autoscaler of cluster A, from the same CA. That autoscaler sees B's group, takes B's
//! workers for instances without a node, scales B for A's pending pods and deletes B's VMs as
//! "unregistered". What gives it away is the nodes it asks NodeGroupForNode about: the
//! autoscaler asks about every node of its own cluster, every loop (upstream caches only a
//! non-empty answer, until the next Refresh), before it scales anything in that loop.
//!
//! **The rule** ([`Sightings::runs_in`]): within the last `window`, the caller reported real
//! nodes of at least [`FOREIGN_VMS_NEEDED`] distinct VMs listed in one cluster it is not bound
//! to, and no node of a VM listed in any cluster it is bound to. Then it runs in that cluster.
//! What counts:
//!
//! - A VM *listed* in a cluster, control and etcd VMs included: an autoscaler asks about its
//!   control-plane nodes too, and they answer "no group" without being any less its cluster's.
//! - Only real nodes. A fake node (the autoscaler's own, for an instance without a node:
//!   `k8s.io/cluster-autoscaler/fake-node-reason`, name = providerID = instance id) is built
//!   from what the provider listed for the caller's group, so it says nothing of where the
//!   caller runs: the autoscaler in the wrong cluster sends one for each of B's VMs.
//! - Nothing for a node of no configured cluster (a VM of a cluster this provider does not
//!   serve, a node outside CloudStack): it is neither.
//!
//! **Why it cannot trip a right autoscaler.** A VM is listed in one cluster only, and a
//! cluster's nodes are its VMs: the autoscaler of B reports B's control node in its first loop
//! and never a VM of A. An identity bound to several clusters counts each of them as its own.
//! With one cluster served, or every cluster bound to the caller, there is no other cluster to
//! be seen in, and nothing is ever judged. One stray VM of another cluster (a VM joined to the
//! wrong Kubernetes cluster by hand) is below the threshold; two are the least any CKS
//! cluster has (a control VM and a worker), so any wrong autoscaler is judged in its first
//! loop. An identity whose reports show both its own cluster and another (the same
//! certificate used by the autoscalers of both) is not judged: which of its calls come from
//! where cannot be told. That is said once instead ([`Sightings::settle_shared`]).
//!
//! **When it clears.** The judgment is redone from the sightings at every question: it ends
//! as soon as the caller reports a node of its own cluster, or once its last report of the
//! other cluster's is `window` old (the autoscaler was given its own certificate and now
//! calls under another identity, or stopped). While the wrong autoscaler runs it asks about
//! its nodes every loop, so the judgment lasts.
//!
//! No clock is read: callers pass the time they observed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a caller's report of a node counts: many autoscaler loops (each asks about every
/// node of its cluster, every 10 s by default), so the judgment of a wrong autoscaler never
/// lapses while it runs, and it ends this long after that autoscaler stopped calling under the
/// identity (it was given its own certificate).
pub const SIGHTING_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Distinct VMs of one other cluster a caller must have reported (with none of its own) to
/// be judged to run there: the fewest VMs a CKS cluster has (one control VM, one worker).
pub const FOREIGN_VMS_NEEDED: usize = 2;

/// What one caller's NodeGroupForNode reports showed, by cluster. `K` names a cluster
/// (the provider's group index).
#[derive(Debug, Clone)]
pub struct Sightings<K> {
    /// How long a report counts.
    window: Duration,
    /// The last report of a node of a cluster the caller is bound to.
    own: Option<Instant>,
    /// For each other cluster, its most recently reported distinct VMs (at most
    /// [`FOREIGN_VMS_NEEDED`], the most recent first): enough to count to the threshold, so a
    /// wrong autoscaler of a 10,000-node cluster costs two entries.
    foreign: BTreeMap<K, Vec<(String, Instant)>>,
    /// The judgment as last settled ([`Sightings::settle`]), to say when it changes.
    judged: Option<K>,
    /// The other cluster its reports showed beside its own, as last settled
    /// ([`Sightings::settle_shared`]).
    shared: Option<K>,
}

/// A change of the judgment, as [`Sightings::settle`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change<K> {
    /// The cluster the caller was judged to run in before (`None`: not judged).
    pub before: Option<K>,
    /// The cluster it is judged to run in now (`None`: not judged).
    pub after: Option<K>,
}

impl<K: Ord + Clone> Sightings<K> {
    /// No sightings; each report counts for `window`.
    pub fn new(window: Duration) -> Self {
        Sightings {
            window,
            own: None,
            foreign: BTreeMap::new(),
            judged: None,
            shared: None,
        }
    }

    /// The caller reported, at `at`, a real node of a VM listed in a cluster it is bound to.
    pub fn own_node(&mut self, at: Instant) {
        self.own = Some(self.own.map_or(at, |o| o.max(at)));
    }

    /// The caller reported, at `at`, a real node of VM `vm` listed in `cluster`, a cluster it
    /// is not bound to.
    pub fn foreign_node(&mut self, cluster: K, vm: &str, at: Instant) {
        let seen = self.foreign.entry(cluster).or_default();
        match seen.iter().position(|(v, _)| v == vm) {
            Some(i) => {
                let (_, when) = &mut seen[i];
                *when = (*when).max(at);
            }
            None => seen.push((vm.to_string(), at)),
        }
        seen.sort_by_key(|(_, at)| std::cmp::Reverse(*at));
        seen.truncate(FOREIGN_VMS_NEEDED);
    }

    fn recent(&self, at: Instant, now: Instant) -> bool {
        now.saturating_duration_since(at) < self.window
    }

    /// The cluster the caller runs in, when that is clear at `now` (see the module's rule):
    /// of the other clusters with at least [`FOREIGN_VMS_NEEDED`] VMs reported within the
    /// window, the first by key; `None` when it reported a node of its own within the window.
    pub fn runs_in(&self, now: Instant) -> Option<&K> {
        if self.own_seen(now) {
            return None;
        }
        self.foreign_seen(now)
    }

    /// Whether the caller reported a node of its own within the window.
    fn own_seen(&self, now: Instant) -> bool {
        self.own.is_some_and(|o| self.recent(o, now))
    }

    /// The first other cluster (by key) with at least [`FOREIGN_VMS_NEEDED`] VMs reported
    /// within the window.
    fn foreign_seen(&self, now: Instant) -> Option<&K> {
        self.foreign.iter().find_map(|(cluster, seen)| {
            let recent = seen.iter().filter(|(_, at)| self.recent(*at, now)).count();
            (recent >= FOREIGN_VMS_NEEDED).then_some(cluster)
        })
    }

    /// Redoes the judgment at `now` and keeps it; returns the change, if it changed since it
    /// was last settled, so that the caller says it once.
    pub fn settle(&mut self, now: Instant) -> Option<Change<K>> {
        let after = self.runs_in(now).cloned();
        if after == self.judged {
            return None;
        }
        let before = std::mem::replace(&mut self.judged, after.clone());
        Some(Change { before, after })
    }

    /// The other cluster whose nodes the caller reported, [`FOREIGN_VMS_NEEDED`] VMs or more
    /// within the window, beside nodes of its own: not a judgment (which calls come from
    /// where cannot be told), but the mark of one certificate used by the autoscalers of both
    /// clusters, whose writes for the wrong one cannot be refused.
    pub fn shared_with(&self, now: Instant) -> Option<&K> {
        if !self.own_seen(now) {
            return None;
        }
        self.foreign_seen(now)
    }

    /// [`Sightings::shared_with`] at `now`, kept; returns the cluster when it was not seen
    /// shared at the last settling, so that the caller says it once.
    pub fn settle_shared(&mut self, now: Instant) -> Option<K> {
        let now_shared = self.shared_with(now).cloned();
        let before = std::mem::replace(&mut self.shared, now_shared.clone());
        match (before, now_shared) {
            (None, Some(k)) => Some(k),
            _ => None,
        }
    }

    /// The judgment as last settled.
    pub fn judged(&self) -> Option<&K> {
        self.judged.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = SIGHTING_WINDOW;
    const A: &str = "alpha";
    const C: &str = "gamma";

    fn t(secs: u64) -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now) + Duration::from_secs(secs)
    }

    #[test]
    fn two_vms_of_another_cluster_and_none_of_its_own_is_clear() {
        let mut s = Sightings::new(WINDOW);
        assert_eq!(s.settle(t(0)), None, "nothing reported: nothing judged");
        s.foreign_node(A, "a-control", t(0));
        assert_eq!(s.runs_in(t(0)), None, "one VM is below the threshold");
        // The same VM again (the next loop, or by name and then by providerID) is still one.
        s.foreign_node(A, "a-control", t(10));
        assert_eq!(s.runs_in(t(10)), None);
        s.foreign_node(A, "a-node-1", t(10));
        assert_eq!(s.runs_in(t(10)), Some(&A));
        assert_eq!(
            s.settle(t(10)),
            Some(Change {
                before: None,
                after: Some(A)
            })
        );
        assert_eq!(s.settle(t(11)), None, "said once");
        assert_eq!(s.judged(), Some(&A));
    }

    #[test]
    fn reports_of_its_own_cluster_and_another_are_said_once_and_judge_nothing() {
        let mut s = Sightings::new(WINDOW);
        s.own_node(t(0));
        s.foreign_node(A, "a-1", t(1));
        assert_eq!(s.settle_shared(t(1)), None, "one VM is below the threshold");
        s.foreign_node(A, "a-2", t(2));
        assert_eq!(s.settle_shared(t(2)), Some(A));
        assert_eq!(s.settle_shared(t(3)), None, "said once");
        assert_eq!(s.runs_in(t(3)), None, "not a judgment");
        // Its own nodes no longer reported: the other cluster's alone judge it instead.
        s.foreign_node(A, "a-1", t(700));
        s.foreign_node(A, "a-2", t(700));
        assert_eq!(s.settle_shared(t(700)), None);
        assert_eq!(s.runs_in(t(700)), Some(&A));
    }

    #[test]
    fn one_vm_each_of_two_other_clusters_is_not_clear() {
        let mut s = Sightings::new(WINDOW);
        s.foreign_node(A, "a-1", t(0));
        s.foreign_node(C, "c-1", t(0));
        assert_eq!(s.runs_in(t(0)), None);
        // Two each: the first cluster by key.
        s.foreign_node(C, "c-2", t(1));
        assert_eq!(s.runs_in(t(1)), Some(&C));
        s.foreign_node(A, "a-2", t(2));
        assert_eq!(s.runs_in(t(2)), Some(&A));
    }

    #[test]
    fn a_node_of_its_own_cluster_within_the_window_clears_it() {
        // The right autoscaler: its own control node first, then (a VM joined to its
        // Kubernetes cluster by mistake, twice over) another cluster's.
        let mut s = Sightings::new(WINDOW);
        s.own_node(t(0));
        s.foreign_node(A, "a-1", t(1));
        s.foreign_node(A, "a-2", t(2));
        assert_eq!(s.runs_in(t(2)), None, "mixed reports are not clear");
        assert_eq!(s.settle(t(2)), None);

        // A wrong autoscaler judged, then the same identity reports a node of its own
        // cluster: cleared at once.
        let mut s = Sightings::new(WINDOW);
        s.foreign_node(A, "a-1", t(0));
        s.foreign_node(A, "a-2", t(0));
        assert!(s.settle(t(0)).is_some());
        s.own_node(t(5));
        assert_eq!(
            s.settle(t(5)),
            Some(Change {
                before: Some(A),
                after: None
            })
        );
        // Its own report ages out; the other cluster's reports come back: judged again.
        s.foreign_node(A, "a-1", t(5 + 600));
        s.foreign_node(A, "a-2", t(5 + 600));
        assert_eq!(s.runs_in(t(5 + 600)), Some(&A));
    }

    #[test]
    fn the_judgment_lasts_while_reports_come_and_ends_a_window_after_the_last() {
        let mut s = Sightings::new(WINDOW);
        // Every loop (10 s) the wrong autoscaler asks about its nodes again.
        for loop_at in (0..3000).step_by(10) {
            s.foreign_node(A, "a-control", t(loop_at));
            s.foreign_node(A, "a-node-1", t(loop_at));
            s.foreign_node(A, "a-node-2", t(loop_at));
            assert_eq!(s.runs_in(t(loop_at + 9)), Some(&A), "{loop_at}");
            s.settle(t(loop_at + 9));
        }
        assert_eq!(s.judged(), Some(&A));
        let last = 2990;
        assert_eq!(s.runs_in(t(last + 599)), Some(&A));
        assert_eq!(
            s.runs_in(t(last + 600)),
            None,
            "a window after the last report"
        );
        assert_eq!(
            s.settle(t(last + 600)),
            Some(Change {
                before: Some(A),
                after: None
            })
        );
        // Only the last two distinct VMs are kept, whatever the cluster's size.
        assert_eq!(s.foreign[&A].len(), FOREIGN_VMS_NEEDED);
    }

    #[test]
    fn two_vms_seen_further_apart_than_the_window_are_not_clear() {
        let mut s = Sightings::new(WINDOW);
        s.foreign_node(A, "a-1", t(0));
        s.foreign_node(A, "a-2", t(600));
        assert_eq!(s.runs_in(t(600)), None);
        // Reports out of order: the later time of a VM stands.
        s.foreign_node(A, "a-1", t(700));
        s.foreign_node(A, "a-1", t(100));
        assert_eq!(s.runs_in(t(1199)), Some(&A));
        assert_eq!(s.runs_in(t(1200)), None);
    }

    #[test]
    fn its_own_nodes_alone_never_judge_it() {
        let mut s: Sightings<&str> = Sightings::new(WINDOW);
        for i in 0..100 {
            s.own_node(t(i));
        }
        assert_eq!(s.runs_in(t(100)), None);
        assert_eq!(s.settle(t(100)), None);
        assert_eq!(s.settle(t(10_000)), None);
    }
}
