//! The CloudStack commands and the simulator-only commands: parameter checking (CloudStack's
//! synchronous 431/432 errors), and the answer of each command. Handlers run under the world
//! lock and return what to send plus any job task to start once the lock is released.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use super::access;
use super::accounts::{Caller, ListScope, ProjectParam};
use super::clock::{parse_date, parse_stamp};
use super::config::SimSettings;
use super::ids::is_uuid;
use super::jobs::{self, INTERNAL_ERROR};
use super::model::{JobKind, JobStatus, VmState, World};
use super::render;
use super::reply::Reply;
use super::rules::{ScalePlan, ScaleRequest};

/// The CloudStack commands served (exact, case-sensitive names as CloudStack matches them).
pub const COMMANDS: &[&str] = &[
    "listKubernetesClusters",
    "scaleKubernetesCluster",
    "queryAsyncJobResult",
    "listAsyncJobs",
    "listVirtualMachines",
    "startVirtualMachine",
    "stopVirtualMachine",
    "listServiceOfferings",
    "listZones",
    "listCapabilities",
    "getApiLimit",
];

/// The simulator-only commands (no signature, no faults, not recorded).
pub const SIM_COMMANDS: &[&str] = &[
    "simListNodes",
    "simConfigure",
    "simRequests",
    "simJobs",
    "simResetRequests",
    "simSetVmState",
    "simSetNode",
];

/// A job task to start after the lock is released.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // built once per job, moved straight into a task
pub enum Spawn {
    /// Boxed: plan and settings make this variant much larger than the other.
    Scale {
        job_id: String,
        cluster_id: String,
        plan: Box<ScalePlan>,
        settings: Box<SimSettings>,
    },
    VmOp {
        job_id: String,
        vm_id: String,
        start: bool,
        duration: Duration,
    },
    /// A queued scale job a worker picks up after `delay` (`SimSettings::pickup_delay`).
    Pickup {
        job_id: String,
        request: Box<ScaleRequest>,
        delay: Duration,
    },
}

/// The request's parameters, first value of each name kept, as CloudStack does.
#[derive(Debug, Clone, Default)]
pub struct Params {
    pub pairs: Vec<(String, String)>,
}

impl Params {
    pub fn from_pairs(all: Vec<(String, String)>) -> Self {
        let mut pairs: Vec<(String, String)> = Vec::with_capacity(all.len());
        for (k, v) in all {
            if !pairs.iter().any(|(x, _)| *x == k) {
                pairs.push((k, v));
            }
        }
        Self { pairs }
    }

    /// Case-insensitive lookup; an empty value counts as absent, as CloudStack treats it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// Everything but the secrets, for the request log.
    pub fn recorded(&self) -> BTreeMap<String, String> {
        self.pairs
            .iter()
            .filter(|(k, _)| {
                !k.eq_ignore_ascii_case("apikey")
                    && !k.eq_ignore_ascii_case("signature")
                    && !k.eq_ignore_ascii_case("signatureversion")
                    && !k.eq_ignore_ascii_case("expires")
                    && k != "command"
            })
            .cloned()
            .collect()
    }
}

/// The context of one command: its response name and parameters.
pub(crate) struct Cmd<'a> {
    pub(crate) lower: String,
    pub(crate) p: &'a Params,
}

