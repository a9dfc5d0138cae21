//! The machine's tests: the phase × event table (`every_phase_against_every_event`), one test
//! per rule of a scale operation's life, and a property test over random event sequences.

use super::events::{Settled, poll_delay};
use super::retry::{MAX_REMOVAL_ATTEMPTS, retry_delay};
use super::*;
use crate::cluster::{ClusterInput, ClusterSnapshot, ClusterState, VmInput, VmState};
use crate::nodeid::FAKE_NODE_REASON_ANNOTATION;
use crate::registry::Registrations;
use crate::removal::StopStage;
use crate::rules::{AlertScaling, Refusal};

const T0_SECS: u64 = 0;

fn at(base: Instant, secs: u64) -> Instant {
    base + Duration::from_secs(secs)
}

/// A cluster with one control VM and `workers` worker VMs (w1, w2, …), `size` = workers.
fn snapshot(state: &str, workers: &[(&str, VmState)], now: Instant) -> Arc<IndexedSnapshot> {
    snapshot_sized(state, workers, workers.len() as u32, now)
}

pub(super) fn snapshot_sized(
    state: &str,
    workers: &[(&str, VmState)],
    size: u32,
    now: Instant,
) -> Arc<IndexedSnapshot> {
    let mut vms = vec![VmInput {
        id: "c1".into(),
        name: "k-control-1a2b".into(),
        state: VmState::Running,
        is_external: false,
        is_etcd: false,
    }];
    for (id, st) in workers {
        vms.push(VmInput {
            id: (*id).into(),
            name: format!("k-node-{id}"),
            state: st.clone(),
            is_external: false,
            is_etcd: false,
        });
    }
    let snap = ClusterSnapshot::classify(ClusterInput {
        id: "cid".into(),
        name: "k".into(),
        state: ClusterState::parse(state),
        size,
        min_size: None,
        max_size: None,
        autoscaling_enabled: false,
        control_nodes: 1,
        etcd_nodes: 0,
        service_offering: None,
        worker_offering: None,
        zone_id: String::new(),
        zone_name: String::new(),
        externally_managed: false,
        vms,
    });
    Arc::new(IndexedSnapshot::new(snap, now))
}

pub(super) fn running3(now: Instant) -> Arc<IndexedSnapshot> {
    snapshot(
        "Running",
        &[
            ("w1", VmState::Running),
            ("w2", VmState::Running),
            ("w3", VmState::Running),
        ],
        now,
    )
}

pub(super) const ALERT: AlertScaling = AlertScaling::Supported;

/// What a successful scale-up leaves behind: CloudStack lists the size it asked for (the
/// machine checks it: `job_finished` reports a size not reached as failed creations).
fn listed_as_asked(m: &mut ScaleMachine) {
    let Phase::Running { op, .. } = &m.phase else {
        return;
    };
    let OpKind::Increase { to, .. } = op.kind else {
        return;
    };
    let Some(s) = &m.snap else {
        return;
    };
    let mut snap = s.snap.clone();
    snap.size = snap.size.max(to);
    let at = s.fetched_at;
    m.snap = Some(Arc::new(IndexedSnapshot::new(snap, at)));
}
const MAX: u32 = 10;
/// The autoscaler's max-node-provision-time, as the deploy manifests set it.
const PROVISION: Duration = Duration::from_secs(25 * 60);

/// No node reported registered.
pub(super) fn no_reports() -> Registrations {
    Registrations::new(PROVISION)
}

fn timings() -> Timings {
    Timings {
        failed_ttl: Duration::from_secs(1800),
        lost_settle: Duration::from_secs(10),
    }
}

/// A machine with a Running 3-worker snapshot, driven by events into `phase`.
pub(super) fn machine_in(phase: &str, t0: Instant) -> ScaleMachine {
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    assert!(m.snapshot_installed(running3(t0), &ALERT, t0).is_empty());
    match phase {
        "idle" => {}
        "submitting" | "answer-lost" | "running" => {
            assert_eq!(
                m.admit_increase(2, MAX, &ALERT),
                Ok(Admission::NeedsFreshSnapshot)
            );
            let started = m.start_increase(2, MAX, &ALERT, t0);
            assert_eq!(
                started,
                Ok(Started::Submit(ScaleRequest::Resize { new_size: 5 }))
            );
            match phase {
                "answer-lost" => {
                    m.submission_lost();
                }
                "running" => m.submission_answered("job-1".into(), t0),
                _ => {}
            }
        }
        "adopted" => {
            assert_eq!(
                m.snapshot_installed(
                    snapshot("Scaling", &[("w1", VmState::Running)], t0),
                    &ALERT,
                    t0
                ),
                vec![Effect::FindJob]
            );
            assert_eq!(
                m.job_found("job-9".into(), t0),
                vec![Effect::Follow("job-9".into())]
            );
            assert!(
                m.snapshot_installed(running3(t0), &ALERT, t0)
                    .contains(&Effect::PollNow)
            );
        }
        other => panic!("no phase {other}"),
    }
    assert_eq!(m.phase().name(), phase);
    m
}

/// The events of the table, applied at `t`.
#[derive(Debug, Clone, Copy)]
enum Ev {
    Increase,
    Answered,
    Refused,
    Lost,
    Found,
    JobSucceeded,
    JobFailed,
    SnapRunning,
    SnapScaling,
    SnapRunningLate,
    Cleanup,
    Decrease,
    /// DeleteNodes for w1 (min 1).
    Remove,
    /// The shell closes the removal window.
    Close,
    /// The job list shows no job the phase waits for.
    NoJob,
}

