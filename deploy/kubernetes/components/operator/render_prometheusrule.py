"""Write the PrometheusRules from deploy/prometheus's rules files (the one source of each):
prometheusrule.yaml (`vllm-alerts`) from vllm-alerts.rules.yml, and prometheusrule-ruleloop.yaml
(`ruleloop-alerts`, the bot watching itself) from ruleloop-alerts.rules.yml.

A PrometheusRule's spec is the rules file's text, indented under `spec:`, so its comments and
block scalars stay as written. Run it after changing the rules:

    python deploy/kubernetes/components/operator/render_prometheusrule.py

`--check` exits 1 (and says how to fix it) when a PrometheusRule differs from what this
writes; tests/test_deploy_operator.py and tests/test_deploy_self_alerts.py run the same
comparison.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RULES = HERE.parents[2] / "prometheus" / "vllm-alerts.rules.yml"
OUTPUT = HERE / "prometheusrule.yaml"
# (rules file, PrometheusRule file, its name): every PrometheusRule this writes
RENDERED = [
    (RULES, OUTPUT, "vllm-alerts"),
    (
        RULES.parent / "ruleloop-alerts.rules.yml",
        HERE / "prometheusrule-ruleloop.yaml",
        "ruleloop-alerts",
    ),
]

HEADER = """\
# GENERATED from deploy/prometheus/{source} by render_prometheusrule.py: edit the
# rules file, then run `python deploy/kubernetes/components/operator/render_prometheusrule.py`.
# The component's kustomization.yaml adds the `release` label kube-prometheus-stack selects by,
# and the label `namespace: <this namespace>` to every rule (the AlertmanagerConfig routes by it).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: ruleloop
    app.kubernetes.io/part-of: ruleloop
spec:
"""


def render(
    rules_text: str, *, name: str = "vllm-alerts", source: str = "vllm-alerts.rules.yml"
) -> str:
    """The PrometheusRule ``name`` for a Prometheus rules file's text."""
    lines = rules_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("groups:")), None)
    if start is None:
        raise ValueError("the rules file has no top-level `groups:` line")
    body = "\n".join(f"  {line}" if line.strip() else "" for line in lines[start:])
    return HEADER.format(name=name, source=source) + body + "\n"


def main(argv: list[str]) -> int:
    stale = 0
    for rules, output, name in RENDERED:
        expected = render(rules.read_text(), name=name, source=rules.name)
        if argv[1:] == ["--check"]:
            if not output.exists() or output.read_text() != expected:
                print(f"{output} is out of date with {rules}: run {Path(__file__).name}")
                stale = 1
            continue
        output.write_text(expected)
        print(f"wrote {output}")
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv))
