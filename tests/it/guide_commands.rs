//! Commands the operations guide tells an operator to run against a cluster, run by the real
//! `kubectl` against a real kube-apiserver (`cks_testkit::kube`) with `--dry-run=server`: the
//! API server parses and admits what the command would create, so a guide command that builds
//! a wrong object (an override that names a field Kubernetes does not have, a volume mounted
//! under another name) fails here instead of on the operator's cluster. Today: the one-off pod
//! that runs `check` from the image (§4).
//!
//! Needs `kubectl` (on PATH, or beside the manifest tools' python) and the API server's
//! binaries: `cks_testkit::tools` sets them up on first use, and the test fails naming what is
//! missing when it cannot.

use cks_testkit::kube::KubeApiServer;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The guide's shell block that starts with `first_line`, its lines continued by `\` joined.
fn guide_command(first_line: &str) -> String {
    let guide =
        std::fs::read_to_string(repo().join("docs/operations.md")).expect("docs/operations.md");
    let start = guide
        .find(first_line)
        .unwrap_or_else(|| panic!("docs/operations.md has no command starting {first_line:?}"));
    let block = &guide[start..];
    let end = block.find("\n```").expect("the command's block ends");
    block[..end].replace("\\\n", " ")
}

/// Splits a command line as `sh` would for the quoting the guide uses (single quotes, plain
/// words); anything else is refused rather than guessed.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '"' | '$' | '`' | '\\' if !quoted => {
                panic!("the guide's command uses {c:?} outside single quotes: {line}")
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    assert!(!quoted, "unbalanced single quote in {line}");
    if in_word {
        out.push(word);
    }
    out
}

#[tokio::test]
async fn the_check_pod_of_the_guide_is_admitted_by_a_real_api_server() {
    let kubectl = cks_testkit::tools::kubectl().unwrap_or_else(|e| panic!("{e}"));
    let kube = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
    // What kube-controller-manager would have made: the namespace's default ServiceAccount,
    // without which a Pod is refused.
    kube.create(
        "/api/v1/namespaces/kube-system/serviceaccounts",
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
    )
    .await
    .expect("create the default ServiceAccount");

    // The namespace enforces the restricted Pod Security level, as the provider's own may: a
    // Pod that breaks it is refused, so the command must hold in such a namespace too.
    let labelled = kube
        .send(
            reqwest::Method::PATCH,
            "/api/v1/namespaces/kube-system",
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
                .to_string(),
        )
        .await
        .expect("label kube-system");
    assert!(
        (200..300).contains(&labelled.status),
        "label kube-system restricted: HTTP {}: {}",
        labelled.status,
        labelled.body
    );

    let line = guide_command("kubectl -n kube-system run cks-check");
    let mut args = words(&line);
    assert_eq!(args.first().map(String::as_str), Some("kubectl"), "{line}");
    args.remove(0);
    // An attached pod removed afterwards cannot be a dry run: what it creates is the same.
    args.retain(|a| a != "--rm" && a != "-i");
    let ca = kube.ca_file();
    let output = Command::new(&kubectl)
        .args(&args)
        .arg("--dry-run=server")
        .arg("-o")
        .arg("json")
        .arg("--server")
        .arg(kube.url())
        .arg("--token")
        .arg(kube.admin_token())
        .arg("--certificate-authority")
        .arg(&ca)
        .env("KUBECONFIG", "/dev/null")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", kubectl.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "kubectl {}\nrefused: {stderr}{stdout}",
        args.join(" ")
    );
    let pod: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("kubectl's answer is no JSON ({e}): {stdout}"));
    let spec = &pod["spec"];
    let container = &spec["containers"][0];
    let arg_list: Vec<&str> = container["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(arg_list.first(), Some(&"check"), "{pod}");
    let config_at = arg_list
        .iter()
        .position(|a| *a == "--cloud-config")
        .and_then(|i| arg_list.get(i + 1))
        .unwrap_or_else(|| panic!("no --cloud-config in {arg_list:?}"));
    assert!(
        arg_list.contains(&"--nodes"),
        "the check pod names no --nodes: {arg_list:?}"
    );
    // The cloud-config the pod reads is the key of the Secret the provider reads, where the
    // pod mounts it.
    let mount = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| {
            m["mountPath"]
                .as_str()
                .is_some_and(|p| config_at.starts_with(&format!("{}/", p.trim_end_matches('/'))))
        })
        .unwrap_or_else(|| panic!("no volume is mounted where {config_at} is: {pod}"));
    let volume = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("the mount names no volume of the pod: {pod}"));
    assert_eq!(volume["secret"]["secretName"], "cloudstack-secret", "{pod}");
    assert!(
        config_at.ends_with("/cloud-config"),
        "the pod reads {config_at}, not the Secret's cloud-config key"
    );
    assert_eq!(pod["spec"]["restartPolicy"], "Never", "{pod}");
}