/// Applies `ev` and returns a summary: the effects (as short names) or the error.
fn apply(m: &mut ScaleMachine, ev: Ev, t0: Instant) -> String {
    let fx = |e: Vec<Effect>| {
        e.iter()
            .map(|e| match e {
                Effect::Submit(ScaleRequest::Resize { new_size }) => {
                    format!("submit:{new_size}")
                }
                Effect::Submit(ScaleRequest::RemoveNodes { vm_ids }) => {
                    format!("remove:{}", vm_ids.join("+"))
                }
                Effect::Follow(j) => format!("follow:{j}"),
                Effect::FindJob => "find".into(),
                Effect::PollNow => "poll".into(),
                Effect::RemovalRetried { vms, .. } => format!("retry:{}", vms.join("+")),
                Effect::RemovalAbandoned { vms, .. } => {
                    format!("abandoned:{}", vms.join("+"))
                }
                Effect::RemovalBlocked { vms, .. } => format!("blocked:{}", vms.join("+")),
                Effect::SizeNotReached { asked, listed, .. } => {
                    format!("not-reached:{listed}<{asked}")
                }
                Effect::KeyMayNotStop { .. } => "key-may-not-stop".into(),
                Effect::JobEnded { job, .. } => format!("ended:{job}"),
                Effect::Searched(news) => format!("searched:{news:?}"),
                Effect::RemovalsWithdrawn { vms } => format!("withdrawn:{}", vms.join("+")),
                Effect::AnsweredUnrecorded => "unrecorded".into(),
                Effect::PromiseWithdrawn { vms, placeholders } => {
                    format!("taken-back:{}+{placeholders}", vms.join("+"))
                }
                Effect::Stranding(news) => format!("stranding:{news:?}"),
                Effect::ExternallyManaged => "externally-managed".into(),
                Effect::NodeOfFailedVm { vm, .. } => format!("node-of-failed:{vm}"),
                Effect::OwnProviderId { vm, .. } => format!("own-provider-id:{vm}"),
                Effect::PromisedAtDeadline { vms } => format!("promised:{}", vms.join("+")),
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let job = m.phase().job().unwrap_or("job-1").to_string();
    match ev {
        Ev::Increase => match m.admit_increase(1, MAX, &ALERT) {
            Ok(Admission::Queued(_)) => "queued".into(),
            Ok(Admission::NeedsFreshSnapshot) => match m.start_increase(1, MAX, &ALERT, t0) {
                Ok(Started::Submit(ScaleRequest::Resize { new_size })) => {
                    format!("submit:{new_size}")
                }
                other => format!("{other:?}"),
            },
            Err(e) => format!("err:{}", err_name(&e)),
        },
        Ev::Answered => {
            m.submission_answered("job-1".into(), t0);
            String::new()
        }
        Ev::Refused => fx(m.submission_refused("no", &ALERT, t0)),
        Ev::Lost => {
            m.submission_lost();
            String::new()
        }
        Ev::Found => fx(m.job_found("job-7".into(), t0)),
        Ev::JobSucceeded => {
            listed_as_asked(m);
            match m.job_finished(&job, &JobEnd::Succeeded, true, false, &ALERT, t0) {
                Some(s) => fx(s.effects),
                None => "ignored".into(),
            }
        }
        Ev::JobFailed => {
            let end = JobEnd::Failed {
                code: 530,
                text: "boom".into(),
            };
            match m.job_finished(&job, &end, true, false, &ALERT, t0) {
                Some(s) => fx(s.effects),
                None => "ignored".into(),
            }
        }
        Ev::SnapRunning => fx(m.snapshot_installed(running3(t0), &ALERT, at(t0, 1))),
        Ev::SnapScaling => fx(m.snapshot_installed(
            snapshot(
                "Scaling",
                &[
                    ("w1", VmState::Running),
                    ("w2", VmState::Running),
                    ("w3", VmState::Running),
                ],
                t0,
            ),
            &ALERT,
            at(t0, 1),
        )),
        Ev::SnapRunningLate => fx(m.snapshot_installed(running3(t0), &ALERT, at(t0, 60))),
        Ev::Cleanup => {
            m.cleanup();
            String::new()
        }
        Ev::Decrease => match m.decrease_target(1) {
            Ok(d) => format!("cancelled:{}", d.cancelled),
            Err(e) => err_name(&e).into(),
        },
        Ev::Remove => {
            let node = NodeRef {
                provider_id: "external-cloudstack://w1".into(),
                ..NodeRef::default()
            };
            match m.accept_removal(&[node], 1, &ALERT, &no_reports(), t0) {
                Ok(a) => format!("{a:?}").to_ascii_lowercase(),
                Err(e) => format!("err:{}", err_name(&e)),
            }
        }
        Ev::Close => match m.close_window(&ALERT, t0) {
            Ok(e) => fx(e),
            Err(e) => format!("err:{}", err_name(&e)),
        },
        Ev::NoJob => fx(m.no_job_found(&ALERT, at(t0, 60))),
    }
}

fn err_name(e: &ScaleError) -> &'static str {
    match e {
        ScaleError::NoSnapshot => "no-snapshot",
        ScaleError::OutOfRange { .. } => "out-of-range",
        ScaleError::SizeAboveMax { .. } => "size-above-max",
        ScaleError::CordonSuspected { .. } => "cordon-suspected",
        ScaleError::Refused(_) => "refused",
        ScaleError::PreviousAnswerLost => "answer-lost",
        ScaleError::UnknownNode { .. } => "unknown-node",
        ScaleError::DrainWouldFail { .. } => "drain-would-fail",
        ScaleError::CannotDecrease { .. } => "cannot-decrease",
        ScaleError::NotWorker { .. } => "not-worker",
        ScaleError::RegisteredElsewhere { .. } => "registered",
        ScaleError::RecentlyRegistered { .. } => "recently-registered",
        ScaleError::BeingCreated { .. } => "being-created",
        ScaleError::BelowMin { .. } => "below-min",
    }
}

/// Every phase against every event: (phase, event, what the event returns, phase after,
/// target after). The machine starts with 3 Running workers; "submitting", "answer-lost"
/// and "running" carry a scale-up 3 → 5.
#[test]
fn every_phase_against_every_event() {
    use Ev::*;
    #[rustfmt::skip]
    let table: &[(&str, Ev, &str, &str, u32)] = &[
        ("idle", Increase, "submit:4", "submitting", 4),
        ("idle", Answered, "", "idle", 3),
        ("idle", Refused, "", "idle", 3),
        ("idle", Lost, "", "idle", 3),
        ("idle", Found, "follow:job-7", "adopted", 3),
        ("idle", JobSucceeded, "ignored", "idle", 3),
        ("idle", JobFailed, "ignored", "idle", 3),
        ("idle", SnapRunning, "", "idle", 3),
        ("idle", SnapScaling, "find", "idle", 3),
        ("idle", SnapRunningLate, "", "idle", 3),
        ("idle", Cleanup, "", "idle", 3),
        ("idle", Decrease, "cannot-decrease", "idle", 3),
        ("idle", Remove, "openswindow", "idle", 2),
        ("idle", Close, "", "idle", 3),
        ("idle", NoJob, "", "idle", 3),

        ("submitting", Increase, "queued", "submitting", 6),
        ("submitting", Answered, "", "running", 5),
        ("submitting", Refused, "", "idle", 3),
        ("submitting", Lost, "", "answer-lost", 5),
        ("submitting", Found, "", "submitting", 5),
        ("submitting", JobSucceeded, "ignored", "submitting", 5),
        ("submitting", JobFailed, "ignored", "submitting", 5),
        ("submitting", SnapRunning, "", "submitting", 5),
        ("submitting", SnapScaling, "", "submitting", 5),
        ("submitting", SnapRunningLate, "", "submitting", 5),
        ("submitting", Cleanup, "", "submitting", 5),
        ("submitting", Decrease, "cannot-decrease", "submitting", 5),
        ("submitting", Remove, "behind", "submitting", 4),
        ("submitting", Close, "", "submitting", 5),
        ("submitting", NoJob, "", "submitting", 5),

        ("answer-lost", Increase, "queued", "answer-lost", 6),
        ("answer-lost", Answered, "", "answer-lost", 5),
        ("answer-lost", Refused, "", "answer-lost", 5),
        ("answer-lost", Lost, "", "answer-lost", 5),
        ("answer-lost", Found, "follow:job-7", "running", 5),
        ("answer-lost", JobSucceeded, "ignored", "answer-lost", 5),
        ("answer-lost", JobFailed, "ignored", "answer-lost", 5),
        // Too early to tell: the request may still reach CloudStack.
        ("answer-lost", SnapRunning, "", "answer-lost", 5),
        ("answer-lost", SnapScaling, "find", "answer-lost", 5),
        // Late enough: the job list tells whether it became a job (it may be queued, not
        // picked up yet).
        ("answer-lost", SnapRunningLate, "find", "answer-lost", 5),
        ("answer-lost", Cleanup, "", "answer-lost", 5),
        ("answer-lost", Decrease, "cannot-decrease", "answer-lost", 5),
        ("answer-lost", Remove, "behind", "answer-lost", 4),
        ("answer-lost", Close, "", "answer-lost", 5),
        ("answer-lost", NoJob, "", "idle", 3),

        ("running", Increase, "queued", "running", 6),
        ("running", Answered, "", "running", 5),
        ("running", Refused, "", "running", 5),
        ("running", Lost, "", "running", 5),
        ("running", Found, "", "running", 5),
        ("running", JobSucceeded, "", "idle", 3),
        // The snapshot shows no new VM: both requested nodes become failed instances.
        ("running", JobFailed, "", "idle", 5),
        ("running", SnapRunning, "poll", "running", 5),
        ("running", SnapScaling, "", "running", 5),
        ("running", SnapRunningLate, "poll", "running", 5),
        ("running", Cleanup, "", "idle", 3),
        ("running", Decrease, "cannot-decrease", "running", 5),
        ("running", Remove, "behind", "running", 4),
        ("running", Close, "", "running", 5),
        ("running", NoJob, "", "running", 5),

        ("adopted", Increase, "queued", "adopted", 4),
        ("adopted", Answered, "", "adopted", 3),
        ("adopted", Refused, "", "adopted", 3),
        ("adopted", Lost, "", "adopted", 3),
        ("adopted", Found, "", "adopted", 3),
        ("adopted", JobSucceeded, "", "idle", 3),
        ("adopted", JobFailed, "", "idle", 3),
        ("adopted", SnapRunning, "poll", "adopted", 3),
        ("adopted", SnapScaling, "", "adopted", 3),
        ("adopted", SnapRunningLate, "poll", "adopted", 3),
        ("adopted", Cleanup, "", "idle", 3),
        ("adopted", Decrease, "cannot-decrease", "adopted", 3),
        ("adopted", Remove, "behind", "adopted", 2),
        ("adopted", Close, "", "adopted", 3),
        ("adopted", NoJob, "", "adopted", 3),
    ];
    let t0 = Instant::now() + Duration::from_secs(T0_SECS);
    for (phase, ev, returns, after, target) in table {
        let mut m = machine_in(phase, t0);
        let got = apply(&mut m, *ev, t0);
        let case = format!("{phase} + {ev:?}");
        assert_eq!(got, *returns, "{case}: returned");
        assert_eq!(m.phase().name(), *after, "{case}: phase after");
        assert_eq!(m.target(), Some(*target), "{case}: target after");
    }
    let phases = ["idle", "submitting", "answer-lost", "running", "adopted"];
    assert_eq!(table.len(), phases.len() * 15, "every phase × every event");
}

/// Found by the soak test: increases queued behind a lost submission were stranded when
/// the lost submission was forgotten, holding the target above CloudStack's size.
#[test]
fn increases_queued_behind_a_forgotten_lost_submission_are_sent() {
    let t0 = Instant::now();
    let mut m = machine_in("submitting", t0);
    assert!(matches!(
        m.admit_increase(1, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    m.submission_lost();
    assert_eq!(m.target(), Some(6));
    // Still too early: nothing happens.
    assert!(
        m.snapshot_installed(running3(t0), &ALERT, at(t0, 5))
            .is_empty()
    );
    // Late enough: the job list is asked first (CloudStack may have queued the job
    // without picking it up yet); it shows none.
    let fx = m.snapshot_installed(running3(t0), &ALERT, at(t0, 11));
    assert_eq!(fx, vec![Effect::FindJob]);
    assert_eq!(m.phase().name(), "answer-lost");
    let fx = m.no_job_found(&ALERT, at(t0, 11));
    assert_eq!(
        fx,
        vec![Effect::Submit(ScaleRequest::Resize { new_size: 4 })]
    );
    assert_eq!(m.phase().name(), "submitting");
    assert_eq!(m.queue().increase.len(), 0);
    assert_eq!(m.target(), Some(4));
}

/// The job search is one event: what the list showed decides which job is followed, whether
/// the lost request is settled, and what the operator is told, whatever the phase.
#[test]
fn a_job_search_settles_a_lost_answer_only_when_the_list_can_tell() {
    use crate::jobs::JobSearch;
    let t0 = Instant::now();
    let late = at(t0, 11);
    // A lost answer: jobs that name no cluster may be it, so nothing is settled.
    let mut m = machine_in("answer-lost", t0);
    assert!(m.search_needs_job_list());
    let (fx, news) = m.job_searched(&JobSearch::Unnamed, &ALERT, late);
    assert_eq!((fx, news), (Vec::new(), SearchNews::Nothing));
    assert_eq!(m.phase().name(), "answer-lost");
    // Too early to call it never a job: still nothing said.
    let (_, news) = m.job_searched(&JobSearch::Nothing, &ALERT, at(t0, 5));
    assert_eq!(news, SearchNews::Nothing);
    assert_eq!(m.phase().name(), "answer-lost");
    // Late enough and no job: forgotten, and said so.
    m.snapshot_installed(running3(t0), &ALERT, late);
    let (_, news) = m.job_searched(&JobSearch::Nothing, &ALERT, late);
    assert_eq!(news, SearchNews::LostForgotten);
    assert_eq!(m.phase().name(), "idle");
    // The lost request's job found: followed, with its kind for the job metrics.
    let mut m = machine_in("answer-lost", t0);
    let (fx, news) = m.job_searched(&JobSearch::Named("job-7".into()), &ALERT, late);
    assert_eq!(fx, vec![Effect::Follow("job-7".into())]);
    assert_eq!(
        news,
        SearchNews::LostBecameJob {
            job: "job-7".into(),
            kind: JobKind::ScaleUp
        }
    );
    assert_eq!(m.phase().job(), Some("job-7"));
    // A cluster Scaling under a job nobody here started: no list needed, followed blind.
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    m.snapshot_installed(
        snapshot("Scaling", &[("w1", VmState::Running)], t0),
        &ALERT,
        t0,
    );
    assert!(!m.search_needs_job_list());
    let (_, news) = m.job_searched(&JobSearch::Nothing, &ALERT, t0);
    assert_eq!(news, SearchNews::AdoptedBlind);
    assert_eq!(m.phase().name(), "adopted");
}

/// A scale RPC's watch of its new job: a failure is the caller's to hear, success or the
/// cluster listed Scaling is past CloudStack's validation, anything else is looked at again.
#[test]
fn a_watched_job_is_past_validation_once_it_succeeded_or_the_cluster_scales() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    assert_eq!(m.watched(None), Watched::LookAgain);
    assert_eq!(m.watched(Some(&JobEnd::Succeeded)), Watched::PastValidation);
    let refused = JobEnd::Failed {
        code: 530,
        text: "cluster is in Alert".into(),
    };
    assert_eq!(m.watched(Some(&refused)), Watched::Ended(refused.clone()));
    assert_eq!(
        m.watched(Some(&JobEnd::Cancelled)),
        Watched::Ended(JobEnd::Cancelled)
    );
    m.snapshot_installed(
        snapshot("Scaling", &[("w1", VmState::Running)], t0),
        &ALERT,
        t0,
    );
    assert_eq!(m.watched(None), Watched::PastValidation);
}

/// A stop that failed is due again when its backoff ends, which is when the group's loop
/// wakes for it; a scale-up in flight holds every stop.
#[test]
fn a_failed_stop_is_due_again_after_its_backoff() {
    let t0 = Instant::now();
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    m.snapshot_installed(running(3, t0), &ALERT, t0);
    m.accept_removal(&[fake("w3", "create-error")], 1, &ALERT, &no_reports(), t0)
        .expect("accepted");
    m.close_window(&ALERT, t0).expect("nothing to send yet");
    m.window_answered(true);
    assert_eq!(m.take_stops(t0), ["w3"]);
    m.stop_answered("w3", StopAnswer::Failed("busy"), t0);
    let again = t0 + retry_delay(1);
    assert_eq!(m.next_stop_at(t0), Some(again));
    assert!(m.take_stops(t0).is_empty(), "not before its backoff");
    assert_eq!(m.next_stop_at(again), Some(again));
    // A scale job started elsewhere (adopted): no stop until it ends.
    let scaling = snapshot(
        "Scaling",
        &[
            ("w1", VmState::Running),
            ("w2", VmState::Running),
            ("w3", VmState::Running),
        ],
        again,
    );
    m.snapshot_installed(scaling, &ALERT, again);
    m.job_searched(&crate::jobs::JobSearch::Nothing, &ALERT, again);
    assert_eq!(m.phase().name(), "adopted");
    assert_eq!(m.next_stop_at(again), None);
    assert!(m.take_stops(again).is_empty());
}

/// Two nodes queued behind a running job, sent as one request when it ends.
fn queued_increase_sent(t0: Instant) -> ScaleMachine {
    let mut m = machine_in("running", t0);
    assert!(matches!(
        m.admit_increase(2, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    // Not read again after the job: its size is not checked, the next request is computed
    // on the size listed before.
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, false, false, &ALERT, t0)
        .expect("our job");
    assert_eq!(
        settled.effects,
        vec![Effect::Submit(ScaleRequest::Resize { new_size: 5 })]
    );
    m
}

#[test]
fn a_queued_request_cloudstack_refuses_becomes_failed_instances() {
    let t0 = Instant::now();
    let mut m = queued_increase_sent(t0);
    assert!(
        m.submission_refused("quota exceeded", &ALERT, t0)
            .is_empty()
    );
    assert_eq!(m.phase(), &Phase::Idle);
    let failed: Vec<_> = m.failed().iter().map(|f| f.error.code.as_str()).collect();
    assert_eq!(failed, ["scale-up-refused", "scale-up-refused"]);
    assert_eq!(
        m.target(),
        Some(5),
        "the failed instances count until deleted"
    );
    assert_eq!(m.decrease_target(2), Ok(Decreased { cancelled: 2 }));
    assert_eq!(m.target(), Some(3));
}

#[test]
fn a_queued_request_the_rules_refuse_becomes_failed_instances_without_a_request() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    assert!(matches!(
        m.admit_increase(1, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    // The job ended with the cluster Stopped: no size change is allowed.
    m.snapshot_installed(
        snapshot("Stopped", &[("w1", VmState::Stopped)], t0),
        &ALERT,
        t0,
    );
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("our job");
    assert!(settled.effects.is_empty());
    assert_eq!(m.failed().len(), 1);
    assert_eq!(m.failed()[0].error.code, "scale-up-refused");
}

#[test]
fn a_failed_scale_up_reports_the_vms_it_left_and_the_ones_it_never_made() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    // One of the two requested VMs appeared, then the job failed; CloudStack updates the
    // cluster's size only when a scale-up succeeds.
    let after = snapshot_sized(
        "Alert",
        &[
            ("w1", VmState::Running),
            ("w2", VmState::Running),
            ("w3", VmState::Running),
            ("w4", VmState::Error),
        ],
        3,
        t0,
    );
    m.snapshot_installed(after, &ALERT, t0);
    let end = JobEnd::Failed {
        code: 533,
        text: "insufficient capacity".into(),
    };
    let s = m
        .job_finished("job-1", &end, true, false, &ALERT, t0)
        .expect("ours");
    assert!(s.changed);
    let failed: Vec<_> = m
        .failed()
        .iter()
        .map(|f| (f.vm_id.clone(), f.error.code.clone()))
        .collect();
    assert_eq!(failed.len(), 2);
    assert_eq!(failed[0], (Some("w4".into()), "out-of-resources".into()));
    assert_eq!(failed[1].0, None);
    // Three workers, the failed VM (counted once, as the instance it is listed as) and one
    // placeholder never created.
    assert_eq!(m.target(), Some(3 + 2));
}

#[test]
fn a_refusal_seen_by_the_watching_rpc_leaves_nothing_behind() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    let end = JobEnd::Failed {
        code: 530,
        text: "Kubernetes cluster k is in Alert state and can not be scaled".into(),
    };
    m.snapshot_installed(
        snapshot(
            "Alert",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Running),
                ("w3", VmState::Stopped),
            ],
            t0,
        ),
        &ALERT,
        t0,
    );
    let s = m
        .job_finished("job-1", &end, true, true, &ALERT, t0)
        .expect("ours");
    assert!(!s.changed);
    assert!(s.alert_refusal);
    assert!(m.failed().is_empty());
    assert_eq!(m.target(), Some(3));
    // Seen by the follower instead (no caller to tell), the same refusal leaves two
    // failed instances so the autoscaler hears of it.
    let mut m = machine_in("running", t0);
    let s = m
        .job_finished("job-1", &end, true, false, &ALERT, t0)
        .expect("ours");
    assert!(!s.changed);
    assert_eq!(m.failed().len(), 2);
}

fn node(id: &str) -> NodeRef {
    NodeRef {
        provider_id: format!("external-cloudstack://{id}"),
        ..NodeRef::default()
    }
}

/// The fake node the autoscaler builds for an instance without a node.
fn fake(id: &str, reason: &str) -> NodeRef {
    let instance = format!("external-cloudstack://{id}");
    NodeRef {
        provider_id: instance.clone(),
        name: instance,
        annotations: HashMap::from([(FAKE_NODE_REASON_ANNOTATION.into(), reason.into())]),
    }
}

#[test]
fn a_vm_reported_registered_is_not_deleted_as_unregistered_within_the_window() {
    let t0 = Instant::now();
    let mut m = machine_in("idle", t0);
    let mut reports = no_reports();
    // Another autoscaler showed w1's node, with the default providerID, 10 minutes in.
    let seen = at(t0, 600);
    reports.record("w1", "k-node-w1", "external-cloudstack://w1", seen);

    let refused = m.accept_removal(
        &[fake("w1", "unregistered")],
        1,
        &ALERT,
        &reports,
        seen + PROVISION - Duration::from_secs(1),
    );
    let Err(e @ ScaleError::RecentlyRegistered { .. }) = refused else {
        panic!("refused as registered: {refused:?}");
    };
    let text = e.to_string();
    assert!(
        text.contains("external-cloudstack://w1") && text.contains("k-node-w1"),
        "{text}"
    );
    assert!(
        text.contains("1499s ago") && text.contains("(1500s)"),
        "{text}"
    );
    assert!(m.queue().remove.is_empty(), "nothing queued");
    assert_eq!(m.target(), Some(3));

    // Not protected: another VM, a failed creation, a real node the autoscaler sees.
    let now = seen + Duration::from_secs(60);
    assert_eq!(
        m.plan_removal(&[fake("w2", "unregistered")], 1, &ALERT, &reports, now)
            .map(|p| p.vms),
        Ok(vec!["w2".to_string()])
    );
    assert_eq!(
        m.plan_removal(&[fake("w1", "create-error")], 1, &ALERT, &reports, now)
            .map(|p| p.vms),
        Ok(vec!["w1".to_string()])
    );
    assert_eq!(
        m.plan_removal(&[node("w1")], 1, &ALERT, &reports, now)
            .map(|p| p.vms),
        Ok(vec!["w1".to_string()])
    );

    // Once the node has not been seen for the whole window, the deletion is the
    // autoscaler's to make.
    assert_eq!(
        m.accept_removal(
            &[fake("w1", "unregistered")],
            1,
            &ALERT,
            &reports,
            seen + PROVISION
        ),
        Ok(Accepted::OpensWindow)
    );
}

fn running(n: u32, t: Instant) -> Arc<IndexedSnapshot> {
    let ids: Vec<String> = (1..=n).map(|i| format!("w{i}")).collect();
    let vms: Vec<(&str, VmState)> = ids.iter().map(|i| (i.as_str(), VmState::Running)).collect();
    snapshot("Running", &vms, t)
}

/// `vm` accepted for removal at rest, its request sent, its caller answered OK.
fn sent_and_owed(m: &mut ScaleMachine, vm: &str, t: Instant) {
    m.accept_removal(&[node(vm)], 1, &ALERT, &no_reports(), t)
        .expect("accepted");
    assert_eq!(m.close_window(&ALERT, t), Ok(vec![remove_of(&[vm])]));
    m.window_answered(true);
}

/// CloudStack's failure of a removal job whose drain of `vm`'s node failed.
fn drain_failed(vm: &str) -> JobEnd {
    JobEnd::Failed {
        code: 530,
        text: format!(
            "Scaling failed for Kubernetes cluster k, failed to remove Kubernetes node: \
             k-node-{vm} running on VM : k-node-{vm}"
        ),
    }
}

fn remove_of(ids: &[&str]) -> Effect {
    Effect::Submit(ScaleRequest::RemoveNodes {
        vm_ids: ids.iter().map(|s| s.to_string()).collect(),
    })
}

/// "Cannot scale in Alert" is concluded only when the provider's own rules, after the
/// job, still allow the request.
#[test]
fn an_alert_refusal_the_rules_explain_says_nothing_about_the_cloudstack_version() {
    let t0 = Instant::now();
    let end = JobEnd::Failed {
        code: 530,
        text: "Kubernetes cluster k is in Alert state and can not be scaled".into(),
    };
    let alert_with = |w3: VmState| {
        snapshot(
            "Alert",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Running),
                ("w3", w3),
            ],
            t0,
        )
    };
    let cases = [
        // A worker down: every rule allows the scale-up, yet CloudStack refused.
        (alert_with(VmState::Stopped), true, true),
        // HA restarted the worker before the job validated: rule 7 explains the refusal.
        (alert_with(VmState::Running), true, false),
        // No snapshot after the job: nothing is concluded.
        (alert_with(VmState::Stopped), false, false),
    ];
    for (snap, fetched, want) in cases {
        let mut m = machine_in("running", t0);
        m.snapshot_installed(snap, &ALERT, t0);
        let s = m
            .job_finished("job-1", &end, fetched, true, &ALERT, t0)
            .expect("ours");
        assert_eq!(s.alert_refusal, want, "fetched {fetched}");
    }
}

#[test]
fn a_removal_drops_the_target_and_remembers_the_vms_once_accepted() {
    let t0 = Instant::now();
    let mut m = machine_in("idle", t0);
    let w2 = NodeRef {
        provider_id: "external-cloudstack://w2".into(),
        name: "k-node-w2".into(),
        annotations: HashMap::new(),
    };
    assert_eq!(
        m.accept_removal(std::slice::from_ref(&w2), 1, &ALERT, &no_reports(), t0),
        Ok(Accepted::OpensWindow)
    );
    assert_eq!(m.target(), Some(2), "the target drops once accepted");
    assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w2"])]));
    assert_eq!(m.target(), Some(2));
    // Refused: nothing remembered, the target is back.
    assert!(m.submission_refused("no", &ALERT, t0).is_empty());
    assert_eq!(m.target(), Some(3));
    assert!(m.recently_removed.is_empty());
    // Accepted: remembered under id and name; once gone, naming it again is a no-op.
    m.accept_removal(std::slice::from_ref(&w2), 1, &ALERT, &no_reports(), t0)
        .expect("accepted");
    m.close_window(&ALERT, t0).expect("sent");
    m.submission_answered("job-2".into(), t0);
    m.snapshot_installed(
        snapshot(
            "Scaling",
            &[("w1", VmState::Running), ("w3", VmState::Running)],
            t0,
        ),
        &ALERT,
        t0,
    );
    assert_eq!(
        m.accept_removal(std::slice::from_ref(&w2), 1, &ALERT, &no_reports(), t0),
        Ok(Accepted::Done)
    );
    // A removal while the first runs waits behind it, but not below the minimum.
    assert_eq!(
        m.accept_removal(&[node("w3")], 2, &ALERT, &no_reports(), t0)
            .map_err(|e| err_name(&e)),
        Err("below-min")
    );
    assert_eq!(
        m.accept_removal(&[node("w3")], 1, &ALERT, &no_reports(), t0),
        Ok(Accepted::Behind)
    );
    assert_eq!(
        m.accept_removal(&[node("w1")], 0, &ALERT, &no_reports(), t0),
        Err(ScaleError::Refused(Refusal::RemovesAllWorkers {
            cluster: "k".into(),
            workers: 2
        })),
        "the last worker stays, counting the removal in flight"
    );
}

/// The real autoscaler's scale-down: one DeleteNodes per node, at once
/// (`core/scaledown/actuation/actuator.go` `deleteNodesAsync`).
#[test]
fn concurrent_per_node_removals_go_one_drain_at_a_time() {
    let t0 = Instant::now();
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    m.snapshot_installed(running(6, t0), &ALERT, t0);
    let got: Vec<_> = ["w1", "w2", "w3", "w2"]
        .iter()
        .map(|id| m.accept_removal(&[node(id)], 1, &ALERT, &no_reports(), t0))
        .collect();
    assert_eq!(
        got,
        [
            Ok(Accepted::OpensWindow),
            Ok(Accepted::JoinsWindow),
            Ok(Accepted::JoinsWindow),
            Ok(Accepted::Done),
        ],
        "a node named twice is queued once"
    );
    assert_eq!(m.target(), Some(3));
    // A snapshot meanwhile does not send the window early.
    assert!(m.snapshot_installed(running(6, t0), &ALERT, t0).is_empty());
    // One VM that needs a drain per request (a failed drain must find nothing removed
    // yet): w1 now, w2 and w3 after it, one job each.
    assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w1"])]));
    m.submission_answered("job-1".into(), t0);
    m.window_answered(true);
    // More arrive while the job runs: accepted at once, sent together when it ends; a
    // node of the job in flight is not sent again.
    assert_eq!(
        m.accept_removal(&[node("w4")], 1, &ALERT, &no_reports(), t0),
        Ok(Accepted::Behind)
    );
    assert_eq!(
        m.accept_removal(&[node("w5")], 1, &ALERT, &no_reports(), t0),
        Ok(Accepted::Behind)
    );
    assert_eq!(
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0),
        Ok(Accepted::Done)
    );
    assert_eq!(m.target(), Some(1));
    assert_eq!(
        m.accept_removal(&[node("w6")], 1, &ALERT, &no_reports(), t0)
            .map_err(|e| err_name(&e)),
        Err("below-min"),
        "the minimum holds against everything queued"
    );
    let after = snapshot(
        "Running",
        &[
            ("w4", VmState::Running),
            ("w5", VmState::Running),
            ("w6", VmState::Running),
        ],
        t0,
    );
    m.snapshot_installed(after, &ALERT, t0);
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("ours");
    // w2 and w3 vanished with the job (listed no more): done. w4 next, then w5.
    assert_eq!(settled.effects, vec![remove_of(&["w4"])]);
    assert_eq!(m.target(), Some(1));
    m.submission_answered("job-2".into(), t0);
    let after = snapshot(
        "Running",
        &[("w5", VmState::Running), ("w6", VmState::Running)],
        t0,
    );
    m.snapshot_installed(after, &ALERT, t0);
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-2", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("ours");
    assert_eq!(settled.effects, vec![remove_of(&["w5"])]);
}

#[test]
fn a_queued_node_that_disappears_is_left_out_and_one_that_comes_back_is_sent() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("queued");
    m.accept_removal(&[node("w2")], 1, &ALERT, &no_reports(), t0)
        .expect("queued");
    // w1 vanished (destroyed elsewhere), w2 missing from one listing and back.
    m.snapshot_installed(
        snapshot(
            "Scaling",
            &[("w3", VmState::Running), ("w4", VmState::Running)],
            t0,
        ),
        &ALERT,
        t0,
    );
    let back = snapshot(
        "Running",
        &[
            ("w1", VmState::Expunging),
            ("w2", VmState::Running),
            ("w3", VmState::Running),
            ("w4", VmState::Running),
            ("w5", VmState::Running),
        ],
        t0,
    );
    m.snapshot_installed(back, &ALERT, t0);
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("ours");
    assert_eq!(settled.effects, vec![remove_of(&["w2"])]);
    // Every queued node gone: nothing is sent.
    let mut m = machine_in("running", t0);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("queued");
    m.snapshot_installed(
        snapshot(
            "Running",
            &[("w2", VmState::Running), ("w3", VmState::Running)],
            t0,
        ),
        &ALERT,
        t0,
    );
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("ours");
    assert!(settled.effects.is_empty());
    assert!(m.queue().remove.is_empty());
}