impl Cmd<'_> {
    pub(crate) fn response(&self) -> String {
        format!("{}response", self.lower)
    }

    pub(crate) fn ok(&self, inner: Value) -> Reply {
        self.ok_with(&inner)
    }

    /// `{"<cmd>response": inner}` serialized straight from `inner`.
    fn ok_with<T: Serialize + ?Sized>(&self, inner: &T) -> Reply {
        let name = self.response();
        let mut outer = BTreeMap::new();
        outer.insert(name.as_str(), inner);
        Reply::ok(&outer)
    }

    /// cserrorcode 9999 on 4.21 (running_20, running_21, errors_06…11): `ApiServer` answers a
    /// parameter error as a `ServerApiException` of its own.
    pub(crate) fn invalid(&self, name: &str, value: &str) -> Reply {
        Reply::error(
            &self.response(),
            431,
            9999,
            &format!(
                "Unable to execute API command {} due to invalid value. Invalid parameter {name} value={value} due to incorrect long value format, or entity does not exist or due to incorrect parameter annotation for the field in api cmd class.",
                self.lower
            ),
        )
    }

    pub(crate) fn missing(&self, name: &str) -> Reply {
        Reply::error(
            &self.response(),
            431,
            9999,
            &format!(
                "Unable to execute API command {} due to missing parameter {name}",
                self.lower
            ),
        )
    }

    pub(crate) fn required(&self, name: &str) -> Result<&str, Reply> {
        self.p.get(name).ok_or_else(|| self.missing(name))
    }

    /// A UUID parameter naming an entity that must exist.
    pub(crate) fn entity(
        &self,
        name: &str,
        exists: impl Fn(&str) -> bool,
    ) -> Result<Option<String>, Reply> {
        match self.p.get(name) {
            None => Ok(None),
            Some(v) if is_uuid(v) && exists(v) => Ok(Some(v.to_string())),
            Some(v) => Err(self.invalid(name, v)),
        }
    }

    fn long(&self, name: &str) -> Result<Option<i64>, Reply> {
        match self.p.get(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<i64>()
                .map(Some)
                .map_err(|_| self.invalid(name, v)),
        }
    }

    /// Java's `Boolean.parseBoolean`: `true` in any case is true, anything else false.
    pub(crate) fn boolean(&self, name: &str) -> Option<bool> {
        self.p.get(name).map(|v| v.eq_ignore_ascii_case("true"))
    }

    fn uuid_list(
        &self,
        name: &str,
        exists: impl Fn(&str) -> bool,
    ) -> Result<Option<Vec<String>>, Reply> {
        let Some(v) = self.p.get(name) else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for id in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !is_uuid(id) || !exists(id) {
                return Err(self.invalid(name, id));
            }
            out.push(id.to_string());
        }
        Ok(Some(out))
    }

    /// `BaseListCmd.validateSpecificParameters` (the dispatch chain's
    /// `SpecificCmdValidationWorker`, before the parameters are processed): `page` and
    /// `pagesize` come together, except `pagesize=-1` (unlimited) alone.
    fn check_paging(&self) -> Result<(), Reply> {
        let size = self.long("pagesize")?;
        let page = self.p.get("page");
        let param_error = |text: &str| Reply::error(&self.response(), 431, 9999, text);
        match (page, size) {
            (None, Some(s)) if s != -1 => Err(param_error(
                "\"page\" parameter is required when \"pagesize\" is specified",
            )),
            (Some(_), None) => Err(param_error(
                "\"pagesize\" parameter is required when \"page\" is specified",
            )),
            _ => Ok(()),
        }
    }

    /// One page of `items`, as `BaseListCmd.getStartIndex`/`getPageSizeVal` cut it, and the
    /// number of items before paging. Without `pagesize` a list holds at most `max_page`
    /// (`default.page.size`); a `pagesize` above it is refused (`BaseListCmd.getPageSize`:
    /// `InvalidParameterValueException`, so 431 with cserrorcode 9999 as every 431 of 4.21,
    /// running_20…23), as is `page` with
    /// `pagesize=-1`. These checks run when the command executes, after its parameters were
    /// processed.
    fn page<T>(&self, items: Vec<T>, max_page: u64) -> Result<(Vec<T>, usize), Reply> {
        let page = self.long("page")?;
        let size = self.long("pagesize")?;
        let invalid_value = |text: String| Reply::error(&self.response(), 431, 9999, &text);
        if let Some(s) = size
            && s > 0
            && s as u64 > max_page
        {
            return Err(invalid_value(format!(
                "Page size can't exceed max allowed page size value: {max_page}"
            )));
        }
        if size == Some(-1) && page.is_some() {
            return Err(invalid_value(
                "Can't specify page parameter when pagesize is -1 (Unlimited)".into(),
            ));
        }
        let total = items.len();
        let limit = match size {
            Some(-1) => return Ok((items, total)),
            Some(s) => u64::try_from(s).unwrap_or(0),
            None => max_page,
        };
        let start = match page {
            Some(p) if p > 0 => (p as u64 - 1).saturating_mul(limit),
            _ => 0,
        };
        let start = usize::try_from(start).unwrap_or(usize::MAX);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        Ok((items.into_iter().skip(start).take(limit).collect(), total))
    }
}

