"""A fake of the Kubernetes API for apps/v1 Deployments, at the HTTP level (an httpx transport).

Faithful where the actuator depends on it:
- objects have the real apps/v1 shape (``spec.template.spec.containers[].args``, status fields
  as the API names them, zero counts omitted as the API's ``omitempty`` does);
- GET and PATCH on ``/apis/apps/v1/namespaces/{ns}/deployments/{name}``; errors are
  ``kind: Status`` bodies with the API's own messages (401, 403, 404, 409, 415, 400);
- PATCH takes only ``application/strategic-merge-patch+json`` (the real API also takes JSON
  patch, JSON merge patch and apply patch, but only a strategic merge merges containers by
  name, so anything else here is a bug in the caller and answered 415); lists with a patch
  merge key (containers by ``name``, ...) are merged element by element, other lists replaced,
  ``null`` deletes a map key; ``metadata.resourceVersion`` in a patch is a precondition (409);
  ``status`` in a patch is ignored (it is a subresource);
- ``metadata.generation`` rises only when the spec changes; ``resourceVersion`` on every write;
- a deployment controller that moves one step on each GET of that Deployment, before the
  answer: first a step where it has not yet seen the new generation (observedGeneration
  lags), then it observes it, then per replica one surge step (a new pod, not yet available;
  an old pod goes too when ``maxUnavailable`` allows) and one settle step (the new pod becomes
  available; an old pod goes if none went at the surge), and old pods go last, so
  callers see every intermediate state ``kubectl rollout status`` waits through. Status
  writes bump resourceVersion, as in the real API.
  ``stall(name)`` makes the next rollout hang after one new pod and, after some polls, report
  ``Progressing=False, reason=ProgressDeadlineExceeded`` as the real controller does.

DaemonSets (``add_daemonset``) are answered to GET at
``/apis/apps/v1/namespaces/{ns}/daemonsets/{name}``, as custom objects are.

Custom objects (an Argo CD Application, a Flux Kustomization) are answered to GET at
``/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}`` from ``custom``, which a test-side
GitOps controller (``tests.fakes.gitops_controller``) keeps up to date; a missing one is a 404
``kind: Status`` as the API server writes it.

EndpointSlices (discovery.k8s.io/v1) are answered to a list with a label selector,
``/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=k=v[,k=v]`` (equality
only, as the bot asks), as an ``EndpointSliceList`` whose items have the shape the
EndpointSlice controller writes (``add_endpoint_slice``); ``forbidden`` holding "list" answers
403 with the API's own message.

Every request is recorded (method, path, content type, parsed body) for assertions.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

TOKEN = "kube-test-token"
PATCH_TYPE = "application/strategic-merge-patch+json"
_PREFIX = "/apis/apps/v1/namespaces/"
_SLICES_PREFIX = "/apis/discovery.k8s.io/v1/namespaces/"
_TIMESTAMP = "2026-09-01T02:00:00Z"
# patchMergeKey of the lists a Deployment holds (from the Kubernetes API's struct tags)
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
}


@dataclass
class Recorded:
    """One request the fake answered."""

    method: str
    path: str
    content_type: str | None
    body: Any  # the parsed JSON body, or None
    status: int


@dataclass
class _Rollout:
    """The controller's view of one Deployment: pods of the old and of the new template."""

    old: int  # available pods of earlier templates
    new: int  # pods of the current template
    new_available: int
    stalled: bool = False
    deadline_after: int | None = None  # polls before a stalled rollout reports the deadline
    polls: int = 0
    noticed: bool = False  # the controller has had one look at a new generation


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``kind: Status`` failure body, as the API server writes it."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def strategic_merge(original: Any, patch: Any, field: str = "") -> Any:
    """``original`` with ``patch`` applied as a strategic merge patch (no $-directives)."""
    if isinstance(patch, dict) and isinstance(original, dict):
        merged = dict(original)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:  # a new map drops its nulls too
                merged[key] = strategic_merge({} if isinstance(value, dict) else [], value, key)
        return merged
    key = _MERGE_KEYS.get(field)
    if key and isinstance(patch, list) and isinstance(original, list):
        merged_list = [copy.deepcopy(item) for item in original]
        for item in patch:
            match = next(
                (i for i, old in enumerate(merged_list) if old.get(key) == item[key]), None
            )
            if match is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[match] = strategic_merge(merged_list[match], item)
        return merged_list
    return copy.deepcopy(patch)