#[test]
fn removals_go_before_increases_and_neither_is_lost() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("queued");
    assert!(matches!(
        m.admit_increase(2, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    assert_eq!(m.target(), Some(5 - 1 + 2));
    m.snapshot_installed(running(5, t0), &ALERT, t0);
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("ours");
    assert_eq!(settled.effects, vec![remove_of(&["w1"])]);
    assert_eq!(m.target(), Some(6));
    m.submission_answered("job-2".into(), t0);
    let four: Vec<String> = (2..=5).map(|i| format!("w{i}")).collect();
    let vms: Vec<(&str, VmState)> = four
        .iter()
        .map(|i| (i.as_str(), VmState::Running))
        .collect();
    m.snapshot_installed(snapshot("Running", &vms, t0), &ALERT, t0);
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-2", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("ours");
    // Sent on top of the four left: CloudStack's size never passed 6 on the way.
    assert_eq!(
        settled.effects,
        vec![Effect::Submit(ScaleRequest::Resize { new_size: 6 })]
    );
    assert_eq!(m.target(), Some(6));
    // An increase arriving while a window collects removals waits for them.
    let mut m = machine_in("idle", t0);
    assert_eq!(
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0),
        Ok(Accepted::OpensWindow)
    );
    assert!(matches!(
        m.admit_increase(1, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w1"])]));
}

#[test]
fn a_merged_request_the_rules_refuse_is_refused_at_rest_and_owed_behind_a_job() {
    let t0 = Instant::now();
    // At rest the rules are checked at once: a call they refuse changes nothing.
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    let alert_no_down_worker = snapshot(
        "Alert",
        &[("w1", VmState::Running), ("w2", VmState::Running)],
        t0,
    );
    m.snapshot_installed(alert_no_down_worker, &ALERT, t0);
    assert!(matches!(
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0),
        Err(ScaleError::Refused(Refusal::AlertWithoutDownWorker { .. }))
    ));
    assert_eq!(m.target(), Some(2));
    // Queued behind a job, they are checked when their turn comes (a key that may not stop
    // VMs: with one, the remedy is a stop, below).
    let mut m = machine_in("running", t0);
    m.set_can_stop_vms(false);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("queued");
    m.snapshot_installed(
        snapshot(
            "Alert",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Running),
                ("w3", VmState::Running),
            ],
            t0,
        ),
        &ALERT,
        t0,
    );
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("ours");
    // Owed (its caller was answered OK): it waits, out of the target, and is tried again.
    assert!(matches!(
        &settled.effects[..],
        [Effect::RemovalRetried { vms, .. }] if vms == &["k-node-w1".to_string()]
    ));
    assert_eq!(m.queue().remove.len(), 1);
    assert_eq!(m.target(), Some(2));
    let shown = m.instances(&[]);
    let w1 = shown.iter().find(|i| i.id.ends_with("w1")).expect("listed");
    assert_eq!(w1.state, crate::status::InstanceState::Deleting);
    assert_eq!(
        w1.error.as_ref().map(|e| e.code.as_str()),
        Some("removal-retrying")
    );
    // In a window, the refusal is the window's error.
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    m.snapshot_installed(running3(t0), &ALERT, t0);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("queued");
    m.snapshot_installed(
        snapshot(
            "Alert",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Running),
                ("w3", VmState::Running),
            ],
            t0,
        ),
        &ALERT,
        t0,
    );
    assert!(matches!(
        m.close_window(&ALERT, t0),
        Err(ScaleError::Refused(_))
    ));
    assert_eq!(m.target(), Some(3));
}

#[test]
fn a_failed_removal_stays_owed_and_is_sent_again_after_a_pause_then_abandoned() {
    let t0 = Instant::now();
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    m.snapshot_installed(running(4, t0), &ALERT, t0);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("queued");
    assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w1"])]));
    m.submission_answered("job-1".into(), t0);
    m.window_answered(true);
    assert_eq!(m.target(), Some(3));
    let end = JobEnd::Failed {
        code: 530,
        text: "failed to remove Kubernetes node".into(),
    };
    m.set_can_stop_vms(false);
    let mut t = t0;
    for attempt in 1..=MAX_REMOVAL_ATTEMPTS {
        m.snapshot_installed(running(4, t), &ALERT, t);
        let settled = m
            .job_finished(
                m.phase().job().unwrap_or("none").to_string().as_str(),
                &end,
                true,
                false,
                &ALERT,
                t,
            )
            .expect("ours");
        // Still out of the target: the autoscaler counts w1 as gone.
        assert_eq!(m.target(), Some(3), "attempt {attempt}");
        let names: Vec<&str> = settled
            .effects
            .iter()
            .map(|e| match e {
                Effect::RemovalRetried { .. } => "retried",
                Effect::RemovalAbandoned { .. } => "abandoned",
                Effect::Submit(_) => "submit",
                _ => "other",
            })
            .collect();
        if attempt < MAX_REMOVAL_ATTEMPTS {
            // w1 backs off: nothing is sent before it is due.
            assert_eq!(names, ["retried"], "attempt {attempt}");
            let wait = retry_delay(attempt);
            let early = t + wait - Duration::from_secs(1);
            assert!(
                m.snapshot_installed(running(4, early), &ALERT, early)
                    .is_empty()
            );
            t += wait;
            let fx = m.snapshot_installed(running(4, t), &ALERT, t);
            let sent: Vec<&Effect> = fx
                .iter()
                .filter(|e| matches!(e, Effect::Submit(_)))
                .collect();
            assert_eq!(sent.len(), 1, "attempt {attempt}: {fx:?}");
            m.submission_answered(format!("job-{}", attempt + 1), t);
        } else {
            assert_eq!(names, ["abandoned"]);
        }
    }
    let w1 = m
        .instances(&[])
        .into_iter()
        .find(|i| i.id.ends_with("w1"))
        .expect("listed");
    assert_eq!(
        w1.error.as_ref().map(|e| e.code.as_str()),
        Some("removal-abandoned")
    );
    assert_eq!(m.target(), Some(3));
    // Abandoned: sent again only once the VM is down (no drain then).
    t += Duration::from_secs(3600);
    let fx = m.snapshot_installed(running(4, t), &ALERT, t);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Submit(ScaleRequest::RemoveNodes { vm_ids }) if vm_ids.contains(&"w1".to_string()))),
        "{fx:?}"
    );
}

#[test]
fn a_running_vm_without_a_node_is_stopped_first_or_refused() {
    let t0 = Instant::now();
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    m.snapshot_installed(running(3, t0), &ALERT, t0);
    // The key may not stop VMs: refused before any promise, saying what to do.
    m.set_can_stop_vms(false);
    let refused = m.accept_removal(&[fake("w3", "create-error")], 1, &ALERT, &no_reports(), t0);
    let Err(e) = refused else {
        panic!("accepted: {refused:?}")
    };
    assert_eq!(err_name(&e), "drain-would-fail");
    assert!(e.to_string().contains("stopVirtualMachine id=w3"), "{e}");
    assert_eq!(m.target(), Some(3));
    // With Alert scaling refused by this CloudStack, stopping would not help either.
    m.set_can_stop_vms(true);
    let unsupported = AlertScaling::Unsupported {
        cloudstack_error: "in Alert state and can not be scaled".into(),
    };
    assert!(matches!(
        m.accept_removal(
            &[fake("w3", "create-error")],
            1,
            &unsupported,
            &no_reports(),
            t0
        ),
        Err(ScaleError::DrainWouldFail { .. })
    ));
    // Otherwise: accepted, stopped, then removed as a down VM.
    assert_eq!(
        m.accept_removal(&[fake("w3", "create-error")], 1, &ALERT, &no_reports(), t0),
        Ok(Accepted::OpensWindow)
    );
    // Not stopped before its caller hears OK: the window may still be refused.
    assert!(m.take_stops(t0).is_empty(), "stopped before the promise");
    assert_eq!(m.next_stop_at(t0), None);
    // Nothing to send while it runs.
    assert_eq!(m.close_window(&ALERT, t0), Ok(vec![]));
    m.window_answered(true);
    assert_eq!(m.next_stop_at(t0), Some(t0), "due once promised");
    assert_eq!(m.take_stops(t0), ["w3"]);
    assert!(m.take_stops(t0).is_empty(), "a stop is sent once");
    assert_eq!(m.next_stop_at(t0), None, "nothing more to stop");
    assert!(m.stop_answered("w3", StopAnswer::Stopping, t0).is_empty());
    assert_eq!(m.target(), Some(2));
    let stopped = snapshot(
        "Alert",
        &[
            ("w1", VmState::Running),
            ("w2", VmState::Running),
            ("w3", VmState::Stopped),
        ],
        t0,
    );
    assert_eq!(
        m.snapshot_installed(stopped, &ALERT, t0),
        vec![remove_of(&["w3"])]
    );
    // A key without stopVirtualMachine: the removal waits for an operator.
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    m.snapshot_installed(running(3, t0), &ALERT, t0);
    m.accept_removal(&[fake("w3", "unregistered")], 1, &ALERT, &no_reports(), t0)
        .expect("accepted");
    assert_eq!(m.close_window(&ALERT, t0), Ok(vec![]));
    m.window_answered(true);
    assert_eq!(m.take_stops(t0), ["w3"]);
    let told = m.stop_answered("w3", StopAnswer::NotPermitted("432 not available"), t0);
    assert!(
        matches!(&told[..], [Effect::KeyMayNotStop { reason }, Effect::RemovalAbandoned { vms, .. }]
            if vms == &["k-node-w3".to_string()] && reason.contains("432")),
        "every group told, and abandoned loudly, not waited on in silence: {told:?}"
    );
    let again = m.stop_answered("w3", StopAnswer::NotPermitted("432 not available"), t0);
    assert!(again.is_empty(), "said once: {again:?}");
    let shown = m.instances(&[]);
    let w3 = shown.iter().find(|i| i.id.ends_with("w3")).expect("listed");
    assert_eq!(
        w3.error.as_ref().map(|e| e.code.as_str()),
        Some("removal-abandoned")
    );
    assert!(
        m.accept_removal(&[fake("w2", "unregistered")], 1, &ALERT, &no_reports(), t0)
            .is_err(),
        "learned: the next one is refused up front"
    );
}

#[test]
fn guarded_unregistered_nodes_do_not_keep_the_others() {
    let t0 = Instant::now();
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    m.snapshot_installed(
        snapshot(
            "Alert",
            &[
                ("w1", VmState::Stopped),
                ("w2", VmState::Stopped),
                ("w3", VmState::Running),
            ],
            t0,
        ),
        &ALERT,
        t0,
    );
    let mut reports = no_reports();
    reports.record("w1", "node-w1", "external-cloudstack://w1", t0);
    let a = m
        .accept_removals(
            &[fake("w1", "unregistered"), fake("w2", "unregistered")],
            1,
            &ALERT,
            &reports,
            t0,
        )
        .expect("w2 accepted");
    assert_eq!(a.accepted, Accepted::OpensWindow);
    assert!(
        matches!(&a.refused[..], [ScaleError::RecentlyRegistered { vm, .. }] if vm == "k-node-w1")
    );
    assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w2"])]));
    // Alone, the guarded one is refused and nothing changes.
    assert!(matches!(
        m.accept_removals(&[fake("w1", "unregistered")], 1, &ALERT, &reports, t0),
        Err(ScaleError::RecentlyRegistered { .. })
    ));
}

