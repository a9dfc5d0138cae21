//! The RPCs the externalgrpc client makes that [`ExternalGrpcClient`](super::client) does not
//! wrap: `GPULabel`, `GetAvailableGPUTypes`, `Cleanup`, and `NodeGroupNodes` on a handle of
//! its own for background tasks. Each runs on a clone of the generated client, under the call
//! deadline, and returns what the timeline records; the caches the real client keeps for them
//! live in [`ClientExtras`]. `NodeGroupGetOptions` is the client's
//! (`client::get_options_call`, in the fields of the wire generation spoken); what the core
//! makes of its answer is [`GroupOptions`].
//!
//! What the client does with each answer follows `cloudprovider/externalgrpc/`
//! `externalgrpc_cloud_provider.go` and `externalgrpc_node_group.go` at
//! cluster-autoscaler-1.33.0 and 1.35.0.

use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;

use super::client::{OptionsFailure, Timed, invoke, with_deadline};
use super::config::AutoscalerConfig;
use super::timeline::{Reply, Request};
use super::wire::OptionsAnswer;
use crate::pb;
use cks_proto::cloud_provider_client::CloudProviderClient;

/// One finished RPC as the timeline records it.
pub(crate) type Finished = (Request, Instant, Timed<Reply>);

fn map<T>(timed: Timed<T>, f: impl FnOnce(T) -> Reply) -> Timed<Reply> {
    Timed {
        outcome: timed.outcome.map(f),
        latency: timed.latency,
    }
}

/// `NodeGroupNodes` on its own handle, for tasks that outlive a loop.
pub(crate) async fn nodes_call(
    mut grpc: CloudProviderClient<Channel>,
    deadline: Duration,
    id: &str,
) -> Finished {
    let started = Instant::now();
    let request = with_deadline(pb::NodeGroupNodesRequest { id: id.to_owned() }, deadline);
    let timed = invoke(deadline, grpc.node_group_nodes(request)).await;
    (
        Request::NodeGroupNodes { id: id.to_owned() },
        started,
        map(timed, |r| Reply::Instances(r.instances)),
    )
}

/// `GPULabel`.
pub(crate) async fn gpu_label_call(
    mut grpc: CloudProviderClient<Channel>,
    deadline: Duration,
) -> Finished {
    let started = Instant::now();
    let request = with_deadline(pb::GpuLabelRequest {}, deadline);
    let timed = invoke(deadline, grpc.gpu_label(request)).await;
    (
        Request::GpuLabel,
        started,
        map(timed, |r| Reply::GpuLabel(r.label)),
    )
}

/// `GetAvailableGPUTypes`.
pub(crate) async fn gpu_types_call(
    mut grpc: CloudProviderClient<Channel>,
    deadline: Duration,
) -> Finished {
    let started = Instant::now();
    let request = with_deadline(pb::GetAvailableGpuTypesRequest {}, deadline);
    let timed = invoke(deadline, grpc.get_available_gpu_types(request)).await;
    (
        Request::GetAvailableGpuTypes,
        started,
        map(timed, |r| {
            let mut types: Vec<String> = r.gpu_types.into_keys().collect();
            types.sort();
            Reply::GpuTypes(types)
        }),
    )
}

/// `Cleanup`.
pub(crate) async fn cleanup_call(
    mut grpc: CloudProviderClient<Channel>,
    deadline: Duration,
) -> Finished {
    let started = Instant::now();
    let request = with_deadline(pb::CleanupRequest {}, deadline);
    let timed = invoke(deadline, grpc.cleanup(request)).await;
    (Request::Cleanup, started, map(timed, |_| Reply::Empty))
}

/// The per-group options the core uses, after the client and
/// `processors/nodegroupconfig/node_group_config_processor.go` (`DelegatingNodeGroupConfigProcessor`)
/// resolved them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupOptions {
    pub(crate) scale_down_unneeded_time: Duration,
    pub(crate) scale_down_unready_time: Duration,
    pub(crate) max_node_provision_time: Duration,
    pub(crate) max_node_startup_time: Duration,
    /// An answer carried options (then every unset field is 0).
    pub(crate) from_provider: bool,
}

impl GroupOptions {
    /// The autoscaler's flags: what `Unimplemented` or an answer without options gives.
    pub(crate) fn defaults(config: &AutoscalerConfig) -> Self {
        Self {
            scale_down_unneeded_time: config.scale_down_unneeded_time,
            scale_down_unready_time: config.scale_down_unready_time,
            max_node_provision_time: config.max_node_provision_time,
            max_node_startup_time: config.max_node_startup_time,
            from_provider: false,
        }
    }

    /// What the core makes of what the client's `NodeGroup.GetOptions` gave
    /// (`DelegatingNodeGroupConfigProcessor`): no options (`ErrNotImplemented`, or `nil, nil`)
    /// mean the flags; options as the release read them (fields it does not read are 0); the
    /// max node startup time 0 whenever options came, the protocol having no field for it
    /// (upstream #10245); a failure stays one for the caller to handle as its call site does.
    pub(crate) fn resolve(
        config: &AutoscalerConfig,
        answer: Result<OptionsAnswer, OptionsFailure>,
    ) -> Result<Self, OptionsFailure> {
        match answer? {
            OptionsAnswer::Options(o) => Ok(Self {
                scale_down_unneeded_time: o.scale_down_unneeded_time,
                scale_down_unready_time: o.scale_down_unready_time,
                max_node_provision_time: o.max_node_provision_time,
                max_node_startup_time: Duration::ZERO,
                from_provider: true,
            }),
            OptionsAnswer::Flags => Ok(Self::defaults(config)),
        }
    }
}

/// The answers the real client caches for the life of the process, and only after a success
/// (`externalgrpc_cloud_provider.go` `GPULabel`, `GetAvailableGPUTypes`): a failure is retried
/// at every use.
#[derive(Debug, Default, Clone)]
pub(crate) struct ClientExtras {
    pub(crate) gpu_label: Option<String>,
    pub(crate) gpu_types: Option<Vec<String>>,
}
