//! The CloudStack API client: request signing, envelopes, async jobs, error mapping,
//! timeouts. The only code in the provider that talks HTTP to CloudStack.
//!
//! Secrets (the API key's secret, signatures) never appear in logs, errors or `Debug` output.

pub mod error;
pub mod sign;
pub mod types;

pub use error::CsError;
use types::{AsyncJob, Capabilities, KubernetesCluster, ServiceOffering, Zone};

use std::time::Duration;

/// Where and how to reach CloudStack.
#[derive(Clone)]
pub struct ClientConfig {
    /// e.g. `https://cloud.example.com/client/api`.
    pub api_url: String,
    pub api_key: String,
    pub secret_key: String,
    /// Skip TLS verification (only when the operator set `ssl-no-verify`).
    pub ssl_no_verify: bool,
    /// Extra PEM CA bundle to trust for CloudStack's certificate.
    pub ca_bundle_pem: Option<Vec<u8>>,
    /// `projectid` added to every list call when set.
    pub project_id: Option<String>,
    /// Whole-request timeout (connect + response).
    pub request_timeout: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("api_url", &self.api_url)
            .field("api_key", &sign::mask(&self.api_key))
            .field("secret_key", &"***")
            .field("ssl_no_verify", &self.ssl_no_verify)
            .field("project_id", &self.project_id)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// A cheap-to-clone CloudStack client (one connection pool).
#[derive(Clone)]
pub struct Client {
    // filled in by the implementation
}

impl Client {
    /// Builds the client; fails on a bad URL or an unreadable CA bundle.
    pub fn new(config: ClientConfig) -> Result<Self, CsError> {
        todo!("client helper")
    }

    /// `listKubernetesClusters id=…`; `Ok(None)` when CloudStack lists none.
    pub async fn get_cluster(&self, id: &str) -> Result<Option<KubernetesCluster>, CsError> {
        todo!("client helper")
    }

    /// `listKubernetesClusters name=…` (exact name).
    pub async fn find_clusters_by_name(
        &self,
        name: &str,
    ) -> Result<Vec<KubernetesCluster>, CsError> {
        todo!("client helper")
    }

    /// `listKubernetesClusters` (all the key can see; follows paging).
    pub async fn list_clusters(&self) -> Result<Vec<KubernetesCluster>, CsError> {
        todo!("client helper")
    }

    /// `scaleKubernetesCluster id=… size=…` and nothing else. Returns the job id.
    pub async fn scale_cluster_size(&self, cluster_id: &str, size: u32) -> Result<String, CsError> {
        todo!("client helper")
    }

    /// `scaleKubernetesCluster id=… nodeids=a,b` and nothing else. Returns the job id.
    pub async fn scale_cluster_remove_nodes(
        &self,
        cluster_id: &str,
        vm_ids: &[String],
    ) -> Result<String, CsError> {
        todo!("client helper")
    }

    /// `queryAsyncJobResult jobid=…`.
    pub async fn query_job(&self, job_id: &str) -> Result<AsyncJob, CsError> {
        todo!("client helper")
    }

    /// `listAsyncJobs` (all pages): used after a restart to find scale jobs still running.
    pub async fn list_async_jobs(&self) -> Result<Vec<AsyncJob>, CsError> {
        todo!("client helper")
    }

    /// `listServiceOfferings id=…`; `Ok(None)` when none.
    pub async fn get_service_offering(&self, id: &str) -> Result<Option<ServiceOffering>, CsError> {
        todo!("client helper")
    }

    /// `listZones id=…`; `Ok(None)` when none.
    pub async fn get_zone(&self, id: &str) -> Result<Option<Zone>, CsError> {
        todo!("client helper")
    }

    /// `listCapabilities`.
    pub async fn capabilities(&self) -> Result<Capabilities, CsError> {
        todo!("client helper")
    }
}
