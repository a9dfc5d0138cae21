//! Removals answered OK are promises kept. Once NodeGroupDeleteNodes answers OK the real
//! autoscaler keeps the node's ToBeDeleted taint and counts it as gone
//! (`core/scaledown/actuation/delete_in_batch.go` `RegisterAndRecordSuccessfulScaleDownEvent`),
//! so the provider carries the removal through CloudStack's failures, and sends only requests
//! CloudStack can finish: CloudStack drains every Running VM it removes, one at a time, and
//! lowers `size` only at the end (`KubernetesClusterScaleWorker.scaleDownKubernetesClusterSize`).

use cks_proto as pb;
use cks_proto::instance_status::InstanceState;
use cks_sim::{ClusterSpec, KeyRole, Scenario};
use cks_testkit::stack::*;
use cks_testkit::*;
use std::time::Duration;
use tonic::Code;

/// The fake node the autoscaler builds for an instance without a node.
fn fake_node(vm_id: &str, reason: &str) -> pb::ExternalGrpcNode {
    let id = format!("external-cloudstack://{vm_id}");
    let mut n = node(&id, &id);
    n.annotations.insert(
        cks_lab::autoscaler::FAKE_NODE_REASON_ANNOTATION.into(),
        reason.into(),
    );
    n
}

/// The VM id of the provider's question at start, whether its key may stop VMs.
const NO_SUCH_VM: &str = "00000000-0000-4000-8000-000000000000";

/// `stopVirtualMachine` requests naming a VM (the provider's question at start names none).
fn vm_stops(env: &Stack) -> usize {
    env.sim
        .requests()
        .iter()
        .filter(|r| {
            r.command == "stopVirtualMachine"
                && r.params.get("id").map(String::as_str) != Some(NO_SUCH_VM)
        })
        .count()
}

/// The `nodeids` requests CloudStack got, in order.
fn removals(env: &Stack) -> Vec<String> {
    env.scale_requests()
        .iter()
        .filter_map(|r| r.get("nodeids").cloned())
        .collect()
}

/// A removal window's request does not wait for a stop the group's loop has under way. A fake
/// node of a Running VM is promised with a stop first (its drain would fail); CloudStack takes
/// half a minute to answer that `stopVirtualMachine` (the provider's client gives up before,
/// after its request timeout). Meanwhile another node's DeleteNodes opens a window: its
/// request goes out within moments (the window's quiet time and a listing), not once the stop
/// call ends (the loop once did one thing at a time: the window waited for the stop, 3 s here).
#[tokio::test(start_paused = true)]
async fn a_windows_request_does_not_wait_for_a_slow_stop() {
    let mut env = Stack::refreshed(pool(4), "pool", |s| s.groups[0].min = 1).await;
    let workers = env.workers();
    let slow = Duration::from_secs(30);
    env.sim.configure(|s| {
        s.command_latency = Some(("stopVirtualMachine".into(), slow));
    });
    env.delete(vec![fake_node(&workers[0].0, "unregistered")])
        .await
        .expect("promised, its VM to be stopped first");
    wait_until("the stop sent", async || vm_stops(&env) == 1).await;
    let stop_at = env
        .sim
        .requests()
        .iter()
        .rfind(|r| r.command == "stopVirtualMachine")
        .map(|r| r.atms)
        .expect("recorded");
    env.delete(vec![worker_node(&workers[1])])
        .await
        .expect("accepted");
    let sent_at = env
        .sim
        .requests()
        .iter()
        .find(|r| {
            r.command == "scaleKubernetesCluster" && r.params.get("nodeids") == Some(&workers[1].0)
        })
        .map(|r| r.atms);
    let sent_at = sent_at.expect("the other node's removal sent while the stop is unanswered");
    let waited = Duration::from_millis(sent_at.saturating_sub(stop_at));
    assert!(
        waited < Duration::from_secs(1),
        "sent {waited:?} after the stop, which CloudStack answers after {slow:?}"
    );
    env.shutdown().await;
}

