//! One loop in brief: the [`LoopSummary`] built from a loop's events, which the demo prints
//! per loop and tests read (targets, call counts, whether `fixNodeGroupSize` acted).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::{
    Call, Decision, Event, EventKind, GroupObservation, InstanceCounts, Observation, Rpc, secs,
};

/// One loop in brief: what the demo prints per loop.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopSummary {
    /// Loop number (1-based).
    pub loop_no: u64,
    /// When it began, since the autoscaler was created.
    pub at: Duration,
    /// How long it took.
    pub duration: Duration,
    /// Node groups as observed (empty if the loop stopped before).
    pub groups: Vec<GroupObservation>,
    /// Managed Ready nodes.
    pub ready: usize,
    /// Managed NotReady nodes.
    pub not_ready: usize,
    /// Nodes no group claims.
    pub unmanaged: usize,
    /// Every call of the loop, then the background calls this loop collected.
    pub calls: Vec<Call>,
    /// Every decision of the loop.
    pub decisions: Vec<Decision>,
    /// Why the loop stopped early, if it did.
    pub aborted: Option<String>,
}

impl LoopSummary {
    pub(crate) fn from_events(
        loop_no: u64,
        at: Duration,
        duration: Duration,
        events: &[Event],
    ) -> Self {
        let mut s = Self {
            loop_no,
            at,
            duration,
            groups: Vec::new(),
            ready: 0,
            not_ready: 0,
            unmanaged: 0,
            calls: Vec::new(),
            decisions: Vec::new(),
            aborted: None,
        };
        let mut background = Vec::new();
        for e in events {
            match &e.kind {
                EventKind::Call(c) if e.loop_no == loop_no => s.calls.push(c.clone()),
                EventKind::BackgroundCall(c) => background.push(c.clone()),
                EventKind::Decided(d) => s.decisions.push(d.clone()),
                EventKind::Observed(Observation::Group(g)) => s.groups.push(g.clone()),
                EventKind::Observed(Observation::Nodes {
                    ready,
                    not_ready,
                    unmanaged,
                }) => {
                    s.ready = *ready;
                    s.not_ready = *not_ready;
                    s.unmanaged = *unmanaged;
                }
                EventKind::LoopAborted { reason } => s.aborted = Some(reason.clone()),
                _ => {}
            }
        }
        s.calls.extend(background);
        s
    }

    /// Target size of `group` seen in this loop.
    pub fn target(&self, group: &str) -> Option<i32> {
        self.groups.iter().find(|g| g.id == group).map(|g| g.target)
    }

    /// Number of calls of `rpc` in this loop.
    pub fn count(&self, rpc: Rpc) -> usize {
        self.calls.iter().filter(|c| c.rpc() == rpc).count()
    }

    /// `fixNodeGroupSize` acted in this loop (asked NodeGroupDecreaseTargetSize for some
    /// group), which ends the loop, or aborts it if the call failed.
    pub fn fixed_node_group_size(&self) -> bool {
        self.decisions
            .iter()
            .any(|d| matches!(d, Decision::FixNodeGroupSize { .. }))
    }
}

impl fmt::Display for LoopSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "loop {} (+{}): ", self.loop_no, secs(self.at))?;
        if let Some(reason) = &self.aborted {
            write!(f, "ABORTED ({reason}); ")?;
        }
        if !self.groups.is_empty() {
            match self.groups.as_slice() {
                [g] => write!(f, "target {}, ", g.target)?,
                groups => {
                    let t: Vec<String> = groups
                        .iter()
                        .map(|g| format!("{}={}", g.id, g.target))
                        .collect();
                    write!(f, "target {}, ", t.join(" "))?;
                }
            }
            write!(f, "nodes {} Ready/{} NotReady", self.ready, self.not_ready)?;
            if self.unmanaged > 0 {
                write!(f, " (+{} unmanaged)", self.unmanaged)?;
            }
            let mut counts = InstanceCounts::default();
            for g in &self.groups {
                counts.add(&g.instances);
            }
            write!(f, ", instances {counts}")?;
            if self.groups.iter().any(|g| g.backed_off) {
                f.write_str(", backed off")?;
            }
            f.write_str(", ")?;
        }
        f.write_str("calls: ")?;
        // Reads are counted; mutations are listed one by one with their outcome.
        let mut reads: BTreeMap<Rpc, (usize, usize)> = BTreeMap::new();
        let mut parts: Vec<String> = Vec::new();
        for c in &self.calls {
            if c.rpc().is_mutation() {
                continue;
            }
            let entry = reads.entry(c.rpc()).or_default();
            entry.0 += 1;
            if !c.is_ok() {
                entry.1 += 1;
            }
        }
        for (rpc, (n, failed)) in &reads {
            let mut p = if *n == 1 {
                rpc.name().to_owned()
            } else {
                format!("{rpc}×{n}")
            };
            if *failed > 0 {
                p.push_str(&format!(" ({failed} failed)"));
            }
            parts.push(p);
        }
        for c in self.calls.iter().filter(|c| c.rpc().is_mutation()) {
            match &c.outcome {
                Ok(_) => parts.push(format!("{} ok", c.request)),
                Err(e) => parts.push(format!("{} FAILED {:?}", c.request, e.code)),
            }
        }
        f.write_str(&parts.join(", "))?;
        let notable: Vec<String> = self
            .decisions
            .iter()
            .filter(|d| !matches!(d, Decision::NodeUnneeded { .. }))
            .map(ToString::to_string)
            .collect();
        if !notable.is_empty() {
            write!(f, "; {}", notable.join("; "))?;
        }
        Ok(())
    }
}
