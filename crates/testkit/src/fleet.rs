//! A central provider's fleet for tests: `n` CKS clusters `c0`…, one node group each bound to
//! its own autoscaler's client name (`autoscaler.cN`), as `--nodes 1:10:ID@autoscaler.cN` sets
//! a central provider up.

use crate::{sim_config_with, start_sim};
use cks_autoscaler_provider::config::{ClusterRef, NodeGroupSpec};
use cks_autoscaler_provider::provider::Settings;
use cks_sim::SimHandle;
use cks_sim::scenario::{ClusterSpec, Scenario};

/// A simulator with `clusters` clusters of 1 control node and 3 workers, their ids by group
/// index, and the provider's settings (defaults, then `tweak`) with one group per cluster.
pub async fn fleet_sim(
    clusters: usize,
    tweak: impl FnOnce(&mut Settings),
) -> (SimHandle, Vec<String>, Settings) {
    let names: Vec<String> = (0..clusters).map(|i| format!("c{i}")).collect();
    let sim = start_sim(sim_config_with(|c| {
        c.scenario = Scenario {
            clusters: names.iter().map(|n| ClusterSpec::new(n, 1, 3)).collect(),
            ..Scenario::empty()
        };
    }))
    .await;
    let ids: Vec<String> = names
        .iter()
        .map(|n| sim.cluster_id(n).expect("cluster"))
        .collect();
    let mut settings = Settings::with_groups(
        ids.iter()
            .map(|id| NodeGroupSpec {
                min: 1,
                max: 10,
                cluster: ClusterRef::Id(id.clone()),
            })
            .collect(),
    );
    settings.clients = (0..clusters)
        .map(|i| Some(format!("autoscaler.c{i}")))
        .collect();
    tweak(&mut settings);
    (sim, ids, settings)
}
