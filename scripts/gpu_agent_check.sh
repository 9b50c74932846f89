#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: start `ruleloop agent`, read its /snapshot, and compare it GPU by
# GPU with `nvidia-smi --query-gpu` (read just before and just after the agent, so that a value
# moving between the two readings is judged against both). Exits 0 when every value agrees
# within its tolerance, 1 on a mismatch (each one printed), 2 when it cannot check (no
# nvidia-smi, the agent did not start, NVML refused).
#
#   scripts/gpu_agent_check.sh                      # uses `ruleloop` from PATH (or .venv/bin)
#   AGENT_CMD="/opt/ruleloop/bin/ruleloop agent" scripts/gpu_agent_check.sh
#
# Tolerances: memory used within max(64 MiB, 1 % of total); memory total within 1 MiB;
# utilisation within 10 points; temperature within 3 °C; power draw within max(15 W, 5 %);
# enforced power limit within 1 W; the maximum SM clock exact; the same GPU count and UUIDs.
# Run it on idle or steadily loaded GPUs: a GPU allocating memory between the readings can
# legitimately move more than the tolerance. tests/test_agent_gpu_check.py runs it here against
# the fake NVML and a fake nvidia-smi (no GPU on the development machines).
set -euo pipefail

cd "$(dirname "$0")/.."
if [[ -z "${AGENT_CMD:-}" ]]; then
  if command -v ruleloop >/dev/null; then AGENT_CMD="ruleloop agent"
  elif [[ -x .venv/bin/ruleloop ]]; then AGENT_CMD=".venv/bin/ruleloop agent"
  else echo "gpu_agent_check: no ruleloop on PATH or in .venv; set AGENT_CMD" >&2; exit 2; fi
fi
PYTHON="${PYTHON:-python3}"
command -v nvidia-smi >/dev/null || { echo "gpu_agent_check: nvidia-smi not found" >&2; exit 2; }

work="$(mktemp -d)"
agent_pid=""
cleanup() {
  if [[ -n "$agent_pid" ]]; then kill "$agent_pid" 2>/dev/null || true; wait "$agent_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

"$PYTHON" -c 'import secrets; print(secrets.token_hex(32))' >"$work/token"
port="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# shellcheck disable=SC2086  # AGENT_CMD is a command line
$AGENT_CMD --listen "127.0.0.1:$port" --token-file "$work/token" 2>"$work/agent.log" &
agent_pid=$!

QUERY="index,uuid,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw,enforced.power.limit,clocks.max.sm"
export AGENT_URL="http://127.0.0.1:$port" TOKEN_FILE="$work/token" QUERY AGENT_LOG="$work/agent.log" \
  AGENT_PID="$agent_pid"
"$PYTHON" - <<'PY'
import csv, io, json, os, subprocess, sys, time, urllib.error, urllib.request

url, query = os.environ["AGENT_URL"], os.environ["QUERY"]
token = open(os.environ["TOKEN_FILE"]).read().strip()


def give_up(why):
    print(f"gpu_agent_check: {why}", file=sys.stderr)
    sys.exit(2)


def smi():
    out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        give_up(f"nvidia-smi failed: {out.stderr.strip() or out.stdout.strip()}")
    rows = {}
    for row in csv.reader(io.StringIO(out.stdout)):
        if not row:
            continue
        values = dict(zip(query.split(","), (v.strip() for v in row)))
        rows[int(values["index"])] = values
    return rows


def agent_exited():
    try:
        with open(f"/proc/{os.environ['AGENT_PID']}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None  # "[N/A]", "[Not Supported]"


deadline = time.monotonic() + 60
while True:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2):
            break
    except OSError:
        if agent_exited() or time.monotonic() > deadline:
            give_up("the agent did not start:\n" + open(os.environ["AGENT_LOG"]).read()[-2000:])
        time.sleep(0.2)

before = smi()
request = urllib.request.Request(f"{url}/snapshot", headers={"Authorization": f"Bearer {token}"})
try:
    with urllib.request.urlopen(request, timeout=30) as response:
        snapshot = json.load(response)
except urllib.error.HTTPError as exc:
    give_up(f"the agent answered HTTP {exc.code}: {exc.read().decode(errors='replace')}")
after = smi()

MIB = 1024 * 1024
problems = []
gpus = {g["index"]: g for g in snapshot["gpus"]}
if sorted(gpus) != sorted(before):
    problems.append(f"GPU indexes: agent {sorted(gpus)}, nvidia-smi {sorted(before)}")


def check(i, what, agent_value, field, tolerance, scale=1.0):
    """The agent's value must lie within tolerance of the range nvidia-smi showed around it."""
    seen = [number(rows[i][field]) for rows in (before, after) if i in rows]
    seen = [v for v in seen if v is not None]
    if not seen:
        return f"GPU {i} {what}: nvidia-smi has no value ({before[i][field]}), not compared"
    if agent_value is None:
        problems.append(f"GPU {i} {what}: the agent read none, nvidia-smi {seen}")
        return None
    value = agent_value / scale
    low, high = min(seen) - tolerance, max(seen) + tolerance
    verdict = "ok" if low <= value <= high else "MISMATCH"
    line = f"GPU {i} {what}: agent {value:.1f}, nvidia-smi {seen} (tolerance {tolerance:g}) {verdict}"
    if verdict != "ok":
        problems.append(line)
    return line


for i in sorted(set(gpus) & set(before)):
    g, s = gpus[i], before[i]
    if g.get("uuid") != s["uuid"]:
        problems.append(f"GPU {i} UUID: agent {g.get('uuid')}, nvidia-smi {s['uuid']}")
    total_mib = number(s["memory.total"]) or 0
    lines = [
        check(i, "memory used (MiB)", g["memory_used_bytes"], "memory.used",
              max(64, 0.01 * total_mib), MIB),
        check(i, "memory total (MiB)", g["memory_total_bytes"], "memory.total", 1, MIB),
        check(i, "utilisation (%)", g["utilization_pct"], "utilization.gpu", 10),
        check(i, "temperature (C)", g["temperature_c"], "temperature.gpu", 3),
        check(i, "power draw (W)", g["power_w"], "power.draw",
              max(15, 0.05 * (number(s["power.draw"]) or 0))),
        check(i, "power limit (W)", g["power_limit_w"], "enforced.power.limit", 1),
        check(i, "max SM clock (MHz)", g["sm_clock_max_mhz"], "clocks.max.sm", 0),
    ]
    for line in filter(None, lines):
        print(line)

print(f"agent on {snapshot['host']}: {len(gpus)} GPU(s), driver {snapshot.get('driver')}")
if problems:
    print("\n".join(["MISMATCHES:", *problems]))
    sys.exit(1)
print("the agent agrees with nvidia-smi")
PY
