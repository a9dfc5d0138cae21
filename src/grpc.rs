//! The externalgrpc `CloudProvider` service: a thin adapter from protobuf messages to
//! [`Provider`] calls. Deadlines come from the request's `grpc-timeout`.

use crate::domain::status::{InstanceError, InstanceState};
use crate::pb;
use crate::pb::cloud_provider_server::CloudProvider;
use crate::provider::ops::NodeRef;
use crate::provider::{InstanceView, NodeGroupView, Provider};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

fn observe<T>(method: &'static str, started: Instant, result: &Result<T, Status>) {
    let code = match result {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    };
    crate::metrics::record_rpc(method, started, &format!("{code:?}"));
    if let Err(s) = result
        && s.code() != tonic::Code::Unimplemented
    {
        tracing::debug!(rpc = method, code = ?s.code(), "{}", s.message());
    }
}

/// The gRPC service.
#[derive(Clone)]
pub struct CloudProviderService {
    provider: Provider,
    extras: std::sync::Arc<dyn Extras>,
}

/// The optional RPCs (template node, options), provided by the modules that own them.
pub trait Extras: Send + Sync + 'static {
    /// NodeGroupTemplateNodeInfo.
    fn template_node_info(
        &self,
        _provider: &Provider,
        _group_id: &str,
    ) -> Result<pb::NodeGroupTemplateNodeInfoResponse, Status> {
        Err(Status::unimplemented(
            "NodeGroupTemplateNodeInfo is not implemented",
        ))
    }
    /// NodeGroupGetOptions.
    fn get_options(
        &self,
        _provider: &Provider,
        _request: &pb::NodeGroupAutoscalingOptionsRequest,
    ) -> Result<pb::NodeGroupAutoscalingOptionsResponse, Status> {
        Err(Status::unimplemented(
            "NodeGroupGetOptions: no per-group overrides configured; the autoscaler's own flags apply",
        ))
    }
}

