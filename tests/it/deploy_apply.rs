//! Every render of `deploy/` applied to a real Kubernetes API server, as `kubectl apply
//! --server-side --dry-run=server` would send it: what the API server itself admits, which no
//! schema check sees (defaulting, cross-field validation, admission, the CRDs' own schemas).
//!
//! The renders are `tools/check_manifests.py`'s, the same streams `deploy_manifests` checks
//! (`--render-only`: every kustomization and Component, the objects of `deploy/kustomize/examples`,
//! each Helm values file, `deploy/examples` included). One API server (`cks_testkit::kube`) takes
//! them all: the namespaces they name are created for real and labelled
//! `pod-security.kubernetes.io/enforce=restricted`, the CustomResourceDefinitions they use
//! (cert-manager's, Prometheus Operator's, from `CKS_KUBE_CRD_DIR`: `tools/kube-testenv/crds.sh`)
//! are created for real and waited on until Established, and then every object is applied with
//! `dryRun=All` and `fieldValidation=Strict`, concurrently. An object passes when the API server
//! accepts it without a warning: PodSecurity admission only warns about a Deployment whose pods
//! a restricted namespace would refuse (k8s.io/pod-security-admission, `admission.go`,
//! `ValidatePodController`; the warn level follows the enforce label when it has none of its own,
//! `api/helpers.go`, `PolicyToEvaluate`), and the warning is what `kubectl apply` prints.
//! PodSecurity is among the admission plugins kube-apiserver 1.33 enables by default
//! (k8s.io/kubernetes `pkg/kubeapiserver/options/plugins.go`); the first control shows it on.
//!
//! Controls, on the same server: a privileged Pod is refused (PodSecurity enforces), a rendered
//! Deployment made privileged and a rendered Certificate given an unknown field are failures of
//! the same check every render goes through.
//!
//! The manifest tools, the API server's binaries and the CRDs are set up on first use
//! (`cks_testkit::tools`); the test fails naming what is missing when they cannot be had. Real
//! time: the API server is a process, every wait a bounded poll of a condition.

use cks_testkit::kube::{KubeApiServer, crd_dir};
use reqwest::Method;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The field manager of every apply.
const FIELD_MANAGER: &str = "cks-deploy-apply";
/// The Pod Security level every target namespace enforces.
const ENFORCE: (&str, &str) = ("pod-security.kubernetes.io/enforce", "restricted");
/// Applies in flight at once (HTTP/2 streams on one connection; the API server is the limit).
const CONCURRENCY: usize = 8;
/// How long a CRD may take to be Established and served (well under a second on loopback).
const CRD_BOUND: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

