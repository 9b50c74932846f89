"""Reading the Kubernetes API, shared by the actuators that change or watch a Deployment.

The Kubernetes actuator patches a Deployment and the git actuator only watches one (Argo CD or
Flux apply the change), but both must read the same things the same way: a bearer token that
the kubelet rotates in place, the cluster's CA, ``kind: Status`` error bodies, which container
carries the vLLM flags, and when a rollout is complete (``rollout_waiting``, as ``kubectl
rollout status`` reads it). The client itself (token, CA) is bot.kernel.runtime.kube_client's.
Custom objects (Argo CD Applications, Flux Kustomizations) come through the same
``request_json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bot.change.actuators.base import ActuatorError
from bot.change.argv import read_flags
from bot.kernel.runtime import kube_client, status_message

ANNOTATION = "ruleloop.dev/applied-flags"
PATCH_TYPE = "application/strategic-merge-patch+json"
# what the message of an API error says, from its status code and the API's own message
Describe = Callable[[int, str], str]


class Conflict(Exception):
    """The API answered 409: the object changed since it was read."""


def client(
    api_url: str,
    *,
    token_file: Path | None,
    ca_file: Path | None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """An API client (bot.kernel.runtime.kube_client) whose token and CA failures are
    ActuatorErrors."""
    return kube_client.client(
        api_url, token_file=token_file, ca_file=ca_file, error=ActuatorError, transport=transport
    )


def deployment_path(namespace: str, name: str) -> str:
    """The apps/v1 path of one Deployment."""
    return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"


def custom_object_path(api_version: str, namespace: str, plural: str, name: str) -> str:
    """The path of one namespaced custom object, e.g. argoproj.io/v1alpha1 applications."""
    return f"/apis/{api_version}/namespaces/{namespace}/{plural}/{name}"


async def request_json(
    http: httpx.AsyncClient,
    method: str,
    path: str,
    *,
    what: str,
    describe: Describe,
    body: Any = None,
) -> dict[str, Any]:
    """One request; the answer's JSON object. Unreachable API, errors (``describe``'s text)
    and non-JSON answers are ActuatorError; 409 is Conflict. ``what`` names the object."""
    content = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json"}
    if content is not None:
        headers["Content-Type"] = PATCH_TYPE
    try:
        response = await http.request(method, path, content=content, headers=headers)
    except httpx.HTTPError as exc:
        raise ActuatorError(
            f"cannot reach the Kubernetes API at {http.base_url}: {type(exc).__name__}: {exc}"
        ) from exc
    if response.status_code == 409:
        raise Conflict(status_message(response))
    if response.is_error:
        raise ActuatorError(describe(response.status_code, status_message(response)))
    try:
        obj = response.json()
    except ValueError as exc:
        raise ActuatorError(
            f"the Kubernetes API at {http.base_url} answered {method} {what} with something "
            "that is not JSON"
        ) from exc
    if not isinstance(obj, dict):
        raise ActuatorError(f"the Kubernetes API answered {method} with {type(obj).__name__}")
    return obj


@dataclass(frozen=True)
class Container:
    """The container that carries the vLLM flags, and its Deployment's pod template."""

    name: str
    args: list[str]
    generation: int
    resource_version: str
    annotation: str | None  # the current ruleloop.dev/applied-flags value, None when unset


def find_container(obj: Mapping[str, Any], *, where: str, wanted: str | None) -> Container:
    """The container to read in a Deployment object (``wanted``, else the first); refused
    when it sets tunable flags in ``command`` (only ``args`` is read and rewritten)."""
    try:
        meta = obj["metadata"]
        template = obj["spec"]["template"]
        containers = template["spec"]["containers"]
    except (KeyError, TypeError) as exc:
        raise ActuatorError(
            f"the Kubernetes API answered for Deployment {where} without a pod "
            f"template ({exc!r} missing): is api_url really the Kubernetes API?"
        ) from exc
    names = [str(c.get("name")) for c in containers]
    found = next((c for c in containers if c.get("name") == wanted), None) if wanted else None
    if wanted is None and containers:
        found = containers[0]
    if found is None:
        raise ActuatorError(
            f"Deployment {where} has no container {wanted!r}; its containers: "
            f"{', '.join(names) or 'none'}. Set `container` in the target's actuator settings"
        )
    command = [str(a) for a in found.get("command") or []]
    if read_flags(command):
        raise ActuatorError(
            f"container {found['name']!r} of Deployment {where} sets tunable "
            f"vLLM flags in `command` ({', '.join(read_flags(command))}); ruleloop rewrites "
            "only `args`: move the flags there"
        )
    annotations = template.get("metadata", {}).get("annotations") or {}
    return Container(
        name=str(found["name"]),
        args=[str(a) for a in found.get("args") or []],
        generation=int(meta.get("generation", 0)),
        resource_version=str(meta.get("resourceVersion", "")),
        annotation=annotations.get(ANNOTATION),
    )


def rollout_waiting(deployment: Mapping[str, Any], generation: int) -> str | None:
    """What the rollout of ``generation`` still waits for (None: complete), read as
    ``kubectl rollout status`` reads it. Raises ActuatorError when the controller gave up."""
    meta, spec = deployment.get("metadata", {}), deployment.get("spec", {})
    status = deployment.get("status", {})
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    generation = max(generation, int(meta.get("generation", 0)))
    observed = int(status.get("observedGeneration", 0))
    if observed < generation:
        return f"the controller to see generation {generation} (it has seen {observed})"
    # The API omits zero counts, so every count defaults to 0 (and spec.replicas to 1).
    want = int(spec.get("replicas", 1))
    total = int(status.get("replicas", 0))
    updated = int(status.get("updatedReplicas", 0))
    available = int(status.get("availableReplicas", 0))
    counts = f"(wanted {want}, updated {updated}, total {total}, available {available})"
    for condition in status.get("conditions", []):
        if condition.get("type") == "Progressing" and (
            condition.get("reason") == "ProgressDeadlineExceeded"
        ):
            raise ActuatorError(
                f"the rollout of Deployment {name} exceeded its progress deadline "
                f"(ProgressDeadlineExceeded: {condition.get('message', 'no message')}) {counts}; "
                "its new pods did not become available, see `kubectl describe deployment` "
                "and the pods' logs"
            )
    if updated < want:
        return f"{updated} of {want} new replicas to be updated {counts}"
    if total > updated:
        return f"{total - updated} old replicas to terminate {counts}"
    if available < updated:
        return f"{available} of {updated} updated replicas to become available {counts}"
    return None
