"""The Kubernetes manifests: the kustomize overlay renders, and every object fits the API schema.

There is no cluster here: `kubectl kustomize` renders the overlay and the official Kubernetes
client's models (pydantic, unknown fields refused) check each object; each check also runs on
a deliberately broken copy, so that none of them can pass by checking nothing.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAY = KUBERNETES / "overlays" / "example"
SECRET_ENV = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "RULELOOP_ALERTMANAGER_TOKEN", "RULELOOP_DATABASE_URL")  # fmt: skip


def kustomize(directory: Path) -> list[dict]:
    """`kubectl kustomize <directory>`, as a list of objects."""
    import yaml

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomize overlay cannot be rendered here")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def model_for(obj: dict) -> type:
    """The official Kubernetes client's model class for an object (V1Deployment for apps/v1)."""
    client = pytest.importorskip(
        "kubernetes.client", reason="the `kubernetes` client (a dev dependency) checks the schema"
    )
    cls = getattr(client, obj["apiVersion"].split("/")[-1].capitalize() + obj["kind"], None)
    assert cls is not None, f"no Kubernetes model for {obj['apiVersion']} {obj['kind']}"
    if getattr(cls, "model_config", {}).get("extra") != "forbid":
        pytest.skip("kubernetes>=37 is needed: its models are pydantic and refuse unknown fields")
    return cls


def schema_problems(objects: list[dict]) -> list[str]:
    """Every object checked against the Kubernetes API schema: unknown fields, types, required."""
    from pydantic import ValidationError

    problems = []
    for obj in objects:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            model_for(obj).model_validate(obj)
        except ValidationError as exc:
            for error in exc.errors():
                where = ".".join(str(part) for part in error["loc"])
                problems.append(f"{name}: {where}: {error['msg']}")
    return problems


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return kustomize(OVERLAY)


def test_overlay_renders_objects_that_fit_the_kubernetes_schema(rendered: list[dict]) -> None:
    kinds = sorted(obj["kind"] for obj in rendered)
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "ConfigMap", "Service", "Deployment"]
    )  # fmt: skip
    assert schema_problems(rendered) == []
    for obj in rendered:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "inference", obj["metadata"]["name"]


@pytest.mark.parametrize(
    ("file", "old", "new", "problem"),
    [
        (
            "base/deployment.yaml",
            "readinessProbe:",
            "readinesProbe:",
            "readinesProbe: Extra inputs",
        ),
        ("base/deployment.yaml", "replicas: 2", "replicas: two", "spec.replicas"),
        (
            "base/service.yaml",
            "    - name: http\n      port: 3000\n",
            "    - name: http\n",
            "ports.0.port",
        ),
        ("base/rbac.yaml", "verbs:", "verb:", "rules.0.verb: Extra inputs"),
    ],
)
def test_schema_check_finds_a_broken_copy(
    tmp_path: Path, file: str, old: str, new: str, problem: str
) -> None:
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    path = tmp_path / "deploy" / "kubernetes" / file
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    problems = schema_problems(
        kustomize(tmp_path / "deploy" / "kubernetes" / "overlays" / "example")
    )
    assert any(problem in p for p in problems), problems


