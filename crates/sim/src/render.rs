//! The JSON CloudStack returns for clusters, VMs, offerings, zones and jobs: field names, types
//! and shapes as CloudStack serializes them. Views borrow from the model so that listing a
//! cluster of thousands of VMs serializes straight into the response buffer.

use serde::Serialize;

use super::accounts::Ownership;
use super::model::{
    Cluster, Job, JobResult, JobStatus, Offering, Vm, VmRole, VmState, World, Zone,
};

#[derive(Serialize)]
pub struct NicView<'a> {
    id: &'a str,
    networkid: &'a str,
    networkname: &'a str,
    netmask: &'static str,
    gateway: &'static str,
    ipaddress: &'a str,
    /// Gone once the VM is stopped (alert_05, alert_07): CloudStack releases the nic's VLAN.
    #[serde(skip_serializing_if = "Option::is_none")]
    isolationuri: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    broadcasturi: Option<&'static str>,
    traffictype: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    isdefault: bool,
    macaddress: &'a str,
    secondaryip: [(); 0],
    extradhcpoption: [(); 0],
    deviceid: &'static str,
}

/// A VM: inside `listKubernetesClusters` (`KubernetesUserVmResponse`, built with the `nics`
/// details only, so no offering or template fields, plus the CKS flags) or in
/// `listVirtualMachines` (full details, no CKS flags). Serialized by hand, entry by entry, so
/// that thousands of them stay cheap and optional parts are simply left out.
pub struct VmView<'a> {
    id: &'a str,
    name: &'a str,
    owner: OwnerView<'a>,
    userid: &'a str,
    username: &'a str,
    domainid: &'a str,
    domain: &'a str,
    created: &'a str,
    state: &'static str,
    zoneid: &'a str,
    zonename: &'a str,
    hypervisor: &'a str,
    guestosid: &'a str,
    nic: [NicView<'a>; 1],
    cks: Option<CksFlags<'a>>,
    full: Option<FullVm<'a>>,
    /// The VM's job in progress, if any.
    job: Option<&'a str>,
}

/// A VM's `details` as 4.21 shows a CKS node's: its root disk size in GB, as a string
/// (running_01), and once stopped whether its reserved capacity was freed (alert_05).
struct Details {
    stopped: bool,
}

impl Serialize for Details {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        if self.stopped {
            m.serialize_entry("Message.ReservedCapacityFreed.Flag", "false")?;
        }
        m.serialize_entry("rootdisksize", "8")?;
        m.end()
    }
}

/// The hypervisor's name of a VM, in CloudStack's `i-<account>-<id>-<suffix>` form (`i-2-4-QA`
/// in running_01), from the VM's own id since the simulator has no numeric ids.
fn instance_name(id: &str) -> String {
    let short: String = id.chars().filter(char::is_ascii_hexdigit).take(6).collect();
    format!("i-2-{short}-VM")
}

struct CksFlags<'a> {
    isexternalnode: bool,
    isetcdnode: bool,
    kubernetesnodeversion: Option<&'a str>,
}

struct FullVm<'a> {
    serviceofferingid: &'a str,
    serviceofferingname: &'a str,
    cpunumber: u64,
    cpuspeed: u64,
    memory: u64,
    templateid: &'a str,
    ipaddress: &'a str,
}

