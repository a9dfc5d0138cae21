//! Who is calling, and which node groups that caller may see and change.
//!
//! A group configured as `--nodes MIN:MAX:CLUSTER@CLIENT` is bound to the autoscaler whose
//! verified client certificate names CLIENT; a group without `@CLIENT` is served to every
//! caller. The gRPC layer reads the caller's names from its certificate once per request
//! (`crate::tls::certificate_identities`) and hands them over as a [`Caller`]; the provider
//! answers each call through [`Provider::seen_by`], which shows the caller its own groups and
//! nothing else: another client's group is not found, exactly as a group that does not exist.
//!
//! One caller has no certificate and sees every group: the operator on the admin address
//! (`serve --admin-listen`, loopback only, reached through `kubectl exec`). It may read and
//! refresh but change nothing: [`Scoped::may_change`] refuses its every write, and its
//! NodeGroupForNode reports teach the provider nothing.
//!
//! A certificate proves a name, not where its holder runs: the autoscaler of cluster A given
//! B's client certificate (same CA) sees B's group and would scale B for A's pods and delete
//! B's VMs as "unregistered". The nodes it reports give it away: [`Whereabouts`] keeps, per
//! caller, which configured clusters its real nodes are VMs of, and `cks_domain::binding`
//! judges when it clearly runs in another cluster than its own. From then on
//! [`Scoped::may_change`] refuses its writes ([`Error::ClientInAnotherCluster`],
//! PERMISSION_DENIED) before anything is queued or sent, one ERROR line says so, and
//! `cks_provider_client_cluster_mismatch` is 1; its reads keep answering. The judgment ends
//! when it reports a node of its own cluster, or reports none of the other's for
//! [`SIGHTING_WINDOW`].

use super::{Error, Provider, Result, Scoped, now};
use crate::metrics::ClientMismatch;
pub use cks_domain::binding::SIGHTING_WINDOW;
use cks_domain::binding::{Change, Sightings};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, PoisonError, RwLock};

/// The names a caller was verified to hold (its client certificate's DNS SANs, or its CN);
/// none for a caller without a client certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    identities: Vec<String>,
    /// The admin address's caller: every group, read-only ([`Caller::admin`]).
    admin: bool,
}

impl Caller {
    /// A caller with no client certificate: it sees only the groups bound to no client.
    pub fn anonymous() -> Caller {
        Caller::default()
    }

    /// A caller verified to hold these names.
    pub fn with_identities(identities: Vec<String>) -> Caller {
        Caller {
            identities,
            admin: false,
        }
    }

    /// The caller on the admin address (`--admin-listen`): an operator inside the provider's
    /// pod. It sees every group, whatever `--nodes …@CLIENT` binds, and may change none.
    pub fn admin() -> Caller {
        Caller {
            identities: Vec::new(),
            admin: true,
        }
    }

    /// Whether this is the admin address's read-only caller.
    pub fn is_admin(&self) -> bool {
        self.admin
    }

    /// The caller's names.
    pub fn identities(&self) -> &[String] {
        &self.identities
    }

    /// Whether a group bound to `client` (`None`: bound to no client) is this caller's. Names
    /// compare without regard to ASCII case, as DNS names do; nothing else is lenient (no
    /// wildcards, no suffixes).
    pub fn may_see(&self, client: Option<&str>) -> bool {
        self.admin
            || client.is_none_or(|c| self.identities.iter().any(|i| i.eq_ignore_ascii_case(c)))
    }

    /// Whether the caller holds one of the `denied` names (compared as [`Caller::may_see`]
    /// compares them).
    pub fn is_denied(&self, denied: &[String]) -> bool {
        denied
            .iter()
            .any(|d| self.identities.iter().any(|i| i.eq_ignore_ascii_case(d)))
    }

    /// The caller for logs.
    fn describe(&self) -> String {
        if self.admin {
            "the admin address (read-only)".to_string()
        } else if self.identities.is_empty() {
            "a client without a client certificate".to_string()
        } else {
            format!("client {}", self.identities.join(", "))
        }
    }
}

