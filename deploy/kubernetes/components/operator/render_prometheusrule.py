"""Write prometheusrule.yaml from deploy/prometheus/vllm-alerts.rules.yml (the one source).

The PrometheusRule's spec is the rules file's text, indented under `spec:`, so its comments and
block scalars stay as written. Run it after changing the rules:

    python deploy/kubernetes/components/operator/render_prometheusrule.py

`--check` exits 1 (and says how to fix it) when prometheusrule.yaml differs from what this
writes; tests/test_deploy_kubernetes.py runs the same comparison.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RULES = HERE.parents[2] / "prometheus" / "vllm-alerts.rules.yml"
OUTPUT = HERE / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/vllm-alerts.rules.yml by render_prometheusrule.py: edit the
# rules file, then run `python deploy/kubernetes/components/operator/render_prometheusrule.py`.
# The component's kustomization.yaml adds the `release` label kube-prometheus-stack selects by,
# and the label `namespace: <this namespace>` to every rule (the AlertmanagerConfig routes by it).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: vllm-alerts
  labels:
    app.kubernetes.io/name: ruleloop
    app.kubernetes.io/part-of: ruleloop
spec:
"""


def render(rules_text: str) -> str:
    """The PrometheusRule manifest for a Prometheus rules file's text."""
    lines = rules_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("groups:")), None)
    if start is None:
        raise ValueError("the rules file has no top-level `groups:` line")
    body = "\n".join(f"  {line}" if line.strip() else "" for line in lines[start:])
    return HEADER + body + "\n"


def main(argv: list[str]) -> int:
    expected = render(RULES.read_text())
    if argv[1:] == ["--check"]:
        if OUTPUT.read_text() != expected:
            print(f"{OUTPUT} is out of date with {RULES}: run {Path(__file__).name}")
            return 1
        return 0
    OUTPUT.write_text(expected)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
