"""Render deploy/kubernetes with `kubectl kustomize` and check objects against their API schema.

There is no cluster here. Kubernetes' own kinds are checked by the official client's models
(pydantic, unknown fields refused); the Prometheus Operator's kinds (PrometheusRule,
ServiceMonitor, AlertmanagerConfig) by cloudcoil's models generated from the operator's CRDs,
which check types, enums and patterns; a field those models do not know is dropped on the way
through, as the API server prunes it, so a field missing from the round trip is reported as
unknown.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
EXAMPLE = KUBERNETES / "overlays" / "example"
OPERATOR_GROUP = "monitoring.coreos.com"
GATEWAY_GROUP = "gateway.networking.k8s.io"
# HTTPRoute (gateway.networking.k8s.io/v1) fields the shipped route may use, with their types and
# enums from the Gateway API's v1 CRD: no Python models of the Gateway API install here, so the
# route is checked against this subset (a field outside it is reported, not passed)
HTTP_ROUTE_FIELDS = {"parentRefs", "hostnames", "rules"}
PARENT_REF_FIELDS = {"group", "kind", "namespace", "name", "sectionName", "port"}
RULE_FIELDS = {"matches", "backendRefs"}
MATCH_FIELDS = {"path", "method", "headers", "queryParams"}
PATH_TYPES = {"Exact", "PathPrefix", "RegularExpression"}
METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
BACKEND_FIELDS = {"group", "kind", "namespace", "name", "port", "weight"}


def kustomize(directory: Path) -> list[dict]:
    """`kubectl kustomize <directory>`, as a list of objects."""
    import yaml

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomize overlays cannot be rendered here")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def with_component(component: Path, workdir: Path, *, overlay: Path = EXAMPLE) -> Path:
    """A kustomization in ``workdir`` applying ``component`` to ``overlay``, as a team would."""
    workdir.mkdir(parents=True, exist_ok=True)
    # kustomize takes relative paths only
    resource = os.path.relpath(overlay.resolve(), workdir.resolve())
    used = os.path.relpath(component.resolve(), workdir.resolve())
    (workdir / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"namespace: inference\nresources: [{resource}]\ncomponents: [{used}]\n"
    )
    return workdir


def renderable() -> list[tuple[str, Path]]:
    """Every directory to render: the base, each overlay, each component (on the example), and
    each set of rights granted in another namespace (rbac/)."""
    found = [("base", KUBERNETES / "base")]
    for kind in ("overlays", "components", "rbac"):
        for directory in sorted((KUBERNETES / kind).iterdir()):
            if (directory / "kustomization.yaml").exists():
                found.append((f"{kind}/{directory.name}", directory))
    return found


def render(name: str, directory: Path, workdir: Path) -> list[dict]:
    """Render one of ``renderable()``: a component is applied to the example overlay."""
    if name.startswith("components/"):
        return kustomize(with_component(directory, workdir / name.replace("/", "-")))
    return kustomize(directory)


def kubernetes_model(obj: dict) -> type:
    """The official Kubernetes client's model class for an object (V1Deployment for apps/v1)."""
    client = pytest.importorskip(
        "kubernetes.client", reason="the `kubernetes` client (a dev dependency) checks the schema"
    )
    cls = getattr(client, obj["apiVersion"].split("/")[-1].capitalize() + obj["kind"], None)
    assert cls is not None, f"no Kubernetes model for {obj['apiVersion']} {obj['kind']}"
    if getattr(cls, "model_config", {}).get("extra") != "forbid":
        pytest.skip("kubernetes>=37 is needed: its models are pydantic and refuse unknown fields")
    return cls


def operator_model(obj: dict) -> type:
    """cloudcoil's model for a monitoring.coreos.com object (its version module, its kind)."""
    models = pytest.importorskip(
        "cloudcoil.models.prometheus_operator",
        reason="cloudcoil-models-prometheus-operator (a dev dependency) checks the CRD schemas",
    )
    version = obj["apiVersion"].split("/")[-1]
    cls = getattr(getattr(models, version, None), obj["kind"], None)
    assert cls is not None, f"no Prometheus Operator model for {obj['apiVersion']} {obj['kind']}"
    return cls