/// `{"<cmd>response": {}}` when nothing matches (errors_15, running_30), `{count}` alone for a
/// page past the end (running_04), `{count, <key>: [...]}` otherwise. `count` is
/// the number of items matched before paging: every list served is built with `searchAndCount`
/// and `ListResponse.setResponses(list, count)` (`KubernetesClusterManagerImpl
/// .listKubernetesClusters` too in current releases; older ones called `setResponses(list)`
/// there and counted only the page).
fn list_reply<T: Serialize>(cmd: &Cmd<'_>, key: &str, items: &[T], count: usize) -> Reply {
    #[derive(Serialize)]
    struct Inner<'a, T> {
        count: usize,
        #[serde(flatten)]
        items: BTreeMap<&'a str, &'a [T]>,
    }
    if count == 0 {
        return cmd.ok(json!({}));
    }
    let mut map = BTreeMap::new();
    if !items.is_empty() {
        map.insert(key, items);
    }
    let mut outer = BTreeMap::new();
    let name = cmd.response();
    outer.insert(name.as_str(), Inner { count, items: map });
    Reply::ok(&outer)
}

/// Answers an authenticated CloudStack command.
pub fn dispatch(
    w: &mut World,
    name: &str,
    p: &Params,
    now_ms: u64,
    version: &str,
    caller: &Caller,
) -> (Reply, Option<Spawn>) {
    let cmd = Cmd {
        lower: name.to_ascii_lowercase(),
        p,
    };
    w.refresh_nodes(now_ms);
    if name.starts_with("list")
        && name != "listCapabilities"
        && let Err(r) = cmd.check_paging()
    {
        return (r, None);
    }
    let result = match name {
        "listKubernetesClusters" => list_clusters(w, &cmd, caller).map(|r| (r, None)),
        "scaleKubernetesCluster" => scale(w, &cmd, caller),
        "queryAsyncJobResult" => query_job(w, &cmd, caller).map(|r| (r, None)),
        "listAsyncJobs" => list_jobs(w, &cmd, caller).map(|r| (r, None)),
        "listVirtualMachines" => list_vms(w, &cmd, caller).map(|r| (r, None)),
        "startVirtualMachine" => vm_op(w, &cmd, true, now_ms, caller),
        "stopVirtualMachine" => vm_op(w, &cmd, false, now_ms, caller),
        "listServiceOfferings" => list_offerings(w, &cmd).map(|r| (r, None)),
        "listZones" => list_zones(w, &cmd).map(|r| (r, None)),
        "listCapabilities" => Ok((capabilities(&cmd, version), None)),
        _ => Ok((unknown_command(name), None)),
    };
    result.unwrap_or_else(|r| (r, None))
}

/// CloudStack 4.21's answer to a command it does not have: the one 401 of every
/// authentication failure, under `errorresponse`, without cserrorcode (errors_12).
pub fn unknown_command(_name: &str) -> Reply {
    Reply::error(
        "errorresponse",
        401,
        0,
        "unable to verify user credentials and/or request signature",
    )
}