/// The drain of a removed node fails once (CloudStack's job fails, the cluster goes to Alert
/// with the node cordoned and no worker down, where every request is refused). The removal
/// stays owed: the VM is listed Deleting and stays out of the target, the provider stops it
/// and removes it as a down VM, which CloudStack does not drain.
#[tokio::test(start_paused = true)]
async fn a_failed_drain_is_carried_through_by_stopping_the_vm() {
    let mut cfg = pool(4);
    cfg.settings.fail_drains = 1;
    let mut env = Stack::refreshed(cfg, "pool", |s| s.groups[0].min = 1).await;
    let victim = env.workers().remove(0);
    env.delete(vec![worker_node(&victim)])
        .await
        .expect("accepted");
    assert_eq!(env.target().await, 3);
    wait_until("the removal's first job to fail", async || {
        env.sim.running_jobs(&env.cluster_id) == 0 && env.cluster_state() == "Alert"
    })
    .await;
    wait_until("the VM to be gone", async || {
        let _ = env.refresh().await;
        // Never back in the target: the autoscaler counts the node as gone.
        assert_eq!(env.target().await, 3);
        !env.workers().iter().any(|w| w.0 == victim.0) && env.sim.running_jobs(&env.cluster_id) == 0
    })
    .await;
    assert_eq!(vm_stops(&env), 1, "stopped once");
    assert_eq!(
        removals(&env),
        [victim.0.clone(), victim.0.clone()],
        "sent again once down"
    );
    wait_until("the cluster back to Running", async || {
        env.cluster_state() == "Running"
    })
    .await;
    assert_eq!(env.cluster_size(), 3);
    env.wait_provider_settled().await;
    assert_eq!(env.target().await, 3);
    env.shutdown().await;
}

/// With the key CKS gives a project cluster (Project Kubernetes Service Role: no
/// stopVirtualMachine), a failed drain cannot be recovered by the provider: the instance says
/// what the operator must do, the node stays out of the target, and once the operator stops
/// the VM the provider removes it. A fake node of a Running VM (whose drain CloudStack would
/// fail) is refused from then on before anything is promised.
#[tokio::test(start_paused = true)]
async fn with_the_project_key_a_failed_drain_waits_for_the_operator_and_says_so() {
    let mut cfg = pool(4);
    cfg.settings.fail_drains = 1;
    cfg.settings.key_role = KeyRole::ProjectKubernetes;
    let mut env = Stack::refreshed(cfg, "pool", |s| s.groups[0].min = 1).await;
    let workers = env.workers();
    let victim = workers[0].clone();
    env.delete(vec![worker_node(&victim)])
        .await
        .expect("accepted");
    // The provider asked at start whether its key may stop VMs: it does not try.
    wait_until(
        "the failed drain to be shown waiting for an operator",
        async || {
            let _ = env.refresh().await;
            env.instances().await.iter().any(|i| {
                i.id.ends_with(&victim.0)
                    && i.status
                        .as_ref()
                        .and_then(|s| s.error_info.as_ref())
                        .is_some_and(|e| e.error_message.contains("stopVirtualMachine id="))
            })
        },
    )
    .await;
    assert_eq!(vm_stops(&env), 0, "no stop the key may not make");
    let shown = env.instances().await;
    let i = shown
        .iter()
        .find(|i| i.id.ends_with(&victim.0))
        .expect("listed");
    assert_eq!(
        i.status.as_ref().map(|s| s.instance_state),
        Some(InstanceState::InstanceDeleting as i32)
    );
    let message = &i
        .status
        .as_ref()
        .and_then(|s| s.error_info.as_ref())
        .expect("error")
        .error_message;
    assert!(
        message.contains(&format!("stopVirtualMachine id={}", victim.0)),
        "{message}"
    );
    assert_eq!(env.target().await, 3, "still out of the target");
    // Learned: a Running VM without a node is refused up front now.
    let e = env
        .delete(vec![fake_node(&workers[1].0, "unregistered")])
        .await
        .expect_err("refused before any promise");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("never registered"), "{}", e.message());
    // The operator stops the VM: the provider removes it as a down VM.
    assert!(env.sim.stop_vm(&victim.0));
    wait_until("the VM to be gone", async || {
        let _ = env.refresh().await;
        !env.workers().iter().any(|w| w.0 == victim.0) && env.sim.running_jobs(&env.cluster_id) == 0
    })
    .await;
    assert_eq!(env.cluster_size(), 3);
    assert_eq!(env.target().await, 3);
    env.shutdown().await;
}

