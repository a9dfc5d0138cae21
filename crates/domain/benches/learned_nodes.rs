//! The providerIDs of a cluster's nodes learned one at a time while a published view holds the
//! machine, as NodeGroupForNode does on the autoscaler's first loop over a cluster whose nodes
//! carry another providerID than CloudStack's default: the answer is read from the view, the
//! change made on the live machine, which the view shares, so it is copied first
//! (`Arc::make_mut`, the shell's `CowArc`), and the changed machine published as the next view.
//! Then one change of something else (the group's maximum) with every node learned, the cost
//! any change of the machine pays while a view holds it: a job poll, a snapshot installed.
//!
//! "Before" is the learned maps as the machine kept them until they were sharded: two
//! `HashMap`s, copied whole with the machine, and `learn` as it was (a model kept here, so
//! both run in the same process, interleaved round by round). "After" is `ScaleMachine`.
//!
//! `cargo bench -p cks-domain --bench learned_nodes [-- --write] [-- --quick]`

#[path = "../../../benches/support/report.rs"]
mod report;

use cks_domain::machine::{Event, ScaleMachine, Timings};
use report::{BenchArgs, Table, fmt_dur, report};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One node as the autoscaler shows it: its VM, its own providerID, its name.
struct Node {
    vm_id: String,
    provider_id: String,
    name: String,
}

fn nodes(n: usize) -> Vec<Node> {
    (0..n)
        .map(|i| {
            // CloudStack's ids are UUIDs: keys of their real length.
            let vm_id = format!("{i:08x}-5c3e-4a7b-9d1f-{i:012x}");
            Node {
                provider_id: format!("cloudstack:///{vm_id}"),
                name: format!("k-node-{i}"),
                vm_id,
            }
        })
        .collect()
}

/// What NodeGroupForNode's learn and any other change do to the machine.
trait Learner: Clone {
    fn would_learn(&self, n: &Node) -> bool;
    fn learn(&mut self, n: &Node);
    fn other_change(&mut self, max: u32);
}

impl Learner for ScaleMachine {
    fn would_learn(&self, n: &Node) -> bool {
        ScaleMachine::would_learn(self, &n.vm_id, &n.provider_id, &n.name)
    }
    fn learn(&mut self, n: &Node) {
        // As the group's loop hands it over: the node report, through the machine's one way in.
        let reported = Event::NodeReported {
            vm_id: &n.vm_id,
            node: &n.name,
            provider_id: Some(&n.provider_id),
            joined: false,
        };
        let _ = self.handle(reported, Instant::now());
    }
    fn other_change(&mut self, max: u32) {
        self.set_max_size(max);
    }
}

#[derive(Clone, PartialEq)]
struct LearnedNode {
    provider_id: String,
    node_name: String,
}

/// The learned maps before: copied whole with the machine on its first change after each
/// publication. The rest of the machine's copy (the snapshot is an `Arc`) costs about 0.1 µs
/// and is left out.
#[derive(Clone, Default)]
struct WholeMaps {
    learned: HashMap<String, LearnedNode>,
    learned_by_provider_id: HashMap<String, String>,
    max_size: Option<u32>,
}

impl Learner for WholeMaps {
    // The non-default providerID's path of `would_learn` and `learn` as they were; every
    // node here carries one.
    fn would_learn(&self, n: &Node) -> bool {
        self.learned
            .get(&n.vm_id)
            .is_none_or(|l| l.provider_id != n.provider_id || l.node_name != n.name)
    }
    fn learn(&mut self, n: &Node) {
        let new = LearnedNode {
            provider_id: n.provider_id.clone(),
            node_name: n.name.clone(),
        };
        if self.learned.get(&n.vm_id) == Some(&new) {
            return;
        }
        if let Some(old) = self.learned.insert(n.vm_id.clone(), new) {
            self.learned_by_provider_id.remove(&old.provider_id);
        }
        self.learned_by_provider_id
            .insert(n.provider_id.clone(), n.vm_id.clone());
    }
    fn other_change(&mut self, max: u32) {
        self.max_size = Some(max);
    }
}