/// The scope of a list call (`AccountManagerImpl.buildACLSearchParameters`; what each scope
/// shows: [`World::may_list`]), once its `projectid` is resolved:
/// - absent: [`ProjectParam::Absent`];
/// - `-1`: every project the caller may see (`ListProjectResourcesOnly`;
///   `ParamProcessWorker.translateUuidToInternalId` passes `-1` through untouched; errors_22);
/// - a project's UUID, in any case: that project (errors_21, project_03); a project the caller
///   is not a member of was refused before the command (`World::project_refusal`, errors_25);
/// - another UUID, or anything that is neither a UUID nor a number: refused before the
///   command runs (`translateUuidToInternalId`: no entity with that UUID), 431 with
///   cserrorcode 9999, as every unknown entity id ([`Cmd::invalid`]; errors_24);
/// - a whole number: `projectid` predates 3.x (its `@Parameter` has no `since`), so it is taken
///   as an internal id, and `buildACLSearchParameters` refuses it with
///   `InvalidParameterValueException("Unable to find project by id N")` (431, 9999: no
///   simulated project's internal id is ever exposed, so no number names one).
///
/// Only the list calls are scoped. A command on one entity checks access on that entity's
/// owner (`World::can_operate`): `scaleKubernetesCluster` in its job
/// (`KubernetesClusterManagerImpl.validateKubernetesClusterScaleParameters`:
/// `checkAccess(caller, OperateEntry, false, cluster)`; errors_17), `stopVirtualMachine` at
/// the call (errors_18; `startVirtualMachine` likewise, *unverified*), `queryAsyncJobResult`
/// on the job's submitter (`ApiResponseHelper.queryJobResult`). `listAsyncJobs` takes no
/// `projectid` (`ListAsyncJobsCmd` extends `BaseListAccountResourcesCmd`) and lists the
/// caller's own jobs, which a project's scale jobs are (their submitter is the caller).
fn list_scope(w: &World, cmd: &Cmd<'_>) -> Result<ListScope, Reply> {
    let project = match cmd.p.get("projectid").map(str::trim) {
        None => ProjectParam::Absent,
        Some("-1") => ProjectParam::AllProjects,
        Some(asked) => match w.project_named(asked) {
            Some((id, _)) => ProjectParam::One(id.to_string()),
            None => return Err(no_such_project(cmd, asked)),
        },
    };
    Ok(ListScope {
        project,
        by_id: cmd.p.get("id").is_some(),
        listall: cmd.boolean("listall") == Some(true),
    })
}

/// CloudStack's refusal of a `projectid` naming no project: a number is looked up as an
/// internal id (`buildACLSearchParameters`: "Unable to find project by id"); anything else
/// fails `ParamProcessWorker`'s translation of the UUID.
fn no_such_project(cmd: &Cmd<'_>, asked: &str) -> Reply {
    if asked.parse::<i64>().is_ok() && !is_uuid(asked) {
        return Reply::error(
            &cmd.response(),
            431,
            9999,
            &format!("Unable to find project by id {asked}"),
        );
    }
    cmd.invalid("projectid", asked)
}

fn list_clusters(w: &World, cmd: &Cmd<'_>, caller: &Caller) -> Result<Reply, Reply> {
    let id = cmd.entity("id", |v| w.cluster(v).is_some())?;
    // After the id check: `ParamProcessWorker` resolves `id` before the command runs, whoever
    // owns the cluster; the clusters the caller may not see are then left out of the search
    // (errors_16: another account's cluster by its id is an empty list).
    let scope = list_scope(w, cmd)?;
    let name = cmd.p.get("name");
    let keyword = cmd.p.get("keyword").map(str::to_ascii_lowercase);
    let state = cmd.p.get("state");
    let Some(fallback_zone) = w.zones.first() else {
        return Ok(cmd.ok(json!({})));
    };
    let selected: Vec<_> = w
        .clusters
        .iter()
        .filter(|c| id.as_deref().is_none_or(|i| c.id == i))
        .filter(|c| name.is_none_or(|n| c.name == n))
        .filter(|c| {
            keyword
                .as_deref()
                .is_none_or(|k| c.name.to_ascii_lowercase().contains(k))
        })
        .filter(|c| state.is_none_or(|s| c.state.as_str().eq_ignore_ascii_case(s)))
        .filter(|c| w.may_list(caller, &w.ownership(c), &scope))
        .collect();
    let (page, total) = cmd.page(selected, w.settings.default_page_size)?;
    let views: Vec<_> = page
        .into_iter()
        .map(|c| render::cluster(w, c, fallback_zone))
        .collect();
    Ok(list_reply(cmd, "kubernetescluster", &views, total))
}

