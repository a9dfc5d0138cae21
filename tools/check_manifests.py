#!/usr/bin/env python3
"""Render every manifest under deploy/ with the real tools and check what they render.

- Every kustomization under deploy/kustomize is built with `kubectl kustomize`; every kustomize
  Component is built on top of the base.
- The Helm chart is linted (`helm lint --strict`, for the oldest and the newest Kubernetes minor
  supported) and rendered by Helm itself (helm-python-sdk: Helm v4's Go SDK as a library) for
  each values file in deploy/helm/cks-autoscaler-provider/ci/, deploy/helm/examples/ and
  deploy/examples/ (the operator's examples, one per common case). Each render also goes through `kubectl kustomize`, as a Helm post-renderer would take it. A values
  file's line `# render: release=R namespace=N` names the release and namespace it is rendered
  as (default: cks-autoscaler-provider in kube-system); `on=FILE` there makes it an overlay,
  rendered on top of FILE of the same directory as `helm -f FILE -f OVERLAY` merges them. Values
  the chart must refuse are rendered too, and must fail with the reason.
- The objects of deploy/kustomize/examples are validated as written.
- Every rendered YAML stream is read with a loader that refuses duplicate mapping keys.
- Every object is validated with kubernetes-validate --strict against the oldest and the newest
  Kubernetes minor supported (the minors the chart lists an autoscaler release for, which the
  README's supported-releases table repeats); cert-manager and Prometheus Operator objects,
  which have no Kubernetes schema, against the models generated from those projects' CRDs
  (cloudcoil), refusing fields the CRDs do not define.

The rendered streams are written to --out (one file per kustomization or values file, the
NOTES.txt of each Helm render beside it, and index.json listing them and the refusals, with the values refused and Helm's message) for
tests/it/deploy_manifests.rs, which checks what no tool checks: that
the files agree with each other (ports, Secret keys, certificate names and DNS names, the
cloud-config the autoscaler reads).

With --render-only the same streams and index.json are written, without linting or validating
(nor the refusals): what tests/it/deploy_apply.rs applies to a real API server, in a few seconds.

Exit status: 0 all good, 1 problems found (listed), 3 a tool is missing (nothing checked).
Install the tools with tools/install-manifest-tools.sh.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

EXIT_PROBLEMS = 1
EXIT_TOOLS_MISSING = 3

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "cks-autoscaler-provider"
KUSTOMIZE = REPO / "deploy" / "kustomize"
# Each directory of values files, and the word its renders are named by (helm-WORD-FILE).
HELM_VALUE_DIRS = [
    (CHART / "ci", "ci"),
    (REPO / "deploy" / "helm" / "examples", "examples"),
    (REPO / "deploy" / "examples", "deploy-examples"),
]
DEFAULT_RELEASE = "cks-autoscaler-provider"
DEFAULT_NAMESPACE = "kube-system"

# Values the chart must refuse at render time, and a phrase its message must contain: the same
# setups `serve` refuses, caught before anything is applied. Each but the image's own names an
# image, so that it is refused for its own reason.
IMAGE = {"repository": "registry.example.com/platform/cks-autoscaler-provider"}
ONE_CLUSTER = [{"min": 1, "max": 3, "cluster": "a"}]
MUST_FAIL = [
    ("no cluster", {"image": IMAGE}, "at least one entry in `nodes`"),
    (
        "two clusters, one without a client",
        {"image": IMAGE, "nodes": [{"min": 1, "max": 3, "cluster": "a", "client": "x"}, {"min": 1, "max": 3, "cluster": "b"}]},
        "client binding",
    ),
    (
        "two clusters without client certificates",
        {
            "image": IMAGE,
            "nodes": [
                {"min": 1, "max": 3, "cluster": "a", "client": "x"},
                {"min": 1, "max": 3, "cluster": "b", "client": "y"},
            ],
            "tls": {"enabled": False},
        },
        "tls.enabled=true",
    ),
    (
        "a client that is no DNS name",
        {"image": IMAGE, "nodes": [{"min": 1, "max": 3, "cluster": "a", "client": "Prod_A"}]},
        "not a lowercase DNS name",
    ),
    (
        "a central provider nothing may reach",
        {"image": IMAGE, "nodes": ONE_CLUSTER, "autoscaler": {"enabled": False}},
        "networkPolicy.extraGrpcClients",
    ),
    (
        "a workload cluster without the provider's address",
        {"provider": {"enabled": False}},
        "autoscaler.providerAddress",
    ),
    (
        "a workload cluster without TLS",
        {"provider": {"enabled": False}, "autoscaler": {"providerAddress": "p.example.com:8086"}, "tls": {"enabled": False}},
        "mutual TLS",
    ),
    (
        "a state claim with the ConfigMap store",
        {"image": IMAGE, "nodes": ONE_CLUSTER, "stateFile": {"existingClaim": "state"}},
        "stateStore=file",
    ),
    (
        "an unknown state store",
        {"image": IMAGE, "nodes": ONE_CLUSTER, "stateStore": "lease"},
        "configmap (the default), file or none",
    ),
    (
        "an existing ServiceAccount without its name",
        {"image": IMAGE, "nodes": ONE_CLUSTER, "autoscaler": {"serviceAccount": {"create": False}}},
        "autoscaler.serviceAccount.name",
    ),
    (
        "a Kubernetes minor given as a number",
        {"image": IMAGE, "nodes": ONE_CLUSTER, "autoscaler": {"kubernetesMinor": 1.3}},
        "quoted string",
    ),
    (
        "a Kubernetes minor without a release",
        {"image": IMAGE, "nodes": ONE_CLUSTER, "autoscaler": {"kubernetesMinor": "1.20"}},
        "no cluster-autoscaler release is listed",
    ),
    (
        "alerts on a job no ServiceMonitor gives",
        {"image": IMAGE, "nodes": ONE_CLUSTER, "prometheusRule": {"enabled": True}},
        "serviceMonitor.enabled",
    ),
    (
        "a provider flag the chart sets, in extraArgs",
        {"image": IMAGE, "nodes": ONE_CLUSTER, "extraArgs": {"max-node-provision-time": "40m"}},
        "extraArgs sets --max-node-provision-time",
    ),
    (
        "an autoscaler flag the chart sets, in the list form of extraArgs",
        {"image": IMAGE, "nodes": ONE_CLUSTER, "autoscaler": {"extraArgs": ["--max-node-provision-time=40m"]}},
        "autoscaler.extraArgs sets --max-node-provision-time",
    ),
    ("no provider image", {"nodes": ONE_CLUSTER}, "image.repository is required"),
    (
        "a provider image repository with its tag",
        {"image": {"repository": IMAGE["repository"] + ":0.1.0"}, "nodes": ONE_CLUSTER},
        "carries a tag or a digest",
    ),
    (
        "a provider image digest that is no digest",
        {"image": {**IMAGE, "digest": "0.1.0"}, "nodes": ONE_CLUSTER},
        "image.digest",
    ),
]


class ToolsMissing(Exception):
    pass


def load_tools(render_only: bool = False) -> dict[str, Any]:
    """The Python tools, imported; ToolsMissing names the first one absent. To render only,
    the validators are left out (importing the CRD models alone takes seconds)."""
    tools: dict[str, Any] = {"kv": None, "crd_models": {}}
    try:
        import yaml  # noqa: PLC0415

        tools["yaml"] = yaml
        import helm_python  # noqa: PLC0415

        tools["helm"] = helm_python
        if render_only:
            return tools
        import kubernetes_validate  # noqa: PLC0415
        import kubernetes_validate.utils  # noqa: PLC0415

        # validate() reads its schema files again for every object; they never change.
        kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)
        tools["kv"] = kubernetes_validate
        from cloudcoil.models.cert_manager import v1 as cert_manager  # noqa: PLC0415
        from cloudcoil.models.prometheus_operator import v1 as monitoring_v1  # noqa: PLC0415

        tools["crd_models"] = {
            ("cert-manager.io/v1", "Certificate"): cert_manager.Certificate,
            ("cert-manager.io/v1", "Issuer"): cert_manager.Issuer,
            ("cert-manager.io/v1", "ClusterIssuer"): cert_manager.ClusterIssuer,
            ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring_v1.ServiceMonitor,
            ("monitoring.coreos.com/v1", "PrometheusRule"): monitoring_v1.PrometheusRule,
        }
    except ImportError as e:
        raise ToolsMissing(f"Python module {e.name} is not installed") from e
    return tools


def find_kubectl() -> str:
    candidates = [os.environ.get("KUBECTL"), shutil.which("kubectl"), str(Path(sys.executable).parent / "kubectl")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise ToolsMissing("kubectl is not installed (nor $KUBECTL set)")


# --- YAML that refuses duplicate keys ------------------------------------------------------------


def strict_loader(yaml: Any) -> Any:
    class StrictLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first at line {seen[key].line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return StrictLoader


class Checker:
    def __init__(self, tools: dict[str, Any], kubectl: str, out: Path, render_only: bool = False) -> None:
        self.yaml = tools["yaml"]
        self.helm = tools["helm"]
        self.kv = tools["kv"]
        self.crd_models = tools["crd_models"]
        self.loader = strict_loader(self.yaml)
        self.kubectl = kubectl
        self.out = out
        self.render_only = render_only
        self.problems: list[str] = []
        self.index: list[dict[str, str]] = []
        self.refusals: list[dict[str, Any]] = []
        self.objects = 0
        self.minors = self.supported_minors()

    def problem(self, text: str) -> None:
        self.problems.append(text)
        print(f"FAIL {text}", flush=True)

    def load_all(self, text: str, where: str) -> list[Any] | None:
        try:
            return [d for d in self.yaml.load_all(text, Loader=self.loader) if d is not None]
        except self.yaml.YAMLError as e:
            self.problem(f"{where}: not valid YAML for a strict reader: {e}")
            return None

    def supported_minors(self) -> list[str]:
        """The oldest and the newest Kubernetes minor the chart has an autoscaler release for."""
        values = self.yaml.load((CHART / "values.yaml").read_text(), Loader=self.loader)
        minors = sorted(values["autoscaler"]["image"]["tagByKubernetesMinor"], key=lambda m: tuple(int(x) for x in m.split(".")))
        if self.render_only:
            return [minors[0], minors[-1]]
        supported = self.kv.utils.all_versions()
        for m in (minors[0], minors[-1]):
            if not any(v.startswith(m + ".") for v in supported):
                raise ToolsMissing(f"kubernetes-validate has no schemas for Kubernetes {m}: upgrade it in tools/requirements.txt")
        return [minors[0], minors[-1]]

    # --- kustomize ----------------------------------------------------------------------------

    def kustomize(self, directory: Path) -> tuple[str | None, str]:
        run = subprocess.run([self.kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False)
        if run.returncode != 0:
            return None, run.stderr.strip() or run.stdout.strip()
        return run.stdout, ""

    def kustomizations(self) -> None:
        base = KUSTOMIZE / "base"
        for k in sorted(KUSTOMIZE.rglob("kustomization.yaml")):
            directory = k.parent
            rel = directory.relative_to(KUSTOMIZE)
            name = "kustomize-" + "-".join(rel.parts)
            doc = self.load_all(k.read_text(), str(k.relative_to(REPO)))
            if not doc:
                continue
            if doc[0].get("kind") == "Component":
                # A component is built on the base, as an overlay would include it.
                with tempfile.TemporaryDirectory() as tmp:
                    (Path(tmp) / "kustomization.yaml").write_text(
                        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                        f"resources:\n  - {os.path.relpath(base, tmp)}\n"
                        f"components:\n  - {os.path.relpath(directory, tmp)}\n"
                    )
                    rendered, err = self.kustomize(Path(tmp))
                how = f"kubectl kustomize (base + {rel})"
            else:
                rendered, err = self.kustomize(directory)
                how = f"kubectl kustomize {rel}"
            if rendered is None:
                self.problem(f"{how}: {err}")
                continue
            self.check_and_write(name, "kustomize", rendered, how, str(rel), DEFAULT_NAMESPACE, "")

    def examples(self) -> None:
        """Objects the operator creates by hand (deploy/kustomize/examples), validated as written."""
        for path in sorted((KUSTOMIZE / "examples").glob("*.yaml")):
            rel = str(path.relative_to(REPO))
            self.check_and_write(f"example-{path.stem}", "example", path.read_text(), rel, rel, DEFAULT_NAMESPACE, "")

    # --- Helm ---------------------------------------------------------------------------------

    @staticmethod
    def render_header(text: str) -> dict[str, str]:
        match = re.search(r"^# render:(.*)$", text, re.MULTILINE)
        pairs = dict(p.split("=", 1) for p in match.group(1).split()) if match else {}
        return {
            "release": pairs.get("release", DEFAULT_RELEASE),
            "namespace": pairs.get("namespace", DEFAULT_NAMESPACE),
            "on": pairs.get("on", ""),
        }

    def values_of(self, path: Path) -> dict[str, Any]:
        """A values file's values; an overlay's (`on=FILE` in its render line) merged on top of
        FILE's, as `helm -f FILE -f OVERLAY` merges them."""
        text = path.read_text()
        values = self.yaml.load(text, Loader=self.loader) or {}
        under = self.render_header(text)["on"]
        if under:
            values = helm_merge(self.values_of(path.parent / under), values)
        return values

    def lint(self, values: dict[str, Any], namespace: str, where: str) -> None:
        if self.render_only:
            return
        for minor in self.minors:
            report = self.helm.lint(CHART, values, strict=True, namespace=namespace, kube_version=f"v{minor}.0")
            for m in report.get("messages", []):
                if m.get("severity", 0) >= 2:
                    self.problem(f"helm lint --strict --kube-version {minor} -f {where}: {m.get('path')}: {m.get('error')}")
            for e in report.get("errors", []):
                self.problem(f"helm lint --strict --kube-version {minor} -f {where}: {e}")

    def helm_sets(self) -> None:
        chart = self.helm.Chart.load(CHART)
        try:
            for directory, word in HELM_VALUE_DIRS:
                for path in sorted(directory.glob("*.yaml")):
                    where = str(path.relative_to(REPO))
                    text = path.read_text()
                    header = self.render_header(text)
                    values = self.values_of(path)
                    origin = where
                    if header["on"]:
                        where = f"{path.parent.relative_to(REPO) / header['on']} -f {where}"
                    self.lint(values, header["namespace"], where)
                    try:
                        rendered = chart.render(values=values, name=header["release"], namespace=header["namespace"], is_install=True)
                    except self.helm.HelmError as e:
                        self.problem(f"helm template -f {where}: {e}")
                        continue
                    parts = []
                    for template, manifest in sorted(rendered.items()):
                        if template.endswith("NOTES.txt") or not manifest.strip():
                            continue
                        if self.load_all(manifest, f"helm template -f {where}: {template}") is None:
                            continue
                        parts.append(f"# Source: {template}\n{manifest.strip()}\n")
                    stream = "---\n".join(parts)
                    name = f"helm-{word}-{path.stem.removesuffix('-values')}"
                    self.post_render(stream, where)
                    self.check_and_write(name, "helm", stream, f"helm template -f {where}", origin, header["namespace"], header["release"])
                    if self.index and self.index[-1]["name"] == name:
                        # The values rendered (an overlay's merged on its base file's), and what
                        # `helm install` prints after it (tests/it/guide_commands.rs runs its commands).
                        self.index[-1]["values"] = values
                        notes = "".join(m for t, m in rendered.items() if t.endswith("NOTES.txt"))
                        (self.out / f"{name}.notes.txt").write_text(notes)
                        self.index[-1]["notes"] = f"{name}.notes.txt"
            for what, values, phrase in [] if self.render_only else MUST_FAIL:
                refusal = {"what": what, "values": values, "refused": False, "message": ""}
                self.refusals.append(refusal)
                try:
                    chart.render(values=values, name=DEFAULT_RELEASE, namespace=DEFAULT_NAMESPACE, is_install=True)
                    self.problem(f"helm template with {what}: rendered; the chart must refuse it ({phrase})")
                except self.helm.HelmError as e:
                    refusal.update(refused=True, message=str(e))
                    if phrase not in str(e):
                        self.problem(f"helm template with {what}: refused without saying {phrase!r}: {e}")
        finally:
            chart.close()

    def post_render(self, stream: str, where: str) -> None:
        """The render as `helm --post-renderer` hands it to kustomize."""
        if self.render_only:
            return
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "all.yaml").write_text(stream)
            (Path(tmp) / "kustomization.yaml").write_text("resources:\n  - all.yaml\n")
            rendered, err = self.kustomize(Path(tmp))
        if rendered is None:
            self.problem(f"helm template -f {where} | kubectl kustomize (a post-renderer): {err}")

    # --- validation ---------------------------------------------------------------------------

    def check_and_write(self, name: str, source: str, stream: str, how: str, origin: str, namespace: str, release: str) -> None:
        docs = self.load_all(stream, how)
        if docs is None:
            return
        before = len(self.problems)
        if any(s["name"] == name for s in self.index):
            self.problem(f"{how}: renders as {name}, the name of another render")
            return
        for doc in [] if self.render_only else docs:
            self.validate(doc, how)
        self.objects += len(docs)
        file = f"{name}.yaml"
        (self.out / file).write_text(stream)
        self.index.append({"name": name, "source": source, "file": file, "origin": origin, "namespace": namespace, "release": release})
        if self.render_only:
            print(f"rendered {how}: {len(docs)} objects", flush=True)
        elif len(self.problems) == before:
            print(f"ok   {how}: {len(docs)} objects valid for Kubernetes {' and '.join(self.minors)}", flush=True)

    def validate(self, doc: Any, how: str) -> None:
        if not isinstance(doc, dict):
            self.problem(f"{how}: a document is not a mapping: {doc!r}")
            return
        kind, api = doc.get("kind"), doc.get("apiVersion")
        what = f"{how}: {kind} {doc.get('metadata', {}).get('name')}"
        model = self.crd_models.get((api, kind))
        if model is not None:
            self.validate_crd(doc, model, what)
            return
        for minor in self.minors:
            try:
                self.kv.validate(doc, f"{minor}.0", strict=True)
            except self.kv.utils.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                self.problem(f"{what}: invalid for Kubernetes {minor} (kubernetes-validate --strict): {path}: {e.message}")
            except self.kv.utils.SchemaNotFoundError as e:
                self.problem(f"{what}: {e.message}")

    def validate_crd(self, doc: dict[str, Any], model: Any, what: str) -> None:
        import pydantic  # noqa: PLC0415 (a dependency of cloudcoil)

        try:
            parsed = model.model_validate(doc)
        except pydantic.ValidationError as e:
            self.problem(f"{what}: invalid for its CRD: {e}")
            return
        known = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
        for path in unknown_fields(doc, known, ""):
            self.problem(f"{what}: {path} is not a field of its CRD")

    def run(self) -> int:
        self.kustomizations()
        self.examples()
        self.helm_sets()
        (self.out / "index.json").write_text(json.dumps({"minors": self.minors, "sets": self.index, "refusals": self.refusals}, indent=1))
        print(
            f"manifest check: {len(self.index)} renders, {self.objects} objects, "
            f"{len(self.refusals)} refusals, {len(self.problems)} problems",
            flush=True,
        )
        return EXIT_PROBLEMS if self.problems else 0


