//! The externalgrpc `CloudProvider` service: a thin adapter from protobuf messages to
//! [`Provider`] calls, and the one place where a provider error becomes a gRPC status code
//! ([`status`]). Deadlines come from the request's `grpc-timeout`; the caller ([`caller`])
//! from its verified client certificate, and every call goes through the provider as that
//! caller sees it ([`Provider::seen_by`]): its own node groups only. On the admin address
//! ([`CloudProviderService::admin`]) every call is the read-only admin caller's instead.

use crate::optional_rpcs::ProviderExtras;
use crate::provider::{
    Call, Caller, Error, InstanceView, NodeGroupView, NodeRef, Provider, Reason,
};
use cks_domain::status::{InstanceError, InstanceState};
use cks_proto as pb;
use cks_proto::cloud_provider_server::CloudProvider;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Code, Request, Response, Status};

/// The gRPC status the autoscaler sees for a provider error. The only mapping of errors to
/// codes in the project: what the caller can do about the error is the provider's to say
/// ([`Error::reason`]); the code for each [`Reason`] is chosen here, for what the autoscaler
/// does with it: UNAVAILABLE for what a later call may get past, FAILED_PRECONDITION for a
/// refusal an operator must look at, NOT_FOUND for a group or node that is not there,
/// OUT_OF_RANGE past the maximum, UNIMPLEMENTED for optional RPCs that have nothing to give
/// (any other code aborts the autoscaler's loop).
pub fn status(e: &Error) -> Status {
    let code = match e.reason() {
        Reason::Invalid => Code::InvalidArgument,
        Reason::NotFound => Code::NotFound,
        Reason::Later => Code::Unavailable,
        Reason::AskLess => Code::OutOfRange,
        Reason::Operator => Code::FailedPrecondition,
        Reason::Denied => Code::PermissionDenied,
        Reason::Cancelled => Code::Aborted,
        Reason::NothingToGive => Code::Unimplemented,
        Reason::Internal => Code::Internal,
    };
    Status::new(code, bounded(e.to_string()))
}

/// Longest status message sent (bytes). gRPC sends it in a header (`grpc-message`), and
/// clients refuse headers past their limit (8 KiB by default for Go's): a longer message would
/// turn the status into a transport error.
const STATUS_MESSAGE_MAX: usize = 4096;

/// `message`, cut to [`STATUS_MESSAGE_MAX`] bytes (at a character boundary) with a note saying
/// so.
fn bounded(message: String) -> String {
    if message.len() <= STATUS_MESSAGE_MAX {
        return message;
    }
    let mut end = STATUS_MESSAGE_MAX;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… (message cut: {} bytes in all)",
        &message[..end],
        message.len()
    )
}

