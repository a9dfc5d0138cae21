//! The `--nodes` grammar (`MIN:MAX:CLUSTER[@CLIENT]`, the in-tree provider's with an optional
//! client) and the check that the node groups and TLS settings keep each autoscaler to its own
//! cluster. The two live together because a `@CLIENT` is only a promise once client
//! certificates are required: [`check_client_binding`] is what makes the grammar safe to use.

use super::ConfigError;
use std::fmt;

/// Largest `MAX` accepted in a `--nodes` spec.
pub const MAX_NODES_LIMIT: u32 = 10_000;

const NODES_FORMAT: &str = "MIN:MAX:CLUSTER or MIN:MAX:CLUSTER@CLIENT (e.g. 1:10:<cluster-uuid>, \
     1:10:name=my-cluster@autoscaler.my-cluster)";

/// How a `--nodes` spec names its CKS cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClusterRef {
    /// A cluster UUID.
    Id(String),
    /// A cluster name (exact match).
    Name(String),
}

impl fmt::Display for ClusterRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterRef::Id(id) => write!(f, "id={id}"),
            ClusterRef::Name(name) => write!(f, "name={name}"),
        }
    }
}

/// One `--nodes MIN:MAX:CLUSTER` node group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroupSpec {
    pub min: u32,
    pub max: u32,
    pub cluster: ClusterRef,
}

/// One `--nodes MIN:MAX:CLUSTER[@CLIENT]` value: a node group and the autoscaler it is served
/// to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundNodeGroup {
    pub group: NodeGroupSpec,
    /// The client the group is served to, matched against the DNS SANs of the caller's
    /// verified client certificate (its CN when it has no DNS SAN). `None`: every client.
    pub client: Option<String>,
}

/// Parses `MIN:MAX:CLUSTER` with no client bound (see [`parse_nodes`] for the whole syntax):
/// a value binding a client is refused rather than read without its client.
pub fn parse_nodes_spec(s: &str) -> Result<NodeGroupSpec, ConfigError> {
    let bound = parse_nodes(s)?;
    match bound.client {
        None => Ok(bound.group),
        Some(client) => Err(nodes_error(
            s,
            format!("binds client {client:?}, which this reader of MIN:MAX:CLUSTER would drop"),
        )),
    }
}

fn nodes_error(input: &str, reason: String) -> ConfigError {
    ConfigError::NodesSpec {
        input: input.to_string(),
        reason,
        expected: NODES_FORMAT,
    }
}

/// Parses `MIN:MAX:CLUSTER[@CLIENT]`. CLUSTER is an id when UUID-shaped, else a name;
/// `id=…`/`name=…` say which explicitly. The first `@` starts CLIENT, so a cluster whose name
/// holds an `@` is named by id. CLIENT is a DNS name or a certificate CN: no `*` (wildcards are
/// never matched), no control characters, no surrounding spaces.
pub fn parse_nodes(s: &str) -> Result<BoundNodeGroup, ConfigError> {
    let err = |reason: String| nodes_error(s, reason);
    let parts: Vec<&str> = s.trim().split(':').collect();
    let [min, max, cluster] = parts.as_slice() else {
        return Err(err(format!(
            "has {} colon-separated part(s), not 3",
            parts.len()
        )));
    };
    let number = |what: &str, v: &str| -> Result<u32, ConfigError> {
        v.trim().parse::<u32>().map_err(|_| {
            err(format!(
                "{what} {:?} is not a non-negative whole number",
                v.trim()
            ))
        })
    };
    let min = number("MIN", min)?;
    let max = number("MAX", max)?;
    if min > max {
        return Err(err(format!("MIN {min} is greater than MAX {max}")));
    }
    if max > MAX_NODES_LIMIT {
        return Err(err(format!(
            "MAX {max} exceeds the limit of {MAX_NODES_LIMIT}"
        )));
    }
    let (cluster, client) = match cluster.split_once('@') {
        Some((cluster, client)) => (cluster, Some(parse_client(client).map_err(err)?)),
        None => (*cluster, None),
    };
    let cluster = cluster.trim();
    let cluster = if let Some(id) = cluster.strip_prefix("id=") {
        ClusterRef::Id(id.trim().to_string())
    } else if let Some(name) = cluster.strip_prefix("name=") {
        ClusterRef::Name(name.trim().to_string())
    } else if is_uuid(cluster) {
        ClusterRef::Id(cluster.to_string())
    } else {
        ClusterRef::Name(cluster.to_string())
    };
    let (ClusterRef::Id(v) | ClusterRef::Name(v)) = &cluster;
    if v.is_empty() {
        return Err(err("CLUSTER is empty".into()));
    }
    Ok(BoundNodeGroup {
        group: NodeGroupSpec { min, max, cluster },
        client,
    })
}

