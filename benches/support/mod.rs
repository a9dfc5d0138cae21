//! What only the benchmarks share: the switches, statistics and table writer of `report`, and
//! the simulator and provider process they run against. The provider process harness and the
//! rest of the test support are `cks_testkit`.
#![allow(dead_code)]

mod report;

pub use report::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where benchmark processes keep their cloud-configs and logs.
pub fn work_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-{name}"))
}

pub fn provider_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cks-autoscaler-provider"))
}

/// A simulator with `count` Running clusters `c0`, `c1`, … of 1 control node and 3 workers,
/// CKS autoscaling on (1..20), whose scale jobs run for `job_duration`.
pub async fn autoscaled_clusters(count: usize, job_duration: Duration) -> cks_sim::SimHandle {
    use cks_sim::{self as sim, ClusterSpec, Scenario, SimConfig, SimSettings};
    let clusters: Vec<ClusterSpec> = (0..count)
        .map(|i| {
            let mut c = ClusterSpec::new(&format!("c{i}"), 1, 3);
            c.min_size = Some(1);
            c.max_size = Some(20);
            c.autoscaling = true;
            c
        })
        .collect();
    let mut cfg = SimConfig::for_tests("bench-key", "bench-secret");
    cfg.settings = SimSettings {
        job_duration,
        ..SimSettings::default()
    };
    cfg.scenario = Scenario {
        clusters,
        ..Scenario::empty()
    };
    sim::spawn(cfg).await.expect("simulator")
}

/// Polls `job` every `poll` until it ends: how a client that waits for each CloudStack job
/// (the blocking designs the benchmarks compare with) learns of its end.
pub async fn wait_for_job(
    cs: &cks_cloudstack::Client,
    job: &str,
    poll: Duration,
) -> Result<(), cks_cloudstack::CsError> {
    use cks_cloudstack::CsError;
    use cks_cloudstack::types::JobOutcome;
    loop {
        tokio::time::sleep(poll).await;
        match cs.query_job(job).await?.outcome() {
            JobOutcome::Pending => continue,
            JobOutcome::Succeeded(_) => return Ok(()),
            JobOutcome::Failed { errortext, .. } => {
                return Err(CsError::Config(format!("job failed: {errortext}")));
            }
            JobOutcome::Cancelled => return Err(CsError::Config("job cancelled".into())),
        }
    }
}