fn scale(w: &mut World, cmd: &Cmd<'_>, caller: &Caller) -> Result<(Reply, Option<Spawn>), Reply> {
    let cluster_id = match cmd.entity("id", |v| w.cluster(v).is_some())? {
        Some(id) => id,
        None => return Err(cmd.missing("id")),
    };
    let size = cmd.long("size")?;
    let min_size = cmd.long("minsize")?;
    let max_size = cmd.long("maxsize")?;
    let node_ids = cmd.uuid_list("nodeids", |v| w.vm_known(v))?;
    let service_offering_id = cmd.entity("serviceofferingid", |v| w.offering(v).is_some())?;
    let autoscaling = cmd.boolean("autoscalingenabled");
    let node_offerings = node_offerings(cmd.p);
    let req = ScaleRequest {
        cluster_id: cluster_id.clone(),
        size,
        node_ids,
        service_offering_id,
        node_offerings,
        autoscaling,
        min_size,
        max_size,
    };
    // `ApiServer.queueCommand`: the parameters are processed (the 431s above), the job is
    // queued (`AsyncJobManager.submitAsyncJob`) and its id returned. Everything else runs in
    // the job: `ScaleKubernetesClusterCmd.execute` -> `KubernetesClusterManagerImpl
    // .scaleKubernetesCluster` -> `validateKubernetesClusterScaleParameters`, then
    // `KubernetesClusterScaleWorker.scaleCluster`, whose state transition moves the cluster
    // to Scaling. `ScaleKubernetesClusterCmd` overrides no sync object, so two such jobs on one
    // cluster are queued side by side.
    let job_id = jobs::new_job(w, JobKind::ScaleCluster, &cluster_id, caller);
    let reply = cmd.ok(json!({ "jobid": job_id }));
    let delay = w.settings.pickup_delay;
    if !delay.is_zero() {
        return Ok((
            reply,
            Some(Spawn::Pickup {
                job_id,
                request: Box::new(req),
                delay,
            }),
        ));
    }
    // No pick-up delay: the job is picked up, validated and moved to Scaling before the
    // answer leaves, under the same lock.
    let spawn = jobs::start_scale(w, &job_id, &req).map(|(plan, settings)| Spawn::Scale {
        job_id,
        cluster_id,
        plan: Box::new(plan),
        settings: Box::new(settings),
    });
    Ok((reply, spawn))
}

/// `nodeofferings[i].node` / `nodeofferings[i].offering` pairs, node types upper-cased.
fn node_offerings(p: &Params) -> Vec<(String, Option<String>)> {
    let mut by_index: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
    for (k, v) in &p.pairs {
        let lower = k.to_ascii_lowercase();
        let Some(rest) = lower.strip_prefix("nodeofferings[") else {
            continue;
        };
        let Some((index, field)) = rest.split_once("].") else {
            continue;
        };
        let entry = by_index.entry(index.to_string()).or_default();
        match field {
            "node" => entry.0 = Some(v.to_ascii_uppercase()),
            "offering" => entry.1 = Some(v.clone()).filter(|s| !s.is_empty()),
            _ => {}
        }
    }
    by_index
        .into_values()
        .filter_map(|(node, offering)| node.map(|n| (n, offering)))
        .collect()
}