#[test]
fn cleanup_drops_removals_not_sent() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("queued behind the job");
    assert_eq!(m.target(), Some(4));
    m.cleanup();
    assert!(m.queue().remove.is_empty());
    assert_eq!(
        m.target(),
        Some(3),
        "w1 is back; the job's placeholders are gone with it"
    );
}

#[test]
fn decrease_cancels_all_it_is_asked_or_refuses_and_changes_nothing() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    assert!(matches!(
        m.admit_increase(2, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    assert_eq!(m.target(), Some(7));
    assert!(
        matches!(
            m.decrease_target(5),
            Err(ScaleError::CannotDecrease {
                asked: 5,
                cancellable: 2,
                target: 7
            })
        ),
        "the in-flight job's VMs are not cancelled"
    );
    assert_eq!(m.target(), Some(7), "a refusal changes nothing");
    assert_eq!(m.decrease_target(2), Ok(Decreased { cancelled: 2 }));
    assert_eq!(m.target(), Some(5));
    assert_eq!(m.phase().name(), "running");
}

#[test]
fn removal_bounds_and_roles_are_checked_before_anything_changes() {
    let t0 = Instant::now();
    let m = machine_in("idle", t0);
    let node = |id: &str| NodeRef {
        provider_id: format!("external-cloudstack://{id}"),
        ..NodeRef::default()
    };
    let cases: &[(&[&str], u32, Result<usize, &str>)] = &[
        (&["w1"], 1, Ok(1)),
        (&["w1", "w1"], 1, Ok(1)),
        (&["w1", "w2"], 2, Err("below-min")),
        (&["c1"], 1, Err("not-worker")),
        (&["zz"], 1, Err("unknown-node")),
        (&["w1", "c1"], 1, Err("not-worker")),
    ];
    for (ids, min, want) in cases {
        let nodes: Vec<NodeRef> = ids.iter().map(|i| node(i)).collect();
        let got = m
            .plan_removal(&nodes, *min, &ALERT, &no_reports(), t0)
            .map(|p| p.vms.len())
            .map_err(|e| err_name(&e));
        assert_eq!(got, *want, "{ids:?} min {min}");
    }
    assert_eq!(m.phase(), &Phase::Idle);
}

#[test]
fn increase_is_bounded_by_the_maximum_counting_queued_work() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    assert_eq!(
        m.admit_increase(6, MAX, &ALERT),
        Err(ScaleError::OutOfRange {
            target: 5,
            delta: 6,
            max: 10
        })
    );
    assert!(matches!(
        m.admit_increase(5, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    assert!(matches!(
        m.admit_increase(1, MAX, &ALERT),
        Err(ScaleError::OutOfRange { .. })
    ));
}

#[test]
fn failed_instances_expire_or_go_with_their_vm() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    let end = JobEnd::Failed {
        code: 530,
        text: "x".into(),
    };
    m.job_finished("job-1", &end, true, false, &ALERT, t0)
        .expect("ours");
    assert_eq!(m.failed().len(), 2);
    m.snapshot_installed(running3(t0), &ALERT, at(t0, 1799));
    assert_eq!(m.failed().len(), 2);
    m.snapshot_installed(running3(t0), &ALERT, at(t0, 1800));
    assert!(m.failed().is_empty());
    assert_eq!(m.target(), Some(3));
}

#[test]
fn increases_queued_behind_a_job_cleanup_forgot_go_out_with_the_next_snapshot() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    assert!(matches!(
        m.admit_increase(1, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    m.cleanup();
    assert_eq!(m.phase(), &Phase::Idle);
    // The job ended while nobody followed it: the next snapshot shows the cluster at rest.
    let fx = m.snapshot_installed(
        snapshot_sized(
            "Running",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Running),
                ("w3", VmState::Running),
                ("w4", VmState::Running),
                ("w5", VmState::Running),
            ],
            5,
            t0,
        ),
        &ALERT,
        t0,
    );
    assert_eq!(
        fx,
        vec![Effect::Submit(ScaleRequest::Resize { new_size: 6 })]
    );
    assert_eq!(m.target(), Some(6));
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// One event as CloudStack or the autoscaler may produce it, in any order.
    #[derive(Debug, Clone)]
    enum Step {
        Increase(u32),
        /// DeleteNodes for worker `w{n}` (down ones and failed ones included).
        Remove(u32),
        /// The shell closes the removal window.
        CloseWindow,
        Decrease(u32),
        Answered,
        Refused,
        Lost,
        Found,
        NoJobFound,
        JobEnds {
            failed: bool,
            watched: bool,
        },
        /// A snapshot `secs` later showing the cluster in a state with `workers` VMs, the
        /// `down`th of them Stopped and the `gone`th Expunging (0: none).
        Snapshot {
            scaling: bool,
            workers: u32,
            down: u32,
            gone: u32,
            secs: u64,
        },
        Cleanup,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (1u32..4).prop_map(Step::Increase),
            (1u32..7).prop_map(Step::Remove),
            Just(Step::CloseWindow),
            (1u32..3).prop_map(Step::Decrease),
            Just(Step::Answered),
            Just(Step::Refused),
            Just(Step::Lost),
            Just(Step::Found),
            Just(Step::NoJobFound),
            (any::<bool>(), any::<bool>())
                .prop_map(|(failed, watched)| Step::JobEnds { failed, watched }),
            (any::<bool>(), 1u32..7, 0u32..4, 0u32..4, 0u64..30).prop_map(
                |(scaling, workers, down, gone, secs)| Step::Snapshot {
                    scaling,
                    workers,
                    down,
                    gone,
                    secs,
                }
            ),
            Just(Step::Cleanup),
        ]
    }

    fn workers_snapshot(
        scaling: bool,
        n: u32,
        down: u32,
        gone: u32,
        t: Instant,
    ) -> Arc<IndexedSnapshot> {
        let ids: Vec<String> = (1..=n).map(|i| format!("w{i}")).collect();
        let vms: Vec<(&str, VmState)> = ids
            .iter()
            .zip(1..)
            .map(|(i, k)| {
                let state = if k == gone {
                    VmState::Expunging
                } else if k == down {
                    VmState::Stopped
                } else {
                    VmState::Running
                };
                (i.as_str(), state)
            })
            .collect();
        let state = if scaling {
            "Scaling"
        } else if down > 0 && down <= n {
            "Alert"
        } else {
            "Running"
        };
        snapshot(state, &vms, t)
    }

    /// The invariant of docs/decrease-target-size.md: the target counts exactly the
    /// instances NodeGroupNodes lists that are not Deleting (so the core's
    /// `fixNodeGroupSize` never asks to cancel what cannot be cancelled).
    fn listed_not_deleting(m: &ScaleMachine) -> u32 {
        m.instances(&m.pending_placeholders())
            .iter()
            .filter(|i| i.state != crate::status::InstanceState::Deleting)
            .count() as u32
    }

    /// What happens to a group in the order the shell can produce it: the autoscaler's calls,
    /// CloudStack's answers (late, twice, never), a caller's deadline before its window's
    /// answer, and restarts between any two steps that replay the ledger.
    #[derive(Debug, Clone)]
    enum Life {
        Step(Step),
        /// The window's callers' deadline comes first: their removals are promised
        /// (`promise_removals`, as DeleteNodes does at its deadline).
        Deadline,
        /// The window's callers hear the answer to its request (`window_answered`).
        WindowAnswered(bool),
        /// CloudStack throttled the request, or it could not be sent.
        NotSent,
        /// The process restarts: a new machine takes the last ledger over, then the last
        /// snapshot comes again.
        Restart,
        /// The VMs to stop are taken and CloudStack answers each stop (0 stopping, 1
        /// failed, 2 not permitted, 3 unknown).
        Stops(u8),
    }

    fn life() -> impl Strategy<Value = Life> {
        prop_oneof![
            6 => step().prop_map(Life::Step),
            1 => Just(Life::Deadline),
            1 => any::<bool>().prop_map(Life::WindowAnswered),
            1 => Just(Life::NotSent),
            1 => Just(Life::Restart),
            1 => (0u8..4).prop_map(Life::Stops),
        ]
    }

    /// What CloudStack answers, applied as both properties apply it, through the machine's
    /// one way in for what happened (`handle`); the effects that follow.
    fn cloudstack_answers(
        m: &mut ScaleMachine,
        step: &Step,
        now: Instant,
        t0: Instant,
    ) -> Vec<Effect> {
        let job = m.phase().job().map(str::to_string);
        let end = |failed: bool| {
            if failed {
                JobEnd::Failed {
                    code: 530,
                    text: "boom".into(),
                }
            } else {
                JobEnd::Succeeded
            }
        };
        let event = |m: &mut ScaleMachine, e: Event<'_>| m.handle(e, now).effects;
        match step {
            Step::Answered => {
                let job = format!("job-{}", now.duration_since(t0).as_secs());
                event(m, Event::Sent(Sent::Accepted(job)))
            }
            Step::Refused => event(
                m,
                Event::Sent(Sent::Refused {
                    text: "no",
                    alert: &ALERT,
                }),
            ),
            Step::Lost => event(m, Event::Sent(Sent::Lost)),
            Step::Found => {
                let search = crate::jobs::JobSearch::Named("job-x".into());
                event(
                    m,
                    Event::JobSearched {
                        search: &search,
                        alert: &ALERT,
                    },
                )
            }
            Step::NoJobFound => event(
                m,
                Event::JobSearched {
                    search: &crate::jobs::JobSearch::Nothing,
                    alert: &ALERT,
                },
            ),
            Step::JobEnds { failed, watched } => {
                let end = end(*failed);
                match &job {
                    Some(job) => event(
                        m,
                        Event::JobEnded {
                            job,
                            end: &end,
                            fetched: true,
                            watched: *watched,
                            alert: &ALERT,
                            registered: &no_reports(),
                        },
                    ),
                    None => Vec::new(),
                }
            }
            _ => Vec::new(),
        }
    }

    /// The VMs whose removal the machine owes (its ledger), as a set.
    fn owed(m: &ScaleMachine, now: Instant) -> std::collections::BTreeSet<String> {
        m.ledger(now)
            .removals
            .into_iter()
            .map(|r| r.vm_id)
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Every promise is kept: once a removal is owed (its caller heard OK, or will at its
        /// deadline) it stays owed, across restarts replaying the ledger, until its VM is no
        /// longer listed, a removal job carrying it succeeded, or the autoscaler's Cleanup
        /// released it; whatever CloudStack answers and in whatever order. And no request
        /// ever asks for more workers than the group's maximum.
        #[test]
        fn every_promised_removal_is_kept_across_answers_and_restarts(
            steps in proptest::collection::vec(life(), 1..60)
        ) {
            let t0 = Instant::now();
            let mut now = t0;
            let fresh = || {
                let mut m = ScaleMachine::new(Some("cid".into()), timings());
                m.set_max_size(MAX);
                m
            };
            let mut m = fresh();
            m.snapshot_installed(running3(t0), &ALERT, t0);
            let mut promised = owed(&m, now);
            for life in steps {
                let before = m.clone();
                let mut effects = Vec::new();
                let mut released = false;
                let mut succeeded: Vec<String> = Vec::new();
                match life.clone() {
                    Life::Step(Step::Increase(d)) => {
                        if let Ok(Admission::NeedsFreshSnapshot) = m.admit_increase(d, MAX, &ALERT)
                            && let Ok(Started::Submit(r)) = m.start_increase(d, MAX, &ALERT, now)
                        {
                            effects.push(Effect::Submit(r));
                        }
                    }
                    Life::Step(Step::Remove(n)) => {
                        let node = NodeRef { provider_id: format!("external-cloudstack://w{n}"), ..NodeRef::default() };
                        let _ = m.accept_removal(&[node], 1, &ALERT, &no_reports(), now);
                    }
                    Life::Step(Step::CloseWindow) => {
                        // Answered later, as the shell does once CloudStack answered.
                        if let Ok(fx) = m.close_window(&ALERT, now) {
                            effects = fx;
                        }
                    }
                    Life::Step(Step::Decrease(d)) => {
                        let _ = m.decrease_target(d);
                    }
                    Life::Step(
                        step @ (Step::Answered
                        | Step::Refused
                        | Step::Lost
                        | Step::Found
                        | Step::NoJobFound
                        | Step::JobEnds { .. }),
                    ) => {
                        if let (Step::JobEnds { failed: false, .. }, Some(OpKind::Remove { vm_ids, .. })) =
                            (&step, m.phase().op().map(|o| &o.kind))
                        {
                            succeeded = vm_ids.clone();
                        }
                        effects = cloudstack_answers(&mut m, &step, now, t0);
                    }
                    Life::Step(Step::Snapshot { scaling, workers, down, gone, secs }) => {
                        now += Duration::from_secs(secs);
                        let snap = workers_snapshot(scaling, workers, down, gone, now);
                        effects = m.handle(Event::Listed { snap, alert: &ALERT }, now).effects;
                    }
                    Life::Step(Step::Cleanup) => {
                        m.cleanup();
                        released = true;
                    }
                    Life::Deadline => {
                        let in_window: Vec<String> = m.queue().remove.iter()
                            .filter(|r| r.in_window)
                            .map(|r| r.vm_id.clone())
                            .collect();
                        let _ = m.promise_removals(&in_window);
                    }
                    Life::WindowAnswered(ok) => {
                        effects = m.handle(Event::WindowAnswered { ok }, now).effects;
                        effects.extend(m.handle(Event::WindowClosed, now).effects);
                    }
                    Life::NotSent => {
                        effects = m.handle(Event::Sent(Sent::NotSent("not sent")), now).effects;
                    }
                    Life::Restart => {
                        let ledger = m.ledger(now);
                        let snap = m.snapshot().cloned();
                        let mut next = fresh();
                        effects = next.handle(Event::Restored(ledger), now).effects;
                        if let Some(snap) = snap {
                            effects.extend(next.handle(Event::Listed { snap, alert: &ALERT }, now).effects);
                        }
                        m = next;
                    }
                    Life::Stops(answer) => {
                        for vm in m.take_stops(now) {
                            let told = match answer {
                                0 => StopAnswer::Stopping,
                                1 => StopAnswer::Failed("boom"),
                                2 => StopAnswer::NotPermitted("432"),
                                _ => StopAnswer::Unknown("no answer"),
                            };
                            effects.extend(m.handle(Event::StopAnswered { vm: &vm, answer: told }, now).effects);
                        }
                    }
                }
                for e in &effects {
                    if let Effect::Submit(ScaleRequest::Resize { new_size }) = e {
                        prop_assert!(*new_size <= MAX, "a size request past the maximum: {new_size}");
                    }
                }
                // A promise leaves the ledger only when it is kept or released.
                let listed = |v: &str| m.snapshot().and_then(|s| s.snap.vm(v)).is_some_and(|vm| !vm.state.is_gone());
                let now_owed = owed(&m, now);
                for v in promised.difference(&now_owed) {
                    prop_assert!(
                        released || !listed(v) || succeeded.contains(v),
                        "the removal of {v} was promised and is no longer owed after {life:?}: {before:?} then {m:?}"
                    );
                }
                promised = now_owed;
            }
        }
    }

    /// What happens to a group with a store that writes its ledger when it gets round to it:
    /// the steps of a group's life, and the store reading the ledger (a write begins) and
    /// reporting it written, late and in any order with the rest.
    #[derive(Debug, Clone)]
    enum Recording {
        Life(Life),
        /// The store reads the ledger and its number: a write begins.
        Write,
        /// The oldest write begun is done: the store reports its number.
        Written,
        /// The oldest write begun failed: nothing is reported.
        WriteFailed,
        /// A caller waiting for its record reaches its deadline (the `n`th waiting).
        CallerDeadline(usize),
    }

    fn recording() -> impl Strategy<Value = Recording> {
        prop_oneof![
            6 => life().prop_map(Recording::Life),
            2 => Just(Recording::Write),
            2 => Just(Recording::Written),
            1 => Just(Recording::WriteFailed),
            1 => (0usize..4).prop_map(Recording::CallerDeadline),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// OK means recorded: a DeleteNodes caller hears OK from the machine
        /// (`Step::replies`) only once a write holding its removal is done, or, when its
        /// deadline comes first, for a removal under way and with the machine saying so
        /// (`AnsweredUnrecorded`); one only queued and its alone is taken back instead
        /// (`Heard::Withdrawn`), neither owed nor promised to another. A restart
        /// takes over the last ledger written, as a new process does: every removal whose
        /// caller heard a recorded OK is owed by it, unless it was kept or released before.
        #[test]
        fn no_ok_is_heard_before_its_record(
            steps in proptest::collection::vec(recording(), 1..80)
        ) {
            use std::collections::{BTreeSet, HashMap, VecDeque};
            let t0 = Instant::now();
            let mut now = t0;
            let fresh = || {
                let mut m = ScaleMachine::new(Some("cid".into()), timings());
                m.set_max_size(MAX);
                m.set_durable(true);
                m
            };
            let mut m = fresh();
            m.snapshot_installed(running3(t0), &ALERT, t0);
            let mut next = 0u64;
            // Callers waiting for the machine's reply: the VM each asked to remove.
            let mut waiting: HashMap<CallId, String> = HashMap::new();
            // Writes begun: what each holds (owed removals) and the ledger's number.
            let mut writes: VecDeque<(BTreeSet<String>, u64)> = VecDeque::new();
            let mut written: BTreeSet<String> = BTreeSet::new();
            // VMs whose caller heard a recorded OK.
            let mut heard: BTreeSet<String> = BTreeSet::new();
            // Callers waiting when a Cleanup released their removals, or when their VM was seen
            // gone.
            let mut cleaned: BTreeSet<CallId> = BTreeSet::new();
            // Every caller that ever asked for each VM.
            let mut callers_of: HashMap<String, BTreeSet<CallId>> = HashMap::new();
            for step in steps {
                let mut replies = Vec::new();
                let mut released = false;
                match step.clone() {
                    Recording::Write => writes.push_back((owed(&m, now), m.ledger_rev())),
                    Recording::Written => {
                        if let Some((held, rev)) = writes.pop_front() {
                            written = held;
                            replies = m.handle(Event::Recorded { rev }, now).replies;
                        }
                    }
                    Recording::WriteFailed => {
                        writes.pop_front();
                    }
                    Recording::CallerDeadline(n) => {
                        let mut calls: Vec<CallId> = waiting.keys().copied().collect();
                        calls.sort();
                        if let Some(&call) = calls.get(n) {
                            // As the shell does: the promise first, the last moment after.
                            replies = m.handle(Event::PromiseDue { call }, now).replies;
                            let last = m.handle(Event::CallerDeadline { call }, now);
                            for r in &last.replies {
                                let vm = waiting.get(&r.call).cloned().unwrap_or_default();
                                match r.heard {
                                    Heard::Ok { recorded: false } => {
                                        prop_assert_eq!(&last.effects, &vec![Effect::AnsweredUnrecorded]);
                                        // OK unrecorded only for what cannot be taken back: sent,
                                        // begun, or another caller's too.
                                        let untouched = m.queue().remove.iter().any(|q| {
                                            q.vm_id == vm && q.attempts == 0 && !q.abandoned
                                                && matches!(q.stop, StopStage::NotNeeded | StopStage::Wanted)
                                        });
                                        prop_assert!(
                                            !untouched || callers_of.get(&vm).is_some_and(|c| c.len() > 1),
                                            "{vm}'s caller heard an unrecorded OK for a removal only queued, and its alone"
                                        );
                                    }
                                    Heard::Withdrawn => {
                                        prop_assert_eq!(
                                            &last.effects,
                                            &vec![Effect::PromiseWithdrawn { vms: vec![vm.clone()], placeholders: 0 }]
                                        );
                                    }
                                    other => prop_assert!(false, "at its deadline {vm}'s caller heard {other:?}"),
                                }
                            }
                            replies.extend(last.replies);
                        }
                    }
                    Recording::Life(Life::Step(Step::Remove(n))) => {
                        let node = NodeRef { provider_id: format!("external-cloudstack://w{n}"), ..NodeRef::default() };
                        if let Ok(a) = m.accept_removals(&[node], 1, &ALERT, &no_reports(), now) {
                            let call = CallId(next);
                            next += 1;
                            waiting.insert(call, format!("w{n}"));
                            callers_of.entry(format!("w{n}")).or_default().insert(call);
                            replies = m.reply_to_removal(call, &a).replies;
                        }
                    }
                    Recording::Life(Life::Step(Step::CloseWindow)) => {
                        if m.close_window(&ALERT, now).is_err() {
                            replies = m.handle(Event::WindowAnswered { ok: false }, now).replies;
                            let _ = m.handle(Event::WindowClosed, now);
                        }
                    }
                    Recording::Life(Life::Deadline) => {
                        let mut calls: Vec<CallId> = waiting.keys().copied().collect();
                        calls.sort();
                        for call in calls {
                            replies.extend(m.handle(Event::PromiseDue { call }, now).replies);
                        }
                    }
                    Recording::Life(Life::WindowAnswered(ok)) => {
                        replies = m.handle(Event::WindowAnswered { ok }, now).replies;
                        let _ = m.handle(Event::WindowClosed, now);
                    }
                    Recording::Life(Life::NotSent) => {
                        let _ = m.handle(Event::Sent(Sent::NotSent("not sent")), now);
                    }
                    Recording::Life(Life::Restart) => {
                        // The new process takes over what was written last; its callers
                        // from before are gone with their connections.
                        let ledger = Ledger {
                            removals: m.ledger(now).removals.into_iter().filter(|r| written.contains(&r.vm_id)).collect(),
                            ..Ledger::default()
                        };
                        let snap = m.snapshot().cloned();
                        let mut next_m = fresh();
                        let _ = next_m.handle(Event::Restored(ledger), now);
                        if let Some(snap) = snap {
                            let _ = next_m.handle(Event::Listed { snap, alert: &ALERT }, now);
                        }
                        m = next_m;
                        waiting.clear();
                        writes.clear();
                    }
                    Recording::Life(Life::Stops(_)) => {}
                    Recording::Life(Life::Step(Step::Snapshot { scaling, workers, down, gone, secs })) => {
                        now += Duration::from_secs(secs);
                        let snap = workers_snapshot(scaling, workers, down, gone, now);
                        let _ = m.handle(Event::Listed { snap, alert: &ALERT }, now);
                    }
                    Recording::Life(Life::Step(Step::Cleanup)) => {
                        m.cleanup();
                        released = true;
                        // The removals its callers wait for are released with the rest.
                        cleaned.extend(waiting.keys().copied());
                    }
                    Recording::Life(Life::Step(
                        s @ (Step::Answered | Step::Refused | Step::Lost | Step::Found | Step::NoJobFound | Step::JobEnds { .. }),
                    )) => {
                        // A removal job that succeeded kept the promises of its VMs, whatever
                        // the last listing shows.
                        if let (Step::JobEnds { failed: false, .. }, Some(OpKind::Remove { vm_ids, .. })) =
                            (&s, m.phase().op().map(|o| &o.kind))
                        {
                            cleaned.extend(waiting.iter().filter(|(_, v)| vm_ids.contains(v)).map(|(c, _)| *c));
                            heard.retain(|v| !vm_ids.contains(v));
                        }
                        let _ = cloudstack_answers(&mut m, &s, now, t0);
                    }
                    Recording::Life(Life::Step(Step::Increase(_) | Step::Decrease(_))) => {}
                }
                let owed_now = owed(&m, now);
                let listed = |v: &str| m.snapshot().and_then(|s| s.snap.vm(v)).is_some_and(|vm| !vm.state.is_gone());
                let removing = |v: &str| matches!(m.phase().op().map(|o| &o.kind), Some(OpKind::Remove { vm_ids, .. }) if vm_ids.iter().any(|x| x == v));
                // A VM seen gone is a promise kept (the generated listings may show it again).
                for (call, v) in &waiting {
                    if !listed(v) {
                        cleaned.insert(*call);
                    }
                }
                for r in replies {
                    let vm = waiting.remove(&r.call);
                    prop_assert!(vm.is_some(), "a reply to a caller not waiting, or twice: {:?}", r);
                    let vm = vm.unwrap_or_default();
                    // Taken back: nothing of it is owed or under way, and no one heard a
                    // recorded OK for it.
                    if r.heard == Heard::Withdrawn {
                        prop_assert!(
                            !owed_now.contains(&vm) && !removing(&vm) && !heard.contains(&vm),
                            "{vm}'s removal was taken back while owed, under way or promised to another, after {step:?}: {m:?}"
                        );
                    }
                    // An OK is a promise: the removal is owed, or already being carried out.
                    if matches!(r.heard, Heard::Ok { .. }) {
                        prop_assert!(
                            cleaned.contains(&r.call) || owed_now.contains(&vm) || !listed(&vm) || removing(&vm)
                                || m.recently_removed.contains_key(&vm),
                            "{vm}'s caller heard OK for a removal not owed, after {step:?}: {m:?}"
                        );
                    }
                    // (A removal kept or released meanwhile needs no record.)
                    if matches!(r.heard, Heard::Ok { recorded: true }) && owed_now.contains(&vm) && !cleaned.contains(&r.call) {
                        prop_assert!(
                            written.contains(&vm),
                            "{vm}'s caller heard OK before a write held its removal, after {step:?}"
                        );
                        heard.insert(vm);
                    }
                }
                if released {
                    heard.clear();
                }
                // Kept promises need nothing; the others heard OK are owed, restarts included.
                heard.retain(|v| owed_now.contains(v) || (listed(v) && !m.recently_removed.contains_key(v)));
                if let Recording::Life(Life::Restart) = step {
                    for v in &heard {
                        prop_assert!(owed_now.contains(v), "{v}'s caller heard a recorded OK and the restart forgot it");
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Whatever happens, in whatever order: a request is sent only from Idle and
        /// never while another is in flight; a refused request changes nothing; once a
        /// snapshot shows the cluster at rest with nothing in flight, no queued work is
        /// left behind; the target is never below what is queued and failed, and always
        /// equals the listed instances that are not Deleting; no VM is queued twice or
        /// queued while its removal runs.
        #[test]
        fn the_machine_never_sends_two_requests_or_strands_work(
            steps in proptest::collection::vec(step(), 1..40)
        ) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut m = ScaleMachine::new(Some("cid".into()), timings());
            m.snapshot_installed(running3(t0), &ALERT, t0);
            for s in steps {
                let before = m.clone();
                let was_idle = m.phase() == &Phase::Idle;
                let mut effects = Vec::new();
                match s {
                    Step::Increase(d) => match m.admit_increase(d, MAX, &ALERT) {
                        Ok(Admission::NeedsFreshSnapshot) => {
                            match m.start_increase(d, MAX, &ALERT, now) {
                                Ok(Started::Submit(r)) => effects.push(Effect::Submit(r)),
                                Ok(_) => {}
                                Err(_) => prop_assert_eq!(m.phase(), before.phase()),
                            }
                        }
                        Ok(Admission::Queued(_)) => prop_assert!(!was_idle || !before.queue().remove.is_empty()),
                        Err(_) => {
                            prop_assert_eq!(m.target(), before.target(), "a refusal changes nothing");
                        }
                    },
                    Step::Remove(n) => {
                        let node = NodeRef { provider_id: format!("external-cloudstack://w{n}"), ..NodeRef::default() };
                        match m.accept_removal(&[node], 1, &ALERT, &no_reports(), now) {
                            Ok(Accepted::Done) => prop_assert!(m.target() <= before.target()),
                            Ok(_) => prop_assert_eq!(m.target(), before.target().map(|t| t - 1), "the target drops at once"),
                            Err(_) => {
                                prop_assert_eq!(m.target(), before.target(), "a refusal changes nothing");
                                prop_assert_eq!(m.queue(), before.queue());
                            }
                        }
                        prop_assert!(m.target().unwrap_or(0) >= 1 || before.target() == Some(0), "never the last worker");
                    }
                    Step::CloseWindow => match m.close_window(&ALERT, now) {
                        Ok(fx) => {
                            effects = fx;
                            m.window_answered(true);
                        }
                        Err(_) => prop_assert!(m.queue().remove.iter().all(|r| !r.in_window)),
                    },
                    Step::Decrease(d) => {
                        match m.decrease_target(d) {
                            Ok(got) => {
                                prop_assert_eq!(got.cancelled, d);
                                prop_assert_eq!(m.target(), before.target().map(|t| t - d), "after an OK the target dropped by the delta");
                            }
                            Err(_) => prop_assert_eq!(m.target(), before.target(), "a refusal changes nothing"),
                        }
                    }
                    Step::Answered
                    | Step::Refused
                    | Step::Lost
                    | Step::Found
                    | Step::NoJobFound
                    | Step::JobEnds { .. } => effects = cloudstack_answers(&mut m, &s, now, t0),
                    Step::Snapshot { scaling, workers, down, gone, secs } => {
                        now += Duration::from_secs(secs);
                        effects = m.snapshot_installed(workers_snapshot(scaling, workers, down, gone, now), &ALERT, now);
                        // (An open window is the shell's to close; its work goes then.)
                        if !scaling && m.phase() == &Phase::Idle && !m.queue().window_open {
                            // (Increases wait while a node a drain may have cordoned keeps
                            // the cluster in Alert: a scale-up would time out on it; and while
                            // owed removals that cannot go now still count in CloudStack's size
                            // and the increases on top of it would pass the group's maximum.)
                            let size = m.snapshot().map_or(0, |s| s.snap.size);
                            let past_max = !m.queue().remove.is_empty()
                                && m.max_size.is_some_and(|max| size + m.queue().increase.len() as u32 > max);
                            prop_assert!(m.queue().increase.is_empty() || !m.cordon_suspects().is_empty() || past_max, "queued work stranded: {:?}", m);
                            // Owed removals wait only for a reason: backing off, their VM to be
                            // stopped, or abandoned (until the VM is down).
                            let snap = m.snapshot().cloned();
                            let down = |id: &str| snap.as_ref().and_then(|s| s.snap.vm(id)).is_some_and(|v| v.state.is_down());
                            for r in &m.queue().remove {
                                let waits = r.not_before.is_some_and(|t| t > now)
                                    || (!down(&r.vm_id) && (r.stop != StopStage::NotNeeded || r.abandoned));
                                prop_assert!(waits, "queued removal stranded: {:?}", m);
                            }
                        }
                    }
                    Step::Cleanup => m.cleanup(),
                }
                let submits = effects.iter().filter(|e| matches!(e, Effect::Submit(_))).count();
                prop_assert!(submits <= 1);
                if submits == 1 {
                    prop_assert!(
                        !matches!(before.phase(), Phase::Submitting { .. } | Phase::AnswerLost { .. } | Phase::Running { .. } | Phase::Adopted { .. })
                            || matches!(s, Step::Refused | Step::JobEnds { .. } | Step::Snapshot { .. } | Step::NoJobFound),
                        "a request sent while another was in flight: {:?} then {:?}", before.phase(), s
                    );
                    prop_assert_eq!(m.phase().name(), "submitting");
                }
                let failed_placeholders = m.failed().iter().filter(|f| f.vm_id.is_none()).count();
                let floor = (m.queue().increase.len() + failed_placeholders) as u32;
                prop_assert!(m.target().unwrap_or(0) >= floor);
                prop_assert_eq!(m.target(), Some(listed_not_deleting(&m)), "target = listed instances not Deleting, after {:?}", s);
                let mut sent_twice = std::collections::HashSet::new();
                for r in &m.queue().remove {
                    prop_assert!(sent_twice.insert(r.vm_id.clone()), "a VM queued twice");
                    let in_flight = matches!(m.phase().op().map(|o| &o.kind), Some(OpKind::Remove { vm_ids, .. }) if vm_ids.contains(&r.vm_id));
                    prop_assert!(!in_flight, "a VM queued while its removal is in flight");
                }
            }
        }
    }
}

#[test]
fn poll_delays() {
    let poll = Duration::from_secs(2);
    let hour = Duration::from_secs(3600);
    let cases = [
        (0, 0, poll),
        (1, 0, Duration::from_secs(4)),
        (3, 0, Duration::from_secs(16)),
        (4, 0, Duration::from_secs(30)),
        (9, 0, Duration::from_secs(30)),
        (0, 7201, Duration::from_secs(60)),
        (0, 7200, poll),
    ];
    for (failed, secs, want) in cases {
        let got = poll_delay(poll, failed, Duration::from_secs(secs), 2 * hour);
        assert_eq!(got, want, "{failed} failed polls after {secs}s");
    }
}

/// A removal whose caller was answered OK at its deadline, before the window's request was
/// answered, is owed whatever the request's fate: refused, lost and never a job, or failed.
/// One whose caller heard the error (a refusal, a failure seen while DeleteNodes watched) is
/// not, and is never stopped; a lost answer is no error: the machine promises the window's
/// removals.
#[test]
fn a_removal_promised_at_the_deadline_is_owed_whatever_the_request_becomes() {
    let t0 = Instant::now();
    // Queued, or sent again.
    let queued = |m: &ScaleMachine| -> Vec<String> {
        let sent = match m.phase().op().map(|op| &op.kind) {
            Some(OpKind::Remove { vm_ids, .. }) => vm_ids.clone(),
            _ => Vec::new(),
        };
        m.queue()
            .remove
            .iter()
            .map(|r| r.vm_id.clone())
            .chain(sent)
            .collect()
    };
    type Outcome = fn(&mut ScaleMachine, Instant);
    let outcomes: [(&str, Outcome); 3] = [
        ("refused", |m, t| {
            m.submission_refused("CloudStack says no", &ALERT, t);
        }),
        ("lost, never a job", |m, t| {
            m.submission_lost();
            let later = t + Duration::from_secs(3600);
            m.snapshot_installed(running(3, later), &ALERT, later);
            m.no_job_found(&ALERT, later);
        }),
        ("failed after the watch", |m, t| {
            m.submission_answered("job-1".into(), t);
            let end = JobEnd::Failed {
                code: 530,
                text: "failed to remove the VM".into(),
            };
            m.snapshot_installed(running(3, t), &ALERT, t);
            m.job_finished("job-1", &end, true, false, &ALERT, t);
        }),
    ];
    for (what, outcome) in outcomes {
        // Promised: the caller's deadline came first.
        let mut m = machine_in("idle", t0);
        let accepted = m
            .accept_removals(&[node("w2")], 1, &ALERT, &no_reports(), t0)
            .expect("accepted");
        assert_eq!(accepted.vm_ids, ["w2"]);
        assert_eq!(m.close_window(&ALERT, t0), Ok(vec![remove_of(&["w2"])]));
        assert!(m.promise_removals(&accepted.vm_ids), "{what}");
        outcome(&mut m, t0);
        assert_eq!(queued(&m), ["w2"], "{what}: still owed");
        assert_eq!(m.target(), Some(2), "{what}: out of the target");

        // Not promised: the callers hear the outcome and the removal is dropped.
        let mut m = machine_in("idle", t0);
        let accepted = m
            .accept_removals(&[node("w2")], 1, &ALERT, &no_reports(), t0)
            .expect("accepted");
        m.close_window(&ALERT, t0).expect("sent");
        match what {
            "refused" => outcome(&mut m, t0),
            "lost, never a job" => {
                // A lost answer is no refusal: CloudStack may be removing the node now, so
                // the machine promises the window's removals and its callers hear OK.
                assert!(m.submission_lost(), "{what}: the callers hear OK");
                assert!(m.promise_removals(&accepted.vm_ids), "{what}");
                let later = t0 + Duration::from_secs(3600);
                m.snapshot_installed(running(3, later), &ALERT, later);
                m.no_job_found(&ALERT, later);
                assert_eq!(queued(&m), ["w2"], "{what}: owed, sent again");
                assert_eq!(m.target(), Some(2), "{what}: out of the target");
                continue;
            }
            _ => {
                // Failed while the DeleteNodes watched it: its callers hear the failure.
                m.submission_answered("job-1".into(), t0);
                let end = JobEnd::Failed {
                    code: 530,
                    text: "failed to remove the VM".into(),
                };
                m.snapshot_installed(running(3, t0), &ALERT, t0);
                m.job_finished("job-1", &end, true, true, &ALERT, t0);
                m.window_answered(false);
            }
        }
        assert!(queued(&m).is_empty(), "{what}: dropped");
        assert_eq!(m.target(), Some(3), "{what}: back in the target");
        // A caller whose deadline comes now hears the error, not OK.
        assert!(!m.promise_removals(&accepted.vm_ids), "{what}");
        m.window_closed();
    }
}

/// An owed removal that rode in a window's request is not dropped with the window's callers.
#[test]
fn an_owed_removal_in_a_refused_window_request_stays_owed() {
    let t0 = Instant::now();
    let mut m = machine_in("idle", t0);
    // w1 owed (its caller answered OK behind an operation), backing off after a failure.
    sent_and_owed(&mut m, "w1", t0);
    m.submission_refused("busy", &ALERT, t0);
    assert_eq!(m.queue().remove.len(), 1, "owed after the refusal");
    // Due again, w1 rides with a new window's w2 (both down: one request).
    let t1 = t0 + Duration::from_secs(3600);
    let down = snapshot(
        "Alert",
        &[
            ("w1", VmState::Stopped),
            ("w2", VmState::Stopped),
            ("w3", VmState::Running),
        ],
        t1,
    );
    m.snapshot_installed(down, &ALERT, t1);
    // The snapshot at rest sent w1 alone; CloudStack refused it: still owed.
    if m.phase().op().is_some() {
        m.submission_refused("busy", &ALERT, t1);
    }
    m.accept_removal(&[node("w2")], 1, &ALERT, &no_reports(), t1)
        .expect("accepted");
    let t2 = t1 + Duration::from_secs(3600);
    let sent = m.close_window(&ALERT, t2).expect("sent");
    assert!(
        sent.iter().any(|e| matches!(e, Effect::Submit(ScaleRequest::RemoveNodes { vm_ids }) if vm_ids.contains(&"w2".to_string()))),
        "{sent:?}"
    );
    m.submission_refused("no", &ALERT, t2);
    m.window_answered(false);
    let left: Vec<&str> = m.queue().remove.iter().map(|r| r.vm_id.as_str()).collect();
    assert!(left.contains(&"w1"), "the owed removal stays: {left:?}");
    assert!(
        !left.contains(&"w2"),
        "the window's removal is dropped: {left:?}"
    );
}

/// CloudStack's API throttling refuses a request before it runs: queued work goes back as it
/// was, never failed instances, never a failed removal attempt.
#[test]
fn a_throttled_queued_request_goes_back_to_the_queue_unchanged() {
    let t0 = Instant::now();
    let mut m = queued_increase_sent(t0);
    m.submission_throttled(t0);
    assert_eq!(m.phase(), &Phase::Idle);
    assert!(m.failed().is_empty(), "{:?}", m.failed());
    assert_eq!(m.queue().increase.len(), 2);
    assert_eq!(m.target(), Some(5));
    // Sent again with the next snapshot at rest.
    let fx = m.snapshot_installed(running3(t0), &ALERT, t0);
    assert_eq!(
        fx,
        vec![Effect::Submit(ScaleRequest::Resize { new_size: 5 })]
    );

    // An owed removal keeps its attempts and waits a moment.
    let mut m = machine_in("idle", t0);
    sent_and_owed(&mut m, "w2", t0);
    m.submission_throttled(t0);
    let r = &m.queue().remove[0];
    assert_eq!((r.vm_id.as_str(), r.attempts), ("w2", 0));
    assert_eq!(r.not_before, Some(t0 + Duration::from_secs(10)));
    assert_eq!(m.target(), Some(2));
}

/// What a restarted provider takes over: every promise (owed removals, queued increases, the
/// job in flight), nothing a caller has not heard OK for, and the same target once the first
/// snapshot is in.
#[test]
fn the_ledger_carries_every_promise_into_a_new_machine() {
    let t0 = Instant::now();
    let mut m = machine_in("idle", t0);
    // w1 owed and sent (its job runs), w2 owed behind it with a backoff, w3 in an open
    // window (its caller waits), two nodes of an IncreaseSize queued.
    sent_and_owed(&mut m, "w1", t0);
    m.submission_answered("job-7".into(), t0);
    m.accept_removal(&[node("w2")], 1, &ALERT, &no_reports(), t0)
        .expect("behind");
    m.queue.remove[0].not_before = Some(t0 + Duration::from_secs(90));
    m.queue.remove[0].attempts = 2;
    assert!(matches!(
        m.admit_increase(2, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    let target = m.target();

    let ledger = m.ledger(t0 + Duration::from_secs(30));
    let owed: Vec<&str> = ledger.removals.iter().map(|r| r.vm_id.as_str()).collect();
    assert_eq!(owed, ["w1", "w2"]);
    assert_eq!(ledger.removals[1].attempts, 2);
    assert_eq!(ledger.removals[1].wait, Some(Duration::from_secs(60)));
    assert_eq!(ledger.queued_increase, 2);
    assert_eq!(ledger.job.as_deref(), Some("job-7"));
    assert_eq!(ledger.drained, ["w1"], "sent to be drained while it ran");

    // A new process, later, in a cluster left in Alert: a scale-up waits for the drained VM.
    let mut alert = ScaleMachine::new(Some("cid".into()), timings());
    alert.restore(ledger.clone(), t0);
    let in_alert = snapshot(
        "Alert",
        &[
            ("w1", VmState::Running),
            ("w2", VmState::Stopped),
            ("w3", VmState::Running),
        ],
        t0,
    );
    alert.snapshot_installed(in_alert, &ALERT, t0);
    assert_eq!(alert.cordon_suspects(), ["k-node-w1"]);

    // A new process, later.
    let t1 = t0 + Duration::from_secs(600);
    let mut fresh = ScaleMachine::new(Some("cid".into()), timings());
    assert_eq!(
        fresh.restore(ledger.clone(), t1),
        vec![Effect::Follow("job-7".into())]
    );
    fresh.snapshot_installed(running3(t1), &ALERT, t1);
    assert_eq!(
        fresh.target(),
        target,
        "the same target as before the restart"
    );
    assert_eq!(
        fresh.phase().job(),
        Some("job-7"),
        "the job is followed, not resent"
    );
    assert_eq!(fresh.ledger(t1), {
        let mut l = ledger;
        l.removals[1].wait = Some(Duration::from_secs(60));
        // Still suspected although the cluster is listed Running: job-7, followed again, may
        // be a removal whose drain is still to fail.
        l
    });

    // A caller still waiting for its window is not in the ledger.
    let mut w = machine_in("idle", t0);
    w.accept_removal(&[node("w3")], 1, &ALERT, &no_reports(), t0)
        .expect("accepted");
    assert!(w.ledger(t0).is_empty());
}

/// A scale-up in flight waits for its new VMs to be Ready: no VM is stopped meanwhile (a
/// stopped VM fails the scale-up, which leaves its VMs). The stop goes once it ended.
#[test]
fn no_vm_is_stopped_while_a_scale_up_runs() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    assert_eq!(
        m.accept_removal(&[fake("w3", "unregistered")], 1, &ALERT, &no_reports(), t0),
        Ok(Accepted::Behind)
    );
    assert!(m.take_stops(t0).is_empty(), "stopped during the scale-up");
    listed_as_asked(&mut m);
    m.job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("our job");
    assert_eq!(m.take_stops(t0), ["w3"]);
}

/// Queued increases are not sent on top of a CloudStack size that still counts owed removals
/// which cannot go now, when that would pass the group's maximum: they wait for the removals.
#[test]
fn queued_increases_wait_rather_than_pass_the_maximum_over_blocked_removals() {
    let t0 = Instant::now();
    let max = 4;
    let mut m = machine_in("idle", t0);
    // (No stop first: the refused removal is simply tried again.)
    m.set_can_stop_vms(false);
    sent_and_owed(&mut m, "w1", t0);
    m.submission_refused("busy", &ALERT, t0);
    assert_eq!(m.target(), Some(2));
    // The autoscaler asks for 2 more: 2 + 2 is within the maximum.
    assert!(matches!(
        m.admit_increase(2, max, &ALERT),
        Ok(Admission::Queued(_))
    ));
    // w1 backs off: CloudStack's size 3 + 2 would be 5 workers.
    let t1 = t0 + Duration::from_secs(1);
    let fx = m.snapshot_installed(running3(t1), &ALERT, t1);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Submit(_))),
        "nothing sent past the maximum: {fx:?}"
    );
    assert_eq!(m.target(), Some(4));
    // Once due, the removal goes; once it is done the increase goes, within the maximum.
    let t2 = t0 + Duration::from_secs(3600);
    assert_eq!(
        m.snapshot_installed(running3(t2), &ALERT, t2),
        vec![remove_of(&["w1"])]
    );
    m.submission_answered("job-2".into(), t2);
    let two = snapshot_sized(
        "Running",
        &[("w2", VmState::Running), ("w3", VmState::Running)],
        2,
        t2,
    );
    m.snapshot_installed(two, &ALERT, t2);
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-2", &JobEnd::Succeeded, true, false, &ALERT, t2)
        .expect("our job");
    assert_eq!(
        settled.effects,
        vec![Effect::Submit(ScaleRequest::Resize { new_size: 4 })]
    );
}

/// A DeleteNodes naming a VM whose removal is already in flight is answered OK at once: that
/// OK is a promise too, kept when the request in flight turns out lost and never a job.
#[test]
fn a_second_delete_of_a_vm_in_a_lost_request_is_owed() {
    let t0 = Instant::now();
    let mut m = machine_in("idle", t0);
    m.accept_removal(&[node("w2")], 1, &ALERT, &no_reports(), t0)
        .expect("accepted");
    m.close_window(&ALERT, t0).expect("sent");
    m.submission_lost();
    // The first caller hears the lost answer (UNAVAILABLE).
    m.window_answered(false);
    m.window_closed();
    // The autoscaler tries again: the VM is being removed, answered OK.
    let again = m
        .accept_removals(&[node("w2")], 1, &ALERT, &no_reports(), t0)
        .expect("accepted");
    assert_eq!(again.accepted, Accepted::Done);
    assert_eq!(again.vm_ids, ["w2"]);
    // The lost request never became a job: the removal is sent again, not forgotten.
    let later = t0 + Duration::from_secs(3600);
    m.snapshot_installed(running3(later), &ALERT, later);
    let fx = m.no_job_found(&ALERT, later);
    assert_eq!(fx, vec![remove_of(&["w2"])]);
    assert_eq!(m.target(), Some(2));
}

/// An owed removal CloudStack's rules keep refusing backs off like one whose jobs fail, and is
/// abandoned, loudly, after as many tries: never retried silently for ever. (A key that may
/// not stop VMs: with one, the remedy is a stop, next test.)
#[test]
fn an_owed_removal_the_rules_keep_refusing_is_abandoned_loudly() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    m.set_can_stop_vms(false);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("owed behind the job");
    // In Alert with no worker down, CloudStack refuses every request (rule 7).
    let alert_all_running = |t| {
        snapshot(
            "Alert",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Running),
                ("w3", VmState::Running),
            ],
            t,
        )
    };
    m.snapshot_installed(alert_all_running(t0), &ALERT, t0);
    listed_as_asked(&mut m);
    m.job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0);
    let mut t = t0;
    let mut abandoned = false;
    for _ in 0..MAX_REMOVAL_ATTEMPTS + 2 {
        t += Duration::from_secs(3600);
        let fx = m.snapshot_installed(alert_all_running(t), &ALERT, t);
        assert!(!fx.iter().any(|e| matches!(e, Effect::Submit(_))), "{fx:?}");
        abandoned |= fx
            .iter()
            .any(|e| matches!(e, Effect::RemovalAbandoned { .. }));
    }
    assert!(abandoned, "abandoned after {MAX_REMOVAL_ATTEMPTS} refusals");
    let r = &m.queue().remove[0];
    assert!(r.abandoned && r.attempts >= MAX_REMOVAL_ATTEMPTS, "{r:?}");
    assert_eq!(m.target(), Some(2), "still out of the target");
}

/// An owed removal refused because the cluster is in Alert with no worker down (rule 7: a
/// node a failed drain left cordoned, whose job's outcome this provider never saw) is carried
/// through as a failed drain is: its VM stopped (the autoscaler drained the node before
/// asking), then removed as a down VM, which CloudStack allows in Alert.
#[test]
fn an_owed_removal_refused_for_alert_without_a_down_worker_stops_its_vm_then_removes_it() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("owed behind the job");
    let alert = |w1: VmState, t| {
        snapshot(
            "Alert",
            &[
                ("w1", w1),
                ("w2", VmState::Running),
                ("w3", VmState::Running),
            ],
            t,
        )
    };
    m.snapshot_installed(alert(VmState::Running, t0), &ALERT, t0);
    // The listing above was taken before the job ended: its size is not checked.
    m.job_finished("job-1", &JobEnd::Succeeded, false, false, &ALERT, t0);
    assert_eq!(m.take_stops(t0), ["w1"], "the promised VM is stopped");
    assert!(m.stop_answered("w1", StopAnswer::Stopping, t0).is_empty());
    let t1 = t0 + Duration::from_secs(5);
    let fx = m.snapshot_installed(alert(VmState::Stopped, t1), &ALERT, t1);
    assert!(fx.contains(&remove_of(&["w1"])), "{fx:?}");
    assert_eq!(m.target(), Some(2));
}

/// Never a scale request past the group's maximum, whatever moved CloudStack's size after an
/// increase was accepted: another client scaled the cluster while a scale-up of this provider
/// ran, so the queued increase no longer fits. It is reported failed (the autoscaler deletes
/// its placeholder and backs off); nothing is sent. Found by the fault campaign, where the
/// provider sent size 9 for a maximum of 6.
#[test]
fn queued_increases_that_no_longer_fit_under_the_maximum_are_failed_not_sent() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    // 3 → 5 running; one more fits the maximum of 6 by the target.
    let max = 6;
    assert!(matches!(
        m.admit_increase(1, max, &ALERT),
        Ok(Admission::Queued(_))
    ));
    assert_eq!(m.target(), Some(6));
    // Meanwhile another client's job took CloudStack's size to 6.
    let six: Vec<(String, VmState)> = (1..=6)
        .map(|i| (format!("w{i}"), VmState::Running))
        .collect();
    let six: Vec<(&str, VmState)> = six.iter().map(|(n, s)| (n.as_str(), s.clone())).collect();
    m.snapshot_installed(snapshot("Running", &six, t0), &ALERT, t0);
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("ours");
    assert!(
        !settled
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Submit(_))),
        "{:?}",
        settled.effects
    );
    assert!(m.queue().increase.is_empty());
}

