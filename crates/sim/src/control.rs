//! The simulator's own commands (`sim…`: nodes, settings, recorded requests, VM and node
//! states), which a test or an operator sends to steer the simulated CloudStack; CloudStack's
//! commands are `api`'s.

use serde_json::json;

use super::api::{Cmd, Params, unknown_command};
use super::jobs;
use super::model::{RecordedRequest, VmState, World};
use super::reply::Reply;

/// Answers a simulator-only command.
pub fn dispatch_sim(w: &mut World, name: &str, p: &Params, now_ms: u64) -> (Reply, bool) {
    let cmd = Cmd {
        lower: name.to_ascii_lowercase(),
        p,
    };
    w.refresh_nodes(now_ms);
    let mut settings_changed = false;
    let reply = match name {
        "simListNodes" => match cmd.entity("clusterid", |v| w.cluster(v).is_some()) {
            Err(r) => r,
            Ok(id) => {
                let nodes = w.nodes(id.as_deref(), now_ms);
                cmd.ok(json!({ "count": nodes.len(), "node": nodes }))
            }
        },
        "simConfigure" => {
            let mut next = w.settings.clone();
            let mut error = None;
            // `projectid` first, so that a `projectname` in the same call names that project.
            let mut pairs: Vec<&(String, String)> = p.pairs.iter().collect();
            pairs.sort_by_key(|(k, _)| !k.eq_ignore_ascii_case("projectid"));
            for (k, v) in pairs {
                let key = k.to_ascii_lowercase();
                if key == "command" || key == "response" {
                    continue;
                }
                match next.apply(&key, v) {
                    Ok(true) => {}
                    Ok(false) => {
                        error = Some(format!(
                            "unknown simConfigure parameter {k:?}; known: latencyms, commandlatency, errorrate, droprate, malformedrate, lateerrorrate, jobdurationms, jobfailure, alertscaling, sizedefaultoffering, sizejobreturnsearly, kubeletdelayms, scannerintervalms, vmopms, readypollms, scaletimeoutms, maxclustersize, pickupdelayms, removalpernodems, faildrains, keyrole, projectid, projectname, defaultpagesize, throttling, throttlingmax, throttlingintervalms"
                        ));
                        break;
                    }
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            match error {
                Some(e) => Reply::error(&cmd.response(), 431, 9999, &e),
                None => {
                    settings_changed = next != w.settings;
                    w.settings = next;
                    cmd.ok(w.settings.to_json())
                }
            }
        }
        "simRequests" => {
            let filter = p.get("cmd");
            let list: Vec<&RecordedRequest> = w
                .requests
                .iter()
                .filter(|r| filter.is_none_or(|f| r.command.eq_ignore_ascii_case(f)))
                .collect();
            cmd.ok(json!({ "count": list.len(), "request": list }))
        }
        // Every job, ended ones included, in creation order: what a test counts jobs by, since
        // `listAsyncJobs` lists only running ones, as a real 4.21 does.
        "simJobs" => {
            let jobs: Vec<_> = w
                .job_order
                .iter()
                .filter_map(|id| w.jobs.get(id))
                .map(|j| super::render::job(w, j))
                .collect();
            cmd.ok(json!({ "count": jobs.len(), "asyncjobs": jobs }))
        }
        "simResetRequests" => {
            let n = w.requests.len();
            w.requests.clear();
            cmd.ok(json!({ "count": n }))
        }
        "simSetVmState" => {
            let r = (|| {
                let id = cmd
                    .entity("id", |v| w.find_vm(v).is_some())?
                    .ok_or_else(|| cmd.missing("id"))?;
                let state_text = cmd.required("state")?;
                let state: VmState = state_text
                    .parse()
                    .map_err(|_| cmd.invalid("state", state_text))?;
                w.set_vm_state(&id, state, now_ms);
                Ok::<_, Reply>(cmd.ok(jobs::vm_json(w, &id)))
            })();
            r.unwrap_or_else(|e| e)
        }
        "simSetNode" => {
            let r = (|| {
                let id = cmd
                    .entity("id", |v| w.find_vm(v).is_some())?
                    .ok_or_else(|| cmd.missing("id"))?;
                if let Some(ready) = cmd.p.get("ready") {
                    let ready = crate::config::parse_switch(ready)
                        .map_err(|_| cmd.invalid("ready", ready))?;
                    w.set_node_ready(&id, ready);
                }
                if cmd.boolean("remove") == Some(true) {
                    w.remove_node(&id);
                }
                if cmd.boolean("uncordon") == Some(true) {
                    w.uncordon_node(&id);
                }
                let node = w.nodes(None, now_ms).into_iter().find(|n| n.vmid == id);
                Ok::<_, Reply>(cmd.ok(json!({ "node": node })))
            })();
            r.unwrap_or_else(|e| e)
        }
        _ => unknown_command(name),
    };
    (reply, settings_changed)
}