impl Serialize for VmView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("id", self.id)?;
        m.serialize_entry("name", self.name)?;
        m.serialize_entry("displayname", self.name)?;
        match self.owner {
            OwnerView::Account(a) => m.serialize_entry("account", a)?,
            OwnerView::Project { id, name } => {
                m.serialize_entry("projectid", id)?;
                m.serialize_entry("project", name)?;
            }
        }
        m.serialize_entry("userid", self.userid)?;
        m.serialize_entry("username", self.username)?;
        m.serialize_entry("domainid", self.domainid)?;
        m.serialize_entry("domain", self.domain)?;
        m.serialize_entry("created", self.created)?;
        m.serialize_entry("state", self.state)?;
        m.serialize_entry("haenable", &false)?;
        m.serialize_entry("zoneid", self.zoneid)?;
        m.serialize_entry("zonename", self.zonename)?;
        m.serialize_entry("hypervisor", self.hypervisor)?;
        if let Some(f) = &self.full {
            // Only `listVirtualMachines` has these (running_07); a cluster's VM entries do not
            // (running_01).
            m.serialize_entry("domainpath", "/")?;
            m.serialize_entry("templatetype", "USER")?;
            m.serialize_entry("templateformat", "QCOW2")?;
            m.serialize_entry("ipaddress", f.ipaddress)?;
            m.serialize_entry("serviceofferingid", f.serviceofferingid)?;
            m.serialize_entry("serviceofferingname", f.serviceofferingname)?;
            m.serialize_entry("cpunumber", &f.cpunumber)?;
            m.serialize_entry("cpuspeed", &f.cpuspeed)?;
            m.serialize_entry("memory", &f.memory)?;
            m.serialize_entry("templateid", f.templateid)?;
            m.serialize_entry("templatename", "cks-template")?;
            m.serialize_entry("templatedisplaytext", "CKS node template")?;
            m.serialize_entry("passwordenabled", &false)?;
            m.serialize_entry("rootdeviceid", &0)?;
            m.serialize_entry("rootdevicetype", "ROOT")?;
        }
        // Both views carry these on 4.21: a cluster's VM entries (running_01) as much as
        // `listVirtualMachines` (running_07).
        m.serialize_entry("guestosid", self.guestosid)?;
        m.serialize_entry("ostypeid", self.guestosid)?;
        m.serialize_entry("osdisplayname", "Ubuntu 22.04 LTS")?;
        m.serialize_entry("pooltype", "NetworkFilesystem")?;
        m.serialize_entry("securitygroup", &[(); 0])?;
        m.serialize_entry("affinitygroup", &[(); 0])?;
        m.serialize_entry("tags", &[(); 0])?;
        m.serialize_entry("instancename", &instance_name(self.id))?;
        m.serialize_entry(
            "details",
            &Details {
                stopped: self.state == VmState::Stopped.as_str(),
            },
        )?;
        m.serialize_entry("deleteprotection", &false)?;
        m.serialize_entry("vmtype", "cksnode")?;
        m.serialize_entry("arch", "x86_64")?;
        m.serialize_entry("nic", &self.nic)?;
        m.serialize_entry("displayvm", &true)?;
        m.serialize_entry("isdynamicallyscalable", &false)?;
        if self.full.is_some() {
            // Not in a cluster's VM entries (running_01), only in `listVirtualMachines`
            // (running_07).
            m.serialize_entry("hasannotations", &false)?;
        }
        if let Some(k) = &self.cks {
            m.serialize_entry("isexternalnode", &k.isexternalnode)?;
            m.serialize_entry("isetcdnode", &k.isetcdnode)?;
            if let Some(v) = k.kubernetesnodeversion {
                m.serialize_entry("kubernetesnodeversion", v)?;
            }
        }
        // `UserVmJoinDaoImpl.newUserVmResponse`: `user_vm_view` joins the VM's pending job,
        // and a VM answer built while one runs carries its id and status 0. So does the stop
        // job's own result, built before the job ends (alert_04, alert_10).
        if let Some(job) = self.job {
            m.serialize_entry("jobid", job)?;
            m.serialize_entry("jobstatus", &(JobStatus::InProgress as u8))?;
        }
        m.end()
    }
}

/// Who owns a cluster or VM, as its response names it. CloudStack names a project's resource
/// by its project only (`projectid`, `project`) and any other by its account (`account`):
/// `UserVmJoinDaoImpl.newUserVmResponse` and `KubernetesClusterManagerImpl
/// .createKubernetesClusterResponse` both test the owner's account type for PROJECT, as
/// `ApiResponseHelper.populateOwner` does.
#[derive(Clone, Copy)]
pub enum OwnerView<'a> {
    Account(&'a str),
    Project { id: &'a str, name: &'a str },
}

fn owner<'a>(o: &Ownership<'a>) -> OwnerView<'a> {
    match *o {
        Ownership::Project { id, name, .. } => OwnerView::Project { id, name },
        Ownership::Account { name, .. } => OwnerView::Account(name),
    }
}

fn nic<'a>(c: &'a Cluster, vm: &'a Vm) -> NicView<'a> {
    let vlan = (vm.state != VmState::Stopped).then_some("vlan://1001");
    NicView {
        id: &vm.nic_id,
        networkid: &c.network_id,
        networkname: &c.network_name,
        netmask: "255.255.0.0",
        gateway: "10.1.0.1",
        ipaddress: &vm.ip,
        isolationuri: vlan,
        broadcasturi: vlan,
        traffictype: "Guest",
        kind: "Isolated",
        isdefault: true,
        macaddress: &vm.mac,
        secondaryip: [],
        extradhcpoption: [],
        deviceid: "0",
    }
}

