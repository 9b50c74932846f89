"""Replicas discovered from a vllm-router, at the wire: a fake router over real HTTP answering
GET /workers in the shape vllm-router 0.1.17 answers it (checked against the real router in
tests/test_fleet_router_engine.py); each replica's /metrics from hand-built pages
(tests/test_fleet_merge.py's ``text``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from bot.diagnosis.probes.context import TargetRef, resolve_replicas
from bot.diagnosis.probes.replicas import Replica, source_of
from bot.diagnosis.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.kernel.config import Target
from bot.kernel.errors import ProbeError
from tests.test_fleet_endpointslices import metrics
from tests.test_fleet_merge import text


def worker(url: str, *, healthy: bool = True, kind: str = "regular") -> dict[str, Any]:
    """One entry of vllm-router's GET /workers, as 0.1.17 writes it."""
    return {"url": url, "model_id": "unknown", "worker_type": kind, "is_healthy": healthy,
            "load": 0, "connection_mode": "Http", "priority": 50, "cost": 1.0}  # fmt: skip


class FakeRouter:
    """GET /workers answers ``body`` (with ``status``); every request is counted."""

    def __init__(self) -> None:
        self.body: Any = {}
        self.status = 200
        self.requests: list[str] = []

    def serve(self, workers: list[dict[str, Any]]) -> None:
        regular = sum(w["worker_type"] == "regular" for w in workers)
        self.body = {"workers": workers, "total": len(workers),
                     "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": regular}}  # fmt: skip

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(request.path)
        return web.json_response(self.body, status=self.status)


@pytest.fixture
async def router() -> AsyncIterator[tuple[FakeRouter, str]]:
    fake = FakeRouter()
    app = web.Application()
    app.router.add_get("/workers", fake.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def target(router_url: str, **kwargs: Any) -> Target:
    return Target(vllm_url=router_url, router_url=router_url, **kwargs)


async def test_healthy_workers_become_replicas_read_once_per_window(
    router: tuple[FakeRouter, str],
) -> None:
    fake, url = router
    fake.serve([
        worker("http://10.1.0.7:8000"),
        worker("http://10.1.0.9:8000", healthy=False),  # the router sends it nothing
        worker("http://10.1.0.8:8000"),
        worker("http://10.1.0.8:8000@1"),  # a data-parallel rank of the same server
    ])  # fmt: skip
    assert source_of(target(url)) == "router_url"
    assert await resolve_replicas(target(url)) == [
        Replica("http://10.1.0.7:8000"), Replica("http://10.1.0.8:8000"),
    ]  # fmt: skip
    fake.requests.clear()
    ctx = metrics({
        "10.1.0.7": [text({}), text({0.01: 3}, finished=3), text({0.01: 4}, finished=4)],
        "10.1.0.8": [text({}, started=2000), text({0.05: 5}, started=2000, finished=5)],
    })  # fmt: skip
    result = await VllmMetricsProbe().run(
        target=TargetRef("prod", target(url)),
        params=WindowParams(window_s=2, interval_s=1),
        ctx=ctx,
    )
    assert result.readings.value("requests_finished") == 9
    assert set(result.details["replicas"]) == {"10.1.0.7:8000", "10.1.0.8:8000"}
    assert fake.requests == ["/workers"]  # at the window's start, not once per round


@pytest.mark.parametrize(
    ("workers", "error"),
    [
        ([], "routes to no healthy worker: no engine serves it now"),
        (
            [worker("http://10.1.0.7:8000", healthy=False)],
            r"no healthy worker \(1 unhealthy: http://10.1.0.7:8000\)",
        ),
        ([worker("http://169.254.169.254:80")], "169.254.169.254 is a link-local address"),
        ([worker("http://8.8.8.8:8000")], "8.8.8.8 is outside kubernetes_networks"),
        ([worker("http://vllm-0.vllm:8000")], "'vllm-0.vllm' is a host name, not an IP"),
        ([worker("grpc://10.1.0.7:8000")], "is not an http.s. URL"),
        (
            [worker("http://10.1.0.7:8000", kind="prefill")],
            "routes to prefill workers .prefill/decode disaggregation.",
        ),
    ],
)
async def test_a_list_the_bot_cannot_read_is_an_error_not_a_fleet(
    router: tuple[FakeRouter, str], workers: list[dict[str, Any]], error: str
) -> None:
    fake, url = router
    fake.serve(workers)
    with pytest.raises(ProbeError, match=error):
        await resolve_replicas(target(url))


async def test_loopback_workers_when_listed_on_purpose(router: tuple[FakeRouter, str]) -> None:
    fake, url = router
    fake.serve([worker("http://127.0.0.1:8001"), worker("http://127.0.0.1:8002")])
    with pytest.raises(ProbeError, match="127.0.0.1 is a loopback address"):
        await resolve_replicas(target(url))
    local = target(url, kubernetes_networks=["127.0.0.0/8"])
    assert [r.address for r in await resolve_replicas(local)] == [
        "127.0.0.1:8001", "127.0.0.1:8002",
    ]  # fmt: skip


async def test_too_many_workers_are_refused(router: tuple[FakeRouter, str]) -> None:
    fake, url = router
    fake.serve([worker(f"http://10.1.0.{i}:8000") for i in range(1, 4)])
    with pytest.raises(ProbeError, match="more than 2 healthy workers"):
        await resolve_replicas(target(url, kubernetes_max_replicas=2))


async def test_a_router_that_is_down_or_not_a_router_is_said(
    router: tuple[FakeRouter, str],
) -> None:
    fake, url = router
    fake.status, fake.body = 404, {"detail": "Not Found"}
    with pytest.raises(ProbeError, match="answered 404.*is router_url a vllm-router"):
        await resolve_replicas(target(url))
    fake.status, fake.body = 200, {"urls": ["http://10.1.0.7:8000"]}  # /list_workers' shape
    with pytest.raises(ProbeError, match="without a worker list"):
        await resolve_replicas(target(url))
    down = "http://127.0.0.1:9"  # discard: nothing listens
    with pytest.raises(ProbeError, match="did not answer .*check router_url"):
        await resolve_replicas(target(down))


async def test_listed_replicas_and_a_service_win_over_the_router() -> None:
    routed = target("http://10.0.0.1:30000", replicas=["http://10.0.3.11:8000"])
    assert source_of(routed) == "replicas"
    assert await resolve_replicas(routed) == [Replica("http://10.0.3.11:8000")]
    both = target("http://10.0.0.1:30000", kubernetes_service="inference/vllm")
    assert source_of(both) == "kubernetes_service"


@pytest.mark.parametrize("bad", ["10.0.0.1:30000", "ftp://r:1", "http://r:1/workers"])
def test_a_router_url_that_is_not_a_base_url_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="router_url"):
        Target(vllm_url="http://svc:8000", router_url=bad)
