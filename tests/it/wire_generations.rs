//! The provider against clients generated from each upstream wire generation.
//!
//! `tests/protos/<generation>/externalgrpc.proto` is the externalgrpc contract as the
//! cluster-autoscaler releases named in its header speak it; build.rs generates a client from
//! each (with Kubernetes' messages as `k8s_pb`'s types, so field 1 of the template answer is
//! decoded as a real `v1.Node`). Each test starts a simulator and a provider on loopback and
//! asks what those releases ask, in the fields they use:
//!
//! | generation | releases | template | option durations |
//! |---|---|---|---|
//! | v1_28 | 1.28.x | field 1 | 3, 4 |
//! | v1_29 | 1.29.0 to 1.32.x | field 1 | 3, 4, 5 |
//! | v1_33 | 1.33.0 to 1.34.1 | field 1 | 3, 4, 5 (and bools 6, 7) |
//! | v1_34_2 | 1.34.2 to 1.34.x | fields 1 and 2 | 3-5 and 8-10 |
//! | v1_35 | 1.35.0 onward | field 2 | 8-10 |

use std::sync::Arc;

use cks_autoscaler_provider::optional_rpcs::ProviderExtras;
use cks_autoscaler_provider::options::parse_overrides_spec;
use cks_testkit::{Stack, sim_config};
use k8s_pb::api::core::v1::{Node, Pod};
use k8s_pb::apimachinery::pkg::apis::meta::v1::{Duration as MetaDuration, ObjectMeta, Time};
use prost::Message;
use tonic::Code;

macro_rules! generation {
    ($name:ident) => {
        #[allow(clippy::all, clippy::pedantic, dead_code, missing_docs)]
        mod $name {
            include!(concat!(
                env!("OUT_DIR"),
                "/wire-generations/",
                stringify!($name),
                "/clusterautoscaler.cloudprovider.v1.externalgrpc.rs"
            ));
        }
    };
}

generation!(v1_28);
generation!(v1_29);
generation!(v1_33);
generation!(v1_34_2);
generation!(v1_35);

/// A client of generation `$g` connected to the stack's provider.
macro_rules! client {
    ($g:ident, $stack:expr) => {
        $g::cloud_provider_client::CloudProviderClient::connect(format!("http://{}", $stack.addr))
            .await
            .expect("connect to the provider")
    };
}

const SECOND: i64 = 1_000_000_000;

fn meta(secs: i64) -> Option<MetaDuration> {
    Some(MetaDuration {
        duration: Some(secs * SECOND),
    })
}

fn google(secs: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: secs,
        nanos: 0,
    })
}

/// The demo cluster (workers on `cks-medium`, 2 vCPU / 4 GiB) with a provider serving template
/// nodes and, when `overrides` is given, NodeGroupGetOptions overrides for it.
async fn stack(overrides: Option<&str>) -> Stack {
    let mut extras = ProviderExtras::default();
    if let Some(spec) = overrides {
        let (cluster, o) = parse_overrides_spec(spec).expect("override spec");
        extras.overrides.insert(cluster, o);
    }
    let mut stack = Stack::start_with_extras(sim_config(), "demo", |_| {}, Arc::new(extras)).await;
    stack.refresh().await.expect("first Refresh");
    stack
}

/// What the template node must say for the demo cluster's worker offering.
fn assert_worker_node(node: &Node, generation: &str) {
    let labels = &node.metadata.as_ref().expect("metadata").labels;
    assert_eq!(
        labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("cks-medium"),
        "{generation}: {labels:?}"
    );
    let status = node.status.as_ref().expect("status");
    assert_eq!(
        status.capacity.get("cpu").and_then(|q| q.string.as_deref()),
        Some("2"),
        "{generation}"
    );
    for resource in ["cpu", "memory", "pods"] {
        assert!(
            status.allocatable.contains_key(resource),
            "{generation}: allocatable lacks {resource}: {:?}",
            status.allocatable
        );
    }
}