fn vm_base<'a>(w: &'a World, c: &'a Cluster, zone: &'a Zone, vm: &'a Vm) -> VmView<'a> {
    let ownership = w.ownership(c);
    let (userid, username) = ownership.user();
    VmView {
        id: &vm.id,
        name: &vm.name,
        owner: owner(&ownership),
        userid,
        username,
        domainid: &w.owner.domain_id,
        domain: &w.owner.domain,
        created: &vm.created,
        state: vm.state.as_str(),
        zoneid: &zone.id,
        zonename: &zone.name,
        hypervisor: &w.hypervisor,
        guestosid: &w.template_id,
        nic: [nic(c, vm)],
        cks: None,
        full: None,
        job: w.pending_vm_jobs.get(&vm.id).map(String::as_str),
    }
}

/// A VM as its cluster lists it.
pub fn cluster_vm<'a>(w: &'a World, c: &'a Cluster, zone: &'a Zone, vm: &'a Vm) -> VmView<'a> {
    VmView {
        cks: Some(CksFlags {
            isexternalnode: vm.role == VmRole::External,
            isetcdnode: vm.role == VmRole::Etcd,
            kubernetesnodeversion: (vm.role != VmRole::Etcd).then_some(c.version_name.as_str()),
        }),
        ..vm_base(w, c, zone, vm)
    }
}

/// A VM as `listVirtualMachines` shows it.
pub fn vm<'a>(w: &'a World, c: &'a Cluster, zone: &'a Zone, vm: &'a Vm) -> VmView<'a> {
    let o = w.offering(&vm.offering_id);
    VmView {
        full: Some(FullVm {
            serviceofferingid: &vm.offering_id,
            serviceofferingname: o.map(|o| o.name.as_str()).unwrap_or(""),
            cpunumber: o.map(|o| o.cpu).unwrap_or(0),
            cpuspeed: o.map(|o| o.speed).unwrap_or(0),
            memory: o.map(|o| o.memory).unwrap_or(0),
            templateid: &c.template_id,
            ipaddress: &vm.ip,
        }),
        ..vm_base(w, c, zone, vm)
    }
}

/// `KubernetesClusterResponse`.
#[derive(Serialize)]
pub struct ClusterView<'a> {
    id: &'a str,
    name: &'a str,
    description: &'a str,
    zoneid: &'a str,
    zonename: &'a str,
    serviceofferingid: &'a str,
    serviceofferingname: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    workerofferingid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workerofferingname: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    controlofferingid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    controlofferingname: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    etcdofferingid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    etcdofferingname: Option<&'a str>,
    templateid: &'a str,
    networkid: &'a str,
    associatednetworkname: &'a str,
    kubernetesversionid: &'a str,
    kubernetesversionname: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    account: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    projectid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    project: Option<&'a str>,
    domainid: &'a str,
    domain: &'a str,
    domainpath: &'static str,
    masternodes: u64,
    controlnodes: u64,
    /// 0 without etcd nodes, as 4.21 lists it (running_01).
    etcdnodes: u64,
    size: u64,
    state: &'static str,
    cpunumber: String,
    memory: String,
    endpoint: String,
    ipaddress: &'a str,
    ipaddressid: &'a str,
    /// `{}` without etcd nodes (running_01); what it holds with some is not recorded.
    etcdips: serde_json::Map<String, serde_json::Value>,
    autoscalingenabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    minsize: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    maxsize: Option<u64>,
    clustertype: &'static str,
    created: &'a str,
    hasannotations: bool,
    virtualmachines: Vec<VmView<'a>>,
}

pub fn cluster<'a>(w: &'a World, c: &'a Cluster, fallback_zone: &'a Zone) -> ClusterView<'a> {
    let zone = w.zone(&c.zone_id).unwrap_or(fallback_zone);
    let (account, projectid, project) = match owner(&w.ownership(c)) {
        OwnerView::Account(a) => (Some(a), None, None),
        OwnerView::Project { id, name } => (None, Some(id), Some(name)),
    };
    let offering_name = |id: &str| {
        w.offering(id)
            .map(|o: &Offering| o.name.as_str())
            .unwrap_or("")
    };
    ClusterView {
        id: &c.id,
        name: &c.name,
        description: &c.description,
        zoneid: &zone.id,
        zonename: &zone.name,
        serviceofferingid: &c.offering_id,
        serviceofferingname: offering_name(&c.offering_id),
        workerofferingid: c.worker_offering_id.as_deref(),
        workerofferingname: c.worker_offering_id.as_deref().map(offering_name),
        controlofferingid: c.control_offering_id.as_deref(),
        controlofferingname: c.control_offering_id.as_deref().map(offering_name),
        etcdofferingid: c.etcd_offering_id.as_deref(),
        etcdofferingname: c.etcd_offering_id.as_deref().map(offering_name),
        templateid: &c.template_id,
        networkid: &c.network_id,
        associatednetworkname: &c.network_name,
        kubernetesversionid: &c.version_id,
        kubernetesversionname: &c.version_name,
        account,
        projectid,
        project,
        domainid: &w.owner.domain_id,
        domain: &w.owner.domain,
        domainpath: "/",
        masternodes: c.control_count,
        controlnodes: c.control_count,
        etcdnodes: c.etcd_count,
        size: c.size,
        state: c.state.as_str(),
        cpunumber: c.cores.to_string(),
        memory: c.memory.to_string(),
        endpoint: format!("https://{}:6443/", c.ip),
        ipaddress: &c.ip,
        ipaddressid: &c.ip_id,
        etcdips: serde_json::Map::new(),
        autoscalingenabled: c.autoscaling,
        // Only with autoscaling on: 4.21 leaves both out otherwise (running_01).
        minsize: c.min_size.filter(|_| c.autoscaling),
        maxsize: c.max_size.filter(|_| c.autoscaling),
        clustertype: if c.externally_managed {
            "ExternalManaged"
        } else {
            "CloudManaged"
        },
        created: &c.created,
        hasannotations: false,
        virtualmachines: c.vms.iter().map(|vm| cluster_vm(w, c, zone, vm)).collect(),
    }
}

