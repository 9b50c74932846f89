"""The nvml-agent kustomize components: the DaemonSet in the bot's overlay and the sidecar patch
of a team's vLLM Deployment render with `kubectl kustomize`, fit the Kubernetes API schema (the
official client's pydantic models, unknown fields refused), run read-only and non-root, claim no
GPU, and agree with `ruleloop agent`'s flags and the bot's token mount.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bot.app.cli.agent import agent as agent_command

ROOT = Path(__file__).parent.parent
TOKEN_DIR = "/var/run/secrets/ruleloop-nvml-agent"
VLLM = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm-prod-a
  labels: {app: vllm-prod-a, ruleloop.dev/nvml-agent: sidecar}
spec:
  replicas: 1
  selector: {matchLabels: {app: vllm-prod-a}}
  template:
    metadata: {labels: {app: vllm-prod-a}}
    spec:
      runtimeClassName: nvidia
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.11.0
          args: ["--model", "/models/llama", "--port", "8000"]
          resources: {limits: {nvidia.com/gpu: "8"}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: unrelated}
spec:
  selector: {matchLabels: {app: unrelated}}
  template:
    metadata: {labels: {app: unrelated}}
    spec:
      containers: [{name: x, image: busybox}]
"""
TEAM_KUSTOMIZATION = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: llm
resources: [vllm.yaml]
components: [../components/nvml-agent/sidecar]
images: [{name: ruleloop, newName: registry.example.com/inference/ruleloop, newTag: 0.1.0}]
"""


def kustomize(directory: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomize components cannot be rendered here")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def schema_problems(objects: list[dict]) -> list[str]:
    client = pytest.importorskip("kubernetes.client", reason="the `kubernetes` dev dependency")
    from pydantic import ValidationError

    problems = []
    for obj in objects:
        cls = getattr(client, obj["apiVersion"].split("/")[-1].capitalize() + obj["kind"])
        if getattr(cls, "model_config", {}).get("extra") != "forbid":
            pytest.skip("kubernetes>=37 is needed: its models refuse unknown fields")
        try:
            cls.model_validate(obj)
        except ValidationError as exc:
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            problems += [
                f"{name}: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()
            ]
    return problems


def deploy_copy(tmp_path: Path) -> Path:
    """deploy/kubernetes copied, with an overlay (example + the component) and a team's vLLM."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")  # the base reads ../../prometheus
    kubernetes = tmp_path / "deploy" / "kubernetes"
    overlay = kubernetes / "overlays" / "with-agent"
    shutil.copytree(kubernetes / "overlays" / "example", overlay)
    with (overlay / "kustomization.yaml").open("a") as fh:
        fh.write("\ncomponents:\n  - ../../components/nvml-agent\n")
    team = kubernetes / "vllm-team"
    team.mkdir()
    (team / "vllm.yaml").write_text(VLLM)
    (team / "kustomization.yaml").write_text(TEAM_KUSTOMIZATION)
    return kubernetes


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    kubernetes = deploy_copy(tmp_path_factory.mktemp("deploy"))
    return {
        "bot": kustomize(kubernetes / "overlays" / "with-agent"),
        "team": kustomize(kubernetes / "vllm-team"),
    }


def one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def assert_read_only_non_root_no_gpu(container: dict) -> None:
    ctx = container["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]} and not ctx.get("privileged")
    assert "nvidia.com/gpu" not in str(container["resources"])  # it claims no GPU
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"  # the route with no token
    args = container["args"]
    assert args[0] == "agent" and args[args.index("--listen") + 1] == "0.0.0.0:9401"
    assert args[args.index("--token-file") + 1] == f"{TOKEN_DIR}/token"
    assert args[args.index("--log-format") + 1] == "json"  # as the bot's, for a log collector
    known = {opt for param in agent_command.params for opt in param.opts}
    assert {a for a in args[1:] if a.startswith("--")} <= known, "a flag `ruleloop agent` lacks"


def token_volume(pod: dict, container: dict) -> dict:
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == TOKEN_DIR]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume["secret"]


def test_the_bot_overlay_with_the_daemonset_fits_the_schema(
    rendered: dict[str, list[dict]],
) -> None:
    assert schema_problems(rendered["bot"]) == []
    daemonset = one(rendered["bot"], "DaemonSet", "ruleloop-nvml-agent")
    assert daemonset["metadata"]["namespace"] == "inference"  # the overlay's namespace applies


