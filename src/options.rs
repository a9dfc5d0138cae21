//! NodeGroupGetOptions: per-cluster autoscaling option overrides, and what to answer.
//!
//! This module owns the pure logic: the override set ([`OptionOverrides`]), its command-line
//! form ([`parse_overrides_spec`]), its validation, the merge with the defaults the autoscaler
//! sends ([`merged_options`]), the wire generations of the option message ([`GroupOptions`],
//! [`sent_by_release_1_28`]) and the start-up warning ([`startup_warning`]). It does no I/O;
//! the gRPC layer answers from a precomputed map because the autoscaler calls NodeGroupGetOptions
//! for every node in every loop and never caches the answer.
//!
//! # Two traps
//!
//! 1. **Unset fields become zero.** The autoscaler's client takes the response message as the
//!    complete option set: any field left unset arrives as 0 (a scale-down-unneeded time of 0 s
//!    means "scale down at once"). So every field that is not overridden must echo the
//!    `defaults` the request carries. [`merged_options`] starts from those defaults and only
//!    then applies overrides.
//! 2. **Max node startup time becomes 0.** The autoscaler's externalgrpc client reads no
//!    max-node-startup time from the response (kubernetes/autoscaler#10245), so whenever a
//!    provider returns options at all, that group's max node startup time is 0: nodes that
//!    are booting and not yet Ready are counted as *unready* rather than *not started*, stop
//!    counting as upcoming capacity (extra scale-ups), count against cluster health and become
//!    scale-down candidates after scale-down-unready time. There is no way around it from the
//!    provider side, so: with no overrides configured the provider answers UNIMPLEMENTED (the
//!    autoscaler keeps its own flags, startup time included), and with overrides configured it
//!    logs [`startup_warning`] once at start.
//!
//! # Wire generations
//!
//! The three durations travel in two sets of fields (`externalgrpc_node_group.go`,
//! `NodeGroup.GetOptions`, at each upstream tag):
//!
//! | release | sends in `defaults` | reads from the answer |
//! |---|---|---|
//! | 1.28.x | 3, 4 (meta.v1.Duration, nanoseconds) | 1-4 |
//! | 1.29.0 to 1.32.x | 3, 4, 5 | 1-5 |
//! | 1.33.0 to 1.34.1 | 3, 4, 5 | 1-7 |
//! | 1.34.2 to 1.34.x | 3-5 and 8-10 (google.protobuf.Duration) | 8-10, each falling back to 3-5 |
//! | 1.35.0 onward | 8, 9, 10 | 8-10 |
//!
//! Releases up to 1.34.1 dereference fields 3-5 of an answer without a nil check, so an answer
//! without them crashes the autoscaler; 1.35 ignores them. So the defaults are read from
//! whichever set came ([`GroupOptions::from_wire`]) and the answer carries both
//! ([`GroupOptions::to_wire`]).
//!
//! 1.28 is special twice over: its client maps no gRPC code to "not implemented" (an
//! UNIMPLEMENTED answer is an error for every option the core asks about: no scale-down, no
//! scale-up tracking), and it reads no max node provision time from an answer (any options
//! answered make it 0: every scale-up times out at once). Its requests are recognised
//! ([`sent_by_release_1_28`]) and answered OK with no options, which its client turns into "use
//! the flags" (`pbOpts == nil`); overrides cannot apply to it.

use std::time::Duration;

use crate::grammar::{parse_bool, parse_duration};
use cks_proto as pb;

/// A max node provision time suited to CKS, for operators who override it (the autoscaler's
/// own default is 15 minutes).
///
/// Why 25 minutes: a CKS scale-up is one CloudStack job that deploys the new worker VMs one
/// after another; each VM then boots, sets up its Kubernetes binaries from the CKS ISO and runs
/// `kubeadm join`, which commonly takes several minutes per VM and more on busy hosts. The
/// autoscaler counts max-node-provision time from the moment it asked for the node, so the last
/// VM of a multi-node scale-up starts late. If the time runs out the autoscaler deletes the
/// still-joining node as "unregistered" and backs the group off, wasting the work. 25 minutes
/// covers a few sequential VMs with margin, and still gives up well before CloudStack's own
/// scale job times out (`cloud.kubernetes.cluster.scale.timeout`, one hour by default).
pub const RECOMMENDED_MAX_NODE_PROVISION: Duration = Duration::from_secs(25 * 60);

