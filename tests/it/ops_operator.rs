//! What an operator runs and reads: `probe` into a pipe whose reader is gone (`probe | head`)
//! ends quietly; with `--log-format json` the errors that stop the binary at start are JSON log
//! lines like every other; the example alerts (`docs/prometheus-rules.yaml`) and the operations
//! guide's metrics table name only metrics the provider exports; scale jobs and refusals are
//! counted by group.
//!
//! Time: the binary's tests run it as a child process, whose clock is its own, so they keep the
//! wall clock and wait on the child's exit (bounded).

use cks_autoscaler_provider::metrics::{
    self, ClientMismatch, GroupGauges, MetricsSource, Told, Worker,
};
use cks_domain::machine::JobKind;
use cks_proto as pb;
use cks_sim::{self as sim, ClusterState, JobFailure, SimConfig};
use cks_testkit::{
    fast_settings, sim_config_with, start_provider, start_sim, wait_until, with_deadline,
};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cks-autoscaler-provider"))
}

/// The binary with `args`, configured by nothing from the caller's environment.
fn command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("CKS_PROVIDER_") || k.starts_with("CKS_PROBE_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args).stdin(Stdio::null()).kill_on_drop(true);
    cmd
}

/// Runs `cmd` to its end: stdout and stderr captured unless `cmd` sets them (tokio's
/// `output()` would replace them with pipes of its own).
async fn run(mut cmd: tokio::process::Command) -> Output {
    run_with(cmd.stdout(Stdio::piped())).await
}

async fn run_with(cmd: &mut tokio::process::Command) -> Output {
    let child = cmd.stderr(Stdio::piped()).spawn().expect("the binary runs");
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the binary exits within a minute")
        .expect("its output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_into_a_pipe_nobody_reads_exits_quietly() {
    let sim = sim::spawn(SimConfig::default()).await.expect("simulator");
    let cluster = sim.cluster_ids().into_iter().next().expect("a cluster");
    let (server, _client) = start_provider(&sim, fast_settings(&cluster, 1, 10)).await;
    let address = server.addr.to_string();
    let probe = ["probe", "--address", address.as_str(), "--timeout", "20s"];

    // Read to the end, the report names the group: the probe gets as far as printing.
    let read = run(command(&probe)).await;
    assert!(read.status.success(), "{read:?}");
    assert!(
        text(&read.stdout).contains(&format!("node group {cluster}")),
        "{}",
        text(&read.stdout)
    );

    // Its stdout a pipe whose reading end is closed before it starts: every line it prints
    // meets EPIPE, as the lines after the first ones do under `probe | head -1`.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let gone = run_with(command(&probe).stdout(Stdio::from(writer))).await;
    assert!(gone.stdout.is_empty(), "stdout went to the pipe");
    let stderr = text(&gone.stderr);
    assert_eq!(gone.status.code(), Some(0), "stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}

/// What a newcomer reads when the start fails, in text logs into a pipe: the cause once, and
/// no colour codes (they belong on a terminal, not in files and pipes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_cloud_config_says_its_cause_once_in_plain_text() {
    let missing = std::env::temp_dir().join(format!("cks-absent-{}.conf", std::process::id()));
    let missing = missing.to_string_lossy().to_string();
    let out = run(command(&[
        "serve",
        "--log-format",
        "text",
        "--cloud-config",
        &missing,
        "--nodes",
        "1:3:some-cluster",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&missing), "{stderr}");
    let cause = std::io::Error::from(std::io::ErrorKind::NotFound).to_string();
    let os_error = "(os error 2)";
    assert_eq!(
        stderr.matches(os_error).count(),
        1,
        "the cause once ({cause}): {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "no ANSI escape codes in a pipe: {stderr:?}"
    );
}

/// Every stderr line, each parsed as JSON (failing on a line that is not).
fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\nstderr:\n{stderr}"))
        })
        .collect()
}

