//! Whether CloudStack accepts a `scaleKubernetesCluster` request, and what the job will do.
//!
//! Written from CloudStack's behaviour (`validateKubernetesClusterScaleParameters` and the scale
//! worker's own checks), plus, when Alert scaling is on, the seven rules under which a cluster
//! in Alert may be scaled. This is the simulator's own code: it shares nothing with the
//! provider's pre-checks, so tests can catch the two disagreeing.
//!
//! CloudStack runs all of this inside the async job: a refusal is a failed job (code 530) with
//! the text returned here, never a synchronous error.

use super::config::JobFailure;
use super::model::{Cluster, ClusterState, VmRole, VmState, World};

/// CKS's minimum offering for a node.
const MIN_NODE_CPU: u64 = 2;
const MIN_NODE_RAM_MB: u64 = 2048;

/// A parsed `scaleKubernetesCluster` request (parameters already well-formed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScaleRequest {
    pub cluster_id: String,
    pub size: Option<i64>,
    pub node_ids: Option<Vec<String>>,
    pub service_offering_id: Option<String>,
    /// `nodeofferings[i].node` (upper-cased) and `.offering`.
    pub node_offerings: Vec<(String, Option<String>)>,
    pub autoscaling: Option<bool>,
    pub min_size: Option<i64>,
    pub max_size: Option<i64>,
}

impl ScaleRequest {
    /// Only `size`: no offering, no nodeids, no autoscaling setting.
    pub fn is_size_only(&self) -> bool {
        self.size.is_some()
            && self.node_ids.is_none()
            && self.service_offering_id.is_none()
            && self.node_offerings.iter().all(|(_, o)| o.is_none())
            && self.autoscaling.is_none()
    }
}

/// The size part of a scale job.
#[derive(Debug, Clone, PartialEq)]
pub enum SizePlan {
    None,
    /// A cluster in Created: only the record changes.
    Record {
        new_size: u64,
    },
    Up {
        new_size: u64,
        add: u64,
    },
    /// VMs to remove, in removal order.
    Down {
        new_size: u64,
        remove: Vec<String>,
    },
}

/// What an accepted request makes the job do.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePlan {
    /// Node types whose offering changes, with the new offering.
    pub offerings: Vec<(VmRole, String)>,
    /// `serviceofferingid` was passed: the cluster-level offering becomes it.
    pub cluster_offering: Option<String>,
    /// New (enabled, minsize, maxsize) when the autoscaling settings change; the size part is
    /// then skipped, as CloudStack returns right after reconfiguring the autoscaler.
    pub autoscale: Option<(bool, Option<u64>, Option<u64>)>,
    pub size: SizePlan,
}

impl ScalePlan {
    pub fn is_noop(&self) -> bool {
        self.offerings.is_empty() && self.autoscale.is_none() && self.size == SizePlan::None
    }
}

fn role_of_type(t: &str) -> Option<VmRole> {
    match t {
        "CONTROL" => Some(VmRole::Control),
        "WORKER" => Some(VmRole::Worker),
        "ETCD" => Some(VmRole::Etcd),
        _ => None,
    }
}

