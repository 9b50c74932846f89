"""The Kubernetes manifests: every kustomize render fits the API schema; the example in detail.

There is no cluster here: `kubectl kustomize` renders the base, every overlay and every
component (applied to the example overlay, as a team would), and each object is checked
against its API schema (tests/kustomize_render.py); each check also runs on a deliberately
broken copy, so that none of them can pass by checking nothing. The operator component is
checked in detail by tests/test_deploy_operator.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.kustomize_render import (
    KUBERNETES,
    ROOT,
    by_kind,
    kustomize,
    render,
    renderable,
    schema_problems,
)

OVERLAY = KUBERNETES / "overlays" / "example"
SOCKET_MODE = KUBERNETES / "overlays" / "socket-mode"
SECRET_ENV = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "RULELOOP_ALERTMANAGER_TOKEN", "RULELOOP_DATABASE_URL")  # fmt: skip
# the incident page's link secret: optional (without it the page is off)
OPTIONAL_SECRET_ENV = ("RULELOOP_WEB_SECRET",)


@pytest.mark.parametrize(("name", "directory"), renderable(), ids=[n for n, _ in renderable()])
def test_every_render_fits_the_schema(name: str, directory: Path, tmp_path: Path) -> None:
    objects = render(name, directory, tmp_path)
    assert objects and schema_problems(objects) == []
    if name.startswith(("overlays/", "components/")):  # everything in the example's namespace
        for obj in objects:
            if obj["kind"] != "Namespace":
                assert obj["metadata"].get("namespace") == "inference", (name, obj["metadata"])
    if name.startswith("rbac/"):  # rights in another namespace, for the bot's service account
        (binding,) = by_kind(objects, "RoleBinding")
        assert binding["metadata"]["namespace"] != "inference"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ruleloop", "namespace": "inference"}]  # fmt: skip


def test_every_overlay_and_component_directory_is_rendered() -> None:
    names = [name for name, _ in renderable()]
    for kind in ("overlays", "components", "rbac"):
        for directory in (KUBERNETES / kind).iterdir():
            assert f"{kind}/{directory.name}" in names, f"{directory}: no kustomization.yaml"
    assert {"base", "overlays/example", "overlays/socket-mode", "overlays/kube-prometheus-stack",
            "components/operator", "components/ingress", "components/gateway-api",
            "rbac/engines-namespace", "rbac/argocd"} <= set(names)  # fmt: skip


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return kustomize(OVERLAY)


def test_overlay_renders_objects_that_fit_the_kubernetes_schema(rendered: list[dict]) -> None:
    kinds = sorted(obj["kind"] for obj in rendered)
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "ConfigMap", "Service", "Deployment",
         "PodDisruptionBudget", "NetworkPolicy"]
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
    # liveness never asks the store (tests/test_health.py stops PostgreSQL under them)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 3000}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    refs = {
        env["name"]: env["valueFrom"]["secretKeyRef"]
        for env in container["env"]
        if "secretKeyRef" in env.get("valueFrom", {})
    }
    assert refs == {name: {"name": "ruleloop", "key": name} for name in SECRET_ENV} | {
        name: {"name": "ruleloop", "key": name, "optional": True} for name in OPTIONAL_SECRET_ENV
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    assert "emptyDir" in mounts["/var/lib/ruleloop"] and "emptyDir" in mounts["/tmp"]
    # ADRs live in the store: the image's /app/adr is read in place (paths.adr, checked with the
    # config below), nothing seeds or mounts over it
    assert "initContainers" not in pod
    assert not [m for m in container["volumeMounts"] if m["mountPath"].startswith("/app/adr")]
    assert "--state-dir" in container["args"]
    assert container["args"][container["args"].index("--state-dir") + 1] == "/var/lib/ruleloop"


def test_config_map_is_mounted_where_ruleloop_config_points_and_loads(
    rendered: list[dict], tmp_path: Path
) -> None:
    from bot.kernel.config import CONFIG_ENV, ENV_KEYS, Settings
    from bot.kernel.errors import UsageError

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
    link_secret = {"RULELOOP_WEB_SECRET": "0" * 64}  # the Secret's key, as the pod gets it
    settings = Settings.load(link_secret, path=tmp_path / config_path.name)
    assert settings.server.host == "0.0.0.0" and settings.server.port == 3000
    assert str(settings.paths.state) == "/var/lib/ruleloop"
    assert settings.paths.runbooks == Path("/app/runbooks") and settings.paths.adr == Path(
        "/app/adr"
    )
    # the example sets public_url: the incident page is on, and it needs the link secret
    assert settings.web.public_url == "https://ruleloop.example.com"
    with pytest.raises(UsageError, match="RULELOOP_WEB_SECRET"):
        Settings.load({}, path=tmp_path / config_path.name)
    base_toml = tmp_path / "base.toml"
    base_toml.write_text((KUBERNETES / "base" / "ruleloop.toml").read_text())
    base = Settings.load({}, path=base_toml)  # the base starts without the optional link secret
    assert base.server.port == 3000 and base.paths.adr == Path("/app/adr")
    assert base.web.public_url is None


def test_rbac_lets_the_service_account_patch_and_watch_deployments_and_list_replicas(
    rendered: list[dict],
) -> None:
    (deployment,) = by_kind(rendered, "Deployment")
    (account,) = by_kind(rendered, "ServiceAccount")
    (role,) = by_kind(rendered, "Role")
    (binding,) = by_kind(rendered, "RoleBinding")
    assert (
        deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    )
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}  # fmt: skip
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ruleloop", "namespace": "inference"}]  # fmt: skip
    deployments, endpointslices = role["rules"]
    assert deployments["apiGroups"] == ["apps"] and deployments["resources"] == ["deployments"]
    assert set(deployments["verbs"]) == {"get", "watch", "patch"}
    # fleet discovery reads the Service's replicas; read-only
    assert endpointslices["apiGroups"] == ["discovery.k8s.io"]
    assert endpointslices["resources"] == ["endpointslices"]
    assert set(endpointslices["verbs"]) == {"get", "list"}


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
    shipped = ROOT / "deploy" / "prometheus"
    assert rules["data"] == {
        name: (shipped / name).read_text()
        for name in ("vllm-alerts.rules.yml", "ruleloop-alerts.rules.yml")  # the bot's own too
    }


def test_secret_example_is_valid_but_not_applied(rendered: list[dict]) -> None:
    import yaml

    example = yaml.safe_load((KUBERNETES / "base" / "secret.example.yaml").read_text())
    assert schema_problems([example]) == []
    assert sorted(example["stringData"]) == sorted(SECRET_ENV + OPTIONAL_SECRET_ENV)
    assert not by_kind(rendered, "Secret")
    for kustomization in KUBERNETES.rglob("kustomization.yaml"):
        assert "secret.example.yaml" not in yaml.safe_load(kustomization.read_text()).get(
            "resources", []
        )


# --- the Socket Mode overlay -------------------------------------------------------------------


def socket_mode_problems(deployment: dict) -> list[str]:
    """What keeps a Deployment from Socket Mode only (docs/bot.md: with both set, both run)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    problems = []
    ref = env.get("SLACK_APP_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef")
    if ref != {"name": "ruleloop", "key": "SLACK_APP_TOKEN"}:
        problems.append("SLACK_APP_TOKEN does not come from the Secret ruleloop")
    if "SLACK_SIGNING_SECRET" in env:
        problems.append("SLACK_SIGNING_SECRET is still set: POST /slack/events stays on")
    if "SLACK_BOT_TOKEN" not in env:
        problems.append("no SLACK_BOT_TOKEN: the bot cannot post")
    return problems


