"""The shipped examples work as shipped: every render of deploy/kubernetes is loaded the way the
pod loads it, with the values of the shipped Secret example, and checked for the mistakes a
platform team hit first.

- The bot accepts the configuration with the Secret example's values (it used to refuse to
  start: the example's placeholder link secret was too short for its [web] public_url).
- A target whose ``vllm_url`` is a Kubernetes Service names its replicas (``replicas`` or
  ``kubernetes_service``): a Service answers from a different pod at each scrape, which the
  probe refuses ("answers from N engines"), so the example was broken on any fleet.
- The public face (the Ingress, the HTTPRoute) serves the host of [web] public_url and only the
  bot's public paths (Slack's requests, the incident pages), never /alertmanager or /metrics.

Each check also runs on a copy with the old mistake put back, so none can pass by checking
nothing.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.kustomize_render import (
    KUBERNETES,
    by_kind,
    kustomize,
    render,
    renderable,
    with_component,
)

SECRET_EXAMPLE = KUBERNETES / "base" / "secret.example.yaml"
# what the bot publishes: Slack's requests and the incident pages (and nothing else)
PUBLIC = {("/slack/events", "Exact"), ("/incidents", "Prefix"), ("/incidents", "PathPrefix")}
SERVICE_HOST = (".svc", ".svc.cluster.local")
BOT_RENDERS = [(n, d) for n, d in renderable() if n.startswith(("overlays/", "components/"))]


def secret_env(path: Path = SECRET_EXAMPLE, *, filled: bool = True) -> dict[str, str]:
    """The environment a pod gets from the Secret example: its stringData with each
    `replace-me` filled in as its comments say (`openssl rand -hex 32`), or as shipped."""
    env = dict(yaml.safe_load(path.read_text())["stringData"])
    if not filled:
        return env
    return {key: value.replace("replace-me", secrets.token_hex(32)) for key, value in env.items()}


def mounted_config(objects: list[dict], workdir: Path) -> Path:
    """The ruleloop.toml the Deployment mounts at $RULELOOP_CONFIG, written to ``workdir``."""
    from bot.kernel import CONFIG_ENV

    (deployment,) = by_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (path,) = [Path(e["value"]) for e in container["env"] if e["name"] == CONFIG_ENV]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (config_map,) = [
        c
        for c in by_kind(objects, "ConfigMap")
        if c["metadata"]["name"] == volume["configMap"]["name"]
    ]
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / path.name).write_text(config_map["data"][path.name])
    return workdir / path.name


def fleet_problems(settings: object) -> list[str]:
    """Targets whose vllm_url is a Service with nothing naming its pods."""
    problems = []
    for name, target in settings.targets.items():  # type: ignore[attr-defined]
        host = urlsplit(target.vllm_url).hostname or ""
        if host.endswith(SERVICE_HOST) and not (target.replicas or target.kubernetes_service):
            problems.append(
                f"targets.{name}: vllm_url {target.vllm_url} is a Service with no replicas or "
                "kubernetes_service: its /metrics answers from a different pod each time"
            )
    return problems


def exposure_problems(objects: list[dict], public_url: str | None) -> list[str]:
    """What an Ingress or HTTPRoute publishes beyond the bot's public paths, or on a host other
    than public_url's."""
    host = urlsplit(public_url).hostname if public_url else None
    routes: list[tuple[set[str], list[tuple[str, str]], list[tuple[str, object]]]] = []
    for ingress in by_kind(objects, "Ingress"):
        for rule in ingress["spec"].get("rules", []):
            paths = rule.get("http", {}).get("paths", [])
            routes.append(({rule.get("host", "*")},
                           [(p["path"], p["pathType"]) for p in paths],
                           [(p["backend"]["service"]["name"], p["backend"]["service"]["port"].get("name")) for p in paths]))  # fmt: skip
    for route in by_kind(objects, "HTTPRoute"):
        for rule in route["spec"].get("rules", []):
            matches = rule.get("matches") or [{"path": {"value": "/", "type": "PathPrefix"}}]
            routes.append((set(route["spec"].get("hostnames", ["*"])),
                           [(m["path"]["value"], m["path"].get("type", "PathPrefix")) for m in matches],
                           [(b["name"], b["port"]) for b in rule.get("backendRefs", [])]))  # fmt: skip
    problems = []
    for hosts, paths, backends in routes:
        if host is None:
            problems.append("an Ingress or HTTPRoute without [web] public_url in ruleloop.toml")
        elif hosts != {host}:
            problems.append(f"published on {sorted(hosts)}, but [web] public_url is on {host}")
        problems += [f"publishes {p} ({t}): only Slack's requests and the incident pages"
                     for p, t in paths if (p, t) not in PUBLIC]  # fmt: skip
        problems += [f"routes to {b}: not the bot's Service port (ruleloop, http or 3000)"
                     for b in backends if b not in {("ruleloop", "http"), ("ruleloop", 3000)}]  # fmt: skip
    return problems