/// `ApiResponseHelper.queryJobResult`: a User account sees only its own account's jobs; any
/// other is a `PermissionDeniedException` (531, 4365) "Account … is not authorized to see job
/// id=N" (from source; its `Account` rendering and the job's internal number are
/// *unverified*); a root admin sees every job.
fn query_job(w: &World, cmd: &Cmd<'_>, caller: &Caller) -> Result<Reply, Reply> {
    let id = cmd.required("jobid")?;
    let Some(job) = w.jobs.get(id) else {
        return Err(cmd.invalid("jobid", id));
    };
    if !caller.is_root_admin() && job.submitter.account_id != caller.account_id {
        let number = w
            .job_order
            .iter()
            .position(|j| j == id)
            .map_or(0, |n| n + 1);
        return Err(access::permission_denied(
            &cmd.response(),
            &format!(
                "Account {} is not authorized to see job id={number}",
                caller.account
            ),
        ));
    }
    Ok(cmd.ok_with(&render::job(w, job)))
}

/// CloudStack's `listAsyncJobs` (`QueryManagerImpl.searchForAsyncJobs`): every job of the
/// caller's account still running, whichever client or cluster it belongs to (the simulator has
/// one account; `listall` changes nothing for it), ordered by id (oldest first), `keyword`
/// matched against the command class, `startdate` keeping jobs created at or after it, then
/// paged. A real 4.21 marks a job removed once it ends, so an ended job, succeeded or failed,
/// is never listed (`recorded/running_26_listAsyncJobs_while_scaling`: the scale job pending;
/// `recorded/running_30_listAsyncJobs_after`: `{}` once it failed); `queryAsyncJobResult`
/// still answers for it.
/// `ListAsyncJobsCmd.startDate` is a DATE parameter: only its day counts (see
/// [`parse_date`]), so a `startdate` of today keeps every job of today.
fn list_jobs(w: &World, cmd: &Cmd<'_>, caller: &Caller) -> Result<Reply, Reply> {
    // The caller's account's jobs; a root admin's `listall` lists every account's
    // (`BaseListAccountResourcesCmd`, scoped as any list: *unverified* for jobs).
    let every_account = caller.is_root_admin() && cmd.boolean("listall") == Some(true);
    let keyword = cmd.p.get("keyword").map(str::to_ascii_lowercase);
    let since = match cmd.p.get("startdate") {
        None => None,
        Some(v) => Some(parse_date(v).ok_or_else(|| {
            Reply::error(
                &cmd.response(),
                431,
                9999,
                &format!(
                    "Unable to parse date {v} for command {}, please pass dates in the format mentioned in the api documentation",
                    cmd.lower
                ),
            )
        })?),
    };
    let jobs: Vec<render::JobView<'_>> = w
        .job_order
        .iter()
        .filter_map(|id| w.jobs.get(id))
        .filter(|j| j.status == JobStatus::InProgress)
        .filter(|j| every_account || j.submitter.account_id == caller.account_id)
        .filter(|j| {
            keyword
                .as_deref()
                .is_none_or(|k| j.kind.class().to_ascii_lowercase().contains(k))
        })
        .filter(|j| since.is_none_or(|t| parse_stamp(&j.created).is_some_and(|c| c >= t)))
        .map(|j| render::job(w, j))
        .collect();
    let (jobs, total) = cmd.page(jobs, w.settings.default_page_size)?;
    Ok(list_reply(cmd, "asyncjobs", &jobs, total))
}

fn list_vms(w: &World, cmd: &Cmd<'_>, caller: &Caller) -> Result<Reply, Reply> {
    let id = cmd.entity("id", |v| w.vm_known(v))?;
    let ids = cmd.uuid_list("ids", |v| w.vm_known(v))?;
    // `QueryManagerImpl.searchForUserVMIdsAndCount` builds its search with
    // `buildACLSearchParameters` as `listKubernetesClusters` does (errors_19: another
    // account's VM by its id is an empty list; errors_20: so is `listall` of a User account).
    let scope = list_scope(w, cmd)?;
    let state = cmd.p.get("state");
    let name = cmd.p.get("name");
    let keyword = cmd.p.get("keyword").map(str::to_ascii_lowercase);
    let Some(fallback_zone) = w.zones.first() else {
        return Ok(cmd.ok(json!({})));
    };
    let mut views = Vec::new();
    for c in w
        .clusters
        .iter()
        .filter(|c| w.may_list(caller, &w.ownership(c), &scope))
    {
        let zone = w.zone(&c.zone_id).unwrap_or(fallback_zone);
        for vm in &c.vms {
            let wanted = id.as_deref().is_none_or(|i| vm.id == i)
                && ids.as_ref().is_none_or(|l| l.contains(&vm.id))
                && name.is_none_or(|n| vm.name == n)
                && keyword
                    .as_deref()
                    .is_none_or(|k| vm.name.to_ascii_lowercase().contains(k))
                && match state {
                    Some(s) => vm.state.as_str().eq_ignore_ascii_case(s),
                    // Destroyed VMs are hidden unless asked for.
                    None => vm.state != VmState::Destroyed,
                };
            if wanted {
                views.push(render::vm(w, c, zone, vm));
            }
        }
    }
    let (views, total) = cmd.page(views, w.settings.default_page_size)?;
    Ok(list_reply(cmd, "virtualmachine", &views, total))
}

