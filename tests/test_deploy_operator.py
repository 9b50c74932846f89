"""The kube-prometheus-stack component (deploy/kubernetes/components/operator), rendered.

Its objects agree with the plain files they stand for: the PrometheusRule is generated from
deploy/prometheus/vllm-alerts.rules.yml (and promtool accepts its rules as rendered), the
AlertmanagerConfig routes as deploy/alertmanager/alertmanager.yml does, to the Service the base
creates, with the token the bot reads; the ServiceMonitors select the Services they are for.
Each check also runs on a deliberately broken copy.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.kustomize_render import KUBERNETES, ROOT, by_kind, kustomize, schema_problems

COMPONENT = KUBERNETES / "components" / "operator"
OVERLAY = KUBERNETES / "overlays" / "kube-prometheus-stack"
RULES = ROOT / "deploy" / "prometheus" / "vllm-alerts.rules.yml"
PLAIN_ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_prometheusrule", COMPONENT / "render_prometheusrule.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def drift(rules_text: str, prometheusrule_text: str) -> list[str]:
    """Where the committed PrometheusRule is not what the generator makes of the rules file."""
    expected = generator().render(rules_text)
    if prometheusrule_text == expected:
        return []
    problems = ["prometheusrule.yaml is not generated from the rules file: run "
                "python deploy/kubernetes/components/operator/render_prometheusrule.py"]  # fmt: skip
    if yaml.safe_load(prometheusrule_text)["spec"] != yaml.safe_load(rules_text):
        problems.append("its rules differ from deploy/prometheus/vllm-alerts.rules.yml")
    return problems


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return kustomize(OVERLAY)


def one(objects: list[dict], kind: str, name: str) -> dict:
    (obj,) = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    return obj


def test_prometheusrule_is_generated_from_the_rules_file() -> None:
    assert drift(RULES.read_text(), (COMPONENT / "prometheusrule.yaml").read_text()) == []
    assert generator().main(["render_prometheusrule.py", "--check"]) == 0


def test_drift_check_finds_a_rule_changed_on_one_side() -> None:
    rules = RULES.read_text().replace("for: 2m", "for: 3m", 1)
    assert rules != RULES.read_text()
    assert drift(rules, (COMPONENT / "prometheusrule.yaml").read_text()) == [
        "prometheusrule.yaml is not generated from the rules file: run "
        "python deploy/kubernetes/components/operator/render_prometheusrule.py",
        "its rules differ from deploy/prometheus/vllm-alerts.rules.yml",
    ]
    assert drift(rules, generator().render(rules)) == []  # the generator follows the source


def test_rendered_rules_are_the_shipped_ones_labelled_with_the_bots_namespace(
    rendered: list[dict], tmp_path: Path
) -> None:
    rule = one(rendered, "PrometheusRule", "vllm-alerts")
    shipped = yaml.safe_load(RULES.read_text())["groups"]
    groups = rule["spec"]["groups"]
    assert [g["name"] for g in groups] == [g["name"] for g in shipped]
    for group, plain in zip(groups, shipped, strict=True):
        for got, want in zip(group["rules"], plain["rules"], strict=True):
            assert got["labels"] == {**want.get("labels", {}), "namespace": "inference"}
            assert {k: v for k, v in got.items() if k != "labels"} == {k: v for k, v in want.items() if k != "labels"}  # fmt: skip
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (`make test` installs prometheus)")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    checked = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_engine_in_another_namespace_keeps_its_own_beside_the_bots(
    rendered: list[dict], tmp_path: Path
) -> None:
    """The stamp routes every alert to the bot's AlertmanagerConfig (namespace: the bot's); the
    engine's own namespace stays on the alert as engine_namespace (promtool on the rendered
    rules: an engine scraped in namespace gpu-pool)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (`make test` installs prometheus)")
    rule = one(rendered, "PrometheusRule", "vllm-alerts")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    labels = 'instance="10.1.0.7:8000",job="vllm",namespace="gpu-pool",ruleloop_target="prod-a"'
    case = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": f"vllm:kv_cache_usage_perc{{{labels}}}",
                              "values": "0.97x20"}],
            "alert_rule_test": [{
                "eval_time": "15m", "alertname": "VLLMKVCacheUsageHigh",
                "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "instance": "10.1.0.7:8000",
                                   "job": "vllm", "namespace": "inference",
                                   "engine_namespace": "gpu-pool", "ruleloop_target": "prod-a"},
                    "exp_annotations": {
                        "summary": "KV cache on 10.1.0.7:8000 is 97% full",
                        "description": "10.1.0.7:8000 has used over 95% of its KV-cache blocks "
                        "for 10 minutes; new requests wait or running ones are preempted next.",
                        "runbook_url": "docs/alerts.md#vllmkvcacheusagehigh",
                    },
                }],
            }],
        }],
    }  # fmt: skip
    (tmp_path / "case.yml").write_text(yaml.safe_dump(case))
    tested = subprocess.run([promtool, "test", "rules", "case.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    for group in rule["spec"]["groups"]:  # every engine alert carries it
        for each in group["rules"]:
            assert each["labels"]["engine_namespace"] == "{{ $labels.namespace }}", each["alert"]


def test_operator_objects_carry_the_release_label_and_replace_the_plain_rules(
    rendered: list[dict],
) -> None:
    monitoring = [o for o in rendered if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert sorted(o["kind"] for o in monitoring) == ["AlertmanagerConfig", "PodMonitor", "PrometheusRule", "PrometheusRule", "ServiceMonitor", "ServiceMonitor"]  # fmt: skip
    for obj in monitoring:
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", obj["kind"]
    (config_map,) = by_kind(rendered, "ConfigMap")  # vllm-alert-rules is gone
    assert config_map["metadata"]["name"].startswith("ruleloop-config-")


def test_service_monitors_select_the_bot_service_and_the_gateways(rendered: list[dict]) -> None:
    (service,) = by_kind(rendered, "Service")
    bot = one(rendered, "ServiceMonitor", "ruleloop")
    assert bot["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = bot["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    gateway = one(rendered, "ServiceMonitor", "ruleloop-gateway")
    assert gateway["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "ruleloop", "app.kubernetes.io/component": "gateway"}  # fmt: skip
    assert not gateway["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()  # fmt: skip
    assert [e["path"] for e in gateway["spec"]["endpoints"]] == ["/metrics"]


def test_alertmanager_config_routes_as_the_plain_file_to_the_bot(rendered: list[dict]) -> None:
    config = one(rendered, "AlertmanagerConfig", "ruleloop")
    plain = yaml.safe_load(PLAIN_ALERTMANAGER.read_text())
    plain_route = plain["route"]["routes"][0]  # the bot's; the pager's routes follow it
    (plain_hook,) = next(r for r in plain["receivers"] if r["name"] == plain_route["receiver"])["webhook_configs"]  # fmt: skip
    route = config["spec"]["route"]
    assert route["groupBy"] == plain_route["group_by"]  # the bot's route's own grouping
    # the alerts go on to the rest of the tree (the pager) after the bot, as in the plain file
    assert route["continue"] is plain_route["continue"] is True
    for mine, theirs in (("groupWait", "group_wait"), ("groupInterval", "group_interval"), ("repeatInterval", "repeat_interval")):  # fmt: skip
        assert route[mine] == plain["route"][theirs]
    (matcher,) = route["matchers"]
    assert f'{matcher["name"]} {matcher["matchType"]} "{matcher["value"]}"' == plain_route["matchers"][0]  # fmt: skip
    (receiver,) = config["spec"]["receivers"]
    assert receiver["name"] == route["receiver"]
    (hook,) = receiver["webhookConfigs"]
    (service,) = by_kind(rendered, "Service")
    port = service["spec"]["ports"][0]["port"]
    assert hook["url"] == f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port}/alertmanager"  # fmt: skip
    assert (hook["sendResolved"], hook["maxAlerts"]) == (plain_hook["send_resolved"], plain_hook["max_alerts"])  # fmt: skip
    auth = hook["httpConfig"]["authorization"]
    assert auth["type"] == plain_hook["http_config"]["authorization"]["type"] == "Bearer"
    # the very Secret key the bot reads its webhook token from
    (deployment,) = by_kind(rendered, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RULELOOP_ALERTMANAGER_TOKEN"]["valueFrom"]["secretKeyRef"] == auth["credentials"]
    # the operator only routes alerts of its own namespace here: the rules carry it
    rule = one(rendered, "PrometheusRule", "vllm-alerts")
    labels = [r["labels"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert {lb["namespace"] for lb in labels} == {config["metadata"]["namespace"]}


@pytest.mark.parametrize(
    ("file", "old", "new", "problem"),
    [
        ("servicemonitor-bot.yaml", "path: /metrics", "metricsPath: /metrics", "spec.endpoints.0.metricsPath: unknown field"),
        ("servicemonitor-bot.yaml", "  endpoints:", "  endpoint:", "spec.endpoints: Field required"),
        ("servicemonitor-bot.yaml", "interval: 30s", "interval: half a minute", "interval"),
        ("alertmanagerconfig.yaml", 'matchType: "=~"', 'matchType: "~"', "matchType"),
        ("alertmanagerconfig.yaml", "groupBy: [instance]", "groupBy: instance", "groupBy"),
        ("alertmanagerconfig.yaml", "                key: RULELOOP_ALERTMANAGER_TOKEN\n", "", "credentials.key"),
        ("prometheusrule.yaml", "for: 2m", "for: 2 minutes", "rules.0.for"),
        ("prometheusrule.yaml", "- alert: VLLMEngineDown", "- alert: VLLMEngineDown\n          severity: critical", "severity: unknown field"),
    ],
)  # fmt: skip
def test_operator_schema_check_finds_a_broken_copy(
    tmp_path: Path, file: str, old: str, new: str, problem: str
) -> None:
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    path = tmp_path / "deploy" / "kubernetes" / "components" / "operator" / file
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))
    objects = kustomize(tmp_path / "deploy" / "kubernetes" / "overlays" / "kube-prometheus-stack")
    problems = schema_problems(objects)
    assert any(problem in p for p in problems), problems