/// CloudStack limits page sizes (`default.page.size`): the provider learns the limit from
/// CloudStack's refusal and pages within it.
#[tokio::test(start_paused = true)]
async fn a_page_limit_below_the_clients_is_learned() {
    let mut cfg = pool(3);
    cfg.settings.default_page_size = 100;
    let mut env = Stack::refreshed(cfg, "pool", |_| {}).await;
    env.increase(1).await.expect("scale-up");
    wait_until("the scale-up done", async || {
        let _ = env.refresh().await;
        env.cluster_size() == 4 && env.sim.running_jobs(&env.cluster_id) == 0
    })
    .await;
    env.wait_provider_settled().await;
    assert_eq!(env.target().await, 4);
    env.shutdown().await;
}

/// The mock autoscaler (which keeps a node's ToBeDeleted taint after an OK DeleteNodes and
/// counts it as Deleted) scales down empty nodes while CloudStack fails the first drain. Had
/// the provider put the VM back in the target, the autoscaler would see a phantom upcoming
/// node (`clusterstate.go` `GetUpcomingNodes`: target − ready − unready − long unregistered)
/// and hold back scale-ups for it. It never does, the node leaves, the loop never aborts and
/// fixNodeGroupSize never acts.
#[tokio::test(start_paused = true)]
async fn scale_down_through_a_failed_drain_leaves_no_phantom_upcoming_node() {
    let mut spec = ClusterSpec::new("shrink", 1, 4);
    spec.autoscaling = true;
    spec.min_size = Some(1);
    spec.max_size = Some(10);
    let mut config = sim_config();
    config.scenario = Scenario::with_cluster(spec);
    config.settings.job_duration = std::time::Duration::from_millis(200);
    config.settings.fail_drains = 1;
    let stack = Stack::start(config, "shrink", |_| {}).await;
    let mut ca = stack.autoscaler(autoscaler_config(600, 30, WAIT)).await;
    ca.set_needed_nodes(3);
    loop_until(&mut ca, "one node removed", |ca| {
        stack.cluster_size() == 3
            && stack.sim.running_jobs(&stack.cluster_id) == 0
            && ca.last_loop().is_some_and(|l| l.ready == 3)
    })
    .await;
    loop_until(&mut ca, "the cluster back to Running", |_| {
        stack.cluster_state() == "Running"
    })
    .await;
    show("removal through a failed drain", &ca);
    let phantoms = ca.timeline().phantom_upcoming_nodes();
    assert!(phantoms.is_empty(), "phantom upcoming nodes: {phantoms:?}");
    assert_eq!(
        ca.timeline().longest_size_fix_streak(),
        0,
        "fixNodeGroupSize acted\n{}",
        ca.timeline()
    );
    for l in ca.timeline().loops() {
        assert!(l.aborted.is_none(), "{l}");
    }
    for c in ca.calls(cks_lab::autoscaler::Rpc::NodeGroupDeleteNodes) {
        assert!(c.is_ok(), "{c}");
    }
    assert!(
        stack
            .sim
            .requests()
            .iter()
            .any(|r| r.command == "stopVirtualMachine"),
        "the VM whose drain failed was stopped"
    );
    assert_eq!(ca.last_target(&stack.cluster_id), Some(3));
    stack.shutdown().await;
}

