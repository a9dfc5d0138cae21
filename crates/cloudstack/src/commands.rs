//! The typed API calls the provider makes: clusters by id or name, scaling a cluster by size or
//! by nodes, VMs by id, stopping a VM, the offering and the CloudStack version. Each names the
//! exact parameters it sends and checks its arguments before any request, so that what the
//! provider can ask of CloudStack is listed in one file.

use crate::CsError;
use crate::client::Client;
use crate::envelope::malformed;
use crate::jobs::job_id;
use crate::paging::{ListSpec, parse_list};
use crate::types::{KubernetesCluster, ServiceOffering, VirtualMachine};

/// At most this many ids go in one `listVirtualMachines ids=…` request, so the URL stays well
/// under the header size a servlet container accepts (37 characters an id).
const VM_IDS_PER_CALL: usize = 50;

/// Sent with cluster lists: without it CloudStack lists only the caller's own account's
/// clusters, so an admin or domain-admin key would not see a cluster another account owns.
fn listall() -> (&'static str, String) {
    ("listall", "true".to_string())
}

const LIST_CLUSTERS: ListSpec = ListSpec {
    command: "listKubernetesClusters",
    field: "kubernetescluster",
};

const LIST_SERVICE_OFFERINGS: ListSpec = ListSpec {
    command: "listServiceOfferings",
    field: "serviceoffering",
};

const LIST_VMS: ListSpec = ListSpec {
    command: "listVirtualMachines",
    field: "virtualmachine",
};

const LIST_CONFIGURATIONS: ListSpec = ListSpec {
    command: "listConfigurations",
    field: "configuration",
};

/// CloudStack's limit on a Kubernetes cluster's node count, control nodes included
/// (`KubernetesClusterService.KubernetesMaxClusterSize`, account scope, default 10).
pub const CLUSTER_MAX_SIZE_SETTING: &str = "cloud.kubernetes.cluster.max.size";

const SCALE_CLUSTER: &str = "scaleKubernetesCluster";

const STOP_VM: &str = "stopVirtualMachine";

const LIST_CAPABILITIES: &str = "listCapabilities";

impl Client {
    /// `listKubernetesClusters id=…`; `Ok(None)` when CloudStack lists none. One request, the
    /// one every refresh sends: its answer is read straight into the clusters it lists.
    pub async fn get_cluster(&self, id: &str) -> Result<Option<KubernetesCluster>, CsError> {
        let params = self.list_params(vec![("id", id.to_string()), listall()]);
        let (clusters, _): (Vec<KubernetesCluster>, _) = self
            .call_with(LIST_CLUSTERS.command, &params, |a| {
                parse_list(&LIST_CLUSTERS, a)
            })
            .await?;
        Ok(clusters.into_iter().find(|c| c.id == id))
    }

    /// `listKubernetesClusters name=…` (exact name).
    pub async fn find_clusters_by_name(
        &self,
        name: &str,
    ) -> Result<Vec<KubernetesCluster>, CsError> {
        let clusters: Vec<KubernetesCluster> = self
            .list_all_pages(&LIST_CLUSTERS, vec![("name", name.to_string()), listall()])
            .await?;
        // Documented as a substring match in some versions; keep exact matches only.
        Ok(clusters.into_iter().filter(|c| c.name == name).collect())
    }

    /// `listKubernetesClusters` with no filter: every cluster the key lists (with `projectid`
    /// when configured), all pages. What an operator is shown when the cluster `--nodes` names
    /// is not among them; never called while serving a listed cluster.
    pub async fn list_clusters(&self) -> Result<Vec<KubernetesCluster>, CsError> {
        self.list_all_pages(&LIST_CLUSTERS, vec![listall()]).await
    }

    /// `listConfigurations name=cloud.kubernetes.cluster.max.size`: its value where the key
    /// may read it (an administrator's command: other keys are refused, 432). The global value:
    /// CloudStack checks the cluster owner's account value, which may override it. `Ok(None)`
    /// when CloudStack lists no such setting or its value is not a number.
    pub async fn cluster_max_size(&self) -> Result<Option<u32>, CsError> {
        #[derive(serde::Deserialize)]
        struct Configuration {
            name: String,
            #[serde(default)]
            value: Option<String>,
        }
        // No `projectid`: `listConfigurations` has no such parameter.
        let params = [("name", CLUSTER_MAX_SIZE_SETTING.to_string())];
        let (listed, _): (Vec<Configuration>, _) = self
            .call_with(LIST_CONFIGURATIONS.command, &params, |inner| {
                parse_list(&LIST_CONFIGURATIONS, inner)
            })
            .await?;
        Ok(listed
            .into_iter()
            .find(|c| c.name == CLUSTER_MAX_SIZE_SETTING)
            .and_then(|c| c.value)
            .and_then(|v| v.trim().parse().ok()))
    }

