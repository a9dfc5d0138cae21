//! The optional node-group RPCs wired to the provider: NodeGroupTemplateNodeInfo (built by
//! [`crate::template`] from the worker offering read at Refresh) and NodeGroupGetOptions
//! (per-cluster overrides from [`crate::options`]).

use crate::options::{OptionOverrides, merged_options, sent_by_release_1_28};
use crate::provider::{Error, Result, Scoped};
use crate::template::{
    TemplateInput, TemplateSettings, build_template_node, encode_node, gpu_from_offering,
};
use cks_proto as pb;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once the 1.28 warning of [`ProviderExtras::get_options`] has been logged (it would
/// otherwise come for every node in every loop).
static WARNED_1_28_OVERRIDES: AtomicBool = AtomicBool::new(false);

/// Template settings and option overrides for every group.
#[derive(Debug, Clone)]
pub struct ProviderExtras {
    /// How template nodes are shaped; `None` answers NodeGroupTemplateNodeInfo with
    /// UNIMPLEMENTED (as a provider without scale-from-zero support does).
    pub template: Option<TemplateSettings>,
    /// Keyed by cluster id or cluster name, as given on the command line.
    pub overrides: HashMap<String, OptionOverrides>,
}

impl Default for ProviderExtras {
    /// Template nodes with the default shape, no option overrides.
    fn default() -> Self {
        ProviderExtras {
            template: Some(TemplateSettings::default()),
            overrides: HashMap::new(),
        }
    }
}

impl ProviderExtras {
    fn overrides_for(&self, scope: &Scoped<'_>, group_id: &str) -> Option<&OptionOverrides> {
        if let Some(o) = self.overrides.get(group_id) {
            return Some(o);
        }
        let name = scope.snapshot(group_id)?.name;
        self.overrides.get(&name)
    }

    /// The template input of a group, from its snapshot and worker offering.
    pub fn template_input(
        &self,
        scope: &Scoped<'_>,
        group_id: &str,
    ) -> std::result::Result<TemplateInput, String> {
        let snap = scope
            .snapshot(group_id)
            .ok_or_else(|| "no CloudStack snapshot yet".to_string())?;
        let offering = scope.worker_offering(group_id).ok_or_else(|| {
            format!(
                "the worker service offering of cluster {:?} has not been read yet (listServiceOfferings)",
                snap.name
            )
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
            copied_labels: scope.sample_labels(group_id).unwrap_or_default(),
            gpu: gpu_from_offering(
                &details,
                offering.gpucount,
                offering.gpucardname.as_deref(),
                offering.vgpuprofilename.as_deref(),
            ),
        })
    }
}

impl ProviderExtras {
    /// Without template nodes (NodeGroupTemplateNodeInfo answers UNIMPLEMENTED) and without
    /// option overrides.
    pub fn without_template() -> Self {
        ProviderExtras {
            template: None,
            overrides: HashMap::new(),
        }
    }

    /// NodeGroupTemplateNodeInfo: the encoded template node (`k8s.io.api.core.v1.Node`), which
    /// the gRPC layer sends in both template fields (1 for releases up to 1.34.1, 2 from 1.34.2).
    ///
    /// Any code but Unimplemented makes the autoscaler abort its whole loop (every group,
    /// scale-down included) for as long as a group has no node to copy; Unimplemented makes
    /// it fall back to a not-ready node of the group or skip only this group (from 1.29; 1.28
    /// takes Unimplemented for an error like any other). So a template that cannot be built is
    /// [`Error::NoTemplate`], with the reason in the message and the log.
    pub fn template_node_info(&self, scope: &Scoped<'_>, group_id: &str) -> Result<Vec<u8>> {
        scope.has_group(group_id)?;
        let built = match &self.template {
            None => Err("this provider is configured without template nodes".to_string()),
            Some(settings) => self.template_input(scope, group_id).and_then(|input| {
                let node = build_template_node(&input, settings).map_err(|e| e.to_string())?;
                let node_bytes = encode_node(&node);
                if node_bytes.is_empty() {
                    return Err("the template node encoded to no bytes".to_string());
                }
                Ok(node_bytes)
            }),
        };
        built.map_err(|reason| {
            tracing::warn!(
                group = group_id,
                reason = %reason,
                "no template node for this node group; answering Unimplemented"
            );
            Error::NoTemplate {
                group: group_id.to_string(),
                reason,
            }
        })
    }

    /// NodeGroupGetOptions: the request's defaults with this group's overrides applied, each
    /// duration in both of its fields (see [`crate::options`]). `Ok(None)`, an answer without
    /// options, is for a 1.28 autoscaler, which then applies its flags: it takes Unimplemented
    /// for an error, and options answered would set its max node provision time to 0.
    pub fn get_options(
        &self,
        scope: &Scoped<'_>,
        request: &pb::NodeGroupAutoscalingOptionsRequest,
    ) -> Result<Option<pb::NodeGroupAutoscalingOptions>> {
        scope.has_group(&request.id)?;
        let overrides = self
            .overrides_for(scope, &request.id)
            .filter(|o| !o.is_empty());
        if sent_by_release_1_28(request) {
            if overrides.is_some() && !WARNED_1_28_OVERRIDES.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    group = %request.id,
                    "a cluster-autoscaler 1.28 asks for options: the --node-group-options \
                     overrides do not apply to it (its client reads no max node provision time, \
                     so any options answered would make it 0); it uses its own flags. Run the \
                     autoscaler release of your Kubernetes minor, 1.29 or later, to use overrides"
                );
            }
            return Ok(None);
        }
        match overrides {
            Some(o) => Ok(Some(merged_options(request.defaults.as_ref(), o))),
            None => Err(Error::NoOptions(
                "no option overrides for this node group: the autoscaler's own flags apply".into(),
            )),
        }
    }
}