/// CloudStack slower than the autoscaler's deadline, then failing: DeleteNodes answers at its
/// deadline, before the request's fate is known, and whatever it answers is kept. An OK is a
/// removal carried through (never back in the target, the VM removed in the end); an error
/// leaves the node as it was. Here every request is answered late with a proxy's 5xx (not
/// executed), so an OK can only be kept by sending the removal again once CloudStack is back.
#[tokio::test(start_paused = true)]
async fn a_removal_answered_at_its_deadline_is_kept_whatever_cloudstack_does() {
    for latency_ms in [2_400, 3_000, 4_000] {
        let mut env = Stack::refreshed(pool(4), "pool", |s| s.groups[0].min = 1).await;
        let victim = env.workers().remove(0);
        env.sim.configure(|c| {
            c.latency = std::time::Duration::from_millis(latency_ms);
            c.error_rate = 1.0;
        });
        let answer = env.delete(vec![worker_node(&victim)]).await;
        env.sim.configure(|c| {
            c.latency = std::time::Duration::ZERO;
            c.error_rate = 0.0;
        });
        match answer {
            Ok(()) => {
                wait_until("the promised removal to be carried out", async || {
                    let _ = env.refresh().await;
                    assert_eq!(
                        env.target().await,
                        3,
                        "latency {latency_ms} ms: back in the target"
                    );
                    !env.workers().iter().any(|w| w.0 == victim.0)
                        && env.sim.running_jobs(&env.cluster_id) == 0
                })
                .await;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "latency {latency_ms} ms: {e}");
                env.wait_provider_settled().await;
                let _ = env.refresh().await;
                assert_eq!(env.target().await, 4, "latency {latency_ms} ms: {e}");
                assert!(env.workers().iter().any(|w| w.0 == victim.0));
            }
        }
        env.shutdown().await;
    }
}

/// CloudStack slower than the autoscaler's deadline, and doing what it was asked. The removal
/// window's request is timed by its first caller's deadline; a caller that joined the window
/// with a later deadline is still waiting when that request's answer is lost. Every caller
/// hears OK and both VMs leave. Before, the later caller heard UNAVAILABLE while CloudStack
/// went on to remove its VM: the real autoscaler then released the node's taint and counted a
/// failed deletion (tests/upstream-autoscaler, slow-removal-answers, where one caller's own
/// deadline races the request's timeout).
#[tokio::test(start_paused = true)]
async fn a_removal_whose_answer_is_lost_past_the_deadline_is_answered_ok_and_carried_out() {
    for latency_ms in [4_800, 7_000] {
        let mut env = Stack::refreshed(pool(4), "pool", |s| s.groups[0].min = 1).await;
        let workers = env.workers();
        let (first, second) = (&workers[0], &workers[1]);
        env.sim
            .configure(|c| c.latency = std::time::Duration::from_millis(latency_ms));
        let call = |vm: &(String, String, cks_sim::VmState), secs| {
            let mut client = env.client.clone();
            let req = with_deadline(
                pb::NodeGroupDeleteNodesRequest {
                    nodes: vec![worker_node(vm)],
                    id: env.cluster_id.clone(),
                },
                std::time::Duration::from_secs(secs),
            );
            tokio::spawn(async move { client.node_group_delete_nodes(req).await.map(|_| ()) })
        };
        let a = call(first, 5);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let b = call(second, 20);
        for (answer, who) in [(a.await, "first"), (b.await, "second")] {
            let answer = answer.expect("task");
            assert!(answer.is_ok(), "latency {latency_ms} ms, {who}: {answer:?}");
        }
        env.sim.configure(|c| c.latency = std::time::Duration::ZERO);
        wait_until("both removals to be carried out", async || {
            let _ = env.refresh().await;
            assert_eq!(
                env.target().await,
                2,
                "latency {latency_ms} ms: back in the target"
            );
            !env.workers()
                .iter()
                .any(|w| w.0 == first.0 || w.0 == second.0)
                && env.sim.running_jobs(&env.cluster_id) == 0
        })
        .await;
        // A request whose answer was lost before CloudStack handled it is sent again; one it
        // handled is not (it would fail, the VMs gone or being removed).
        assert!(
            env.sim.failed_jobs().is_empty(),
            "latency {latency_ms} ms: {:?}",
            env.sim.failed_jobs()
        );
        env.shutdown().await;
    }
}