/// The callers already told they match no group, so each is logged once.
#[derive(Debug, Default)]
pub(crate) struct Unmatched(Mutex<HashSet<Vec<String>>>);

impl Provider {
    /// The provider as `caller` sees it: its groups only. A caller that matches no group, or
    /// is denied (`--deny-client`), sees an empty provider, which is logged once per caller.
    pub fn seen_by<'a>(&'a self, caller: &'a Caller) -> Scoped<'a> {
        let scoped = Scoped {
            p: self,
            caller: Some(caller),
            denied: caller.is_denied(&self.inner.settings.denied_clients),
        };
        if !scoped.sees_any() {
            let mut logged = self
                .inner
                .unmatched
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if !logged.insert(caller.identities.clone()) {
                return scoped;
            }
            if scoped.denied {
                tracing::warn!(
                    "{} is denied (--deny-client): it sees no node group",
                    caller.describe()
                );
            } else {
                let clients: Vec<&str> = self
                    .inner
                    .groups
                    .iter()
                    .filter_map(|g| g.client.as_deref())
                    .collect();
                tracing::warn!(
                    "{} matches no node group: it sees an empty provider (groups are bound to: {}); \
                     bind its group with --nodes MIN:MAX:CLUSTER@CLIENT naming a DNS SAN (or, \
                     without SANs, the CN) of its certificate",
                    caller.describe(),
                    clients.join(", ")
                );
            }
        }
        scoped
    }
}

/// Where each bound caller runs, as the nodes it reports show (`cks_domain::binding`), and the
/// series of `cks_provider_client_cluster_mismatch` set so far. Its locks are never held while
/// a group's is taken: names are read after they are released.
#[derive(Debug, Default)]
pub(crate) struct Whereabouts {
    /// By the caller's names; group indices name the clusters. Each caller's sightings have a
    /// lock of their own, taken under the map's read lock: a NodeGroupForNode waits only for
    /// another call of the same caller, never for another caller's; the map is locked to
    /// write only when a caller is first seen.
    by_caller: RwLock<HashMap<Vec<String>, Mutex<Sightings<usize>>>>,
    /// Each (client, bound cluster, seen cluster) series ever set, and whether it is 1.
    series: Mutex<BTreeMap<(String, String, String), bool>>,
}

impl Whereabouts {
    /// Runs `f` while the sightings of the caller with these names are locked, as a call of
    /// that caller recording one holds them; `None` when it has none.
    #[cfg(test)]
    pub(super) fn holding<R>(&self, names: &[String], f: impl FnOnce() -> R) -> Option<R> {
        let by = read(&self.by_caller);
        let _held = lock(by.get(names)?);
        Some(f())
    }
}