class FakeKube:
    """Deployments in memory behind ``transport``; ``requests`` records every call."""

    def __init__(self, *, token: str | None = TOKEN) -> None:
        self.token = token
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[Recorded] = []
        self.forbidden: set[str] = set()  # verbs ("get", "patch") the service account lacks
        # someone else's edits: each lands on the stored object just before one PATCH
        self.before_patch: list[Callable[[dict[str, Any]], None]] = []
        # mutating admission webhooks: each may change every object a PATCH is about to store
        self.admission: list[Callable[[dict[str, Any]], None]] = []
        # custom objects by path (/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/x)
        self.custom: dict[str, dict[str, Any]] = {}
        # EndpointSlice objects by namespace, in creation order (add_endpoint_slice)
        self.endpoint_slices: dict[str, list[dict[str, Any]]] = {}
        # Pod objects by namespace, in creation order (add_pod)
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self._rollouts: dict[tuple[str, str], _Rollout] = {}
        self._stall: dict[tuple[str, str], int | None] = {}
        self._versions = itertools.count(1000)
        self._uids = itertools.count(1)

    @property
    def transport(self) -> httpx.MockTransport:
        """An httpx transport that answers from this fake."""
        return httpx.MockTransport(self.handle)

    # --- setting up and inspecting -----------------------------------------------------------

    def add_deployment(
        self,
        name: str,
        *,
        namespace: str = "inference",
        args: list[str] | None = None,
        containers: list[dict[str, Any]] | None = None,
        replicas: int = 3,
    ) -> dict[str, Any]:
        """A fully rolled-out Deployment whose (first) ``vllm`` container runs ``args``."""
        if containers is None:
            containers = [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "args": list(args or []),
                    "ports": [{"containerPort": 8000, "name": "http", "protocol": "TCP"}],
                }
            ]
        labels = {"app": name}
        obj: dict[str, Any] = {
            "kind": "Deployment",
            "apiVersion": "apps/v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"00000000-0000-4000-8000-{next(self._uids):012d}",
                "resourceVersion": str(next(self._versions)),
                "generation": 1,
                "creationTimestamp": _TIMESTAMP,
                "labels": labels,
                "annotations": {"deployment.kubernetes.io/revision": "1"},
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": containers, "restartPolicy": "Always"},
                },
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
                },
                "revisionHistoryLimit": 10,
                "progressDeadlineSeconds": 600,
            },
        }
        key = (namespace, name)
        self.deployments[key] = obj
        self._rollouts[key] = _Rollout(old=0, new=replicas, new_available=replicas)
        self._write_status(key, observed=1)
        return obj

    def add_endpoint_slice(
        self,
        service: str,
        endpoints: list[dict[str, Any]],
        *,
        namespace: str = "inference",
        ports: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """An EndpointSlice of Service ``service`` as its controller writes it; each endpoint
        is ``{"ip", "pod", "node", "ready"}`` (ready None: the condition left unset)."""
        name = f"{service}-{next(self._uids):05x}"
        items = []
        for e in endpoints:
            conditions = {} if e.get("ready", True) is None else {"ready": e.get("ready", True)}
            if conditions:
                conditions |= {"serving": conditions["ready"], "terminating": False}
            item: dict[str, Any] = {"addresses": [e["ip"]], "conditions": conditions}
            if e.get("pod"):
                item["targetRef"] = {
                    "kind": "Pod", "namespace": namespace, "name": e["pod"],
                    "uid": f"uid-{e['pod']}",
                }  # fmt: skip
            if e.get("node"):
                item["nodeName"] = e["node"]
            items.append(item)
        obj: dict[str, Any] = {
            "metadata": {
                "name": name, "generateName": f"{service}-", "namespace": namespace,
                "uid": f"uid-{name}", "resourceVersion": str(next(self._versions)),
                "generation": 1, "creationTimestamp": _TIMESTAMP,
                "labels": {
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Service", "name": service,
                    "uid": f"uid-svc-{service}", "controller": True, "blockOwnerDeletion": True,
                }],
            },
            "addressType": "IPv4",
            "endpoints": items or None,  # the API writes null for a slice without endpoints
            "ports": ports if ports is not None else [
                {"name": "http", "protocol": "TCP", "port": 8000}
            ],
        }  # fmt: skip
        self.endpoint_slices.setdefault(namespace, []).append(obj)
        return obj

    def add_pod(
        self,
        name: str,
        ip: str | None,
        *,
        labels: dict[str, str],
        namespace: str = "inference",
        node: str | None = None,
        ready: bool = True,
        deleting: bool = False,
        owner: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A Pod as the API returns it: its labels, node, podIP and Ready condition (and, with
        ``owner``, the controller reference its DaemonSet's controller writes)."""
        meta: dict[str, Any] = {
            "name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels,
            "resourceVersion": str(next(self._versions)), "creationTimestamp": _TIMESTAMP,
        }  # fmt: skip
        if owner is not None:
            meta["ownerReferences"] = [
                {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "controller": True,
                 "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                 "blockOwnerDeletion": True}
            ]  # fmt: skip
        if deleting:
            meta["deletionTimestamp"] = _TIMESTAMP
        status: dict[str, Any] = {
            "phase": "Running",
            "conditions": [{"type": t, "status": "True" if ready or t == "PodScheduled" else "False"}
                           for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
        }  # fmt: skip
        if ip is not None:
            status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
               "spec": {"nodeName": node} if node else {}, "status": status}  # fmt: skip
        self.pods.setdefault(namespace, []).append(obj)
        return obj

    def add_daemonset(
        self, name: str, *, labels: dict[str, str], namespace: str = "inference"
    ) -> dict[str, Any]:
        """An apps/v1 DaemonSet selecting pods by ``labels`` (GET answers it; its pods are
        ``add_pod(..., owner=<it>)``)."""
        obj = {
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-ds-{name}",
                         "labels": labels, "resourceVersion": str(next(self._versions))},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": []}}},
        }  # fmt: skip
        self.custom[f"{_PREFIX}{namespace}/daemonsets/{name}"] = obj
        return obj

    def stall(
        self, name: str, *, namespace: str = "inference", deadline_after: int | None = 2
    ) -> None:
        """Make the next rollout of ``name`` hang; report ProgressDeadlineExceeded after
        ``deadline_after`` more polls (None: never, as with progressDeadlineSeconds unset)."""
        self._stall[(namespace, name)] = deadline_after

    def args(self, name: str, *, namespace: str = "inference", container: int = 0) -> list[str]:
        """The stored args of one container."""
        spec = self.deployments[(namespace, name)]["spec"]["template"]["spec"]
        return list(spec["containers"][container].get("args", []))

    def rolled_out(self, name: str, *, namespace: str = "inference") -> bool:
        """Whether the controller has finished the latest rollout of ``name``."""
        obj = self.deployments[(namespace, name)]
        roll = self._rollouts[(namespace, name)]
        observed = obj["status"].get("observedGeneration", 0) >= obj["metadata"]["generation"]
        return observed and roll.old == 0 and roll.new == roll.new_available == _replicas(obj)

    def patches(self, name: str | None = None) -> list[Recorded]:
        """The PATCH requests received (for one Deployment, when named)."""
        return [
            r
            for r in self.requests
            if r.method == "PATCH" and (name is None or r.path.endswith(f"/deployments/{name}"))
        ]

    def gets(self, name: str | None = None) -> list[Recorded]:
        """The GET requests received (for one Deployment, when named)."""
        return [
            r
            for r in self.requests
            if r.method == "GET" and (name is None or r.path.endswith(f"/deployments/{name}"))
        ]

    # --- the API ------------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one request as the API server would."""
        content_type = request.headers.get("content-type")
        body: Any = None
        if request.content:
            try:
                body = json.loads(request.content)
            except ValueError:
                body = request.content.decode(errors="replace")
        response = self._answer(request, content_type, body)
        self.requests.append(
            Recorded(request.method, request.url.path, content_type, body, response.status_code)
        )
        return response

    def _answer(
        self, request: httpx.Request, content_type: str | None, body: Any
    ) -> httpx.Response:
        authorization = request.headers.get("authorization")
        if self.token is not None and authorization != f"Bearer {self.token}":
            return _error(401, "Unauthorized", "Unauthorized")
        path = request.url.path
        if path.startswith(_SLICES_PREFIX):
            return self._endpoint_slices(request)
        if path.startswith("/api/v1/namespaces/") and path.endswith("/pods"):
            return self._list_pods(request)
        if path.startswith("/apis/") and not path.startswith(_PREFIX):
            return self._custom_object(request.method, path)
        if path.startswith(_PREFIX) and path.split("/")[-2:-1] == ["daemonsets"]:
            return self._daemonset(request.method, path)
        parts = path[len(_PREFIX) :].split("/") if path.startswith(_PREFIX) else []
        if len(parts) != 3 or parts[1] != "deployments":
            return _error(404, "NotFound", "the server could not find the requested resource")
        namespace, _, name = parts
        verb = {"GET": "get", "PATCH": "patch"}.get(request.method)
        if verb is None:
            return _error(
                405, "MethodNotAllowed", "the server does not allow this method on the resource"
            )
        if verb in self.forbidden:
            return _error(
                403,
                "Forbidden",
                f'deployments.apps "{name}" is forbidden: User '
                f'"system:serviceaccount:{namespace}:ruleloop" cannot {verb} resource '
                f'"deployments" in API group "apps" in the namespace "{namespace}"',
            )
        key = (namespace, name)
        if key not in self.deployments:
            return _error(404, "NotFound", f'deployments.apps "{name}" not found')
        if verb == "get":
            self._advance(key)
            return httpx.Response(200, json=copy.deepcopy(self.deployments[key]))
        return self._patch(key, content_type, body)

    def _endpoint_slices(self, request: httpx.Request) -> httpx.Response:
        """LIST of a namespace's EndpointSlices, filtered by an equality label selector."""
        parts = request.url.path[len(_SLICES_PREFIX) :].split("/")  # ns, endpointslices
        if len(parts) != 2 or parts[1] != "endpointslices":
            return _error(404, "NotFound", "the server could not find the requested resource")
        if request.method != "GET":
            return _error(
                405, "MethodNotAllowed", "the server does not allow this method on the resource"
            )
        namespace = parts[0]
        if "list" in self.forbidden:
            return _error(
                403,
                "Forbidden",
                "endpointslices.discovery.k8s.io is forbidden: User "
                f'"system:serviceaccount:{namespace}:ruleloop" cannot list resource '
                f'"endpointslices" in API group "discovery.k8s.io" in the namespace "{namespace}"',
            )
        wanted: dict[str, str] = {}
        for term in filter(None, request.url.params.get("labelSelector", "").split(",")):
            key, sep, value = term.replace("==", "=").partition("=")
            if not sep:
                return _error(400, "BadRequest", f"unable to parse requirement: {term!r}")
            wanted[key] = value
        items = [
            copy.deepcopy(s)
            for s in self.endpoint_slices.get(namespace, [])
            if wanted.items() <= s["metadata"]["labels"].items()
        ]
        return httpx.Response(
            200,
            json={
                "kind": "EndpointSliceList",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(next(self._versions))},
                "items": items,
            },
        )

    def _list_pods(self, request: httpx.Request) -> httpx.Response:
        """LIST of a namespace's Pods, filtered by an equality label selector."""
        namespace = request.url.path.split("/")[4]
        if "list" in self.forbidden:
            return _error(403, "Forbidden", 'pods is forbidden: User '
                          f'"system:serviceaccount:{namespace}:ruleloop" cannot list resource '
                          f'"pods" in API group "" in the namespace "{namespace}"')  # fmt: skip
        wanted = dict(term.partition("=")[::2] for term in
                      filter(None, request.url.params.get("labelSelector", "").split(",")))  # fmt: skip
        items = [copy.deepcopy(p) for p in self.pods.get(namespace, [])
                 if wanted.items() <= p["metadata"]["labels"].items()]  # fmt: skip
        return httpx.Response(200, json={"kind": "PodList", "apiVersion": "v1", "items": items,
                                         "metadata": {"resourceVersion": str(next(self._versions))}})  # fmt: skip

    def _daemonset(self, method: str, path: str) -> httpx.Response:
        """GET of a DaemonSet (``add_daemonset``); ``forbidden`` holding "get" answers 403."""
        namespace, name = path.split("/")[5], path.split("/")[-1]
        if "get" in self.forbidden:
            return _error(403, "Forbidden", f'daemonsets.apps "{name}" is forbidden: User '
                          f'"system:serviceaccount:{namespace}:ruleloop" cannot get resource '
                          f'"daemonsets" in API group "apps" in the namespace "{namespace}"')  # fmt: skip
        return self._custom_object(method, path)

    def _custom_object(self, method: str, path: str) -> httpx.Response:
        """GET of a custom object (the only verb the actuators use on them)."""
        parts = path.split("/")  # '', apis, group, version, namespaces, ns, plural, name
        if len(parts) != 8 or parts[4] != "namespaces":
            return _error(404, "NotFound", "the server could not find the requested resource")
        if method != "GET":
            return _error(
                405, "MethodNotAllowed", "the server does not allow this method on the resource"
            )
        if path not in self.custom:
            return _error(404, "NotFound", f'{parts[6]}.{parts[2]} "{parts[7]}" not found')
        return httpx.Response(200, json=copy.deepcopy(self.custom[path]))

    def _patch(self, key: tuple[str, str], content_type: str | None, body: Any) -> httpx.Response:
        media = (content_type or "").split(";")[0].strip()
        if media != PATCH_TYPE:
            return _error(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: application/json-patch+json, application/merge-patch+json, "
                f"application/apply-patch+yaml, {PATCH_TYPE}",
            )
        if not isinstance(body, dict):
            return _error(400, "BadRequest", "the request body is not a JSON object")
        if self.before_patch:  # someone else's edit lands just before this PATCH
            self.before_patch.pop(0)(self.deployments[key])
            self._bump(key, spec_changed=True)
        obj = self.deployments[key]
        wanted = body.get("metadata", {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            return _error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on deployments.apps "{key[1]}": the object has '
                f"been modified; please apply your changes to the latest version and try again",
            )
        patch = {k: v for k, v in body.items() if k != "status"}
        patch.get("metadata", {}).pop("resourceVersion", None)
        merged = strategic_merge(obj, patch)
        merged["status"] = obj["status"]
        for webhook in self.admission:
            webhook(merged)
        spec_changed = merged["spec"] != obj["spec"]
        if merged != obj:
            self.deployments[key] = merged
            self._bump(key, spec_changed=spec_changed)
        return httpx.Response(200, json=copy.deepcopy(self.deployments[key]))

    # --- the deployment controller -------------------------------------------------------------

    def _bump(self, key: tuple[str, str], *, spec_changed: bool) -> None:
        meta = self.deployments[key]["metadata"]
        meta["resourceVersion"] = str(next(self._versions))
        if spec_changed:
            meta["generation"] += 1

    def _advance(self, key: tuple[str, str]) -> None:
        """One controller step after a GET (see the module docstring)."""
        obj = self.deployments[key]
        roll = self._rollouts[key]
        want = _replicas(obj)
        observed = obj["status"].get("observedGeneration", 0)
        if observed < obj["metadata"]["generation"]:
            if not roll.noticed:  # the informer has not delivered the change yet
                roll.noticed = True
                return
            # A new template: every pod now running belongs to an old one.
            available = roll.old + roll.new_available
            self._rollouts[key] = roll = _Rollout(old=available, new=0, new_available=0)
            if key in self._stall:
                roll.stalled, roll.deadline_after = True, self._stall.pop(key)
            self._write_status(key, observed=obj["metadata"]["generation"])
            return
        spare = _max_unavailable(obj)
        if roll.stalled:
            if roll.new == 0:  # one pod that never becomes ready
                roll.new = 1
                if spare and roll.old:
                    roll.old -= 1
            roll.polls += 1
            deadline = roll.deadline_after is not None and roll.polls > roll.deadline_after
            self._write_status(key, observed=observed, deadline_exceeded=deadline)
            return
        if roll.new > roll.new_available:  # settle: the new pod is ready (an old one goes)
            roll.new_available += 1
            if not spare and roll.old:
                roll.old -= 1
        elif roll.new < want:  # surge: one more new pod; an old one goes if one may be missing
            roll.new += 1
            if spare and roll.old:
                roll.old -= 1
        elif roll.old > 0:
            roll.old -= 1
        else:
            return
        self._write_status(key, observed=observed)

    def _write_status(
        self, key: tuple[str, str], *, observed: int, deadline_exceeded: bool = False
    ) -> None:
        obj = self.deployments[key]
        roll = self._rollouts[key]
        want = _replicas(obj)
        total = roll.old + roll.new
        available = roll.old + roll.new_available
        done = roll.old == 0 and roll.new == roll.new_available == want
        if deadline_exceeded:
            progressing = ("False", "ProgressDeadlineExceeded", "has timed out progressing.")
        elif done:
            progressing = ("True", "NewReplicaSetAvailable", "has successfully progressed.")
        else:
            progressing = ("True", "ReplicaSetUpdated", "is progressing.")
        replica_set = f"{key[1]}-{obj['metadata']['generation']:x}5f7c9d"
        counts = {
            "observedGeneration": observed,
            "replicas": total,
            "updatedReplicas": roll.new,
            "readyReplicas": available,
            "availableReplicas": available,
            "unavailableReplicas": max(0, want - available),
        }
        # The API omits zero counts (omitempty), so readers must default them.
        status: dict[str, Any] = {k: v for k, v in counts.items() if v}
        has_minimum = available >= want - max(1, want // 4)
        status["conditions"] = [
            {
                "type": "Available",
                "status": "True" if has_minimum else "False",
                "lastUpdateTime": _TIMESTAMP,
                "lastTransitionTime": _TIMESTAMP,
                "reason": "MinimumReplicasAvailable"
                if has_minimum
                else "MinimumReplicasUnavailable",
                "message": "Deployment has minimum availability."
                if has_minimum
                else "Deployment does not have minimum availability.",
            },
            {
                "type": "Progressing",
                "status": progressing[0],
                "lastUpdateTime": _TIMESTAMP,
                "lastTransitionTime": _TIMESTAMP,
                "reason": progressing[1],
                "message": f'ReplicaSet "{replica_set}" {progressing[2]}',
            },
        ]
        obj["status"] = status
        obj["metadata"]["resourceVersion"] = str(next(self._versions))


def _replicas(obj: dict[str, Any]) -> int:
    return int(obj["spec"].get("replicas", 1))


def _max_unavailable(obj: dict[str, Any]) -> int:
    """rollingUpdate.maxUnavailable in pods (a percentage rounds down, as the controller does)."""
    value = obj["spec"].get("strategy", {}).get("rollingUpdate", {}).get("maxUnavailable", "25%")
    if isinstance(value, str) and value.endswith("%"):
        return _replicas(obj) * int(value[:-1]) // 100
    return int(value)


def _error(code: int, reason: str, message: str) -> httpx.Response:
    return httpx.Response(code, json=status_object(code, reason, message))


class KubeActuators:
    """The bot's ``actuator_for`` seam: the real KubernetesActuator against a FakeKube, over the
    wire (bearer token, https base URL), polling rollouts on ``clock`` (a FakeTime)."""

    def __init__(self, kube: FakeKube, clock: Any) -> None:
        self.http = httpx.AsyncClient(
            transport=kube.transport, base_url="https://kube.test",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )  # fmt: skip
        self._clock = clock

    def __call__(self, name: str, target: Any) -> Any:
        from bot.change.actuators.kubernetes import KubernetesActuator
        from bot.kernel.config import KubernetesActuatorSpec

        assert isinstance(target.actuator, KubernetesActuatorSpec)
        return KubernetesActuator(
            target.actuator, vllm_url=target.vllm_url, http=self.http, sleep=self._clock.sleep,
            monotonic=self._clock.clock,
        )  # fmt: skip

    async def aclose(self) -> None:
        await self.http.aclose()