def example_problems(objects: list[dict], env: dict[str, str], workdir: Path) -> list[str]:
    """Every problem of one render, loaded as the pod loads it with ``env``."""
    from bot.kernel import RuleloopError, Settings

    try:
        settings = Settings.load(env, path=mounted_config(objects, workdir))
    except RuleloopError as exc:
        return [f"the bot refuses to start: {exc}"]
    return fleet_problems(settings) + exposure_problems(objects, settings.web.public_url)


@pytest.mark.parametrize(("name", "directory"), BOT_RENDERS, ids=[n for n, _ in BOT_RENDERS])
def test_every_render_starts_with_the_secret_example_and_names_its_fleet(
    name: str, directory: Path, tmp_path: Path
) -> None:
    objects = render(name, directory, tmp_path)
    assert example_problems(objects, secret_env(), tmp_path / "config") == []


def test_the_public_components_publish_the_public_paths(tmp_path: Path) -> None:
    for component, kind in (("ingress", "Ingress"), ("gateway-api", "HTTPRoute")):
        objects = render(f"components/{component}", KUBERNETES / "components" / component, tmp_path)
        (route,) = by_kind(objects, kind)
        assert route["metadata"]["namespace"] == "inference"
    # the Gateway's own namespace may reach the bot's port (the component patches the policy)
    objects = render("components/gateway-api", KUBERNETES / "components" / "gateway-api", tmp_path)
    (policy,) = by_kind(objects, "NetworkPolicy")
    allowed = [f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
               for f in policy["spec"]["ingress"][0]["from"]]  # fmt: skip
    assert allowed == ["monitoring", "ingress-nginx", "gateway-system"]


def copy_of(tmp_path: Path, relative: str, old: str, new: str) -> Path:
    """deploy/kubernetes copied to ``tmp_path`` with ``old`` replaced by ``new`` in one file."""
    shutil.copytree(KUBERNETES.parent, tmp_path / "deploy")  # the base reads ../prometheus
    copy = tmp_path / "deploy" / "kubernetes"
    target = copy / relative
    text = target.read_text()
    assert old in text, f"{relative} no longer holds {old!r}"
    target.write_text(text.replace(old, new))
    return copy


def test_the_example_as_shipped_before_is_found(tmp_path: Path) -> None:
    """vllm_url at the Service with nothing naming its pods: every diagnosis of a fleet failed."""
    copy = copy_of(tmp_path, "overlays/example/ruleloop.toml",
                   'kubernetes_service = "inference/vllm-prod-a"\n', "")  # fmt: skip
    objects = kustomize(copy / "overlays" / "example")
    assert example_problems(objects, secret_env(), tmp_path / "config") == [
        "targets.prod-a: vllm_url http://vllm-prod-a.inference.svc:8000 is a Service with no "
        "replicas or kubernetes_service: its /metrics answers from a different pod each time"
    ]