def test_socket_mode_overlay_passes_the_app_token_instead_of_the_signing_secret(
    rendered: list[dict],
) -> None:
    from bot.kernel.config import ENV_KEYS, Settings

    (example,) = by_kind(rendered, "Deployment")
    (deployment,) = by_kind(kustomize(SOCKET_MODE), "Deployment")
    assert socket_mode_problems(deployment) == []
    assert socket_mode_problems(example) == [
        "SLACK_APP_TOKEN does not come from the Secret ruleloop",
        "SLACK_SIGNING_SECRET is still set: POST /slack/events stays on",
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {e["name"] for e in container["env"]} <= set(ENV_KEYS) | {"RULELOOP_CONFIG"}
    # what the server then runs: Slack enabled, over Socket Mode, no HTTP signing secret
    slack = Settings.load({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"}).slack
    assert slack.enabled and slack.app_token is not None and slack.signing_secret is None
    # everything else is the example's Deployment
    (before,) = example["spec"]["template"]["spec"]["containers"]
    assert {k: v for k, v in container.items() if k != "env"} == {k: v for k, v in before.items() if k != "env"}  # fmt: skip
    kept = [e for e in before["env"] if e["name"] != "SLACK_SIGNING_SECRET"]
    added = [e for e in container["env"] if e["name"] != "SLACK_APP_TOKEN"]
    assert sorted(kept, key=str) == sorted(added, key=str)


def test_socket_mode_check_finds_an_overlay_that_keeps_http(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    patch = tmp_path / "deploy" / "kubernetes" / "overlays" / "socket-mode" / "socket-mode.yaml"
    text = patch.read_text()
    assert "            - name: SLACK_SIGNING_SECRET\n              $patch: delete\n" in text
    patch.write_text(
        text.replace("            - name: SLACK_SIGNING_SECRET\n              $patch: delete\n", "")
    )
    (deployment,) = by_kind(kustomize(patch.parent), "Deployment")
    assert socket_mode_problems(deployment) == [
        "SLACK_SIGNING_SECRET is still set: POST /slack/events stays on"
    ]