/// Every generation gets the template node from the field its release reads, decoded as a
/// `v1.Node`, and the same Node whichever field it reads.
#[tokio::test(start_paused = true)]
async fn every_generation_gets_the_template_node_from_the_field_it_reads() {
    let stack = stack(None).await;
    let id = stack.cluster_id.clone();

    // Up to 1.34.1: field 1, a v1.Node message.
    let mut from_field_1 = Vec::new();
    macro_rules! field_1_only {
        ($g:ident) => {{
            let mut c = client!($g, stack);
            let groups = c
                .node_groups($g::NodeGroupsRequest {})
                .await
                .expect("NodeGroups")
                .into_inner()
                .node_groups;
            assert_eq!(groups.len(), 1, stringify!($g));
            let r = c
                .node_group_template_node_info($g::NodeGroupTemplateNodeInfoRequest {
                    id: id.clone(),
                })
                .await
                .expect(concat!(stringify!($g), ": NodeGroupTemplateNodeInfo"))
                .into_inner();
            let node = r.node_info.expect(concat!(
                stringify!($g),
                ": field 1 (nodeInfo) is unset: this release would get no template"
            ));
            assert_worker_node(&node, stringify!($g));
            from_field_1.push(node);
        }};
    }
    field_1_only!(v1_28);
    field_1_only!(v1_29);
    field_1_only!(v1_33);

    // 1.34.2: nodeBytes when set (else field 1); both must hold the same Node.
    let mut c = client!(v1_34_2, stack);
    let r = c
        .node_group_template_node_info(v1_34_2::NodeGroupTemplateNodeInfoRequest { id: id.clone() })
        .await
        .expect("v1_34_2: NodeGroupTemplateNodeInfo")
        .into_inner();
    let from_bytes = Node::decode(r.node_bytes.as_slice()).expect("v1_34_2: nodeBytes is a Node");
    assert_worker_node(&from_bytes, "v1_34_2");
    assert_eq!(
        r.node_info.as_ref(),
        Some(&from_bytes),
        "fields 1 and 2 agree"
    );

    // From 1.35: nodeBytes only.
    let mut c = client!(v1_35, stack);
    let r = c
        .node_group_template_node_info(v1_35::NodeGroupTemplateNodeInfoRequest { id: id.clone() })
        .await
        .expect("v1_35: NodeGroupTemplateNodeInfo")
        .into_inner();
    let latest = Node::decode(r.node_bytes.as_slice()).expect("v1_35: nodeBytes is a Node");
    assert_worker_node(&latest, "v1_35");

    for node in from_field_1 {
        assert_eq!(node, latest, "every release sees the same template node");
    }
    assert_eq!(from_bytes, latest);
    stack.shutdown().await;
}

