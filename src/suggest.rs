//! A cluster `--nodes` names that CloudStack does not list: what the key lists instead, and the
//! closest of those to the name or id asked for (another case, a typo), so that the message
//! names the likely cluster ("did you mean `demo`?") and blames the project or the key only
//! when the key lists no cluster of that name nor a close one. Used by `check` and by `serve`
//! (the group's error, which its log and the autoscaler's Refresh error carry).
//!
//! The listing is one `listKubernetesClusters` with no filter, asked only after a cluster was
//! not found; [`SeenCache`] keeps it for [`SEEN_TTL`] so a provider retrying a group that stays
//! unlisted does not list every cluster again on each try.

use crate::config::ClusterRef;
use cks_cloudstack::{Client, CsError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long `serve` reuses one listing of the key's clusters for its messages.
pub const SEEN_TTL: Duration = Duration::from_secs(300);

/// At most this many cluster names are written in a message.
const NAMES_SHOWN: usize = 10;

/// A cluster the key lists: its name and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenCluster {
    pub name: String,
    pub id: String,
}

/// Every cluster the key lists (one `listKubernetesClusters` with no filter, every page).
pub async fn clusters_seen(cs: &Client) -> Result<Vec<SeenCluster>, CsError> {
    Ok(cs
        .list_clusters()
        .await?
        .into_iter()
        .map(|c| SeenCluster {
            name: c.name,
            id: c.id,
        })
        .collect())
}

/// One listing of the key's clusters, reused for [`SEEN_TTL`]. A listing that fails is not
/// kept: the next not-found asks again.
#[derive(Debug, Default)]
pub struct SeenCache(Mutex<Option<(Instant, Arc<Vec<SeenCluster>>)>>);

impl SeenCache {
    /// The listing kept at `now` if it is younger than [`SEEN_TTL`].
    pub fn fresh(&self, now: Instant) -> Option<Arc<Vec<SeenCluster>>> {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.as_ref()
            .filter(|(at, _)| now.saturating_duration_since(*at) < SEEN_TTL)
            .map(|(_, seen)| seen.clone())
    }

    /// Keeps `seen`, listed at `now`.
    pub fn keep(&self, now: Instant, seen: Vec<SeenCluster>) -> Arc<Vec<SeenCluster>> {
        let seen = Arc::new(seen);
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((now, seen.clone()));
        seen
    }

    /// The kept listing, or a new one asked of `cs` (`None` when that fails).
    pub async fn get(&self, cs: &Client, now: Instant) -> Option<Arc<Vec<SeenCluster>>> {
        if let Some(seen) = self.fresh(now) {
            return Some(seen);
        }
        match clusters_seen(cs).await {
            Ok(seen) => Some(self.keep(now, seen)),
            Err(e) => {
                tracing::debug!(error = %e, "listing the key's clusters for the message failed");
                None
            }
        }
    }
}

/// The listed cluster closest to `wanted`: the same name in another case first, then the
/// smallest edit distance within a bound that grows with the name's length (one edit for a
/// short name, at most three), then a name holding the other; `None` when none is close.
pub fn closest<'a>(wanted: &ClusterRef, seen: &'a [SeenCluster]) -> Option<&'a SeenCluster> {
    let (wanted, by_id) = match wanted {
        ClusterRef::Name(n) => (n.to_lowercase(), false),
        ClusterRef::Id(id) => (id.to_lowercase(), true),
    };
    let len = wanted.chars().count();
    let bound = (len / 4).clamp(1, 3);
    seen.iter()
        .filter_map(|c| {
            let key = if by_id { &c.id } else { &c.name }.to_lowercase();
            let d = distance(&wanted, &key);
            let rank = if d <= bound {
                d
            } else if !by_id
                && len.min(key.chars().count()) >= 3
                && (key.contains(&wanted) || wanted.contains(&key))
            {
                bound + 1
            } else {
                return None;
            };
            Some((rank, c))
        })
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, c)| c)
}

/// The optimal string alignment distance between `a` and `b`: insertions, deletions,
/// substitutions and swaps of two neighbours (`dmeo` → `demo` is one), counted in characters.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

/// The listed names, quoted, at most [`NAMES_SHOWN`] of them.
fn names(seen: &[SeenCluster]) -> String {
    let mut shown: Vec<String> = seen
        .iter()
        .take(NAMES_SHOWN)
        .map(|c| format!("{:?}", c.name))
        .collect();
    if seen.len() > NAMES_SHOWN {
        shown.push(format!("… ({} in all)", seen.len()));
    }
    shown.join(", ")
}