def test_the_secret_example_is_refused_unfilled_by_name_not_by_length(tmp_path: Path) -> None:
    """As shipped before, the example's link secret was refused for its length beside the
    example's public_url, as if the bot were broken. Unfilled, each guessable token is now
    refused as a placeholder, by name, with the command that makes a real one."""
    objects = kustomize(KUBERNETES / "overlays" / "example")
    shipped, filled = secret_env(filled=False), secret_env()
    for key in ("RULELOOP_ALERTMANAGER_TOKEN", "RULELOOP_WEB_SECRET"):
        env = {**filled, key: shipped[key]}  # only this one left as shipped
        (problem,) = example_problems(objects, env, tmp_path / "config")
        assert problem.startswith("the bot refuses to start")
        assert "placeholder from an example: set a random" in problem and key in problem
        assert "characters" not in problem and "openssl rand -hex 32" in problem


@pytest.mark.parametrize(
    ("component", "old", "new", "problem"),
    [
        ("ingress/ingress.yaml", "path: /incidents", "path: /",
         "publishes / (Prefix): only Slack's requests and the incident pages"),
        ("gateway-api/httproute.yaml", "value: /incidents", "value: /",
         "publishes / (PathPrefix): only Slack's requests and the incident pages"),
        ("ingress/ingress.yaml", "- host: ruleloop.example.com", "- host: bot.example.org",
         "published on ['bot.example.org'], but [web] public_url is on ruleloop.example.com"),
        ("gateway-api/httproute.yaml", "port: 3000", "port: 9090",
         "routes to ('ruleloop', 9090): not the bot's Service port (ruleloop, http or 3000)"),
    ],
)  # fmt: skip
def test_a_public_face_that_publishes_too_much_is_found(
    tmp_path: Path, component: str, old: str, new: str, problem: str
) -> None:
    copy = copy_of(tmp_path, f"components/{component}", old, new)
    directory = copy / "components" / component.split("/")[0]
    objects = kustomize(
        with_component(directory, tmp_path / "render", overlay=copy / "overlays" / "example")
    )
    assert problem in example_problems(objects, secret_env(), tmp_path / "config")


def test_the_http_route_check_finds_an_unknown_field() -> None:
    from tests.kustomize_render import schema_problems

    route = yaml.safe_load(
        (KUBERNETES / "components" / "gateway-api" / "httproute.yaml").read_text()
    )
    assert schema_problems([route]) == []
    route["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Glob"
    route["spec"]["rules"][0]["backendRef"] = route["spec"]["rules"][0].pop("backendRefs")
    assert schema_problems([route]) == [
        "HTTPRoute/ruleloop: spec.rules.0.backendRef: unknown field",
        "HTTPRoute/ruleloop: spec.rules.0.matches.0.path: {'type': 'Glob', 'value': '/slack/events'}",
    ]


def test_serve_warns_for_each_placeholder_left_in_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The placeholders the bot cannot refuse (Slack answers for its own tokens; the store's
    password is the database's) are named at start, one warning each."""
    import logging

    from tests.test_serve_reviewers import start_serve

    shipped, filled = secret_env(filled=False), secret_env()
    for key in shipped:
        monkeypatch.delenv(key, raising=False)
    left = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "RULELOOP_DATABASE_URL")
    for key, value in {**filled, **{k: shipped[k] for k in left}}.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING, logger="bot.app.cli.serve"):
        start_serve(tmp_path, '[access]\nreview = ["U1"]\n')
    warned = [
        r.getMessage().split(" ")[0] for r in caplog.records if "placeholder" in r.getMessage()
    ]
    assert sorted(warned) == sorted(left)
    caplog.clear()
    for key, value in filled.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING, logger="bot.app.cli.serve"):
        start_serve(tmp_path, '[access]\nreview = ["U1"]\n')
    assert "placeholder" not in caplog.text