/// OK means recorded, at the deadline too: CloudStack takes longer to answer the window's
/// request than the caller can wait, so the caller is promised its removal before its
/// deadline, early enough that the state file holds the removal when the OK arrives, and no
/// ERROR says an OK went out unrecorded. The removal is then carried out.
#[tokio::test(start_paused = true)]
async fn a_removal_promised_at_its_deadline_is_recorded_before_its_ok() {
    logs::capture();
    let (_dir, state, mut env) = with_a_state_file(pool(4), |s| s.groups[0].min = 1).await;
    let victim = env.workers().remove(0);
    // Answered within the client's timeout (3 s), after the caller had to hear (its 3 s
    // deadline, less the margin and the store's second).
    let slow = Duration::from_millis(2_500);
    env.sim.configure(|s| {
        s.command_latency = Some(("scaleKubernetesCluster".into(), slow));
    });
    let unrecorded = logs::lines_mentioning("before the promise was recorded").len();
    let req = with_deadline(
        pb::NodeGroupDeleteNodesRequest {
            nodes: vec![worker_node(&victim)],
            id: env.cluster_id.clone(),
        },
        Duration::from_secs(3),
    );
    let asked = tokio::time::Instant::now();
    env.client
        .node_group_delete_nodes(req)
        .await
        .expect("promised at its deadline");
    assert!(
        asked.elapsed() < slow,
        "answered after CloudStack: {:?}",
        asked.elapsed()
    );
    let recorded = std::fs::read_to_string(&state).expect("the state file");
    assert!(
        recorded.contains(&victim.0),
        "the OK came before its record: {recorded}"
    );
    assert_eq!(
        logs::lines_mentioning("before the promise was recorded").len(),
        unrecorded,
        "an OK said to be unrecorded"
    );
    assert!(
        !logs::lines_mentioning("the request's deadline came before CloudStack's answer")
            .is_empty(),
        "the promise at the deadline is said"
    );
    env.sim.configure(|s| s.command_latency = None);
    wait_until("the promised removal to be carried out", async || {
        let _ = env.refresh().await;
        assert_eq!(env.target().await, 3, "back in the target");
        !env.workers().iter().any(|w| w.0 == victim.0) && env.sim.running_jobs(&env.cluster_id) == 0
    })
    .await;
    env.shutdown().await;
}

/// OK means recorded for an IncreaseSize too, when its watch of the new job runs as long as
/// the caller can wait (CloudStack validates the job late, after its pick-up delay): the OK
/// comes with the job in the state file, and no ERROR says an OK went out unrecorded. (How
/// much of the deadline the watch leaves the record is the machine's, `ScaleMachine::
/// watch_until`, tested with it.)
#[tokio::test(start_paused = true)]
async fn an_increase_watched_to_its_deadline_is_recorded_before_its_ok() {
    logs::capture();
    let mut cfg = pool(3);
    cfg.settings.pickup_delay = Duration::from_secs(8);
    let (_dir, state, mut env) =
        with_a_state_file(cfg, |s| s.scale_watch = Duration::from_secs(30)).await;
    let unrecorded = logs::lines_mentioning("before the promise was recorded").len();
    env.increase(1).await.expect("scale-up accepted");
    let recorded = std::fs::read_to_string(&state).expect("the state file");
    assert!(
        recorded.contains("\"job\""),
        "the job is recorded: {recorded}"
    );
    assert_eq!(
        logs::lines_mentioning("before the promise was recorded").len(),
        unrecorded,
        "an OK said to be unrecorded"
    );
    env.shutdown().await;
}