impl Scoped<'_> {
    /// Whether the caller may change anything: every caller but the admin address's, and but
    /// one judged to be another cluster's autoscaler. A write asked by either is refused
    /// before it is looked at, so nothing is queued, promised or sent to CloudStack.
    pub(crate) fn may_change(&self) -> Result<()> {
        match self.caller {
            Some(c) if c.admin => Err(Error::ReadOnly),
            Some(c) => self.runs_where_bound(c),
            None => Ok(()),
        }
    }

    /// Whether this is the admin address's read-only caller.
    pub(crate) fn read_only(&self) -> bool {
        self.caller.is_some_and(Caller::is_admin)
    }

    /// Refuses the caller when its node reports show, now, that it runs in another cluster.
    fn runs_where_bound(&self, caller: &Caller) -> Result<()> {
        let (change, judged) = {
            let by = read(&self.p.inner.whereabouts.by_caller);
            let Some(s) = by.get(caller.identities.as_slice()) else {
                return Ok(());
            };
            let mut s = lock(s);
            (s.settle(now()), s.judged().copied())
        };
        if let Some(change) = change {
            self.say(change);
        }
        match judged {
            None => Ok(()),
            Some(seen) => Err(self.in_another_cluster(seen)),
        }
    }

    /// Records that the caller reported a node of VM `vm_id`, listed in group `gi`'s cluster,
    /// at NodeGroupForNode; `real`: a node of its Kubernetes cluster, not a fake one the
    /// autoscaler built from an instance without a node (which says nothing of where it
    /// runs). Only callers that may change a group and could be in another cluster are
    /// watched: not the admin address, not a denied or unmatched caller, not with one group.
    pub(crate) fn sighted(&self, gi: usize, vm_id: &str, real: bool) {
        let Some(caller) = self.caller else {
            return;
        };
        if !real
            || caller.admin
            || self.denied
            || caller.identities.is_empty()
            || self.p.inner.groups.len() < 2
        {
            return;
        }
        let own = self.sees(gi);
        let at = now();
        let record = |s: &mut Sightings<usize>| {
            if own {
                s.own_node(at);
            } else {
                s.foreign_node(gi, vm_id, at);
            }
            (s.settle(at), s.settle_shared(at))
        };
        let whereabouts = &self.p.inner.whereabouts;
        let seen = read(&whereabouts.by_caller)
            .get(caller.identities.as_slice())
            .map(|s| record(&mut lock(s)));
        let (change, shared) = match seen {
            Some(seen) => seen,
            None => {
                if own && (0..self.p.inner.groups.len()).all(|i| self.sees(i)) {
                    // Every cluster is its own: there is nowhere else for it to be.
                    return;
                }
                if !self.sees_any() {
                    return;
                }
                let mut by = whereabouts
                    .by_caller
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                // Another call of the same caller may have added it since the look above.
                let s = by
                    .entry(caller.identities.clone())
                    .or_insert_with(|| Mutex::new(Sightings::new(SIGHTING_WINDOW)));
                record(s.get_mut().unwrap_or_else(PoisonError::into_inner))
            }
        };
        if let Some(change) = change {
            self.say(change);
        }
        if let Some(other) = shared {
            tracing::warn!(
                client = %self.binding_names(),
                bound_cluster = %self.bound_clusters(),
                seen_cluster = %self.p.inner.groups[other].label(),
                "client {} reports nodes of its own cluster {} and of cluster {}: one client certificate may be in use by the autoscalers of both; which calls come from where cannot be told, so none is refused, and the autoscaler of {} may scale {}. Give each autoscaler its own cluster's certificate",
                self.binding_names(),
                self.bound_clusters(),
                self.p.inner.groups[other].label(),
                self.p.inner.groups[other].label(),
                self.bound_clusters()
            );
        }
    }

    /// The names the caller's groups are bound to, or its own names when none is.
    fn binding_names(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for gi in self.visible() {
            if let Some(c) = self.p.inner.groups[gi].client.as_deref()
                && !names.iter().any(|n| n.eq_ignore_ascii_case(c))
            {
                names.push(c);
            }
        }
        if names.is_empty() {
            return self
                .caller
                .map(|c| c.identities.join(", "))
                .unwrap_or_default();
        }
        names.join(", ")
    }

    /// The clusters the caller is bound to, by name.
    fn bound_clusters(&self) -> String {
        self.visible()
            .into_iter()
            .map(|gi| self.p.inner.groups[gi].label())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn in_another_cluster(&self, seen: usize) -> Error {
        Error::ClientInAnotherCluster {
            client: self.binding_names(),
            bound: self.bound_clusters(),
            seen: self.p.inner.groups[seen].label(),
        }
    }

    /// Says a change of the judgment of the caller: ERROR when it is judged to run in
    /// another cluster (once per judgment), INFO when that ends.
    fn say(&self, change: Change<usize>) {
        match (change.before, change.after) {
            (_, Some(seen)) => {
                let e = self.in_another_cluster(seen);
                tracing::error!(
                    client = %self.binding_names(),
                    bound_cluster = %self.bound_clusters(),
                    seen_cluster = %self.p.inner.groups[seen].label(),
                    "{e}. Refused until it reports a node of its own cluster, or none of {}'s for {} minutes",
                    self.p.inner.groups[seen].label(),
                    SIGHTING_WINDOW.as_secs() / 60
                );
            }
            (Some(seen), None) => tracing::info!(
                client = %self.binding_names(),
                bound_cluster = %self.bound_clusters(),
                seen_cluster = %self.p.inner.groups[seen].label(),
                "client {} is no longer taken for an autoscaler running in cluster {} (it reported a node of its own cluster, or none of {}'s for {} minutes): its scale requests are accepted again",
                self.binding_names(),
                self.p.inner.groups[seen].label(),
                self.p.inner.groups[seen].label(),
                SIGHTING_WINDOW.as_secs() / 60
            ),
            (None, None) => {}
        }
    }
}

