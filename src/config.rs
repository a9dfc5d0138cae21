//! Configuration sources: the CloudStack cloud-config (ini) and `--nodes` specs.
//! (Placeholder types; the full parser lands separately.)

/// A `--nodes MIN:MAX:CLUSTER` spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroupSpec {
    pub min: u32,
    pub max: u32,
    pub cluster: ClusterRef,
}

/// How a `--nodes` spec names its CKS cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterRef {
    Id(String),
    Name(String),
}
