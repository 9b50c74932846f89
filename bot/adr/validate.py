"""The ADR validator: schema, cross-record rules, and the engine flags an ADR may apply.

Per file: it parses (schema included), its name starts with its id, the id's date is its date,
an accepted ADR has gates, no gate compares numbers of unlike kinds (``relative.unlike_gate``),
a draft is only proposed, and `fix.engine_args` passes the allowlist and, where vLLM is
installed, vLLM's own argument parser; each `cause` is a known cause name (the built-in ones and
those the runbooks declare), refused with its line. Across files: ids are unique,
`supersedes` names real ADRs, and an ADR an accepted one supersedes is marked superseded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from bot.adr import causes as vocabulary
from bot.adr import vllm_args
from bot.adr.causes import Cause
from bot.adr.flags import check_engine_args, to_argv
from bot.adr.models import Adr
from bot.adr.parse import Problem, date_of_id, parse_with_problems
from bot.adr.relative import NORMAL, unlike_gate
from bot.adr.store import DRAFTS, GLOB

# Given an argv, vLLM's reason for refusing it, or None; None as a whole means "not checked".
ArgvChecker = Callable[[Sequence[str]], "str | None"]


def default_checker(use_vllm: bool | None) -> ArgvChecker | None:
    """vLLM's parser when asked for (True) or when installed (None); no check when False."""
    if use_vllm is False or (use_vllm is None and not vllm_args.available()):
        return None
    return vllm_args.refusal


def collect(path: Path) -> list[Path]:
    """The ADR files at a path: the file itself, or every ADR-*.md below a directory."""
    if path.is_dir():
        return sorted(path.rglob(GLOB))
    return [path]


def validate_paths(
    paths: Sequence[Path],
    *,
    context: Sequence[Path] = (),
    checker: ArgvChecker | None = None,
    causes: Mapping[str, Cause] | None = None,
) -> list[Problem]:
    """Every problem in the given ADR files; ``context`` files count for ids and supersedes;
    ``causes``: the cause names an ADR may answer (default: the built-in ones)."""
    problems: list[Problem] = []
    records: dict[Path, Adr] = {}
    for path in paths:
        adr, found = _load(path)
        problems += found
        if adr is not None:
            records[path] = adr
            problems += check_record(adr, path=path, checker=checker)
            problems += check_causes(adr, path=path, causes=causes or vocabulary.known())
    known = dict(records)
    resolved = {path.resolve() for path in records}
    for path in context:
        if path.resolve() not in resolved and (adr := _load(path)[0]) is not None:
            known[path] = adr
    problems += check_across(records, known)
    return problems


def _load(path: Path) -> tuple[Adr | None, list[Problem]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Problem(str(path), "file", f"cannot read: {exc}")]
    return parse_with_problems(text, file=str(path))


def check_record(adr: Adr, *, path: Path, checker: ArgvChecker | None = None) -> list[Problem]:
    """The rules one record must follow on its own."""
    file = str(path)
    problems: list[Problem] = []
    if path.name != f"{adr.id}.md" and not path.name.startswith(f"{adr.id}-"):
        problems.append(
            Problem(file, "id", f"the file name must start with the id: {adr.id}-<slug>.md")
        )
    if date_of_id(adr.id) != adr.date:
        problems.append(
            Problem(file, "date", f"{adr.date} differs from the date in the id {adr.id}")
        )
    if adr.status == "accepted" and (adr.gates is None or adr.gates.is_empty()):
        problems.append(
            Problem(
                file,
                "gates",
                "an accepted ADR needs canary gates "
                "(max_ttft_p99_ms, max_tpot_p99_ms, min_goodput_ratio, max_kv_fragmentation)",
            )
        )
    if adr.gates is not None:
        problems += [
            Problem(file, f"gates.{key}", unlike_gate(key, value))
            for key, value in adr.gates.relative(NORMAL).items()
        ]
    if path.parent.name == DRAFTS and adr.status != "proposed":
        problems.append(
            Problem(
                file,
                "status",
                f"a draft must be 'proposed', not {adr.status!r}; "
                "move the file out of drafts/ when the decision is made",
            )
        )
    if adr.id in adr.supersedes:
        problems.append(Problem(file, "supersedes", "an ADR cannot supersede itself"))
    flag_problems = check_engine_args(adr.fix.engine_args)
    problems += [Problem(file, field, why) for field, why in flag_problems]
    if checker is not None and adr.fix.engine_args and not flag_problems:
        argv = to_argv(adr.fix.engine_args, file=file)
        reason = checker(argv)
        if reason is not None:
            problems.append(
                Problem(
                    file,
                    "fix.engine_args",
                    f"vLLM {vllm_args.version()} refuses {' '.join(argv)}: {reason}",
                )
            )
    return problems


def check_causes(adr: Adr, *, path: Path, causes: Mapping[str, Cause]) -> list[Problem]:
    """Each name in ``cause:`` is a cause the diagnosis can test; the problem names the line."""
    unknown = [name for name in adr.cause if name not in causes]
    if not unknown:
        return []
    line = _line_of(path, "cause:")
    where = f"cause (line {line})" if line else "cause"
    return [
        Problem(
            str(path),
            where,
            f"unknown cause {name!r}; write one of: {', '.join(causes)} "
            "(or declare it in a runbook's causes)",
        )
        for name in unknown
    ]


def _line_of(path: Path, prefix: str) -> int | None:
    """The 1-based line of the file's first line starting with ``prefix`` (None: not found)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return next((n for n, text in enumerate(lines, 1) if text.startswith(prefix)), None)


def check_across(records: dict[Path, Adr], known: dict[Path, Adr]) -> list[Problem]:
    """The rules between records: unique ids, real supersedes targets, superseded status."""
    problems: list[Problem] = []
    by_id: dict[str, Path] = {}
    for path, adr in sorted(known.items(), key=lambda item: item[0]):
        first = by_id.setdefault(adr.id, path)
        if first != path and path in records:
            problems.append(Problem(str(path), "id", f"{adr.id} is already the id of {first}"))
    for path, adr in records.items():
        for target in adr.supersedes:
            if target not in by_id:
                problems.append(
                    Problem(
                        str(path),
                        "supersedes",
                        f"{target} is not an ADR here "
                        f"(known: {', '.join(sorted(by_id)) or 'none'})",
                    )
                )
    for path, adr in known.items():
        if adr.status != "accepted":
            continue
        for target in adr.supersedes:
            old_path = by_id.get(target)
            if old_path in records and known[old_path].status != "superseded":
                problems.append(
                    Problem(
                        str(old_path),
                        "status",
                        f"{target} is superseded by accepted "
                        f"{adr.id} ({path.name}); set status: superseded",
                    )
                )
    return problems


def validate(
    path: Path, *, checker: ArgvChecker | None = None, causes: Mapping[str, Cause] | None = None
) -> list[Problem]:
    """Validate an ADR file or directory; a single file is checked against its whole store."""
    paths = collect(path)
    if not paths:
        return [Problem(str(path), "path", f"no {GLOB} files here")]
    root = path.parent if path.is_file() else path
    if root.name == DRAFTS:
        root = root.parent
    return validate_paths(
        paths, context=collect(root) if root.is_dir() else [], checker=checker, causes=causes
    )
