"""Writes the proposed ADR a tune run ends with: its context, measured matrix and rules."""

from __future__ import annotations

import datetime as dt
import platform
from pathlib import Path

from bot.adr import Adr, Fix, MatrixRow, format_ms, vllm_args
from bot.adr.workload import WorkloadShape
from bot.canary import CanaryReport, source_note
from bot.tune.matrix import TrialRow
from bot.tune.plan import TunePlan

NO_PICK = (
    "无配置达标 (no configuration met the gates): 保持现有配置，查明原因后再调优 "
    "(keep the current flags)."
)


def build_draft(
    plan: TunePlan,
    rows: list[TrialRow],
    *,
    adr_id: str,
    day: dt.date,
    runs_dir: Path,
    base: Path,
    how: list[str] | None = None,
) -> Adr:
    """The proposed ADR for a finished run; the recommended row's flags become its fix.

    ``how``: what ran, in the context's words (a search says its sampler, space and objective);
    None: the configurations of the plan, each on a freshly started engine."""
    pick = next((row for row in rows if row.recommended), None)
    return Adr(
        id=adr_id,
        title=plan.title,
        status="proposed",
        date=day,
        deciders=plan.deciders,
        match=plan.match,
        cause=plan.cause,
        fix=Fix(engine_args=pick.config.engine_args if pick else {}, gateway=plan.gateway),
        gates=plan.gates,
        workload=measured_under(rows),
        context=_context(plan, rows, how),
        matrix=[_matrix_row(row) for row in rows],
        matrix_notes=_notes(plan, rows, runs_dir=runs_dir, base=base),
        rules=_rules(plan, pick),
    )


def shape_of(report: CanaryReport | None) -> WorkloadShape | None:
    """The workload shape a canary report says its run sent (``workload_shape``), None in a
    report without one (written before canaries said it)."""
    return None if report is None else report.workload_shape


def measured_under(rows: list[TrialRow]) -> WorkloadShape | None:
    """The shape the matrix was measured under: the recommended row's run, else the first
    measured row's (every row runs the same canary workload; the baseline comes first)."""
    ordered = sorted(rows, key=lambda row: not row.recommended)  # stable: plan order kept
    return next((shape for row in ordered if (shape := shape_of(row.report))), None)


def _matrix_row(row: TrialRow) -> MatrixRow:
    v = row.values
    return MatrixRow(
        config=row.config.label(),
        ttft_p99_ms=v.ttft_p99_ms if v else None,
        tpot_p99_ms=v.tpot_p99_ms if v else None,
        goodput_ratio=v.goodput_ratio if v else None,
        kv_fragmentation=v.kv_fragmentation if v else None,
        verdict=row.verdict(),
    )


def _context(plan: TunePlan, rows: list[TrialRow], how: list[str] | None) -> str:
    lines = [plan.context.strip(), ""] if plan.context.strip() else []
    if how is None:
        lines.append(
            f"`ruleloop tune` measured {len(rows)} vLLM configurations one after another, each "
            "on a freshly started engine, under the same canary workload "
            f"({where_measured()})."
        )
        lines.append("")
    else:
        lines += how
    lines.append(f"- measured: {plan.workload.describe()}")
    lines += [f"- background: {b.describe(background=True)}" for b in plan.background]
    return "\n".join(lines)


def where_measured() -> str:
    """The vLLM version and the machine, as the context says them."""
    return f"vLLM {vllm_args.version()}, {platform.machine()} {platform.system()}"


def _notes(plan: TunePlan, rows: list[TrialRow], *, runs_dir: Path, base: Path) -> str:
    notes = [source_note(mixed=bool(plan.background))]
    metric = plan.objective.metric if plan.objective is not None else None
    also = [line for row in rows if (line := _also(row, metric))]
    if also:
        notes.append("Also measured (same runs):\n" + "\n".join(also))
    cited = [Path(r.report_path) for r in rows if r.report_path]
    if cited:
        where = _relative(runs_dir, base)
        notes.append(
            f"Canary JSON per row, in `{where}/`: " + ", ".join(f"`{p.name}`" for p in cited) + "."
        )
    return "\n\n".join(notes)


def _also(row: TrialRow, plan_metric: str | None) -> str | None:
    """Token gaps, queueing and the other classes' TTFT: what step budgets move besides TPOT."""
    report = row.report
    if not report:
        return None
    queue = None if report.engine is None else report.engine.queue_time_ms.p99
    parts = [f"ITL p99 {format_ms(report.itl_ms.p99)}", f"engine queue p99 {format_ms(queue)}"]
    for other in report.background:
        name = other.workload.get("name", "background")
        ttft = format_ms(other.ttft_ms.p99)
        parts.append(f"{name} TTFT p99 {ttft} ({other.requests.ok} requests)")
    if row.score is not None and plan_metric is not None:
        parts.insert(0, f"{plan_metric} {row.score:,.4g}")
    return f"- {row.config.name}: " + ", ".join(parts)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def _rules(plan: TunePlan, pick: TrialRow | None) -> list[str]:
    if pick is None:
        return [NO_PICK]
    argv = " ".join(pick.config.argv) or "(vLLM defaults)"
    best = ""
    if pick.score is not None and plan.objective is not None:
        best = (
            f", the best {plan.objective.metric} ({pick.score:,.4g}) of the trials that met "
            "every gate"
        )
    rules = [
        f"推荐配置 (recommended) `{pick.config.name}`: vLLM 启动参数 `{argv}` "
        f"(front matter `fix.engine_args`){best}."
    ]
    gates = plan.gates
    if gates is not None and not gates.is_empty():
        gate_flags = gates.cli_flags()
        rules.append(
            "发布门禁 (release gate): "
            f"`python3 -m latency_checker --endpoint <canary> {gate_flags}`."
        )
    if plan.gateway is not None:
        g = plan.gateway
        if g.require_request_timeout:
            rules.append(
                f"代理层必须校验 {g.timeout_header} (the gateway requires a request timeout)."
            )
        if g.drop_on_cancel:
            rules.append("客户端 Cancel 时立即中止上游请求，丢弃残余计算 (drop work on cancel).")
    return rules
