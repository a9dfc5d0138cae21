//! Property tests of the domain core: classification, the scaling decision (Alert included),
//! VM lookup and instance status, over generated clusters and requests.
//!
//! The invariants live in `fuzz/src/decision.rs`, shared with the `scale_decision` fuzz target.
//! Each property runs a bounded number of cases (`PROPTEST_CASES` raises it for a longer run).

#[path = "../../../fuzz/src/decision.rs"]
mod decision;

use cks_domain::cluster::{
    ClusterInput, ClusterSnapshot, ClusterState, NodeRole, Vm, VmInput, VmState,
};
use cks_domain::rules::{AlertScaling, ScaleRequest};
use cks_domain::status::{
    ErrorClass, InstanceError, InstanceState, VmActivity, reported_down, scale_up_failure,
    vm_status,
};
use decision::{check_decision, expected_roles};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use std::collections::BTreeMap;

/// `cases` unless `PROPTEST_CASES` says otherwise; no regression files in the source tree.
fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        // A failing case's messages carry whole clusters; bound the time spent shrinking them.
        max_shrink_time: 30_000,
        ..Config::default()
    }
}

fn cluster_state() -> impl Strategy<Value = ClusterState> {
    prop_oneof![
        6 => Just(ClusterState::Running),
        6 => Just(ClusterState::Alert),
        8 => prop::sample::select(&decision::CLUSTER_STATES[..]).prop_map(ClusterState::parse),
        1 => "\\PC{0,10}".prop_map(|s| ClusterState::parse(&s)),
    ]
}

fn vm_state() -> impl Strategy<Value = VmState> {
    vm_state_running(8)
}

/// A VM state, Running with weight `running` against 7 for all others together.
fn vm_state_running(running: u32) -> impl Strategy<Value = VmState> {
    prop_oneof![
        running => Just(VmState::Running),
        6 => prop::sample::select(&decision::VM_STATES[..]).prop_map(VmState::parse),
        1 => prop_oneof![Just("running".to_string()), "\\PC{0,10}".prop_map(String::from)]
            .prop_map(|s| VmState::parse(&s)),
    ]
}

/// A VM name: CKS-style for its intended role, a tricky name, or anything.
fn vm_name(prefix: String, role: NodeRole) -> impl Strategy<Value = String> {
    let cks = {
        let prefix = prefix.clone();
        (
            "[0-9a-f]{1,11}",
            prop::sample::select(&["control", "CONTROL", "Control"][..]),
        )
            .prop_map(move |(hex, control)| match role {
                NodeRole::Control => format!("{prefix}-{control}-{hex}"),
                NodeRole::Etcd => format!("{prefix}-etcd-1-{hex}"),
                NodeRole::Worker => format!("{prefix}-node-{hex}"),
                NodeRole::External => format!("ext-{hex}"),
            })
    };
    prop_oneof![
        8 => cks,
        2 => prop::sample::select(&decision::TRICKY_NAMES[..]).prop_map(String::from),
        1 => "\\PC{0,16}",
        1 => "[a-z]{0,3}(-(control|node|CoNtRoL))?-[0-9a-gA-F]{0,3}",
    ]
}

/// One VM meant to have `role`: the flags match it, except now and then.
fn vm(
    prefix: String,
    role: NodeRole,
) -> impl Strategy<Value = (NodeRole, String, VmState, bool, bool)> {
    let flags = match role {
        NodeRole::External => (Just(true).boxed(), any::<bool>().boxed()),
        NodeRole::Etcd => (
            prop::bool::weighted(0.05).boxed(),
            prop::bool::weighted(0.95).boxed(),
        ),
        _ => (
            prop::bool::weighted(0.03).boxed(),
            prop::bool::weighted(0.03).boxed(),
        ),
    };
    // The control plane is mostly up, so that Alert's later rules get their turn.
    let running = match role {
        NodeRole::Control | NodeRole::Etcd => 30,
        _ => 8,
    };
    (vm_name(prefix, role), vm_state_running(running), flags)
        .prop_map(move |(name, state, (external, etcd))| (role, name, state, external, etcd))
}