/// A VM this provider asked CloudStack to remove (so to drain) that is still Running while
/// the cluster is in Alert may have a node the failed drain left cordoned: scale-ups wait
/// (CloudStack's would time out on it), until the VM is down or gone or the cluster is Running
/// again. Found by the fault campaign: a removal lost with its drain failed, a worker stopped
/// elsewhere, and the scale-up the rules then allowed stranded the cluster.
#[test]
fn a_scale_up_waits_while_a_node_this_provider_had_drained_may_be_cordoned() {
    let t0 = Instant::now();
    let mut m = machine_in("idle", t0);
    sent_and_owed(&mut m, "w1", t0);
    let alert = |w1: VmState, t| {
        snapshot(
            "Alert",
            &[
                ("w1", w1),
                ("w2", VmState::Stopped),
                ("w3", VmState::Running),
            ],
            t,
        )
    };
    m.snapshot_installed(alert(VmState::Running, t0), &ALERT, t0);
    assert_eq!(m.cordon_suspects(), ["k-node-w1"]);
    m.snapshot_installed(alert(VmState::Stopped, t0), &ALERT, t0);
    assert!(m.cordon_suspects().is_empty(), "down: not drained again");
    let mut m = machine_in("idle", t0);
    sent_and_owed(&mut m, "w1", t0);
    m.submission_answered("job-1".into(), t0);
    m.snapshot_installed(alert(VmState::Running, t0), &ALERT, t0);
    m.job_finished("job-1", &drain_failed("w1"), true, false, &ALERT, t0);
    let t1 = t0 + Duration::from_secs(1);
    m.snapshot_installed(alert(VmState::Running, t1), &ALERT, t1);
    let t2 = t1 + Duration::from_secs(1);
    m.snapshot_installed(running3(t2), &ALERT, t2);
    m.snapshot_installed(alert(VmState::Running, t2), &ALERT, t2);
    assert!(
        m.cordon_suspects().is_empty(),
        "Alert, then Running: CloudStack's scanner counted every node Ready"
    );
}