/// Runs one RPC: maps its error to a status, records the call's metrics, logs failures.
async fn observed<T>(
    method: &'static str,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<Response<T>, Status> {
    let started = std::time::Instant::now();
    let result = call.await.map(Response::new).map_err(|e| status(&e));
    let code = match &result {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    crate::metrics::record_rpc(method, started, &format!("{code:?}"));
    if let Err(s) = &result
        && s.code() != Code::Unimplemented
    {
        tracing::debug!(rpc = method, code = ?s.code(), "{}", s.message());
    }
    result
}

/// The gRPC service.
#[derive(Clone)]
pub struct CloudProviderService {
    provider: Provider,
    extras: Arc<ProviderExtras>,
    /// Serves the admin address: every caller is [`Caller::admin`], whatever it presents.
    admin: bool,
}

/// The gate in front of every RPC: with leader election, a replica that does not serve (a
/// standby, a leader still taking over the ledger or one that lost the lease) answers
/// UNAVAILABLE before anything is read or promised: what it holds is not the leader's, and
/// the autoscaler tries again at its next loop (the Service routes to the leader).
pub fn leader_gate(
    provider: Provider,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req| {
        if provider.health().serving() {
            Ok(req)
        } else {
            Err(status(&Error::NotLeader {
                leader: provider.health().leader(),
            }))
        }
    }
}

/// Who sent `req`: the names its client certificate carries, as the TLS handshake verified it
/// (`tls::certificate_identities`); anonymous without a client certificate (plaintext, or TLS
/// without `--tls-client-ca`).
pub fn caller<T>(req: &Request<T>) -> Caller {
    match req.peer_certs() {
        Some(chain) => match chain.first() {
            Some(leaf) => Caller::with_identities(crate::tls::certificate_identities(leaf)),
            None => Caller::anonymous(),
        },
        None => Caller::anonymous(),
    }
}

/// The response header NodeGroups carries when the caller sees no node group: `unbound` (no
/// group is bound to a name it presented) or `denied` (`--deny-client`). Without it, an empty
/// answer means the caller's groups have no CloudStack snapshot yet. `probe` reads it.
pub const CALLER_GROUPS_HEADER: &str = "cks-caller-groups";

/// The response header (binary, UTF-8) that goes with [`CALLER_GROUPS_HEADER`]: the names the
/// provider read from the caller's verified certificate, one per line (absent: none presented).
pub const CALLER_NAMES_HEADER: &str = "cks-caller-names-bin";

/// Tells a caller that sees no node group why, in NodeGroups' response headers (an autoscaler
/// ignores them; `probe` says it).
fn unbound_caller(headers: &mut tonic::metadata::MetadataMap, caller: &Caller, denied: bool) {
    let why = if denied { "denied" } else { "unbound" };
    headers.insert(
        CALLER_GROUPS_HEADER,
        tonic::metadata::MetadataValue::from_static(why),
    );
    if !caller.identities().is_empty() {
        headers.insert_bin(
            CALLER_NAMES_HEADER,
            tonic::metadata::MetadataValue::from_bytes(caller.identities().join("\n").as_bytes()),
        );
    }
}

/// Parses a `grpc-timeout` header value (`<digits><H|M|S|m|u|n>`).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (num, unit) = v.split_at(v.len() - 1);
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl CloudProviderService {
    /// A service over `provider` answering the optional RPCs from `extras`.
    pub fn new(provider: Provider, extras: Arc<ProviderExtras>) -> Self {
        CloudProviderService {
            provider,
            extras,
            admin: false,
        }
    }

    /// The service on the admin address (`--admin-listen`): every call is the admin caller's,
    /// who sees every group and may change none (the provider refuses its writes).
    pub fn admin(provider: Provider, extras: Arc<ProviderExtras>) -> Self {
        CloudProviderService {
            provider,
            extras,
            admin: true,
        }
    }

    /// Who sent `req` on this service's listener.
    fn caller<T>(&self, req: &Request<T>) -> Caller {
        if self.admin {
            Caller::admin()
        } else {
            caller(req)
        }
    }

    fn deadline<T>(&self, req: &Request<T>) -> tokio::time::Instant {
        let budget = req
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .unwrap_or(self.provider.settings().default_rpc_deadline);
        tokio::time::Instant::now() + budget
    }
}

fn group_pb(v: NodeGroupView) -> pb::NodeGroup {
    pb::NodeGroup {
        id: v.id,
        min_size: i32::try_from(v.min).unwrap_or(i32::MAX),
        max_size: i32::try_from(v.max).unwrap_or(i32::MAX),
        debug: v.debug,
    }
}

fn instance_pb(i: &InstanceView) -> pb::Instance {
    use pb::instance_status::InstanceState as S;
    let state = match i.state {
        InstanceState::Running => S::InstanceRunning,
        InstanceState::Creating => S::InstanceCreating,
        InstanceState::Deleting => S::InstanceDeleting,
    };
    pb::Instance {
        id: i.id.clone(),
        status: Some(pb::InstanceStatus {
            instance_state: state as i32,
            error_info: i.error.clone().map(error_pb),
        }),
    }
}

fn error_pb(e: InstanceError) -> pb::InstanceErrorInfo {
    pb::InstanceErrorInfo {
        error_code: e.code,
        error_message: e.message,
        instance_error_class: e.class as i32,
    }
}

#[tonic::async_trait]
impl CloudProvider for CloudProviderService {
    async fn node_groups(
        &self,
        request: Request<pb::NodeGroupsRequest>,
    ) -> Result<Response<pb::NodeGroupsResponse>, Status> {
        let caller = self.caller(&request);
        let scoped = self.provider.seen_by(&caller);
        let mut response = observed("NodeGroups", async {
            Ok(pb::NodeGroupsResponse {
                node_groups: scoped.node_groups().into_iter().map(group_pb).collect(),
            })
        })
        .await?;
        if !scoped.sees_any() {
            unbound_caller(response.metadata_mut(), &caller, scoped.denied);
        }
        Ok(response)
    }

    async fn node_group_for_node(
        &self,
        request: Request<pb::NodeGroupForNodeRequest>,
    ) -> Result<Response<pb::NodeGroupForNodeResponse>, Status> {
        let caller = self.caller(&request);
        let deadline = self.deadline(&request);
        observed("NodeGroupForNode", async {
            let Some(node) = request.into_inner().node else {
                return Err(Error::InvalidArgument(
                    "NodeGroupForNode: node is missing".into(),
                ));
            };
            let scoped = self.provider.seen_by(&caller);
            scoped.first_snapshots(deadline).await;
            let group = scoped
                .node_group_for_node(
                    &node.provider_id,
                    &node.name,
                    &node.labels,
                    &node.annotations,
                    deadline,
                )
                .await
                .map(group_pb)
                .unwrap_or_default();
            Ok(pb::NodeGroupForNodeResponse {
                node_group: Some(group),
            })
        })
        .await
    }

    async fn gpu_label(
        &self,
        _request: Request<pb::GpuLabelRequest>,
    ) -> Result<Response<pb::GpuLabelResponse>, Status> {
        observed("GPULabel", async {
            Ok(pb::GpuLabelResponse {
                label: self.provider.settings().gpu_label.clone(),
            })
        })
        .await
    }

    async fn get_available_gpu_types(
        &self,
        _request: Request<pb::GetAvailableGpuTypesRequest>,
    ) -> Result<Response<pb::GetAvailableGpuTypesResponse>, Status> {
        observed("GetAvailableGPUTypes", async {
            let gpu_types = self
                .provider
                .settings()
                .gpu_types
                .iter()
                .map(|t| (t.clone(), prost_types::Any::default()))
                .collect();
            Ok(pb::GetAvailableGpuTypesResponse { gpu_types })
        })
        .await
    }

    async fn cleanup(
        &self,
        request: Request<pb::CleanupRequest>,
    ) -> Result<Response<pb::CleanupResponse>, Status> {
        let caller = self.caller(&request);
        observed("Cleanup", async {
            self.provider.seen_by(&caller).cleanup().await?;
            Ok(pb::CleanupResponse {})
        })
        .await
    }

    async fn refresh(
        &self,
        request: Request<pb::RefreshRequest>,
    ) -> Result<Response<pb::RefreshResponse>, Status> {
        let deadline = self.deadline(&request);
        let caller = self.caller(&request);
        observed("Refresh", async {
            self.provider
                .seen_by(&caller)
                .refresh_within(Some(deadline))
                .await?;
            Ok(pb::RefreshResponse {})
        })
        .await
    }

    async fn node_group_target_size(
        &self,
        request: Request<pb::NodeGroupTargetSizeRequest>,
    ) -> Result<Response<pb::NodeGroupTargetSizeResponse>, Status> {
        let caller = self.caller(&request);
        observed("NodeGroupTargetSize", async {
            let size = self
                .provider
                .seen_by(&caller)
                .target_size(&request.get_ref().id)?;
            Ok(pb::NodeGroupTargetSizeResponse {
                target_size: i32::try_from(size).unwrap_or(i32::MAX),
            })
        })
        .await
    }

    async fn node_group_increase_size(
        &self,
        request: Request<pb::NodeGroupIncreaseSizeRequest>,
    ) -> Result<Response<pb::NodeGroupIncreaseSizeResponse>, Status> {
        let deadline = self.deadline(&request);
        let caller = self.caller(&request);
        let r = request.into_inner();
        observed("NodeGroupIncreaseSize", async {
            self.provider
                .seen_by(&caller)
                .scale(
                    &r.id,
                    Call::Increase {
                        delta: r.delta,
                        deadline,
                    },
                )
                .await?;
            Ok(pb::NodeGroupIncreaseSizeResponse {})
        })
        .await
    }

    async fn node_group_delete_nodes(
        &self,
        request: Request<pb::NodeGroupDeleteNodesRequest>,
    ) -> Result<Response<pb::NodeGroupDeleteNodesResponse>, Status> {
        let deadline = self.deadline(&request);
        let caller = self.caller(&request);
        let r = request.into_inner();
        let nodes = r
            .nodes
            .into_iter()
            .map(|n| NodeRef {
                provider_id: n.provider_id,
                name: n.name,
                annotations: n.annotations,
            })
            .collect();
        observed("NodeGroupDeleteNodes", async {
            self.provider
                .seen_by(&caller)
                .scale(&r.id, Call::Delete { nodes, deadline })
                .await?;
            Ok(pb::NodeGroupDeleteNodesResponse {})
        })
        .await
    }

    async fn node_group_decrease_target_size(
        &self,
        request: Request<pb::NodeGroupDecreaseTargetSizeRequest>,
    ) -> Result<Response<pb::NodeGroupDecreaseTargetSizeResponse>, Status> {
        let caller = self.caller(&request);
        let r = request.into_inner();
        observed("NodeGroupDecreaseTargetSize", async {
            self.provider
                .seen_by(&caller)
                .scale(&r.id, Call::Decrease { delta: r.delta })
                .await?;
            Ok(pb::NodeGroupDecreaseTargetSizeResponse {})
        })
        .await
    }

    async fn node_group_nodes(
        &self,
        request: Request<pb::NodeGroupNodesRequest>,
    ) -> Result<Response<pb::NodeGroupNodesResponse>, Status> {
        let caller = self.caller(&request);
        observed("NodeGroupNodes", async {
            let instances = self
                .provider
                .seen_by(&caller)
                .nodes(&request.get_ref().id)?;
            Ok(pb::NodeGroupNodesResponse {
                instances: instances.iter().map(instance_pb).collect(),
            })
        })
        .await
    }

    async fn node_group_template_node_info(
        &self,
        request: Request<pb::NodeGroupTemplateNodeInfoRequest>,
    ) -> Result<Response<pb::NodeGroupTemplateNodeInfoResponse>, Status> {
        let caller = self.caller(&request);
        observed("NodeGroupTemplateNodeInfo", async {
            let id = &request.get_ref().id;
            let scope = self.provider.seen_by(&caller);
            let node_bytes = self.extras.template_node_info(&scope, id)?;
            // The same Node in both fields: releases up to 1.34.1 read field 1 (declared as a
            // v1.Node message upstream, as bytes here: the encoding is the same), releases
            // from 1.34.2 field 2.
            Ok(pb::NodeGroupTemplateNodeInfoResponse {
                node_info: node_bytes.clone(),
                node_bytes,
            })
        })
        .await
    }

    async fn node_group_get_options(
        &self,
        request: Request<pb::NodeGroupAutoscalingOptionsRequest>,
    ) -> Result<Response<pb::NodeGroupAutoscalingOptionsResponse>, Status> {
        let caller = self.caller(&request);
        observed("NodeGroupGetOptions", async {
            // `None` (for a 1.28 autoscaler) is an answer without options: that client then
            // applies its own flags.
            let scope = self.provider.seen_by(&caller);
            let options = self.extras.get_options(&scope, request.get_ref())?;
            Ok(pb::NodeGroupAutoscalingOptionsResponse {
                node_group_autoscaling_options: options,
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::{STATUS_MESSAGE_MAX, bounded, parse_grpc_timeout, status};
    use crate::provider::Error;
    use cks_cloudstack::CsError;
    use std::time::Duration;
    use tonic::Code;

    #[test]
    fn cloudstacks_throttling_is_unavailable_and_says_to_slow_down() {
        let throttled = Error::CloudStack(CsError::Throttled {
            command: "scaleKubernetesCluster".into(),
            detail: "The given user has reached his/her account api limit, please retry after \
                     [412] ms. (errorcode 429, cserrorcode 9999)"
                .into(),
        });
        let s = status(&throttled);
        assert_eq!(s.code(), Code::Unavailable);
        let message = s.message().to_lowercase();
        for said in [
            "throttl",
            "api.throttling",
            "--cloudstack-max-rps",
            "raise the limit",
        ] {
            assert!(message.contains(said), "{said}: {message}");
        }
        assert!(!message.contains("unauthorized"), "{message}");
        assert!(!message.contains("rejected the api key"), "{message}");
    }

    #[test]
    fn a_refused_key_is_permission_denied_and_says_so_wherever_it_surfaces() {
        let refused = || CsError::Unauthorized {
            command: "listKubernetesClusters".into(),
            http_status: 401,
            detail: "unable to verify user credentials and/or request signature \
                         (errorcode 401)"
                .into(),
        };
        let said = Error::CloudStack(refused()).to_string();
        let errors = [
            Error::CloudStack(refused()),
            Error::Stale {
                bound: Duration::from_secs(120),
                failures: vec![format!(
                    "pool: the last snapshot is 130.0s old; last error: {said}"
                )],
                key_refused: true,
            },
            Error::NoSnapshot {
                group: "pool".into(),
                last_error: Some(said.clone()),
                key_refused: true,
            },
            Error::Batch(std::sync::Arc::new(Error::CloudStack(refused()))),
        ];
        for e in &errors {
            assert!(e.is_key_refused(), "{e}");
            let s = status(e);
            assert_eq!(s.code(), Code::PermissionDenied, "{e}");
            for says in [
                "CloudStack refused this provider's API key",
                "without a restart",
            ] {
                assert!(s.message().contains(says), "{says}: {}", s.message());
            }
            assert!(
                !s.message().to_lowercase().contains("unreachable"),
                "{}",
                s.message()
            );
        }
        // Old or missing snapshots for any other reason are an outage: try again later.
        let stale = Error::Stale {
            bound: Duration::from_secs(120),
            failures: vec!["pool: no snapshot yet".into()],
            key_refused: false,
        };
        assert!(!stale.is_key_refused());
        assert_eq!(status(&stale).code(), Code::Unavailable);
    }

    /// One value of each [`Error`] variant (every variant's flags that change its code, every
    /// CloudStack failure, every scale refusal) and the code the autoscaler gets for it. The
    /// codes are what the autoscaler acts on, so none may move unnoticed: the exhaustive
    /// matches below stop the build when a variant is added, and the counts fail the test
    /// until it has a row here.
    #[test]
    fn every_error_keeps_its_code() {
        use cks_cloudstack::{Class, Transport};
        use cks_domain::machine::{Ask, ScaleError};
        use cks_domain::rules::Refusal;
        use std::collections::BTreeSet;
        use std::sync::Arc;

        let group = || "pool".to_string();
        let cs = |e: CsError| Error::CloudStack(e);
        let scale = |source: ScaleError| Error::Scale {
            group: group(),
            source,
        };
        let api = |errorcode: i64| CsError::Api {
            command: "scaleKubernetesCluster".into(),
            http_status: 530,
            errorcode,
            cserrorcode: 9999,
            errortext: "refused".into(),
        };
        let job_refused = |alert_unsupported: bool, key_not_permitted: bool| Error::JobRefused {
            group: group(),
            job: "job-1".into(),
            code: 530,
            text: "refused".into(),
            alert_unsupported,
            key_not_permitted,
        };
        let cases = || -> Vec<(Error, Code)> {
            vec![
                (
                    Error::InvalidArgument("delta".into()),
                    Code::InvalidArgument,
                ),
                (
                    Error::UnknownGroup {
                        id: "x".into(),
                        configured: group(),
                    },
                    Code::NotFound,
                ),
                (
                    Error::NoSnapshot {
                        group: group(),
                        last_error: None,
                        key_refused: false,
                    },
                    Code::Unavailable,
                ),
                (
                    Error::NoSnapshot {
                        group: group(),
                        last_error: Some("refused".into()),
                        key_refused: true,
                    },
                    Code::PermissionDenied,
                ),
                (scale(ScaleError::NoSnapshot), Code::Unavailable),
                (
                    scale(ScaleError::OutOfRange {
                        target: 3,
                        delta: 2,
                        max: 4,
                    }),
                    Code::OutOfRange,
                ),
                (
                    scale(ScaleError::SizeAboveMax {
                        size: 4,
                        delta: 1,
                        max: 4,
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::CordonSuspected {
                        vms: vec!["vm-1".into()],
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::Refused(Refusal::NoChange {
                        cluster: "c".into(),
                        size: 3,
                    })),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::PreviousAnswerLost),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::UnknownNode {
                        node: "n".into(),
                        provider_id: "p".into(),
                    }),
                    Code::NotFound,
                ),
                (
                    scale(ScaleError::NotWorker {
                        node: "n".into(),
                        role: "control",
                        vm: "vm-1".into(),
                        cluster: "c".into(),
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::RegisteredElsewhere {
                        vm: "vm-1".into(),
                        node: "n".into(),
                        provider_id: "p".into(),
                        instance: "i".into(),
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::RecentlyRegistered {
                        vm: "vm-1".into(),
                        instance: "i".into(),
                        node: "n".into(),
                        ago_secs: 10,
                        window_secs: 900,
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::BeingCreated {
                        instance: "i".into(),
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::BelowMin {
                        removed: 1,
                        target: 1,
                        min: 1,
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::DrainWouldFail {
                        vm: "vm-1".into(),
                        vm_id: "id".into(),
                        node: "n".into(),
                        why: "why",
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    scale(ScaleError::CannotDecrease {
                        asked: 2,
                        cancellable: 1,
                        target: 3,
                    }),
                    Code::FailedPrecondition,
                ),
                (
                    Error::ClusterNotFound {
                        cluster: "c".into(),
                        hint: "hint".into(),
                    },
                    Code::NotFound,
                ),
                (
                    Error::DuplicateCluster {
                        name: "c".into(),
                        id: "id".into(),
                        other: "other".into(),
                    },
                    Code::FailedPrecondition,
                ),
                (
                    Error::AmbiguousName {
                        name: "c".into(),
                        count: 2,
                    },
                    Code::FailedPrecondition,
                ),
                (
                    cs(CsError::Unreachable {
                        command: "listKubernetesClusters".into(),
                        detail: "refused".into(),
                        cause: Transport::Refused,
                    }),
                    Code::Unavailable,
                ),
                (cs(api(530)), Code::FailedPrecondition),
                (cs(api(429)), Code::Unavailable),
                (
                    cs(CsError::Unauthorized {
                        command: "listKubernetesClusters".into(),
                        http_status: 401,
                        detail: "refused".into(),
                    }),
                    Code::PermissionDenied,
                ),
                (
                    cs(CsError::NotPermitted {
                        command: "listAsyncJobs".into(),
                        detail: "refused".into(),
                    }),
                    Code::PermissionDenied,
                ),
                (
                    cs(CsError::Throttled {
                        command: "listKubernetesClusters".into(),
                        detail: "limit".into(),
                    }),
                    Code::Unavailable,
                ),
                (
                    cs(CsError::Http {
                        command: "listKubernetesClusters".into(),
                        http_status: 502,
                        snippet: "bad gateway".into(),
                    }),
                    Code::Unavailable,
                ),
                (
                    cs(CsError::Malformed {
                        command: "listKubernetesClusters".into(),
                        detail: "not JSON".into(),
                    }),
                    Code::Unavailable,
                ),
                (cs(CsError::Config("bad URL".into())), Code::Internal),
                (
                    Error::Deadline {
                        group: group(),
                        command: "queryAsyncJobResult",
                    },
                    Code::Unavailable,
                ),
                (
                    Error::AnswerLost {
                        group: group(),
                        detail: "reset".into(),
                    },
                    Code::Unavailable,
                ),
                (job_refused(false, false), Code::FailedPrecondition),
                (job_refused(true, false), Code::FailedPrecondition),
                (job_refused(false, true), Code::PermissionDenied),
                (
                    Error::JobCancelled {
                        group: group(),
                        job: "job-1".into(),
                    },
                    Code::Aborted,
                ),
                (
                    Error::JobFailed {
                        group: group(),
                        job: "job-1".into(),
                        code: 530,
                        text: "drain failed".into(),
                    },
                    Code::FailedPrecondition,
                ),
                (
                    Error::Stale {
                        bound: Duration::from_secs(120),
                        failures: vec![group()],
                        key_refused: false,
                    },
                    Code::Unavailable,
                ),
                (
                    Error::Stale {
                        bound: Duration::from_secs(120),
                        failures: vec![group()],
                        key_refused: true,
                    },
                    Code::PermissionDenied,
                ),
                (
                    Error::StoreUnavailable {
                        store: "state".into(),
                        error: "conflict".into(),
                    },
                    Code::Unavailable,
                ),
                (Error::NotLeader { leader: None }, Code::Unavailable),
                (Error::ReadOnly, Code::PermissionDenied),
                (
                    Error::ClientInAnotherCluster {
                        client: "a".into(),
                        bound: "b".into(),
                        seen: "c".into(),
                    },
                    Code::PermissionDenied,
                ),
                (
                    Error::NoTemplate {
                        group: group(),
                        reason: "none".into(),
                    },
                    Code::Unimplemented,
                ),
                (Error::NoOptions("none".into()), Code::Unimplemented),
                (Error::Internal("bug".into()), Code::Internal),
            ]
        };
        // A merged removal's callers hear its outcome as if it were their own.
        let batched = cases()
            .into_iter()
            .map(|(e, code)| (Error::Batch(Arc::new(e)), code));

        let (mut variants, mut classes, mut asks) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for (e, code) in cases().into_iter().chain(batched) {
            assert_eq!(status(&e).code(), code, "{e:?}");
            variants.insert(variant(&e));
            match &e {
                Error::CloudStack(c) => {
                    classes.insert(class_index(c.class()));
                }
                Error::Scale { source, .. } => {
                    asks.insert(ask_index(source.ask()));
                }
                _ => {}
            }
        }
        assert_eq!(variants.len(), VARIANTS, "{variants:?}");
        assert_eq!(classes.len(), CLASSES, "{classes:?}");
        assert_eq!(asks.len(), ASKS, "{asks:?}");

        /// How many variants [`variant`] names.
        const VARIANTS: usize = 22;
        fn variant(e: &Error) -> &'static str {
            match e {
                Error::InvalidArgument(_) => "InvalidArgument",
                Error::UnknownGroup { .. } => "UnknownGroup",
                Error::NoSnapshot { .. } => "NoSnapshot",
                Error::Scale { .. } => "Scale",
                Error::ClusterNotFound { .. } => "ClusterNotFound",
                Error::DuplicateCluster { .. } => "DuplicateCluster",
                Error::AmbiguousName { .. } => "AmbiguousName",
                Error::CloudStack(_) => "CloudStack",
                Error::Deadline { .. } => "Deadline",
                Error::AnswerLost { .. } => "AnswerLost",
                Error::JobRefused { .. } => "JobRefused",
                Error::JobCancelled { .. } => "JobCancelled",
                Error::JobFailed { .. } => "JobFailed",
                Error::Stale { .. } => "Stale",
                Error::StoreUnavailable { .. } => "StoreUnavailable",
                Error::NotLeader { .. } => "NotLeader",
                Error::ReadOnly => "ReadOnly",
                Error::ClientInAnotherCluster { .. } => "ClientInAnotherCluster",
                Error::NoTemplate { .. } => "NoTemplate",
                Error::NoOptions(_) => "NoOptions",
                Error::Batch(_) => "Batch",
                Error::Internal(_) => "Internal",
            }
        }
        const CLASSES: usize = 6;
        fn class_index(c: Class) -> usize {
            match c {
                Class::Refused => 0,
                Class::Throttled => 1,
                Class::Unauthorized => 2,
                Class::NotPermitted => 3,
                Class::Unknown => 4,
                Class::NotSent => 5,
            }
        }
        const ASKS: usize = 4;
        fn ask_index(a: Ask) -> usize {
            match a {
                Ask::Later => 0,
                Ask::Less => 1,
                Ask::Existing => 2,
                Ask::Operator => 3,
            }
        }
    }

    #[test]
    fn a_long_status_message_is_cut_at_a_character_boundary_and_says_so() {
        let short = "node group \"x\" is not configured".to_string();
        assert_eq!(bounded(short.clone()), short);
        let long = "é".repeat(STATUS_MESSAGE_MAX);
        let cut = bounded(long.clone());
        assert!(cut.len() < STATUS_MESSAGE_MAX + 64, "{}", cut.len());
        assert!(
            cut.ends_with(&format!("(message cut: {} bytes in all)", long.len())),
            "{cut}"
        );
    }

    #[test]
    fn grpc_timeout_header_values() {
        let cases = [
            ("5S", Some(Duration::from_secs(5))),
            ("4999m", Some(Duration::from_millis(4999))),
            ("100u", Some(Duration::from_micros(100))),
            ("2M", Some(Duration::from_secs(120))),
            ("1H", Some(Duration::from_secs(3600))),
            ("7n", Some(Duration::from_nanos(7))),
            ("5", None),
            ("S", None),
            ("5x", None),
            ("-5S", None),
            ("123456789S", None),
        ];
        for (v, want) in cases {
            assert_eq!(parse_grpc_timeout(v), want, "{v}");
        }
    }
}