/// A provider over `cfg` recording its promises in a `--state-file` of its own, in a folder
/// a test may take away (the store then fails to write), its settings tweaked by `tweak`; the
/// folder's owner, the file, the stack.
async fn with_a_state_file(
    cfg: cks_sim::SimConfig,
    tweak: impl FnOnce(&mut cks_autoscaler_provider::provider::Settings),
) -> (cks_testkit::certs::TempDir, std::path::PathBuf, Stack) {
    let dir = cks_testkit::certs::TempDir::new("state");
    let folder = dir.path("state");
    std::fs::create_dir_all(&folder).expect("state folder");
    let file = folder.join("state.json");
    let recorded = file.clone();
    let env = Stack::refreshed(cfg, "pool", move |s| {
        s.state_file = Some(recorded);
        tweak(s);
    })
    .await;
    (dir, file, env)
}

/// [`with_a_state_file`] with minute-long jobs and a minimum of one node: the folder's owner,
/// the folder (to take away), the stack.
async fn with_a_store_that_can_go(
    mut cfg: cks_sim::SimConfig,
) -> (cks_testkit::certs::TempDir, std::path::PathBuf, Stack) {
    cfg.settings.job_duration = Duration::from_secs(60);
    let (dir, file, env) = with_a_state_file(cfg, |s| s.groups[0].min = 1).await;
    let folder = file.parent().expect("the file's folder").to_path_buf();
    (dir, folder, env)
}

/// The answer to a call taken back because the store could not record it: UNAVAILABLE,
/// saying so.
fn taken_back(answer: Result<(), tonic::Status>) {
    let err = answer.expect_err("not recorded and only queued: taken back");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("cannot record promises"),
        "{}",
        err.message()
    );
}

