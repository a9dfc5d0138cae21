//! Who may see and change what (the rules are listed in `accounts`): the caller a key names,
//! the owner of a cluster, the access checks of a command on one entity, the scope of a list,
//! the project role check, and the answers CloudStack gives when one of them refuses.

use serde_json::json;

use super::accounts::{Caller, ClusterOwner, ListScope, Ownership, ProjectParam};
use super::model::{Cluster, World};
use super::reply::Reply;

impl World {
    /// The key's own account, calling with its current role.
    pub fn key_caller(&self) -> Caller {
        Caller {
            account: self.owner.account.clone(),
            account_id: self.owner.account_id.clone(),
            user_id: self.owner.user_id.clone(),
            username: self.owner.username.clone(),
            role: self.settings.key_role,
        }
    }

    /// Another account's caller and secret key, by its API key.
    pub fn account_by_key(&self, api_key: &str) -> Option<(String, Caller)> {
        self.accounts
            .iter()
            .find(|a| super::signing::constant_time_eq(a.api_key.as_bytes(), api_key.as_bytes()))
            .map(|a| {
                (
                    a.secret_key.clone(),
                    Caller {
                        account: a.name.clone(),
                        account_id: a.id.clone(),
                        user_id: a.user_id.clone(),
                        username: a.username.clone(),
                        role: a.role,
                    },
                )
            })
    }

    /// The id and name of the project `id` names (in any case, as CloudStack's database
    /// compares it): one of the scenario's, or `SimSettings::project`, of which the key's own
    /// account is the one member.
    pub fn project_named(&self, id: &str) -> Option<(&str, &str)> {
        let id = id.trim();
        if let Some(p) = &self.settings.project
            && p.id.eq_ignore_ascii_case(id)
        {
            return Some((&p.id, &p.name));
        }
        self.projects
            .iter()
            .find(|p| p.id.eq_ignore_ascii_case(id))
            .map(|p| (p.id.as_str(), p.name.as_str()))
    }

    /// Whether `caller`'s account is a member of project `id`.
    pub fn is_member(&self, caller: &Caller, id: &str) -> bool {
        if let Some(p) = &self.settings.project
            && p.id.eq_ignore_ascii_case(id)
        {
            return caller.account_id == self.owner.account_id;
        }
        self.projects
            .iter()
            .any(|p| p.id.eq_ignore_ascii_case(id) && p.members.contains(&caller.account_id))
    }

    /// Who owns cluster `c`.
    pub fn ownership<'a>(&'a self, c: &'a Cluster) -> Ownership<'a> {
        let key = |o: &'a super::accounts::Owner| Ownership::Account {
            name: &o.account,
            id: &o.account_id,
            user_id: &o.user_id,
            username: &o.username,
        };
        let project = |id: &'a str, name: &'a str| Ownership::Project {
            id,
            name,
            user_id: &self.owner.user_id,
            username: &self.owner.username,
        };
        match &c.owner {
            ClusterOwner::Key => match &self.settings.project {
                Some(p) => project(&p.id, &p.name),
                None => key(&self.owner),
            },
            ClusterOwner::Account(id) => match self.accounts.iter().find(|a| &a.id == id) {
                Some(a) => Ownership::Account {
                    name: &a.name,
                    id: &a.id,
                    user_id: &a.user_id,
                    username: &a.username,
                },
                None => key(&self.owner),
            },
            ClusterOwner::Project(id) => match self.projects.iter().find(|p| &p.id == id) {
                Some(p) => project(&p.id, &p.name),
                None => key(&self.owner),
            },
        }
    }

    /// `AccountManagerImpl.checkAccess` on a resource of `owner`: a root admin, the owner's
    /// account, or a member of the owning project (domain admins are not modelled).
    pub fn can_operate(&self, caller: &Caller, owner: &Ownership<'_>) -> bool {
        caller.is_root_admin()
            || match owner {
                Ownership::Account { id, .. } => *id == caller.account_id,
                Ownership::Project { id, .. } => self.is_member(caller, id),
            }
    }

    /// Whether a list call of `caller` in `scope` shows a resource of `owner`, following
    /// `AccountManagerImpl.buildACLSearchParameters` (and `buildACLViewSearchCriteria`):
    /// - no `projectid`: without an `id`, project resources are skipped
    ///   (`SkipProjectResources`); a User account sees its own account's only (errors_16,
    ///   errors_19, errors_20); a root admin its own without `listall` and `id`, any account's
    ///   with either (and, by `id`, a project's: nothing skips them then);
    /// - `projectid=-1`: project resources only (`ListProjectResourcesOnly`), of the projects
    ///   a User account is a member of, of every project for a root admin (errors_22,
    ///   project_05); with `listall`, the caller's own account's too
    ///   (`ListAllIncludingProjectResources`);
    /// - `projectid=<a project>`: that project's (errors_21, errors_23, project_03,
    ///   project_06); the caller may see it (a non-member was refused before, see
    ///   [`World::project_refusal`]).
    pub fn may_list(&self, caller: &Caller, owner: &Ownership<'_>, scope: &ListScope) -> bool {
        let own = |id: &str| id == caller.account_id;
        let admin = caller.is_root_admin();
        match (&scope.project, owner) {
            (ProjectParam::Absent, Ownership::Account { id, .. }) => {
                own(id) || (admin && (scope.listall || scope.by_id))
            }
            (ProjectParam::Absent, Ownership::Project { .. }) => admin && scope.by_id,
            (ProjectParam::AllProjects, Ownership::Account { id, .. }) => {
                scope.listall && (admin || own(id))
            }
            (ProjectParam::AllProjects, Ownership::Project { id, .. }) => {
                admin || self.is_member(caller, id)
            }
            (ProjectParam::One(p), Ownership::Project { id, .. }) => p.eq_ignore_ascii_case(id),
            (ProjectParam::One(_), Ownership::Account { .. }) => false,
        }
    }

    /// `ProjectRoleBasedApiAccessChecker.checkAccess`, one of `ApiServer`'s access checkers
    /// (run once the key is found, before the signature): a call whose `projectid` names a
    /// project (`ApiServlet.setProjectContext` looks it up by UUID; `-1` or an unknown id
    /// names none and passes) is refused unless the caller is a root admin or a member of it:
    /// `UnavailableCommandException`, HTTP 432 under `errorresponse`, cserrorcode 9999, "The
    /// API [listKubernetesClusters] does not exist or is not available for this account/user
    /// in project [<uuid>]." (errors_25; 4.21 writes the names in brackets, older sources
    /// without). A member's project role is not modelled (every member may call every
    /// command).
    pub fn project_refusal(
        &self,
        caller: &Caller,
        command: &str,
        projectid: Option<&str>,
    ) -> Option<Reply> {
        let (id, _) = self.project_named(projectid?)?;
        if caller.is_root_admin() || self.is_member(caller, id) {
            return None;
        }
        Some(Reply::error(
            "errorresponse",
            432,
            9999,
            &format!(
                "The API [{command}] does not exist or is not available for this account/user in project [{id}]."
            ),
        ))
    }
}