def helm_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Two values files as `helm -f base -f over` merges them (Helm's pkg/cli/values,
    `mergeMaps`): a mapping in both is merged key by key, anything else (a list, a scalar, a
    mapping over a non-mapping) is replaced whole by the later file's."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = value
    return out


def render_cases(checker: Checker, spec: Path, out: Path) -> int:
    """Renders the chart once per case of `spec` (a JSON list of {name, values, and optionally
    files, release and namespace}) and writes, for each, whether Helm refused it (and its
    message) or the rendered stream, NOTES.txt and the problems validation found in it, to
    `out` (JSON). `files` are values files merged in order before `values`, as `helm -f a -f b
    --set ...` merges them. For tests/it/deploy_habits.rs, which gives values of its own rather
    than files."""
    cases = json.loads(spec.read_text())
    chart = checker.helm.Chart.load(CHART)
    results = []
    try:
        for case in cases:
            result: dict[str, Any] = {"name": case["name"], "refused": False, "message": "", "stream": "", "problems": []}
            results.append(result)
            how = f"helm template ({case['name']})"
            values: dict[str, Any] = {}
            for file in case.get("files", []):
                values = helm_merge(values, checker.yaml.load(Path(file).read_text(), Loader=checker.loader) or {})
            values = helm_merge(values, case.get("values", {}))
            try:
                rendered = chart.render(
                    values=values,
                    name=case.get("release", DEFAULT_RELEASE),
                    namespace=case.get("namespace", DEFAULT_NAMESPACE),
                    is_install=True,
                )
            except checker.helm.HelmError as e:
                result.update(refused=True, message=str(e))
                continue
            parts = [
                f"# Source: {template}\n{manifest.strip()}\n"
                for template, manifest in sorted(rendered.items())
                if not template.endswith("NOTES.txt") and manifest.strip()
            ]
            stream = "---\n".join(parts)
            notes = "".join(m for t, m in rendered.items() if t.endswith("NOTES.txt"))
            before = len(checker.problems)
            for doc in checker.load_all(stream, how) or []:
                checker.validate(doc, how)
            result.update(stream=stream, notes=notes, problems=checker.problems[before:])
    finally:
        chart.close()
    out.write_text(json.dumps(results, indent=1))
    return 0


