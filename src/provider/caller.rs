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

use super::{Error, Provider, Result, Scoped};
use std::collections::HashSet;
use std::sync::Mutex;

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

impl Scoped<'_> {
    /// Whether the caller may change anything: every caller but the admin address's may. A
    /// write asked there is refused before it is looked at, so nothing is queued, promised or
    /// sent to CloudStack.
    pub(crate) fn may_change(&self) -> Result<()> {
        match self.caller {
            Some(c) if c.admin => Err(Error::ReadOnly),
            _ => Ok(()),
        }
    }
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