/// What an operator reads when the cluster `wanted` is not listed for the key: with `seen`
/// (what the key lists; `None` when it could not be listed), the closest cluster, or the
/// clusters it lists and why the one asked for may be missing: `blame`, what to check of the
/// project and the key (`crate::provider::not_listed_hint`), said only when no listed cluster
/// is close.
pub fn not_listed(wanted: &ClusterRef, seen: Option<&[SeenCluster]>, blame: &str) -> String {
    let Some(seen) = seen else {
        return format!("deleted, or not visible to this API key: {blame}");
    };
    let count = match seen.len() {
        1 => "1 cluster".to_string(),
        n => format!("{n} clusters"),
    };
    if seen.is_empty() {
        return format!("this API key lists no cluster at all: {blame}");
    }
    match (closest(wanted, seen), wanted) {
        (Some(c), ClusterRef::Name(_)) => format!(
            "did you mean {:?} (id {})? This API key lists {count}: {}. --nodes names a cluster by \
             its exact name, case included, or by its id: write MIN:MAX:{} (or MIN:MAX:{})",
            c.name,
            c.id,
            names(seen),
            c.name,
            c.id
        ),
        (Some(c), ClusterRef::Id(_)) => format!(
            "did you mean id {} (named {:?})? This API key lists {count}: {}. Write \
             MIN:MAX:{} in --nodes",
            c.id,
            c.name,
            names(seen),
            c.id
        ),
        (None, _) => format!(
            "this API key lists {count}, none of that {} nor close to it: {}. If the cluster is \
             none of these, it was deleted or this key does not see it: {blame}",
            match wanted {
                ClusterRef::Name(_) => "name",
                ClusterRef::Id(_) => "id",
            },
            names(seen)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blame(project: Option<&str>) -> String {
        crate::provider::not_listed_hint(project)
    }

    fn seen(names: &[(&str, &str)]) -> Vec<SeenCluster> {
        names
            .iter()
            .map(|(name, id)| SeenCluster {
                name: name.to_string(),
                id: id.to_string(),
            })
            .collect()
    }

    #[test]
    fn the_closest_cluster_is_another_case_then_a_small_typo_then_a_part() {
        let listed = seen(&[
            ("demo", "6f1d2c1e-0000-4000-8000-00000000abcd"),
            ("prod-eu", "a1b2c3d4-0000-4000-8000-000000000001"),
            ("Staging", "a1b2c3d4-0000-4000-8000-000000000002"),
        ]);
        let name = |n: &str| ClusterRef::Name(n.into());
        let cases: [(ClusterRef, Option<&str>); 10] = [
            (name("Demo"), Some("demo")),
            (name("dmeo"), Some("demo")),
            (name("demo2"), Some("demo")),
            (name("staging"), Some("Staging")),
            (name("prod-ue"), Some("prod-eu")),
            (name("prod"), Some("prod-eu")),
            (name("dev"), None),
            (name("production-us"), None),
            (name("x"), None),
            (
                ClusterRef::Id("6f1d2c1e-0000-4000-8000-00000000abce".into()),
                Some("demo"),
            ),
        ];
        for (wanted, want) in cases {
            assert_eq!(
                closest(&wanted, &listed).map(|c| c.name.as_str()),
                want,
                "{wanted}"
            );
        }
        assert_eq!(
            closest(
                &ClusterRef::Id("00000000-0000-4000-8000-000000000000".into()),
                &listed
            ),
            None
        );
        assert_eq!(distance("dmeo", "demo"), 1);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
    }

    #[test]
    fn the_message_names_the_close_cluster_and_blames_the_key_only_without_one() {
        let listed = seen(&[("demo", "c-1"), ("prod", "c-2")]);
        let demo_typo = not_listed(
            &ClusterRef::Name("dmeo".into()),
            Some(&listed),
            &blame(None),
        );
        assert_eq!(
            demo_typo,
            "did you mean \"demo\" (id c-1)? This API key lists 2 clusters: \"demo\", \"prod\". \
             --nodes names a cluster by its exact name, case included, or by its id: write \
             MIN:MAX:demo (or MIN:MAX:c-1)"
        );
        assert!(!demo_typo.contains("project"), "{demo_typo}");
        let other = not_listed(
            &ClusterRef::Name("web".into()),
            Some(&listed),
            &blame(Some("p-1")),
        );
        assert!(
            other.starts_with(
                "this API key lists 2 clusters, none of that name nor close to it: \"demo\", \"prod\". If the cluster is none of these"
            ),
            "{other}"
        );
        assert!(other.contains("project-id is p-1"), "{other}");
        let none = not_listed(&ClusterRef::Name("demo".into()), Some(&[]), &blame(None));
        assert!(
            none.starts_with("this API key lists no cluster at all: a cluster in a CloudStack project is listed only with the project's id: set project-id"),
            "{none}"
        );
        let unknown = not_listed(&ClusterRef::Name("demo".into()), None, &blame(Some("p-1")));
        assert!(
            unknown.starts_with("deleted, or not visible to this API key: project-id is p-1"),
            "{unknown}"
        );
        let many: Vec<SeenCluster> = (0..12)
            .map(|i| SeenCluster {
                name: format!("cluster-{i:02}"),
                id: format!("id-{i}"),
            })
            .collect();
        let long = not_listed(&ClusterRef::Name("zzz".into()), Some(&many), &blame(None));
        assert!(long.contains("\"cluster-09\", … (12 in all)"), "{long}");
        assert!(!long.contains("cluster-10"), "{long}");
    }

    #[test]
    fn a_listing_is_reused_for_its_ttl_only() {
        let cache = SeenCache::default();
        let t0 = Instant::now();
        assert!(cache.fresh(t0).is_none());
        cache.keep(t0, seen(&[("demo", "c-1")]));
        assert_eq!(cache.fresh(t0 + SEEN_TTL / 2).map(|s| s.len()), Some(1));
        assert!(cache.fresh(t0 + SEEN_TTL).is_none());
    }
}
