"""Every file a rendered pod is given (Secret, ConfigMap and projected volumes) is readable by
the user of each container that mounts it, under the kubelet's ownership rules; and
`ruleloop agent` starts on a token file with the ownership and mode the kubelet gives it.

The kubelet's rules, as modelled here (pkg/volume/secret, configmap, projected and
volume_linux.go's SetVolumeOwnership): each file is owned by root, with the item's `mode` or
the volume's `defaultMode` (0644 when unset); with a pod `fsGroup`, its group is the fsGroup and
the read bits of owner and group are added (0440, the volume is read-only), without one it is
root:root. The process reads with its uid (runAsUser: the container's, else the pod's, else the
image's USER), its primary group (runAsGroup, likewise) and the supplementary groups (fsGroup,
supplementalGroups): the owner bits if it is the owner, else the group bits if it has the
group, else the other bits. Root with CAP_DAC_OVERRIDE reads anything; `drop: [ALL]` removes it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kustomize_render import KUBERNETES, ROOT, kustomize, render, renderable

pytestmark = pytest.mark.faults

DEFAULT_MODE = 0o644
SIDECAR = KUBERNETES / "components" / "nvml-agent" / "sidecar"
TOKEN = "/var/run/secrets/ruleloop-nvml-agent/token"
POD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job")


def image_user() -> tuple[int, int]:
    """The image's `USER uid:gid` (the Dockerfile's)."""
    (user,) = re.findall(r"^USER (\d+):(\d+)$", (ROOT / "Dockerfile").read_text(), re.M)
    return int(user[0]), int(user[1])


def files_of(volume: dict) -> list[tuple[str, int]]:
    """(key or '*', mode) of each file a Secret/ConfigMap/projected volume gives."""
    found: list[tuple[str, int]] = []
    for kind in ("secret", "configMap"):
        if kind in volume:
            source = volume[kind]
            mode = source.get("defaultMode", DEFAULT_MODE)
            items = source.get("items") or [{"key": "*"}]
            found += [(item["key"], item.get("mode", mode)) for item in items]
    if "projected" in volume:
        mode = volume["projected"].get("defaultMode", DEFAULT_MODE)
        for source in volume["projected"].get("sources", []):
            for kind in ("secret", "configMap"):
                if kind in source:
                    items = source[kind].get("items") or [{"key": "*"}]
                    found += [(item["key"], item.get("mode", mode)) for item in items]
    return found


def readable(mode: int, *, uid: int, groups: set[int], file_gid: int, root_caps: bool) -> bool:
    if uid == 0 and root_caps:
        return True
    if uid == 0:  # the owner
        return bool(mode & 0o400)
    if file_gid in groups:
        return bool(mode & 0o040)
    return bool(mode & 0o004)


def access_problems(objects: list[dict]) -> list[str]:
    """Each (workload, container, file) the container's user cannot read."""
    problems = []
    for obj in objects:
        if obj["kind"] not in POD_KINDS:
            continue
        pod = obj["spec"]["template"]["spec"]
        pod_ctx = pod.get("securityContext") or {}
        fs_group = pod_ctx.get("fsGroup")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            ctx = container.get("securityContext") or {}
            uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
            gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
            if str(container["image"]).split(":")[0].endswith("ruleloop"):
                uid = image_user()[0] if uid is None else uid
                gid = image_user()[1] if gid is None else gid
            if uid is None:  # another image's user is not known here: its files are not ours
                continue
            groups = {g for g in (gid, fs_group) if g is not None}
            groups |= set(pod_ctx.get("supplementalGroups", []))
            root_caps = "ALL" not in (ctx.get("capabilities") or {}).get("drop", [])
            for mount in container.get("volumeMounts", []):
                for key, mode in files_of(volumes[mount["name"]]):
                    if fs_group is not None:
                        mode |= 0o440
                    file_gid = fs_group if fs_group is not None else 0
                    if not readable(mode, uid=uid, groups=groups, file_gid=file_gid,
                                    root_caps=root_caps):  # fmt: skip
                        problems.append(
                            f"{obj['kind']}/{obj['metadata']['name']} {container['name']} "
                            f"(uid {uid}, groups {sorted(groups)}) cannot read "
                            f"{mount['mountPath']}/{key} (root:{file_gid} {mode:04o})"
                        )
    return problems