/// The CLIENT of `CLUSTER@CLIENT`, trimmed.
fn parse_client(client: &str) -> Result<String, String> {
    let client = client.trim();
    if client.is_empty() {
        return Err("CLIENT after `@` is empty".into());
    }
    if client.contains('*') {
        return Err(format!(
            "CLIENT {client:?} holds a `*`: wildcard certificate names are never matched; name \
             the one DNS SAN (or CN) of the autoscaler's certificate"
        ));
    }
    if client.chars().any(char::is_control) {
        return Err(format!("CLIENT {client:?} holds a control character"));
    }
    Ok(client.to_string())
}

/// Refuses node groups and TLS settings that would let an autoscaler see or change another's
/// groups: with more than one group, every group must name its client and client
/// certificates must be required (`client_ca`, `--tls-client-ca`); a group naming a client
/// needs them too, or no caller could ever be told to be that client. One group served to
/// every client (the in-tree provider's setup) needs nothing.
pub fn check_client_binding(groups: &[BoundNodeGroup], client_ca: bool) -> Result<(), ConfigError> {
    let mut missing = Vec::new();
    let unbound: Vec<String> = groups
        .iter()
        .filter(|g| g.client.is_none())
        .map(|g| g.group.cluster.to_string())
        .collect();
    if groups.len() > 1 && !unbound.is_empty() {
        missing.push(format!(
            "{} node groups are served on one listener, and {} name(s) no client ({}): write \
             each as --nodes MIN:MAX:CLUSTER@CLIENT, CLIENT being a DNS SAN (or, without SANs, \
             the CN) of that cluster's autoscaler's client certificate",
            groups.len(),
            unbound.len(),
            unbound.join(", ")
        ));
    }
    let bound = groups.len() - unbound.len();
    if !client_ca && (groups.len() > 1 || bound > 0) {
        missing.push(if bound > 0 {
            format!(
                "{bound} node group(s) name a client but --tls-client-ca is not set: without \
                 required client certificates no caller can be told apart; give --tls-client-ca \
                 (with --tls-cert and --tls-key)"
            )
        } else {
            "--tls-client-ca is not set: give it (with --tls-cert and --tls-key) so that every \
             autoscaler presents a client certificate naming it"
                .to_string()
        });
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::ClientBinding { missing })
    }
}

/// Refuses two entries naming the same cluster by the same reference (an id twice, or a name
/// twice; ids without regard to case, as CloudStack looks them up; names exactly). A cluster
/// named once by id and once by name is found when the name resolves (the provider refuses the
/// second group then).
pub fn check_distinct_clusters(groups: &[BoundNodeGroup]) -> Result<(), ConfigError> {
    let same = |a: &ClusterRef, b: &ClusterRef| match (a, b) {
        (ClusterRef::Id(a), ClusterRef::Id(b)) => a.eq_ignore_ascii_case(b),
        (ClusterRef::Name(a), ClusterRef::Name(b)) => a == b,
        _ => false,
    };
    for (second, g) in groups.iter().enumerate() {
        if let Some(first) = groups[..second]
            .iter()
            .position(|o| same(&o.group.cluster, &g.group.cluster))
        {
            return Err(ConfigError::DuplicateCluster {
                cluster: g.group.cluster.to_string(),
                first: first + 1,
                second: second + 1,
            });
        }
    }
    Ok(())
}

