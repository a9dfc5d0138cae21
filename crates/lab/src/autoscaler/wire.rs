//! The externalgrpc message shapes of each cluster-autoscaler release the mock can speak
//! ([`WireGeneration`]): which field of NodeGroupTemplateNodeInfo it reads, which fields of
//! NodeGroupGetOptions it sends and reads, and what its client makes of the answer. Pure
//! functions over this crate's messages (`crates/proto/proto/externalgrpc.proto` holds every field any
//! release uses; a generation only ever fills or reads the fields its release has); the client
//! (`client.rs`) sends them.
//!
//! Each behaviour follows upstream
//! `cluster-autoscaler/cloudprovider/externalgrpc/externalgrpc_node_group.go` at the
//! release's tag (cluster-autoscaler-1.28.0, 1.29.0, 1.33.0, 1.34.2, 1.35.0):
//! `NodeGroup.TemplateNodeInfo` and `NodeGroup.GetOptions`.

use std::fmt;
use std::time::Duration;

use crate::pb;

/// The meta.v1.Duration of releases up to 1.34.x (nanoseconds).
type MetaDuration = k8s_pb::apimachinery::pkg::apis::meta::v1::Duration;

/// The externalgrpc message shapes a cluster-autoscaler release speaks (upstream
/// `cloudprovider/externalgrpc/protos/externalgrpc.proto`; `tests/protos/` has each shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WireGeneration {
    /// 1.28.x: template in field 1; options with durations 3 and 4 only; no gRPC code means
    /// "not implemented".
    V1_28,
    /// 1.29.0 to 1.32.x: template in field 1; options durations 3, 4, 5 (no 6, 7).
    V1_29,
    /// 1.33.0 to 1.34.1: template in field 1; options 1 to 7.
    V1_33,
    /// 1.34.2 to 1.34.x: template in field 2, else field 1; sends durations in 3-5 and 8-10,
    /// reads 8-10, each falling back to 3-5.
    V1_34_2,
    /// 1.35.0 onward (1.36 and master too): template in field 2; durations 8-10 only.
    #[default]
    V1_35,
}

/// The per-group options the autoscaler works with (its `config.NodeGroupAutoscalingOptions`,
/// the fields the externalgrpc protocol carries).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeGroupOptions {
    /// `ScaleDownUtilizationThreshold`
    pub scale_down_utilization_threshold: f64,
    /// `ScaleDownGpuUtilizationThreshold`
    pub scale_down_gpu_utilization_threshold: f64,
    /// `ScaleDownUnneededTime`
    pub scale_down_unneeded_time: Duration,
    /// `ScaleDownUnreadyTime`
    pub scale_down_unready_time: Duration,
    /// `MaxNodeProvisionTime`
    pub max_node_provision_time: Duration,
    /// `ZeroOrMaxNodeScaling`
    pub zero_or_max_node_scaling: bool,
    /// `IgnoreDaemonSetsUtilization`
    pub ignore_daemonsets_utilization: bool,
}

/// What `NodeGroup.GetOptions` gives the core.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionsAnswer {
    /// Options built from the answer (fields the release does not read are zero).
    Options(NodeGroupOptions),
    /// The autoscaler's flags apply: the answer held no options (`pbOpts == nil`), or the
    /// provider answered Unimplemented (understood from 1.29).
    Flags,
}

impl WireGeneration {
    /// Every generation, oldest first.
    pub const ALL: [WireGeneration; 5] = [
        WireGeneration::V1_28,
        WireGeneration::V1_29,
        WireGeneration::V1_33,
        WireGeneration::V1_34_2,
        WireGeneration::V1_35,
    ];

    /// The generation of release 1.`minor`.0. Releases before 1.28 are not modelled: they
    /// get 1.28's. 1.34.2 and later 1.34 patches ([`WireGeneration::V1_34_2`]) need
    /// [`Self::of_release`].
    pub fn of_minor(minor: u32) -> WireGeneration {
        match minor {
            0..=28 => WireGeneration::V1_28,
            29..=32 => WireGeneration::V1_29,
            33 | 34 => WireGeneration::V1_33,
            _ => WireGeneration::V1_35,
        }
    }

