"""Every shipped way of scraping the vLLM engines labels them `ruleloop_target`.

The bot matches an alert to its target by that label (else by `instance` against each
target's vllm_url host:port, which a pod IP never is). The plain Prometheus file sets it on its
static targets; the kube-prometheus-stack component's monitors must set it by relabeling from a
label every scraped pod (or Service) carries. Each check also runs on a broken copy.
"""

from __future__ import annotations

import copy
import re

import yaml

from tests.kustomize_render import KUBERNETES, ROOT, kustomize, schema_problems

PLAIN = ROOT / "deploy" / "prometheus" / "prometheus.yml"
OVERLAY = KUBERNETES / "overlays" / "kube-prometheus-stack"
MONITORS = {"PodMonitor": "podMetricsEndpoints", "ServiceMonitor": "endpoints"}


def plain_problems(config: dict) -> list[str]:
    """Where the plain file's `vllm` job leaves a target without `ruleloop_target`."""
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == "vllm"]
    if not jobs:
        return ["prometheus.yml has no scrape job `vllm`"]
    problems = []
    for job in jobs:
        relabelled = any(r.get("target_label") == "ruleloop_target" for r in job.get("relabel_configs", []))  # fmt: skip
        for static in job.get("static_configs", []):
            if not relabelled and "ruleloop_target" not in static.get("labels", {}):
                problems.append(f"prometheus.yml: {static['targets']} has no ruleloop_target")
    return problems


def meta_label(key: str) -> str:
    """The name Prometheus gives a Kubernetes label in its discovery metadata."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def required_labels(selector: dict) -> set[str]:
    """The labels every object the selector picks carries."""
    keys = set(selector.get("matchLabels", {}))
    keys |= {e["key"] for e in selector.get("matchExpressions", []) if e["operator"] in ("Exists", "In")}  # fmt: skip
    return keys


def monitor_problems(objects: list[dict]) -> list[str]:
    """Where a monitor of the job `vllm` does not set `ruleloop_target` on every target."""
    problems = []
    engines = 0
    for obj in objects:
        if obj["kind"] not in MONITORS:
            continue
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        kind = "pod" if obj["kind"] == "PodMonitor" else "service"
        carried = {f"__meta_kubernetes_{kind}_label_{meta_label(k)}" for k in required_labels(obj["spec"]["selector"])}  # fmt: skip
        for endpoint in obj["spec"][MONITORS[obj["kind"]]]:
            relabelings = endpoint.get("relabelings", [])
            if not any(r.get("targetLabel") == "job" and r.get("replacement") == "vllm" for r in relabelings):  # fmt: skip
                continue
            engines += 1
            sources = [r.get("sourceLabels", []) for r in relabelings if r.get("targetLabel") == "ruleloop_target"]  # fmt: skip
            if not sources:
                problems.append(f"{name}: no relabeling sets ruleloop_target")
            elif not all(set(s) and set(s) <= carried for s in sources):
                problems.append(
                    f"{name}: ruleloop_target comes from {sources}, a label its selector does "
                    f"not require (it requires {sorted(carried)})"
                )
    if not engines:
        problems.append("no PodMonitor or ServiceMonitor scrapes the engines as the job `vllm`")
    return problems


def rendered() -> list[dict]:
    return kustomize(OVERLAY)


def test_the_plain_prometheus_file_labels_every_engine() -> None:
    config = yaml.safe_load(PLAIN.read_text())
    assert plain_problems(config) == []
    broken = copy.deepcopy(config)
    del broken["scrape_configs"][0]["static_configs"][1]["labels"]
    assert plain_problems(broken) == ["prometheus.yml: ['10.0.0.6:8000'] has no ruleloop_target"]


def test_the_operator_component_labels_every_engine() -> None:
    objects = rendered()
    assert monitor_problems(objects) == []
    monitors = [o for o in objects if o["kind"] in MONITORS]
    assert schema_problems(monitors) == []


def test_a_monitor_without_the_label_or_from_an_optional_label_fails() -> None:
    objects = [o for o in rendered() if o["kind"] in MONITORS]
    (engines,) = [o for o in objects if o["metadata"]["name"] == "vllm"]
    without = copy.deepcopy(engines)
    (endpoint,) = without["spec"]["podMetricsEndpoints"]
    endpoint["relabelings"] = [r for r in endpoint["relabelings"] if r["targetLabel"] != "ruleloop_target"]  # fmt: skip
    assert monitor_problems([without]) == ["PodMonitor/vllm: no relabeling sets ruleloop_target"]
    optional = copy.deepcopy(engines)
    optional["spec"]["selector"] = {"matchLabels": {"app": "vllm"}}
    assert monitor_problems([optional])[0].startswith("PodMonitor/vllm: ruleloop_target comes from")  # fmt: skip
    assert monitor_problems([o for o in objects if o is not engines]) == [
        "no PodMonitor or ServiceMonitor scrapes the engines as the job `vllm`"
    ]
