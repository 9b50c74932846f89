"""The Slack app manifests (HTTP and Socket Mode) against the bolt app's listeners.

Each check is a function returning its problems, run on the shipped manifests (no problems)
and on a deliberately broken copy (the problem it must find).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.slack_api import FakeSlack

ROOT = Path(__file__).parent.parent

SLACK_MANIFEST = ROOT / "deploy" / "slack" / "manifest.yml"
USAGE_HINTS = {
    "/diagnose": "[target]",
    "/apply-adr": "ADR-ID [target]",
    "/adr-draft": "[incident-id]",
}
SCOPES = {
    "chat:write",
    "chat:write.public",
    "commands",
    "files:write",
    "channels:join",
    "users:read",
}


class Recorder:
    """Stands in for the AsyncApp in ``listeners.register``: records what gets registered."""

    def __init__(self) -> None:
        self.registered: list[tuple[str, object]] = []

    def __getattr__(self, kind: str) -> object:
        def listener(constraints: object = None, *args: object, **kwargs: object) -> object:
            self.registered.append((kind, constraints))
            return lambda handler: handler

        return listener

    def names(self, kind: str) -> list[object]:
        """What was registered with ``app.<kind>(...)``: command names, action ids..."""
        return [constraints for k, constraints in self.registered if k == kind]


def registered_listeners() -> Recorder:
    """Everything the bot's ``listeners.register(app)`` registers."""
    from bot.surfaces.slack import listeners

    recorder = Recorder()
    listeners.register(recorder)  # type: ignore[arg-type]
    return recorder


def manifest_problems(manifest: dict, app: Recorder) -> list[str]:
    """Where the Slack manifest and the app's listeners disagree, both ways."""
    problems: list[str] = []
    declared = {c["command"]: c for c in manifest["features"].get("slash_commands", [])}
    registered = app.names("command")
    for name in sorted(set(registered) - set(declared)):
        problems.append(f"the app registers {name} but the manifest does not declare it")
    for name in sorted(set(declared) - set(registered)):
        problems.append(f"the manifest declares {name} but the app registers no listener for it")
    socket_mode = manifest["settings"].get("socket_mode_enabled", False)
    for name, command in declared.items():
        if not socket_mode and not str(command.get("url", "")).endswith("/slack/events"):
            problems.append(f"{name}: url must be the bot's /slack/events")
    interactive = [k for k, _ in app.registered if k in ("action", "view", "shortcut", "options")]
    interactivity = manifest["settings"].get("interactivity", {})
    url = interactivity.get("request_url", "")
    if interactive and not interactivity.get("is_enabled"):
        problems.append(
            f"the app listens to {', '.join(sorted(set(interactive)))}: enable interactivity"
        )
    elif interactive and not socket_mode and not str(url).endswith("/slack/events"):
        problems.append("interactivity.request_url must be the bot's /slack/events")
    missing = SCOPES - set(manifest["oauth_config"]["scopes"]["bot"])
    if missing:
        problems.append(f"missing bot scopes: {', '.join(sorted(missing))}")
    return problems


def load_manifest() -> dict:
    import yaml

    return yaml.safe_load(SLACK_MANIFEST.read_text())


def test_slack_manifest_declares_exactly_the_apps_commands() -> None:
    problems = manifest_problems(load_manifest(), registered_listeners())
    assert not problems, "\n".join(problems)


async def test_the_real_app_answers_every_declared_command(
    tmp_path: Path, slack: FakeSlack
) -> None:
    from slack_bolt.request.async_request import AsyncBoltRequest
    from slack_bolt.response import BoltResponse

    from tests.fakes.bot import harness

    bot = harness(tmp_path, slack=slack)
    try:
        assert bot.bot.slack is not None
        listeners = bot.bot.slack._async_listeners

        async def handlers(command: str) -> int:
            body = {"command": command, "text": "", "user_id": "U1", "team_id": "T0FAKE",
                    "channel_id": "C0INCIDENTS"}  # fmt: skip
            request = AsyncBoltRequest(body=body, mode="socket_mode")
            response = BoltResponse(status=200)
            return sum([await x.async_matches(req=request, resp=response) for x in listeners])

        declared = [c["command"] for c in load_manifest()["features"]["slash_commands"]]
        found = {c: await handlers(c) for c in declared}
        assert found == {c: 1 for c in declared}, f"listeners per declared command: {found}"
        assert await handlers("/not-in-the-manifest") == 0
    finally:
        await bot.close()