/// No optional RPCs.
pub struct NoExtras;
impl Extras for NoExtras {}

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
    /// A service over `provider` with the given optional-RPC implementation.
    pub fn new(provider: Provider, extras: std::sync::Arc<dyn Extras>) -> Self {
        CloudProviderService { provider, extras }
    }

    fn deadline<T>(&self, req: &Request<T>) -> Instant {
        let budget = req
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .unwrap_or(self.provider.settings().default_rpc_deadline);
        Instant::now() + budget
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

impl CloudProviderService {
    async fn node_groups_inner(
        &self,
        _request: Request<pb::NodeGroupsRequest>,
    ) -> Result<Response<pb::NodeGroupsResponse>, Status> {
        Ok(Response::new(pb::NodeGroupsResponse {
            node_groups: self
                .provider
                .node_groups()
                .into_iter()
                .map(group_pb)
                .collect(),
        }))
    }

    async fn node_group_for_node_inner(
        &self,
        request: Request<pb::NodeGroupForNodeRequest>,
    ) -> Result<Response<pb::NodeGroupForNodeResponse>, Status> {
        let Some(node) = request.into_inner().node else {
            return Err(Status::invalid_argument(
                "NodeGroupForNode: node is missing",
            ));
        };
        let group = self
            .provider
            .node_group_for_node(
                &node.provider_id,
                &node.name,
                &node.labels,
                &node.annotations,
            )
            .map(group_pb)
            .unwrap_or_default();
        Ok(Response::new(pb::NodeGroupForNodeResponse {
            node_group: Some(group),
        }))
    }

    async fn gpu_label_inner(
        &self,
        _request: Request<pb::GpuLabelRequest>,
    ) -> Result<Response<pb::GpuLabelResponse>, Status> {
        Ok(Response::new(pb::GpuLabelResponse {
            label: self.provider.settings().gpu_label.clone(),
        }))
    }

    async fn get_available_gpu_types_inner(
        &self,
        _request: Request<pb::GetAvailableGpuTypesRequest>,
    ) -> Result<Response<pb::GetAvailableGpuTypesResponse>, Status> {
        let gpu_types = self
            .provider
            .settings()
            .gpu_types
            .iter()
            .map(|t| (t.clone(), prost_types::Any::default()))
            .collect();
        Ok(Response::new(pb::GetAvailableGpuTypesResponse {
            gpu_types,
        }))
    }

    async fn cleanup_inner(
        &self,
        _request: Request<pb::CleanupRequest>,
    ) -> Result<Response<pb::CleanupResponse>, Status> {
        self.provider.cleanup();
        Ok(Response::new(pb::CleanupResponse {}))
    }

    async fn refresh_inner(
        &self,
        request: Request<pb::RefreshRequest>,
    ) -> Result<Response<pb::RefreshResponse>, Status> {
        let deadline = self.deadline(&request);
        self.provider.refresh_within(Some(deadline)).await?;
        Ok(Response::new(pb::RefreshResponse {}))
    }

    async fn node_group_target_size_inner(
        &self,
        request: Request<pb::NodeGroupTargetSizeRequest>,
    ) -> Result<Response<pb::NodeGroupTargetSizeResponse>, Status> {
        let size = self.provider.target_size(&request.get_ref().id)?;
        Ok(Response::new(pb::NodeGroupTargetSizeResponse {
            target_size: i32::try_from(size).unwrap_or(i32::MAX),
        }))
    }

    async fn node_group_increase_size_inner(
        &self,
        request: Request<pb::NodeGroupIncreaseSizeRequest>,
    ) -> Result<Response<pb::NodeGroupIncreaseSizeResponse>, Status> {
        let deadline = self.deadline(&request);
        let r = request.into_inner();
        self.provider
            .increase_size(&r.id, r.delta, deadline)
            .await?;
        Ok(Response::new(pb::NodeGroupIncreaseSizeResponse {}))
    }

    async fn node_group_delete_nodes_inner(
        &self,
        request: Request<pb::NodeGroupDeleteNodesRequest>,
    ) -> Result<Response<pb::NodeGroupDeleteNodesResponse>, Status> {
        let deadline = self.deadline(&request);
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
        self.provider.delete_nodes(&r.id, nodes, deadline).await?;
        Ok(Response::new(pb::NodeGroupDeleteNodesResponse {}))
    }

    async fn node_group_decrease_target_size_inner(
        &self,
        request: Request<pb::NodeGroupDecreaseTargetSizeRequest>,
    ) -> Result<Response<pb::NodeGroupDecreaseTargetSizeResponse>, Status> {
        let deadline = self.deadline(&request);
        let r = request.into_inner();
        self.provider
            .decrease_target_size(&r.id, r.delta, deadline)
            .await?;
        Ok(Response::new(pb::NodeGroupDecreaseTargetSizeResponse {}))
    }

    async fn node_group_nodes_inner(
        &self,
        request: Request<pb::NodeGroupNodesRequest>,
    ) -> Result<Response<pb::NodeGroupNodesResponse>, Status> {
        let instances = self.provider.nodes(&request.get_ref().id)?;
        Ok(Response::new(pb::NodeGroupNodesResponse {
            instances: instances.iter().map(instance_pb).collect(),
        }))
    }

    async fn node_group_template_node_info_inner(
        &self,
        request: Request<pb::NodeGroupTemplateNodeInfoRequest>,
    ) -> Result<Response<pb::NodeGroupTemplateNodeInfoResponse>, Status> {
        let id = &request.get_ref().id;
        self.provider.group(id)?;
        let resp = self.extras.template_node_info(&self.provider, id)?;
        if resp.node_bytes.is_empty() {
            return Err(Status::internal("template node encoded to no bytes"));
        }
        Ok(Response::new(resp))
    }

    async fn node_group_get_options_inner(
        &self,
        request: Request<pb::NodeGroupAutoscalingOptionsRequest>,
    ) -> Result<Response<pb::NodeGroupAutoscalingOptionsResponse>, Status> {
        Ok(Response::new(
            self.extras.get_options(&self.provider, request.get_ref())?,
        ))
    }
}

#[tonic::async_trait]
impl CloudProvider for CloudProviderService {
    async fn node_groups(
        &self,
        request: Request<pb::NodeGroupsRequest>,
    ) -> Result<Response<pb::NodeGroupsResponse>, Status> {
        let started = Instant::now();
        let result = self.node_groups_inner(request).await;
        observe("NodeGroups", started, &result);
        result
    }

    async fn node_group_for_node(
        &self,
        request: Request<pb::NodeGroupForNodeRequest>,
    ) -> Result<Response<pb::NodeGroupForNodeResponse>, Status> {
        let started = Instant::now();
        let result = self.node_group_for_node_inner(request).await;
        observe("NodeGroupForNode", started, &result);
        result
    }

    async fn gpu_label(
        &self,
        request: Request<pb::GpuLabelRequest>,
    ) -> Result<Response<pb::GpuLabelResponse>, Status> {
        let started = Instant::now();
        let result = self.gpu_label_inner(request).await;
        observe("GPULabel", started, &result);
        result
    }

    async fn get_available_gpu_types(
        &self,
        request: Request<pb::GetAvailableGpuTypesRequest>,
    ) -> Result<Response<pb::GetAvailableGpuTypesResponse>, Status> {
        let started = Instant::now();
        let result = self.get_available_gpu_types_inner(request).await;
        observe("GetAvailableGPUTypes", started, &result);
        result
    }

    async fn cleanup(
        &self,
        request: Request<pb::CleanupRequest>,
    ) -> Result<Response<pb::CleanupResponse>, Status> {
        let started = Instant::now();
        let result = self.cleanup_inner(request).await;
        observe("Cleanup", started, &result);
        result
    }

    async fn refresh(
        &self,
        request: Request<pb::RefreshRequest>,
    ) -> Result<Response<pb::RefreshResponse>, Status> {
        let started = Instant::now();
        let result = self.refresh_inner(request).await;
        observe("Refresh", started, &result);
        result
    }

    async fn node_group_target_size(
        &self,
        request: Request<pb::NodeGroupTargetSizeRequest>,
    ) -> Result<Response<pb::NodeGroupTargetSizeResponse>, Status> {
        let started = Instant::now();
        let result = self.node_group_target_size_inner(request).await;
        observe("NodeGroupTargetSize", started, &result);
        result
    }

    async fn node_group_increase_size(
        &self,
        request: Request<pb::NodeGroupIncreaseSizeRequest>,
    ) -> Result<Response<pb::NodeGroupIncreaseSizeResponse>, Status> {
        let started = Instant::now();
        let result = self.node_group_increase_size_inner(request).await;
        observe("NodeGroupIncreaseSize", started, &result);
        result
    }

    async fn node_group_delete_nodes(
        &self,
        request: Request<pb::NodeGroupDeleteNodesRequest>,
    ) -> Result<Response<pb::NodeGroupDeleteNodesResponse>, Status> {
        let started = Instant::now();
        let result = self.node_group_delete_nodes_inner(request).await;
        observe("NodeGroupDeleteNodes", started, &result);
        result
    }

    async fn node_group_decrease_target_size(
        &self,
        request: Request<pb::NodeGroupDecreaseTargetSizeRequest>,
    ) -> Result<Response<pb::NodeGroupDecreaseTargetSizeResponse>, Status> {
        let started = Instant::now();
        let result = self.node_group_decrease_target_size_inner(request).await;
        observe("NodeGroupDecreaseTargetSize", started, &result);
        result
    }

    async fn node_group_nodes(
        &self,
        request: Request<pb::NodeGroupNodesRequest>,
    ) -> Result<Response<pb::NodeGroupNodesResponse>, Status> {
        let started = Instant::now();
        let result = self.node_group_nodes_inner(request).await;
        observe("NodeGroupNodes", started, &result);
        result
    }

    async fn node_group_template_node_info(
        &self,
        request: Request<pb::NodeGroupTemplateNodeInfoRequest>,
    ) -> Result<Response<pb::NodeGroupTemplateNodeInfoResponse>, Status> {
        let started = Instant::now();
        let result = self.node_group_template_node_info_inner(request).await;
        observe("NodeGroupTemplateNodeInfo", started, &result);
        result
    }

    async fn node_group_get_options(
        &self,
        request: Request<pb::NodeGroupAutoscalingOptionsRequest>,
    ) -> Result<Response<pb::NodeGroupAutoscalingOptionsResponse>, Status> {
        let started = Instant::now();
        let result = self.node_group_get_options_inner(request).await;
        observe("NodeGroupGetOptions", started, &result);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::parse_grpc_timeout;
    use std::time::Duration;

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