def unknown_fields(given: Any, known: Any, path: str) -> list[str]:
    """Paths present in `given` that the model dropped while parsing it."""
    if isinstance(given, dict) and isinstance(known, dict):
        out = []
        for key, value in given.items():
            if key not in known:
                out.append(f"{path}.{key}")
            else:
                out.extend(unknown_fields(value, known[key], f"{path}.{key}"))
        return out
    if isinstance(given, list) and isinstance(known, list):
        return [p for i, (g, k) in enumerate(zip(given, known)) for p in unknown_fields(g, k, f"{path}[{i}]")]
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "target" / "rendered-manifests", help="where the rendered streams go")
    parser.add_argument("--render", type=Path, help="render only the cases of this JSON file (values given inline), see render_cases")
    parser.add_argument("--render-out", type=Path, help="with --render: where the results go (JSON)")
    parser.add_argument("--render-only", action="store_true", help="render and write, without linting or validating")
    args = parser.parse_args()
    try:
        tools = load_tools(args.render_only)
        kubectl = find_kubectl()
    except ToolsMissing as e:
        print(f"manifest tools missing: {e}; install them with tools/install-manifest-tools.sh", file=sys.stderr)
        return EXIT_TOOLS_MISSING
    args.out.mkdir(parents=True, exist_ok=True)
    # --render writes only its JSON: the renders another run left in --out stay.
    for old in [] if args.render else [*args.out.glob("*.yaml"), *args.out.glob("*.notes.txt")]:
        old.unlink()
    try:
        checker = Checker(tools, kubectl, args.out, args.render_only)
    except ToolsMissing as e:
        print(f"manifest tools missing: {e}", file=sys.stderr)
        return EXIT_TOOLS_MISSING
    if args.render:
        if not args.render_out:
            parser.error("--render needs --render-out")
        return render_cases(checker, args.render, args.render_out)
    return checker.run()


if __name__ == "__main__":
    sys.exit(main())