/// One render: the objects of one kustomization, example file or Helm values file.
struct Render {
    name: String,
    /// The release namespace (Helm) or the kustomization's: where an object without a
    /// namespace of its own lands.
    namespace: String,
    objects: Vec<Value>,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Kubernetes' YAML reader takes `0440` as octal, so this one does too.
fn parse_yaml(text: &str, what: &str) -> Vec<Value> {
    let options = serde_saphyr::options! { legacy_octal_numbers: true };
    serde_saphyr::from_multiple_with_options::<Value>(text, options)
        .unwrap_or_else(|e| panic!("{what}: not YAML: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// The renders, as `tools/check_manifests.py --render-only` writes them (the manifest tools set
/// up on first use; the test fails without them).
fn renders() -> Vec<Render> {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("applied-manifests");
    let index = cks_testkit::tools::render_manifests(&out);
    let sets = index["sets"].as_array().expect("index.json lists its sets");
    let renders: Vec<Render> = sets
        .iter()
        .map(|s| {
            let field = |f: &str| s[f].as_str().unwrap_or_default().to_string();
            let file = out.join(field("file"));
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            Render {
                name: field("name"),
                namespace: field("namespace"),
                objects: parse_yaml(&text, &field("name")),
            }
        })
        .collect();
    assert!(!renders.is_empty(), "nothing rendered: {index}");
    renders
}

/// How the API server serves one kind: its resource (plural) name and whether it is namespaced.
#[derive(Clone, Debug)]
struct Resource {
    plural: String,
    namespaced: bool,
}

/// `(apiVersion, kind)` to the resource that serves it.
type Served = BTreeMap<(String, String), Resource>;

fn api_version(object: &Value) -> &str {
    object["apiVersion"].as_str().unwrap_or_default()
}

fn kind(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// The discovery document of one group version: `/api/v1` or `/apis/GROUP/VERSION`.
fn discovery_path(api_version: &str) -> String {
    if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    }
}

/// Reads discovery for `api_versions` until every `(apiVersion, kind)` of `wanted` is served or
/// the bound passes (a CRD's kind appears in discovery shortly after it is Established).
async fn discover(kube: &KubeApiServer, wanted: &BTreeSet<(String, String)>) -> Served {
    let started = Instant::now();
    loop {
        let mut served = Served::new();
        let versions: BTreeSet<&str> = wanted.iter().map(|(v, _)| v.as_str()).collect();
        for version in versions {
            let path = discovery_path(version);
            let (code, answer) = kube
                .request(Method::GET, &path, None)
                .await
                .unwrap_or_else(|e| panic!("discovery: {e}"));
            if code != 200 {
                continue;
            }
            for r in answer["resources"].as_array().into_iter().flatten() {
                let plural = r["name"].as_str().unwrap_or_default();
                if plural.contains('/') {
                    continue; // a subresource
                }
                served.insert(
                    (
                        version.to_string(),
                        r["kind"].as_str().unwrap_or_default().into(),
                    ),
                    Resource {
                        plural: plural.into(),
                        namespaced: r["namespaced"].as_bool().unwrap_or(false),
                    },
                );
            }
        }
        let missing: Vec<_> = wanted.iter().filter(|w| !served.contains_key(*w)).collect();
        if missing.is_empty() {
            return served;
        }
        assert!(
            started.elapsed() < CRD_BOUND,
            "the API server serves no {missing:?} after {CRD_BOUND:?}: a render uses a kind \
             that is neither built in nor defined by a CRD of {}",
            cks_testkit::tools::KUBE_CRD_DIR_ENV
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The URL path of one object (its namespace: its own, else `default_ns` when namespaced).
fn object_path(object: &Value, resource: &Resource, default_ns: &str) -> String {
    let prefix = discovery_path(api_version(object));
    let name = name(object);
    if resource.namespaced {
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or(default_ns);
        format!("{prefix}/namespaces/{ns}/{}/{name}", resource.plural)
    } else {
        format!("{prefix}/{}/{name}", resource.plural)
    }
}

/// Server-side apply, for real (`dry_run` false) or not.
async fn apply(
    kube: &KubeApiServer,
    path: &str,
    object: &Value,
    dry_run: bool,
) -> cks_testkit::kube::KubeAnswer {
    let query = format!(
        "fieldManager={FIELD_MANAGER}&force=true&fieldValidation=Strict{}",
        if dry_run { "&dryRun=All" } else { "" }
    );
    kube.send(
        Method::PATCH,
        &format!("{path}?{query}"),
        "application/apply-patch+yaml",
        object.to_string(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The check every object goes through: a dry-run apply the API server accepts without a
/// warning. The failure names the render, the object and what the API server said.
async fn check_object(
    kube: &KubeApiServer,
    served: &Served,
    render: &str,
    default_ns: &str,
    object: &Value,
) -> Result<(), String> {
    let key = (api_version(object).to_string(), kind(object).to_string());
    let ns = object["metadata"]["namespace"].as_str();
    let Some(resource) = served.get(&key) else {
        return Err(format!(
            "{render}: {}/{} {}: {} is not served",
            key.1,
            ns.unwrap_or(default_ns),
            name(object),
            key.0
        ));
    };
    let what = if resource.namespaced {
        format!("{}/{}/{}", key.1, ns.unwrap_or(default_ns), name(object))
    } else {
        format!("{}/{} (cluster-scoped)", key.1, name(object))
    };
    let path = object_path(object, resource, default_ns);
    let answer = apply(kube, &path, object, true).await;
    if !(200..300).contains(&answer.status) {
        let message = answer.body["message"]
            .as_str()
            .map_or_else(|| answer.body.to_string(), str::to_string);
        return Err(format!(
            "{render}: {what}: refused, HTTP {}: {message}",
            answer.status
        ));
    }
    if !answer.warnings.is_empty() {
        return Err(format!(
            "{render}: {what}: accepted with warnings: {}",
            answer.warnings.join("; ")
        ));
    }
    Ok(())
}

/// Every namespace the renders put an object in, created (or labelled) for real to enforce the
/// restricted Pod Security level, with the ServiceAccount `default` kube-controller-manager
/// would create there (a Pod naming no account is refused without it).
async fn restricted_namespaces(kube: &KubeApiServer, namespaces: &BTreeSet<String>) {
    for ns in namespaces {
        let namespace = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {ENFORCE.0: ENFORCE.1}},
        });
        let answer = apply(kube, &format!("/api/v1/namespaces/{ns}"), &namespace, false).await;
        assert!(
            (200..300).contains(&answer.status),
            "namespace {ns}: HTTP {}: {}",
            answer.status,
            answer.body
        );
        let account = json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns},
        });
        let path = format!("/api/v1/namespaces/{ns}/serviceaccounts/default");
        let answer = apply(kube, &path, &account, false).await;
        assert!(
            (200..300).contains(&answer.status),
            "ServiceAccount {ns}/default: HTTP {}: {}",
            answer.status,
            answer.body
        );
    }
}

/// Creates every CRD of `dir` for real and waits until each is Established.
async fn create_crds(kube: &KubeApiServer, dir: &Path) -> usize {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut names = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for crd in parse_yaml(&text, &file.display().to_string()) {
            assert_eq!(
                kind(&crd),
                "CustomResourceDefinition",
                "{}: not a CRD",
                file.display()
            );
            let crd_name = name(&crd).to_string();
            let path =
                format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}");
            let answer = apply(kube, &path, &crd, false).await;
            assert!(
                (200..300).contains(&answer.status),
                "CRD {crd_name} ({}): HTTP {}: {}",
                file.display(),
                answer.status,
                answer.body
            );
            names.push((crd_name, path));
        }
    }
    let started = Instant::now();
    for (crd_name, path) in &names {
        loop {
            let (_, crd) = kube
                .request(Method::GET, path, None)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let established = crd["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Established" && c["status"] == "True");
            if established {
                break;
            }
            assert!(
                started.elapsed() < CRD_BOUND,
                "CRD {crd_name} not Established after {CRD_BOUND:?}: {}",
                crd["status"]
            );
            tokio::time::sleep(POLL).await;
        }
    }
    names.len()
}

/// The first object of `kind` in the renders (for the controls, which break a real one).
fn first_of<'a>(renders: &'a [Render], kind_: &str) -> (&'a Render, &'a Value) {
    renders
        .iter()
        .flat_map(|r| r.objects.iter().map(move |o| (r, o)))
        .find(|(_, o)| kind(o) == kind_)
        .unwrap_or_else(|| panic!("no {kind_} in any render"))
}

/// The operator's examples (`deploy/examples/*.yaml`, Helm values files) are among the renders,
/// so that each is applied below: their renders are named `helm-deploy-examples-FILE`.
fn assert_examples_rendered(renders: &[Render]) {
    let dir = repo().join("deploy/examples");
    let mut examples = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("deploy/examples entry").path();
        if path.extension().is_none_or(|x| x != "yaml") {
            continue;
        }
        examples += 1;
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        let want = format!("helm-deploy-examples-{stem}");
        assert!(
            renders
                .iter()
                .any(|r| r.name == want && !r.objects.is_empty()),
            "{} was not rendered (no render {want})",
            path.display()
        );
    }
    assert!(
        examples >= 3,
        "deploy/examples holds {examples} values files"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_render_is_accepted_by_a_real_api_server_in_restricted_namespaces() {
    let renders = renders();
    assert_examples_rendered(&renders);
    let crds = crd_dir().unwrap_or_else(|e| panic!("{e}"));
    let kube = KubeApiServer::start()
        .await
        .unwrap_or_else(|e| panic!("the Kubernetes API server did not start: {e}"));
    let started = Instant::now();
    let crd_count = create_crds(&kube, &crds).await;

    let wanted: BTreeSet<(String, String)> = renders
        .iter()
        .flat_map(|r| &r.objects)
        .map(|o| (api_version(o).to_string(), kind(o).to_string()))
        .chain([("v1".to_string(), "Pod".to_string())])
        .collect();
    let served = Arc::new(discover(&kube, &wanted).await);
    let namespaces: BTreeSet<String> = renders
        .iter()
        .flat_map(|r| {
            r.objects
                .iter()
                .filter_map(|o| o["metadata"]["namespace"].as_str().map(str::to_string))
                .chain([r.namespace.clone()])
        })
        .collect();
    restricted_namespaces(&kube, &namespaces).await;

    // Control: PodSecurity enforces in these namespaces (were it off, or only warning, every
    // check below would pass vacuously). The violation is one only the restricted level
    // forbids, and one the Pod's own validation lets through (`privileged: true` is refused by
    // validation first, on an API server without --allow-privileged).
    let ns = namespaces.iter().next().expect("a namespace");
    let escalating_pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "escalating-control", "namespace": ns},
        "spec": {"containers": [{
            "name": "c", "image": "registry.example.com/control:1",
            "securityContext": {"allowPrivilegeEscalation": true},
        }]},
    });
    let refused = check_object(&kube, &served, "control", ns, &escalating_pod).await;
    let message = refused.expect_err("a Pod allowing privilege escalation was accepted");
    assert!(
        message.contains("HTTP 403")
            && message.contains("violates PodSecurity \"restricted")
            && message.contains("allowPrivilegeEscalation"),
        "a Pod allowing privilege escalation was refused, but not by PodSecurity: {message}"
    );

    // Control: a rendered Deployment whose pods a restricted namespace would refuse is a
    // failure of the check (PodSecurity only warns about a Deployment).
    let (render, deployment) = first_of(&renders, "Deployment");
    let mut broken = deployment.clone();
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] =
        json!(true);
    let caught = check_object(&kube, &served, &render.name, &render.namespace, &broken).await;
    let message = caught.expect_err("a Deployment allowing privilege escalation passed the check");
    assert!(
        message.contains(&format!(
            "Deployment/{}/{}",
            render.namespace,
            name(deployment)
        )) && message.contains("would violate PodSecurity")
            && message.contains("allowPrivilegeEscalation"),
        "the broken Deployment's failure does not name it and PodSecurity: {message}"
    );

    // Control: a rendered Certificate with a field its CRD does not define is refused (the
    // CRD's schema is in force, fieldValidation=Strict).
    let (render, certificate) = first_of(&renders, "Certificate");
    let mut broken = certificate.clone();
    broken["spec"]["notAField"] = json!(true);
    let caught = check_object(&kube, &served, &render.name, &render.namespace, &broken).await;
    let message = caught.expect_err("a Certificate with an unknown field passed the check");
    assert!(
        message.contains("notAField") && message.contains(&render.name),
        "the broken Certificate's failure does not name the field and the render: {message}"
    );

    // Every object of every render, CONCURRENCY at a time.
    let kube = Arc::new(kube);
    let semaphore = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    let mut objects = 0;
    for render in &renders {
        for object in &render.objects {
            objects += 1;
            let (kube, served, semaphore) = (kube.clone(), served.clone(), semaphore.clone());
            let (name, ns, object) = (
                render.name.clone(),
                render.namespace.clone(),
                object.clone(),
            );
            tasks.spawn(async move {
                let _permit = semaphore.acquire_owned().await.expect("semaphore");
                check_object(&kube, &served, &name, &ns, &object).await
            });
        }
    }
    let mut failures = Vec::new();
    while let Some(result) = tasks.join_next().await {
        if let Err(e) = result.expect("an apply task panicked") {
            failures.push(e);
        }
    }
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} of {objects} objects not accepted by the API server:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "deploy_apply: {objects} objects of {} renders accepted (dry-run) in namespaces {:?} \
         enforcing restricted, after {crd_count} CRDs, in {:?}",
        renders.len(),
        namespaces,
        started.elapsed()
    );
}