/// One group's options as the autoscaler uses them, whichever fields carried them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupOptions {
    /// `scaleDownUtilizationThreshold` (field 1).
    pub scale_down_utilization_threshold: f64,
    /// `scaleDownGpuUtilizationThreshold` (field 2).
    pub scale_down_gpu_utilization_threshold: f64,
    /// Fields 8 and 3.
    pub scale_down_unneeded: Duration,
    /// Fields 9 and 4.
    pub scale_down_unready: Duration,
    /// Fields 10 and 5.
    pub max_node_provision: Duration,
    /// `zeroOrMaxNodeScaling` (field 6).
    pub zero_or_max_node_scaling: bool,
    /// `ignoreDaemonSetsUtilization` (field 7).
    pub ignore_daemonsets_utilization: bool,
}

impl GroupOptions {
    /// The cluster-autoscaler's own flag defaults (`--scale-down-utilization-threshold=0.5`,
    /// `--scale-down-gpu-utilization-threshold=0.5`, `--scale-down-unneeded-time=10m`,
    /// `--scale-down-unready-time=20m`, `--max-node-provision-time=15m`,
    /// `--ignore-daemonsets-utilization=false`, zero-or-max off). They stand in for what a
    /// request does not carry, which the autoscaler's client never leaves out; falling back to
    /// these beats echoing zeros.
    pub const AUTOSCALER_FLAG_DEFAULTS: GroupOptions = GroupOptions {
        scale_down_utilization_threshold: 0.5,
        scale_down_gpu_utilization_threshold: 0.5,
        scale_down_unneeded: Duration::from_secs(10 * 60),
        scale_down_unready: Duration::from_secs(20 * 60),
        max_node_provision: Duration::from_secs(15 * 60),
        zero_or_max_node_scaling: false,
        ignore_daemonsets_utilization: false,
    };

    /// The options a request's `defaults` carry. Each duration comes from its
    /// google.protobuf.Duration field (8-10) when present, else from its meta.v1.Duration field
    /// (3-5), the order in which 1.34.2's client reads an answer; one in neither is the flag
    /// default. Without `defaults` at all, the flag defaults. Negative durations count as 0.
    pub fn from_wire(defaults: Option<&pb::NodeGroupAutoscalingOptions>) -> GroupOptions {
        let flags = Self::AUTOSCALER_FLAG_DEFAULTS;
        let Some(d) = defaults else {
            return flags;
        };
        let pick = |new: Option<prost_types::Duration>,
                    old: Option<k8s_pb::apimachinery::pkg::apis::meta::v1::Duration>,
                    flag: Duration| {
            new.map(from_proto_duration)
                .or(old.map(from_meta_duration))
                .unwrap_or(flag)
        };
        GroupOptions {
            scale_down_utilization_threshold: d.scale_down_utilization_threshold,
            scale_down_gpu_utilization_threshold: d.scale_down_gpu_utilization_threshold,
            scale_down_unneeded: pick(
                d.scale_down_unneeded_duration,
                d.scale_down_unneeded_time,
                flags.scale_down_unneeded,
            ),
            scale_down_unready: pick(
                d.scale_down_unready_duration,
                d.scale_down_unready_time,
                flags.scale_down_unready,
            ),
            max_node_provision: pick(
                d.max_node_provision_duration,
                d.max_node_provision_time,
                flags.max_node_provision,
            ),
            zero_or_max_node_scaling: d.zero_or_max_node_scaling,
            ignore_daemonsets_utilization: d.ignore_daemon_sets_utilization,
        }
    }

    /// The answer: every field set, each duration in both of its fields (3-5 for releases up
    /// to 1.34.1, which crash without them; 8-10 for releases from 1.34.2).
    pub fn to_wire(&self) -> pb::NodeGroupAutoscalingOptions {
        pb::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: self.scale_down_utilization_threshold,
            scale_down_gpu_utilization_threshold: self.scale_down_gpu_utilization_threshold,
            scale_down_unneeded_time: Some(meta_duration(self.scale_down_unneeded)),
            scale_down_unready_time: Some(meta_duration(self.scale_down_unready)),
            max_node_provision_time: Some(meta_duration(self.max_node_provision)),
            zero_or_max_node_scaling: self.zero_or_max_node_scaling,
            ignore_daemon_sets_utilization: self.ignore_daemonsets_utilization,
            scale_down_unneeded_duration: Some(proto_duration(self.scale_down_unneeded)),
            scale_down_unready_duration: Some(proto_duration(self.scale_down_unready)),
            max_node_provision_duration: Some(proto_duration(self.max_node_provision)),
        }
    }

    /// These options with `overrides` applied.
    pub fn with_overrides(mut self, overrides: &OptionOverrides) -> GroupOptions {
        if let Some(v) = overrides.scale_down_utilization_threshold {
            self.scale_down_utilization_threshold = v;
        }
        if let Some(v) = overrides.scale_down_gpu_utilization_threshold {
            self.scale_down_gpu_utilization_threshold = v;
        }
        if let Some(d) = overrides.scale_down_unneeded {
            self.scale_down_unneeded = d;
        }
        if let Some(d) = overrides.scale_down_unready {
            self.scale_down_unready = d;
        }
        if let Some(d) = overrides.max_node_provision {
            self.max_node_provision = d;
        }
        if let Some(v) = overrides.zero_or_max_node_scaling {
            self.zero_or_max_node_scaling = v;
        }
        if let Some(v) = overrides.ignore_daemonsets_utilization {
            self.ignore_daemonsets_utilization = v;
        }
        self
    }
}

