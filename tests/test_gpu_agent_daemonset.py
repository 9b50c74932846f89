"""The NVML agent found per node (issue 44 item 3): a target names the DaemonSet of its `ruleloop
agent` pods (gpu_agent_daemonset) instead of one gpu_agent_url. The bot reads the DaemonSet and
its pods from the Kubernetes API (the fake one, over HTTP), finds the Ready pod it controls on each
replica's node, checks its address as a discovered replica's is, and reads that agent (a real
`ruleloop agent` process per node, each on its own loopback address, its NVML the fake one).
When the fleet verdict names a slow replica, gpu_fault is judged on its own node's GPUs.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.adr import AdrStore
from bot.diagnosis import Diagnoser, Diagnosis
from bot.diagnosis.probes import ProbeContext, TargetRef
from bot.diagnosis.probes.nvml import NvmlParams, NvmlProbe
from bot.diagnosis.probes.types import ProbeResult, Severity
from bot.diagnosis.runbooks import RunbookRunner, default_registry, load_dir
from bot.engine.process import free_port
from bot.kernel import KubernetesApiSpec, ProbeError
from bot.kernel.config import Target
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import FakeKube
from tests.fakes.kube_server import served_api
from tests.fakes.metrics_server import RecordedMetrics
from tests.fakes.nvml import FakeNvml
from tests.fakes.nvml_agent import running_agent
from tests.test_fleet_diagnosis import FAST, SLOW, page

ROOT = Path(__file__).parent.parent
H200 = ROOT / "tests" / "fixtures" / "nvml" / "h200-x2.json"
AGENT_LABELS = {"app.kubernetes.io/name": "ruleloop-nvml-agent"}
DAEMONSET = "inference/ruleloop-nvml-agent"
# each node's agent pod, on its own loopback address (listed on purpose in kubernetes_networks)
NODES = {"gpu-1": "127.0.0.2", "gpu-2": "127.0.0.3"}
NETWORKS = ["127.0.0.0/8"]


@contextmanager
def agents(tmp_path: Path, masks: Mapping[str, int]) -> Iterator[int]:
    """A real agent per node of ``masks``, GPU 0's clock-event reasons as given (GPU 1 none),
    all on one port; yields the port."""
    port = free_port()
    with ExitStack() as stack:
        for node, mask in masks.items():
            reading = json.loads(H200.read_text())
            reading["gpus"][0]["clock_event_reasons"] = mask
            reading["gpus"][1]["clock_event_reasons"] = 0
            where = tmp_path / node
            where.mkdir()
            (where / "gpus.json").write_text(json.dumps(reading))
            stack.enter_context(running_agent(where, "--fixture", str(where / "gpus.json"),
                                              host=NODES[node], port=port))  # fmt: skip
        yield port


def agent_pods(kube: FakeKube, *, ready: bool = True) -> None:
    """The DaemonSet and its pod on each node; a pod with the same labels on gpu-1 that the
    DaemonSet does not control (never read: nothing listens at its address)."""
    daemonset = kube.add_daemonset("ruleloop-nvml-agent", labels=AGENT_LABELS)
    kube.add_pod("impostor", "127.0.0.9", labels=AGENT_LABELS, node="gpu-1")
    for i, (node, ip) in enumerate(NODES.items()):
        kube.add_pod(f"ruleloop-nvml-agent-{i}", ip, labels=AGENT_LABELS, node=node,
                     owner=daemonset, ready=ready or node == "gpu-1")  # fmt: skip


def fleet_slices(kube: FakeKube, ports: Mapping[str, int]) -> None:
    """Service inference/vllm: one ready endpoint per replica, ``gpu-1``'s first."""
    for (node, port), pod in zip(ports.items(), ("vllm-a", "vllm-b"), strict=True):
        kube.add_endpoint_slice("vllm", [{"ip": "127.0.0.1", "pod": pod, "node": node}],
                                ports=[{"name": "http", "protocol": "TCP", "port": port}])  # fmt: skip


def target(api: KubernetesApiSpec, port: int, token_file: Path, **more: Any) -> Target:
    return Target(
        vllm_url="http://127.0.0.1:1", kubernetes_service="inference/vllm", kubernetes_api=api,
        kubernetes_networks=NETWORKS, gpu_agent_daemonset=DAEMONSET, gpu_agent_port=port,
        gpu_agent_token_file=token_file, **more,
    )  # fmt: skip