/// The text of 4.21's `PermissionDeniedException` from `checkAccess` on an entity (errors_17's
/// failed job, errors_18's 531).
pub const NO_PERMISSION: &str =
    "Caller does not have permission to operate with provided resource.";

/// 4.21's answer to a command on an entity the caller may not operate, refused at the call
/// (`StopVMCmd`'s `id` is checked for access while the parameters are processed): HTTP 531
/// (`ACCOUNT_ERROR`), cserrorcode 4365 (`PermissionDeniedException`), under
/// `<command>response` (errors_18).
pub fn permission_denied(response_name: &str, text: &str) -> Reply {
    Reply::error(response_name, 531, 4365, text)
}

/// A role's refusal of a command (`DynamicRoleBasedAPIAccessChecker`'s
/// `UnavailableCommandException`): HTTP 432 under `errorresponse`, cserrorcode 9999, as 4.21
/// words it: "The API [stopVirtualMachine] does not exist or is not available for the account
/// for user id [<user uuid>]." (errors_14, errors_13b).
pub fn unavailable_command(name: &str, caller: &Caller) -> Reply {
    Reply::error(
        "errorresponse",
        432,
        9999,
        &format!(
            "The API [{name}] does not exist or is not available for the account for user id [{}].",
            caller.user_id
        ),
    )
}

/// `getApiLimit` (`GetApiLimitCmd`, `ApiRateLimitServiceImpl.searchApiLimit`) once the
/// caller's own call has been counted: `{"apilimit": {accountid, account, apiIssued,
/// apiAllowed, expireAfter}}` (project_10). `window` is the caller's (calls counted, ms left),
/// `None` when it has none (a root admin, never counted): 0 issued, the whole maximum allowed,
/// and `expireAfter` the interval in seconds, as `searchApiLimit` writes it then (its other
/// branch writes milliseconds). With throttling off the command refuses:
/// `ServerApiException(UNSUPPORTED_ACTION_ERROR, "This api is only available when
/// api.throttling.enabled = true.")`, 432 under `errorresponse` (from source; not recorded).
pub fn api_limit(
    caller: &Caller,
    enabled: bool,
    max: u32,
    interval_secs: u64,
    window: Option<(u64, u64)>,
) -> Reply {
    if !enabled {
        return Reply::error(
            "errorresponse",
            432,
            9999,
            "This api is only available when api.throttling.enabled = true.",
        );
    }
    let (issued, expire_after) = window.unwrap_or((0, interval_secs));
    Reply::ok(&json!({
        "getapilimitresponse": {
            "apilimit": {
                "accountid": caller.account_id,
                "account": caller.account,
                "apiIssued": issued,
                "apiAllowed": i64::from(max) - i64::try_from(issued).unwrap_or(i64::MAX),
                "expireAfter": expire_after,
            }
        }
    }))
}
