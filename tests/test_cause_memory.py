"""Memory of earlier incidents and `ruleloop adr stats` (issue 33), on a REAL store (SQLite and
PostgreSQL): incidents with stored diagnosis summaries, the changes made for them, the drift
job's audit entries and on-call's cause answers, read back by bot.incidents.memory and
bot.incidents.stats.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from bot.app.cli.adr import adr as adr_cli
from bot.incidents import memory, stats
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.kernel.store.models import CauseFeedback, Incident, Remediation
from tests import test_bot_store

# the store on each backend (a real PostgreSQL server too), as tests/test_bot_store.py makes it
db, postgres = test_bot_store.db, test_bot_store.postgres

T0 = dt.datetime(2026, 11, 29, 2, 0, tzinfo=dt.UTC)
ADR = "ADR-20261129-02"
KEYS = itertools.count(1)
MOVED = "prompt p50: 2,000–5,000 -> 500–1,000 tokens (more than 2x smaller): DRIFTED"


def summary(
    *supported: str, ruled_out: tuple[str, ...] = (), matches: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A stored diagnosis summary with these verdicts."""
    causes = [{"cause": c, "title": c, "verdict": "supported", "evidence": "", "number": "9000 tokens",
               "missing": []} for c in supported]  # fmt: skip
    causes += [{"cause": c, "title": c, "verdict": "ruled_out", "evidence": "", "number": "1 %",
                "missing": []} for c in ruled_out]  # fmt: skip
    return {"causes": causes, "matches": list(matches)}


def incident(db: Database, at: dt.datetime, data: dict[str, Any], *, target: str = "prod-a") -> int:
    with db.transaction() as s:
        made = store.create(s, key=f"g{next(KEYS)}", source="alertmanager",
                            title="TTFT p99 high", target=target, labels={}, at=at)  # fmt: skip
        store.set_summary(s, made, summary=data)
        s.flush()
        return made.id


def change(
    db: Database, incident_id: int, state: str, at: dt.datetime, *, target: str = "prod-a"
) -> None:
    with db.transaction() as s:
        s.add(Remediation(incident_id=incident_id, adr_id=ADR, target=target, requested_by="U1",
                          state=state, approvals_needed=1, approved_by=["U2"], created_at=at,
                          updated_at=at))  # fmt: skip


def recall(db: Database, incident_id: int) -> list[memory.Memory]:
    with db.transaction() as s:
        found = s.get(Incident, incident_id)
        assert found is not None
        return memory.recall(s, found, found.summary)


def test_a_cause_seen_before_on_the_target_names_the_change_kept_then_and_the_drift(
    db: Database,
) -> None:
    first = incident(db, T0, summary("prefill_decode_mixing", matches=(ADR,)))
    change(db, first, "promoted", T0 + dt.timedelta(minutes=20))
    incident(db, T0 + dt.timedelta(days=2), summary("prefill_decode_mixing"))
    incident(db, T0 + dt.timedelta(days=3), summary("prefill_decode_mixing"), target="prod-b")
    incident(db, T0 + dt.timedelta(days=3), summary("kv_cache_pressure"))  # another cause
    with db.transaction() as s:  # the drift job found the workload moved since
        drift = store.create(s, key="drift", source="workload_drift", title="drift",
                             target="prod-a", labels={}, at=T0 + dt.timedelta(days=4))  # fmt: skip
        store.audit(s, at=T0 + dt.timedelta(days=4), actor="ruleloop", action="workload.drift",
                    incident=drift, detail={"dimensions": {ADR: [MOVED]}})  # fmt: skip
    now = incident(db, T0 + dt.timedelta(days=5), summary("prefill_decode_mixing"))

    [remembered] = recall(db, now)
    assert (remembered.cause, remembered.times) == ("prefill_decode_mixing", 3)
    assert remembered.last == memory.Earlier(first, T0, ADR, "applied and kept")
    assert remembered.moved == [MOVED]
    line = memory.memory_line(remembered)
    assert line.startswith("3rd time in 7 days: *prefill_decode_mixing*; on 29 Nov (incident #1)")
    assert f"{ADR} was applied and kept; since then the workload moved: prompt p50" in line


def test_a_first_time_cause_says_nothing_and_old_ones_do_not_count_as_recent(db: Database) -> None:
    old = incident(db, T0 - dt.timedelta(days=30), summary("queueing"))
    now = incident(db, T0, summary("queueing"))
    [remembered] = recall(db, now)
    assert remembered.times == 1 and remembered.last == memory.Earlier(
        old, T0 - dt.timedelta(days=30)
    )
    assert "1st time in 7 days" in memory.memory_line(remembered)
    assert "no change made then" in memory.memory_line(remembered)
    fresh = incident(db, T0, summary("gpu_fault"))
    assert recall(db, fresh) == []
    unsupported = incident(db, T0, summary(ruled_out=("queueing",)))
    assert recall(db, unsupported) == []  # a ruled-out cause is not a recurrence