/// A `Running` listing asked for before the removal's job ended says nothing about the drain:
/// CloudStack lists the cluster Running until a worker picks the job up, and the job may then
/// fail on the drain, leaving the node cordoned. Found by the fault campaign: such a listing,
/// installed after the request was sent, cleared the suspicion, and a scale-up then timed out
/// on the cordoned node.
#[test]
fn a_running_listing_asked_for_before_the_removal_ended_keeps_the_cordon_suspicion() {
    let t0 = Instant::now();
    let mut m = machine_in("idle", t0);
    m.snapshot_installed(running3(t0), &ALERT, t0);
    let t1 = t0 + Duration::from_secs(1);
    sent_and_owed(&mut m, "w1", t1);
    // Asked for before the request was sent, installed after: stale.
    m.snapshot_installed(running3(t0), &ALERT, t1);
    let t2 = t1 + Duration::from_secs(1);
    m.submission_answered("job-9".into(), t2);
    // Asked for while the job ran (not yet picked up): Running, and our job in flight.
    m.snapshot_installed(running3(t2), &ALERT, t2);
    let t3 = t2 + Duration::from_secs(1);
    m.job_finished("job-9", &drain_failed("w1"), false, false, &ALERT, t3);
    // Asked for before the job's end was seen, installed after: stale too.
    m.snapshot_installed(running3(t2), &ALERT, t3);
    let alert = snapshot(
        "Alert",
        &[
            ("w1", VmState::Running),
            ("w2", VmState::Stopped),
            ("w3", VmState::Running),
        ],
        t3,
    );
    m.snapshot_installed(alert.clone(), &ALERT, t3);
    assert_eq!(m.cordon_suspects(), ["k-node-w1"]);

    // Another removal (of the down w2) succeeds: CloudStack lists the cluster Running after a
    // job's success whatever its cordons, then its scanner moves it back to Alert (w1's node
    // is cordoned). Found by the fault campaign: the scale-up sent then timed out.
    let t4 = t3 + Duration::from_secs(1);
    m.snapshot_installed(alert, &ALERT, t4);
    sent_and_owed(&mut m, "w2", t4);
    m.submission_answered("job-10".into(), t4);
    let t5 = t4 + Duration::from_secs(1);
    m.job_finished("job-10", &JobEnd::Succeeded, false, false, &ALERT, t5);
    let t6 = t5 + Duration::from_secs(1);
    let two = [("w1", VmState::Running), ("w3", VmState::Running)];
    m.snapshot_installed(snapshot("Running", &two, t6), &ALERT, t6);
    m.snapshot_installed(snapshot("Alert", &two, t6), &ALERT, t6);
    assert_eq!(m.cordon_suspects(), ["k-node-w1"]);
}

