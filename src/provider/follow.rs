//! What follows a scale job's end: the cluster fetched again and the end reported to the
//! machine (which settles it and may start the queued request); the group's loop
//! (`cluster_loop`) polls the job. Also reads `listAsyncJobs` for jobs this provider did not
//! start (after a restart or a lost answer); which of them is a cluster's is the domain's
//! decision (`cks_domain::jobs`).

use super::Cluster;
use super::now;
use cks_cloudstack::types::{JobOutcome, cloudstack_date};
use cks_domain::jobs::{self, JobQuery, JobScan, JobSearch, ListedJob};
use cks_domain::machine::{Answer, Effect, Event, JobEnd, Phase};
use std::collections::HashSet;
use tokio::time::Instant;

/// A polled job's outcome as the machine takes it: `None` while it runs.
pub(crate) fn job_end(outcome: JobOutcome) -> Option<JobEnd> {
    match outcome {
        JobOutcome::Pending => None,
        JobOutcome::Succeeded(_) => Some(JobEnd::Succeeded),
        JobOutcome::Failed {
            errorcode,
            errortext,
        } => Some(JobEnd::Failed {
            code: errorcode,
            text: errortext,
        }),
        JobOutcome::Cancelled => Some(JobEnd::Cancelled),
    }
}

impl Cluster {
    /// The group's id (its cluster's id) as metric labels name it.
    pub(crate) fn id(&self) -> String {
        self.group()
            .read()
            .scale
            .cluster_id
            .clone()
            .unwrap_or_default()
    }

    /// Fetches the cluster after a job ended, so its outcome is judged on what CloudStack
    /// shows now: tried again as `timing::post_job_read_wait` says, or until `deadline`.
    /// Returns whether it worked.
    pub(crate) async fn fetch_after_job(&self, deadline: Option<Instant>) -> bool {
        let label = self.label();
        let tries = async {
            let mut failures = 0u32;
            loop {
                match self.fetch_and_act().await {
                    Ok(_) => return true,
                    Err(e) => {
                        tracing::warn!(group = %label, error = %e, "fetching the cluster after the job failed");
                        failures += 1;
                        let poll = self.p.inner.settings.job_poll_interval;
                        match cks_domain::timing::post_job_read_wait(failures, poll) {
                            Some(wait) if deadline.is_none() => tokio::time::sleep(wait).await,
                            _ => return false,
                        }
                    }
                }
            }
        };
        match deadline {
            Some(d) => tokio::time::timeout_at(super::before(d), tries)
                .await
                .unwrap_or(false),
            None => tries.await,
        }
    }

    /// Reports a job's end to the machine and carries out what follows: the news, the
    /// queued request. Returns what the RPC that watched it hears (`watched`), when the job
    /// was still the group's.
    pub(crate) async fn settle(
        &self,
        job_id: &str,
        end: &JobEnd,
        fetched: bool,
        watched: bool,
    ) -> Option<Answer> {
        let alert = self.p.inner.alert.scaling();
        let step = {
            let g = self.group();
            let mut st = g.lock();
            // Taken after the state, the documented order.
            let registered = g.registered.lock().unwrap_or_else(|p| p.into_inner());
            let event = Event::JobEnded {
                job: job_id,
                end,
                fetched,
                watched,
                alert: &alert,
                registered: &registered,
            };
            st.scale.handle(event, now())
        };
        self.carry(step).await
    }

    /// Looks for the scale job the group's phase waits for (a cluster Scaling with no job
    /// known, or a submission whose answer was lost) and reports what it found to the
    /// machine; returns the effects that follow (the queue's next request).
    pub(crate) async fn find_and_follow(&self) -> Vec<Effect> {
        let Some(cluster_id) = self.group().read().scale.cluster_id.clone() else {
            return Vec::new();
        };
        let wants_list = self.group().read().scale.search_needs_job_list();
        let search = if wants_list
            && self
                .p
                .inner
                .optional
                .jobs
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            match self.find_running_scale_job(&cluster_id).await {
                Ok(found) => found,
                Err(e) if e.is_not_permitted() => {
                    self.p
                        .inner
                        .optional
                        .jobs
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(error = %e, cloudstack = self.p.inner.cs.api_url(), "this CloudStack key may not call listAsyncJobs (optional): {}", super::WITHOUT_LIST_ASYNC_JOBS);
                    JobSearch::Nothing
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listAsyncJobs failed; cannot adopt the running scale job yet");
                    return Vec::new();
                }
            }
        } else {
            JobSearch::Nothing
        };
        let alert = self.p.inner.alert.scaling();
        let event = Event::JobSearched {
            search: &search,
            alert: &alert,
        };
        self.group().lock().scale.handle(event, now()).effects
    }

    /// The running `scaleKubernetesCluster` job the group waits for, read from
    /// `listAsyncJobs` one page at a time and only as far back as such a job can have
    /// started ([`jobs::search_start`]): CloudStack keeps finished jobs for a day and lists
    /// them oldest first, so without `startdate` every check would read the account's whole
    /// day of jobs. Which job is the cluster's is decided in [`cks_domain::jobs`]; here are
    /// the pages and the wall clock (`startdate` and `created` are CloudStack's wall-clock
    /// times).
    async fn find_running_scale_job(
        &self,
        cluster_id: &str,
    ) -> Result<JobSearch, cks_cloudstack::CsError> {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let startdate = cloudstack_date(jobs::search_start(
            wall,
            self.p.inner.settings.job_max_follow,
        ));
        let lost_since = match self.group().read().scale.phase() {
            Phase::AnswerLost { since, .. } => Some(jobs::created_since(
                wall,
                now().saturating_duration_since(*since),
            )),
            _ => None,
        };
        let followed: HashSet<String> = (0..self.p.inner.groups.len())
            .filter(|&other| other != self.gi)
            .filter_map(|other| {
                self.p.inner.groups[other]
                    .read()
                    .scale
                    .phase()
                    .job()
                    .map(str::to_string)
            })
            .collect();
        let query = JobQuery {
            cluster_id,
            followed_elsewhere: &followed,
            lost_since,
        };
        let mut scan = JobScan::default();
        let mut complete = false;
        for page in 1..=jobs::SEARCH_MAX_PAGES {
            let (listed, more) = self
                .p
                .inner
                .cs
                .list_async_jobs_page(&startdate, page)
                .await?;
            let found = scan.read_page(
                &query,
                listed.iter().map(|job| ListedJob {
                    id: &job.jobid,
                    running_scale: job.is_running_scale(),
                    names: job.jobinstanceid.as_deref(),
                    created_unix: job.created_unix(),
                }),
            );
            if let Some(job) = found {
                return Ok(JobSearch::Named(job));
            }
            if !more {
                complete = true;
                break;
            }
        }
        if !complete {
            tracing::warn!(
                cluster = cluster_id,
                pages = jobs::SEARCH_MAX_PAGES,
                "no running scale job found in the first pages of listAsyncJobs since {startdate}; not reading further"
            );
        }
        let search = scan.conclude(complete);
        if search == JobSearch::Unnamed {
            tracing::debug!(
                cluster = cluster_id,
                "running scale jobs that name no cluster: none is taken for this cluster's"
            );
        }
        Ok(search)
    }
}