/// Whether a NodeGroupGetOptions request comes from a cluster-autoscaler 1.28.x: its
/// `defaults` carry durations in fields 3 and 4 only. Every release sends every duration field
/// it knows (`externalgrpc_node_group.go`, `NodeGroup.GetOptions`): 1.29 added field 5 and
/// 1.34.2 fields 8-10, and none sends fewer. See the module docs for why such a request is
/// answered with no options.
pub fn sent_by_release_1_28(request: &pb::NodeGroupAutoscalingOptionsRequest) -> bool {
    request.defaults.as_ref().is_some_and(|d| {
        (d.scale_down_unneeded_time.is_some() || d.scale_down_unready_time.is_some())
            && d.max_node_provision_time.is_none()
            && d.scale_down_unneeded_duration.is_none()
            && d.scale_down_unready_duration.is_none()
            && d.max_node_provision_duration.is_none()
    })
}

/// Per-cluster overrides; `None` means "echo the autoscaler's default".
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OptionOverrides {
    /// `scaleDownUtilizationThreshold` (0..=1).
    pub scale_down_utilization_threshold: Option<f64>,
    /// `scaleDownGpuUtilizationThreshold` (0..=1).
    pub scale_down_gpu_utilization_threshold: Option<f64>,
    /// `scaleDownUnneededDuration` (> 0).
    pub scale_down_unneeded: Option<Duration>,
    /// `scaleDownUnreadyDuration` (> 0).
    pub scale_down_unready: Option<Duration>,
    /// `MaxNodeProvisionDuration` (> 0); see [`RECOMMENDED_MAX_NODE_PROVISION`].
    pub max_node_provision: Option<Duration>,
    /// `zeroOrMaxNodeScaling`.
    pub zero_or_max_node_scaling: Option<bool>,
    /// `ignoreDaemonSetsUtilization`.
    pub ignore_daemonsets_utilization: Option<bool>,
}

/// The keys [`parse_overrides_spec`] accepts, canonical spelling first. The autoscaler's flag
/// names (`scale-down-unneeded-time`, …) are accepted as aliases.
pub const OVERRIDE_KEYS: &[&str] = &[
    "scale-down-utilization-threshold",
    "scale-down-gpu-utilization-threshold",
    "scale-down-unneeded",
    "scale-down-unready",
    "max-node-provision",
    "zero-or-max-node-scaling",
    "ignore-daemonsets-utilization",
];

impl OptionOverrides {
    /// True when nothing is overridden (the provider then answers UNIMPLEMENTED).
    pub fn is_empty(&self) -> bool {
        self.overridden_keys().is_empty()
    }

    /// The canonical keys (see [`OVERRIDE_KEYS`]) that are set, in that order; for logs.
    pub fn overridden_keys(&self) -> Vec<&'static str> {
        let set = [
            self.scale_down_utilization_threshold.is_some(),
            self.scale_down_gpu_utilization_threshold.is_some(),
            self.scale_down_unneeded.is_some(),
            self.scale_down_unready.is_some(),
            self.max_node_provision.is_some(),
            self.zero_or_max_node_scaling.is_some(),
            self.ignore_daemonsets_utilization.is_some(),
        ];
        OVERRIDE_KEYS
            .iter()
            .zip(set)
            .filter_map(|(k, on)| on.then_some(*k))
            .collect()
    }

    /// Thresholds must lie in [0, 1]; durations must be greater than zero (a zero duration is
    /// exactly the failure the merge exists to avoid).
    pub fn validate(&self) -> Result<(), String> {
        let thresholds = [
            (
                "scale-down-utilization-threshold",
                self.scale_down_utilization_threshold,
            ),
            (
                "scale-down-gpu-utilization-threshold",
                self.scale_down_gpu_utilization_threshold,
            ),
        ];
        for (key, value) in thresholds {
            if let Some(v) = value
                && !(0.0..=1.0).contains(&v)
            {
                return Err(format!("{key} must be between 0 and 1, got {v}"));
            }
        }
        let durations = [
            ("scale-down-unneeded", self.scale_down_unneeded),
            ("scale-down-unready", self.scale_down_unready),
            ("max-node-provision", self.max_node_provision),
        ];
        for (key, value) in durations {
            if value.is_some_and(|d| d.is_zero()) {
                return Err(format!("{key} must be greater than 0"));
            }
        }
        Ok(())
    }
}