/// With an override configured (scale-down-unneeded 5m), each generation sends its defaults
/// in the fields its release sends and finds, in the fields it reads, the override and every
/// other default echoed.
#[tokio::test(start_paused = true)]
async fn every_generation_gets_its_defaults_back_with_the_override_in_the_fields_it_reads() {
    let stack = stack(Some("demo:scale-down-unneeded=5m")).await;
    let id = stack.cluster_id.clone();
    // Defaults as the autoscalers send them (flags: unneeded 10m, unready 17m, provision 25m).
    let (unneeded, unready, provision, overridden) = (600, 17 * 60, 25 * 60, 300);

    // 1.29 to 1.32: thresholds and meta.v1.Duration fields 3, 4, 5.
    let mut c = client!(v1_29, stack);
    let o = c
        .node_group_get_options(v1_29::NodeGroupAutoscalingOptionsRequest {
            id: id.clone(),
            defaults: Some(v1_29::NodeGroupAutoscalingOptions {
                scale_down_utilization_threshold: 0.45,
                scale_down_gpu_utilization_threshold: 0.35,
                scale_down_unneeded_time: meta(unneeded),
                scale_down_unready_time: meta(unready),
                max_node_provision_time: meta(provision),
            }),
        })
        .await
        .expect("v1_29: NodeGroupGetOptions")
        .into_inner()
        .node_group_autoscaling_options
        .expect("v1_29: options");
    assert_eq!(
        o,
        v1_29::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: 0.45,
            scale_down_gpu_utilization_threshold: 0.35,
            scale_down_unneeded_time: meta(overridden),
            scale_down_unready_time: meta(unready),
            max_node_provision_time: meta(provision),
        }
    );

    // 1.33 to 1.34.1: the same plus the booleans 6 and 7.
    let mut c = client!(v1_33, stack);
    let o = c
        .node_group_get_options(v1_33::NodeGroupAutoscalingOptionsRequest {
            id: id.clone(),
            defaults: Some(v1_33::NodeGroupAutoscalingOptions {
                scale_down_utilization_threshold: 0.45,
                scale_down_gpu_utilization_threshold: 0.35,
                scale_down_unneeded_time: meta(unneeded),
                scale_down_unready_time: meta(unready),
                max_node_provision_time: meta(provision),
                zero_or_max_node_scaling: true,
                ignore_daemon_sets_utilization: true,
            }),
        })
        .await
        .expect("v1_33: NodeGroupGetOptions")
        .into_inner()
        .node_group_autoscaling_options
        .expect("v1_33: options");
    assert_eq!(
        o,
        v1_33::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: 0.45,
            scale_down_gpu_utilization_threshold: 0.35,
            scale_down_unneeded_time: meta(overridden),
            scale_down_unready_time: meta(unready),
            max_node_provision_time: meta(provision),
            zero_or_max_node_scaling: true,
            ignore_daemon_sets_utilization: true,
        }
    );

    // 1.34.2: both sets sent, both answered.
    let mut c = client!(v1_34_2, stack);
    let o = c
        .node_group_get_options(v1_34_2::NodeGroupAutoscalingOptionsRequest {
            id: id.clone(),
            defaults: Some(v1_34_2::NodeGroupAutoscalingOptions {
                scale_down_utilization_threshold: 0.45,
                scale_down_gpu_utilization_threshold: 0.35,
                scale_down_unneeded_time: meta(unneeded),
                scale_down_unready_time: meta(unready),
                max_node_provision_time: meta(provision),
                zero_or_max_node_scaling: true,
                ignore_daemon_sets_utilization: false,
                scale_down_unneeded_duration: google(unneeded),
                scale_down_unready_duration: google(unready),
                max_node_provision_duration: google(provision),
            }),
        })
        .await
        .expect("v1_34_2: NodeGroupGetOptions")
        .into_inner()
        .node_group_autoscaling_options
        .expect("v1_34_2: options");
    assert_eq!(
        o,
        v1_34_2::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: 0.45,
            scale_down_gpu_utilization_threshold: 0.35,
            scale_down_unneeded_time: meta(overridden),
            scale_down_unready_time: meta(unready),
            max_node_provision_time: meta(provision),
            zero_or_max_node_scaling: true,
            ignore_daemon_sets_utilization: false,
            scale_down_unneeded_duration: google(overridden),
            scale_down_unready_duration: google(unready),
            max_node_provision_duration: google(provision),
        }
    );

    // 1.35: google.protobuf.Duration fields 8-10 only.
    let mut c = client!(v1_35, stack);
    let o = c
        .node_group_get_options(v1_35::NodeGroupAutoscalingOptionsRequest {
            id: id.clone(),
            defaults: Some(v1_35::NodeGroupAutoscalingOptions {
                scale_down_utilization_threshold: 0.45,
                scale_down_gpu_utilization_threshold: 0.35,
                zero_or_max_node_scaling: false,
                ignore_daemon_sets_utilization: true,
                scale_down_unneeded_duration: google(unneeded),
                scale_down_unready_duration: google(unready),
                max_node_provision_duration: google(provision),
            }),
        })
        .await
        .expect("v1_35: NodeGroupGetOptions")
        .into_inner()
        .node_group_autoscaling_options
        .expect("v1_35: options");
    assert_eq!(
        o,
        v1_35::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: 0.45,
            scale_down_gpu_utilization_threshold: 0.35,
            zero_or_max_node_scaling: false,
            ignore_daemon_sets_utilization: true,
            scale_down_unneeded_duration: google(overridden),
            scale_down_unready_duration: google(unready),
            max_node_provision_duration: google(provision),
        }
    );
    stack.shutdown().await;
}