/// Every node learned one at a time, each learn published: the time, and the machine.
fn learn_all<M: Learner>(fresh: M, nodes: &[Node]) -> (Duration, Arc<M>) {
    let mut live = Arc::new(fresh);
    let mut view = Arc::clone(&live);
    let started = Instant::now();
    for n in nodes {
        if view.would_learn(n) {
            Arc::make_mut(&mut live).learn(n);
            view = Arc::clone(&live);
        }
    }
    let took = started.elapsed();
    assert!(
        nodes.iter().all(|n| !view.would_learn(n)),
        "every node is learned"
    );
    (took, live)
}

/// The mean time of one other change of `live`, each published while the last view holds it.
fn other_changes<M: Learner>(mut live: Arc<M>, count: u32) -> Duration {
    let mut view = Arc::clone(&live);
    let started = Instant::now();
    for i in 0..count {
        Arc::make_mut(&mut live).other_change(i);
        view = Arc::clone(&live);
    }
    let took = started.elapsed();
    drop(view);
    took / count
}

/// One round of one layout: learning every node, then one other change.
fn round<M: Learner>(fresh: M, nodes: &[Node], changes: u32) -> (Duration, Duration) {
    let (learning, live) = learn_all(fresh, nodes);
    (learning, other_changes(live, changes))
}

/// [`fmt_dur`], with the fractions of a microsecond a change costs when it copies no map.
fn fmt_fine(d: Duration) -> String {
    if d < Duration::from_micros(10) {
        format!("{:.2} µs", d.as_secs_f64() * 1e6)
    } else {
        fmt_dur(d)
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn ratio(before: Duration, after: Duration) -> String {
    let r = before.as_secs_f64() / after.as_secs_f64().max(1e-9);
    if r < 10.0 {
        format!("{r:.1}")
    } else {
        format!("{r:.0}")
    }
}

fn main() {
    let args = BenchArgs::parse();
    let machine = report::machine();
    let started = Instant::now();
    let (sizes, rounds): (&[usize], usize) = if args.quick {
        (&[1_000], 1)
    } else {
        (&[1_000, 10_000], 3)
    };
    let changes = 200;
    let mut t = Table::new(&[
        "learned providerIDs",
        "rounds",
        "learning them one at a time: before",
        "after",
        "before ÷ after",
        "one learn (mean): before",
        "after",
        "another change, all learned: before",
        "after",
        "before ÷ after",
    ]);
    let mut at_10k = None;
    for &n in sizes {
        let nodes = nodes(n);
        let (mut learn_before, mut learn_after) = (Vec::new(), Vec::new());
        let (mut change_before, mut change_after) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let (l, c) = round(WholeMaps::default(), &nodes, changes);
            learn_before.push(l);
            change_before.push(c);
            let (l, c) = round(ScaleMachine::new(None, Timings::default()), &nodes, changes);
            learn_after.push(l);
            change_after.push(c);
        }
        let (lb, la) = (median(learn_before), median(learn_after));
        let (cb, ca) = (median(change_before), median(change_after));
        let per = u32::try_from(n).unwrap_or(u32::MAX);
        t.row(vec![
            n.to_string(),
            rounds.to_string(),
            fmt_dur(lb),
            fmt_dur(la),
            ratio(lb, la),
            fmt_fine(lb / per),
            fmt_fine(la / per),
            fmt_fine(cb),
            fmt_fine(ca),
            ratio(cb, ca),
        ]);
        if n == 10_000 {
            at_10k = Some((lb, la));
        }
    }
    let summary = match at_10k {
        Some((before, after)) => format!(
            "At 10,000 nodes the autoscaler's first loop spends {} learning them instead of {}.",
            fmt_dur(after),
            fmt_dur(before)
        ),
        None => "(quick run: 10,000 nodes not measured)".to_string(),
    };
    let body = format!(
        "Measured on {machine}; medians of {rounds} interleaved rounds, {changes} other changes per round; {} in all.\n\n{}\n{summary}\n",
        fmt_dur(started.elapsed()),
        t.markdown(),
    );
    report(args, "learned_nodes", &body);
}