/// The store fails between the check and the write, with a removal only queued behind a
/// running job (checked only against the store's last write): by the caller's deadline its
/// promise is not recorded and nothing was sent for it, so it is taken back and the caller
/// hears UNAVAILABLE (the autoscaler untaints the node and asks again later). The node counts
/// in the target again, and the job's end sends nothing for it.
#[tokio::test(start_paused = true)]
async fn a_queued_removal_the_store_could_not_record_in_time_is_taken_back() {
    logs::capture();
    let withdrawn = || metric("cks_provider_unrecorded_promises_withdrawn_total");
    let mut cfg = pool(4);
    cfg.settings.scale_timeout = Duration::from_secs(3600);
    let (_dir, folder, mut env) = with_a_store_that_can_go(cfg).await;
    env.increase(1).await.expect("a job in flight, recorded");
    let taken = withdrawn();
    let said = logs::lines_mentioning("it is taken back").len();
    std::fs::remove_dir_all(&folder).expect("the store goes away");
    let victim = env.workers().remove(0);
    taken_back(env.delete(vec![worker_node(&victim)]).await);
    assert!(withdrawn() > taken, "counted");
    assert!(
        logs::lines_mentioning("it is taken back").len() > said,
        "and said"
    );
    assert_eq!(env.target().await, 5, "the node counts again");
    // The scale-up's minute: once it ends, nothing goes out for the node taken back.
    for _ in 0..60 {
        let _ = env.refresh().await;
        if env.sim.running_jobs(&env.cluster_id) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert_eq!(
        env.sim.running_jobs(&env.cluster_id),
        0,
        "the scale-up ended"
    );
    env.wait_provider_settled().await;
    assert!(
        removals(&env).is_empty(),
        "nothing sent for the node taken back"
    );
    assert!(env.workers().iter().any(|w| w.0 == victim.0));
    assert_eq!(env.target().await, 5);
    env.shutdown().await;
}

/// The same for an increase queued behind a running job: taken back, UNAVAILABLE, and the
/// nodes it asked for are not upcoming.
#[tokio::test(start_paused = true)]
async fn a_queued_increase_the_store_could_not_record_in_time_is_taken_back() {
    let (_dir, folder, mut env) = with_a_store_that_can_go(pool(4)).await;
    env.increase(1).await.expect("a job in flight, recorded");
    assert_eq!(env.target().await, 5);
    std::fs::remove_dir_all(&folder).expect("the store goes away");
    taken_back(env.increase(2).await);
    assert_eq!(
        env.target().await,
        5,
        "no node upcoming for the call taken back"
    );
    env.shutdown().await;
}

/// The store fails while the window's request is with CloudStack (after the check that let
/// it go, before the write that records the promise it makes): the removal is under way, so
/// the caller still hears OK at its deadline (an error would have the autoscaler count back a
/// node CloudStack is removing), and the operator is told loudly that the promise is not
/// recorded: an ERROR and `cks_provider_unrecorded_oks_total`.
#[tokio::test(start_paused = true)]
async fn an_ok_for_a_request_already_sent_the_store_could_not_record_is_said_and_counted() {
    logs::capture();
    let unrecorded_oks = || metric("cks_provider_unrecorded_oks_total");
    let mut cfg = pool(4);
    // CloudStack holds the request long enough for the store to go away meanwhile.
    cfg.settings.command_latency = Some(("scaleKubernetesCluster".into(), Duration::from_secs(2)));
    let (_dir, folder, env) = with_a_store_that_can_go(cfg).await;
    let counted = unrecorded_oks();
    let said = logs::lines_mentioning("before the promise was recorded").len();
    let victim = env.workers().remove(0);
    let mut client = env.client.clone();
    let req = with_deadline(
        pb::NodeGroupDeleteNodesRequest {
            nodes: vec![worker_node(&victim)],
            id: env.cluster_id.clone(),
        },
        Duration::from_secs(5),
    );
    let store_goes = async {
        wait_until("the request to reach CloudStack", async || {
            !env.scale_requests().is_empty()
        })
        .await;
        std::fs::remove_dir_all(&folder).expect("the store goes away");
    };
    let (answer, ()) = tokio::join!(client.node_group_delete_nodes(req), store_goes);
    answer.expect("under way: OK at the deadline");
    assert!(
        logs::lines_mentioning("before the promise was recorded").len() > said,
        "the unrecorded OK is said"
    );
    assert!(unrecorded_oks() > counted, "and counted");
    assert_eq!(removals(&env), std::slice::from_ref(&victim.0));
    env.shutdown().await;
}

/// The provider dies (no shutdown, no Cleanup) with a removal owed behind a running scale-up:
/// the next provider, started with the same `--state-file`, takes the promise over, follows
/// the running job instead of sending anything twice, and removes the VM once it ends. The
/// target never shows the node back.
#[tokio::test(start_paused = true)]
async fn a_removal_owed_when_the_provider_dies_is_carried_out_by_the_next_one() {
    let dir = cks_testkit::certs::TempDir::new("state-restart");
    let state = dir.path("state.json");
    let mut cfg = pool(4);
    cfg.settings.job_duration = std::time::Duration::from_secs(60);
    cfg.settings.scale_timeout = std::time::Duration::from_secs(3600);
    let file = state.clone();
    let mut env = Stack::refreshed(cfg, "pool", move |s| {
        s.groups[0].min = 1;
        s.state_file = Some(file);
    })
    .await;
    let victim = env.workers().remove(0);
    env.increase(1).await.expect("scale-up accepted");
    env.delete(vec![worker_node(&victim)])
        .await
        .expect("owed behind the scale-up");
    assert_eq!(env.target().await, 4);
    let recorded = std::fs::read_to_string(&state).expect("the promise is recorded");
    assert!(recorded.contains(&victim.0), "{recorded}");

    env.restart_provider().await;
    env.refresh()
        .await
        .expect("first Refresh of the new provider");
    assert_eq!(env.target().await, 4, "no phantom node after the restart");
    assert_eq!(
        env.sim.running_jobs(&env.cluster_id),
        1,
        "the scale-up still runs"
    );
    // The scale-up's minute, then the removal's: looked at every 2 s, as an autoscaler would.
    let mut removed = false;
    for _ in 0..300 {
        let _ = env.refresh().await;
        assert_eq!(env.target().await, 4, "never back in the target");
        removed = !env.workers().iter().any(|w| w.0 == victim.0)
            && env.sim.running_jobs(&env.cluster_id) == 0;
        if removed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    assert!(removed, "the new provider removed the VM within 10 minutes");
    env.wait_provider_settled().await;
    assert_eq!(env.cluster_size(), 4);
    let scale_ups = env
        .scale_requests()
        .iter()
        .filter(|r| r.contains_key("size"))
        .count();
    assert_eq!(scale_ups, 1, "nothing sent twice");
    assert_eq!(removals(&env), std::slice::from_ref(&victim.0));
    wait_until("the ledger to be empty", async || {
        std::fs::read_to_string(&state).is_ok_and(|t| !t.contains(&victim.0))
    })
    .await;
    env.shutdown().await;
}

/// OK means recorded: while the state file cannot be written, no new promise is made. The
/// request whose write failed first waits for a write that succeeds (its caller's deadline may
/// pass); the next ones are refused at once, UNAVAILABLE naming the store, with nothing queued
/// or sent; once the file can be written again, promises are made again.
#[tokio::test(start_paused = true)]
async fn no_promise_is_made_while_the_state_file_cannot_be_written() {
    let dir = cks_testkit::certs::TempDir::new("state-unwritable");
    let folder = dir.path("state");
    std::fs::create_dir_all(&folder).expect("state folder");
    let file = folder.join("state.json");
    // Jobs long enough that each promise changes what is recorded (the job in flight).
    let mut cfg = pool(4);
    cfg.settings.job_duration = std::time::Duration::from_secs(20);
    let mut env = Stack::refreshed(cfg, "pool", {
        let file = file.clone();
        move |s| {
            s.groups[0].min = 1;
            s.state_file = Some(file);
        }
    })
    .await;
    env.increase(1)
        .await
        .expect("recorded while the file can be written");
    env.wait_provider_settled().await;
    std::fs::remove_dir_all(&folder).expect("the store goes away");
    // The first promise finds the store broken: the store is written before its request is
    // sent, so it is refused in time (not at its deadline), naming the store, and nothing
    // is sent.
    let requests = env.scale_requests().len();
    let first = env.increase(1).await.expect_err("OK without a record");
    assert_eq!(first.code(), Code::Unavailable, "{first:?}");
    assert!(
        first.message().contains("cannot record promises"),
        "{first:?}"
    );
    assert_eq!(
        env.scale_requests().len(),
        requests,
        "sent without a record"
    );
    // The next ones are refused before anything is queued or sent.
    let victim = env.workers().remove(0);
    let refused = env
        .delete(vec![worker_node(&victim)])
        .await
        .expect_err("refused while nothing can be recorded");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("cannot record promises"),
        "{refused:?}"
    );
    let refused = env.increase(1).await.expect_err("refused too");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(env.scale_requests().len(), requests);
    std::fs::create_dir_all(&folder).expect("the store comes back");
    wait_until("promises to be recorded again", async || {
        env.delete(vec![worker_node(&victim)]).await.is_ok()
    })
    .await;
    let recorded = std::fs::read_to_string(&file).expect("recorded");
    assert!(recorded.contains(&victim.0), "{recorded}");
}