/// 8-4-4-4-12 hex digits.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4";

    #[test]
    fn the_same_cluster_twice_is_refused() {
        let groups = |specs: &[&str]| -> Vec<BoundNodeGroup> {
            specs.iter().map(|s| parse_nodes(s).expect(s)).collect()
        };
        let by_id = format!("1:3:{UUID}@b");
        let by_upper_id = format!("2:4:{}@c", UUID.to_uppercase());
        let refused = [
            (vec!["1:3:prod@a", "1:5:prod@b"], "prod", (1, 2)),
            (
                vec!["1:3:other@a", by_id.as_str(), by_upper_id.as_str()],
                UUID,
                (2, 3),
            ),
        ];
        for (specs, cluster, (first, second)) in refused {
            let err = check_distinct_clusters(&groups(&specs)).expect_err("refused");
            let text = err.to_string();
            assert!(
                text.contains(&format!("entries {first} and {second}"))
                    && text.to_lowercase().contains(&cluster.to_lowercase()),
                "{specs:?}: {text}"
            );
        }
        for ok in [
            vec!["1:3:prod@a", "1:3:staging@b"],
            vec!["1:3:prod@a", by_id.as_str()],
            vec!["1:3:Prod@a", "1:3:prod@b"],
        ] {
            check_distinct_clusters(&groups(&ok)).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
    }

    #[test]
    fn nodes_spec_accepts_ids_and_names() {
        let cases: [(&str, u32, u32, ClusterRef); 7] = [
            (
                "1:5:177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4",
                1,
                5,
                ClusterRef::Id(UUID.into()),
            ),
            (
                "0:10:177D0EEB-EE9F-4BD6-B3B3-2E8E1BF4E1A4",
                0,
                10,
                ClusterRef::Id(UUID.to_uppercase()),
            ),
            ("2:2:prod", 2, 2, ClusterRef::Name("prod".into())),
            (" 1 : 3 : prod ", 1, 3, ClusterRef::Name("prod".into())),
            (
                "1:3:name=177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4",
                1,
                3,
                ClusterRef::Name(UUID.into()),
            ),
            ("1:3:id=legacy-id", 1, 3, ClusterRef::Id("legacy-id".into())),
            (
                "0:10000:177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a",
                0,
                10_000,
                ClusterRef::Name(UUID[..35].into()),
            ),
        ];
        for (input, min, max, cluster) in cases {
            let spec = parse_nodes_spec(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(spec, NodeGroupSpec { min, max, cluster }, "{input}");
        }
    }

    #[test]
    fn nodes_spec_errors_quote_the_input_and_the_format() {
        let cases: [(&str, &str); 10] = [
            ("1:5", "2 colon-separated part(s)"),
            ("1:5:a:b", "4 colon-separated part(s)"),
            ("", "1 colon-separated part(s)"),
            ("x:5:prod", "MIN \"x\""),
            ("1:-5:prod", "MAX \"-5\""),
            ("1:2.5:prod", "MAX \"2.5\""),
            ("6:5:prod", "MIN 6 is greater than MAX 5"),
            ("1:10001:prod", "exceeds the limit of 10000"),
            ("1:5:", "CLUSTER is empty"),
            ("1:5:id=", "CLUSTER is empty"),
        ];
        for (input, reason) in cases {
            let err = parse_nodes_spec(input).expect_err(input).to_string();
            assert!(err.contains(&format!("{input:?}")), "{err}");
            assert!(err.contains(reason), "{input}: {err}");
            assert!(err.contains("MIN:MAX:CLUSTER"), "{err}");
        }
    }

    #[test]
    fn nodes_binds_a_client_after_the_first_at() {
        let name = |n: &str| ClusterRef::Name(n.into());
        let cases: [(&str, ClusterRef, Option<&str>); 7] = [
            ("1:3:prod", name("prod"), None),
            (
                "1:3:prod@autoscaler.prod",
                name("prod"),
                Some("autoscaler.prod"),
            ),
            (
                "1:3:177d0eeb-ee9f-4bd6-b3b3-2e8e1bf4e1a4@ca-a",
                ClusterRef::Id(UUID.into()),
                Some("ca-a"),
            ),
            ("1:3:name=prod @ ca-a ", name("prod"), Some("ca-a")),
            ("1:3:id=x@ca-a", ClusterRef::Id("x".into()), Some("ca-a")),
            // A CN may hold spaces and an `@`: only the first `@` separates.
            (
                "1:3:prod@cluster autoscaler@prod",
                name("prod"),
                Some("cluster autoscaler@prod"),
            ),
            ("0:0:a@B.Example", name("a"), Some("B.Example")),
        ];
        for (input, cluster, client) in cases {
            let bound = parse_nodes(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(bound.group.cluster, cluster, "{input}");
            assert_eq!(bound.client.as_deref(), client, "{input}");
        }
        assert_eq!(
            parse_nodes("2:5:prod@ca")
                .map(|b| (b.group.min, b.group.max))
                .ok(),
            Some((2, 5))
        );
    }

    #[test]
    fn nodes_refuses_an_unusable_client_and_the_plain_reader_never_drops_one() {
        let cases: [(&str, &str); 5] = [
            ("1:3:prod@", "CLIENT after `@` is empty"),
            ("1:3:prod@  ", "CLIENT after `@` is empty"),
            ("1:3:prod@*.example", "wildcard"),
            ("1:3:prod@a\tb", "control character"),
            ("1:3:@ca-a", "CLUSTER is empty"),
        ];
        for (input, reason) in cases {
            let err = parse_nodes(input).expect_err(input).to_string();
            assert!(err.contains(reason), "{input}: {err}");
            assert!(err.contains(&format!("{input:?}")), "{err}");
            assert!(err.contains("MIN:MAX:CLUSTER@CLIENT"), "{err}");
        }
        let err = parse_nodes_spec("1:3:prod@ca-a").expect_err("binds a client");
        assert!(err.to_string().contains("binds client \"ca-a\""), "{err}");
        assert_eq!(
            parse_nodes_spec("1:3:prod").ok().map(|g| g.cluster),
            Some(ClusterRef::Name("prod".into()))
        );
    }

    #[test]
    fn several_groups_need_every_client_named_and_client_certificates_required() {
        let bound = |spec: &str| parse_nodes(spec).expect(spec);
        let a = bound("1:3:a@ca-a");
        let b = bound("1:3:b@ca-b");
        let plain_b = bound("1:3:b");
        let plain_a = bound("1:3:a");
        // Accepted: one unbound group, with or without mTLS; bound groups with mTLS.
        assert!(check_client_binding(std::slice::from_ref(&plain_a), false).is_ok());
        assert!(check_client_binding(std::slice::from_ref(&plain_a), true).is_ok());
        assert!(check_client_binding(&[a.clone(), b.clone()], true).is_ok());
        assert!(check_client_binding(std::slice::from_ref(&a), true).is_ok());
        // Refused, each naming what is missing.
        let refused = |groups: &[BoundNodeGroup], ca: bool| {
            check_client_binding(groups, ca)
                .expect_err("refused")
                .to_string()
        };
        let e = refused(&[a.clone(), plain_b.clone()], true);
        assert!(e.starts_with("client binding: "), "{e}");
        assert!(e.contains("1 name(s) no client (name=b)"), "{e}");
        assert!(!e.contains("--tls-client-ca is not set"), "{e}");
        let e = refused(&[a.clone(), b.clone()], false);
        assert!(
            e.contains("2 node group(s) name a client but --tls-client-ca is not set"),
            "{e}"
        );
        let e = refused(&[plain_a.clone(), plain_b.clone()], false);
        assert!(e.contains("2 name(s) no client (name=a, name=b)"), "{e}");
        assert!(e.contains("--tls-client-ca is not set"), "{e}");
        assert!(e.contains("delete them"), "the message says why: {e}");
        let e = refused(std::slice::from_ref(&a), false);
        assert!(e.contains("1 node group(s) name a client"), "{e}");
    }
}