/// A queued scale-up in Alert with a node this provider had drained still Running: it waits
/// while the provider owes that VM's removal (carrying it out ends the suspicion), and is
/// reported failed, saying why and what the operator can do, when nobody owes it (the
/// removal was withdrawn): waiting would only make the autoscaler wait a provision time for
/// nodes that cannot come (and a client that does not decrease the target waits for ever).
#[test]
fn a_queued_scale_up_held_by_a_cordon_nobody_will_lift_is_reported_failed() {
    let t0 = Instant::now();
    let alert = |t| {
        snapshot(
            "Alert",
            &[
                ("w1", VmState::Running),
                ("w2", VmState::Stopped),
                ("w3", VmState::Running),
            ],
            t,
        )
    };
    // Owed: the drain failed, the provider carries the removal through.
    let mut m = machine_in("idle", t0);
    sent_and_owed(&mut m, "w1", t0);
    m.submission_answered("job-1".into(), t0);
    assert!(matches!(
        m.admit_increase(1, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
    m.snapshot_installed(alert(t0), &ALERT, t0);
    m.job_finished("job-1", &drain_failed("w1"), true, false, &ALERT, t0);
    assert_eq!(m.cordon_suspects(), ["k-node-w1"]);
    assert_eq!(m.queue().increase.len(), 1, "held");
    assert!(m.failed().is_empty(), "{:?}", m.failed());

    // Not owed any more: the autoscaler gave the node up (its mark is gone, the removal
    // withdrawn) after the drain failed.
    let t1 = t0 + Duration::from_secs(11);
    assert_eq!(m.removals_withdrawn(&["w1".to_string()]), ["w1"]);
    m.snapshot_installed(alert(t1), &ALERT, t1);
    assert_eq!(m.cordon_suspects(), ["k-node-w1"]);
    assert!(m.queue().increase.is_empty());
    let failed = m.failed();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].error.message.contains("k-node-w1")
            && failed[0].error.message.contains("remove or stop the VM"),
        "{failed:?}"
    );
}

/// A node a failed drain names may be left cordoned, whatever state the cluster is listed in
/// afterwards (a removal job's success lists it Running whatever its cordons), so it stays
/// suspected; a removal that failed past its drain (the node deleted, then the VM's destroy
/// failed: `KubernetesClusterScaleWorker.scaleDownKubernetesClusterSize`) or a request refused
/// before it became a job left no cordon. Found by the fault campaign (an autoscaler exit among
/// its ops): with the suspicion limited to clusters listed Alert, a scale-up timed out on the
/// cordoned node.
#[test]
fn a_node_a_failed_drain_names_stays_suspected_in_any_cluster_state() {
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_secs(1);
    let t2 = t1 + Duration::from_secs(1);
    let ended = |end: &JobEnd| {
        let mut m = machine_in("idle", t0);
        sent_and_owed(&mut m, "w1", t0);
        m.submission_answered("job-1".into(), t0);
        m.job_finished("job-1", end, true, false, &ALERT, t1);
        m.snapshot_installed(running3(t2), &ALERT, t2);
        m.cordon_suspects()
    };
    assert_eq!(ended(&drain_failed("w1")), ["k-node-w1"], "listed Running");
    let destroy_failed = JobEnd::Failed {
        code: 530,
        text: "Scaling failed for Kubernetes cluster k, unable to destroy VM k-node-w1".into(),
    };
    assert!(ended(&destroy_failed).is_empty(), "drained and deleted");
    assert!(ended(&JobEnd::Succeeded).is_empty());

    let mut m = machine_in("idle", t0);
    sent_and_owed(&mut m, "w1", t0);
    m.submission_refused("Unable to connect to the management server", &ALERT, t0);
    assert!(m.cordon_suspects().is_empty(), "{:?}", m.cordon_suspects());
}

/// Where the shell reads the cluster's Nodes, a suspected node CloudStack counts Ready (Ready,
/// not cordoned) is suspected no more: in a cluster listed Running the status scanner never
/// clears the suspicion (Running turns to Alert only for a VM or a map row, not a node), so an
/// operator's uncordon would otherwise hold scale-ups until the VM is removed. A reading asked
/// for before the last job ended, or while one runs, proves nothing.
#[test]
fn a_suspected_node_read_ready_and_schedulable_after_the_last_job_is_cleared() {
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_secs(1);
    let mut m = machine_in("idle", t0);
    sent_and_owed(&mut m, "w1", t0);
    m.submission_answered("job-1".into(), t0);
    assert!(
        m.cordons_to_check().is_empty(),
        "a job in flight may still drain it"
    );
    m.job_finished("job-1", &drain_failed("w1"), true, false, &ALERT, t1);
    m.snapshot_installed(running3(t1), &ALERT, t1);
    m.queue.remove.clear();
    assert_eq!(
        m.cordons_to_check(),
        [("w1".to_string(), "k-node-w1".to_string())]
    );
    m.nodes_counted_ready(&["w1".into()], t0);
    assert_eq!(
        m.cordon_suspects(),
        ["k-node-w1"],
        "read before the job ended"
    );
    m.nodes_counted_ready(&["w1".into()], t1 + Duration::from_millis(1));
    assert!(m.cordon_suspects().is_empty());
    assert!(m.cordons_to_check().is_empty());
}

/// An owed removal whose node the autoscaler no longer marks (a restarted autoscaler removed
/// every `ToBeDeletedByClusterAutoscaler` taint) is withdrawn: out of the queue, its VM back
/// in the target. One whose VM this provider already stopped is not: withdrawn, it would
/// leave a stopped VM nobody starts.
#[test]
fn removals_the_autoscaler_no_longer_marks_are_withdrawn_unless_their_vm_was_stopped() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    // Behind the scale-up in flight: answered OK at once, owed.
    for vm in ["w1", "w2"] {
        m.accept_removal(&[node(vm)], 1, &ALERT, &no_reports(), t0)
            .expect("accepted");
    }
    assert_eq!(m.target(), Some(3));
    let to_confirm = m.removals_to_confirm();
    assert_eq!(
        to_confirm,
        [
            ("w1".to_string(), "k-node-w1".to_string()),
            ("w2".to_string(), "k-node-w2".to_string())
        ]
    );
    // w2's VM was asked to stop: no longer a candidate.
    m.queue.remove[1].stop = StopStage::Sent;
    assert_eq!(m.removals_to_confirm().len(), 1);
    let withdrawn = m.removals_withdrawn(&["w1".to_string(), "w2".to_string()]);
    assert_eq!(withdrawn, ["w1"]);
    assert_eq!(m.target(), Some(4), "w1 counts again");
    assert_eq!(m.queue().remove.len(), 1);
    assert_eq!(m.queue().remove[0].vm_id, "w2");
}

/// CloudStack's refusal text as `recorded/alert_08_scale_err_alert_size_job_final` shows it.
fn unsupported() -> AlertScaling {
    AlertScaling::Unsupported {
        cloudstack_error: "Kubernetes cluster k is in Alert state and can not be scaled".into(),
    }
}

fn w1_stopped(state: &str, t: Instant) -> Arc<IndexedSnapshot> {
    snapshot(
        state,
        &[
            ("w1", VmState::Stopped),
            ("w2", VmState::Running),
            ("w3", VmState::Running),
        ],
        t,
    )
}

/// Issue 39, difference 3: an IncreaseSize in Alert on a CloudStack without Alert scaling was
/// queued behind a removal retry, answered OK, then refused by CloudStack and reported as a
/// failed creation. It is refused at once, in every phase.
#[test]
fn an_increase_in_alert_without_alert_scaling_is_refused_before_any_promise() {
    let t0 = Instant::now();
    for phase in ["idle", "running"] {
        let mut m = machine_in(phase, t0);
        m.snapshot_installed(w1_stopped("Alert", t0), &unsupported(), t0);
        let before = m.target();
        let got = m.admit_increase(1, MAX, &unsupported());
        assert!(
            matches!(
                got,
                Err(ScaleError::Refused(Refusal::AlertUnsupported { .. }))
            ),
            "{phase}: {got:?}"
        );
        assert_eq!(m.target(), before, "{phase}: nothing queued");
        assert!(m.queue().increase.is_empty());
    }
    // The verdict unknown, or the cluster Running: admitted as before.
    let mut m = machine_in("running", t0);
    m.snapshot_installed(w1_stopped("Alert", t0), &ALERT, t0);
    assert!(matches!(
        m.admit_increase(1, MAX, &ALERT),
        Ok(Admission::Queued(_))
    ));
}

/// Issue 39, difference 2: without Alert scaling a down worker's removal fails on its drain
/// and puts the cluster in Alert, so DeleteNodes is refused before promising, naming what
/// the operator must do, whether the cluster is at rest or a job runs.
#[test]
fn a_down_workers_removal_without_alert_scaling_is_refused_before_any_promise() {
    let t0 = Instant::now();
    for phase in ["idle", "running"] {
        let mut m = machine_in(phase, t0);
        m.snapshot_installed(w1_stopped("Running", t0), &unsupported(), t0);
        let before = m.target();
        let got = m.accept_removal(&[node("w1")], 1, &unsupported(), &no_reports(), t0);
        let Err(ScaleError::Refused(r @ Refusal::DownWorkerNotRemovable { .. })) = &got else {
            panic!("{phase}: {got:?}");
        };
        let msg = r.to_string();
        assert!(
            msg.contains("k-node-w1 (Stopped)")
                && msg.contains("start the VM")
                && msg.contains("remove it in CloudStack"),
            "{msg}"
        );
        assert_eq!(m.target(), before, "{phase}: nothing promised");
        assert!(m.queue().remove.is_empty());
        // A Running worker is still accepted.
        assert!(
            m.accept_removal(&[node("w2")], 1, &unsupported(), &no_reports(), t0)
                .is_ok()
        );
    }
}

