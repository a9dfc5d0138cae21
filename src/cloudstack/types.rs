//! CloudStack response objects, as the API sends them. Lenient where CloudStack is loose:
//! numbers that arrive as strings (`cpunumber`, `memory`), absent optional fields, unknown
//! fields ignored.

use serde::Deserialize;

/// One element of `listkubernetesclustersresponse.kubernetescluster[]` (and of a scale job's
/// `jobresult.kubernetescluster`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct KubernetesCluster {
    pub id: String,
    pub name: String,
    pub state: String,
    /// Worker count.
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub controlnodes: u64,
    #[serde(default)]
    pub etcdnodes: Option<u64>,
    #[serde(default)]
    pub minsize: Option<u64>,
    #[serde(default)]
    pub maxsize: Option<u64>,
    #[serde(default)]
    pub autoscalingenabled: bool,
    #[serde(default)]
    pub serviceofferingid: Option<String>,
    #[serde(default)]
    pub serviceofferingname: Option<String>,
    #[serde(default)]
    pub workerofferingid: Option<String>,
    #[serde(default)]
    pub workerofferingname: Option<String>,
    #[serde(default)]
    pub zoneid: Option<String>,
    #[serde(default)]
    pub zonename: Option<String>,
    #[serde(default)]
    pub kubernetesversionname: Option<String>,
    #[serde(default)]
    pub virtualmachines: Vec<ClusterVm>,
}

/// One element of a cluster's `virtualmachines[]` (KubernetesUserVmResponse).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ClusterVm {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub isexternalnode: bool,
    #[serde(default)]
    pub isetcdnode: bool,
    #[serde(default)]
    pub kubernetesnodeversion: Option<String>,
    #[serde(default)]
    pub created: Option<String>,
}

/// `queryasyncjobresultresponse` / an element of `listasyncjobsresponse.asyncjobs[]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct AsyncJob {
    pub jobid: String,
    /// 0 in progress, 1 succeeded, 2 failed, 3 cancelled.
    pub jobstatus: i64,
    #[serde(default)]
    pub jobresultcode: i64,
    #[serde(default)]
    pub jobresult: Option<serde_json::Value>,
    #[serde(default)]
    pub jobinstancetype: Option<String>,
    #[serde(default)]
    pub jobinstanceid: Option<String>,
    #[serde(default)]
    pub cmd: Option<String>,
    #[serde(default)]
    pub created: Option<String>,
}

/// Where a job stands, with the failure text pulled out of `jobresult`.
#[derive(Debug, Clone, PartialEq)]
pub enum JobOutcome {
    Pending,
    /// The job's `jobresult.kubernetescluster` when present.
    Succeeded(Option<Box<KubernetesCluster>>),
    Failed {
        errorcode: i64,
        errortext: String,
    },
    Cancelled,
}

impl AsyncJob {
    /// Interprets `jobstatus`/`jobresult` (failure text from `jobresult.errortext`).
    pub fn outcome(&self) -> JobOutcome {
        todo!("client helper")
    }

    /// True for `scaleKubernetesCluster` jobs (by `cmd` class name).
    pub fn is_scale_cluster(&self) -> bool {
        self.cmd
            .as_deref()
            .is_some_and(|c| c.ends_with("ScaleKubernetesClusterCmd"))
    }
}

/// An element of `listserviceofferingsresponse.serviceoffering[]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ServiceOffering {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub cpunumber: Option<u64>,
    /// MiB.
    #[serde(default)]
    pub memory: Option<u64>,
    /// MHz.
    #[serde(default)]
    pub cpuspeed: Option<u64>,
    /// GiB, when the offering fixes the root disk size.
    #[serde(default)]
    pub rootdisksize: Option<u64>,
    /// e.g. GPU details (`pciDevice`, `vgpuType`) on GPU offerings.
    #[serde(default)]
    pub serviceofferingdetails: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    pub vgpuprofilename: Option<String>,
    #[serde(default)]
    pub gpucount: Option<u64>,
    #[serde(default)]
    pub gpucardname: Option<String>,
}

/// An element of `listzonesresponse.zone[]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Zone {
    pub id: String,
    pub name: String,
}

/// `listcapabilitiesresponse.capability`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Capabilities {
    #[serde(default)]
    pub cloudstackversion: Option<String>,
    #[serde(default)]
    pub apilimitinterval: Option<i64>,
    #[serde(default)]
    pub apilimitmax: Option<i64>,
}
