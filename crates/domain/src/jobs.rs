//! Which of the account's scale jobs is a cluster's: the decision behind adopting a running
//! job and settling a request whose answer was lost. The shell reads `listAsyncJobs` page by
//! page and the wall clock; everything it concludes from them is decided here.
//!
//! A job is a cluster's only when it names it (`jobinstanceid`). Real scale jobs name no
//! cluster, and `listAsyncJobs` lists every job of the account: other clusters' scale jobs (CKS's
//! own autoscaler, operators, other providers) use the same keys. So an unnamed job is never
//! taken for a cluster's, not even the only one created since a submission whose answer was
//! lost: nothing proves its cluster, group or command, and taking another client's job would
//! settle the lost request by someone else's outcome (a failure re-queuing removals the
//! autoscaler no longer counts, a success ending a wait early). Pending unnamed jobs created
//! since the lost submission only delay its settling, which is then read from the cluster's
//! snapshot once none is pending.

use std::collections::HashSet;
use std::time::Duration;

/// How much earlier than a lost submission a job may look created, for clock differences
/// with CloudStack (its `created` has one-second resolution).
pub const CREATED_CLOCK_SLACK: Duration = Duration::from_secs(120);

/// How far before the follow limit a job search looks, for clock differences with CloudStack.
pub const SEARCH_CLOCK_SLACK: Duration = Duration::from_secs(15 * 60);

/// A safety net on the pages one job search reads: the `startdate` window bounds them already,
/// unless the account starts thousands of jobs an hour.
pub const SEARCH_MAX_PAGES: u32 = 20;

/// What the job list says about the job a group waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobSearch {
    /// A running scale job that is the cluster's (it names it).
    Named(String),
    /// Running scale jobs that name no cluster (any of the account's), or pages left unread:
    /// none is provably the cluster's, and the lost request may be among them.
    Unnamed,
    /// No running scale job.
    Nothing,
}

/// A job as `listAsyncJobs` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedJob<'a> {
    pub id: &'a str,
    /// A `scaleKubernetesCluster` job still pending.
    pub running_scale: bool,
    /// The cluster it names (`jobinstanceid`), if any.
    pub names: Option<&'a str>,
    /// When CloudStack created it (Unix seconds), if it says.
    pub created_unix: Option<u64>,
}

/// What a search looks for.
#[derive(Debug, Clone, Copy)]
pub struct JobQuery<'a> {
    pub cluster_id: &'a str,
    /// Jobs other groups of this provider follow: never this cluster's.
    pub followed_elsewhere: &'a HashSet<String>,
    /// For a lost submission, the earliest creation time (Unix seconds) its job can show
    /// ([`created_since`]); `None` when no answer was lost.
    pub lost_since: Option<u64>,
}

/// The window of a search: its `startdate` (Unix seconds), as far back as a scale job can
/// still matter (CloudStack ends one after its scale timeout; the provider follows one for
/// `max_follow` before polling it rarely), less [`SEARCH_CLOCK_SLACK`] so a clock a little
/// ahead of CloudStack's still finds the job.
pub fn search_start(wall_now: u64, max_follow: Duration) -> u64 {
    wall_now.saturating_sub((max_follow + SEARCH_CLOCK_SLACK).as_secs())
}

/// The earliest creation time a lost submission's job can show: when it was sent (`lost_for`
/// ago on the wall clock), less [`CREATED_CLOCK_SLACK`].
pub fn created_since(wall_now: u64, lost_for: Duration) -> u64 {
    wall_now
        .saturating_sub(lost_for.as_secs())
        .saturating_sub(CREATED_CLOCK_SLACK.as_secs())
}

/// A search read page by page.
#[derive(Debug, Default)]
pub struct JobScan {
    unnamed: Vec<String>,
}

