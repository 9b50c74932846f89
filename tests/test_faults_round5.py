"""Hardening round 5 (issue 45), its two medium findings, each reproduced through the real bot
(create_bot: the real slack-bolt app, signed requests; Slack and Kubernetes faked at the wire):

- EndpointSlice addresses were fetched unchecked: loopback, the metadata address, an FQDN
  slice naming localhost and an IPv6 "address" carrying its own port and path were scraped,
  and the thread said which answered; 100 endpoints were 100 scrapes; a port that is an
  object gave a traceback. Now every address is an IP of its slice's family inside the
  target's kubernetes_networks, or discovery is refused and nothing is fetched.
- One bad ADR file (a 400-digit match value, front matter nested 3,000 deep) failed every
  diagnosis, `ruleloop serve`'s start and `ruleloop adr list`; now it is skipped and named,
  like a typo.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from bot.adr.store import AdrStore
from bot.app.cli import cli
from tests.fakes.bot import ROOT, Harness, engine_transport, harness
from tests.fakes.kube_api import TOKEN, FakeKube
from tests.fakes.kube_server import KubeServer
from tests.fakes.slack_api import FakeSlack

pytestmark = pytest.mark.faults

SEED = "ADR-20260831-01"


class Recording(httpx.AsyncBaseTransport):
    """The engine's recorded pages, and every URL the bot fetched through its client."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self._pages = engine_transport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        return await self._pages.handle_async_request(request)


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def kube_url(kube: FakeKube) -> Iterator[str]:
    with KubeServer(kube) as server:
        yield server.url


def fleet_harness(
    tmp_path: Path, slack: FakeSlack, kube_url: str, fetched: Recording, **target: Any
) -> Harness:
    """A bot whose target prod-a is Service inference/vllm, read from the fake API."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    prod_a = {
        "vllm_url": "http://vllm.inference.svc:8000",
        "kubernetes_service": "inference/vllm",
        "kubernetes_api": {"api_url": kube_url, "token_file": str(token), "ca_file": None},
        **target,
    }
    return harness(tmp_path, slack=slack, transport=fetched, targets={"prod-a": prod_a})


async def discover(
    tmp_path: Path, slack: FakeSlack, kube_url: str, **target: Any
) -> tuple[str, list[str]]:
    """A /diagnose of prod-a (Service inference/vllm); what the thread shows and every URL the
    bot fetched."""
    fetched = Recording()
    h = fleet_harness(tmp_path, slack, kube_url, fetched, **target)
    try:
        return await diagnose(h, slack), fetched.urls
    finally:
        await h.close()


async def diagnose(h: Harness, slack: FakeSlack) -> str:
    """/diagnose prod-a to its end; every block the bot posted, as one JSON text."""
    await h.slash("prod-a")
    await slack.until("chat.update")
    await h.bot.tasks.drain()
    calls = slack.of("chat.postMessage") + slack.of("chat.update")
    return json.dumps([c.args for c in calls], ensure_ascii=False)


HOSTILE = [
    pytest.param("IPv4", "127.0.0.1", "a loopback address", id="loopback"),
    pytest.param("IPv4", "169.254.169.254", "a link-local address", id="metadata"),
    pytest.param("FQDN", "localhost", "addressType 'FQDN'", id="fqdn-localhost"),
    pytest.param("IPv6", "::1]:9/admin/secret?x=", "is not an IPv6 address", id="v6-path"),
    pytest.param("IPv6", "::1", "a loopback address", id="v6-loopback"),
    pytest.param("IPv6", "::ffff:169.254.169.254", "a link-local address", id="v4-mapped"),
    pytest.param("IPv4", "8.8.8.8", "outside kubernetes_networks", id="outside"),
    pytest.param("IPv6", "10.1.0.7", "is not an IPv6 address", id="wrong-family"),
]


@pytest.mark.parametrize(("family", "address", "why"), HOSTILE)
async def test_a_discovered_address_outside_the_pod_networks_is_never_fetched(
    tmp_path: Path, slack: FakeSlack, kube: FakeKube, kube_url: str,
    family: str, address: str, why: str,
) -> None:  # fmt: skip
    """Reproduction: the bot GET loopback and the metadata address, at a port and path of the
    slice's choosing, and said whether each answered."""
    kube.add_endpoint_slice("vllm", [{"ip": "10.1.0.7", "pod": "vllm-0"}])
    hostile = kube.add_endpoint_slice("vllm", [{"ip": address, "pod": "vllm-1"}])
    hostile["addressType"] = family
    shown, urls = await discover(tmp_path, slack, kube_url)
    assert urls == []  # not even the good replica: a fleet read partly is no fleet
    assert "endpoint address(es) refused, nothing was scraped" in shown
    assert why in shown
    assert "kubernetes_networks" in shown
    assert "unexpected" not in shown and "Traceback" not in shown


