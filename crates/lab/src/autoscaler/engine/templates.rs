//! The template pass: every node group's node template for this loop, from a Ready node, the
//! remembered one, NodeGroupTemplateNodeInfo or a NotReady node, and the crash of a release
//! that finds no template node in the answer. Follows
//! `processors/nodeinfosprovider/mixed_nodeinfos_processor.go`
//! (`MixedTemplateNodeInfoProvider.Process`) at cluster-autoscaler-1.33.0 and 1.35.0.

use std::collections::HashMap;

use super::{MockAutoscaler, Templates};
use crate::autoscaler::nodes::KubeNode;
use crate::autoscaler::pods::{NodeTemplate, TemplateSource};
use crate::autoscaler::timeline::{EventKind, Observation};
use crate::pb;

impl MockAutoscaler {
    /// `MixedTemplateNodeInfoProvider.Process`: a group's template is its first good node
    /// (Ready, not being deleted; also remembered), else the remembered one, else
    /// `NodeGroupTemplateNodeInfo`, else, as a last resort, a NotReady node of the group. An
    /// Unimplemented answer leaves the group to that last resort; any other error, or bytes
    /// that are no Node, fails the whole pass and so the loop.
    pub(super) async fn build_templates(
        &mut self,
        nodes: &[KubeNode],
        node_group: &[Option<pb::NodeGroup>],
        groups: &[pb::NodeGroup],
    ) -> Result<Templates, String> {
        let good =
            |i: usize| nodes[i].ready && !self.state.tainted.contains_key(&nodes[i].cache_key());
        let mut found: HashMap<String, NodeTemplate> = HashMap::new();
        for (i, node) in nodes.iter().enumerate() {
            let Some(group) = &node_group[i] else {
                continue;
            };
            if !good(i) || found.contains_key(&group.id) {
                continue;
            }
            let template =
                NodeTemplate::from_node(node, TemplateSource::ReadyNode(node.name.clone()));
            found.insert(group.id.clone(), template);
        }
        for (id, t) in &found {
            self.state.node_info_cache.insert(id.clone(), t.clone());
        }

        let mut unimplemented: HashMap<String, String> = HashMap::new();
        for g in groups {
            if found.contains_key(&g.id) {
                continue;
            }
            if let Some(cached) = self.state.node_info_cache.get(&g.id) {
                let mut t = cached.clone();
                if let TemplateSource::ReadyNode(name) = &cached.source {
                    t.source = TemplateSource::Cached(name.clone());
                }
                found.insert(g.id.clone(), t);
                continue;
            }
            match self.client.template_node_info(&g.id, &mut self.rec).await {
                Ok(bytes) if bytes.is_empty() => {
                    // The field the release reads is unset: its `NodeGroup.TemplateNodeInfo`
                    // returns (nil, nil), and the core dereferences the nil NodeInfo
                    // (`core/utils/utils.go` `GetNodeInfoFromTemplate` up to 1.32,
                    // `simulator/node_info_utils.go` `SanitizedTemplateNodeInfoFromNodeGroup`
                    // from 1.33, called by `MixedTemplateNodeInfoProvider.Process`).
                    let why = format!(
                        "cluster-autoscaler {} finds no template node in the \
                         NodeGroupTemplateNodeInfo answer for {} ({} unset) and dereferences \
                         the nil NodeInfo: nil pointer dereference",
                        self.client.generation(),
                        g.id,
                        self.client.generation().template_field()
                    );
                    return self.crash(why).await;
                }
                Ok(bytes) => {
                    let t = NodeTemplate::decode(&bytes).map_err(|e| {
                        format!(
                            "building node templates failed: NodeGroupTemplateNodeInfo({}): {e}",
                            g.id
                        )
                    })?;
                    found.insert(g.id.clone(), t);
                }
                Err(e) if e.code == tonic::Code::Unimplemented => {
                    unimplemented.insert(
                        g.id.clone(),
                        format!("NodeGroupTemplateNodeInfo answered {e}"),
                    );
                }
                Err(e) => {
                    return Err(format!(
                        "building node templates failed: NodeGroupTemplateNodeInfo({}) failed: {e}",
                        g.id
                    ));
                }
            }
        }
        self.state
            .node_info_cache
            .retain(|id, _| groups.iter().any(|g| g.id == *id));

        for (i, node) in nodes.iter().enumerate() {
            let Some(group) = &node_group[i] else {
                continue;
            };
            if good(i) || found.contains_key(&group.id) {
                continue;
            }
            let template =
                NodeTemplate::from_node(node, TemplateSource::UnreadyNode(node.name.clone()));
            found.insert(group.id.clone(), template);
        }

        let mut out = Templates::new();
        for g in groups {
            let template = match found.remove(&g.id) {
                Some(t) => Ok(t),
                None => Err(format!(
                    "no Ready node, no node seen Ready since the autoscaler started, {}, and no NotReady node to fall back on",
                    unimplemented
                        .remove(&g.id)
                        .unwrap_or_else(|| "no NodeGroupTemplateNodeInfo answer".into())
                )),
            };
            self.rec
                .record(EventKind::Observed(Observation::NodeTemplate {
                    group: g.id.clone(),
                    template: template.clone(),
                }));
            out.insert(g.id.clone(), template);
        }
        Ok(out)
    }
}