/// A cluster shaped like CKS builds them (controls, etcd, workers, externals, counts to
/// match), then perturbed: VMs shuffled now and then, counts off now and then. VM ids are
/// unique.
fn cluster() -> impl Strategy<Value = ClusterInput> {
    let prefix = prop_oneof![
        4 => Just("k8s".to_string()),
        1 => "[a-z][a-z0-9-]{0,8}",
        1 => "\\PC{0,6}",
    ];
    (
        prefix,
        prop_oneof![1 => Just(0usize), 6 => 1..=3usize],
        0..=2usize,
        0..=5usize,
        0..=2usize,
    ).prop_flat_map(
        |(prefix, controls, etcd, workers, externals)| {
            let mut vms = Vec::new();
            for (role, n) in [
                (NodeRole::Control, controls),
                (NodeRole::Etcd, etcd),
                (NodeRole::Worker, workers),
                (NodeRole::External, externals),
            ] {
                for _ in 0..n {
                    vms.push(vm(prefix.clone(), role).boxed());
                }
            }
            let count = |n: usize| {
                let n = n as u32;
                prop_oneof![
                    8 => Just(n),
                    1 => Just(n + 1),
                    1 => Just(n.saturating_sub(1)),
                    1 => 0..=6u32,
                ]
            };
            (
                Just(prefix.clone()),
                vms,
                prop::bool::weighted(0.25),
                cluster_state(),
                (count(controls), count(etcd), count(workers)),
                prop_oneof![20 => Just(None), 1 => Just(Some(u32::MAX)), 1 => Just(Some(u32::MAX - 1))],
            )
        },
    )
    .prop_flat_map(|(name, vms, shuffle, state, counts, huge_size)| {
        let order: Vec<usize> = (0..vms.len()).collect();
        let order = if shuffle {
            Just(order).prop_shuffle().boxed()
        } else {
            Just(order).boxed()
        };
        (Just((name, vms, state, counts, huge_size)), order)
    })
    .prop_map(|((name, vms, state, (controls, etcd, size), huge_size), order)| {
        let vms = order
            .iter()
            .map(|&i| {
                let (_, name, state, external, etcd) = vms[i].clone();
                VmInput {
                    id: format!("vm-{i}"),
                    name,
                    state,
                    is_external: external,
                    is_etcd: etcd,
                }
            })
            .collect();
        ClusterInput {
            id: format!("{name}-id"),
            name,
            state,
            size: huge_size.unwrap_or(size),
            min_size: None,
            max_size: None,
            autoscaling_enabled: false,
            control_nodes: controls,
            etcd_nodes: etcd,
            service_offering: None,
            worker_offering: None,
            zone_id: "zone-1".into(),
            zone_name: "zone1".into(),
            externally_managed: false,
            vms,
        }
    })
}

/// A request for `input`: sizes around the current one and at the edges, or removals of mostly
/// workers, sometimes other VMs, unknown ids and duplicates.
fn request(input: &ClusterInput) -> BoxedStrategy<ScaleRequest> {
    let size = input.size;
    let resize = prop_oneof![
        Just(0),
        Just(1),
        Just(size),
        Just(size.saturating_add(1)),
        Just(size.saturating_sub(1)),
        Just(u32::MAX),
        any::<u32>(),
    ]
    .prop_map(|new_size| ScaleRequest::Resize { new_size });
    let roles = expected_roles(input);
    let workers: Vec<String> = input
        .vms
        .iter()
        .zip(&roles)
        .filter(|(_, r)| **r == NodeRole::Worker)
        .map(|(v, _)| v.id.clone())
        .collect();
    let mut any_id: Vec<String> = input.vms.iter().map(|v| v.id.clone()).collect();
    any_id.push("no-such-vm".into());
    any_id.push("VM-0".into());
    let worker_ids = if workers.is_empty() {
        Just(Vec::new()).boxed()
    } else {
        prop::collection::vec(prop::sample::select(workers), 1..=3).boxed()
    };
    let remove = prop_oneof![
        6 => worker_ids,
        2 => prop::collection::vec(prop::sample::select(any_id), 0..=3),
    ]
    .prop_map(|vm_ids| ScaleRequest::RemoveNodes { vm_ids });
    prop_oneof![resize, remove].boxed()
}

fn alert_scaling() -> impl Strategy<Value = AlertScaling> {
    prop_oneof![
        3 => Just(AlertScaling::Supported),
        2 => Just(AlertScaling::Unknown),
        1 => "\\PC{0,20}".prop_map(|cloudstack_error| AlertScaling::Unsupported { cloudstack_error }),
    ]
}

fn case() -> impl Strategy<Value = (ClusterInput, ScaleRequest, AlertScaling)> {
    cluster().prop_flat_map(|input| {
        let req = request(&input);
        (Just(input), req, alert_scaling())
    })
}