async def test_a_listed_loopback_network_is_fetched(
    tmp_path: Path, slack: FakeSlack, kube: FakeKube, kube_url: str
) -> None:
    """The check is the config's, not a blanket refusal: a network listed on purpose is read."""
    kube.add_endpoint_slice("vllm", [{"ip": "127.0.0.9", "pod": "vllm-0"}])
    _, urls = await discover(tmp_path, slack, kube_url, kubernetes_networks=["127.0.0.0/8"])
    assert urls and {u for u in urls} == {"http://127.0.0.9:8000/metrics"}


async def test_a_wide_network_does_not_let_in_the_metadata_address(
    tmp_path: Path, slack: FakeSlack, kube: FakeKube, kube_url: str
) -> None:
    """0.0.0.0/0 lists every address, but not the special blocks on purpose."""
    kube.add_endpoint_slice("vllm", [{"ip": "169.254.169.254", "pod": "vllm-0"}])
    shown, urls = await discover(tmp_path, slack, kube_url, kubernetes_networks=["0.0.0.0/0"])
    assert urls == []
    assert "169.254.169.254 is a link-local address" in shown


async def test_more_endpoints_than_the_cap_are_refused_before_any_scrape(
    tmp_path: Path, slack: FakeSlack, kube: FakeKube, kube_url: str
) -> None:
    """Reproduction: 100 endpoints were 100 scrapes."""
    kube.add_endpoint_slice("vllm", [{"ip": f"10.1.{n // 250}.{n % 250 + 1}"} for n in range(100)])
    shown, urls = await discover(tmp_path, slack, kube_url, kubernetes_max_replicas=64)
    assert urls == []
    assert "lists more than 64 ready endpoints: nothing was scraped" in shown


def _port_object(slice_: dict[str, Any]) -> None:
    slice_["ports"] = [{"name": "http", "port": {"$ne": 1}, "protocol": "TCP"}]


def _endpoints_string(slice_: dict[str, Any]) -> None:
    slice_["endpoints"] = "10.1.0.7"


def _port_out_of_range(slice_: dict[str, Any]) -> None:
    slice_["ports"] = [{"name": "http", "port": 70000, "protocol": "TCP"}]


def _port_udp(slice_: dict[str, Any]) -> None:
    slice_["ports"] = [{"name": "http", "port": 8000, "protocol": "UDP"}]


def _addresses_object(slice_: dict[str, Any]) -> None:
    slice_["endpoints"][0]["addresses"] = {"0": "10.1.0.7"}


@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        (_port_object, "is not a TCP port number 1-65535 (port 'dict'"),
        (_port_out_of_range, "is not a TCP port number 1-65535 (port 70000"),
        (_port_udp, "protocol 'UDP'"),
        (_endpoints_string, "an EndpointSlice's `endpoints` is not a list"),
        (_addresses_object, "an EndpointSlice's `addresses` is not a list"),
    ],
)
async def test_a_malformed_slice_is_said_not_a_traceback(
    tmp_path: Path, slack: FakeSlack, kube: FakeKube, kube_url: str, spoil: Any, said: str
) -> None:
    """Reproduction: a port that is an object, or endpoints that are a string, gave "probe
    failed unexpectedly" with a traceback."""
    spoil(kube.add_endpoint_slice("vllm", [{"ip": "10.1.0.7", "pod": "vllm-0"}]))
    shown, urls = await discover(tmp_path, slack, kube_url)
    assert urls == []
    assert said in shown
    assert "unexpected" not in shown and "Traceback" not in shown


# --- one bad ADR file costs only itself ---------------------------------------------------

HUGE = "9" * 400
BAD_ADRS = [
    pytest.param(
        lambda t: t.replace("  value: 1.0\n", f"  value: {HUGE}\n", 1),
        "is not a finite number",
        id="400-digit-integer",
    ),
    pytest.param(
        lambda t: t.replace("  value: 1.0\n", f"  value: {HUGE}x normal\n", 1),
        "the multiple is too large to be a number",
        id="400-digit-factor",
    ),
    pytest.param(
        lambda t: t.replace("  value: 1.0\n", f"  value: {'9' * 5000}\n", 1),
        "not a value an ADR can hold",
        id="5000-digit-integer",
    ),
    pytest.param(
        lambda t: t.replace("---\n", "---\ndeep: " + "[" * 3000 + "]" * 3000 + "\n", 1),
        "nested more than 32 levels deep",
        id="nested-3000-flow",
    ),
    pytest.param(
        lambda t: t.replace(
            "---\n",
            "---\ndeep:\n" + "".join(f"{'  ' * (n + 1)}k:\n" for n in range(300)) + "\n",
            1,
        ),
        "nested more than 32 levels deep",
        id="nested-300-block",
    ),
]


