//! Configuration sources: the CloudStack cloud-config (ini) and `--nodes` specs.
//!
//! The cloud-config is the file operators already have for the in-tree CloudStack provider and
//! CKS's `cloudstack-secret`: section `[Global]` with `api-url`, `api-key`, `secret-key` and
//! optionally `ssl-no-verify`, `project-id`, `zone`. This module reads it the way gcfg
//! (`gopkg.in/gcfg.v1`, which the in-tree provider calls) does, so one file means the same to
//! both. The rules, and the one place this reader is more lenient (unknown keys and sections are
//! ignored with a warning instead of refused), are in docs/operations.md §2.5. The `--nodes`
//! spec is the in-tree provider's `MIN:MAX:CLUSTER`, optionally bound to the one autoscaler it
//! is served to (`MIN:MAX:CLUSTER@CLIENT`, see [`parse_nodes`] and [`check_client_binding`]).
//!
//! Nothing here logs or returns a value read from the file except `api-url` and
//! `ssl-no-verify`: errors and warnings name lines, columns, keys and sections.
//!
//! One error type, [`ConfigError`], says why any of these sources was refused. The reading is
//! in three parts because each answers to a different authority: `gcfg` to Go's gcfg scanner
//! (how a line splits into name and value), `cloud_config` to the in-tree provider's
//! `CSConfig` (what `[Global]` and its keys mean), `nodes` to the in-tree `--nodes` syntax and
//! to the rule that one autoscaler never sees another's groups.

mod cloud_config;
mod gcfg;
mod nodes;

pub use cloud_config::{
    CloudConfig, CloudConfigReport, load_cloud_config_with_keys, parse_cloud_config,
    parse_cloud_config_report, parse_cloud_config_with_keys,
};
pub use nodes::{
    BoundNodeGroup, ClusterRef, MAX_NODES_LIMIT, NodeGroupSpec, check_client_binding,
    check_distinct_clusters, parse_nodes, parse_nodes_spec,
};

/// Why a configuration source was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The cloud-config file could not be read.
    /// (The cause is part of the message and not a `source`, so a chain printed whole, as the
    /// binary prints its fatal errors, says it once.)
    #[error("cannot read cloud-config {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    /// The cloud-config breaks gcfg's syntax at `line`. `detail` never quotes file content.
    #[error("cloud-config {source_name} line {line}: {detail}")]
    Syntax {
        source_name: String,
        line: usize,
        detail: String,
    },
    /// No `[Global]` section.
    #[error("cloud-config {source_name} has no [{section}] section")]
    MissingSection {
        source_name: String,
        section: String,
    },
    /// A required key is absent or empty; `hint` says why it came out empty, when known.
    #[error("cloud-config {source_name}: [Global] key `{key}` is missing or empty{hint}")]
    MissingKey {
        source_name: String,
        key: String,
        hint: String,
    },
    /// A key on `line` has a value this provider (or gcfg) cannot use.
    #[error("cloud-config {source_name} line {line}: [Global] key `{key}` is invalid: {reason}")]
    InvalidValue {
        source_name: String,
        line: usize,
        key: String,
        reason: String,
    },
    /// A `--nodes` spec could not be parsed.
    #[error("invalid --nodes value {input:?}: {reason}; expected {expected}")]
    NodesSpec {
        input: String,
        reason: String,
        expected: &'static str,
    },
    /// The node groups and the TLS settings together would let one autoscaler see or change
    /// another's groups. `missing` says what to add, each item a sentence.
    #[error(
        "client binding: {}. Each autoscaler must see only its own cluster's node group: one \
         that saw another cluster's group would take that cluster's workers for its own \
         unregistered nodes and delete them after max-node-provision-time, and scale that \
         cluster for its own pods",
        missing.join("; ")
    )]
    ClientBinding { missing: Vec<String> },
    /// Two `--nodes` entries name the same cluster: two groups would scale one cluster, each
    /// taking the other's nodes for its own.
    #[error(
        "--nodes names cluster {cluster} twice (entries {first} and {second}): one node group per \
         cluster"
    )]
    DuplicateCluster {
        cluster: String,
        first: usize,
        second: usize,
    },
}
