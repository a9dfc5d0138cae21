//! The RPCs the externalgrpc client makes that [`ExternalGrpcClient`](super::client) does not
//! wrap: `NodeGroupGetOptions`, `GPULabel`, `GetAvailableGPUTypes`, `Cleanup`, and
//! `NodeGroupNodes` on a handle of its own for background tasks. Each runs on a clone of the
//! generated client, under the call deadline, and returns what the timeline records; the
//! caches the real client keeps for them live in [`ClientExtras`].
//!
//! What the client does with each answer follows `cloudprovider/externalgrpc/`
//! `externalgrpc_cloud_provider.go` and `externalgrpc_node_group.go` at
//! cluster-autoscaler-1.33.0 and 1.35.0.

use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;

use super::client::{Timed, invoke, with_deadline};
use super::config::AutoscalerConfig;
use super::timeline::{Reply, Request, RpcError};
use crate::pb;
use crate::pb::cloud_provider_client::CloudProviderClient;

/// One finished RPC as the timeline records it.
pub(crate) type Finished = (Request, Instant, Timed<Reply>);

fn map<T>(timed: Timed<T>, f: impl FnOnce(T) -> Reply) -> Timed<Reply> {
    Timed {
        outcome: timed.outcome.map(f),
        latency: timed.latency,
    }
}

/// The upstream flag defaults of the two utilization thresholds (`--scale-down-utilization-
/// threshold`, `--scale-down-gpu-utilization-threshold`, 0.5), which the client sends as
/// `defaults`; the mock does not model utilization otherwise.
const UTILIZATION_THRESHOLD: f64 = 0.5;

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// `NodeGroupGetOptions` with the autoscaler's flags as `defaults`, as
/// `externalgrpc_node_group.go` `GetOptions` sends them (1.35: the Duration fields 8–10).
pub(crate) async fn get_options_call(
    mut grpc: CloudProviderClient<Channel>,
    deadline: Duration,
    id: &str,
    config: &AutoscalerConfig,
) -> Finished {
    let defaults = pb::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: UTILIZATION_THRESHOLD,
        scale_down_gpu_utilization_threshold: UTILIZATION_THRESHOLD,
        zero_or_max_node_scaling: false,
        ignore_daemon_sets_utilization: false,
        scale_down_unneeded_duration: Some(proto_duration(config.scale_down_unneeded_time)),
        scale_down_unready_duration: Some(proto_duration(config.scale_down_unready_time)),
        max_node_provision_duration: Some(proto_duration(config.max_node_provision_time)),
        ..Default::default()
    };
    let started = Instant::now();
    let request = with_deadline(
        pb::NodeGroupAutoscalingOptionsRequest {
            id: id.to_owned(),
            defaults: Some(defaults),
        },
        deadline,
    );
    let timed = invoke(deadline, grpc.node_group_get_options(request)).await;
    (
        Request::NodeGroupGetOptions { id: id.to_owned() },
        started,
        map(timed, |r| Reply::Options(r.node_group_autoscaling_options)),
    )
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

    /// What the core makes of a `NodeGroupGetOptions` outcome: `Unimplemented`
    /// (`ErrNotImplemented`) and an answer with no options message (`nil, nil`) mean the flags;
    /// options as answered, an unset Duration being 0 (1.35's client); the max node startup
    /// time 0 whenever options came, the protocol having no field for it (upstream #10245);
    /// any other error stays an error for the caller to handle as its call site does.
    pub(crate) fn resolve(
        config: &AutoscalerConfig,
        outcome: &Result<Reply, RpcError>,
    ) -> Result<Self, RpcError> {
        let dur = |d: Option<&prost_types::Duration>| {
            d.map_or(Duration::ZERO, |d| {
                if d.seconds < 0 || d.nanos < 0 {
                    Duration::ZERO
                } else {
                    Duration::new(d.seconds.unsigned_abs(), d.nanos.unsigned_abs())
                }
            })
        };
        match outcome {
            Ok(Reply::Options(Some(o))) => Ok(Self {
                scale_down_unneeded_time: dur(o.scale_down_unneeded_duration.as_ref()),
                scale_down_unready_time: dur(o.scale_down_unready_duration.as_ref()),
                max_node_provision_time: dur(o.max_node_provision_duration.as_ref()),
                max_node_startup_time: Duration::ZERO,
                from_provider: true,
            }),
            Ok(_) => Ok(Self::defaults(config)),
            Err(e) if e.code == tonic::Code::Unimplemented => Ok(Self::defaults(config)),
            Err(e) => Err(e.clone()),
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