pub fn offering(o: &Offering) -> serde_json::Value {
    serde_json::json!({
        "id": o.id,
        "name": o.name,
        "displaytext": o.name,
        "cpunumber": o.cpu,
        "cpuspeed": o.speed,
        "memory": o.memory,
        "created": o.created,
        "storagetype": "shared",
        "provisioningtype": "thin",
        "offerha": false,
        "limitcpuuse": false,
        "isvolatile": false,
        "issystem": false,
        "defaultuse": false,
        "iscustomized": o.customized,
        // The rest as 4.21 lists an offering (running_11).
        "state": "Active",
        "rootdisksize": 0,
        "dynamicscalingenabled": true,
        "diskofferingstrictness": false,
        "diskofferingid": o.id,
        "diskofferingname": o.name,
        "diskofferingdisplaytext": o.name,
        "encryptroot": false,
        "gpudisplay": false,
        "hasannotations": false,
    })
}

pub fn zone(z: &Zone) -> serde_json::Value {
    serde_json::json!({
        "id": z.id,
        "name": z.name,
        "networktype": "Advanced",
        "securitygroupsenabled": false,
        "allocationstate": "Enabled",
        "dhcpprovider": "VirtualRouter",
        "localstorageenabled": false,
        "type": "Core",
        "tags": [],
        "hasannotations": false,
    })
}

/// An async job as `queryAsyncJobResult` and `listAsyncJobs` show it.
pub struct JobView<'a> {
    w: &'a World,
    j: &'a Job,
}

pub fn job<'a>(w: &'a World, j: &'a Job) -> JobView<'a> {
    JobView { w, j }
}

#[derive(Serialize)]
struct ClusterResult<'a> {
    kubernetescluster: ClusterView<'a>,
}

impl Serialize for JobView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let (w, j) = (self.w, self.j);
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("cmd", j.kind.class())?;
        m.serialize_entry("jobstatus", &(j.status as u8))?;
        m.serialize_entry("jobprocstatus", &0)?;
        m.serialize_entry("jobresultcode", &j.result_code)?;
        if j.status != JobStatus::InProgress {
            m.serialize_entry("jobresulttype", "object")?;
            match &j.result {
                Some(JobResult::Json(v)) => m.serialize_entry("jobresult", v)?,
                Some(JobResult::Cluster(c)) => match w.zone(&c.zone_id).or(w.zones.first()) {
                    Some(z) => m.serialize_entry(
                        "jobresult",
                        &ClusterResult {
                            kubernetescluster: cluster(w, c, z),
                        },
                    )?,
                    None => m.serialize_entry("jobresult", &serde_json::Value::Null)?,
                },
                None => {}
            }
        }
        if let Some(kind) = j.kind.instance_type() {
            m.serialize_entry("jobinstancetype", kind)?;
            m.serialize_entry("jobinstanceid", &j.instance_id)?;
        }
        m.serialize_entry("created", &j.created)?;
        m.serialize_entry("userid", &j.submitter.user_id)?;
        m.serialize_entry("accountid", &j.submitter.account_id)?;
        if let Some(done) = &j.completed {
            m.serialize_entry("completed", done)?;
        }
        m.serialize_entry("jobid", &j.id)?;
        m.serialize_entry("account", &j.submitter.account)?;
        m.serialize_entry("domainid", &w.owner.domain_id)?;
        m.serialize_entry("domainpath", "/")?;
        m.end()
    }
}
