"""A target's replicas from an InferencePool (the Gateway API Inference Extension, as llm-d
deploys it), read from the Kubernetes API at the wire: the pool (v1, or v1alpha2 where the
cluster serves only that), then the Ready pods its selector matches, on its target port.

The fake API serves the objects as the API server returns them (tests/fakes/kube_api.py) over
real HTTP; the pool objects are shaped as the Inference Extension's CRDs define them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bot.diagnosis.probes.context import TargetRef, resolve_replicas
from bot.diagnosis.probes.replicas import Replica, source_of
from bot.diagnosis.probes.vllm_window import VllmMetricsProbe, WindowParams
from bot.kernel.config import KubernetesApiSpec, Target
from bot.kernel.errors import ProbeError
from tests.fakes.kube_api import FakeKube
from tests.fakes.kube_server import served_api
from tests.test_fleet_endpointslices import metrics
from tests.test_fleet_merge import text

V1 = "/apis/inference.networking.k8s.io/v1/namespaces/llm-d/inferencepools/qwen-pool"
V1ALPHA2 = "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/llm-d/inferencepools/qwen-pool"
LABELS = {"llm-d.ai/inferenceServing": "true", "llm-d.ai/model": "qwen"}


def pool_v1(port: int = 8000) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "qwen-pool", "namespace": "llm-d"},
        "spec": {"selector": {"matchLabels": LABELS}, "targetPorts": [{"number": port}],
                 "endpointPickerRef": {"name": "qwen-epp", "port": {"number": 9002}}},
    }  # fmt: skip


def pool_v1alpha2(port: int = 8200) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
        "metadata": {"name": "qwen-pool", "namespace": "llm-d"},
        "spec": {"selector": LABELS, "targetPortNumber": port,
                 "extensionRef": {"name": "qwen-epp"}},
    }  # fmt: skip


@pytest.fixture
def kube() -> FakeKube:
    fake = FakeKube()
    fake.add_pod("qwen-decode-0", "10.2.0.7", labels=LABELS, namespace="llm-d", node="gpu-1")
    fake.add_pod("qwen-decode-1", "10.2.0.8", labels=LABELS, namespace="llm-d", node="gpu-2")
    fake.add_pod("qwen-decode-2", "10.2.0.9", labels=LABELS, namespace="llm-d", ready=False)
    fake.add_pod("qwen-decode-3", "10.2.0.10", labels=LABELS, namespace="llm-d", deleting=True)
    fake.add_pod("other-0", "10.2.0.20", labels={"app": "other"}, namespace="llm-d")
    return fake


@pytest.fixture
def api(kube: FakeKube, tmp_path: Path) -> Iterator[KubernetesApiSpec]:
    yield from served_api(kube, tmp_path)


def target(api: KubernetesApiSpec, **kwargs: Any) -> Target:
    return Target(vllm_url="http://qwen-gateway.llm-d.svc:80", inference_pool="llm-d/qwen-pool",
                  kubernetes_api=api, **kwargs)  # fmt: skip


async def test_the_pools_ready_pods_are_the_replicas_and_the_window_reads_each(
    kube: FakeKube, api: KubernetesApiSpec
) -> None:
    kube.custom[V1] = pool_v1()
    assert source_of(target(api)) == "inference_pool"
    replicas = await resolve_replicas(target(api))
    assert replicas == [
        Replica("http://10.2.0.7:8000", pod="qwen-decode-0", node="gpu-1"),
        Replica("http://10.2.0.8:8000", pod="qwen-decode-1", node="gpu-2"),
    ]  # not ready, being deleted and another app's pod left out
    paths = [r.path for r in kube.requests]
    assert paths == [V1, "/api/v1/namespaces/llm-d/pods"]
    ctx = metrics({
        "10.2.0.7": [text({}), text({0.01: 4}, finished=4)],
        "10.2.0.8": [text({}, started=2000), text({0.05: 5}, started=2000, finished=5)],
    })  # fmt: skip
    result = await VllmMetricsProbe().run(
        target=TargetRef("qwen", target(api)), params=WindowParams(window_s=1), ctx=ctx
    )
    assert result.readings.value("requests_finished") == 9
    assert result.details["replicas"]["10.2.0.8:8000"]["pod"] == "qwen-decode-1"


async def test_a_cluster_with_only_v1alpha2_is_read_too(
    kube: FakeKube, api: KubernetesApiSpec
) -> None:
    kube.custom[V1ALPHA2] = pool_v1alpha2(port=8200)
    replicas = await resolve_replicas(target(api))
    assert [r.url for r in replicas] == ["http://10.2.0.7:8200", "http://10.2.0.8:8200"]
    assert [r.status for r in kube.requests[:2]] == [404, 200]


async def test_failures_are_said_never_an_empty_fleet(
    kube: FakeKube, api: KubernetesApiSpec
) -> None:
    with pytest.raises(
        ProbeError, match=r"InferencePool llm-d/qwen-pool not found .*fix inference_pool"
    ):
        await resolve_replicas(target(api))
    kube.custom[V1] = pool_v1()
    kube.forbidden.add("list")
    with pytest.raises(ProbeError, match=r"403.*list on pods in namespace llm-d"):
        await resolve_replicas(target(api))
    kube.forbidden.clear()
    kube.pods["llm-d"] = [
        p for p in kube.pods["llm-d"] if p["metadata"]["name"] in ("qwen-decode-2",)
    ]
    with pytest.raises(ProbeError, match=r"selects no ready pod \(1 not ready: qwen-decode-2\)"):
        await resolve_replicas(target(api))
    kube.custom[V1] = {**pool_v1(), "spec": {"targetPorts": [{"number": 8000}]}}
    with pytest.raises(ProbeError, match="its selector names no pod labels"):
        await resolve_replicas(target(api))


@pytest.mark.parametrize(
    ("ip", "said"),
    [("169.254.169.254", "link-local"), ("127.0.0.1", "loopback"), ("8.8.8.8", "outside kubernetes_networks"),
     ("not-an-ip", "is not an IPv4 address")],
)  # fmt: skip
async def test_a_pod_address_outside_the_allowed_networks_refuses_the_discovery(
    kube: FakeKube, api: KubernetesApiSpec, ip: str, said: str
) -> None:
    kube.custom[V1] = pool_v1()
    kube.add_pod("qwen-decode-9", ip, labels=LABELS, namespace="llm-d")
    with pytest.raises(
        ProbeError,
        match=rf"1 pod address\(es\) refused, nothing was scraped: qwen-decode-9: .*{said}",
    ):
        await resolve_replicas(target(api))


async def test_more_pods_than_allowed_is_refused(kube: FakeKube, api: KubernetesApiSpec) -> None:
    kube.custom[V1] = pool_v1()
    with pytest.raises(ProbeError, match="selects more than 1 ready pods"):
        await resolve_replicas(target(api, kubernetes_max_replicas=1))


def test_a_bad_pool_reference_is_refused() -> None:
    with pytest.raises(ValidationError, match="is not `namespace/name` of an InferencePool"):
        Target(vllm_url="http://x:8000", inference_pool="qwen-pool")
