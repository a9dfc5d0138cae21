//! Scenario files: the zone, offerings and clusters a simulator starts with, in YAML or TOML
//! (chosen by file extension), and the default demo cluster.
//!
//! ```yaml
//! zone: { name: zone1 }
//! hypervisor: KVM
//! offerings:
//!   - { name: cks-medium, cpu: 2, memory: 4096 }
//! clusters:
//!   - name: demo
//!     offering: cks-medium
//!     control: 1
//!     workers: [Running, Stopped, Running]   # or a count: 3
//!     min_size: 1
//!     max_size: 10
//!     autoscaling: true
//! accounts:                                   # besides the key's own, `admin`
//!   - { name: alice, api_key: K, secret_key: S }
//! projects:
//!   - { name: p1, members: [admin] }
//! ```

use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;

use super::accounts::{Account, ClusterOwner, Owner, ProjectEntry};
use super::clock::now_stamp;
use super::config::{KeyRole, SimSettings};
use super::ids::IdGen;
use super::model::{
    Cluster, ClusterState, NetworkKind, Offering, VmRole, VmState, World, Zone, name_prefix,
};

/// A whole scenario.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub zone: ZoneSpec,
    /// Hypervisor of every VM. Changing the offering of running VMs is only possible on
    /// XenServer, VMware or Simulator, as on CloudStack.
    #[serde(default = "default_hypervisor")]
    pub hypervisor: String,
    /// Service offerings; when empty, a default set (`cks-small`, `cks-medium`, `cks-large`,
    /// `cks-tiny` below CKS's minimum, `cks-custom` dynamic).
    #[serde(default)]
    pub offerings: Vec<OfferingSpec>,
    #[serde(default)]
    pub clusters: Vec<ClusterSpec>,
    /// Accounts besides the key's own (named [`KEY_ACCOUNT`]), each with its own keys.
    #[serde(default)]
    pub accounts: Vec<AccountSpec>,
    /// CloudStack projects, owning the clusters that name them.
    #[serde(default)]
    pub projects: Vec<ProjectSpec>,
}

/// The name of the account the simulator's own key (`SimConfig::api_key`) belongs to, as a
/// scenario's `members` and `account` name it.
pub const KEY_ACCOUNT: &str = "admin";

/// Another account: a User account unless `role` says otherwise, with one user (named as
/// the account) and its keys. Keys not given are generated at random when the simulator
/// starts (`SimHandle::account_keys` tells them).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountSpec {
    pub name: String,
    /// `user` (the default), `list-only`, `project-kubernetes` or `admin`.
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub api_key: Option<String>,
    #[serde(default)]
    pub secret_key: Option<String>,
}

impl AccountSpec {
    /// A User account called `name`, its keys generated.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            role: None,
            api_key: None,
            secret_key: None,
        }
    }
}

/// A project and the accounts that are its members (by name; [`KEY_ACCOUNT`] is the key's).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectSpec {
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    pub members: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneSpec {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default = "default_zone_name")]
    pub name: String,
}