/// An owed removal whose VM went down on a CloudStack without Alert scaling is said once,
/// loudly, and held (not retried and abandoned over half an hour); it goes out once the VM
/// runs again.
#[test]
fn an_owed_removal_of_a_down_vm_without_alert_scaling_waits_for_an_operator_loudly() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
        .expect("owed behind the job");
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("ours");
    assert_eq!(settled.effects, vec![remove_of(&["w1"])]);
    // Its job fails on the drain of the stopped VM (the shape of `recorded/running_35_…`).
    m.submission_answered("job-2".into(), t0);
    m.snapshot_installed(w1_stopped("Alert", t0), &ALERT, t0);
    let text = "Scaling failed for Kubernetes cluster KubernetesCluster {\"id\":1,\"name\":\"k\",\
                \"uuid\":\"cid\"}, failed to remove Kubernetes node: k-node-w1 running on VM : \
                VM instance {\"id\":7,\"instanceName\":\"i-2-7-VM\",\"state\":\"Stopped\",\
                \"type\":\"User\",\"uuid\":\"w1\"}";
    let end = JobEnd::Failed {
        code: 530,
        text: text.into(),
    };
    let s = m
        .job_finished("job-2", &end, true, false, &ALERT, t0)
        .expect("ours");
    assert!(
        s.alert_refusal,
        "a stopped VM's drain failure teaches the verdict"
    );
    // With the verdict learned from this very failure: held and said at once, before any
    // later listing, then never said again nor sent.
    let blocked: Vec<&Effect> = s
        .effects
        .iter()
        .filter(|e| matches!(e, Effect::RemovalBlocked { .. }))
        .collect();
    assert!(
        matches!(blocked[..], [Effect::RemovalBlocked { vms, .. }] if vms == &["k-node-w1"]),
        "{:?}",
        s.effects
    );
    assert!(
        !s.effects.iter().any(|e| matches!(e, Effect::Submit(_))),
        "{:?}",
        s.effects
    );
    let later = at(t0, 3600);
    for i in 0..20 {
        let fx = m.snapshot_installed(w1_stopped("Alert", t0), &unsupported(), at(later, i * 600));
        assert!(fx.is_empty(), "said once, never sent: {fx:?}");
    }
    let q = &m.queue().remove[0];
    assert!(!q.abandoned, "still owed");
    assert!(
        q.trouble
            .as_deref()
            .unwrap_or_default()
            .contains("start the VM"),
        "{q:?}"
    );
    assert_eq!(m.target(), Some(2), "still out of the target");
    // The operator starts the VM and the scanner lists the cluster Running: sent.
    let fx = m.snapshot_installed(running3(t0), &unsupported(), at(later, 30_000));
    assert_eq!(fx, vec![remove_of(&["w1"])]);
}

/// Issue 39, difference 1: listAsyncJobs lists running jobs only, so a queued scale-up
/// whose job failed in validation is never found. Its callers heard OK long ago: settled by
/// CloudStack's unchanged size, its nodes are reported failed, not dropped from the target.
#[test]
fn a_lost_queued_scale_up_whose_job_ended_unseen_is_reported_failed() {
    let t0 = Instant::now();
    let mut m = queued_increase_sent(t0);
    m.submission_lost();
    assert_eq!(m.target(), Some(5));
    assert_eq!(
        m.snapshot_installed(running3(t0), &ALERT, at(t0, 11)),
        vec![Effect::FindJob]
    );
    assert!(m.no_job_found(&ALERT, at(t0, 11)).is_empty());
    assert_eq!(m.phase(), &Phase::Idle);
    let failed: Vec<_> = m.failed().iter().map(|f| f.error.code.as_str()).collect();
    assert_eq!(failed, ["scale-up-refused", "scale-up-refused"]);
    assert_eq!(m.target(), Some(5), "the autoscaler sees failed creations");
}

/// The same for a lost removal: a job that failed on its drain is never listed, and left the
/// cluster in Alert; the VM stays owed and suspected of a cordon (no scale-up is sent on top
/// of it), and its removal goes out again.
#[test]
fn a_lost_removal_whose_job_ended_unseen_stays_owed_and_suspected() {
    let t0 = Instant::now();
    let mut m = machine_in("idle", t0);
    sent_and_owed(&mut m, "w1", t0);
    m.submission_lost();
    let alert = snapshot(
        "Alert",
        &[
            ("w1", VmState::Running),
            ("w2", VmState::Running),
            ("w3", VmState::Running),
        ],
        t0,
    );
    assert_eq!(
        m.snapshot_installed(alert, &ALERT, at(t0, 11)),
        vec![Effect::FindJob]
    );
    m.no_job_found(&ALERT, at(t0, 11));
    assert_eq!(m.cordon_suspects(), ["k-node-w1"]);
    assert_eq!(m.target(), Some(2), "still owed");
    assert!(m.queue().remove.iter().any(|r| r.vm_id == "w1") || m.phase().name() == "submitting");
}

/// A scale-up job that ends successfully while CloudStack still lists the old size (a stored
/// version of `KubernetesClusterScaleWorker.scaleCluster` returns from its node-type loop before
/// the workers) is not trusted: the VMs asked for become failed creations, said once.
#[test]
fn a_successful_scale_up_job_that_left_the_size_alone_is_reported_failed() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    assert_eq!(m.target(), Some(5));
    // Read after the job: still size 3, no new VM.
    m.snapshot_installed(running3(t0), &ALERT, t0);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("our job");
    assert_eq!(
        settled.effects,
        vec![Effect::SizeNotReached {
            job: "job-1".into(),
            asked: 5,
            listed: 3
        }]
    );
    assert_eq!(m.phase().name(), "idle");
    let failed: Vec<&FailedInstance> = m.failed.iter().collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    for f in failed {
        assert_eq!(f.vm_id, None);
        assert_eq!(f.error.code, "scale-up-failed");
        assert!(f.error.message.contains("lists size 3, not 5"), "{f:?}");
    }
    // Placeholders stay in the target as failed creations, for the autoscaler to delete.
    assert_eq!(m.target(), Some(5));

    // Half done (one VM listed, size 4): only the missing one is failed.
    let mut m = machine_in("running", t0);
    let four = snapshot(
        "Running",
        &[
            ("w1", VmState::Running),
            ("w2", VmState::Running),
            ("w3", VmState::Running),
            ("w4", VmState::Running),
        ],
        t0,
    );
    m.snapshot_installed(four, &ALERT, t0);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("our job");
    assert!(matches!(
        &settled.effects[..],
        [Effect::SizeNotReached { listed: 4, .. }]
    ));
    assert_eq!(m.failed.len(), 1);

    // The size asked for is listed: nothing to report.
    let mut m = machine_in("running", t0);
    listed_as_asked(&mut m);
    let settled = m
        .job_finished("job-1", &JobEnd::Succeeded, true, false, &ALERT, t0)
        .expect("our job");
    assert!(settled.effects.is_empty(), "{:?}", settled.effects);
    assert!(m.failed.is_empty());
}

/// apache/cloudstack#11994: a size job failing on the offering map makes every later size
/// request of the cluster a refusal before any promise (IncreaseSize is never answered OK to
/// fail the same way), until a listing shows the cluster's offerings changed. Removals by node
/// are not affected.
#[test]
fn a_size_job_failing_on_running_kvm_offerings_refuses_size_requests_until_offerings_change() {
    let t0 = Instant::now();
    let mut m = machine_in("running", t0);
    let text = "Scaling Kubernetes cluster : k failed, scaling Kubernetes cluster with running \
                VMs on hypervisor KVM is not supported!";
    m.job_finished(
        "job-1",
        &JobEnd::Failed {
            code: 530,
            text: text.into(),
        },
        true,
        true,
        &ALERT,
        t0,
    )
    .expect("our job");
    let refused = |m: &mut ScaleMachine| match m.admit_increase(1, MAX, &ALERT) {
        Err(ScaleError::Refused(Refusal::SizeScalingBroken {
            cloudstack_error, ..
        })) => {
            assert_eq!(cloudstack_error, text);
            true
        }
        _ => false,
    };
    assert!(refused(&mut m));
    assert!(matches!(
        m.start_increase(1, MAX, &ALERT, t0),
        Err(ScaleError::Refused(Refusal::SizeScalingBroken { .. }))
    ));
    assert!(
        m.accept_removal(&[node("w1")], 1, &ALERT, &no_reports(), t0)
            .is_ok()
    );
    // The same listing again: still refused.
    m.snapshot_installed(running3(t0), &ALERT, t0);
    assert!(refused(&mut m));
    // The operator changed the offerings: asked again.
    let snap = running3(t0);
    let mut changed = snap.snap.clone();
    changed.service_offering = Some(crate::cluster::OfferingRef {
        id: "o-2".into(),
        name: "cks-large".into(),
    });
    m.snapshot_installed(Arc::new(IndexedSnapshot::new(changed, t0)), &ALERT, t0);
    assert!(!refused(&mut m));
    // Any other failure of a size job teaches nothing of the kind.
    let mut m = machine_in("running", t0);
    m.job_finished(
        "job-1",
        &JobEnd::Failed {
            code: 530,
            text: "insufficient capacity".into(),
        },
        true,
        true,
        &ALERT,
        t0,
    );
    assert!(!refused(&mut m));
}

/// The collection window closes [`WINDOW_QUIET`] after its last arrival, at most the cap after
/// its first; with no caller in it, at once.
#[test]
fn the_window_closes_once_calls_stop_coming_within_its_cap() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let cap = ms(500);
    let mut m = ScaleMachine::new(Some("cid".into()), Timings::default());
    m.queue.window_open = true;
    assert_eq!(m.window_closes_at(cap), None);
    m.queue
        .remove
        .push(QueuedRemoval::new("w1".into(), "w1".into(), t0, true));
    assert_eq!(m.window_closes_at(cap), Some(t0 + WINDOW_QUIET));
    m.queue.remove.push(QueuedRemoval::new(
        "w2".into(),
        "w2".into(),
        t0 + ms(60),
        true,
    ));
    assert_eq!(m.window_closes_at(cap), Some(t0 + ms(60) + WINDOW_QUIET));
    // Arrivals that keep coming do not hold it open past the cap.
    for (i, at) in [150, 240, 330, 420].into_iter().enumerate() {
        let vm = format!("w{}", i + 3);
        m.queue
            .remove
            .push(QueuedRemoval::new(vm.clone(), vm, t0 + ms(at), true));
    }
    assert_eq!(m.window_closes_at(cap), Some(t0 + cap));
    // Removals owed from before (answered already) do not count as arrivals.
    let mut m = ScaleMachine::new(Some("cid".into()), Timings::default());
    m.queue.window_open = true;
    m.queue.remove.push(QueuedRemoval::new(
        "old".into(),
        "old".into(),
        t0 + ms(400),
        false,
    ));
    m.queue
        .remove
        .push(QueuedRemoval::new("w1".into(), "w1".into(), t0, true));
    assert_eq!(m.window_closes_at(cap), Some(t0 + WINDOW_QUIET));
    // A cap below the quiet time wins.
    assert_eq!(m.window_closes_at(ms(30)), Some(t0 + ms(30)));
}

/// What the caller who watched a failed job hears: OK when its removal is carried through or a
/// scale-up failed part-way (failed creations), CloudStack's refusal when nothing changed (the
/// key's when the job says so), a removal's failure otherwise.
#[test]
fn a_watched_failure_is_answered_by_what_the_job_did() {
    let settled = |kind, changed, owed| Settled {
        kind,
        op: None,
        changed,
        alert_refusal: false,
        effects: Vec::new(),
        owed,
    };
    let failed = |code, text: &str| JobEnd::Failed {
        code,
        text: text.into(),
    };
    let drain = failed(530, "failed to remove Kubernetes node");
    assert_eq!(
        settled(JobKind::RemoveNodes, true, true).watched_answer(&drain),
        WatchedAnswer::CarriedThrough
    );
    assert_eq!(
        settled(JobKind::RemoveNodes, true, false).watched_answer(&drain),
        WatchedAnswer::Failed {
            code: 530,
            text: "failed to remove Kubernetes node".into()
        }
    );
    assert_eq!(
        settled(JobKind::ScaleUp, true, false).watched_answer(&failed(530, "provision")),
        WatchedAnswer::FailedCreations
    );
    assert_eq!(
        settled(JobKind::ScaleUp, false, false).watched_answer(&JobEnd::Cancelled),
        WatchedAnswer::Cancelled
    );
    let perm = failed(
        530,
        "Caller does not have permission to operate with provided resource.",
    );
    assert!(matches!(
        settled(JobKind::ScaleUp, false, false).watched_answer(&perm),
        WatchedAnswer::Refused {
            code: 530,
            key_not_permitted: true,
            alert_unsupported: false,
            ..
        }
    ));
}

/// A stop whose answer was lost (no answer, a proxy's page) is no failure: it is asked again
/// after the pause unless a snapshot shows the VM down first, and never brings the removal
/// nearer to being abandoned, however often it happens.
#[test]
fn a_stop_whose_answer_was_lost_is_asked_again_and_counts_no_failure() {
    let t0 = Instant::now();
    let mut m = ScaleMachine::new(Some("cid".into()), timings());
    m.snapshot_installed(running(3, t0), &ALERT, t0);
    m.accept_removal(&[fake("w3", "create-error")], 1, &ALERT, &no_reports(), t0)
        .expect("accepted");
    assert_eq!(m.close_window(&ALERT, t0), Ok(vec![]));
    m.window_answered(true);
    let mut t = t0;
    for _ in 0..(2 * MAX_REMOVAL_ATTEMPTS) {
        assert_eq!(m.take_stops(t), ["w3"]);
        let told = m.stop_answered("w3", StopAnswer::Unknown("connection reset"), t);
        assert!(
            told.is_empty(),
            "never abandoned for lost answers: {told:?}"
        );
        assert!(m.take_stops(t).is_empty(), "asked again only after a pause");
        t += retry_delay(1);
    }
    let r = &m.queue().remove[0];
    assert_eq!(r.attempts, 0);
    assert!(!r.abandoned);
    // The stop had gone through: the snapshot shows the VM down, and its removal goes.
    let stopped = snapshot(
        "Alert",
        &[
            ("w1", VmState::Running),
            ("w2", VmState::Running),
            ("w3", VmState::Stopped),
        ],
        t,
    );
    assert_eq!(
        m.snapshot_installed(stopped, &ALERT, t),
        vec![remove_of(&["w3"])]
    );
}

/// The shell publishes the machine as a view and the next change copies it: a learn after the
/// copy (a new node, a node under another providerID, a node back on the default one) must
/// leave the view answering as before, while the machine answers what it learned.
#[test]
fn a_learn_after_a_copy_leaves_the_copy_as_it_was() {
    let t0 = Instant::now();
    let mut m = machine_in("idle", t0);
    let at = |vm: &str| Hit::Vm(m.snapshot().expect("a snapshot").by_id[vm]);
    let (w1, w2, w3) = (at("w1"), at("w2"), at("w3"));
    assert!(m.learn("w1", "k3s://node-a", "node-a"));
    assert!(m.learn("w3", "k3s://node-c", "node-c"));
    let view = m.clone();

    assert!(m.learn("w2", "k3s://node-b", "node-b"));
    assert!(m.learn("w1", "k3s://node-a2", "node-a"));
    assert!(!m.learn("w3", &crate::nodeid::default_provider_id("w3"), "node-c"));

    // The view: what was learned before the copy, and nothing after it.
    assert_eq!(view.resolve("k3s://node-a", "node-a"), Some(w1.clone()));
    assert_eq!(view.resolve("k3s://node-a2", ""), None);
    assert_eq!(view.resolve("k3s://node-b", ""), None);
    assert_eq!(view.resolve("k3s://node-c", ""), Some(w3.clone()));
    assert_eq!(view.instance_id("w1"), "k3s://node-a");
    assert_eq!(view.instance_id("w2"), "external-cloudstack://w2");
    assert_eq!(view.instance_id("w3"), "k3s://node-c");
    assert!(view.would_learn("w2", "k3s://node-b", "node-b"));
    assert!(!view.would_learn("w3", "k3s://node-c", "node-c"));

    // The machine: every learn, the replaced and forgotten providerIDs no longer its own.
    assert_eq!(m.resolve("k3s://node-a", ""), None);
    assert_eq!(m.resolve("k3s://node-a2", ""), Some(w1));
    assert_eq!(m.resolve("k3s://node-b", ""), Some(w2));
    assert_eq!(m.resolve("k3s://node-c", ""), None);
    assert_eq!(m.resolve("external-cloudstack://w3", ""), Some(w3));
    assert_eq!(m.instance_id("w1"), "k3s://node-a2");
    assert_eq!(m.instance_id("w2"), "k3s://node-b");
    assert_eq!(m.instance_id("w3"), "external-cloudstack://w3");
    assert!(!m.would_learn("w2", "k3s://node-b", "node-b"));
    assert!(m.would_learn("w3", "k3s://node-c", "node-c"));
}