#[test]
fn the_scaling_decision_keeps_every_invariant() {
    let mut runner = TestRunner::new(config(1024));
    runner
        .run(&case(), |(input, req, alert)| {
            let _ = check_decision(&input, &req, &alert);
            Ok(())
        })
        .unwrap();
}

/// The generator reaches every outcome, acceptances in Alert included, so the invariants above
/// are exercised on both sides of every rule rather than on refusals alone.
#[test]
fn the_generated_cases_reach_every_rule_and_acceptance() {
    let mut runner = TestRunner::deterministic();
    let strategy = case();
    let mut outcomes: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut alert_accepts = 0;
    let mut removals_accepted = 0;
    let total = 3000;
    for _ in 0..total {
        let (input, req, alert) = strategy.new_tree(&mut runner).unwrap().current();
        let outcome = match check_decision(&input, &req, &alert) {
            Ok(()) => {
                if input.state == ClusterState::Alert {
                    alert_accepts += 1;
                }
                if matches!(req, ScaleRequest::RemoveNodes { .. }) {
                    removals_accepted += 1;
                }
                "ok"
            }
            Err(refusal) => refusal.rule(),
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    eprintln!(
        "{total} cases: {outcomes:?}; {alert_accepts} Alert acceptances, {removals_accepted} removals accepted"
    );
    for rule in decision::RULES.iter().chain(&["ok"]) {
        assert!(
            outcomes.get(rule).copied().unwrap_or(0) >= 5,
            "{rule} reached too rarely: {outcomes:?}"
        );
    }
    assert!(
        outcomes["ok"] * 10 >= total,
        "fewer than 10% accepted: {outcomes:?}"
    );
    assert!(alert_accepts >= 20, "{alert_accepts} Alert acceptances");
    assert!(
        removals_accepted >= 20,
        "{removals_accepted} removals accepted"
    );
}

/// The restatement of the rules is itself checked on hand-made cases, so the properties above
/// compare the code with something known to be right.
#[test]
fn the_restated_control_pattern_and_rules_agree_with_hand_made_cases() {
    let named = [
        ("k8s-control-18c0a1", true),
        ("k8s-CONTROL-1a2b", true),
        ("-control-0", true),
        ("ö-control-1a", true),
        ("k8s-node-control-ff", true),
        ("x-control-zz", false),
        ("-control-", false),
        ("control-1a", false),
        ("k8s-control-1A2B", false),
        ("k8s-xcontrol-1a", false),
        ("k8s-controller-1a", false),
        ("k8s-contröl-1a", false),
        ("k8s-ＣＯＮＴＲＯＬ-1", false),
        ("k8s-control-١٢", false),
        ("k8s-control-1a-node", false),
        ("", false),
    ];
    for (name, expected) in named {
        assert_eq!(decision::control_named(name), expected, "{name:?}");
    }

    let vm = |id: &str, name: &str, state: &str, external: bool, etcd: bool| VmInput {
        id: id.into(),
        name: name.into(),
        state: VmState::parse(state),
        is_external: external,
        is_etcd: etcd,
    };
    // One control, one etcd, two workers (one Stopped), one external (counted in size, as
    // CloudStack counts it): Alert rules hold.
    let alert = ClusterInput {
        id: "c".into(),
        name: "k8s".into(),
        state: ClusterState::Alert,
        size: 3,
        min_size: None,
        max_size: None,
        autoscaling_enabled: false,
        control_nodes: 1,
        etcd_nodes: 1,
        service_offering: None,
        worker_offering: None,
        zone_id: String::new(),
        zone_name: String::new(),
        externally_managed: false,
        vms: vec![
            vm("c1", "k8s-control-a1", "Running", false, false),
            vm("e1", "k8s-etcd-1-b1", "Running", false, true),
            vm("w1", "k8s-node-c1", "Running", false, false),
            vm("w2", "k8s-node-c2", "Stopped", false, false),
            vm("x1", "ext-1", "Running", true, false),
        ],
    };
    assert_eq!(
        expected_roles(&alert),
        [
            NodeRole::Control,
            NodeRole::Etcd,
            NodeRole::Worker,
            NodeRole::Worker,
            NodeRole::External
        ]
    );
    let remove = |ids: &[&str]| ScaleRequest::RemoveNodes {
        vm_ids: ids.iter().map(|s| s.to_string()).collect(),
    };
    let resize = |new_size| ScaleRequest::Resize { new_size };
    let supported = AlertScaling::Supported;
    let unsupported = AlertScaling::Unsupported {
        cloudstack_error: "no".into(),
    };
    let cases = [
        (&alert, resize(4), &supported, true),
        (&alert, resize(1), &supported, true),
        (&alert, resize(3), &supported, false),
        (&alert, resize(0), &supported, false),
        (&alert, resize(4), &unsupported, false),
        (&alert, remove(&["w2"]), &supported, true),
        (&alert, remove(&["w2", "w2"]), &supported, true),
        (&alert, remove(&["w1", "w2"]), &supported, false),
        (&alert, remove(&["c1"]), &supported, false),
        (&alert, remove(&["e1"]), &supported, false),
        (&alert, remove(&["x1"]), &supported, false),
        (&alert, remove(&[]), &supported, false),
        (&alert, remove(&["nope"]), &supported, false),
    ];
    for (input, req, alert_scaling, expected) in cases {
        assert_eq!(
            decision::expected_accept(input, &req, alert_scaling),
            expected,
            "{req:?} {alert_scaling:?}"
        );
        assert_eq!(check_decision(input, &req, alert_scaling).is_ok(), expected);
    }
    let mut no_down_worker = alert.clone();
    no_down_worker.vms[3].state = VmState::Running;
    let mut control_down = alert.clone();
    control_down.vms[0].state = VmState::Stopped;
    let mut etcd_down = alert.clone();
    etcd_down.vms[1].state = VmState::Error;
    let mut stray = alert.clone();
    stray
        .vms
        .push(vm("w3", "k8s-node-c3", "Running", false, false));
    let mut running = no_down_worker.clone();
    running.state = ClusterState::Running;
    let mut stopped = alert.clone();
    stopped.state = ClusterState::Stopped;
    let mut scaling = running.clone();
    scaling.state = ClusterState::Scaling;
    for (input, expected) in [
        (&no_down_worker, false),
        (&control_down, false),
        (&etcd_down, false),
        (&stray, false),
        (&running, true),
        (&stopped, false),
        (&scaling, false),
    ] {
        assert_eq!(
            decision::expected_accept(input, &resize(3), &supported),
            expected,
            "{input:?}"
        );
        check_decision(input, &resize(3), &supported).ok();
    }
    assert!(decision::expected_accept(
        &stopped,
        &remove(&["w2"]),
        &supported
    ));
    assert!(!decision::expected_accept(
        &scaling,
        &remove(&["w2"]),
        &supported
    ));
}

fn activity() -> impl Strategy<Value = VmActivity> {
    let error = |code: &'static str| {
        "\\PC{0,30}".prop_map(move |message| InstanceError {
            code: code.into(),
            message,
            class: ErrorClass::Other,
        })
    };
    prop_oneof![
        Just(VmActivity::Idle),
        Just(VmActivity::BeingCreated),
        Just(VmActivity::BeingRemoved),
        prop::sample::select(
            &[
                "removal-retrying",
                "removal-stopping-vm",
                "removal-abandoned"
            ][..]
        )
        .prop_flat_map(error)
        .prop_map(VmActivity::RemovalTroubled),
        (any::<i64>(), "\\PC{0,30}").prop_map(|(code, text)| VmActivity::CreateFailed(
            scale_up_failure("job-1", code, &text)
        )),
        error("creation-written-off").prop_map(VmActivity::WrittenOff),
    ]
}

proptest! {
    #![proptest_config(config(512))]

    /// Every VM state and activity maps to a status. A VM on its way out (being removed, gone,
    /// written off) is Deleting; a failed creation is Creating with the job's error. A down
    /// worker the provider is doing nothing with is Running with no error (an error would stop
    /// upstream from expecting its node, so one that never registered would never be removed):
    /// it is reported to the operator as down (`reported_down`: the group's gauges and debug
    /// line) instead. A new worker that went down during a scale-up is Creating with an error
    /// naming the VM, so the autoscaler removes it.
    #[test]
    fn instance_status_is_total_and_a_down_worker_is_reported(
        id in "[0-9a-f-]{1,36}",
        name in "\\PC{0,20}",
        state in vm_state(),
        activity in activity(),
    ) {
        let vm = Vm { id: id.clone(), name: name.clone(), state: state.clone(), role: NodeRole::Worker };
        let (status, error) = vm_status(&vm, &activity);
        match &activity {
            VmActivity::BeingRemoved => prop_assert_eq!((status, error.clone()), (InstanceState::Deleting, None)),
            VmActivity::RemovalTroubled(trouble) => prop_assert_eq!((status, error.as_ref()), (InstanceState::Deleting, Some(trouble))),
            _ if state.is_gone() => prop_assert_eq!((status, error.clone()), (InstanceState::Deleting, None)),
            VmActivity::WrittenOff(off) => prop_assert_eq!((status, error.as_ref()), (InstanceState::Deleting, Some(off))),
            VmActivity::CreateFailed(failure) => prop_assert_eq!((status, error.as_ref()), (InstanceState::Creating, Some(failure))),
            VmActivity::BeingCreated => {
                prop_assert_eq!(status, InstanceState::Creating);
                prop_assert_eq!(error.is_some(), state.is_down());
            }
            VmActivity::Idle => {
                let expected = if state == VmState::Starting { InstanceState::Creating } else { InstanceState::Running };
                prop_assert_eq!((status, error.clone()), (expected, None), "a worker at rest carries no error, down or not");
            }
        }
        if let (Some(e), VmActivity::BeingCreated) = (&error, &activity) {
            prop_assert_eq!(e.class, ErrorClass::Other);
            prop_assert_eq!(&e.code, &format!("vm-{}", state.as_str().to_ascii_lowercase()));
            prop_assert!(e.message.contains(&id) && e.message.contains(&name), "{}", e.message);
            prop_assert!(e.message.contains("NodeGroupDeleteNodes"), "{}", e.message);
        }
        // The operator's view: a worker at rest or new is counted down exactly when its VM is
        // down and not gone; one being removed, failed or written off is counted as such.
        let at_rest_or_new = matches!(activity, VmActivity::Idle | VmActivity::BeingCreated);
        prop_assert_eq!(
            reported_down(&vm, &activity),
            at_rest_or_new && state.is_down() && !state.is_gone(),
            "{:?} / {:?}", state, activity
        );
    }

    /// A failed scale-up is out of resources exactly when CloudStack's code or text says so;
    /// the code is one of two labels and the message carries the job and CloudStack's text.
    #[test]
    fn scale_up_failures_classify_by_code_and_text(
        job in "[0-9a-f-]{1,36}",
        code in prop_oneof![Just(530i64), Just(533), Just(535), any::<i64>()],
        text in prop_oneof![
            "\\PC{0,40}",
            "\\PC{0,10}(Insufficient capacity|RESOURCE LIMIT|unable to create a deployment)\\PC{0,10}",
        ],
    ) {
        let error = scale_up_failure(&job, code, &text);
        let lower = text.to_lowercase();
        let out_of_resources = code == 533
            || code == 535
            || ["insufficient capacity", "insufficientservercapacityexception",
                "unable to create a deployment", "resource limit",
                "resourceallocationexception", "maximum number of resources"]
                .iter()
                .any(|t| lower.contains(t));
        let expected = if out_of_resources {
            ("out-of-resources", ErrorClass::OutOfResources)
        } else {
            ("scale-up-failed", ErrorClass::Other)
        };
        prop_assert_eq!((error.code.as_str(), error.class), expected, "{:?}", text);
        prop_assert!(error.message.contains(&job) && error.message.contains(&text));
        prop_assert!(error.message.contains(&code.to_string()));
    }

    /// Node names match VMs case-insensitively (Kubernetes lower-cases hostnames), ids exactly.
    #[test]
    fn vms_are_found_by_exact_id_and_case_insensitive_name(input in cluster(), pick in any::<prop::sample::Index>()) {
        let snapshot = ClusterSnapshot::classify(input.clone());
        if snapshot.vms.is_empty() {
            return Ok(());
        }
        let vm = &snapshot.vms[pick.index(snapshot.vms.len())];
        prop_assert_eq!(snapshot.vm(&vm.id).map(|v| &v.id), Some(&vm.id));
        prop_assert_eq!(snapshot.vm(&vm.id.to_uppercase()), None);
        let found = snapshot.vm_by_name(&vm.name.to_ascii_lowercase()).expect("found by its lower-case name");
        prop_assert!(found.name.eq_ignore_ascii_case(&vm.name));
        let workers: Vec<&str> = snapshot.workers().map(|v| v.id.as_str()).collect();
        let expected: Vec<&str> = snapshot.vms.iter().zip(expected_roles(&input))
            .filter(|(_, r)| *r == NodeRole::Worker).map(|(v, _)| v.id.as_str()).collect();
        prop_assert_eq!(workers, expected);
    }
}
