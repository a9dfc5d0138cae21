//! The optional node-group RPCs wired to the provider: NodeGroupTemplateNodeInfo (built by
//! [`crate::template`] from the worker offering read at Refresh) and NodeGroupGetOptions
//! (per-cluster overrides from [`crate::options`]).

use crate::grpc::Extras;
use crate::options::{OptionOverrides, merged_options};
use crate::pb;
use crate::provider::Provider;
use crate::template::{
    TemplateInput, TemplateSettings, build_template_node, encode_node, gpu_from_offering,
};
use std::collections::HashMap;
use tonic::Status;

/// Template settings and option overrides for every group.
#[derive(Debug, Clone, Default)]
pub struct ProviderExtras {
    pub template: TemplateSettings,
    /// Keyed by cluster id or cluster name, as given on the command line.
    pub overrides: HashMap<String, OptionOverrides>,
}

impl ProviderExtras {
    fn overrides_for(&self, provider: &Provider, group_id: &str) -> Option<&OptionOverrides> {
        if let Some(o) = self.overrides.get(group_id) {
            return Some(o);
        }
        let name = provider.snapshot(group_id)?.name;
        self.overrides.get(&name)
    }

    /// The template input of a group, from its snapshot and worker offering.
    pub fn template_input(
        &self,
        provider: &Provider,
        group_id: &str,
    ) -> Result<TemplateInput, Status> {
        let snap = provider.snapshot(group_id).ok_or_else(|| {
            Status::unavailable(format!("node group {group_id}: no CloudStack snapshot yet"))
        })?;
        let offering = provider.worker_offering(group_id).ok_or_else(|| {
            Status::unavailable(format!(
                "node group {group_id}: the worker service offering of cluster {:?} has not been read yet (listServiceOfferings)",
                snap.name
            ))
        })?;
        let details = offering.serviceofferingdetails.clone().unwrap_or_default();
        Ok(TemplateInput {
            group_id: group_id.to_string(),
            cluster_name: snap.name.clone(),
            offering_name: offering.name.clone(),
            cpus: offering.cpunumber.unwrap_or(0),
            memory_mib: offering.memory.unwrap_or(0),
            root_disk_gib: offering.rootdisksize.filter(|g| *g > 0),
            zone_name: snap.zone_name.clone(),
            arch: "amd64".to_string(),
            copied_labels: provider.sample_labels(group_id).unwrap_or_default(),
            gpu: gpu_from_offering(
                &details,
                offering.gpucount,
                offering.gpucardname.as_deref(),
                offering.vgpuprofilename.as_deref(),
            ),
        })
    }
}

impl Extras for ProviderExtras {
    fn template_node_info(
        &self,
        provider: &Provider,
        group_id: &str,
    ) -> Result<pb::NodeGroupTemplateNodeInfoResponse, Status> {
        // Any code but Unimplemented makes the autoscaler abort its whole loop (every group,
        // scale-down included) for as long as a group has no node to copy; Unimplemented makes
        // it fall back to a not-ready node of the group or skip only this group. So a template
        // that cannot be built is Unimplemented, with the reason in the message and the log.
        let built = self.template_input(provider, group_id).and_then(|input| {
            let node = build_template_node(&input, &self.template)
                .map_err(|e| Status::failed_precondition(e.to_string()))?;
            let node_bytes = encode_node(&node);
            if node_bytes.is_empty() {
                return Err(Status::internal("the template node encoded to no bytes"));
            }
            Ok(node_bytes)
        });
        match built {
            Ok(node_bytes) => Ok(pb::NodeGroupTemplateNodeInfoResponse {
                node_bytes,
                resource_slice_bytes: Vec::new(),
            }),
            Err(e) => {
                tracing::warn!(
                    group = group_id,
                    reason = e.message(),
                    "no template node for this node group; answering Unimplemented"
                );
                Err(Status::unimplemented(format!(
                    "no template node for node group {group_id}: {}",
                    e.message()
                )))
            }
        }
    }

    fn get_options(
        &self,
        provider: &Provider,
        request: &pb::NodeGroupAutoscalingOptionsRequest,
    ) -> Result<pb::NodeGroupAutoscalingOptionsResponse, Status> {
        provider.group(&request.id)?;
        match self.overrides_for(provider, &request.id) {
            Some(o) if !o.is_empty() => Ok(pb::NodeGroupAutoscalingOptionsResponse {
                node_group_autoscaling_options: Some(merged_options(request.defaults.as_ref(), o)),
            }),
            _ => Err(Status::unimplemented(
                "no option overrides for this node group: the autoscaler's own flags apply",
            )),
        }
    }
}