impl super::Health<'_> {
    /// Every client ever judged to run in another cluster than its own, and whether it is now
    /// (`cks_provider_client_cluster_mismatch`). Judgments are settled at this moment, so one
    /// whose reports aged out ends here even when its caller no longer calls.
    pub fn client_cluster_mismatches(&self) -> Vec<ClientMismatch> {
        let at = now();
        let settled = {
            let by = read(&self.p.inner.whereabouts.by_caller);
            by.iter()
                .map(|(names, s)| {
                    let mut s = lock(s);
                    (names.clone(), s.settle(at), s.judged().copied())
                })
                .filter(|(_, change, judged)| change.is_some() || judged.is_some())
                .collect::<Vec<_>>()
        };
        let mut now_judged = Vec::new();
        for (names, change, judged) in settled {
            let caller = Caller::with_identities(names);
            let scoped = Scoped {
                p: self.p,
                caller: Some(&caller),
                denied: caller.is_denied(&self.p.inner.settings.denied_clients),
            };
            if let Some(change) = change {
                scoped.say(change);
            }
            if let Some(seen) = judged {
                now_judged.push((
                    scoped.binding_names(),
                    scoped.bound_clusters(),
                    self.p.cluster(seen).label(),
                ));
            }
        }
        let mut series = lock(&self.p.inner.whereabouts.series);
        for active in series.values_mut() {
            *active = false;
        }
        for key in now_judged {
            series.insert(key, true);
        }
        series
            .iter()
            .map(|((client, bound, seen), active)| ClientMismatch {
                client: client.clone(),
                bound_cluster: bound.clone(),
                seen_cluster: seen.clone(),
                active: *active,
            })
            .collect()
    }
}

/// A lock whose holder never panics while holding it with the data inconsistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`], shared.
fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::Caller;

    #[test]
    fn a_group_is_seen_when_it_names_no_client_or_one_of_the_callers_names() {
        let a = Caller::with_identities(vec!["autoscaler.a".into(), "Alias.A".into()]);
        let anonymous = Caller::anonymous();
        let cases: [(&Caller, Option<&str>, bool); 10] = [
            (&a, None, true),
            (&anonymous, None, true),
            (&a, Some("autoscaler.a"), true),
            (&a, Some("AUTOSCALER.A"), true),
            (&a, Some("alias.a"), true),
            (&a, Some("autoscaler.b"), false),
            (&a, Some("a"), false),
            (&a, Some("autoscaler.a.evil"), false),
            (&a, Some("*.a"), false),
            (&anonymous, Some("autoscaler.a"), false),
        ];
        for (caller, client, seen) in cases {
            assert_eq!(caller.may_see(client), seen, "{caller:?} / {client:?}");
        }
        assert!(a.is_denied(&["ALIAS.a".to_string()]));
        assert!(!a.is_denied(&["autoscaler".to_string(), "autoscaler.b".to_string()]));
        assert!(!anonymous.is_denied(&["autoscaler.a".to_string()]));
        // A wildcard the caller holds is a name like any other: it matches only itself.
        let wild = Caller::with_identities(vec!["*.example".into()]);
        assert!(!wild.may_see(Some("a.example")));
        assert_eq!(a.identities().len(), 2);
    }

    #[test]
    fn the_admin_caller_sees_every_group_and_no_name_denies_it() {
        let admin = Caller::admin();
        assert!(admin.is_admin());
        assert!(admin.may_see(None));
        assert!(admin.may_see(Some("autoscaler.a")));
        assert!(!admin.is_denied(&["autoscaler.a".to_string(), String::new()]));
        assert!(!Caller::anonymous().is_admin());
        assert!(!Caller::with_identities(vec!["admin".into()]).is_admin());
    }
}