fn vm_op(
    w: &mut World,
    cmd: &Cmd<'_>,
    start: bool,
    now: u64,
    caller: &Caller,
) -> Result<(Reply, Option<Spawn>), Reply> {
    let vm_id = match cmd.entity("id", |v| w.vm_known(v))? {
        Some(id) => id,
        None => return Err(cmd.missing("id")),
    };
    // `StopVMCmd`'s `id` is checked for access while the parameters are processed, so
    // another account's VM is refused at the call, before any job (errors_18).
    if let Some((ci, _)) = w.find_vm(&vm_id)
        && !w.can_operate(caller, &w.ownership(&w.clusters[ci]))
    {
        return Err(access::permission_denied(
            &cmd.response(),
            access::NO_PERMISSION,
        ));
    }
    let kind = if start {
        JobKind::StartVm
    } else {
        JobKind::StopVm
    };
    let job_id = jobs::new_job(w, kind, &vm_id, caller);
    let reply = cmd.ok(json!({ "jobid": job_id }));
    let Some((_, vm)) = w.find_vm(&vm_id) else {
        jobs::fail(
            w,
            &job_id,
            INTERNAL_ERROR,
            &format!("Unable to find VM with ID {vm_id}, it may have been expunged"),
        );
        return Ok((reply, None));
    };
    let (state, vm_name) = (vm.state, vm.name.clone());
    let next = match (start, state) {
        (true, VmState::Running) | (false, VmState::Stopped) => None,
        (true, VmState::Stopped | VmState::Shutdown) => Some(VmState::Starting),
        (false, VmState::Running | VmState::Starting | VmState::Unknown | VmState::Migrating) => {
            Some(VmState::Stopping)
        }
        (_, s) => {
            let verb = if start { "started" } else { "stopped" };
            jobs::fail(
                w,
                &job_id,
                INTERNAL_ERROR,
                &format!("VM {vm_name} is in {s} state and can not be {verb}"),
            );
            return Ok((reply, None));
        }
    };
    match next {
        None => {
            let result = jobs::vm_result(w, &vm_id);
            jobs::succeed(w, &job_id, result);
            Ok((reply, None))
        }
        Some(s) => {
            w.set_vm_state(&vm_id, s, now);
            let duration = w.settings.vm_op_duration;
            Ok((
                reply,
                Some(Spawn::VmOp {
                    job_id,
                    vm_id,
                    start,
                    duration,
                }),
            ))
        }
    }
}

fn list_offerings(w: &World, cmd: &Cmd<'_>) -> Result<Reply, Reply> {
    let id = cmd.entity("id", |v| w.offering(v).is_some())?;
    let name = cmd.p.get("name");
    let keyword = cmd.p.get("keyword").map(str::to_ascii_lowercase);
    let list: Vec<Value> = w
        .offerings
        .iter()
        .filter(|o| id.as_deref().is_none_or(|i| o.id == i))
        .filter(|o| name.is_none_or(|n| o.name == n))
        .filter(|o| {
            keyword
                .as_deref()
                .is_none_or(|k| o.name.to_ascii_lowercase().contains(k))
        })
        .map(render::offering)
        .collect();
    let (list, total) = cmd.page(list, w.settings.default_page_size)?;
    Ok(list_reply(cmd, "serviceoffering", &list, total))
}