VLLM = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm-prod-a
  labels: {app: vllm-prod-a, ruleloop.dev/nvml-agent: sidecar}
spec:
  selector: {matchLabels: {app: vllm-prod-a}}
  template:
    metadata: {labels: {app: vllm-prod-a}}
    spec:
      %s
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.11.0
"""
# the vLLM pods a team may have: root (the vLLM image's default), its own fsGroup, non-root
VLLM_PODS = {
    "root": "securityContext: {}",
    "own-fsgroup": "securityContext: {fsGroup: 2000}",
    "non-root": "securityContext: {runAsUser: 1000, runAsGroup: 1000}",
}


def sidecar_render(workdir: Path, pod: str, *, component: Path = SIDECAR) -> list[dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "vllm.yaml").write_text(VLLM % pod)
    used = os.path.relpath(component.resolve(), workdir.resolve())
    (workdir / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [vllm.yaml]\ncomponents: [{used}]\n"
    )
    return kustomize(workdir)


@pytest.mark.parametrize(("name", "directory"), renderable(), ids=[n for n, _ in renderable()])
def test_every_container_can_read_the_files_it_is_given(
    name: str, directory: Path, tmp_path: Path
) -> None:
    objects = render(name, directory, tmp_path)
    assert access_problems(objects) == []


@pytest.mark.parametrize("pod", sorted(VLLM_PODS))
def test_the_sidecar_can_read_its_token_in_any_vllm_pod(pod: str, tmp_path: Path) -> None:
    objects = sidecar_render(tmp_path / pod, VLLM_PODS[pod])
    assert access_problems(objects) == []
    (deployment,) = objects
    names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert names == ["vllm", "nvml-agent"]  # the check did look at the agent


def test_the_check_finds_the_daemonset_without_fsgroup(tmp_path: Path) -> None:
    """The DaemonSet as shipped before: user 10001, a root:root 0440 token."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    component = tmp_path / "deploy" / "kubernetes" / "components" / "nvml-agent"
    daemonset = component / "daemonset.yaml"
    text = daemonset.read_text()
    assert "        fsGroup: 10001\n" in text
    daemonset.write_text(text.replace("        fsGroup: 10001\n", ""))
    overlay = tmp_path / "deploy" / "kubernetes" / "overlays" / "example"
    from tests.kustomize_render import with_component

    objects = kustomize(with_component(component, tmp_path / "w", overlay=overlay))
    assert access_problems(objects) == [
        "DaemonSet/ruleloop-nvml-agent nvml-agent (uid 10001, groups [10001]) cannot read "
        "/var/run/secrets/ruleloop-nvml-agent/* (root:0 0440)"
    ]


