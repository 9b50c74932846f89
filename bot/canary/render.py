"""Human-readable canary output: the progress line and the summary table."""

from __future__ import annotations

from bot.canary.runner import Progress
from bot.canary.schema import CanaryReport, Spread
from bot.diagnosis.probes import Quantiles
from bot.kernel.numbers import NOT_MEASURED, in_unit


def progress_line(p: Progress) -> str:
    """One line: elapsed, done/target, in flight, failures, token rate."""
    target = f"/{p.target}" if p.target else ""
    rate = p.tokens / p.elapsed_s if p.elapsed_s > 0 else 0.0
    return (
        f"[{p.elapsed_s:6.1f}s] {p.done}{target} done, {p.in_flight} in flight, "
        f"{p.cancelled} cancelled, {p.failed} failed, {rate:,.0f} tok/s"
    )


def _ms(value: float | None) -> str:
    return NOT_MEASURED if value is None else in_unit(value, "ms")


def _p(summary: Spread | Quantiles | None, key: str) -> str:
    """A percentile; '∞' where failed requests (counted as inf) reached it."""
    if summary is None:
        return _ms(None)
    value = getattr(summary, key)
    if value is None and isinstance(summary, Spread) and summary.infinite:
        return "∞ (failed requests)"
    return _ms(value)


def _pct(value: float | None) -> str:
    return NOT_MEASURED if value is None else in_unit(value, "ratio")


def summary_table(report: CanaryReport) -> str:
    """The four metrics from both sides, request outcomes and gate verdicts, as aligned text."""
    engine = report.engine
    e_ttft, e_itl = (engine.ttft_ms, engine.itl_ms) if engine else (None, None)
    ttft, tpot, frag, req = report.ttft_ms, report.tpot_ms, report.kv_fragmentation, report.requests
    rows = [
        ("metric", "client", _engine_header(report)),
        ("TTFT p50", _p(ttft, "p50"), _p(e_ttft, "p50")),
        ("TTFT p99", _p(ttft, "p99"), _p(e_ttft, "p99")),
        ("TPOT p50", _p(tpot, "p50"), "-"),
        ("TPOT p99", _p(tpot, "p99"), "-"),
        ("ITL p99", _ms(report.itl_ms.p99), _p(e_itl, "p99")),
        (
            "goodput ratio",
            _pct(report.goodput_ratio),
            _pct(engine.goodput_ratio if engine else None),
        ),
        ("SLO attainment", _pct(report.slo_attainment), "-"),
        ("KV frag. (observed)", _pct(frag.observed), "-"),
        ("KV frag. (internal)", _pct(frag.internal), "-"),
        ("wasted prefill tok", "-", _fmt_num(report.wasted_prefill_tokens)),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(width[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in width))
    lines.append("")
    wall_s = report.throughput.wall_s or 0.0
    lines.append(
        f"requests: {req.ok} ok, {req.cancelled} cancelled, {req.failed} failed "
        f"of {req.total} in {wall_s:.1f} s ({report.tokens.streamed or 0:,} tokens streamed)"
    )
    if req.failed_by_cause:
        lines.append(
            "failed by cause: "
            + ", ".join(f"{n} x {cause}" for cause, n in req.failed_by_cause.items())
        )
    for error in report.errors:
        lines.append(f"  {error.count} x {error.error}")
    lines.append("gates:")
    for gate in report.gates:
        mark = "PASS" if gate.passed else "FAIL"
        lines.append(f"  {mark}  {gate.name}: {gate.reason}")
        lines.append(f"        ({gate.source})")
        if gate.statistics:
            lines.append(f"        statistics: {gate.statistics}")
    if len(report.gates) <= 1:
        lines.append("  (only the error gate: pass --max-ttft-p99-ms etc. to gate latency)")
    lines.append("verdict: " + ("all gates passed" if report.passed else "GATE FAILED"))
    for warning in report.warnings:
        lines.append(f"warning: {warning}")
    return "\n".join(lines)


def _engine_header(report: CanaryReport) -> str:
    """The engine column's scope: the fleet merged, or one page (one replica's)."""
    scope = report.engine_scope or ""
    if scope.startswith("fleet"):
        return "engine (" + scope.split(" merged")[0] + ")"
    return "engine (one page)" if scope else "engine"


def _fmt_num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"