def bad_copy(adr_dir: Path, spoil: Any) -> str:
    """A spoilt copy of the store's one ADR under another id; its file name."""
    (seed,) = adr_dir.glob(f"{SEED}-*.md")
    text = spoil(seed.read_text()).replace(SEED, "ADR-20261201-07")
    name = "ADR-20261201-07-bad.md"
    (adr_dir / name).write_text(text)
    return name


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=slack, matching_adr=True)
    yield harness_
    await harness_.close()


@pytest.mark.parametrize(("spoil", "why"), BAD_ADRS)
async def test_one_bad_adr_file_is_skipped_and_every_diagnosis_still_matches(
    tmp_path: Path, slack: FakeSlack, spoil: Any, why: str
) -> None:
    """Reproduction: while the file was there every diagnosis failed, and the bot could not
    start (create_bot is what `ruleloop serve` runs)."""
    from tests.fakes.bot import adr_dir

    name = bad_copy(adr_dir(tmp_path, matching=True), spoil)
    h = harness(tmp_path, slack=slack, matching_adr=True)  # starts with the file there
    try:
        shown = await diagnose(h, slack)
    finally:
        await h.close()
    assert f"skipped ADR file {name}" in shown and why in shown
    assert f"Matching accepted ADRs: {SEED}" in shown  # the good one still matched
    assert "unexpected" not in shown


@pytest.mark.parametrize(("spoil", "why"), BAD_ADRS)
def test_adr_list_names_the_bad_file_and_why(tmp_path: Path, spoil: Any, why: str) -> None:
    store = tmp_path / "adr"
    shutil.copytree(ROOT / "adr", store)
    name = bad_copy(store, lambda t: spoil(t.replace("  value: 1000.0\n", "  value: 1.0\n", 1)))
    assert [p.name for p, _ in AdrStore(root=store).skipped()] == [name]
    result = CliRunner().invoke(cli, ["adr", "list", "--adr-dir", str(store)])
    # as for a typo: the file, the field and why, exit 2 (was "unexpected failure")
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {store / name}: ") and why in result.output
    assert "unexpected" not in result.output and len(result.output) < 600


# --- low findings: the condition grammar -------------------------------------------------


@pytest.mark.parametrize("spaces", [10_000, 200_000])
def test_a_condition_padded_with_spaces_is_read_in_one_pass(spaces: int) -> None:
    """Reproduction: the splitter was quadratic in whitespace (10k spaces 0.81 s, 50k 19 s;
    200k would take minutes). Now the text is split on whitespace once; an alarm far above the
    cost on the slowest machine (milliseconds here) stops the old behaviour, not a slow box."""
    import signal

    from bot.diagnosis.runbooks.conditions import parse

    def stuck(*_: object) -> None:
        raise TimeoutError(f"parsing {spaces} spaces took over 60 s")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    try:
        found = parse("vllm_metrics.ttft_p99_ms > 1" + " " * spaces + "and queue_cancel.x < 2")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert [len(group) for group in found.alternatives] == [2]


RUNBOOK_WITH = """
name: bad
probes:
  - {{probe: vllm_metrics, params: {{window_s: 2}}}}
findings:
  - {{when: "{when}", severity: info, message: "{message}"}}
"""


@pytest.mark.parametrize(
    ("when", "message", "said"),
    [
        ("vllm_metrics.ttft_p99_ms > 1", "p99 {value[0]}", "message may use only {value}"),
        ("vllm_metrics.ttft_p99_ms > " + "9" * 400, "x", "is not `probe.reading OP number`"),
    ],
)
def test_a_bad_finding_is_named_by_runbooks_validate_not_an_unexpected_failure(
    tmp_path: Path, when: str, message: str, said: str
) -> None:
    """Reproduction: a message `{value[0]}` was an "unexpected failure" in `runbooks validate`
    (and at start) instead of naming the file and field; a 400-digit limit was an infinite one."""
    path = tmp_path / "bad.yaml"
    path.write_text(RUNBOOK_WITH.format(when=when, message=message))
    result = CliRunner().invoke(cli, ["runbooks", "validate", str(path)])
    assert result.exit_code == 2, result.output
    assert "bad.yaml" in result.output and said in result.output
    assert "unexpected" not in result.output
