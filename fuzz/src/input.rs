//! Decoding fuzzer bytes into a cluster, a scale request and the Alert capability.
//!
//! The shapes lean towards what CKS produces (CKS-style names, small counts, known states) so
//! that the fuzzer spends its time near the rules' edges, while still reaching arbitrary names,
//! unknown states and extreme counts. VM ids are unique, as CloudStack's are.

use crate::decision::{CLUSTER_STATES, TRICKY_NAMES, VM_STATES};
use arbitrary::Arbitrary;
use cks_domain::cluster::{ClusterInput, ClusterState, VmInput, VmState};
use cks_domain::rules::{AlertScaling, ScaleRequest};

/// One fuzz case for the scaling decision.
#[derive(Debug, Arbitrary)]
pub struct ScaleCase {
    name: Name,
    state: State,
    size: Count,
    control_nodes: Count,
    etcd_nodes: Count,
    vms: Vec<Vm>,
    request: Request,
    alert: Alert,
}

#[derive(Debug, Arbitrary)]
enum Name {
    /// `<cluster>-control-<hex>`, "control" in the case the byte picks.
    Control(u8, u32),
    /// `<cluster>-node-<hex>`.
    Worker(u32),
    /// `<cluster>-etcd-1-<hex>`.
    Etcd(u32),
    /// One of [`TRICKY_NAMES`].
    Tricky(u8),
    Raw(String),
}

#[derive(Debug, Arbitrary)]
enum State {
    Known(u8),
    Other(String),
}

#[derive(Debug, Arbitrary)]
enum Count {
    Small(u8),
    Any(u32),
}

#[derive(Debug, Arbitrary)]
struct Vm {
    name: Name,
    state: State,
    external: bool,
    etcd: bool,
}

#[derive(Debug, Arbitrary)]
enum Request {
    /// A size relative to the current one (wrapping), so sizes near it are common.
    ResizeBy(i8),
    Resize(u32),
    /// Indices into the cluster's VMs; an index past the end names an unknown VM.
    Remove(Vec<u8>),
}

#[derive(Debug, Arbitrary)]
enum Alert {
    Unknown,
    Supported,
    Unsupported(String),
}

impl Count {
    fn value(&self) -> u32 {
        match self {
            Count::Small(n) => u32::from(*n % 7),
            Count::Any(n) => *n,
        }
    }
}

impl Name {
    fn render(&self, cluster: &str) -> String {
        match self {
            Name::Control(case, hex) => {
                let control = ["control", "CONTROL", "Control"][usize::from(*case) % 3];
                format!("{cluster}-{control}-{hex:x}")
            }
            Name::Worker(hex) => format!("{cluster}-node-{hex:x}"),
            Name::Etcd(hex) => format!("{cluster}-etcd-1-{hex:x}"),
            Name::Tricky(i) => TRICKY_NAMES[usize::from(*i) % TRICKY_NAMES.len()].to_string(),
            Name::Raw(s) => s.clone(),
        }
    }
}

impl State {
    fn render<'a>(&'a self, known: &[&'a str]) -> &'a str {
        match self {
            State::Known(i) => known[usize::from(*i) % known.len()],
            State::Other(s) => s,
        }
    }
}

impl ScaleCase {
    /// The cluster, request and Alert capability this case describes.
    pub fn build(&self) -> (ClusterInput, ScaleRequest, AlertScaling) {
        let name = match &self.name {
            Name::Raw(s) => s.clone(),
            _ => "k8s".to_string(),
        };
        let vms: Vec<VmInput> = self
            .vms
            .iter()
            .enumerate()
            .map(|(i, vm)| VmInput {
                id: format!("vm-{i}"),
                name: vm.name.render(&name),
                state: VmState::parse(vm.state.render(&VM_STATES)),
                is_external: vm.external,
                is_etcd: vm.etcd,
            })
            .collect();
        let size = self.size.value();
        let request = match &self.request {
            Request::ResizeBy(d) => ScaleRequest::Resize {
                new_size: size.wrapping_add_signed(i32::from(*d)),
            },
            Request::Resize(n) => ScaleRequest::Resize { new_size: *n },
            Request::Remove(indices) => ScaleRequest::RemoveNodes {
                vm_ids: indices
                    .iter()
                    .map(|&i| match vms.get(usize::from(i)) {
                        Some(vm) => vm.id.clone(),
                        None => format!("unknown-{i}"),
                    })
                    .collect(),
            },
        };
        let alert = match &self.alert {
            Alert::Unknown => AlertScaling::Unknown,
            Alert::Supported => AlertScaling::Supported,
            Alert::Unsupported(text) => AlertScaling::Unsupported {
                cloudstack_error: text.clone(),
            },
        };
        let input = ClusterInput {
            id: format!("{name}-id"),
            state: ClusterState::parse(self.state.render(&CLUSTER_STATES)),
            name,
            size,
            min_size: None,
            max_size: None,
            autoscaling_enabled: false,
            control_nodes: self.control_nodes.value(),
            etcd_nodes: self.etcd_nodes.value(),
            service_offering: None,
            worker_offering: None,
            zone_id: "zone-1".to_string(),
            zone_name: "zone1".to_string(),
            externally_managed: false,
            vms,
        };
        (input, request, alert)
    }
}
