//! Async jobs: an async command's job id, querying a job, and the
//! `listAsyncJobs` search by start date through which a job lost to a restart or a dropped answer
//! is found again. Apart from the typed commands because `startdate` is a DATE read in the
//! management server's own time zone, a CloudStack quirk the search alone must absorb.

use crate::CsError;
use crate::client::Client;
use crate::envelope::{Answer, malformed};
use crate::paging::ListSpec;
use crate::types::{self, AsyncJob};
use std::time::Duration;

/// How far before the wanted instant the `startdate` of `listAsyncJobs` is put. The parameter
/// is a DATE: CloudStack reads only `yyyy-MM-dd` and takes midnight in the management
/// server's own time zone (`SimpleDateFormat` with the JVM's default zone), which can be up to
/// 12 hours after midnight UTC (UTC-12). Jobs created before the wanted instant are dropped
/// from the answer by `created` instead.
const STARTDATE_ZONE_SLACK: Duration = Duration::from_secs(12 * 3600);

pub(crate) const LIST_ASYNC_JOBS: ListSpec = ListSpec {
    command: "listAsyncJobs",
    field: "asyncjobs",
};

const QUERY_JOB: &str = "queryAsyncJobResult";

/// The `jobid` an async command's answer names: what [`Client::call_with`] reads from
/// `scaleKubernetesCluster` and `stopVirtualMachine`.
pub(crate) fn job_id(command: &str, inner: &Answer<'_>) -> Result<String, CsError> {
    match inner
        .fields
        .get("jobid")
        .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
    {
        Some(id) if !id.is_empty() => Ok(id),
        _ => Err(malformed(command, "no \"jobid\" in the response".into())),
    }
}

impl Client {
    /// `queryAsyncJobResult jobid=…`.
    pub async fn query_job(&self, job_id: &str) -> Result<AsyncJob, CsError> {
        self.call_with(QUERY_JOB, &[("jobid", job_id.to_string())], |inner| {
            serde_json::from_str(inner.raw.get())
                .map_err(|e| malformed(QUERY_JOB, format!("job {job_id}: {e}")))
        })
        .await
    }

    /// One page of the jobs created at or after `startdate` (CloudStack's
    /// `yyyy-MM-dd'T'HH:mm:ssZ`, see [`types::cloudstack_date`]), which CloudStack lists oldest
    /// first (by id): [`Client::list_async_jobs_since`] for that instant. A `startdate` in
    /// another form is sent as it is and nothing is filtered. The flag says whether another
    /// page may follow. Read one page at a time so a long job history is never held in memory
    /// whole.
    pub async fn list_async_jobs_page(
        &self,
        startdate: &str,
        page: u32,
    ) -> Result<(Vec<types::ListedJob>, bool), CsError> {
        match types::parse_cloudstack_date(startdate) {
            Some(since) => self.list_async_jobs_since(since, page).await,
            None => {
                self.list_async_jobs(startdate.trim().to_string(), None, page)
                    .await
            }
        }
    }

    /// One page of `listAsyncJobs startdate=yyyy-MM-dd page=… pagesize=…` keeping the jobs
    /// created at or after `since_unix` (seconds since the Unix epoch). `startdate` is a DATE
    /// parameter: CloudStack drops any time part and lists from midnight in its own time zone,
    /// so the date sent is that of `since_unix` less 12 hours (the earliest midnight any zone
    /// can mean) and the jobs created before `since_unix` are dropped here, by `created`; a job
    /// whose `created` is absent or unreadable is kept. The flag says whether another page may
    /// follow (the page CloudStack sent was full, before filtering).
    pub async fn list_async_jobs_since(
        &self,
        since_unix: u64,
        page: u32,
    ) -> Result<(Vec<types::ListedJob>, bool), CsError> {
        let day = types::cloudstack_day(since_unix.saturating_sub(STARTDATE_ZONE_SLACK.as_secs()));
        self.list_async_jobs(day, Some(since_unix), page).await
    }

    async fn list_async_jobs(
        &self,
        startdate: String,
        since_unix: Option<u64>,
        page: u32,
    ) -> Result<(Vec<types::ListedJob>, bool), CsError> {
        let base = self.list_params(vec![("startdate", startdate)]);
        let (mut jobs, _, size) = self
            .list_page::<types::ListedJob>(&LIST_ASYNC_JOBS, &base, page.max(1), self.page_size())
            .await?;
        let more = u32::try_from(jobs.len()).is_ok_and(|n| n >= size);
        if let Some(since) = since_unix {
            jobs.retain(|job| job.created_unix().is_none_or(|created| created >= since));
        }
        Ok((jobs, more))
    }
}