/// Releases up to 1.34.1 read `pbOpts.GetScaleDownUnneededTime().Duration` (and 4, 5) with no
/// nil check: every options answer they get must carry fields 3, 4 and 5, whichever fields the
/// request came with (a 1.35-shaped request included) and whatever is overridden.
#[tokio::test(start_paused = true)]
async fn releases_up_to_1_34_1_find_fields_3_to_5_in_every_options_answer() {
    let stack = stack(Some(
        "demo:max-node-provision=25m,scale-down-utilization-threshold=0.6",
    ))
    .await;
    let id = stack.cluster_id.clone();
    // Requests as each generation shapes them, and one with no defaults at all; every answer
    // decoded as 1.33 decodes it.
    let requests: Vec<(&str, Vec<u8>)> = vec![
        (
            "v1_29 request",
            v1_29::NodeGroupAutoscalingOptionsRequest {
                id: id.clone(),
                defaults: Some(v1_29::NodeGroupAutoscalingOptions {
                    scale_down_unneeded_time: meta(600),
                    scale_down_unready_time: meta(1200),
                    max_node_provision_time: meta(900),
                    ..Default::default()
                }),
            }
            .encode_to_vec(),
        ),
        (
            "v1_35 request",
            v1_35::NodeGroupAutoscalingOptionsRequest {
                id: id.clone(),
                defaults: Some(v1_35::NodeGroupAutoscalingOptions {
                    scale_down_unneeded_duration: google(600),
                    scale_down_unready_duration: google(1200),
                    max_node_provision_duration: google(900),
                    ..Default::default()
                }),
            }
            .encode_to_vec(),
        ),
        (
            "request without defaults",
            v1_35::NodeGroupAutoscalingOptionsRequest {
                id: id.clone(),
                defaults: None,
            }
            .encode_to_vec(),
        ),
    ];
    let mut c = client!(v1_33, stack);
    for (what, bytes) in requests {
        // The same bytes on the wire, sent through the 1.33 client.
        let request = v1_33::NodeGroupAutoscalingOptionsRequest::decode(bytes.as_slice())
            .expect("request shapes share field numbers");
        let o = c
            .node_group_get_options(request)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .into_inner()
            .node_group_autoscaling_options
            .unwrap_or_else(|| panic!("{what}: no options"));
        for (field, value) in [
            ("scaleDownUnneededTime (3)", o.scale_down_unneeded_time),
            ("scaleDownUnreadyTime (4)", o.scale_down_unready_time),
            ("MaxNodeProvisionTime (5)", o.max_node_provision_time),
        ] {
            let nanos = value
                .and_then(|d| d.duration)
                .unwrap_or_else(|| panic!("{what}: {field} missing: 1.33 would crash"));
            assert!(nanos > 0, "{what}: {field} is {nanos} ns");
        }
        assert_eq!(o.max_node_provision_time, meta(25 * 60), "{what}");
        assert_eq!(o.scale_down_utilization_threshold, 0.6, "{what}");
    }
    stack.shutdown().await;
}