def test_slack_manifest_usage_hints_and_scope_comments() -> None:
    commands = load_manifest()["features"]["slash_commands"]
    assert {c["command"]: c["usage_hint"] for c in commands} == USAGE_HINTS
    text = SLACK_MANIFEST.read_text()
    for scope in SCOPES:
        (line,) = [ln for ln in text.splitlines() if ln.strip().startswith(f"- {scope} ")]
        assert "#" in line and len(line.split("#", 1)[1].strip()) > 10, f"{scope}: say why"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: m["features"]["slash_commands"].pop(0), "registers /diagnose but the manifest"),
        (
            lambda m: m["features"]["slash_commands"].append(
                {"command": "/ghost", "url": "https://x/slack/events"}
            ),
            "declares /ghost but the app registers no listener",
        ),
        (lambda m: m["settings"]["interactivity"].update(is_enabled=False), "enable interactivity"),
        (lambda m: m["settings"]["interactivity"].update(request_url="https://x/"), "request_url"),
        (lambda m: m["oauth_config"]["scopes"]["bot"].remove("files:write"), "files:write"),
        (
            lambda m: m["features"]["slash_commands"][0].update(url="https://x/events"),
            "/diagnose: url",
        ),
    ],
)
def test_slack_manifest_check_finds_a_broken_copy(change: object, problem: str) -> None:
    manifest = load_manifest()
    change(manifest)  # type: ignore[operator]
    problems = manifest_problems(manifest, registered_listeners())
    assert any(problem in p for p in problems), problems


# --- the Socket Mode variant -------------------------------------------------------------------

SOCKET_MANIFEST = ROOT / "deploy" / "slack" / "manifest.socket-mode.yml"


def socket_variant_problems(http: dict, socket: dict) -> list[str]:
    """Where the Socket Mode manifest is not the HTTP one less its URLs, with Socket Mode on."""
    import copy

    problems = []
    if socket["settings"].get("socket_mode_enabled") is not True:
        problems.append("socket_mode_enabled must be true")
    for command in socket["features"].get("slash_commands", []):
        if "url" in command:
            problems.append(f"{command['command']}: no url in Socket Mode (Slack ignores it)")
    if "request_url" in socket["settings"].get("interactivity", {}):
        problems.append("interactivity.request_url: none in Socket Mode")
    expected = copy.deepcopy(http)
    for command in expected["features"].get("slash_commands", []):
        command.pop("url", None)
    expected["settings"].get("interactivity", {}).pop("request_url", None)
    expected["settings"]["socket_mode_enabled"] = True
    for part in ("display_information", "features", "oauth_config", "settings"):
        if socket.get(part) != expected.get(part):
            problems.append(f"{part} differs from manifest.yml's (beyond the URLs)")
    return problems


def load_socket_manifest() -> dict:
    import yaml

    return yaml.safe_load(SOCKET_MANIFEST.read_text())


def test_socket_mode_manifest_is_the_http_one_without_urls() -> None:
    socket = load_socket_manifest()
    assert socket_variant_problems(load_manifest(), socket) == []
    assert manifest_problems(socket, registered_listeners()) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: m["settings"].update(socket_mode_enabled=False), "socket_mode_enabled"),
        (
            lambda m: m["features"]["slash_commands"][0].update(url="https://x/slack/events"),
            "/diagnose: no url",
        ),
        (lambda m: m["oauth_config"]["scopes"]["bot"].remove("users:read"), "oauth_config"),
        (lambda m: m["features"]["slash_commands"].pop(), "features differs"),
        (lambda m: m["settings"]["interactivity"].update(is_enabled=False), "settings differs"),
    ],
)
def test_socket_variant_check_finds_a_drifted_copy(change: object, problem: str) -> None:
    socket = load_socket_manifest()
    change(socket)  # type: ignore[operator]
    problems = socket_variant_problems(load_manifest(), socket)
    assert any(problem in p for p in problems), problems