/// The message of the one ERROR line.
fn error_message(lines: &[serde_json::Value]) -> String {
    let errors: Vec<&serde_json::Value> = lines.iter().filter(|l| l["level"] == "ERROR").collect();
    assert_eq!(errors.len(), 1, "one ERROR line: {lines:?}");
    errors[0]["fields"]["message"]
        .as_str()
        .expect("a message")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_at_start_are_json_with_log_format_json() {
    // Refused by serve's checks (no cloud-config): a JSON line, exit 1.
    let out = run(command(&[
        "serve",
        "--log-format",
        "json",
        "--nodes",
        "1:3:some-cluster",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let message = error_message(&json_lines(&text(&out.stderr)));
    assert!(message.contains("--cloud-config is required"), "{message}");

    // The same without --log-format json is plain text.
    let out = run(command(&["serve", "--nodes", "1:3:some-cluster"])).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("error: --cloud-config is required"),
        "{stderr}"
    );
    assert!(serde_json::from_str::<serde_json::Value>(stderr.trim()).is_err());

    // A command line that does not parse, the format asked for by flag (either spelling, before
    // or after the subcommand) or by the environment: JSON, clap's exit code.
    for (args, env) in [
        (
            vec![
                "--log-format",
                "json",
                "serve",
                "--listen",
                "not-an-address",
            ],
            None,
        ),
        (vec!["serve", "--log-format=json", "--no-such-flag"], None),
        (
            vec!["serve", "--listen", "not-an-address"],
            Some(("CKS_PROVIDER_LOG_FORMAT", "json")),
        ),
    ] {
        let mut cmd = command(&args);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = run(cmd).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let message = error_message(&json_lines(&text(&out.stderr)));
        assert!(
            message.contains("not-an-address") || message.contains("--no-such-flag"),
            "{args:?}: {message}"
        );
    }

    // A RUST_LOG that does not parse is reported in JSON too, before the error.
    let mut cmd = command(&["serve", "--log-format", "json"]);
    cmd.env("RUST_LOG", "info,cks=notalevel");
    let out = run(cmd).await;
    let lines = json_lines(&text(&out.stderr));
    assert!(
        lines
            .iter()
            .any(|l| l["level"] == "WARN" && l["fields"]["rust_log"] == "info,cks=notalevel"),
        "{lines:?}"
    );
    error_message(&lines);

    // --help stays clap's help, on stdout.
    let out = run(command(&["--log-format", "json", "serve", "--help"])).await;
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).contains("--shutdown-grace"), "{out:?}");
}

/// A provider as the metrics endpoint sees it: one group in Alert with a down worker, and a
/// client judged to run in another cluster.
struct OneGroup;

impl MetricsSource for OneGroup {
    fn ready(&self) -> bool {
        true
    }

    fn group_gauges(&self) -> Vec<GroupGauges> {
        vec![GroupGauges {
            id: "ops-rules-group".into(),
            target_size: Some(2),
            min_size: 1,
            max_size: 3,
            workers: vec![
                Worker {
                    told: Told::Running,
                    down: false,
                },
                Worker {
                    told: Told::Running,
                    down: true,
                },
            ],
            cluster_state: Some("Alert".into()),
            blocked: Some("alert_rule_5_vm_count_mismatch"),
            since_refresh: Some(Duration::from_secs(1)),
            stale: false,
            refresh_failures: 0,
        }]
    }

    fn alert_verdict(&self) -> Option<(&'static str, Option<Duration>)> {
        Some(("unsupported", Some(Duration::from_secs(30))))
    }

    fn client_mismatches(&self) -> Vec<ClientMismatch> {
        vec![ClientMismatch {
            client: "ops-rules-client".into(),
            bound_cluster: "ops-rules-bound".into(),
            seen_cluster: "ops-rules-seen".into(),
            active: true,
        }]
    }
}

/// The `cks_provider_…` metric names a text mentions.
fn provider_metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("cks_provider_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[tokio::test]
async fn the_example_alerts_and_the_guide_name_exported_metrics() {
    metrics::install();
    metrics::record_rpc("NodeGroups", Instant::now(), "Ok");
    cks_cloudstack::record_request_metrics(
        "listKubernetesClusters",
        Duration::from_millis(5),
        "ok",
    );
    metrics::record_job_started("ops-rules-group", JobKind::ScaleUp);
    metrics::record_job("ops-rules-group", JobKind::ScaleUp, "failed");
    metrics::record_refusal("ops-rules-group", "alert_unsupported");
    metrics::record_removals_retried(1);
    metrics::record_removals_abandoned(1);
    metrics::record_standby_start();
    metrics::record_standby_ledger(true);
    metrics::record_tls_handshake_refused("unknown_ca");
    let page = cks_testkit::scrape_metrics(Arc::new(OneGroup)).await;
    let exported: BTreeSet<&str> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = std::fs::read_to_string(root.join("docs/prometheus-rules.yaml")).expect("rules");
    let guide = std::fs::read_to_string(root.join("docs/operations.md")).expect("guide");
    let in_rules = provider_metric_names(&rules);
    assert!(in_rules.len() >= 5, "{in_rules:?}");
    for (file, names) in [
        ("prometheus-rules.yaml", in_rules),
        ("operations.md", provider_metric_names(&guide)),
    ] {
        for name in names {
            // A histogram is named in the guide by its family name.
            assert!(
                exported.contains(name.as_str()),
                "{file} names {name}, which the provider does not export:\n{page}"
            );
        }
    }
    // The guide's table has a row for every family the provider exports.
    for family in exported.iter().filter(|f| f.starts_with("cks_provider_")) {
        let abbreviated = family
            .strip_prefix("cks_provider_node_group")
            .map(|t| format!("`…{t}`"));
        assert!(
            guide.contains(&format!("`{family}`"))
                || abbreviated.is_some_and(|a| guide.contains(&a)),
            "operations.md does not describe {family}"
        );
    }
}

/// The value of one series (name and labels exactly as rendered) on a page; 0 when absent.
fn series(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(start_paused = true)]
async fn scale_jobs_and_refusals_are_counted_by_group() {
    let handle = metrics::install();
    // The recorder is the process's: a seed of its own gives this test's cluster an id no
    // other test's scale-ups are counted under.
    let sim = start_sim(sim_config_with(|c| c.seed = 0x0b5e_12ed)).await;
    let cluster = sim.cluster_id("demo").expect("demo cluster");
    let (_server, mut client) = start_provider(&sim, fast_settings(&cluster, 1, 10)).await;
    let started = format!(
        r#"cks_provider_scale_jobs_started_total{{node_group="{cluster}",kind="scale_up"}}"#
    );
    let finished = |outcome: &str| {
        format!(
            r#"cks_provider_scale_jobs_finished_total{{node_group="{cluster}",kind="scale_up",outcome="{outcome}"}}"#
        )
    };
    let refused = format!(
        r#"cks_provider_scale_requests_refused_total{{node_group="{cluster}",rule="stopped_cluster_size"}}"#
    );
    let refresh = async |c: &mut pb::cloud_provider_client::CloudProviderClient<_>| {
        c.refresh(with_deadline(pb::RefreshRequest {}, Duration::from_secs(5)))
            .await
            .expect("Refresh");
    };
    let increase = |id: &str| {
        with_deadline(
            pb::NodeGroupIncreaseSizeRequest {
                id: id.to_string(),
                delta: 1,
            },
            Duration::from_secs(5),
        )
    };

    // Refused by a rule before anything is sent: counted under the rule, no job started.
    assert!(sim.set_cluster_state(&cluster, ClusterState::Stopped));
    refresh(&mut client).await;
    let e = client
        .node_group_increase_size(increase(&cluster))
        .await
        .expect_err("a size change on a stopped cluster");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let page = handle.render();
    assert_eq!(series(&page, &refused), 1.0, "{page}");
    assert_eq!(series(&page, &started), 0.0, "{page}");

    // A scale-up that succeeds: started, then finished as succeeded.
    assert!(sim.set_cluster_state(&cluster, ClusterState::Running));
    refresh(&mut client).await;
    client
        .node_group_increase_size(increase(&cluster))
        .await
        .expect("scale-up accepted");
    wait_until("the scale-up to be counted as succeeded", async || {
        series(&handle.render(), &finished("succeeded")) == 1.0
    })
    .await;
    assert_eq!(series(&handle.render(), &started), 1.0);

    // A scale-up CloudStack fails (no capacity): started, then finished as failed.
    sim.configure(|s| s.job_failure = JobFailure::Capacity);
    wait_until("the cluster to be Running again", async || {
        sim.running_jobs(&cluster) == 0 && sim.cluster_json(&cluster)["state"] == "Running"
    })
    .await;
    refresh(&mut client).await;
    let _ = client.node_group_increase_size(increase(&cluster)).await;
    wait_until("the failed scale-up to be counted", async || {
        series(&handle.render(), &finished("failed")) == 1.0
    })
    .await;
    let page = handle.render();
    assert_eq!(series(&page, &started), 2.0, "{page}");
    assert_eq!(series(&page, &finished("succeeded")), 1.0, "{page}");
    assert_eq!(series(&page, &refused), 1.0, "{page}");
}