/// 1.28's client reads no MaxNodeProvisionTime and takes Unimplemented for an error: it gets
/// an answer without options (it then applies its own flags), overrides or not. From 1.29, no
/// overrides means Unimplemented, which those clients take for "use the flags".
#[tokio::test(start_paused = true)]
async fn release_1_28_gets_no_options_and_later_ones_unimplemented_without_overrides() {
    for overrides in [None, Some("demo:scale-down-unneeded=5m")] {
        let stack = stack(overrides).await;
        let id = stack.cluster_id.clone();
        let mut c = client!(v1_28, stack);
        let answer = c
            .node_group_get_options(v1_28::NodeGroupAutoscalingOptionsRequest {
                id: id.clone(),
                defaults: Some(v1_28::NodeGroupAutoscalingOptions {
                    scale_down_utilization_threshold: 0.5,
                    scale_down_gpu_utilization_threshold: 0.5,
                    scale_down_unneeded_time: meta(600),
                    scale_down_unready_time: meta(1200),
                }),
            })
            .await
            .unwrap_or_else(|e| panic!("1.28 takes any error for a failure: {e}"))
            .into_inner();
        assert_eq!(answer.node_group_autoscaling_options, None, "{overrides:?}");
        if overrides.is_none() {
            let mut c = client!(v1_29, stack);
            let e = c
                .node_group_get_options(v1_29::NodeGroupAutoscalingOptionsRequest {
                    id: id.clone(),
                    defaults: Some(v1_29::NodeGroupAutoscalingOptions {
                        scale_down_unneeded_time: meta(600),
                        scale_down_unready_time: meta(1200),
                        max_node_provision_time: meta(900),
                        ..Default::default()
                    }),
                })
                .await
                .expect_err("no overrides");
            assert_eq!(e.code(), Code::Unimplemented);
        }
        stack.shutdown().await;
    }
}

/// Pricing requests of every shape decode (unknown fields are skipped) and are answered
/// Unimplemented, which every release understands for pricing.
#[tokio::test(start_paused = true)]
async fn pricing_requests_of_every_generation_are_unimplemented() {
    let stack = stack(None).await;
    let time = |seconds| {
        Some(Time {
            seconds: Some(seconds),
            nanos: Some(0),
        })
    };
    let timestamp = |seconds| Some(prost_types::Timestamp { seconds, nanos: 0 });
    let pod = Pod {
        metadata: Some(ObjectMeta {
            name: Some("web-0".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut codes = Vec::new();
    macro_rules! legacy_pricing {
        ($g:ident) => {{
            let mut c = client!($g, stack);
            let node = $g::PricingNodePriceRequest {
                node: Some($g::ExternalGrpcNode {
                    provider_id: "external-cloudstack://x".into(),
                    name: "x".into(),
                    ..Default::default()
                }),
                start_time: time(1_700_000_000),
                end_time: time(1_700_003_600),
            };
            codes.push((
                stringify!($g),
                c.pricing_node_price(node)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.code()),
            ));
            let pod = $g::PricingPodPriceRequest {
                pod: Some(pod.clone()),
                start_time: time(1_700_000_000),
                end_time: time(1_700_003_600),
            };
            codes.push((
                stringify!($g),
                c.pricing_pod_price(pod)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.code()),
            ));
        }};
    }
    legacy_pricing!(v1_28);
    legacy_pricing!(v1_29);
    legacy_pricing!(v1_33);

    let mut c = client!(v1_34_2, stack);
    let r = c
        .pricing_pod_price(v1_34_2::PricingPodPriceRequest {
            pod: Some(pod.clone()),
            start_time: time(1_700_000_000),
            end_time: time(1_700_003_600),
            pod_bytes: pod.encode_to_vec(),
            start_timestamp: timestamp(1_700_000_000),
            end_timestamp: timestamp(1_700_003_600),
        })
        .await;
    codes.push(("v1_34_2", r.map(|_| ()).map_err(|e| e.code())));
    let mut c = client!(v1_35, stack);
    let r = c
        .pricing_node_price(v1_35::PricingNodePriceRequest {
            node: None,
            start_timestamp: timestamp(1_700_000_000),
            end_timestamp: timestamp(1_700_003_600),
        })
        .await;
    codes.push(("v1_35", r.map(|_| ()).map_err(|e| e.code())));

    assert_eq!(codes.len(), 8);
    for (generation, code) in codes {
        assert_eq!(code, Err(Code::Unimplemented), "{generation}");
    }
    stack.shutdown().await;
}