async def probe(spec: Target) -> ProbeResult:
    async with httpx.AsyncClient(timeout=30) as http:
        ctx = ProbeContext(http=http, nvml=FakeNvml.no_driver(), hostname="bot-pod")
        return await NvmlProbe().run(target=TargetRef("prod-a", spec), params=NvmlParams(),
                                     ctx=ctx)  # fmt: skip


@pytest.fixture
def kube() -> FakeKube:
    fake = FakeKube()
    fleet_slices(fake, {"gpu-1": 8000, "gpu-2": 8001})
    return fake


@pytest.fixture
def api(kube: FakeKube, tmp_path: Path) -> Iterator[KubernetesApiSpec]:
    yield from served_api(kube, tmp_path)


async def test_each_replicas_node_has_its_agent_read(
    kube: FakeKube, api: KubernetesApiSpec, tmp_path: Path
) -> None:
    """Both replicas' nodes: each node's agent read, every GPU together (the worst counts),
    each node's own readings beside; the pod that only shares the agent's labels is not read."""
    agent_pods(kube)
    with agents(tmp_path, {"gpu-1": 0x8, "gpu-2": 0x4}) as port:
        result = await probe(target(api, port, tmp_path / "gpu-1" / "agent-token"))
    r = result.readings.numbers
    assert r["gpu_count"] == 4 and r["slowdown_gpus"] == 1 and r["power_capped_gpus"] == 1
    assert r["xid_errors"] == 0 and r["ecc_uncorrected"] == 0
    nodes = result.details["nodes"]
    assert nodes["gpu-1"]["slowdown_gpus"] == 1 and nodes["gpu-2"]["slowdown_gpus"] == 0
    assert nodes["gpu-2"]["power_capped_gpus"] == 1
    assert result.details["source"] == {"kind": "daemonset", "where": DAEMONSET}
    shown = [(f.severity, f.message) for f in result.findings]
    assert (Severity.WARNING, "GPU 0 on node gpu-1 is throttled: hardware slowdown") in shown
    assert (Severity.INFO, "GPU 0 on node gpu-2 is throttled: software power cap") in shown
    asked = [r.path for r in kube.requests]
    assert "/apis/apps/v1/namespaces/inference/daemonsets/ruleloop-nvml-agent" in asked


async def test_a_node_whose_agent_is_not_ready_is_said_and_rules_nothing_out(
    kube: FakeKube, api: KubernetesApiSpec, tmp_path: Path
) -> None:
    """gpu-2's agent pod is not Ready: it is not read, the thread says so, and the clear
    readings of gpu-1 alone cannot rule a GPU fault out (they read unknown, not 0)."""
    agent_pods(kube, ready=False)
    with agents(tmp_path, {"gpu-1": 0x0}) as port:
        result = await probe(target(api, port, tmp_path / "gpu-1" / "agent-token"))
    r = result.readings.numbers
    assert r["gpu_count"] == 2 and r["xid_errors"] is None and r["slowdown_gpus"] is None
    warnings = [f.message for f in result.findings if f.severity is Severity.WARNING]
    assert warnings == [
        "no GPU reading of node gpu-2: its agent pod ruleloop-nvml-agent-1 is not Ready"
    ]


async def test_an_agent_address_outside_the_networks_is_refused(
    kube: FakeKube, api: KubernetesApiSpec, tmp_path: Path
) -> None:
    """As a discovered replica's: an agent pod's IP outside kubernetes_networks refuses the
    discovery, and no agent is read."""
    agent_pods(kube)
    spec = target(api, 9401, tmp_path / "token")
    kube.pods["inference"][1]["status"]["podIP"] = "169.254.169.254"  # gpu-1's agent
    with pytest.raises(ProbeError, match=r"agent pod ruleloop-nvml-agent-0 on node gpu-1 was "
                       r"refused, no agent was read: 169\.254\.169\.254 is a link-local"):  # fmt: skip
        await probe(spec)