def test_the_daemonset_runs_the_agent_on_gpu_nodes_read_only(
    rendered: dict[str, list[dict]],
) -> None:
    daemonset = one(rendered["bot"], "DaemonSet", "ruleloop-nvml-agent")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/inference/ruleloop:0.1.0"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's user
    assert pod["automountServiceAccountToken"] is False  # it needs no Kubernetes API
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    assert container["ports"] == [
        {"name": "agent", "containerPort": 9401, "hostPort": 9401, "protocol": "TCP"}
    ]
    assert_read_only_non_root_no_gpu(container)
    assert token_volume(pod, container)["secretName"] == "ruleloop-nvml-agent"


def test_the_bot_gets_the_same_token(rendered: dict[str, list[dict]]) -> None:
    deployment = one(rendered["bot"], "Deployment", "ruleloop")
    pod = deployment["spec"]["template"]["spec"]
    (bot,) = [c for c in pod["containers"] if c["name"] == "ruleloop"]
    assert token_volume(pod, bot)["secretName"] == "ruleloop-nvml-agent"
    docs = (ROOT / "docs" / "agent.md").read_text()
    assert f'gpu_agent_token_file = "{TOKEN_DIR}/token"' in docs  # what the docs tell to set


def test_the_bot_may_find_each_nodes_agent_and_nothing_more(
    rendered: dict[str, list[dict]],
) -> None:
    """gpu_agent_daemonset: the bot's Role gets the DaemonSet (by name: the one the overlay
    renders) and lists pods, read-only, beside the actuator's rules, in the bot's namespace; a
    target's gpu_agent_daemonset of the docs names the DaemonSet as rendered."""
    (role,) = [o for o in rendered["bot"] if o["kind"] == "Role"]
    daemonset = one(rendered["bot"], "DaemonSet", "ruleloop-nvml-agent")
    assert role["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    rules = [r for r in role["rules"] if r["resources"] in (["daemonsets"], ["pods"])]
    assert rules == [
        {"apiGroups": ["apps"], "resources": ["daemonsets"],
         "resourceNames": [daemonset["metadata"]["name"]], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]  # fmt: skip
    assert role["rules"][0]["resources"] == ["deployments"]  # the actuator's rules stay
    name = f"{daemonset['metadata']['namespace']}/{daemonset['metadata']['name']}"
    assert f'gpu_agent_daemonset = "{name}"' in (ROOT / "docs" / "agent.md").read_text()


def test_the_sidecar_is_appended_to_the_labelled_deployment_only(
    rendered: dict[str, list[dict]],
) -> None:
    assert schema_problems(rendered["team"]) == []
    vllm = one(rendered["team"], "Deployment", "vllm-prod-a")
    pod = vllm["spec"]["template"]["spec"]
    engine, sidecar = pod["containers"]
    # the engine stays first: the container the Kubernetes actuator patches when none is named
    assert engine["name"] == "vllm" and sidecar["name"] == "nvml-agent"
    assert sidecar["image"] == "registry.example.com/inference/ruleloop:0.1.0"
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    assert sidecar["securityContext"]["runAsUser"] == 10001
    assert_read_only_non_root_no_gpu(sidecar)
    assert token_volume(pod, sidecar)["secretName"] == "ruleloop-nvml-agent"
    unrelated = one(rendered["team"], "Deployment", "unrelated")
    assert [c["name"] for c in unrelated["spec"]["template"]["spec"]["containers"]] == ["x"]


@pytest.mark.parametrize(
    ("file", "old", "new", "problem"),
    [
        ("daemonset.yaml", "readinessProbe:", "readinesProbe:", "readinesProbe: Extra inputs"),
        ("daemonset.yaml", "containerPort: 9401", "containerPort: agent", "container_port"),
    ],
)
def test_the_schema_check_finds_a_broken_copy(
    tmp_path: Path, file: str, old: str, new: str, problem: str
) -> None:
    kubernetes = deploy_copy(tmp_path)
    path = kubernetes / "components" / "nvml-agent" / file
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    problems = schema_problems(kustomize(kubernetes / "overlays" / "with-agent"))
    assert any(problem in p or problem.replace("_", "") in p.lower() for p in problems), problems