/// Validates `r` against cluster `c` as CloudStack does at the start of the job.
pub fn validate(w: &World, c: &Cluster, r: &ScaleRequest) -> Result<ScalePlan, String> {
    let name = &c.name;
    let zone = w
        .zone(&c.zone_id)
        .ok_or_else(|| format!("Unable to find zone for Kubernetes cluster : {name}"))?;
    // KubernetesClusterManagerImpl.validateKubernetesClusterScaleParameters, after the access
    // check: `isCommandSupported` is false for scaling an ExternalManaged cluster.
    if c.externally_managed {
        return Err(format!(
            "Scale kubernetes cluster is not supported for an externally managed cluster ({name})"
        ));
    }
    let node_offering_empty =
        r.node_offerings.is_empty() || r.node_offerings.iter().any(|(_, o)| o.is_none());
    if r.service_offering_id.is_none()
        && node_offering_empty
        && r.size.is_none()
        && r.node_ids.is_none()
        && r.autoscaling.is_none()
    {
        return Err(format!(
            "Kubernetes cluster {name} cannot be scaled, either service offering or cluster size or nodeids to be removed or autoscaling must be passed"
        ));
    }
    for (t, _) in &r.node_offerings {
        if t != "DEFAULT" && role_of_type(t).is_none() {
            return Err(format!(
                "Invalid node type {t} for the nodeofferings parameter, valid values are CONTROL, WORKER and ETCD"
            ));
        }
    }

    match c.state {
        ClusterState::Created | ClusterState::Running | ClusterState::Stopped => {}
        ClusterState::Alert if w.settings.alert_scaling => alert_rules(w, c, r)?,
        s => {
            return Err(format!(
                "Kubernetes cluster {name} is in {s} state and can not be scaled"
            ));
        }
    }

    let max = w.settings.max_cluster_size;
    if r.autoscaling == Some(true) {
        if r.size.is_some() || r.node_ids.is_some() {
            return Err("Autoscaling can not be passed along with nodeids or clustersize".into());
        }
        let (Some(min_size), Some(max_size)) = (r.min_size, r.max_size) else {
            return Err("Autoscaling requires minsize and maxsize to be passed".into());
        };
        if min_size < 1 {
            return Err("Minsize must be at least than 1".into());
        }
        if max_size <= min_size {
            return Err("Maxsize must be greater than minsize".into());
        }
        if max_size.saturating_add(c.control_count as i64) > max as i64 {
            return Err(format!(
                "Maximum cluster size can not exceed {max}. Please contact your administrator"
            ));
        }
    }

    let offering_for_type = |t: &str| {
        r.node_offerings
            .iter()
            .find(|(k, _)| k == t)
            .and_then(|(_, o)| o.clone())
    };
    let worker_offering = offering_for_type("WORKER");
    if let Some(ids) = &r.node_ids {
        if r.size.is_some() || r.service_offering_id.is_some() || worker_offering.is_some() {
            return Err(
                "nodeids can not be passed along with clustersize or service offering".into(),
            );
        }
        let mut unique: Vec<&String> = ids.iter().collect();
        unique.sort();
        unique.dedup();
        let found: Vec<_> = unique.iter().filter_map(|id| c.vm(id)).collect();
        if found.len() != ids.len() {
            return Err("Invalid node ids".into());
        }
        let control = found.iter().filter(|v| v.role == VmRole::Control).count() as u64;
        if control >= c.control_count {
            return Err("Can not remove all control nodes from a cluster".into());
        }
        if found.len() as u64 - control >= c.size {
            return Err("Can not remove all nodes from a cluster".into());
        }
    }

    let mut offerings = Vec::new();
    for (t, role) in [
        ("CONTROL", VmRole::Control),
        ("ETCD", VmRole::Etcd),
        ("WORKER", VmRole::Worker),
    ] {
        let Some(new_id) = offering_for_type(t).or_else(|| r.service_offering_id.clone()) else {
            continue;
        };
        let Some(new) = w.offering(&new_id) else {
            return Err(format!("Failed to find service offering ID: {new_id}"));
        };
        if new.customized {
            return Err(format!(
                "Custom service offerings are not supported for Kubernetes clusters. Kubernetes cluster : {name}, service offering : {}",
                new.name
            ));
        }
        if new.cpu < MIN_NODE_CPU || new.memory < MIN_NODE_RAM_MB {
            return Err(format!(
                "Kubernetes cluster : {name} cannot be scaled with service offering : {}, Kubernetes cluster template(CoreOS) needs minimum {MIN_NODE_CPU} vCPUs and {MIN_NODE_RAM_MB} MB RAM",
                new.name
            ));
        }
        let existing_id = c.offering_for(role).to_string();
        if let Some(existing) = w.offering(&existing_id)
            && c.state == ClusterState::Running
            && (new.memory < existing.memory || new.cpu * new.speed < existing.cpu * existing.speed)
        {
            return Err(format!(
                "Kubernetes cluster cannot be scaled down for service offering. Service offering : {} offers lesser resources as compared to service offering : {} of Kubernetes cluster : {name}",
                new.name, existing.name
            ));
        }
        if new_id != c.existing_offering_for(role) {
            offerings.push((role, new_id));
        }
    }

    if w.settings.size_default_offering && r.is_size_only() && c.state != ClusterState::Alert {
        // 4.21's offering map for a request naming no offering: the cluster's own, compared
        // by the worker with the offering the first VM of each type runs
        // (`getExistingOfferingIdForNodeType`); a type that differs is "scaled" to it.
        for role in [VmRole::Control, VmRole::Etcd, VmRole::Worker] {
            if c.vms.iter().any(|v| v.role == role)
                && c.existing_offering_for(role) != c.offering_id
            {
                offerings.push((role, c.offering_id.clone()));
            }
        }
    }

    if let Some(size) = r.size
        && size != c.size as i64
    {
        if c.state == ClusterState::Stopped {
            return Err(format!(
                "Kubernetes cluster : {name} is in {} state",
                c.state
            ));
        }
        if size < 1 {
            return Err(format!(
                "Kubernetes cluster : {name} cannot be scaled for size, {size}"
            ));
        }
        if size.saturating_add(c.control_count as i64) > max as i64 {
            return Err(format!(
                "Maximum cluster size can not exceed {max}. Please contact your administrator"
            ));
        }
    }
    let _ = zone;

    // In Alert the job gets no offerings: it only changes the size (the rules above already
    // refused any real change).
    if c.state == ClusterState::Alert {
        offerings.clear();
    }

    let autoscale = r.autoscaling.and_then(|enabled| {
        let changed = enabled != c.autoscaling
            || r.min_size
                .is_some_and(|m| u64::try_from(m).ok() != c.min_size)
            || r.max_size
                .is_some_and(|m| u64::try_from(m).ok() != c.max_size);
        changed.then(|| {
            if enabled {
                (
                    true,
                    r.min_size.map(|m| m as u64),
                    r.max_size.map(|m| m as u64),
                )
            } else {
                (false, None, None)
            }
        })
    });

    let size = if autoscale.is_some() {
        SizePlan::None
    } else if let Some(ids) = &r.node_ids {
        // CloudStack leaves external nodes out of the removal but still counts them off the size.
        let new_size = c.size.saturating_sub(ids.len() as u64);
        let remove: Vec<String> = c
            .vms
            .iter()
            .rev()
            .filter(|v| ids.contains(&v.id) && v.role != VmRole::External)
            .map(|v| v.id.clone())
            .collect();
        SizePlan::Down { new_size, remove }
    } else {
        match r.size {
            Some(s) if s as u64 == c.size => SizePlan::None,
            Some(s) if c.state == ClusterState::Created => SizePlan::Record { new_size: s as u64 },
            Some(s) if (s as u64) > c.size => SizePlan::Up {
                new_size: s as u64,
                add: s as u64 - c.size,
            },
            Some(s) => SizePlan::Down {
                new_size: s as u64,
                remove: pick_for_removal(w, c, c.size - s as u64),
            },
            None => SizePlan::None,
        }
    };
    Ok(ScalePlan {
        offerings,
        cluster_offering: r.service_offering_id.clone(),
        autoscale,
        size,
    })
}

