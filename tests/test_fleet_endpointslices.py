"""Replicas discovered from a Kubernetes Service's EndpointSlices, at the wire: the fake API
(tests/fakes/kube_api.py) over real HTTP with a token file, as the bot reads it in a cluster;
each replica's /metrics from hand-built pages (tests/test_fleet_merge.py's ``text``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from bot.diagnosis import replicas as replica_rule
from bot.diagnosis.probes.context import ProbeContext, TargetRef, resolve_replicas
from bot.diagnosis.probes.replicas import Replica, source_of
from bot.diagnosis.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.diagnosis.runbooks.runner import RunbookResult
from bot.kernel.config import KubernetesApiSpec, Target
from bot.kernel.errors import ProbeError
from tests.fakes.clock import FakeTime
from tests.fakes.kube_api import FakeKube
from tests.fakes.kube_server import served_api
from tests.test_fleet_merge import text

SLICES = "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices"
POD_A = {"ip": "10.1.0.7", "pod": "vllm-0", "node": "gpu-node-1"}
POD_B = {"ip": "10.1.0.8", "pod": "vllm-1", "node": "gpu-node-2"}
POD_C = {"ip": "10.1.0.9", "pod": "vllm-2", "node": "gpu-node-3", "ready": False}


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def api(kube: FakeKube, tmp_path: Path) -> Iterator[KubernetesApiSpec]:
    yield from served_api(kube, tmp_path)


def target(api: KubernetesApiSpec, **kwargs: Any) -> Target:
    return Target(
        vllm_url="http://vllm.inference.svc:8000",
        kubernetes_service="inference/vllm",
        kubernetes_api=api,
        **kwargs,
    )


def metrics(served: dict[str, list[str | None]]) -> ProbeContext:
    """Each host answers its pages in order, repeating the last; None: connection refused."""

    def handler(request: httpx.Request) -> httpx.Response:
        pages = served[request.url.host]
        answer = pages.pop(0) if len(pages) > 1 else pages[0]
        if answer is None:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(200, text=answer)

    time = FakeTime()
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return ProbeContext(http=http, monotonic=time.clock, sleep=time.sleep)


async def test_ready_endpoints_become_replicas_with_pod_and_node(
    kube: FakeKube, api: KubernetesApiSpec
) -> None:
    kube.add_endpoint_slice("vllm", [POD_A, POD_C])
    kube.add_endpoint_slice("vllm", [{**POD_B, "ready": None}])  # unset ready: ready (API docs)
    kube.add_endpoint_slice("other", [{"ip": "10.9.9.9", "pod": "other-0"}])  # not the Service's
    replicas = await resolve_replicas(target(api))
    assert replicas == [
        Replica("http://10.1.0.7:8000", pod="vllm-0", node="gpu-node-1"),
        Replica("http://10.1.0.8:8000", pod="vllm-1", node="gpu-node-2"),
    ]
    (request,) = kube.requests
    assert (request.method, request.path, request.status) == ("GET", SLICES, 200)

    # the window reads both, each labelled by its address and said with its pod and node
    ctx = metrics({
        "10.1.0.7": [text({}), text({0.01: 4}, finished=4)],
        "10.1.0.8": [text({}, started=2000), text({0.05: 5}, started=2000, finished=5)],
    })  # fmt: skip
    result = await VllmMetricsProbe().run(
        target=TargetRef("prod", target(api)), params=WindowParams(window_s=1), ctx=ctx
    )
    assert result.readings.value("requests_finished") == 9
    rows = result.details["replicas"]
    assert set(rows) == {"10.1.0.7:8000", "10.1.0.8:8000"}
    assert (rows["10.1.0.8:8000"]["pod"], rows["10.1.0.8:8000"]["node"]) == ("vllm-1", "gpu-node-2")
    # ... and the replica rule's verdict carries them, for the advice and the finding
    run = RunbookResult(
        runbook="fleet",
        details={"vllm_metrics": result.details},
        windows={"vllm_metrics": result.window},  # type: ignore[dict-item]
    )
    verdict = replica_rule.of_run(run)
    assert verdict is not None
    assert verdict.pods == {"10.1.0.7:8000": "vllm-0", "10.1.0.8:8000": "vllm-1"}
    assert verdict.nodes == {"10.1.0.7:8000": "gpu-node-1", "10.1.0.8:8000": "gpu-node-2"}


async def test_a_named_port_is_chosen_among_several(kube: FakeKube, api: KubernetesApiSpec) -> None:
    ports = [{"name": "grpc", "protocol": "TCP", "port": 9000},
             {"name": "http", "protocol": "TCP", "port": 8001}]  # fmt: skip
    kube.add_endpoint_slice("vllm", [POD_A], ports=ports)
    (replica,) = await resolve_replicas(target(api, kubernetes_port="http"))
    assert replica.url == "http://10.1.0.7:8001"
    with pytest.raises(ProbeError, match=r"has 2 ports \('grpc', 'http'\): set kubernetes_port"):
        await resolve_replicas(target(api))
    with pytest.raises(ProbeError, match=r"no port named 'metrics'.*fix kubernetes_port"):
        await resolve_replicas(target(api, kubernetes_port="metrics"))


async def test_forbidden_says_which_rbac_to_add(kube: FakeKube, api: KubernetesApiSpec) -> None:
    kube.add_endpoint_slice("vllm", [POD_A])
    kube.forbidden = {"list"}
    with pytest.raises(ProbeError) as raised:
        await resolve_replicas(target(api))
    message = str(raised.value)
    assert "cannot read the EndpointSlices of Service inference/vllm (403: " in message
    assert 'cannot list resource "endpointslices"' in message  # the API's own words
    assert "get and list on endpointslices (apiGroup discovery.k8s.io) in namespace inference" in (
        message
    )


async def test_a_refused_token_and_an_unreachable_api_are_said(
    kube: FakeKube, api: KubernetesApiSpec, tmp_path: Path
) -> None:
    (tmp_path / "stale").write_text("expired")
    stale = api.model_copy(update={"token_file": tmp_path / "stale"})
    with pytest.raises(ProbeError, match=r"\(401: Unauthorized\); the token in kubernetes_api"):
        await resolve_replicas(target(stale))
    down = api.model_copy(update={"api_url": "http://127.0.0.1:9"})
    with pytest.raises(ProbeError, match="did not answer .*ConnectError.*kubernetes_api.api_url"):
        await resolve_replicas(target(down))


async def test_no_ready_endpoint_is_an_error_not_an_empty_fleet(
    kube: FakeKube, api: KubernetesApiSpec
) -> None:
    with pytest.raises(ProbeError, match="Service inference/vllm has no EndpointSlices: check"):
        await resolve_replicas(target(api))
    kube.add_endpoint_slice("vllm", [POD_C])
    kube.add_endpoint_slice("vllm", [])  # the controller's placeholder: endpoints null
    with pytest.raises(ProbeError, match=r"no ready endpoints \(1 not ready: vllm-2\)"):
        await resolve_replicas(target(api))
    # through a probe too: the window fails, it is never read as a fleet that served nothing
    ctx = metrics({})
    with pytest.raises(ProbeError, match="no ready endpoints"):
        await VllmMetricsProbe().run(
            target=TargetRef("prod", target(api)), params=WindowParams(window_s=1), ctx=ctx
        )


async def test_a_replica_that_disappears_mid_window_is_said_not_zero(
    kube: FakeKube, api: KubernetesApiSpec
) -> None:
    kube.add_endpoint_slice("vllm", [POD_A, POD_B])
    # vllm-1 answers the first scrape, then its pod is gone (connection refused)
    ctx = metrics({
        "10.1.0.7": [text({}), text({0.01: 3}, finished=3), text({0.01: 6}, finished=6)],
        "10.1.0.8": [text({}, started=2000), None],
    })  # fmt: skip
    result = await VllmMetricsProbe().run(
        target=TargetRef("prod", target(api)),
        params=WindowParams(window_s=2, interval_s=1),
        ctx=ctx,
    )
    assert result.readings.value("requests_finished") == 6  # vllm-0's alone
    gone = result.details["replicas"]["10.1.0.8:8000"]
    assert gone["pod"] == "vllm-1" and gone["requests_finished"] is None  # not 0
    assert "answered 1 of 3 scrapes and is left out of the fleet's numbers" in gone["note"]
    assert "Connection refused" in gone["note"]
    # resolved once, at the window's start, not once per round
    assert [r.path for r in kube.requests] == [SLICES]


async def test_listed_replicas_win_and_the_api_is_not_read(
    kube: FakeKube, api: KubernetesApiSpec
) -> None:
    listed = target(api, replicas=["http://10.0.3.11:8000"])
    assert source_of(listed) == "replicas"
    assert await resolve_replicas(listed) == [Replica("http://10.0.3.11:8000")]
    assert kube.requests == []
    assert source_of(target(api)) == "kubernetes_service"
    assert source_of(Target(vllm_url="http://svc:8000")) == "vllm_url"


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"kubernetes_service": "vllm"}, "is not `namespace/name` of a Service"),
        ({"kubernetes_service": "inference/vLLM"}, "is not `namespace/name` of a Service"),
        ({"kubernetes_service": "a/b/c"}, "is not `namespace/name` of a Service"),
        ({"kubernetes_service": "inference/"}, "is not `namespace/name` of a Service"),
        ({"kubernetes_service": "inference/vllm", "kubernetes_port": "HTTP"}, "port name"),
        ({"kubernetes_service": "inference/vllm", "kubernetes_port": "8000"}, "port name"),
        ({"kubernetes_port": "http"}, "kubernetes_port names a port of kubernetes_service"),
    ],
)
def test_bad_service_settings_are_refused(settings: dict[str, str], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        Target(vllm_url="http://svc:8000", **settings)  # type: ignore[arg-type]