fn list_zones(w: &World, cmd: &Cmd<'_>) -> Result<Reply, Reply> {
    let id = cmd.entity("id", |v| w.zone(v).is_some())?;
    let name = cmd.p.get("name");
    let list: Vec<Value> = w
        .zones
        .iter()
        .filter(|z| id.as_deref().is_none_or(|i| z.id == i))
        .filter(|z| name.is_none_or(|n| z.name == n))
        .map(render::zone)
        .collect();
    let (list, total) = cmd.page(list, w.settings.default_page_size)?;
    Ok(list_reply(cmd, "zone", &list, total))
}

fn capabilities(cmd: &Cmd<'_>, version: &str) -> Reply {
    cmd.ok(json!({
        "capability": {
            "cloudstackversion": version,
            "securitygroupsenabled": false,
            "userpublictemplateenabled": true,
            "supportELB": "false",
            "projectinviterequired": false,
            "allowusercreateprojects": true,
            "customdiskofferingminsize": 1,
            "customdiskofferingmaxsize": 1024,
            "regionsecondaryenabled": false,
            "kvmsnapshotenabled": true,
            "allowuserviewdestroyedvm": false,
            "allowuserexpungerecovervm": false,
            "dynamicrolesenabled": true,
            "kubernetesserviceenabled": true,
            "kubernetesclusterexperimentalfeaturesenabled": false,
            "apilimitinterval": 1,
            "apilimitmax": 0,
        }
    }))
}

/// Counts in-progress scale jobs of a cluster.
pub fn running_jobs(w: &World, cluster_id: &str) -> usize {
    w.jobs
        .values()
        .filter(|j| {
            j.kind == JobKind::ScaleCluster
                && j.status == JobStatus::InProgress
                && j.instance_id == cluster_id
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::IdGen;
    use crate::scenario::{ClusterSpec, Scenario};

    fn big_world() -> World {
        let scenario = Scenario::with_cluster(ClusterSpec::new("big", 3, 4997));
        scenario
            .build(SimSettings::default(), IdGen::new(1), IdGen::new(2))
            .unwrap()
    }

    fn params(pairs: &[(&str, &str)]) -> Params {
        Params::from_pairs(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn lists_a_5000_vm_cluster() {
        let mut w = big_world();
        let caller = w.key_caller();
        let (reply, _) = dispatch(
            &mut w,
            "listKubernetesClusters",
            &params(&[]),
            0,
            "4.22.0.0",
            &caller,
        );
        assert_eq!(reply.status, 200);
        let v: Value = serde_json::from_slice(&reply.body).unwrap();
        let vms = v["listkubernetesclustersresponse"]["kubernetescluster"][0]["virtualmachines"]
            .as_array()
            .unwrap();
        assert_eq!(vms.len(), 5000);
    }

    /// Server-side cost of listing a 5,000-VM cluster (lock held, render, serialize), without
    /// HTTP. Run with `cargo test --release --lib sim::api -- --ignored --nocapture`.
    #[test]
    #[ignore = "measurement, run by hand in release mode"]
    fn measure_server_side_listing() {
        let mut w = big_world();
        let caller = w.key_caller();
        for (command, p) in [
            ("listKubernetesClusters", params(&[])),
            ("listVirtualMachines", params(&[("pagesize", "-1")])),
        ] {
            let mut times = Vec::new();
            let mut bytes = 0;
            for _ in 0..100 {
                let t = std::time::Instant::now();
                let (reply, _) = dispatch(&mut w, command, &p, 0, "4.22.0.0", &caller);
                times.push(t.elapsed());
                bytes = reply.body.len();
            }
            times.sort();
            println!(
                "{command}: {bytes} bytes, median {:?}, min {:?}",
                times[50], times[0]
            );
        }
    }
}