def test_a_cause_marked_wrong_is_said_the_next_time_it_is_proposed(db: Database) -> None:
    first = incident(db, T0, summary("kv_cache_pressure"))
    with db.transaction() as s:
        s.add(CauseFeedback(incident_id=first, target="prod-a", cause="kv_cache_pressure",
                            verdict="wrong", adr_ids=[], actor="U1", at=T0))  # fmt: skip
    now = incident(db, T0 + dt.timedelta(hours=3), summary("kv_cache_pressure"))
    [remembered] = recall(db, now)
    assert remembered.marked_wrong == T0
    assert memory.memory_line(remembered).endswith("on-call marked this cause wrong on 29 Nov")


def test_stats_count_matches_changes_recurrences_and_answers(db: Database) -> None:
    kept = incident(db, T0, summary("prefill_decode_mixing", matches=(ADR,)))
    change(db, kept, "promoted", T0)
    back = incident(db, T0 + dt.timedelta(days=1), summary("prefill_decode_mixing", matches=(ADR,)))
    change(db, back, "rolled_back", T0 + dt.timedelta(days=1))
    asked = incident(db, T0 + dt.timedelta(days=20), summary(matches=(ADR,)))
    change(db, asked, "dry_run", T0 + dt.timedelta(days=20))  # not applied
    with db.transaction() as s:
        for verdict in ("confirmed", "confirmed", "wrong"):
            s.add(CauseFeedback(incident_id=kept, target="prod-a", cause="prefill_decode_mixing",
                                verdict=verdict, adr_ids=[ADR], actor="U1", at=T0))  # fmt: skip
    with db.transaction() as s:
        [row] = stats.collect(s, days=7)
        [wide] = stats.collect(s, days=30)
    assert (row.matched, row.applied, row.kept, row.rolled_back) == (3, 2, 1, 1)
    assert row.recurred == 1  # the same cause came back a day after the kept change
    assert (row.confirmed, row.marked_wrong) == (2, 1)
    assert wide.recurred == 1  # counted per kept change, not per incident after it
    text = stats.table([row], days=7)
    assert "recurred 7d" in text.splitlines()[0] and text.splitlines()[2].startswith(ADR)


def test_stats_cli_prints_a_table_and_json_of_the_store(tmp_path: Path, db: Database) -> None:
    kept = incident(db, T0, summary("prefill_decode_mixing", matches=(ADR,)))
    change(db, kept, "promoted", T0)
    env = {"RULELOOP_DATABASE_URL": db.url.render_as_string(hide_password=False)}
    result = CliRunner().invoke(adr_cli, ["stats", "--json", "--days", "3"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["recurred_within_days"] == 3
    assert data["adrs"][0] == {"adr_id": ADR, "matched": 1, "applied": 1, "kept": 1,
                                    "rolled_back": 0, "recurred": 0, "confirmed": 0,
                                    "marked_wrong": 0}  # fmt: skip
    table = CliRunner().invoke(adr_cli, ["stats"], env=env)
    assert table.exit_code == 0 and ADR in table.output and "rolled back" in table.output


def test_the_incident_page_shows_the_threads_memory_line(db: Database) -> None:
    from bot.surfaces.web import queries
    from bot.surfaces.web.routes import templates
    from bot.surfaces.web.view import incident_page

    first = incident(db, T0, summary("prefill_decode_mixing", matches=(ADR,)))
    change(db, first, "promoted", T0 + dt.timedelta(minutes=20))
    moved = "prompt p50 <1,000 & 2x more tokens: DRIFTED"  # Slack escapes it, HTML too
    with db.transaction() as s:
        drift = store.create(s, key="drift-page", source="workload_drift", title="drift",
                             target="prod-a", labels={}, at=T0 + dt.timedelta(days=1))  # fmt: skip
        store.audit(s, at=T0 + dt.timedelta(days=1), actor="ruleloop", action="workload.drift",
                    incident=drift, detail={"dimensions": {ADR: [moved]}})  # fmt: skip
    now = incident(db, T0 + dt.timedelta(days=2), summary("prefill_decode_mixing"))
    [remembered] = recall(db, now)
    thread = memory.memory_text([remembered])
    assert (
        thread is not None
        and "*prefill_decode_mixing*" in thread
        and "&lt;1,000 &amp; 2x" in thread
    )

    def page(incident_id: int) -> str:
        record = queries.incident(db, incident_id)
        assert record is not None
        view = incident_page(record, adr=lambda _: None, markdown=lambda _: "")
        return templates().get_template("incident.html.j2").render(page=view, chart_url="")

    html = page(now)
    line = (
        thread.removeprefix(":repeat: ").replace("*", "").replace("&lt;", "<").replace("&amp;", "&")
    )
    shown = html.split('<section id="memory">', 1)[1].split("</section>", 1)[0]
    assert f'<li class="memory">{line.replace("&", "&amp;").replace("<", "&lt;")}</li>' in shown
    assert "2nd time in 7 days: prefill_decode_mixing; on 29 Nov (incident #" in shown
    assert 'id="memory"' not in page(first)  # the first time: nothing remembered, no section