def test_deployment_runs_serve_as_non_root_with_probes_and_secrets(rendered: list[dict]) -> None:
    (deployment,) = by_kind(rendered, "Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert spec["replicas"] == 2
    assert container["image"] == "registry.example.com/inference/ruleloop:0.1.0"
    assert container["args"][:1] == ["serve"] and "--host" in container["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's user
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 3000}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    refs = {
        env["name"]: env["valueFrom"]["secretKeyRef"]
        for env in container["env"]
        if "secretKeyRef" in env.get("valueFrom", {})
    }
    assert refs == {name: {"name": "ruleloop", "key": name} for name in SECRET_ENV}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert "emptyDir" in mounts["/var/lib/ruleloop"] and "emptyDir" in mounts["/tmp"]
    # the ADR store is writable (drafts, accepted ADRs), seeded from the image's adr/
    (seed,) = pod["initContainers"]
    assert seed["image"] == container["image"] and seed["command"][:2] == ["cp", "-R"]
    (seed_mount,) = seed["volumeMounts"]
    assert mounts["/app/adr"] is volumes[seed_mount["name"]]
    assert seed["command"][2:] == ["/app/adr/.", seed_mount["mountPath"] + "/"]
    assert "--state-dir" in container["args"]
    assert container["args"][container["args"].index("--state-dir") + 1] == "/var/lib/ruleloop"


def test_config_map_is_mounted_where_ruleloop_config_points_and_loads(
    rendered: list[dict], tmp_path: Path
) -> None:
    from bot.config import CONFIG_ENV, ENV_KEYS, Settings

    (deployment,) = by_kind(rendered, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert set(env) <= {CONFIG_ENV, *ENV_KEYS}, "an env var ruleloop does not read"
    config_path = Path(env[CONFIG_ENV]["value"])
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (config_map,) = [
        c
        for c in by_kind(rendered, "ConfigMap")
        if c["metadata"]["name"] == volume["configMap"]["name"]
    ]
    (tmp_path / config_path.name).write_text(config_map["data"][config_path.name])
    settings = Settings.load({}, path=tmp_path / config_path.name)
    assert settings.server.host == "0.0.0.0" and settings.server.port == 3000
    assert str(settings.paths.state) == "/var/lib/ruleloop"
    assert settings.paths.runbooks == Path("/app/runbooks") and settings.paths.adr == Path(
        "/app/adr"
    )
    base_toml = tmp_path / "base.toml"
    base_toml.write_text((KUBERNETES / "base" / "ruleloop.toml").read_text())
    assert Settings.load({}, path=base_toml).server.port == 3000


def test_rbac_lets_the_service_account_patch_and_watch_deployments(rendered: list[dict]) -> None:
    (deployment,) = by_kind(rendered, "Deployment")
    (account,) = by_kind(rendered, "ServiceAccount")
    (role,) = by_kind(rendered, "Role")
    (binding,) = by_kind(rendered, "RoleBinding")
    assert (
        deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    )
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ruleloop", "namespace": "inference"}]  # fmt: skip
    (rule,) = role["rules"]
    assert rule["apiGroups"] == ["apps"] and rule["resources"] == ["deployments"]
    assert set(rule["verbs"]) == {"get", "watch", "patch"}


def test_service_reaches_the_pods_on_the_http_port(rendered: list[dict]) -> None:
    (deployment,) = by_kind(rendered, "Deployment")
    (service,) = by_kind(rendered, "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items() and service["spec"]["selector"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (3000, "http")
    import yaml

    alertmanager = yaml.safe_load(
        (ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
    )
    urls = [h["url"] for r in alertmanager["receivers"] for h in r.get("webhook_configs", [])]
    assert urls == [f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:3000/alertmanager"]  # fmt: skip


def test_alert_rules_config_map_carries_the_shipped_rules(rendered: list[dict]) -> None:
    (rules,) = [
        c for c in by_kind(rendered, "ConfigMap") if c["metadata"]["name"] == "vllm-alert-rules"
    ]
    shipped = (ROOT / "deploy" / "prometheus" / "vllm-alerts.rules.yml").read_text()
    assert rules["data"] == {"vllm-alerts.rules.yml": shipped}


def test_secret_example_is_valid_but_not_applied(rendered: list[dict]) -> None:
    import yaml

    example = yaml.safe_load((KUBERNETES / "base" / "secret.example.yaml").read_text())
    assert schema_problems([example]) == []
    assert sorted(example["stringData"]) == sorted(SECRET_ENV)
    assert not by_kind(rendered, "Secret")
    for kustomization in KUBERNETES.rglob("kustomization.yaml"):
        assert "secret.example.yaml" not in yaml.safe_load(kustomization.read_text()).get(
            "resources", []
        )
