//! providerID parsing: how a Kubernetes node (or an autoscaler fake node) names a VM.

/// The providerID CloudStack's cloud-controller-manager gives a CKS node.
pub fn default_provider_id(vm_id: &str) -> String {
    format!("external-cloudstack://{vm_id}")
}

/// The VM id a providerID names: the part after `://` for `external-cloudstack://<uuid>`,
/// `cloudstack://<uuid>` (any scheme, as the CCM splits on `://`), or the string itself when it
/// has no scheme. Returns `None` for an empty string or an empty id after the scheme.
/// Surrounding whitespace is not trimmed: providerIDs are compared as exact strings.
pub fn vm_id_from_provider_id(provider_id: &str) -> Option<&str> {
    let id = match provider_id.split_once("://") {
        Some((_scheme, id)) => id,
        None => provider_id,
    };
    (!id.is_empty()).then_some(id)
}

/// The annotation the autoscaler puts on the fake nodes it builds for unregistered or failed
/// instances (name = providerID = instance id).
pub const FAKE_NODE_REASON_ANNOTATION: &str = "k8s.io/cluster-autoscaler/fake-node-reason";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_name_vms() {
        let cases = [
            (
                "external-cloudstack://5a1e7c9e-0000-4000-8000-000000000001",
                Some("5a1e7c9e-0000-4000-8000-000000000001"),
            ),
            ("cloudstack://abc", Some("abc")),
            ("anything://abc", Some("abc")),
            ("abc", Some("abc")),
            ("a://b://c", Some("b://c")),
            ("://abc", Some("abc")),
            ("external-cloudstack:/abc", Some("external-cloudstack:/abc")),
            (" external-cloudstack://abc ", Some("abc ")),
            ("external-cloudstack://", None),
            ("://", None),
            ("", None),
        ];
        for (provider_id, expected) in cases {
            assert_eq!(
                vm_id_from_provider_id(provider_id),
                expected,
                "{provider_id:?}"
            );
        }
    }

    #[test]
    fn the_default_provider_id_round_trips() {
        let id = default_provider_id("vm-1");
        assert_eq!(id, "external-cloudstack://vm-1");
        assert_eq!(vm_id_from_provider_id(&id), Some("vm-1"));
    }
}