async def test_without_rights_on_daemonsets_the_error_says_which_to_grant(
    kube: FakeKube, api: KubernetesApiSpec, tmp_path: Path
) -> None:
    agent_pods(kube)
    kube.forbidden.add("get")
    with pytest.raises(ProbeError, match="grant the bot's service account get on daemonsets"):
        await probe(target(api, 9401, tmp_path / "token"))


async def diagnose(
    api: KubernetesApiSpec, agent_port: int, token_file: Path, tmp_path: Path
) -> Diagnosis:
    """The nvml runbook (vllm-latency) on the fleet, the window's clock moved by its sleeps."""
    time = FakeTime()
    async with httpx.AsyncClient(timeout=30) as http:
        diagnoser = Diagnoser(
            runbooks=load_dir(ROOT / "runbooks", default_registry()),
            runner=RunbookRunner(registry=default_registry()),
            adrs=AdrStore(root=tmp_path / "adrs"),
            context=lambda: ProbeContext(http=http, monotonic=time.clock, sleep=time.sleep),
            clock=lambda: dt.datetime(2026, 11, 29, tzinfo=dt.UTC),
        )
        spec = target(api, agent_port, token_file)
        return await diagnoser.diagnose(
            TargetRef("prod-a", spec), labels={"alertname": "VLLMTimeToFirstTokenP99High"}
        )


@pytest.mark.parametrize(("slow_node_mask", "verdict"), [(0x8, "supported"), (0x0, "ruled_out")])
async def test_the_slow_replicas_node_is_judged_on_its_own_gpus(
    tmp_path: Path, slow_node_mask: int, verdict: str
) -> None:
    """The slow replica runs on gpu-1: a hardware slowdown there supports gpu_fault on its
    node's GPUs; with gpu-1 clear and the slowdown on gpu-2 (the other replica's node), the
    fleet's worst GPU is faulty but the slow replica's node is not blamed."""
    with ExitStack() as stack:
        pages = {n: [page(t, started=1000.0 + i, scrape=k) for k in range(1, 60)]
                 for i, (n, t) in enumerate((("gpu-1", SLOW), ("gpu-2", FAST)))}  # fmt: skip
        engines = {n: stack.enter_context(RecordedMetrics(p)) for n, p in pages.items()}
        kube = FakeKube()
        fleet_slices(kube, {n: int(e.base_url.rsplit(":", 1)[1]) for n, e in engines.items()})
        agent_pods(kube)
        api = stack.enter_context(contextmanager(served_api)(kube, tmp_path))
        other = 0x0 if slow_node_mask else 0x8
        port = stack.enter_context(agents(tmp_path, {"gpu-1": slow_node_mask, "gpu-2": other}))
        diagnosis = await diagnose(api, port, tmp_path / "gpu-1" / "agent-token", tmp_path)
    slow = engines["gpu-1"].base_url.removeprefix("http://")
    assert diagnosis.replicas is not None
    assert [r.address for r in diagnosis.replicas.slow] == [slow]
    assert diagnosis.readings.value("nvml.slowdown_gpus") == 1  # the fleet's worst, either way
    (gpu,) = [v for v in diagnosis.causes if v.cause == "gpu_fault"]
    assert gpu.verdict == verdict, gpu
    assert gpu.number is not None and gpu.number.startswith(f"{slow}'s node gpu-1: ")
    if verdict == "supported":
        assert gpu.evidence.startswith(f"the slow replica {slow}'s node gpu-1: ")
        assert "GPUs slowed down: 1" in gpu.number
    else:
        assert "GPUs slowed down: 0" in gpu.number
        assert "the fleet's worst GPU, not the slow replica's: GPUs slowed down: 1" in gpu.number


async def test_replicas_without_known_nodes_say_how_to_name_them(tmp_path: Path) -> None:
    """Replicas listed by URL carry no node: nothing is asked of the API, and the warning says
    how to let the bot know the nodes."""
    spec = Target(
        vllm_url="http://10.0.0.7:8000", replicas=["http://10.0.0.7:8000", "http://10.0.0.8:8000"],
        gpu_agent_daemonset=DAEMONSET, gpu_agent_token_file=tmp_path / "token",
    )  # fmt: skip
    result = await probe(spec)
    (warning,) = [f.message for f in result.findings if f.severity is Severity.WARNING]
    assert "no node of prod-a's replicas is known; name them by kubernetes_service or " in warning
    assert result.readings.numbers == {}
