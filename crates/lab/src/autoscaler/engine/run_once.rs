//! The loop driver: [`MockAutoscaler::run_once`] (one `StaticAutoscaler.RunOnce`, a crash of
//! the real process ending it), the loops around it, and the loop's body, which calls the
//! phases of the sibling files in the real order. Follows `core/static_autoscaler.go`
//! (`RunOnce`, `cleanUpIfRequired`) at cluster-autoscaler-1.33.0 and 1.35.0 (1.36.0 where it
//! differs).

use std::time::Duration;

use tokio::time::Instant;

use super::MockAutoscaler;
use crate::autoscaler::background::lock;
use crate::autoscaler::timeline::{Decision, EventKind, LoopSummary};

impl MockAutoscaler {
    /// Runs `n` loops, `loop_interval` apart, and returns their summaries.
    pub async fn run_loops(&mut self, n: usize) -> Vec<LoopSummary> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if i > 0 {
                tokio::time::sleep(self.config.loop_interval).await;
            }
            out.push(self.run_once().await);
        }
        out
    }

    /// Runs loops `loop_interval` apart until `done` holds after a loop, for at most
    /// `max_wait`. Returns the number of loops run; the error names the last loop seen.
    pub async fn run_until(
        &mut self,
        max_wait: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> anyhow::Result<u64> {
        let give_up = Instant::now() + max_wait;
        let mut loops = 0;
        loop {
            self.run_once().await;
            loops += 1;
            if done(self) {
                return Ok(loops);
            }
            if Instant::now() + self.config.loop_interval > give_up {
                let last = self
                    .last_loop()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                anyhow::bail!(
                    "condition not met after {loops} loops in {max_wait:?}; last: {last}"
                );
            }
            tokio::time::sleep(self.config.loop_interval).await;
        }
    }

    /// One autoscaler loop. Failures are part of the result (and the timeline), not errors.
    /// An answer the real autoscaler would crash on (see the
    /// [module docs](crate::autoscaler)) ends the loop where it comes, and the crash is the
    /// loop's abort reason.
    pub async fn run_once(&mut self) -> LoopSummary {
        self.client.deadline = self.config.call_deadline;
        let wire = self.config.wire_generation();
        if self.client.generation() != wire {
            self.client.set_generation(wire);
        }
        self.rec.wire = wire;
        self.rec.loop_no += 1;
        self.bg.outbox.set_loop(self.rec.loop_no);
        let started = Instant::now();
        let first_event = self.rec.timeline.events.len();
        self.rec.record(EventKind::LoopStarted);
        let crashed = self.crash.signal.clone();
        let outcome = tokio::select! {
            biased;
            () = crashed.notified() => Ok(()),
            outcome = self.loop_body() => outcome,
        };
        let outcome = match self.crash.reason.take() {
            Some(why) => Err(format!("the autoscaler process crashed: {why}")),
            None => outcome,
        };
        if let Err(reason) = outcome {
            self.rec.record(EventKind::LoopAborted { reason });
        }
        let duration = started.elapsed();
        self.rec.record(EventKind::LoopFinished { duration });
        let summary = LoopSummary::from_events(
            self.rec.loop_no,
            self.rec.since_start(started),
            duration,
            &self.rec.timeline.events[first_event..],
        );
        self.rec.timeline.loops.push(summary.clone());
        summary
    }

    async fn loop_body(&mut self) -> Result<(), String> {
        let now = Instant::now();
        // A crash a background task ran into, collected between loops (`settle_deletions`):
        // this loop only reports it (`run_once`).
        if self.crash.reason.is_some() {
            return Ok(());
        }
        if !self.bg.started {
            self.start_cluster_state().await;
        }
        let listed = self.nodes.list_nodes().await;
        if !self.state.initialized {
            // `cleanUpIfRequired`, once per process, before anything else of the first loop
            // (`core/static_autoscaler.go`, cluster-autoscaler-1.33.0 … 1.36.0): the
            // ToBeDeleted taints an earlier process left are removed from the nodes of the
            // groups `filterNodesFromSelectedGroups` finds, asking NodeGroupForNode per node
            // (before any Refresh; the answers stay cached until it). A node whose
            // NodeGroupForNode fails or answers "" keeps its taint.
            self.state.initialized = true;
            if let Ok(nodes) = &listed {
                let mut cleaned = Vec::new();
                for node in nodes {
                    let group = self.client.node_group_for_node(node, &mut self.rec).await;
                    if matches!(group, Ok(Some(_)))
                        && self.state.tainted.remove(&node.cache_key()).is_some()
                    {
                        cleaned.push(node.name.clone());
                    }
                }
                if !cleaned.is_empty() {
                    self.rec
                        .record(EventKind::Decided(Decision::ToBeDeletedTaintsCleaned {
                            nodes: cleaned,
                        }));
                }
            }
        }
        let mut nodes = listed.map_err(|e| format!("listing Kubernetes nodes failed: {e:#}"))?;
        self.filter_gpu_unready(&mut nodes).await;
        self.state.track_nodes(&nodes, now);
        // The scale-down actuation status is read before the cloud provider refreshes.
        self.collect_background();
        if self.crash.reason.is_some() {
            // A background task crashed the process (`run_once` reports why).
            return Ok(());
        }

        self.client
            .refresh(&mut self.rec)
            .await
            .map_err(|e| format!("Refresh failed: {e}"))?;
        let groups = self.client.node_groups(&mut self.rec).await;
        *lock(&self.bg.known_groups) = groups.iter().map(|g| g.id.clone()).collect();

        // The template pass looks up every node's group first, then builds a template for
        // each group; a template error other than Unimplemented aborts the loop.
        let mut template_group = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let answer = self.client.node_group_for_node(node, &mut self.rec).await;
            template_group.push(answer.ok().flatten());
        }
        let templates = self
            .build_templates(&nodes, &template_group, &groups)
            .await?;

        // clusterstate `UpdateNodes`: target sizes (any error aborts the loop), instances
        // through the cache, readiness, unregistered instances.
        let mut targets = Vec::with_capacity(groups.len());
        for g in &groups {
            match self.client.target_size(&g.id, &mut self.rec).await {
                Ok(t) => targets.push(t),
                Err(e) => {
                    // A failed cluster-state update resets the scale-down timers.
                    self.state.unneeded_since.clear();
                    return Err(format!("NodeGroupTargetSize({}) failed: {e}", g.id));
                }
            }
        }
        let instances = match self.cloud_provider_node_instances(&groups).await {
            Ok(i) => i,
            Err(e) => {
                self.state.unneeded_since.clear();
                return Err(e);
            }
        };
        let (node_group, startup) = self.readiness_lookups(&nodes).await;
        let unregistered = self.state.track_unregistered(&nodes, &instances, now);
        let unregistered_group = self.classify_unregistered(&unregistered, now).await;

        let mut snap = self.build_snapshot(
            now,
            nodes,
            (&node_group, &startup),
            (groups, targets, instances),
            unregistered,
            &unregistered_group,
        );
        snap.templates = templates;
        self.observe(&snap);
        self.update_scale_requests(&snap).await;
        self.handle_creation_errors(&snap).await;
        self.update_incorrect_sizes(&snap);
        self.state.last_sizes = snap
            .groups
            .iter()
            .map(|v| (v.group.id.clone(), (v.target, v.provisioned())))
            .collect();

        self.remove_old_unregistered(&snap).await;
        if self.cluster_unhealthy(&snap) {
            self.state.unneeded_since.clear();
            return Ok(());
        }
        self.delete_created_with_errors(&snap).await;
        if self.fix_node_group_sizes(&snap).await? {
            self.rec
                .record(EventKind::Decided(Decision::SkipRestOfLoop {
                    reason: "a node group size was fixed".into(),
                }));
            return Ok(());
        }
        let upcoming = self.upcoming_nodes(&snap);
        let (needed, pending) = self.resolve_demand(&snap);
        self.scale_up(&snap, &upcoming, pending).await;
        self.scale_down(&snap, needed).await;
        Ok(())
    }
}
