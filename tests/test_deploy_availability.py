"""High availability and isolation of the rendered manifests: a PodDisruptionBudget and a
topology spread for the bot's replicas, NetworkPolicies for the bot's port and the agent's
hostPort, and the actuator's Role narrowed to the Deployments the config names. Each check runs
on every kustomization (tests/kustomize_render.py) and on a broken copy it must catch."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.kustomize_render import (
    EXAMPLE,
    KUBERNETES,
    ROOT,
    by_kind,
    kustomize,
    render,
    renderable,
    with_component,
)

pytestmark = pytest.mark.faults

NVML_AGENT = KUBERNETES / "components" / "nvml-agent"


def selects(selector: dict, labels: dict) -> bool:
    match = selector.get("matchLabels", {})
    return bool(match) and match.items() <= labels.items() and not selector.get("matchExpressions")


def bot(objects: list[dict]) -> dict:
    (deployment,) = [
        d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == "ruleloop"
    ]
    return deployment


def policies_for(objects: list[dict], labels: dict) -> list[dict]:
    return [
        p for p in by_kind(objects, "NetworkPolicy") if selects(p["spec"]["podSelector"], labels)
    ]


def alertmanager_namespace() -> str:
    """Where deploy/prometheus/prometheus.yml sends alerts from: Alertmanager's namespace."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (target,) = config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    return target.split(".")[1]


def availability_problems(objects: list[dict]) -> list[str]:
    """What keeps the bot's replicas from surviving a drain or a node, or opens its port."""
    problems = []
    deployment = bot(objects)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pod = deployment["spec"]["template"]["spec"]
    budgets = [b for b in by_kind(objects, "PodDisruptionBudget") if selects(b["spec"]["selector"], labels)]  # fmt: skip
    if len(budgets) != 1:
        problems.append(f"{len(budgets)} PodDisruptionBudgets select the bot's pods, not 1")
    else:
        spec = budgets[0]["spec"]
        allowed = (
            deployment["spec"]["replicas"] - spec["minAvailable"]
            if "minAvailable" in spec
            else spec.get("maxUnavailable", 0)
        )
        if not 1 <= allowed < deployment["spec"]["replicas"]:
            problems.append(f"the PodDisruptionBudget lets {allowed} of the replicas go at once")
    spread = {c["topologyKey"]: c for c in pod.get("topologySpreadConstraints", [])}
    host = spread.get("kubernetes.io/hostname")
    if host is None or host["whenUnsatisfiable"] != "DoNotSchedule" or host["maxSkew"] != 1:
        problems.append("the replicas may share a node (no required spread by hostname)")
    for constraint in spread.values():
        if not selects(constraint["labelSelector"], labels):
            problems.append(f"the spread by {constraint['topologyKey']} counts other pods")
    # the bot's port: from the namespaces that call it, nothing else
    policies = policies_for(objects, labels)
    if not policies:
        problems.append("no NetworkPolicy selects the bot's pods")
    for policy in policies:
        if "Ingress" not in policy["spec"].get("policyTypes", []):
            problems.append(f"NetworkPolicy {policy['metadata']['name']} does not limit ingress")
        for rule in policy["spec"].get("ingress", []):
            if not rule.get("from"):
                problems.append("a rule lets every source reach the bot")
            if [p.get("port") for p in rule.get("ports", [])] != ["http"]:
                problems.append(f"a rule opens ports {rule.get('ports')} (only `http`)")
        allowed_ns = {
            peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name")
            for rule in policy["spec"].get("ingress", [])
            for peer in rule.get("from", [])
        }  # fmt: skip
        if alertmanager_namespace() not in allowed_ns:
            problems.append(
                f"Alertmanager's namespace {alertmanager_namespace()} cannot reach the bot"
            )
    # the agents' hostPort, where the DaemonSet is rendered
    for daemonset in by_kind(objects, "DaemonSet"):
        agent = daemonset["spec"]["template"]["metadata"]["labels"]
        (container,) = daemonset["spec"]["template"]["spec"]["containers"]
        ports = {p["name"] for p in container["ports"] if p.get("hostPort")}
        policies = policies_for(objects, agent)
        if not policies:
            problems.append(f"no NetworkPolicy selects {daemonset['metadata']['name']}'s pods (hostPort open)")  # fmt: skip
        for policy in policies:
            for rule in policy["spec"].get("ingress", []):
                peers = rule.get("from", [])
                if not peers or not all(
                    "namespaceSelector" not in peer and selects(peer.get("podSelector", {}), labels)
                    for peer in peers
                ):
                    problems.append("the agent's port takes pods other than the bot's")
                if {p.get("port") for p in rule.get("ports", [])} != ports:
                    problems.append(f"the agent's policy opens {rule.get('ports')}, not {ports}")
    return problems


def configured_deployments(objects: list[dict], namespace: str | None) -> set[str]:
    """The Deployments the rendered ruleloop.toml lets the actuator change in ``namespace``."""
    (config,) = [c for c in by_kind(objects, "ConfigMap") if "ruleloop.toml" in c.get("data", {})]
    targets = tomllib.loads(config["data"]["ruleloop.toml"]).get("targets", {})
    names = set()
    for target in targets.values():
        actuator = target.get("actuator", {})
        if actuator.get("kind") == "kubernetes" and actuator.get("namespace") == namespace:
            names |= {actuator["deployment"], *filter(None, [actuator.get("canary_deployment")])}
    return names