/// The options to answer: the request's `defaults` (read from whichever duration fields came,
/// see [`GroupOptions::from_wire`]) with the overrides applied, every field set and each
/// duration in both of its fields. Every field that is not overridden is the request's value.
pub fn merged_options(
    defaults: Option<&pb::NodeGroupAutoscalingOptions>,
    overrides: &OptionOverrides,
) -> pb::NodeGroupAutoscalingOptions {
    GroupOptions::from_wire(defaults)
        .with_overrides(overrides)
        .to_wire()
}

/// The warning to log once at start when any cluster has overrides (`None` when none has),
/// naming the consequence an operator would otherwise discover the hard way.
pub fn startup_warning(overrides_present_for: &[String]) -> Option<String> {
    if overrides_present_for.is_empty() {
        return None;
    }
    Some(format!(
        "NodeGroupGetOptions overrides are configured for {}. For these node groups the \
         cluster-autoscaler will use a max node startup time of 0, because the externalgrpc \
         protocol cannot carry it (kubernetes/autoscaler#10245): a worker that is still booting \
         and joining counts as unready instead of starting, no longer counts as upcoming \
         capacity (which can cause extra scale-ups), counts against cluster health, and can be \
         scaled down after scale-down-unready time. Remove the overrides to keep the \
         autoscaler's own flags.",
        overrides_present_for
            .iter()
            .map(|c| format!("'{c}'"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Parses `CLUSTER:key=value[,key=value...]`, e.g.
/// `prod:scale-down-unneeded=5m,max-node-provision=25m,scale-down-utilization-threshold=0.6`.
///
/// The cluster is everything before the last `:` (no value contains one). Keys are listed in
/// [`OVERRIDE_KEYS`]; durations and booleans are written as in every other setting
/// (`90s`, `1.5m`, `1h30m`; `true`, `false`, see [`crate::grammar`]). Unknown keys, repeated keys and invalid values are errors naming the key. The
/// result is validated ([`OptionOverrides::validate`]).
pub fn parse_overrides_spec(s: &str) -> Result<(String, OptionOverrides), String> {
    const FORM: &str = "expected CLUSTER:key=value[,key=value...]";
    let (cluster, list) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("option overrides '{s}': {FORM}"))?;
    let cluster = cluster.trim();
    if cluster.is_empty() {
        return Err(format!(
            "option overrides '{s}': cluster name is empty ({FORM})"
        ));
    }
    let mut o = OptionOverrides::default();
    let mut seen: Vec<&'static str> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item.split_once('=').ok_or_else(|| {
            format!("option overrides for '{cluster}': '{item}' is not key=value")
        })?;
        let (key, value) = (key.trim(), value.trim());
        let canonical = canonical_key(key).ok_or_else(|| {
            format!(
                "option overrides for '{cluster}': unknown key '{key}'; known keys: {}",
                OVERRIDE_KEYS.join(", ")
            )
        })?;
        if seen.contains(&canonical) {
            return Err(format!(
                "option overrides for '{cluster}': key '{canonical}' is given twice"
            ));
        }
        seen.push(canonical);
        let bad = |why: String| format!("option overrides for '{cluster}': {canonical}: {why}");
        match canonical {
            "scale-down-utilization-threshold" => {
                o.scale_down_utilization_threshold = Some(parse_threshold(value).map_err(bad)?)
            }
            "scale-down-gpu-utilization-threshold" => {
                o.scale_down_gpu_utilization_threshold = Some(parse_threshold(value).map_err(bad)?)
            }
            "scale-down-unneeded" => {
                o.scale_down_unneeded = Some(parse_duration(value).map_err(bad)?)
            }
            "scale-down-unready" => {
                o.scale_down_unready = Some(parse_duration(value).map_err(bad)?)
            }
            "max-node-provision" => {
                o.max_node_provision = Some(parse_duration(value).map_err(bad)?)
            }
            "zero-or-max-node-scaling" => {
                o.zero_or_max_node_scaling = Some(parse_bool(value).map_err(bad)?)
            }
            _ => o.ignore_daemonsets_utilization = Some(parse_bool(value).map_err(bad)?),
        }
    }
    if o.is_empty() {
        return Err(format!(
            "option overrides for '{cluster}': no key=value given ({FORM})"
        ));
    }
    o.validate()
        .map_err(|e| format!("option overrides for '{cluster}': {e}"))?;
    Ok((cluster.to_string(), o))
}

fn canonical_key(key: &str) -> Option<&'static str> {
    let alias = match key {
        "scale-down-unneeded-time" => "scale-down-unneeded",
        "scale-down-unready-time" => "scale-down-unready",
        "max-node-provision-time" => "max-node-provision",
        other => other,
    };
    OVERRIDE_KEYS.iter().copied().find(|k| *k == alias)
}

