"""The table of one eval run: per scenario and in sum, markdown and JSON, dated, with the machine
(``lscpu``'s model, AVX-512 or not) and the engine's version, so that runs compare like for like.
"""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
from collections.abc import Sequence
from statistics import mean

from pydantic import BaseModel, ConfigDict

from bot.adr.vllm_args import version
from bot.eval.grades import Graded


class Machine(BaseModel):
    """Where the run ran."""

    model_config = ConfigDict(frozen=True)

    cpu: str
    avx512: bool | None  # None: lscpu did not say
    cores: int | None
    engine: str  # the vLLM distribution's version


class Summary(BaseModel):
    """The run in a few numbers (None where nothing was graded)."""

    model_config = ConfigDict(frozen=True)

    scenarios: int
    mean_grade: float
    right: int  # grade 100
    wrong: int  # grade 0
    abstained: int
    ruled_out_precision: float | None  # pooled over every cause ruled out
    ruled_out_recall: float | None  # pooled over every cause that had to be
    cannot_tell_right: float | None
    adr_right: str  # "2/3", or "not graded"
    fixes_right: str  # "2/2": the gate kept a fix that helps and rolled back one that does not
    mean_extra_s: float


class EvalReport(BaseModel):
    """One run of the catalogue."""

    model_config = ConfigDict(frozen=True)

    at: dt.datetime
    subset: str
    machine: Machine
    summary: Summary
    scenarios: list[Graded]


def machine() -> Machine:
    """This machine, from ``lscpu`` (Linux) or the platform module."""
    fields: dict[str, str] = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        fields = {
            k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in out.splitlines())
        }
    except (OSError, subprocess.SubprocessError):
        pass
    flags = fields.get("Flags")
    cores = fields.get("CPU(s)")
    return Machine(
        cpu=fields.get("Model name") or platform.processor() or "unknown",
        avx512=None if flags is None else "avx512f" in flags.split(),
        cores=int(cores) if cores and cores.isdigit() else None,
        engine=f"vllm {version()}",
    )


def _pooled(graded: Sequence[Graded], kind: str) -> float | None:
    """Precision or recall over every cause of every scenario (not a mean of ratios)."""
    if kind == "precision":
        hits = sum(sum(c not in g.truth for c in g.ruled_out) for g in graded)
        total = sum(len(g.ruled_out) for g in graded)
    else:
        hits = sum(sum(c in g.ruled_out for c in g.must_rule_out) for g in graded)
        total = sum(len(g.must_rule_out) for g in graded)
    return hits / total if total else None


def summarise(graded: Sequence[Graded]) -> Summary:
    """The run's sum."""
    adr = [g.adr_right for g in graded if g.adr_right is not None]
    fixes = [g.fix for g in graded if g.fix is not None]
    told = [g.cannot_tell_right for g in graded if g.cannot_tell_right is not None]
    return Summary(
        scenarios=len(graded),
        mean_grade=mean(g.grade for g in graded) if graded else 0.0,
        right=sum(g.grade == 100 for g in graded),
        wrong=sum(g.grade == 0 for g in graded),
        abstained=sum(g.abstained for g in graded),
        ruled_out_precision=_pooled(graded, "precision"),
        ruled_out_recall=_pooled(graded, "recall"),
        cannot_tell_right=mean(told) if told else None,
        adr_right=f"{sum(adr)}/{len(adr)}" if adr else "not graded",
        fixes_right=f"{sum(f.right for f in fixes)}/{len(fixes)}" if fixes else "none tried",
        mean_extra_s=mean(g.extra_s for g in graded) if graded else 0.0,
    )


def report(graded: Sequence[Graded], *, subset: str, at: dt.datetime | None = None) -> EvalReport:
    """The run's report, dated now unless ``at``."""
    return EvalReport(at=at or dt.datetime.now(dt.UTC), subset=subset, machine=machine(),
                      summary=summarise(graded), scenarios=list(graded))  # fmt: skip


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def _fix(g: Graded) -> str:
    if g.fix is None:
        return "–"
    done = "kept" if g.fix.kept else "rolled back"
    return f"{g.fix.adr} {done} {'✓' if g.fix.right else '✗'} (n={g.fix.requests} a side)"


def markdown(r: EvalReport) -> str:
    """The run as markdown: the machine, the sum, then one row per scenario."""
    m, s = r.machine, r.summary
    avx = {True: "AVX-512", False: "no AVX-512", None: "AVX-512 unknown"}[m.avx512]
    lines = [
        f"## Eval run {r.at:%Y-%m-%d %H:%M} UTC ({r.subset} catalogue)",
        "",
        f"Machine: {m.cpu}, {avx}, {m.cores or '?'} CPUs; engine {m.engine}.",
        "",
        f"- mean cause grade **{s.mean_grade:.1f}** over {s.scenarios} scenarios "
        f"({s.right} right, {s.wrong} wrong, {s.abstained} abstained)",
        f"- ruled out: precision {_pct(s.ruled_out_precision)}, recall "
        f"{_pct(s.ruled_out_recall)}; cannot tell where it cannot: {_pct(s.cannot_tell_right)}",
        f"- ADR offered right: {s.adr_right}; fixes the gate decided right: {s.fixes_right}; "
        f"time beyond the sampling window: {s.mean_extra_s:.1f} s on average",
        "",
        "| scenario | truth | named | grade | ruled out (P / R) | cannot tell | ADR | fix | "
        "window | beyond |",
        "| :--- | :--- | :--- | ---: | :--- | :--- | :--- | :--- | ---: | ---: |",
    ]
    for g in r.scenarios:
        adr = ", ".join(g.adr_offered) or "none"
        if g.adr_right is not None:
            adr += " ✓" if g.adr_right else " ✗"
        lines.append(
            f"| {g.scenario} | {', '.join(g.truth) or 'no engine cause'} | {g.top or '(none)'} | "
            f"{g.grade} | {_pct(g.ruled_out_precision)} / {_pct(g.ruled_out_recall)} | "
            f"{_pct(g.cannot_tell_right)} | {adr} | {_fix(g)} | {g.window_s:.1f} s | "
            f"{g.extra_s:.1f} s |"
        )
    wrong = [g for g in r.scenarios if g.grade < 100 or g.misses or g.adr_right is False]
    if wrong:
        lines += ["", "Not right:", ""]
        for g in wrong:
            said = [g.why] if g.grade < 100 else []
            said += g.misses
            if g.adr_right is False:
                said.append(f"offered {', '.join(g.adr_offered) or 'no ADR'}")
            lines.append(f"- **{g.scenario}** ({g.grade}): {'; '.join(said)}")
    return "\n".join(lines) + "\n"