def test_the_check_finds_a_0440_sidecar_token_in_a_root_vllm_pod(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    component = tmp_path / "deploy" / "kubernetes" / "components" / "nvml-agent" / "sidecar"
    path = component / "kustomization.yaml"
    path.write_text(path.read_text().replace("defaultMode: 0444", "defaultMode: 0440"))
    objects = sidecar_render(tmp_path / "team", VLLM_PODS["root"], component=component)
    assert access_problems(objects) == [
        "Deployment/vllm-prod-a nvml-agent (uid 10001, groups [10001]) cannot read "
        "/var/run/secrets/ruleloop-nvml-agent/* (root:0 0440)"
    ]
    # with the team's fsGroup the kubelet gives the group read: 0440 would do there
    assert access_problems(sidecar_render(tmp_path / "team2", VLLM_PODS["own-fsgroup"],
                                          component=component)) == []  # fmt: skip


# --- the agent itself, on a token file owned and moded as the kubelet makes it ------------------

AGENT_UID = AGENT_GID = 10001  # the Dockerfile's USER and the DaemonSet's runAsUser/runAsGroup


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_agent(token_file: Path, as_user: list[str]) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    ruleloop = Path(sys.executable).parent / "ruleloop"
    argv = [*as_user, str(ruleloop), "agent", "--listen", f"127.0.0.1:{port}",
            "--token-file", str(token_file), "--no-watch-xid"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def kubelet_token(directory: Path, *, mode: int, fs_group: int | None) -> tuple[Path, list[str]]:
    """The token file as the kubelet writes it, and how to run the agent as the pod's user.

    As root this is exact: root:<fsGroup or 0>, ``mode``, the agent as uid/gid 10001 with the
    fsGroup as supplementary group. Not root, the test's own user stands in: the file is its
    own, and the owner bits of ``mode`` are those a root-owned file would give a non-owner in
    the fsGroup (group bits) or not (other bits)."""
    token = directory / "token"
    token.write_text("t" * 64 + "\n")
    if os.geteuid() == 0:
        os.chown(token, 0, fs_group if fs_group is not None else 0)
        token.chmod(mode | (0o440 if fs_group is not None else 0))
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv (util-linux) is needed to run the agent as user 10001")
        groups = ["--groups", str(fs_group)] if fs_group is not None else ["--clear-groups"]
        return token, [setpriv, f"--reuid={AGENT_UID}", f"--regid={AGENT_GID}", *groups]
    effective = mode | (0o440 if fs_group is not None else 0)
    bits = (effective >> 3) & 0o7 if fs_group is not None else effective & 0o7
    token.chmod(bits << 6)
    return token, []


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory user 10001 can reach (pytest's tmp_path is 0700)."""
    directory = Path(tempfile.mkdtemp(prefix="ruleloop-token-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def daemonset_token(tmp_path: Path) -> tuple[int, int | None]:
    """The token's mode and the pod's fsGroup in the rendered DaemonSet."""
    from tests.kustomize_render import with_component

    component = KUBERNETES / "components" / "nvml-agent"
    objects = kustomize(with_component(component, tmp_path / "w"))
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == AGENT_UID
    assert pod["securityContext"]["runAsGroup"] == AGENT_GID
    (container,) = pod["containers"]
    assert container["args"][container["args"].index("--token-file") + 1] == TOKEN
    (mount,) = [m for m in container["volumeMounts"] if TOKEN.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    mode = volume["secret"].get("defaultMode", DEFAULT_MODE)
    return mode, pod["securityContext"].get("fsGroup")


def test_the_agent_starts_on_the_token_the_daemonset_gives_it(
    open_dir: Path, tmp_path: Path
) -> None:
    mode, fs_group = daemonset_token(tmp_path)
    token, as_user = kubelet_token(open_dir, mode=mode, fs_group=fs_group)
    proc, url = start_agent(token, as_user)
    try:
        for _ in range(300):
            if proc.poll() is not None:
                pytest.fail(f"the agent exited {proc.returncode}:\n{proc.communicate()[0]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        wrong = httpx.get(f"{url}/snapshot", headers={"Authorization": "Bearer " + "x" * 64})
        assert wrong.status_code == 401
        # the token it read: past the bearer check (no NVIDIA driver here: 503, or 200 with one)
        right = httpx.get(f"{url}/snapshot", headers={"Authorization": "Bearer " + "t" * 64})
        assert right.status_code in (200, 503), right.text
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_the_agent_refuses_to_start_on_a_root_only_token(open_dir: Path) -> None:
    """What the DaemonSet without fsGroup gave it: root:root 0440."""
    token, as_user = kubelet_token(open_dir, mode=0o440, fs_group=None)
    proc, _ = start_agent(token, as_user)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    # click's readable check, or the agent's own (bot/app/cli/agent.py) where click's passes
    assert f"'{token}' is not readable" in out or "Permission denied" in out, out