fn parse_threshold(v: &str) -> Result<f64, String> {
    let x: f64 = v
        .parse()
        .map_err(|_| format!("'{v}' is not a number between 0 and 1"))?;
    if x.is_finite() && (0.0..=1.0).contains(&x) {
        Ok(x)
    } else {
        Err(format!("'{v}' is not between 0 and 1"))
    }
}

/// `std` duration → protobuf duration, saturating at the protobuf maximum (durations here are
/// minutes long; saturation only guards against absurd configuration).
fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// `std` duration → meta.v1.Duration (nanoseconds), saturating at `i64::MAX` (292 years).
fn meta_duration(d: Duration) -> k8s_pb::apimachinery::pkg::apis::meta::v1::Duration {
    k8s_pb::apimachinery::pkg::apis::meta::v1::Duration {
        duration: Some(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
    }
}

/// protobuf duration → `std` duration; negative is 0, overflow saturates.
fn from_proto_duration(d: prost_types::Duration) -> Duration {
    let Ok(secs) = u64::try_from(d.seconds) else {
        return Duration::ZERO;
    };
    let nanos = u64::try_from(d.nanos).unwrap_or(0);
    Duration::from_secs(secs).saturating_add(Duration::from_nanos(nanos))
}

/// meta.v1.Duration (nanoseconds; a message without its field is 0) → `std` duration;
/// negative is 0.
fn from_meta_duration(d: k8s_pb::apimachinery::pkg::apis::meta::v1::Duration) -> Duration {
    Duration::from_nanos(u64::try_from(d.duration.unwrap_or(0)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(secs: i64) -> Option<prost_types::Duration> {
        Some(prost_types::Duration {
            seconds: secs,
            nanos: 0,
        })
    }

    fn m(secs: i64) -> Option<k8s_pb::apimachinery::pkg::apis::meta::v1::Duration> {
        Some(k8s_pb::apimachinery::pkg::apis::meta::v1::Duration {
            duration: Some(secs * 1_000_000_000),
        })
    }

    /// Defaults as 1.35 sends them (durations in fields 8-10 only), every field distinctive.
    fn request_defaults() -> pb::NodeGroupAutoscalingOptions {
        pb::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: 0.45,
            scale_down_gpu_utilization_threshold: 0.35,
            zero_or_max_node_scaling: true,
            ignore_daemon_sets_utilization: true,
            scale_down_unneeded_duration: d(600),
            scale_down_unready_duration: d(1200),
            max_node_provision_duration: d(900),
            ..Default::default()
        }
    }

    /// The same defaults as 1.33 sends them (fields 3-5 only).
    fn legacy_request_defaults() -> pb::NodeGroupAutoscalingOptions {
        pb::NodeGroupAutoscalingOptions {
            scale_down_unneeded_duration: None,
            scale_down_unready_duration: None,
            max_node_provision_duration: None,
            scale_down_unneeded_time: m(600),
            scale_down_unready_time: m(1200),
            max_node_provision_time: m(900),
            ..request_defaults()
        }
    }

    /// `request_defaults` answered: each duration in both of its fields.
    fn answered(defaults: pb::NodeGroupAutoscalingOptions) -> pb::NodeGroupAutoscalingOptions {
        pb::NodeGroupAutoscalingOptions {
            scale_down_unneeded_time: m(600),
            scale_down_unready_time: m(1200),
            max_node_provision_time: m(900),
            scale_down_unneeded_duration: d(600),
            scale_down_unready_duration: d(1200),
            max_node_provision_duration: d(900),
            ..defaults
        }
    }

    #[test]
    fn unset_fields_echo_the_request_defaults_in_both_duration_sets() {
        let one = OptionOverrides {
            max_node_provision: Some(Duration::from_secs(25 * 60)),
            ..OptionOverrides::default()
        };
        for defaults in [request_defaults(), legacy_request_defaults()] {
            let got = merged_options(Some(&defaults), &one);
            let want = pb::NodeGroupAutoscalingOptions {
                max_node_provision_duration: d(1500),
                max_node_provision_time: m(1500),
                ..answered(request_defaults())
            };
            assert_eq!(got, want, "from {defaults:?}");
            assert_eq!(got.scale_down_unneeded_duration, d(600), "never 0 s");
            assert_eq!(got.scale_down_unneeded_time, m(600), "never missing");
        }
    }

    #[test]
    fn defaults_are_read_from_whichever_duration_fields_came() {
        let want = GroupOptions {
            scale_down_utilization_threshold: 0.45,
            scale_down_gpu_utilization_threshold: 0.35,
            scale_down_unneeded: Duration::from_secs(600),
            scale_down_unready: Duration::from_secs(1200),
            max_node_provision: Duration::from_secs(900),
            zero_or_max_node_scaling: true,
            ignore_daemonsets_utilization: true,
        };
        assert_eq!(GroupOptions::from_wire(Some(&request_defaults())), want);
        assert_eq!(
            GroupOptions::from_wire(Some(&legacy_request_defaults())),
            want
        );
        // Both sets (1.34.2 sends both): fields 8-10 win, as 1.34.2's client reads them.
        let both = pb::NodeGroupAutoscalingOptions {
            scale_down_unneeded_time: m(1),
            scale_down_unready_time: m(2),
            max_node_provision_time: m(3),
            ..request_defaults()
        };
        assert_eq!(GroupOptions::from_wire(Some(&both)), want);
        // A field in neither set: the flag default, not 0.
        let partial = pb::NodeGroupAutoscalingOptions {
            max_node_provision_duration: None,
            ..request_defaults()
        };
        assert_eq!(
            GroupOptions::from_wire(Some(&partial)).max_node_provision,
            Duration::from_secs(15 * 60)
        );
        // Sub-second and nanosecond values survive both encodings.
        let fine = GroupOptions {
            scale_down_unneeded: Duration::from_nanos(1_500_000_001),
            ..want
        };
        assert_eq!(GroupOptions::from_wire(Some(&fine.to_wire())), fine);
        let only_meta = pb::NodeGroupAutoscalingOptions {
            scale_down_unneeded_duration: None,
            ..fine.to_wire()
        };
        assert_eq!(GroupOptions::from_wire(Some(&only_meta)), fine);
        // Negative values count as 0.
        let negative = pb::NodeGroupAutoscalingOptions {
            scale_down_unneeded_duration: d(-5),
            scale_down_unready_duration: None,
            scale_down_unready_time: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::Duration {
                duration: Some(-7),
            }),
            ..request_defaults()
        };
        let got = GroupOptions::from_wire(Some(&negative));
        assert_eq!(got.scale_down_unneeded, Duration::ZERO);
        assert_eq!(got.scale_down_unready, Duration::ZERO);
    }

    #[test]
    fn a_1_28_request_is_told_apart_by_its_duration_fields() {
        let req = |defaults| pb::NodeGroupAutoscalingOptionsRequest {
            id: "g".into(),
            defaults,
        };
        // What 1.28's client sends: thresholds and fields 3, 4.
        let v1_28 = pb::NodeGroupAutoscalingOptions {
            scale_down_utilization_threshold: 0.5,
            scale_down_gpu_utilization_threshold: 0.5,
            scale_down_unneeded_time: m(600),
            scale_down_unready_time: m(1200),
            ..Default::default()
        };
        assert!(sent_by_release_1_28(&req(Some(v1_28))));
        // 1.29 to 1.34.1: field 5 too; 1.34.2: 3-5 and 8-10; 1.35: 8-10; none at all.
        let v1_29 = pb::NodeGroupAutoscalingOptions {
            max_node_provision_time: m(900),
            ..v1_28
        };
        for other in [
            Some(v1_29),
            Some(answered(request_defaults())),
            Some(request_defaults()),
            None,
            Some(pb::NodeGroupAutoscalingOptions::default()),
        ] {
            assert!(!sent_by_release_1_28(&req(other)), "{other:?}");
        }
    }

    #[test]
    fn every_override_wins_over_the_defaults() {
        let all = OptionOverrides {
            scale_down_utilization_threshold: Some(0.6),
            scale_down_gpu_utilization_threshold: Some(0.0),
            scale_down_unneeded: Some(Duration::from_secs(300)),
            scale_down_unready: Some(Duration::from_secs(3600)),
            max_node_provision: Some(Duration::from_millis(1500)),
            zero_or_max_node_scaling: Some(false),
            ignore_daemonsets_utilization: Some(false),
        };
        let got = merged_options(Some(&request_defaults()), &all);
        assert_eq!(
            got,
            pb::NodeGroupAutoscalingOptions {
                scale_down_utilization_threshold: 0.6,
                scale_down_gpu_utilization_threshold: 0.0,
                zero_or_max_node_scaling: false,
                ignore_daemon_sets_utilization: false,
                scale_down_unneeded_time: m(300),
                scale_down_unready_time: m(3600),
                max_node_provision_time: Some(
                    k8s_pb::apimachinery::pkg::apis::meta::v1::Duration {
                        duration: Some(1_500_000_000)
                    }
                ),
                scale_down_unneeded_duration: d(300),
                scale_down_unready_duration: d(3600),
                max_node_provision_duration: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 500_000_000
                }),
            }
        );
    }

    #[test]
    fn without_request_defaults_the_autoscaler_flag_defaults_stand_in() {
        let got = merged_options(None, &OptionOverrides::default());
        assert_eq!(got.scale_down_utilization_threshold, 0.5);
        assert_eq!(got.scale_down_gpu_utilization_threshold, 0.5);
        assert_eq!(got.scale_down_unneeded_duration, d(600));
        assert_eq!(got.scale_down_unready_duration, d(1200));
        assert_eq!(got.max_node_provision_duration, d(900));
        assert_eq!(got.scale_down_unneeded_time, m(600));
        assert_eq!(got.scale_down_unready_time, m(1200));
        assert_eq!(got.max_node_provision_time, m(900));
        assert!(!got.zero_or_max_node_scaling);
        assert!(!got.ignore_daemon_sets_utilization);
    }

    #[test]
    fn emptiness_and_overridden_keys() {
        assert!(OptionOverrides::default().is_empty());
        let o = OptionOverrides {
            zero_or_max_node_scaling: Some(false),
            scale_down_unready: Some(Duration::from_secs(60)),
            ..OptionOverrides::default()
        };
        assert!(!o.is_empty(), "an explicit false is still an override");
        assert_eq!(
            o.overridden_keys(),
            vec!["scale-down-unready", "zero-or-max-node-scaling"]
        );
    }

    #[test]
    fn validation_rejects_out_of_range_thresholds_and_zero_durations() {
        let bad = [
            (
                OptionOverrides {
                    scale_down_utilization_threshold: Some(1.5),
                    ..OptionOverrides::default()
                },
                "scale-down-utilization-threshold must be between 0 and 1",
            ),
            (
                OptionOverrides {
                    scale_down_gpu_utilization_threshold: Some(-0.1),
                    ..OptionOverrides::default()
                },
                "scale-down-gpu-utilization-threshold",
            ),
            (
                OptionOverrides {
                    scale_down_utilization_threshold: Some(f64::NAN),
                    ..OptionOverrides::default()
                },
                "scale-down-utilization-threshold",
            ),
            (
                OptionOverrides {
                    scale_down_unneeded: Some(Duration::ZERO),
                    ..OptionOverrides::default()
                },
                "scale-down-unneeded must be greater than 0",
            ),
            (
                OptionOverrides {
                    max_node_provision: Some(Duration::ZERO),
                    ..OptionOverrides::default()
                },
                "max-node-provision must be greater than 0",
            ),
        ];
        for (o, needle) in bad {
            let err = o.validate().unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
        let good = OptionOverrides {
            scale_down_utilization_threshold: Some(0.0),
            scale_down_gpu_utilization_threshold: Some(1.0),
            scale_down_unneeded: Some(Duration::from_millis(1)),
            ..OptionOverrides::default()
        };
        assert_eq!(good.validate(), Ok(()));
    }

    #[test]
    fn startup_warning_names_clusters_and_the_consequence() {
        assert_eq!(startup_warning(&[]), None);
        let w = startup_warning(&["prod".to_string(), "ci".to_string()]).unwrap();
        for needle in [
            "'prod', 'ci'",
            "max node startup time of 0",
            "kubernetes/autoscaler#10245",
            "counts as unready",
            "extra scale-ups",
        ] {
            assert!(w.contains(needle), "missing {needle:?} in {w}");
        }
    }

    #[test]
    fn recommended_provision_time_is_longer_than_the_autoscaler_default() {
        assert!(RECOMMENDED_MAX_NODE_PROVISION > Duration::from_secs(15 * 60));
        assert!(RECOMMENDED_MAX_NODE_PROVISION < Duration::from_secs(3600));
    }

    #[test]
    fn parse_spec_accepts_the_documented_form_and_aliases() {
        let (cluster, o) = parse_overrides_spec(
            "prod:scale-down-unneeded=5m,max-node-provision=25m,scale-down-utilization-threshold=0.6",
        )
        .unwrap();
        assert_eq!(cluster, "prod");
        assert_eq!(
            o,
            OptionOverrides {
                scale_down_unneeded: Some(Duration::from_secs(300)),
                max_node_provision: Some(Duration::from_secs(1500)),
                scale_down_utilization_threshold: Some(0.6),
                ..OptionOverrides::default()
            }
        );

        let (cluster, o) = parse_overrides_spec(
            "team:a:scale-down-unneeded-time=90s, scale-down-unready-time=1h30m, \
             max-node-provision-time=20m, zero-or-max-node-scaling=TRUE, \
             ignore-daemonsets-utilization=false, scale-down-gpu-utilization-threshold=1",
        )
        .unwrap();
        assert_eq!(
            cluster, "team:a",
            "cluster is everything before the last ':'"
        );
        assert_eq!(
            o,
            OptionOverrides {
                scale_down_unneeded: Some(Duration::from_secs(90)),
                scale_down_unready: Some(Duration::from_secs(5400)),
                max_node_provision: Some(Duration::from_secs(1200)),
                zero_or_max_node_scaling: Some(true),
                ignore_daemonsets_utilization: Some(false),
                scale_down_gpu_utilization_threshold: Some(1.0),
                ..OptionOverrides::default()
            }
        );

        // The grammar the flags and the config file use holds here too.
        let (_, o) = parse_overrides_spec(
            "prod:scale-down-unneeded=1.5m,max-node-provision=1500,zero-or-max-node-scaling=yes",
        )
        .unwrap();
        assert_eq!(
            o,
            OptionOverrides {
                scale_down_unneeded: Some(Duration::from_secs(90)),
                max_node_provision: Some(Duration::from_secs(1500)),
                zero_or_max_node_scaling: Some(true),
                ..OptionOverrides::default()
            }
        );
    }

    #[test]
    fn parse_spec_errors_name_what_is_wrong() {
        for (spec, needle) in [
            ("prod", "expected CLUSTER:key=value"),
            (":scale-down-unneeded=5m", "cluster name is empty"),
            ("prod:", "no key=value given"),
            (
                "prod:scale-down-unneeded",
                "'scale-down-unneeded' is not key=value",
            ),
            (
                "prod:scale-down-uneeded=5m",
                "unknown key 'scale-down-uneeded'",
            ),
            (
                "prod:scale-down-unneeded=5m,scale-down-unneeded-time=6m",
                "key 'scale-down-unneeded' is given twice",
            ),
            (
                "prod:scale-down-unneeded=5min",
                "scale-down-unneeded: invalid duration \"5min\": unknown unit \"min\"",
            ),
            (
                "prod:max-node-provision=0s",
                "max-node-provision must be greater than 0",
            ),
            ("prod:max-node-provision=5d", "unknown unit \"d\""),
            (
                "prod:scale-down-utilization-threshold=1.2",
                "scale-down-utilization-threshold: '1.2' is not between 0 and 1",
            ),
            (
                "prod:scale-down-utilization-threshold=half",
                "'half' is not a number",
            ),
            (
                "prod:zero-or-max-node-scaling=maybe",
                "zero-or-max-node-scaling: \"maybe\" is not a boolean",
            ),
        ] {
            let err = parse_overrides_spec(spec).unwrap_err();
            assert!(err.contains(needle), "{spec}: {err}");
        }
        let err = parse_overrides_spec("prod:bogus=1").unwrap_err();
        assert!(
            err.contains("known keys: scale-down-utilization-threshold"),
            "{err}"
        );
    }
}