/// Workers removed by a size decrease: with Alert scaling on, those whose VMs are down first,
/// then the newest; on an older CloudStack, the newest.
pub fn pick_for_removal(w: &World, c: &Cluster, count: u64) -> Vec<String> {
    let workers = c.vms.iter().rev().filter(|v| v.role == VmRole::Worker);
    let ordered: Vec<&super::model::Vm> = if w.settings.alert_scaling {
        workers
            .clone()
            .filter(|v| v.state.is_down())
            .chain(workers.filter(|v| !v.state.is_down()))
            .collect()
    } else {
        workers.collect()
    };
    ordered
        .into_iter()
        .take(count as usize)
        .map(|v| v.id.clone())
        .collect()
}

/// The seven rules for a cluster in Alert (Alert scaling on).
fn alert_rules(w: &World, c: &Cluster, r: &ScaleRequest) -> Result<(), String> {
    let name = &c.name;
    let only = "only its size can be changed or worker nodes removed";

    // 1. No change of offering or of the autoscaling settings.
    let mut offering_change = r
        .service_offering_id
        .as_ref()
        .is_some_and(|o| o != &c.offering_id);
    for (t, o) in &r.node_offerings {
        if let (Some(o), Some(role)) = (o, role_of_type(t)) {
            offering_change |= o != c.offering_for(role);
        }
    }
    if offering_change {
        return Err(format!(
            "Kubernetes cluster {name} is in Alert state and its service offering can not be changed; {only}"
        ));
    }
    let autoscaling_change = r.autoscaling.is_some_and(|a| a != c.autoscaling)
        || r.min_size
            .is_some_and(|m| u64::try_from(m).ok() != c.min_size)
        || r.max_size
            .is_some_and(|m| u64::try_from(m).ok() != c.max_size);
    if autoscaling_change {
        return Err(format!(
            "Kubernetes cluster {name} is in Alert state and its autoscaling settings can not be changed; {only}"
        ));
    }

    // 2. Something must change.
    let size_change = r.size.is_some_and(|s| s != c.size as i64);
    let node_change = r.node_ids.as_ref().is_some_and(|ids| !ids.is_empty());
    if !size_change && !node_change {
        return Err(format!(
            "Kubernetes cluster {name} is in Alert state and the request changes neither its size nor its nodes"
        ));
    }

    // 3. Only worker nodes may be removed.
    if let Some(ids) = &r.node_ids {
        let others: Vec<String> = c
            .vms
            .iter()
            .filter(|v| ids.contains(&v.id) && v.role != VmRole::Worker)
            .map(|v| format!("{} ({} node, VM {})", v.name, v.role.as_str(), v.id))
            .collect();
        if !others.is_empty() {
            return Err(format!(
                "Kubernetes cluster {name} is in Alert state and only worker nodes can be removed; not worker nodes: {}",
                others.join(", ")
            ));
        }
    }

    // 4. The first control node must run.
    match c.first_control() {
        Some(v) if v.state == VmState::Running => {}
        Some(v) => {
            return Err(format!(
                "Kubernetes cluster {name} is in Alert state and can not be scaled while its first control node VM {} ({}) is {}",
                v.name, v.id, v.state
            ));
        }
        None => {
            return Err(format!(
                "Kubernetes cluster {name} is in Alert state and can not be scaled as it has no control node VM"
            ));
        }
    }

    // 5. As many VMs as nodes.
    if c.vms.len() as u64 != c.total_nodes() {
        return Err(format!(
            "Kubernetes cluster {name} is in Alert state and can not be scaled while it has {} VMs for {} nodes",
            c.vms.len(),
            c.total_nodes()
        ));
    }

    // 6. No control or etcd VM down.
    let down: Vec<String> = c
        .vms
        .iter()
        .filter(|v| matches!(v.role, VmRole::Control | VmRole::Etcd) && v.state.is_down())
        .map(|v| format!("{} ({})", v.name, v.state))
        .collect();
    if !down.is_empty() {
        return Err(format!(
            "Kubernetes cluster {name} is in Alert state and can not be scaled while control or etcd node VMs are down: {}; recover the control plane first",
            down.join(", ")
        ));
    }

    // 7. A worker VM must be down: otherwise scaling will not fix what put it in Alert.
    if !c
        .vms
        .iter()
        .any(|v| v.role == VmRole::Worker && v.state.is_down())
    {
        return Err(format!(
            "Kubernetes cluster {name} is in Alert state and can not be scaled as no worker node VM is down; scaling would not fix the cause of the Alert state"
        ));
    }
    let _ = w;
    Ok(())
}

