//! What CloudStack's answers say about a worker: its GPUs (from the offering's fields, or from
//! its details on releases before 4.21) and its architecture in Kubernetes' spelling. Apart from
//! the building because these fields change with CloudStack releases while the Node built from
//! them does not.

use std::collections::BTreeMap;

use super::{DEFAULT_GPU_RESOURCE, GpuSpec};

/// Reads GPU information from a CloudStack service offering.
///
/// CloudStack 4.21 and later report `gpucount`, `gpucardname` and `vgpuprofilename` on the
/// offering (pass them here); older releases keep GPU offerings in `serviceofferingdetails`
/// under `pciDevice` (the GPU group, e.g. "Group of NVIDIA A6000 GPUs") and `vgpuType` (a vGPU
/// type such as "GRID K120Q", or "passthrough"), one device per VM. A `gpucount` of 0 means the
/// newer fields say "no GPU"; the older details are still consulted.
///
/// The type is the vGPU profile when one is used (that is what the VM sees), else the card or
/// group name. The resource is `amd.com/gpu` or `gpu.intel.com/i915` when the name says AMD or
/// Intel, else `nvidia.com/gpu`.
pub fn gpu_from_offering(
    details: &BTreeMap<String, String>,
    gpucount: Option<u64>,
    gpucardname: Option<&str>,
    vgpuprofile: Option<&str>,
) -> Option<GpuSpec> {
    fn non_empty(s: Option<&str>) -> Option<&str> {
        s.map(str::trim).filter(|s| !s.is_empty())
    }
    let not_passthrough = |s: Option<&str>| {
        s.filter(|s| !s.eq_ignore_ascii_case("passthrough"))
            .map(str::to_string)
    };
    let detail = |key: &str| {
        details
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    };

    let card = non_empty(gpucardname);
    let profile = non_empty(vgpuprofile);
    let newer = match gpucount {
        Some(0) => None,
        Some(n) => Some(n),
        None if card.is_some() || profile.is_some() => Some(1),
        None => None,
    };
    let (count, gpu_type) = if let Some(count) = newer {
        let gpu_type = not_passthrough(profile)
            .or_else(|| card.map(str::to_string))
            .unwrap_or_else(|| "gpu".to_string());
        (count, gpu_type)
    } else {
        let group = detail("pciDevice");
        let vgpu = detail("vgpuType");
        if group.is_none() && vgpu.is_none() {
            return None;
        }
        let gpu_type = not_passthrough(vgpu)
            .or_else(|| group.map(str::to_string))
            .unwrap_or_else(|| "gpu".to_string());
        (1, gpu_type)
    };

    let names = format!("{} {}", gpu_type, card.unwrap_or("")).to_ascii_lowercase();
    let resource_name =
        if names.contains("amd") || names.contains("radeon") || names.contains("instinct") {
            "amd.com/gpu"
        } else if names.contains("intel") {
            "gpu.intel.com/i915"
        } else {
            DEFAULT_GPU_RESOURCE
        };
    Some(GpuSpec {
        resource_name: resource_name.to_string(),
        count,
        gpu_type,
    })
}

/// Kubernetes' name for a CloudStack architecture (`arch` of a VM or template, CloudStack
/// 4.20.1+): `x86_64` → `amd64`, `aarch64` → `arm64`; absent or empty → `amd64` (older
/// CloudStack knows only x86); anything else lower-cased as is.
pub fn kubernetes_arch(cloudstack_arch: Option<&str>) -> String {
    match cloudstack_arch.map(str::trim).unwrap_or("") {
        "" => "amd64".to_string(),
        a if a.eq_ignore_ascii_case("x86_64") || a.eq_ignore_ascii_case("amd64") => {
            "amd64".to_string()
        }
        a if a.eq_ignore_ascii_case("aarch64") || a.eq_ignore_ascii_case("arm64") => {
            "arm64".to_string()
        }
        a => a.to_ascii_lowercase(),
    }
}