impl Default for ZoneSpec {
    fn default() -> Self {
        Self {
            id: None,
            name: default_zone_name(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfferingSpec {
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    pub cpu: u64,
    /// MB.
    pub memory: u64,
    /// MHz.
    #[serde(default = "default_speed")]
    pub speed: u64,
    #[serde(default)]
    pub customized: bool,
}

/// VMs of one role: a count of Running VMs, or one state per VM.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum NodesSpec {
    Count(u64),
    States(Vec<VmState>),
}

/// Bounds a scenario so that a typo cannot exhaust memory.
const MAX_VMS_PER_CLUSTER: u64 = 100_000;

impl NodesSpec {
    fn count(&self) -> u64 {
        match self {
            Self::Count(n) => *n,
            Self::States(s) => s.len() as u64,
        }
    }

    fn states(&self) -> Vec<VmState> {
        match self {
            Self::Count(n) => vec![VmState::Running; *n as usize],
            Self::States(s) => s.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// Default: Running when every VM runs, else Alert.
    #[serde(default)]
    pub state: Option<ClusterState>,
    /// Cluster offering, by name or id. Default: the first offering.
    #[serde(default)]
    pub offering: Option<String>,
    #[serde(default)]
    pub control_offering: Option<String>,
    #[serde(default)]
    pub worker_offering: Option<String>,
    #[serde(default)]
    pub etcd_offering: Option<String>,
    #[serde(default = "one")]
    pub control: NodesSpec,
    #[serde(default = "zero")]
    pub etcd: NodesSpec,
    #[serde(default = "one")]
    pub workers: NodesSpec,
    /// Nodes added from outside CKS.
    #[serde(default = "zero")]
    pub external: NodesSpec,
    /// Recorded size. Default: workers plus external nodes; set it to build a cluster with
    /// more or fewer VMs than nodes.
    #[serde(default)]
    pub size: Option<u64>,
    #[serde(default)]
    pub min_size: Option<u64>,
    #[serde(default)]
    pub max_size: Option<u64>,
    #[serde(default)]
    pub autoscaling: bool,
    /// `clustertype` ExternalManaged instead of CloudManaged.
    #[serde(default)]
    pub externally_managed: bool,
    /// `isolated` (the default: the network CKS creates) or `shared`.
    #[serde(default)]
    pub network: NetworkKind,
    #[serde(default = "default_version")]
    pub kubernetes_version: String,
    /// Whether the nodes of the VMs Running at start are registered (and Ready) from the start.
    #[serde(default = "yes")]
    pub nodes_registered: bool,
    /// The account owning it, by name. Default: the key's own (or `SimSettings::project`).
    #[serde(default)]
    pub account: Option<String>,
    /// The project owning it, by name or id (not with `account`).
    #[serde(default)]
    pub project: Option<String>,
}

fn default_hypervisor() -> String {
    "KVM".into()
}
fn default_zone_name() -> String {
    "zone1".into()
}
fn default_speed() -> u64 {
    2000
}
fn default_version() -> String {
    "v1.33.1".into()
}
fn one() -> NodesSpec {
    NodesSpec::Count(1)
}
fn zero() -> NodesSpec {
    NodesSpec::Count(0)
}
fn yes() -> bool {
    true
}

impl ClusterSpec {
    /// A Running cluster with `control` control nodes and `workers` workers, everything else
    /// default.
    pub fn new(name: &str, control: u64, workers: u64) -> Self {
        Self {
            id: None,
            name: name.into(),
            description: None,
            state: None,
            offering: None,
            control_offering: None,
            worker_offering: None,
            etcd_offering: None,
            control: NodesSpec::Count(control),
            etcd: zero(),
            workers: NodesSpec::Count(workers),
            external: zero(),
            size: None,
            min_size: None,
            max_size: None,
            autoscaling: false,
            externally_managed: false,
            network: NetworkKind::Isolated,
            kubernetes_version: default_version(),
            nodes_registered: true,
            account: None,
            project: None,
        }
    }
}

impl Default for Scenario {
    fn default() -> Self {
        Self::demo()
    }
}

impl Scenario {
    /// No cluster at all.
    pub fn empty() -> Self {
        Self {
            zone: ZoneSpec::default(),
            hypervisor: default_hypervisor(),
            offerings: Vec::new(),
            clusters: Vec::new(),
            accounts: Vec::new(),
            projects: Vec::new(),
        }
    }

    /// The demo: cluster `demo`, 1 control and 3 workers, Running, autoscaling 1..10.
    pub fn demo() -> Self {
        let mut demo = ClusterSpec::new("demo", 1, 3);
        demo.offering = Some("cks-medium".into());
        demo.min_size = Some(1);
        demo.max_size = Some(10);
        demo.autoscaling = true;
        Self {
            clusters: vec![demo],
            ..Self::empty()
        }
    }

    /// One cluster, otherwise defaults.
    pub fn with_cluster(cluster: ClusterSpec) -> Self {
        Self {
            clusters: vec![cluster],
            ..Self::empty()
        }
    }

    /// Reads a `.yaml`/`.yml` or `.toml` file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading scenario file {}", path.display()))?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let parsed = match ext.as_str() {
            "yaml" | "yml" => Self::from_yaml(&text),
            "toml" => Self::from_toml(&text),
            _ => bail!(
                "scenario file {} must end in .yaml, .yml or .toml",
                path.display()
            ),
        };
        parsed.with_context(|| format!("in scenario file {}", path.display()))
    }

    pub fn from_yaml(text: &str) -> anyhow::Result<Self> {
        let s: Self = serde_saphyr::from_str(text)
            .map_err(|e| anyhow::anyhow!("invalid YAML scenario: {e}"))?;
        s.check()?;
        Ok(s)
    }

    pub fn from_toml(text: &str) -> anyhow::Result<Self> {
        let s: Self =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("invalid TOML scenario: {e}"))?;
        s.check()?;
        Ok(s)
    }

    fn offering_specs(&self) -> Vec<OfferingSpec> {
        if !self.offerings.is_empty() {
            return self.offerings.clone();
        }
        let o = |name: &str, cpu, memory, customized| OfferingSpec {
            id: None,
            name: name.into(),
            cpu,
            memory,
            speed: 2000,
            customized,
        };
        vec![
            o("cks-medium", 2, 4096, false),
            o("cks-small", 2, 2048, false),
            o("cks-large", 4, 8192, false),
            o("cks-tiny", 1, 1024, false),
            o("cks-custom", 2, 4096, true),
        ]
    }

    /// Checks what serde cannot: names unique, offerings, accounts and projects resolvable, at
    /// least one control node.
    pub fn check(&self) -> anyhow::Result<()> {
        let offerings = self.offering_specs();
        let mut accounts = std::collections::HashSet::from([KEY_ACCOUNT]);
        for a in &self.accounts {
            if a.name.trim().is_empty() || !accounts.insert(a.name.as_str()) {
                bail!(
                    "account name {:?} is empty or used twice (the key's own is {KEY_ACCOUNT:?})",
                    a.name
                );
            }
            if let Some(role) = &a.role {
                role.parse::<KeyRole>()
                    .map_err(|e| anyhow::anyhow!("account {:?}: {e}", a.name))?;
            }
        }
        let mut projects = std::collections::HashSet::new();
        for p in &self.projects {
            if p.name.trim().is_empty() || !projects.insert(p.name.as_str()) {
                bail!("project name {:?} is empty or used twice", p.name);
            }
            if let Some(id) = &p.id
                && !super::ids::is_uuid(id)
            {
                bail!("project {:?}: id {id:?} is not a UUID", p.name);
            }
            if let Some(m) = p.members.iter().find(|m| !accounts.contains(m.as_str())) {
                bail!(
                    "project {:?} names member {m:?}, which is no account of the scenario",
                    p.name
                );
            }
        }
        let mut names = std::collections::HashSet::new();
        for c in &self.clusters {
            if let Some(a) = c.account.as_deref().filter(|a| !accounts.contains(a)) {
                bail!(
                    "cluster {:?} names account {a:?}, which the scenario does not define",
                    c.name
                );
            }
            if let Some(p) = &c.project {
                if c.account.is_some() {
                    bail!("cluster {:?} names both an account and a project", c.name);
                }
                if !self.projects.iter().any(|s| {
                    &s.name == p || s.id.as_ref().is_some_and(|id| id.eq_ignore_ascii_case(p))
                }) {
                    bail!(
                        "cluster {:?} names project {p:?}, which the scenario does not define",
                        c.name
                    );
                }
            }
            if c.name.trim().is_empty() {
                bail!("a cluster has an empty name");
            }
            if !names.insert(c.name.as_str()) {
                bail!("cluster name {:?} is used twice", c.name);
            }
            if c.control.count() == 0 {
                bail!("cluster {:?} needs at least one control node", c.name);
            }
            let total = c.control.count() + c.etcd.count() + c.workers.count() + c.external.count();
            if total > MAX_VMS_PER_CLUSTER {
                bail!(
                    "cluster {:?} has {total} VMs; the simulator allows at most {MAX_VMS_PER_CLUSTER}",
                    c.name
                );
            }
            for o in [
                &c.offering,
                &c.control_offering,
                &c.worker_offering,
                &c.etcd_offering,
            ]
            .into_iter()
            .flatten()
            {
                if !offerings
                    .iter()
                    .any(|s| &s.name == o || s.id.as_ref() == Some(o))
                {
                    bail!(
                        "cluster {:?} names offering {:?}, which the scenario does not define",
                        c.name,
                        o
                    );
                }
            }
        }
        Ok(())
    }

    /// Builds the world this scenario describes; ids come from `ids`.
    pub(crate) fn build(
        &self,
        settings: SimSettings,
        mut ids: IdGen,
        fault_rng: IdGen,
    ) -> anyhow::Result<World> {
        self.check()?;
        let created = now_stamp();
        let zone = Zone {
            id: self.zone.id.clone().unwrap_or_else(|| ids.uuid()),
            name: self.zone.name.clone(),
        };
        let offerings: Vec<Offering> = self
            .offering_specs()
            .into_iter()
            .map(|s| Offering {
                id: s.id.unwrap_or_else(|| ids.uuid()),
                name: s.name,
                cpu: s.cpu,
                speed: s.speed,
                memory: s.memory,
                customized: s.customized,
                created: created.clone(),
            })
            .collect();
        let owner = Owner {
            account: "admin".into(),
            account_id: ids.uuid(),
            user_id: ids.uuid(),
            username: "admin".into(),
            domain: "ROOT".into(),
            domain_id: ids.uuid(),
        };
        let template_id = ids.uuid();
        let mut keys = IdGen::new(rand::random());
        let accounts: Vec<Account> = self
            .accounts
            .iter()
            .map(|a| Account {
                id: ids.uuid(),
                user_id: ids.uuid(),
                username: a.name.clone(),
                role: a
                    .role
                    .as_deref()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or_default(),
                api_key: a.api_key.clone().unwrap_or_else(|| keys.key()),
                secret_key: a.secret_key.clone().unwrap_or_else(|| keys.key()),
                name: a.name.clone(),
            })
            .collect();
        let account_id = |name: &str| {
            accounts
                .iter()
                .find(|a| a.name == name)
                .map_or(owner.account_id.clone(), |a| a.id.clone())
        };
        let projects: Vec<ProjectEntry> = self
            .projects
            .iter()
            .map(|p| ProjectEntry {
                id: p
                    .id
                    .as_ref()
                    .map(|id| id.to_ascii_lowercase())
                    .unwrap_or_else(|| ids.uuid()),
                name: p.name.clone(),
                members: p.members.iter().map(|m| account_id(m)).collect(),
            })
            .collect();
        let owners: Vec<ClusterOwner> = self
            .clusters
            .iter()
            .map(|c| match (&c.account, &c.project) {
                (Some(a), _) if a != KEY_ACCOUNT => ClusterOwner::Account(account_id(a)),
                (_, Some(p)) => self
                    .projects
                    .iter()
                    .zip(&projects)
                    .find(|(s, _)| {
                        &s.name == p || s.id.as_ref().is_some_and(|id| id.eq_ignore_ascii_case(p))
                    })
                    .map_or(ClusterOwner::Key, |(_, e)| {
                        ClusterOwner::Project(e.id.clone())
                    }),
                _ => ClusterOwner::Key,
            })
            .collect();
        let mut world = World {
            settings,
            zones: vec![zone.clone()],
            hypervisor: self.hypervisor.clone(),
            offerings,
            clusters: Vec::new(),
            jobs: Default::default(),
            job_order: Vec::new(),
            removed_vms: Default::default(),
            owner,
            accounts,
            projects,
            pending_vm_jobs: Default::default(),
            template_id,
            requests: Vec::new(),
            provisioning: Default::default(),
            interference: Vec::new(),
            ids,
            fault_rng,
        };
        for (spec, owner) in self.clusters.iter().zip(owners) {
            add_cluster(&mut world, spec, &zone.id, owner)?;
        }
        Ok(world)
    }
}

fn resolve_offering(world: &World, key: &Option<String>) -> Option<String> {
    let key = key.as_ref()?;
    world
        .offerings
        .iter()
        .find(|o| &o.name == key || &o.id == key)
        .map(|o| o.id.clone())
}

fn add_cluster(
    world: &mut World,
    spec: &ClusterSpec,
    zone_id: &str,
    owner: ClusterOwner,
) -> anyhow::Result<()> {
    let offering_id = resolve_offering(world, &spec.offering)
        .or_else(|| world.offerings.first().map(|o| o.id.clone()))
        .context("the scenario defines no service offering")?;
    let id = spec.id.clone().unwrap_or_else(|| world.ids.uuid());
    let cluster = Cluster {
        prefix: name_prefix(&spec.name, &id),
        id,
        name: spec.name.clone(),
        description: spec
            .description
            .clone()
            .unwrap_or_else(|| spec.name.clone()),
        state: ClusterState::Running,
        zone_id: zone_id.to_string(),
        offering_id,
        control_offering_id: resolve_offering(world, &spec.control_offering),
        worker_offering_id: resolve_offering(world, &spec.worker_offering),
        etcd_offering_id: resolve_offering(world, &spec.etcd_offering),
        control_count: 0,
        etcd_count: 0,
        size: 0,
        min_size: spec.min_size,
        max_size: spec.max_size,
        autoscaling: spec.autoscaling,
        externally_managed: spec.externally_managed,
        network: spec.network,
        cores: 0,
        memory: 0,
        version_id: world.ids.uuid(),
        version_name: spec.kubernetes_version.clone(),
        template_id: world.template_id.clone(),
        network_id: world.ids.uuid(),
        network_name: format!("{}-network", spec.name),
        ip: format!("192.0.2.{}", world.clusters.len() % 250 + 10),
        ip_id: world.ids.uuid(),
        created: now_stamp(),
        vms: Vec::new(),
        owner,
        next_ip: 0,
        next_etcd_index: 0,
    };
    world.clusters.push(cluster);
    let ci = world.clusters.len() - 1;
    let layout = [
        (VmRole::Control, spec.control.states()),
        (VmRole::Etcd, spec.etcd.states()),
        (VmRole::Worker, spec.workers.states()),
        (VmRole::External, spec.external.states()),
    ];
    for (role, states) in &layout {
        for state in states {
            let vm_id = world.new_vm(ci, *role, *state, 0);
            if spec.nodes_registered
                && let Some(vm) = world.clusters[ci].vm_mut(&vm_id)
                && role.is_kubernetes_node()
                && *state == VmState::Running
            {
                // Up and joined before the simulator started.
                vm.running_since_ms = Some(0);
                vm.node_registered_ms = Some(0);
            }
        }
    }
    let (mut cores, mut memory) = (0, 0);
    for vm in &world.clusters[ci].vms {
        if let Some(o) = world.offering(&vm.offering_id) {
            cores += o.cpu;
            memory += o.memory;
        }
    }
    let c = &mut world.clusters[ci];
    c.control_count = layout[0].1.len() as u64;
    c.etcd_count = layout[1].1.len() as u64;
    c.size = spec
        .size
        .unwrap_or((layout[2].1.len() + layout[3].1.len()) as u64);
    c.cores = cores;
    c.memory = memory;
    c.state = spec
        .state
        .unwrap_or(if c.vms.iter().all(|v| v.state == VmState::Running) {
            ClusterState::Running
        } else {
            ClusterState::Alert
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_and_toml_describe_the_same_cluster() {
        let yaml = "clusters:\n  - name: web\n    workers: [Running, Stopped]\n    min_size: 1\n    max_size: 5\n";
        let toml = "[[clusters]]\nname = \"web\"\nworkers = [\"Running\", \"Stopped\"]\nmin_size = 1\nmax_size = 5\n";
        let a = Scenario::from_yaml(yaml).unwrap();
        let b = Scenario::from_toml(toml).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a.clusters[0].workers,
            NodesSpec::States(vec![VmState::Running, VmState::Stopped])
        );
    }

    #[test]
    fn bad_scenarios_are_named() {
        let e = Scenario::from_yaml("clusters:\n  - name: a\n    offering: nope\n").unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        let e = Scenario::from_yaml("clusters:\n  - name: a\n    colour: red\n").unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn accounts_and_projects_must_resolve() {
        for (yaml, named) in [
            ("clusters:\n  - name: a\n    account: bob\n", "bob"),
            ("clusters:\n  - name: a\n    project: p\n", "p"),
            ("projects:\n  - name: p\n    members: [carol]\n", "carol"),
            ("accounts:\n  - name: admin\n", "admin"),
            ("accounts:\n  - name: a\n    role: boss\n", "boss"),
            ("projects:\n  - name: p\n    id: p-1\n", "p-1"),
        ] {
            let e = Scenario::from_yaml(yaml).unwrap_err();
            assert!(e.to_string().contains(named), "{yaml}: {e}");
        }
        let both = "accounts:\n  - name: bob\nprojects:\n  - name: p\nclusters:\n  - name: a\n    account: bob\n    project: p\n";
        assert!(Scenario::from_yaml(both).is_err());
        let fine = "accounts:\n  - { name: bob, role: list-only }\nprojects:\n  - { name: p, members: [admin, bob] }\nclusters:\n  - { name: a, account: bob }\n  - { name: b, project: p }\n  - { name: c, account: admin }\n";
        let w = Scenario::from_yaml(fine)
            .unwrap()
            .build(SimSettings::default(), IdGen::new(1), IdGen::new(2))
            .unwrap();
        let bob = &w.accounts[0];
        assert_eq!((bob.name.as_str(), bob.role), ("bob", KeyRole::ListOnly));
        assert!(!bob.api_key.is_empty() && !bob.secret_key.is_empty());
        assert_eq!(
            w.projects[0].members,
            [w.owner.account_id.clone(), bob.id.clone()]
        );
        assert_eq!(w.clusters[0].owner, ClusterOwner::Account(bob.id.clone()));
        assert_eq!(
            w.clusters[1].owner,
            ClusterOwner::Project(w.projects[0].id.clone())
        );
        assert_eq!(w.clusters[2].owner, ClusterOwner::Key);
    }

    #[test]
    fn absurd_sizes_are_refused() {
        let e =
            Scenario::from_yaml("clusters:\n  - name: a\n    workers: 99999999999\n").unwrap_err();
        assert!(e.to_string().contains("at most 100000"), "{e}");
        let e = Scenario::from_yaml("clusters:\n  - name: a\n    control: 0\n").unwrap_err();
        assert!(e.to_string().contains("at least one control node"), "{e}");
    }

    #[test]
    fn demo_world() {
        let w = Scenario::demo()
            .build(SimSettings::default(), IdGen::new(1), IdGen::new(2))
            .unwrap();
        let c = &w.clusters[0];
        assert_eq!((c.control_count, c.size, c.vms.len()), (1, 3, 4));
        assert_eq!(c.state, ClusterState::Running);
        assert!(c.vms[0].name.starts_with("demo-control-"));
        assert!(c.vms[1].name.starts_with("demo-node-"));
        assert_eq!((c.cores, c.memory), (8, 16384));
    }
}