def rbac_problems(objects: list[dict]) -> list[str]:
    (role,) = by_kind(objects, "Role")
    named = configured_deployments(objects, role["metadata"].get("namespace"))
    problems = []
    for rule in role["rules"]:
        if rule["resources"] != ["deployments"]:
            continue  # only the Deployments the actuator patches are named; a list has no names
        given = set(rule.get("resourceNames", []))
        if named and given != named:
            problems.append(f"the Role reaches {sorted(given) or 'every Deployment'}, the config names {sorted(named)}")  # fmt: skip
    return problems


RENDERS = [(name, path) for name, path in renderable() if not name.startswith("rbac/")]


@pytest.mark.parametrize(("name", "directory"), RENDERS, ids=[n for n, _ in RENDERS])
def test_every_render_keeps_a_replica_and_limits_who_reaches_it(
    name: str, directory: Path, tmp_path: Path
) -> None:
    """Every render of the bot (rbac/ holds only rights granted in other namespaces)."""
    objects = render(name, directory, tmp_path)
    assert availability_problems(objects) == []
    assert rbac_problems(objects) == []


def test_the_example_role_is_narrowed_to_the_configured_deployment(tmp_path: Path) -> None:
    objects = kustomize(EXAMPLE)
    assert configured_deployments(objects, "inference") == {"vllm-prod-a"}
    (role,) = by_kind(objects, "Role")
    assert role["rules"][0]["resourceNames"] == ["vllm-prod-a"]
    agent = kustomize(with_component(NVML_AGENT, tmp_path / "agent"))
    assert [p["metadata"]["name"] for p in by_kind(agent, "NetworkPolicy")] == ["ruleloop", "ruleloop-nvml-agent"]  # fmt: skip


def broken(tmp_path: Path, file: str, old: str, new: str) -> Path:
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    path = tmp_path / "deploy" / "kubernetes" / file
    assert old in path.read_text(), (file, old)
    path.write_text(path.read_text().replace(old, new, 1))
    return tmp_path / "deploy" / "kubernetes"


@pytest.mark.parametrize(
    ("file", "old", "new", "problem"),
    [
        ("base/kustomization.yaml", "  - poddisruptionbudget.yaml\n", "",
         "0 PodDisruptionBudgets select the bot's pods, not 1"),
        ("base/poddisruptionbudget.yaml", "minAvailable: 1", "minAvailable: 2",
         "the PodDisruptionBudget lets 0 of the replicas go at once"),
        ("base/deployment.yaml", "whenUnsatisfiable: DoNotSchedule", "whenUnsatisfiable: ScheduleAnyway",
         "the replicas may share a node (no required spread by hostname)"),
        ("base/kustomization.yaml", "  - networkpolicy.yaml\n", "",
         "no NetworkPolicy selects the bot's pods"),
        ("base/networkpolicy.yaml", "kubernetes.io/metadata.name: monitoring", "kubernetes.io/metadata.name: observability",
         "Alertmanager's namespace monitoring cannot reach the bot"),
        ("base/networkpolicy.yaml", "        - port: http\n", "        - port: 9999\n",
         "a rule opens ports [{'port': 9999, 'protocol': 'TCP'}] (only `http`)"),
    ],
)  # fmt: skip
def test_the_checks_find_a_broken_copy(
    tmp_path: Path, file: str, old: str, new: str, problem: str
) -> None:
    kubernetes = broken(tmp_path, file, old, new)
    assert problem in availability_problems(kustomize(kubernetes / "overlays" / "example"))


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("  - networkpolicy.yaml\n", "",
         "no NetworkPolicy selects ruleloop-nvml-agent's pods (hostPort open)"),
        ("        - podSelector:  # the bot", "        - namespaceSelector: {}\n          podSelector:  # the bot",
         "the agent's port takes pods other than the bot's"),
    ],
)  # fmt: skip
def test_the_agent_check_finds_a_broken_copy(
    tmp_path: Path, old: str, new: str, problem: str
) -> None:
    file = "networkpolicy.yaml" if "podSelector" in old else "kustomization.yaml"
    kubernetes = broken(tmp_path, f"components/nvml-agent/{file}", old, new)
    overlay = kubernetes / "overlays" / "example"
    objects = kustomize(with_component(kubernetes / "components" / "nvml-agent", tmp_path / "w", overlay=overlay))  # fmt: skip
    assert problem in availability_problems(objects)


def test_the_rbac_check_finds_a_role_that_names_another_deployment(tmp_path: Path) -> None:
    kubernetes = broken(tmp_path, "overlays/example/ruleloop.toml", 'deployment = "vllm-prod-a"',
                        'deployment = "vllm-prod-b"')  # fmt: skip
    assert rbac_problems(kustomize(kubernetes / "overlays" / "example")) == [
        "the Role reaches ['vllm-prod-a'], the config names ['vllm-prod-b']"
    ]
    unnarrowed = broken(tmp_path / "2", "overlays/example/kustomization.yaml",
                        "path: /rules/0/resourceNames", "path: /rules/0/x-unused")  # fmt: skip
    assert rbac_problems(kustomize(unnarrowed / "overlays" / "example")) == [
        "the Role reaches every Deployment, the config names ['vllm-prod-a']"
    ]