    /// The generation of a cluster-autoscaler release, `1.33.4` or `v1.33.4` (a minor alone,
    /// `1.34`, means its first patch). Releases before 1.28 are not supported.
    pub fn of_release(release: &str) -> Result<WireGeneration, String> {
        let bad = || format!("{release:?} is not a cluster-autoscaler release such as 1.33.4");
        let version = release.trim().trim_start_matches('v');
        let mut parts = version.split('.').map(str::parse::<u32>);
        let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) else {
            return Err(bad());
        };
        let patch = match parts.next() {
            None => 0,
            Some(Ok(p)) => p,
            Some(Err(_)) => return Err(bad()),
        };
        if parts.next().is_some() || major != 1 {
            return Err(bad());
        }
        Ok(match (minor, patch) {
            (0..=27, _) => return Err(format!("cluster-autoscaler {release} is older than 1.28")),
            (34, 2..) => WireGeneration::V1_34_2,
            _ => WireGeneration::of_minor(minor),
        })
    }

    /// The template node bytes this release takes from an answer (empty: no node).
    /// `NodeGroup.TemplateNodeInfo`: up to 1.34.1 `res.GetNodeInfo()` (field 1, a v1.Node
    /// message, whose encoding is the Node's bytes); 1.34.2 `res.GetNodeBytes()` when set,
    /// else `res.GetNodeInfo()`; from 1.35 `res.GetNodeBytes()` only.
    pub fn template_node(self, response: &pb::NodeGroupTemplateNodeInfoResponse) -> &[u8] {
        match self {
            WireGeneration::V1_28 | WireGeneration::V1_29 | WireGeneration::V1_33 => {
                &response.node_info
            }
            WireGeneration::V1_34_2 if response.node_bytes.is_empty() => &response.node_info,
            WireGeneration::V1_34_2 | WireGeneration::V1_35 => &response.node_bytes,
        }
    }

    /// The template field this release reads, for messages.
    pub fn template_field(self) -> &'static str {
        match self {
            WireGeneration::V1_28 | WireGeneration::V1_29 | WireGeneration::V1_33 => {
                "nodeInfo (field 1)"
            }
            WireGeneration::V1_34_2 => "nodeBytes (field 2) or nodeInfo (field 1)",
            WireGeneration::V1_35 => "nodeBytes (field 2)",
        }
    }

    /// The `defaults` this release sends (`NodeGroup.GetOptions`): thresholds always; the
    /// durations as meta.v1.Duration in fields 3, 4 (and 5 from 1.29) up to 1.34.x, as
    /// google.protobuf.Duration in 8-10 from 1.34.2; the two booleans from 1.33.
    pub fn options_request(self, flags: &NodeGroupOptions) -> pb::NodeGroupAutoscalingOptions {
        let meta = |d: Duration| {
            Some(MetaDuration {
                duration: Some(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            })
        };
        let proto = |d: Duration| {
            Some(prost_types::Duration {
                seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
            })
        };
        let mut o = pb::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: flags.scale_down_utilization_threshold,
            scale_down_gpu_utilization_threshold: flags.scale_down_gpu_utilization_threshold,
            ..Default::default()
        };
        if self != WireGeneration::V1_35 {
            o.scale_down_unneeded_time = meta(flags.scale_down_unneeded_time);
            o.scale_down_unready_time = meta(flags.scale_down_unready_time);
        }
        if matches!(
            self,
            WireGeneration::V1_29 | WireGeneration::V1_33 | WireGeneration::V1_34_2
        ) {
            o.max_node_provision_time = meta(flags.max_node_provision_time);
        }
        if matches!(
            self,
            WireGeneration::V1_33 | WireGeneration::V1_34_2 | WireGeneration::V1_35
        ) {
            o.zero_or_max_node_scaling = flags.zero_or_max_node_scaling;
            o.ignore_daemon_sets_utilization = flags.ignore_daemonsets_utilization;
        }
        if matches!(self, WireGeneration::V1_34_2 | WireGeneration::V1_35) {
            o.scale_down_unneeded_duration = proto(flags.scale_down_unneeded_time);
            o.scale_down_unready_duration = proto(flags.scale_down_unready_time);
            o.max_node_provision_duration = proto(flags.max_node_provision_time);
        }
        o
    }

    /// What this release makes of an OK answer (`NodeGroup.GetOptions`): no options message is
    /// "use the flags"; otherwise the fields it reads, every other one zero. Up to 1.34.1 it
    /// reads `pbOpts.GetScaleDownUnneededTime().Duration` (and 4, and 5 from 1.29) with no nil
    /// check, 1.34.2 falls back to them when 8-10 are missing: a missing one is a nil pointer
    /// dereference in `NodeGroup.GetOptions`, which crashes the autoscaler process: the error
    /// says so.
    pub fn read_options(
        self,
        answer: Option<&pb::NodeGroupAutoscalingOptions>,
    ) -> Result<OptionsAnswer, String> {
        let Some(a) = answer else {
            return Ok(OptionsAnswer::Flags);
        };
        let deref = |field: Option<MetaDuration>, name: &str| {
            field
                .map(|d| Duration::from_nanos(u64::try_from(d.duration.unwrap_or(0)).unwrap_or(0)))
                .ok_or_else(|| {
                    format!(
                        "cluster-autoscaler {self} dereferences the missing {name} of a \
                         NodeGroupGetOptions answer (NodeGroup.GetOptions): nil pointer \
                         dereference"
                    )
                })
        };
        let google = |field: Option<prost_types::Duration>| {
            field.map(|d| {
                Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0))
                    .saturating_add(Duration::from_nanos(u64::try_from(d.nanos).unwrap_or(0)))
            })
        };
        let mut o = NodeGroupOptions {
            scale_down_utilization_threshold: a.scale_down_utilization_threshold,
            scale_down_gpu_utilization_threshold: a.scale_down_gpu_utilization_threshold,
            scale_down_unneeded_time: Duration::ZERO,
            scale_down_unready_time: Duration::ZERO,
            max_node_provision_time: Duration::ZERO,
            zero_or_max_node_scaling: false,
            ignore_daemonsets_utilization: false,
        };
        match self {
            WireGeneration::V1_28 | WireGeneration::V1_29 | WireGeneration::V1_33 => {
                o.scale_down_unneeded_time = deref(
                    a.scale_down_unneeded_time,
                    "scaleDownUnneededTime (field 3)",
                )?;
                o.scale_down_unready_time =
                    deref(a.scale_down_unready_time, "scaleDownUnreadyTime (field 4)")?;
                if self != WireGeneration::V1_28 {
                    o.max_node_provision_time =
                        deref(a.max_node_provision_time, "MaxNodeProvisionTime (field 5)")?;
                }
            }
            WireGeneration::V1_34_2 => {
                o.scale_down_unneeded_time = match google(a.scale_down_unneeded_duration) {
                    Some(d) => d,
                    None => deref(
                        a.scale_down_unneeded_time,
                        "scaleDownUnneededTime (field 3)",
                    )?,
                };
                o.scale_down_unready_time = match google(a.scale_down_unready_duration) {
                    Some(d) => d,
                    None => deref(a.scale_down_unready_time, "scaleDownUnreadyTime (field 4)")?,
                };
                o.max_node_provision_time = match google(a.max_node_provision_duration) {
                    Some(d) => d,
                    None => deref(a.max_node_provision_time, "MaxNodeProvisionTime (field 5)")?,
                };
            }
            WireGeneration::V1_35 => {
                o.scale_down_unneeded_time =
                    google(a.scale_down_unneeded_duration).unwrap_or_default();
                o.scale_down_unready_time =
                    google(a.scale_down_unready_duration).unwrap_or_default();
                o.max_node_provision_time =
                    google(a.max_node_provision_duration).unwrap_or_default();
            }
        }
        if !matches!(self, WireGeneration::V1_28 | WireGeneration::V1_29) {
            o.zero_or_max_node_scaling = a.zero_or_max_node_scaling;
            o.ignore_daemonsets_utilization = a.ignore_daemon_sets_utilization;
        }
        Ok(OptionsAnswer::Options(o))
    }

    /// Whether this release's client turns an Unimplemented answer to NodeGroupTemplateNodeInfo
    /// or NodeGroupGetOptions into "not implemented" (`codes.Unimplemented` →
    /// `cloudprovider.ErrNotImplemented`, from 1.29); 1.28 returns it as an error.
    pub fn understands_unimplemented(self) -> bool {
        self != WireGeneration::V1_28
    }
}