/// The scale worker's checks that run before the cluster moves to Scaling. A failure here
/// leaves the cluster state as it was.
pub fn pre_transition_checks(
    w: &World,
    c: &Cluster,
    plan: &ScalePlan,
    failure: JobFailure,
) -> Result<(), String> {
    let name = &c.name;
    let rows_short = (c.vms.len() as u64) < c.total_nodes();
    if !plan.offerings.is_empty() && c.state != ClusterState::Created {
        if rows_short {
            return Err(format!(
                "Scaling Kubernetes cluster : {name} failed, it is in unstable state as not enough existing VM instances found!"
            ));
        }
        let live_scaling = matches!(w.hypervisor.as_str(), "XenServer" | "VMware" | "Simulator");
        if !live_scaling && c.vms.iter().any(|v| v.state == VmState::Running) {
            return Err(format!(
                "Scaling Kubernetes cluster : {name} failed, scaling Kubernetes cluster with running VMs on hypervisor {} is not supported!",
                w.hypervisor
            ));
        }
    }
    if matches!(plan.size, SizePlan::Up { .. } | SizePlan::Down { .. }) {
        if let SizePlan::Up { .. } = plan.size
            && failure == JobFailure::Capacity
        {
            let zone = w.zone(&c.zone_id).map(|z| z.name.as_str()).unwrap_or("");
            return Err(format!(
                "Scaling failed for Kubernetes cluster : {name} in zone : {zone}, insufficient capacity"
            ));
        }
        if rows_short {
            return Err(format!(
                "Scaling failed for Kubernetes cluster : {name}, it is in unstable state as not enough existing VM instances found"
            ));
        }
    }
    Ok(())
}
