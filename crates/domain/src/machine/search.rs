//! What the job list said about the job a group waits for (a cluster Scaling with no job
//! known, or a submission whose answer was lost), taken in as one event: which job is
//! followed, whether the lost request is settled, and what the operator is told of it.

use super::{Effect, JobKind, Phase, ScaleMachine};
use crate::jobs::JobSearch;
use crate::rules::AlertScaling;
use std::time::Instant;

/// What a job search changed, for the log and the job metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchNews {
    /// The request whose answer was lost became this job, now followed.
    LostBecameJob { job: String, kind: JobKind },
    /// A running scale job this provider did not start is adopted and followed.
    Adopted { job: String },
    /// The request whose answer was lost did not become a job: settled as never sent.
    LostForgotten,
    /// The cluster is Scaling under a job no listing names: followed through its state.
    AdoptedBlind,
    /// Nothing changed.
    Nothing,
}

impl ScaleMachine {
    /// Whether the job search needs the job list: only a lost answer does (is a job created
    /// since still pending?). A cluster Scaling under a job nobody here started is followed
    /// through its state whatever the list says, since no scale job names its cluster.
    pub fn search_needs_job_list(&self) -> bool {
        matches!(self.phase, Phase::AnswerLost { .. })
    }

    /// The job search's result (`search`: what `listAsyncJobs` showed, or
    /// [`JobSearch::Nothing`] without it). A job that may be the lost request's
    /// ([`JobSearch::Unnamed`]) settles nothing while it is pending.
    pub(crate) fn job_searched(
        &mut self,
        search: &JobSearch,
        alert: &AlertScaling,
        now: Instant,
    ) -> (Vec<Effect>, SearchNews) {
        let was_lost = self.search_needs_job_list();
        let effects = match (search, was_lost) {
            (JobSearch::Named(job), _) => self.job_found(job.clone(), now),
            (JobSearch::Unnamed, true) => Vec::new(),
            _ => self.no_job_found(alert, now),
        };
        let news = match (search, was_lost) {
            (JobSearch::Named(job), true) if !effects.is_empty() => SearchNews::LostBecameJob {
                job: job.clone(),
                kind: JobKind::of(self.phase.op().map(|o| &o.kind)),
            },
            (JobSearch::Named(job), false) if !effects.is_empty() => {
                SearchNews::Adopted { job: job.clone() }
            }
            (JobSearch::Unnamed | JobSearch::Nothing, true) => {
                if self.search_needs_job_list() {
                    SearchNews::Nothing
                } else {
                    SearchNews::LostForgotten
                }
            }
            (_, false) if matches!(self.phase, Phase::Adopted { job: None, .. }) => {
                SearchNews::AdoptedBlind
            }
            _ => SearchNews::Nothing,
        };
        (effects, news)
    }
}
