//! The externalgrpc `CloudProvider` service: a thin adapter from protobuf messages to
//! [`Provider`] calls, and the one place where a provider error becomes a gRPC status code
//! ([`status`]). Deadlines come from the request's `grpc-timeout`; the caller ([`caller`])
//! from its verified client certificate, and every call goes through the provider as that
//! caller sees it ([`Provider::seen_by`]): its own node groups only. On the admin address
//! ([`CloudProviderService::admin`]) every call is the read-only admin caller's instead.

use crate::optional_rpcs::ProviderExtras;
use crate::provider::{Caller, Error, InstanceView, NodeGroupView, NodeRef, Provider};
use cks_cloudstack::Class;
use cks_domain::machine::Ask;
use cks_domain::status::{InstanceError, InstanceState};
use cks_proto as pb;
use cks_proto::cloud_provider_server::CloudProvider;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Code, Request, Response, Status};

/// The gRPC status the autoscaler sees for a provider error. The only mapping of errors to
/// codes in the project; the codes are chosen for what the autoscaler does with them:
/// UNAVAILABLE for what a later call may get past (CloudStack slow or unreachable, no snapshot
/// yet), FAILED_PRECONDITION for a refusal an operator must look at, NOT_FOUND for a group or
/// node that is not there, OUT_OF_RANGE past the maximum, UNIMPLEMENTED for optional RPCs that
/// have nothing to give (any other code aborts the autoscaler's loop).
pub fn status(e: &Error) -> Status {
    let code = match e {
        Error::Batch(inner) => return status(inner),
        // The snapshots are missing or old because CloudStack refuses the key, which waiting
        // does not mend: the key's refusal, not an outage.
        Error::NoSnapshot {
            key_refused: true, ..
        }
        | Error::Stale {
            key_refused: true, ..
        } => Code::PermissionDenied,
        // The key may not scale the cluster: the operator's to fix, not a refusal of the
        // request by CloudStack's rules.
        Error::JobRefused {
            key_not_permitted: true,
            ..
        } => Code::PermissionDenied,
        Error::InvalidArgument(_) => Code::InvalidArgument,
        Error::UnknownGroup { .. } | Error::ClusterNotFound { .. } => Code::NotFound,
        Error::ReadOnly => Code::PermissionDenied,
        // The caller is another cluster's autoscaler: its identity's, not the request's, fault.
        Error::ClientInAnotherCluster { .. } => Code::PermissionDenied,
        Error::NoSnapshot { .. }
        | Error::Deadline { .. }
        | Error::AnswerLost { .. }
        | Error::Stale { .. }
        | Error::StoreUnavailable { .. }
        | Error::NotLeader { .. } => Code::Unavailable,
        Error::Scale { source, .. } => match source.ask() {
            Ask::Later => Code::Unavailable,
            Ask::Less => Code::OutOfRange,
            Ask::Existing => Code::NotFound,
            Ask::Operator => Code::FailedPrecondition,
        },
        Error::AmbiguousName { .. }
        | Error::DuplicateCluster { .. }
        | Error::JobRefused { .. }
        | Error::JobFailed { .. } => Code::FailedPrecondition,
        Error::JobCancelled { .. } => Code::Aborted,
        Error::CloudStack(cs) => match cs.class() {
            // A throttled call did nothing (CloudStack refuses it before the command runs):
            // try again later, as for no answer at all; never a refused key or request.
            Class::Unknown | Class::Throttled => Code::Unavailable,
            Class::Unauthorized | Class::NotPermitted => Code::PermissionDenied,
            Class::Refused => Code::FailedPrecondition,
            Class::NotSent => Code::Internal,
        },
        Error::NoTemplate { .. } | Error::NoOptions(_) => Code::Unimplemented,
        Error::Internal(_) => Code::Internal,
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
        if provider.serving() {
            Ok(req)
        } else {
            Err(status(&Error::NotLeader {
                leader: provider.leader(),
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
                )
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
            self.provider.seen_by(&caller).cleanup()?;
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
                .increase_size(&r.id, r.delta, deadline)
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
                .delete_nodes(&r.id, nodes, deadline)
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
                .decrease_target_size(&r.id, r.delta)
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