def dropped_fields(given: object, kept: object, where: str = "") -> list[str]:
    """Paths present in ``given`` that the model's round trip ``kept`` no longer has."""
    if isinstance(given, dict) and isinstance(kept, dict):
        missing = [f"{where}{key}" for key in given if key not in kept]
        return missing + [
            path
            for key in given
            if key in kept
            for path in dropped_fields(given[key], kept[key], f"{where}{key}.")
        ]
    if isinstance(given, list) and isinstance(kept, list):
        return [
            path
            for i, (a, b) in enumerate(zip(given, kept, strict=False))
            for path in dropped_fields(a, b, f"{where}{i}.")
        ]
    return []


def schema_problems(objects: list[dict]) -> list[str]:
    """Every object checked against its API schema: unknown fields, types, required, enums."""
    from pydantic import ValidationError

    problems = []
    for obj in objects:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        operator = str(obj.get("apiVersion", "")).startswith(OPERATOR_GROUP + "/")
        if str(obj.get("apiVersion", "")).startswith(GATEWAY_GROUP + "/"):
            problems += [f"{name}: {p}" for p in http_route_problems(obj)]
            continue
        model = operator_model(obj) if operator else kubernetes_model(obj)
        try:
            parsed = model.model_validate(obj)
        except ValidationError as exc:
            for error in exc.errors():
                where = ".".join(str(part) for part in error["loc"])
                problems.append(f"{name}: {where}: {error['msg']}")
            continue
        if operator:
            kept = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
            problems += [f"{name}: {path}: unknown field" for path in dropped_fields(obj, kept)]
    return problems


def http_route_problems(obj: dict) -> list[str]:
    """An HTTPRoute checked against HTTP_ROUTE_FIELDS and the rest of the subset above."""
    spec = obj.get("spec", {})
    problems = [f"spec.{k}: unknown field" for k in set(spec) - HTTP_ROUTE_FIELDS]
    if obj.get("kind") != "HTTPRoute" or obj.get("apiVersion") != f"{GATEWAY_GROUP}/v1":
        problems.append("only HTTPRoute of gateway.networking.k8s.io/v1 is checked here")
    for i, ref in enumerate(spec.get("parentRefs") or [None]):
        if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
            problems.append(f"spec.parentRefs.{i}: a parent needs a name")
            continue
        problems += [
            f"spec.parentRefs.{i}.{k}: unknown field" for k in set(ref) - PARENT_REF_FIELDS
        ]
    for i, rule in enumerate(spec.get("rules", [])):
        where = f"spec.rules.{i}"
        problems += [f"{where}.{k}: unknown field" for k in set(rule) - RULE_FIELDS]
        for j, match in enumerate(rule.get("matches", [])):
            problems += [
                f"{where}.matches.{j}.{k}: unknown field" for k in set(match) - MATCH_FIELDS
            ]
            path = match.get("path", {})
            if path.get("type", "PathPrefix") not in PATH_TYPES or not str(
                path.get("value", "/")
            ).startswith("/"):
                problems.append(f"{where}.matches.{j}.path: {path}")
            if "method" in match and match["method"] not in METHODS:
                problems.append(f"{where}.matches.{j}.method: {match['method']!r}")
        for j, backend in enumerate(rule.get("backendRefs", [])):
            problems += [
                f"{where}.backendRefs.{j}.{k}: unknown field" for k in set(backend) - BACKEND_FIELDS
            ]
            port = backend.get("port")
            if not isinstance(backend.get("name"), str) or not (
                isinstance(port, int) and 1 <= port <= 65535
            ):
                problems.append(
                    f"{where}.backendRefs.{j}: a Service backend needs a name and a port"
                )
    return problems


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]
