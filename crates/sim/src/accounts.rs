//! Accounts and projects: the key's own account (`World::owner`, its role
//! `SimSettings::key_role`), the scenario's other accounts, each with its own keys and role,
//! the scenario's projects and their members, and the owner of each cluster (an account or a
//! project; its VMs are the cluster's owner's). Who may see and change what is `access`.
//!
//! The rules `access` follows, as CloudStack 4.21 answered them (`shared/cloudstack-4.21/recorded/`, named
//! below) and, where no recording shows them, as apache/cloudstack's source reads:
//! - Lists (`listKubernetesClusters`, `listVirtualMachines`) are scoped by
//!   `AccountManagerImpl.buildACLSearchParameters` ([`ListScope`]): a User account sees its own
//!   resources only, `listall` or not (errors_15, errors_16, errors_19, errors_20: another
//!   account's cluster or VM, by id or not, is an empty list, not an error); a project's
//!   resources only with `projectid` (errors_21…23, project_03…07); a root admin its own
//!   without `listall`, every account's with it or by `id`.
//! - A command on one entity checks the caller's access to its owner
//!   (`World::can_operate`, `AccountManagerImpl.checkAccess`): the owner's account, a member
//!   of the owning project, or a root admin. Where that check runs decides the answer: a scale
//!   request's in its job (200, then the job fails 530; errors_17), a VM stop's at the call
//!   (531, cserrorcode 4365; errors_18).
//! - A `projectid` naming a project the caller is not a member of is refused before the
//!   command runs (`ProjectRoleBasedApiAccessChecker`: 432 under `errorresponse`; errors_25).

use super::config::KeyRole;

/// The account of the simulator's own key (`SimConfig::api_key`), and the domain every account
/// is in: every resource the scenario gives no other owner belongs to it.
#[derive(Debug, Clone)]
pub struct Owner {
    pub account: String,
    pub account_id: String,
    pub user_id: String,
    pub username: String,
    pub domain: String,
    pub domain_id: String,
}

/// An account of the simulated CloudStack besides the key's own: one user, its keys, its role.
#[derive(Debug, Clone)]
pub struct Account {
    pub name: String,
    pub id: String,
    pub user_id: String,
    pub username: String,
    pub role: KeyRole,
    pub api_key: String,
    pub secret_key: String,
}

/// The user (and account) a request's key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub account: String,
    pub account_id: String,
    pub user_id: String,
    pub username: String,
    pub role: KeyRole,
}

impl Caller {
    pub fn is_root_admin(&self) -> bool {
        self.role.is_root_admin()
    }
}

/// A project the scenario declares, and the ids of its member accounts.
#[derive(Debug, Clone)]
pub struct ProjectEntry {
    pub id: String,
    pub name: String,
    pub members: Vec<String>,
}

/// Who a cluster (and its VMs) belongs to, as the scenario says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ClusterOwner {
    /// The key's own account, or the project of `SimSettings::project` while one is set.
    #[default]
    Key,
    /// The account with this id.
    Account(String),
    /// The scenario's project with this id.
    Project(String),
}

/// A cluster's owner as its answers name it, with the user they show as `userid`/`username`
/// (for a project's resources, the key's own user: the one the scenario takes to have
/// created them, as `admin` created `cksp` in project_01 and project_06 shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership<'a> {
    Account {
        name: &'a str,
        id: &'a str,
        user_id: &'a str,
        username: &'a str,
    },
    Project {
        id: &'a str,
        name: &'a str,
        user_id: &'a str,
        username: &'a str,
    },
}

impl<'a> Ownership<'a> {
    pub fn user(&self) -> (&'a str, &'a str) {
        match *self {
            Self::Account {
                user_id, username, ..
            }
            | Self::Project {
                user_id, username, ..
            } => (user_id, username),
        }
    }
}

/// What a list call's `projectid` asks for (`ParamProcessWorker` has already refused a value
/// naming no project).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectParam {
    Absent,
    /// `-1`: the projects' resources (`ListProjectResourcesOnly`).
    AllProjects,
    /// One project, by its id.
    One(String),
}

/// The scope of a list call, as `buildACLSearchParameters` reads it from the call.
#[derive(Debug, Clone)]
pub struct ListScope {
    pub project: ProjectParam,
    /// An `id` was given (not `ids`: `searchForUserVMIdsAndCount` passes `cmd.getId()`).
    pub by_id: bool,
    pub listall: bool,
}