impl JobScan {
    /// Reads one page; returns the job that names the cluster when the page holds it (the
    /// search ends there).
    pub fn read_page<'a>(
        &mut self,
        query: &JobQuery<'_>,
        jobs: impl IntoIterator<Item = ListedJob<'a>>,
    ) -> Option<String> {
        for job in jobs {
            if !job.running_scale || query.followed_elsewhere.contains(job.id) {
                continue;
            }
            match job.names {
                Some(id) if id == query.cluster_id => return Some(job.id.to_string()),
                Some(_) => {}
                None => {
                    let recent = query
                        .lost_since
                        .is_none_or(|t| job.created_unix.is_none_or(|c| c >= t));
                    if recent {
                        self.unnamed.push(job.id.to_string());
                    }
                }
            }
        }
        None
    }

    /// The search's answer once no page named the cluster: `complete` when every page was
    /// read.
    pub fn conclude(self, complete: bool) -> JobSearch {
        if !complete || !self.unnamed.is_empty() {
            // Unread pages, or pending jobs that may be the lost request's: not settled.
            return JobSearch::Unnamed;
        }
        JobSearch::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job<'a>(id: &'a str, names: Option<&'a str>, created: u64) -> ListedJob<'a> {
        ListedJob {
            id,
            running_scale: true,
            names,
            created_unix: Some(created),
        }
    }

    /// One row: the pages listed (jobs created at Unix second t), whether every page was read,
    /// whether the answer was lost (sent at second 1000, so jobs from 880 on count), how many
    /// groups wait, and what the search concludes.
    #[test]
    fn which_job_is_the_clusters() {
        let followed: HashSet<String> = ["followed".to_string()].into();
        let other = Some("other-cluster");
        let mine = Some("c1");
        let done = ListedJob {
            running_scale: false,
            ..job("done", mine, 990)
        };
        type Row<'a> = (&'a str, Vec<Vec<ListedJob<'a>>>, bool, bool, JobSearch);
        let named = |id: &str| JobSearch::Named(id.to_string());
        let rows: Vec<Row> = vec![
            ("no job", vec![vec![]], true, false, JobSearch::Nothing),
            (
                "a job naming the cluster",
                vec![vec![job("j1", mine, 990)]],
                true,
                false,
                named("j1"),
            ),
            (
                "found on a later page",
                vec![vec![job("x", other, 990)], vec![job("j2", mine, 990)]],
                true,
                false,
                named("j2"),
            ),
            (
                "found even with pages left",
                vec![vec![job("j3", mine, 990)]],
                false,
                true,
                named("j3"),
            ),
            (
                "another cluster's job",
                vec![vec![job("x", other, 990)]],
                true,
                true,
                JobSearch::Nothing,
            ),
            (
                "a finished job",
                vec![vec![done]],
                true,
                false,
                JobSearch::Nothing,
            ),
            (
                "a job another group follows",
                vec![vec![job("followed", mine, 990)]],
                true,
                false,
                JobSearch::Nothing,
            ),
            (
                "an unnamed job, nothing lost",
                vec![vec![job("u", None, 990)]],
                true,
                false,
                JobSearch::Unnamed,
            ),
            (
                "no guess: the one unnamed job since a lost request is pending, not taken",
                vec![vec![job("u", None, 990)]],
                true,
                true,
                JobSearch::Unnamed,
            ),
            (
                "no guess among two",
                vec![vec![job("u", None, 990), job("v", None, 995)]],
                true,
                true,
                JobSearch::Unnamed,
            ),
            (
                "an unnamed job older than the lost request",
                vec![vec![job("old", None, 100)]],
                true,
                true,
                JobSearch::Nothing,
            ),
            (
                "within the clock slack",
                vec![vec![job("u", None, 1000 - 120)]],
                true,
                true,
                JobSearch::Unnamed,
            ),
            (
                "pages left unread",
                vec![vec![job("x", other, 990)]],
                false,
                true,
                JobSearch::Unnamed,
            ),
        ];
        for (name, pages, complete, lost, want) in rows {
            let query = JobQuery {
                cluster_id: "c1",
                followed_elsewhere: &followed,
                lost_since: lost.then(|| created_since(1000 + 60, Duration::from_secs(60))),
            };
            let mut scan = JobScan::default();
            let mut got = None;
            for page in pages {
                if let Some(id) = scan.read_page(&query, page) {
                    got = Some(JobSearch::Named(id));
                    break;
                }
            }
            let got = got.unwrap_or_else(|| scan.conclude(complete));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn the_search_window_reaches_back_past_the_follow_limit() {
        let two_hours = Duration::from_secs(7200);
        assert_eq!(search_start(100_000, two_hours), 100_000 - 7200 - 900);
        assert_eq!(search_start(10, two_hours), 0, "no underflow");
        assert_eq!(
            created_since(10, Duration::from_secs(60)),
            0,
            "no underflow"
        );
    }
}