impl fmt::Display for WireGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireGeneration::V1_28 => "1.28",
            WireGeneration::V1_29 => "1.29-1.32",
            WireGeneration::V1_33 => "1.33-1.34.1",
            WireGeneration::V1_34_2 => "1.34.2+",
            WireGeneration::V1_35 => "1.35+",
        })
    }
}

/// The autoscaler flags the wire tests send as defaults (here and in the client's tests).
#[cfg(test)]
pub(crate) fn test_flags() -> NodeGroupOptions {
    const MIN: u64 = 60;
    NodeGroupOptions {
        scale_down_utilization_threshold: 0.5,
        scale_down_gpu_utilization_threshold: 0.4,
        scale_down_unneeded_time: Duration::from_secs(10 * MIN),
        scale_down_unready_time: Duration::from_secs(20 * MIN),
        max_node_provision_time: Duration::from_secs(25 * MIN),
        zero_or_max_node_scaling: true,
        ignore_daemonsets_utilization: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60;

    fn meta(secs: u64) -> Option<MetaDuration> {
        Some(MetaDuration {
            duration: Some(i64::try_from(secs * 1_000_000_000).unwrap()),
        })
    }

    fn google(secs: i64) -> Option<prost_types::Duration> {
        Some(prost_types::Duration {
            seconds: secs,
            nanos: 0,
        })
    }

    use super::test_flags as flags;

    #[test]
    fn releases_map_to_their_generation() {
        for (release, want) in [
            ("1.28.0", WireGeneration::V1_28),
            ("v1.28.7", WireGeneration::V1_28),
            ("1.29.5", WireGeneration::V1_29),
            ("1.32.7", WireGeneration::V1_29),
            ("1.33.0", WireGeneration::V1_33),
            ("1.34.1", WireGeneration::V1_33),
            ("1.34", WireGeneration::V1_33),
            ("1.34.2", WireGeneration::V1_34_2),
            ("v1.34.5", WireGeneration::V1_34_2),
            ("1.35.0", WireGeneration::V1_35),
            ("1.36.1", WireGeneration::V1_35),
        ] {
            assert_eq!(WireGeneration::of_release(release), Ok(want), "{release}");
        }
        for bad in ["1.27.9", "2.0.0", "1", "1.x", "1.33.1.2", ""] {
            assert!(WireGeneration::of_release(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_generation_reads_the_template_from_its_field() {
        let old_only = pb::NodeGroupTemplateNodeInfoResponse {
            node_info: b"field 1".to_vec(),
            node_bytes: Vec::new(),
        };
        let new_only = pb::NodeGroupTemplateNodeInfoResponse {
            node_info: Vec::new(),
            node_bytes: b"field 2".to_vec(),
        };
        let both = pb::NodeGroupTemplateNodeInfoResponse {
            node_info: b"field 1".to_vec(),
            node_bytes: b"field 2".to_vec(),
        };
        use WireGeneration::*;
        for (g, old, new, both_read) in [
            (V1_28, "field 1", "", "field 1"),
            (V1_29, "field 1", "", "field 1"),
            (V1_33, "field 1", "", "field 1"),
            (V1_34_2, "field 1", "field 2", "field 2"),
            (V1_35, "", "field 2", "field 2"),
        ] {
            assert_eq!(g.template_node(&old_only), old.as_bytes(), "{g:?}");
            assert_eq!(g.template_node(&new_only), new.as_bytes(), "{g:?}");
            assert_eq!(g.template_node(&both), both_read.as_bytes(), "{g:?}");
        }
    }

    #[test]
    fn each_generation_sends_the_option_fields_its_release_has() {
        let f = flags();
        use WireGeneration::*;
        let sent = |g: WireGeneration| g.options_request(&f);
        let v1_28 = sent(V1_28);
        assert_eq!(
            (
                v1_28.scale_down_unneeded_time,
                v1_28.scale_down_unready_time
            ),
            (meta(10 * MIN), meta(20 * MIN))
        );
        assert_eq!(v1_28.max_node_provision_time, None);
        assert!(!v1_28.zero_or_max_node_scaling);
        assert_eq!(sent(V1_29).max_node_provision_time, meta(25 * MIN));
        assert!(!sent(V1_29).ignore_daemon_sets_utilization);
        assert!(sent(V1_33).ignore_daemon_sets_utilization);
        assert_eq!(sent(V1_33).scale_down_unneeded_duration, None);
        let v1_34_2 = sent(V1_34_2);
        assert_eq!(v1_34_2.max_node_provision_time, meta(25 * MIN));
        assert_eq!(v1_34_2.max_node_provision_duration, google(25 * 60));
        let v1_35 = sent(V1_35);
        assert_eq!(v1_35.scale_down_unneeded_time, None);
        assert_eq!(v1_35.max_node_provision_time, None);
        assert_eq!(v1_35.scale_down_unready_duration, google(20 * 60));
        assert!(v1_35.zero_or_max_node_scaling);
        for g in WireGeneration::ALL {
            assert_eq!(sent(g).scale_down_gpu_utilization_threshold, 0.4, "{g:?}");
        }
    }

    #[test]
    fn releases_up_to_1_34_1_crash_on_options_without_fields_3_to_5() {
        // An answer as a provider that only knows the 1.35 shape gives it.
        let new_only = WireGeneration::V1_35.options_request(&flags());
        use WireGeneration::*;
        for g in [V1_28, V1_29, V1_33] {
            match g.read_options(Some(&new_only)) {
                Err(why) => {
                    assert!(why.contains("scaleDownUnneededTime (field 3)"), "{why}")
                }
                other => panic!("{g:?}: {other:?}"),
            }
        }
        // 1.34.2 falls back to 3-5 only when 8-10 are missing.
        assert!(matches!(
            V1_34_2.read_options(Some(&new_only)),
            Ok(OptionsAnswer::Options(_))
        ));
        let old_only = V1_33.options_request(&flags());
        assert_eq!(
            V1_34_2.read_options(Some(&old_only)),
            Ok(OptionsAnswer::Options(flags()))
        );
        // 1.35 reads an answer without 8-10 as zero durations.
        match V1_35.read_options(Some(&old_only)) {
            Ok(OptionsAnswer::Options(o)) => {
                assert_eq!(o.scale_down_unneeded_time, Duration::ZERO)
            }
            other => panic!("{other:?}"),
        }
        // No options at all: every release uses its flags.
        for g in WireGeneration::ALL {
            assert_eq!(g.read_options(None), Ok(OptionsAnswer::Flags), "{g:?}");
        }
    }

    #[test]
    fn older_releases_drop_the_fields_they_do_not_know() {
        use WireGeneration::*;
        let both = V1_34_2.options_request(&flags());
        let read = |g: WireGeneration| match g.read_options(Some(&both)) {
            Ok(OptionsAnswer::Options(o)) => o,
            other => panic!("{g:?}: {other:?}"),
        };
        let v1_28 = read(V1_28);
        assert_eq!(v1_28.max_node_provision_time, Duration::ZERO);
        assert!(!v1_28.zero_or_max_node_scaling);
        let v1_29 = read(V1_29);
        assert_eq!(v1_29.max_node_provision_time, Duration::from_secs(25 * MIN));
        assert!(!v1_29.ignore_daemonsets_utilization);
        for g in [V1_33, V1_34_2, V1_35] {
            assert_eq!(read(g), flags(), "{g:?}");
        }
    }
}