    /// `scaleKubernetesCluster id=… size=…` and nothing else. Returns the job id.
    pub async fn scale_cluster_size(&self, cluster_id: &str, size: u32) -> Result<String, CsError> {
        let params = vec![("id", cluster_id.to_string()), ("size", size.to_string())];
        self.call_with(SCALE_CLUSTER, &params, |a| job_id(SCALE_CLUSTER, a))
            .await
    }

    /// `scaleKubernetesCluster id=… nodeids=a,b` and nothing else. Returns the job id.
    pub async fn scale_cluster_remove_nodes(
        &self,
        cluster_id: &str,
        vm_ids: &[String],
    ) -> Result<String, CsError> {
        if vm_ids.is_empty()
            || vm_ids
                .iter()
                .any(|id| id.trim().is_empty() || id.contains(','))
        {
            return Err(CsError::Config(format!(
                "{SCALE_CLUSTER} needs one or more node ids without commas, got {vm_ids:?}"
            )));
        }
        let params = vec![
            ("id", cluster_id.to_string()),
            ("nodeids", vm_ids.join(",")),
        ];
        self.call_with(SCALE_CLUSTER, &params, |a| job_id(SCALE_CLUSTER, a))
            .await
    }

    /// `listVirtualMachines ids=… listall=true` (with `projectid` when configured): the VMs
    /// CloudStack lists among `vm_ids`, in requests of at most 50 ids, each paged. A VM it
    /// does not list (expunged, or not visible to the key) is absent from the answer. No ids
    /// lists nothing (no request; CloudStack would list every VM).
    pub async fn list_virtual_machines(
        &self,
        vm_ids: &[String],
    ) -> Result<Vec<VirtualMachine>, CsError> {
        if vm_ids
            .iter()
            .any(|id| id.trim().is_empty() || id.contains(','))
        {
            return Err(CsError::Config(format!(
                "{} needs VM ids without commas, got {vm_ids:?}",
                LIST_VMS.command
            )));
        }
        let mut vms = Vec::new();
        for chunk in vm_ids.chunks(VM_IDS_PER_CALL) {
            let params = vec![("ids", chunk.join(",")), listall()];
            let listed: Vec<VirtualMachine> = self.list_all_pages(&LIST_VMS, params).await?;
            vms.extend(listed.into_iter().filter(|vm| chunk.contains(&vm.id)));
        }
        Ok(vms)
    }

    /// `stopVirtualMachine id=…`, with `forced=true` when `forced` (`StopVMCmd`: the VM is
    /// marked Stopped even when the stop command cannot reach its host). Returns the job id;
    /// the job's result holds the VM ([`AsyncJob::result_virtual_machine`](crate::types::AsyncJob::result_virtual_machine)).
    pub async fn stop_virtual_machine(&self, vm_id: &str, forced: bool) -> Result<String, CsError> {
        if vm_id.trim().is_empty() {
            return Err(CsError::Config(format!("{STOP_VM} needs a VM id")));
        }
        let mut params = vec![("id", vm_id.to_string())];
        if forced {
            params.push(("forced", "true".to_string()));
        }
        self.call_with(STOP_VM, &params, |a| job_id(STOP_VM, a))
            .await
    }

    /// `listCapabilities`: the `cloudstackversion` CloudStack reports (an upgrade changes it).
    pub async fn cloudstack_version(&self) -> Result<String, CsError> {
        #[derive(serde::Deserialize)]
        struct Capability {
            #[serde(default)]
            cloudstackversion: String,
        }
        #[derive(serde::Deserialize)]
        struct Capabilities {
            capability: Capability,
        }
        self.call_with(LIST_CAPABILITIES, &[], |inner| {
            serde_json::from_str::<Capabilities>(inner.raw.get())
                .map(|c| c.capability.cloudstackversion)
                .map_err(|e| malformed(LIST_CAPABILITIES, e.to_string()))
        })
        .await
    }

    /// `listServiceOfferings id=…`; `Ok(None)` when none.
    pub async fn get_service_offering(&self, id: &str) -> Result<Option<ServiceOffering>, CsError> {
        let offerings: Vec<ServiceOffering> = self
            .list_one_page(&LIST_SERVICE_OFFERINGS, vec![("id", id.to_string())])
            .await?;
        Ok(offerings.into_iter().find(|o| o.id == id))
    }
}
