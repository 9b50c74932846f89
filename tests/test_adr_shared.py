"""ADRs in the store (SQLite and a real PostgreSQL): the ADR directory imported by its rules,
exported back byte for byte, read by the CLI, and decided once when two reviewers click at once."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import shutil
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, select, text

from bot.adr.parse import parse
from bot.adr.render import render
from bot.adr.shared import SharedAdrStore
from bot.adr.sync import Action, decide
from bot.app.cli import cli
from bot.kernel.store import adrs as rows
from bot.kernel.store import service as store
from bot.kernel.store.db import Database
from bot.kernel.store.models import ActionToken, AdrRecord, AdrRevision, AuditEntry
from bot.postmortem.service import AlreadyDecided
from tests.fakes.bot import Harness, harness
from tests.test_bot_store import new_database, postgres  # noqa: F401  (the real PostgreSQL server fixture)

ROOT = Path(__file__).resolve().parents[1]
SEED = "ADR-20260831-01"
SEED_FILE = "ADR-20260831-01-kv-cache-paging-throughput.md"
TUNE_DRAFT = "ADR-20261129-01"
DEMO = ROOT / "bot" / "app" / "demo" / "ADR-20261129-02-cpu-demo-scheduler-step.md"
T0 = dt.datetime(2026, 12, 1, 9, 0, tzinfo=dt.UTC)


def new_url(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> str:
    """A new, empty database on ``backend``."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'ruleloop.db'}"
    server = request.getfixturevalue("postgres")
    return new_database(server, prefix="a")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a migrated, empty store on each backend."""
    database = Database(new_url(request, tmp_path, request.param))
    database.create_schema()
    database.dispose()
    return database.url.render_as_string(hide_password=False)


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    database = Database(url)
    yield database
    database.dispose()


@pytest.fixture
def adr_dir(tmp_path: Path) -> Path:
    """A copy of the repository's adr/ (a record, a `ruleloop tune` draft and its runs) with
    the demo's ADR beside them."""
    target = tmp_path / "adr"
    shutil.copytree(ROOT / "adr", target)
    shutil.copy(DEMO, target / DEMO.name)
    return target


def shared(adr_dir: Path, db: Database) -> SharedAdrStore:
    """A new store object (as a newly started replica has): nothing imported by it yet."""
    return SharedAdrStore(root=adr_dir, db=db, clock=lambda: T0)


def record(db: Database, adr_id: str) -> AdrRecord:
    with db.transaction() as s:
        found = rows.get(s, adr_id)
    assert found is not None
    return found


def history(db: Database, adr_id: str) -> list[tuple[int, str, str]]:
    with db.transaction() as s:
        return [(r.version, r.source, r.note) for r in rows.revisions(s, adr_id)]


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("ADR-*.md")}


# --- the rules, on their own --------------------------------------------------------------
def row(*, sha: str, synced: str | None) -> AdrRecord:
    return AdrRecord(adr_id=SEED, sha=sha, synced_sha=synced, version=3)


@pytest.mark.parametrize(
    ("stored", "seen_before", "expected"),
    [
        (None, False, Action.NEW),
        (row(sha="f", synced=None), False, Action.SAME),  # a file catching up with the store
        (row(sha="s", synced="s"), True, Action.OLDER),  # an old copy: never rolls back
        (row(sha="s", synced="s"), False, Action.FILE_WINS),  # edited in git
        (row(sha="s", synced="o"), False, Action.STORE_WINS),  # decided in the store since
        (row(sha="s", synced=None), False, Action.STORE_WINS),  # drafted by the bot
    ],
)
def test_import_rule(stored: AdrRecord | None, seen_before: bool, expected: Action) -> None:
    assert decide(file_sha="f", row=stored, seen_before=seen_before) is expected


# --- import and export ----------------------------------------------------------------------
def test_import_then_export_gives_back_the_shipped_files_byte_for_byte(
    adr_dir: Path, db: Database, tmp_path: Path
) -> None:
    imported = shared(adr_dir, db).sync()
    assert imported is not None and imported.count(Action.NEW) == 3 and not imported.skipped
    out = tmp_path / "exported"
    done = SharedAdrStore(root=out, db=db, sync=False).export(out)
    assert len(done.written) == 3 and not done.removed
    assert files(out) == files(adr_dir)  # drafts/ included; .runs/ stay where git has them
    for name, data in files(adr_dir).items():  # the renderer gives the same files
        assert render(parse(data.decode("utf-8"))).encode("utf-8") == data, name
    again = SharedAdrStore(root=out, db=db, sync=False).export(out)
    assert (again.written, len(again.unchanged)) == ([], 3)


def test_import_is_idempotent_and_reads_like_the_files(adr_dir: Path, db: Database) -> None:
    first = shared(adr_dir, db)
    first.sync()
    second = shared(adr_dir, db).sync()  # another replica, or a restart
    assert second is not None and second.count(Action.SAME) == 3
    assert [v for v, *_ in history(db, SEED)] == [1]  # no new version
    store_ = shared(adr_dir, db)
    assert [a.id for a in store_.accepted()] == [SEED, "ADR-20261129-02"]
    found = store_.find(TUNE_DRAFT)
    assert found is not None and found[1].status == "proposed"
    assert str(found[0]).startswith(f"adr/drafts/{TUNE_DRAFT}-")
    assert store_.next_id(dt.date(2026, 11, 29)) == "ADR-20261129-03"
    assert store_.get_or_raise(SEED).gates is not None
    with pytest.raises(Exception, match=r"no ADR ADR-20260831 under .* or in the store \(known: "):
        store_.get_or_raise("ADR-20260831")


def test_a_file_edited_in_git_replaces_the_record_the_store_has_not_changed(
    adr_dir: Path, db: Database
) -> None:
    shared(adr_dir, db).sync()
    seed = adr_dir / SEED_FILE
    seed.write_text(seed.read_text().replace("max_ttft_p99_ms: 350.0", "max_ttft_p99_ms: 300.0"))
    done = shared(adr_dir, db).sync()
    assert done is not None and done.actions[seed] is Action.FILE_WINS
    assert shared(adr_dir, db).get_or_raise(SEED).gates.max_ttft_p99_ms == 300.0  # type: ignore[union-attr]
    assert history(db, SEED)[-1] == (2, "file", "adr/" + SEED_FILE + " changed since version 1")
    assert record(db, SEED).synced_sha == record(db, SEED).sha


def test_a_file_edited_while_the_store_runs_counts_at_once(adr_dir: Path, db: Database) -> None:
    """One store object (a running replica) imports what changed on its next read."""
    running = shared(adr_dir, db)
    assert running.get_or_raise(SEED).status == "accepted"
    seed = adr_dir / SEED_FILE
    seed.write_text(seed.read_text().replace("status: accepted", "status: superseded"))
    assert [a.id for a in running.accepted()] == ["ADR-20261129-02"]


def test_an_older_copy_never_rolls_the_store_back(adr_dir: Path, db: Database) -> None:
    seed = adr_dir / SEED_FILE
    v1 = seed.read_text()
    shared(adr_dir, db).sync()
    seed.write_text(v1.replace("max_ttft_p99_ms: 350.0", "max_ttft_p99_ms: 300.0"))
    shared(adr_dir, db).sync()
    seed.write_text(v1)  # a replica started from the older image, or a stale checkout
    done = shared(adr_dir, db).sync()
    assert done is not None and done.actions[seed] is Action.OLDER
    assert record(db, SEED).version == 2
    assert shared(adr_dir, db).get_or_raise(SEED).gates.max_ttft_p99_ms == 300.0  # type: ignore[union-attr]


def test_a_decision_made_in_the_store_wins_until_the_file_catches_up(
    adr_dir: Path, db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared(adr_dir, db).sync()
    draft_path = next((adr_dir / "drafts").glob(f"{TUNE_DRAFT}-*.md"))
    decided = draft_path.read_text().replace("status: proposed", "status: rejected")
    with db.transaction() as s:  # as a reviewer's click in Slack does (bot.postmortem.service)
        stored = rows.get(s, TUNE_DRAFT)
        assert stored is not None
        assert rows.change(
            s, stored, name=stored.name, draft=False, status="rejected", markdown=decided,
            source="slack", actor="U2", at=T0, note="rejected in Slack by U2", synced=False,
        )  # fmt: skip
    # the image still has the proposed draft: an older version, the decision stays
    assert shared(adr_dir, db).sync().actions[draft_path] is Action.OLDER  # type: ignore[union-attr]
    # someone edits the draft in git meanwhile: a conflict, the store keeps the decision
    draft_path.write_text(draft_path.read_text().replace("Chats beside", "Chats next to"))
    with caplog.at_level(logging.WARNING, logger="ruleloop.adr"):
        done = shared(adr_dir, db).sync()
    assert done is not None and done.actions[draft_path] is Action.STORE_WINS
    assert "the store keeps its version" in caplog.text and "ruleloop adr export" in caplog.text
    assert shared(adr_dir, db).get_or_raise(TUNE_DRAFT).status == "rejected"
    # exported and committed: the file holds the decision, and owns the record again
    exported = SharedAdrStore(root=adr_dir, db=db, sync=False).export(adr_dir)
    assert exported.removed == [draft_path]  # one file per id: the draft left drafts/
    decided_path = adr_dir / draft_path.name
    assert shared(adr_dir, db).sync().actions[decided_path] is Action.SAME  # type: ignore[union-attr]
    decided_path.write_text(decided_path.read_text().replace("Chats beside", "Chats next to"))
    assert shared(adr_dir, db).sync().actions[decided_path] is Action.FILE_WINS  # type: ignore[union-attr]
    assert [source for _, source, _ in history(db, TUNE_DRAFT)] == ["file", "slack", "file"]


def test_files_that_do_not_import_are_skipped_and_named(
    adr_dir: Path, db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    (adr_dir / "ADR-20261201-01-broken.md").write_text("---\nid: [\n---\n# nothing\n")
    seed = (adr_dir / SEED_FILE).read_text()
    (adr_dir / "ADR-20261201-02-other-name.md").write_text(seed)  # id ADR-20260831-01 inside
    (adr_dir / "drafts" / SEED_FILE).write_text(seed)  # the seed's id again
    with caplog.at_level(logging.WARNING, logger="ruleloop.adr"):
        records, skipped = shared(adr_dir, db).scan(include_drafts=True)
    assert sorted(a.id for a in records) == [SEED, TUNE_DRAFT, "ADR-20261129-02"]
    why = {path.name: reason for path, reason in skipped}
    assert why["ADR-20261201-01-broken.md"].startswith("front matter: line 2: not valid YAML")
    assert why["ADR-20261201-02-other-name.md"] == (
        f"id: the file name must start with the id: {SEED}-<slug>.md"
    )
    assert why[SEED_FILE] == f"id: {SEED} is already the id of {SEED_FILE}"
    assert "skipped ADR file" in caplog.text
    # records only (what diagnoses name): the drafts/ copy is not among them
    assert len(shared(adr_dir, db).skipped()) == 2


def test_a_record_removed_from_the_directory_stays_in_the_store(
    adr_dir: Path, db: Database
) -> None:
    shared(adr_dir, db).sync()
    (adr_dir / DEMO.name).unlink()
    assert "ADR-20261129-02" in [a.id for a in shared(adr_dir, db).accepted()]


def test_replicas_importing_at_once_store_each_record_once(adr_dir: Path, url: str) -> None:
    replicas = [Database(url) for _ in range(4)]
    try:
        with ThreadPoolExecutor(len(replicas)) as pool:
            list(pool.map(lambda d: shared(adr_dir, d).sync(), replicas))
        with replicas[0].transaction() as s:
            versions = s.scalars(select(AdrRevision.adr_id)).all()
    finally:
        for database in replicas:
            database.dispose()
    assert sorted(versions) == sorted([SEED, TUNE_DRAFT, "ADR-20261129-02"])


def test_export_into_a_file_is_refused_with_the_reason(
    adr_dir: Path, db: Database, tmp_path: Path
) -> None:
    shared(adr_dir, db).sync()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(Exception, match=f"cannot write the ADRs into {blocker}"):
        SharedAdrStore(root=blocker, db=db, sync=False).export(blocker)


# --- the command line -------------------------------------------------------------------------
def adr_cli(*args: str, url: str | None) -> Any:
    env = {"RULELOOP_CONFIG": None, "RULELOOP_DATABASE_URL": url, "RULELOOP_ADR_DIR": None}
    return CliRunner().invoke(cli, ["adr", *args], env=env, catch_exceptions=False)


def test_cli_reads_the_store_when_a_database_is_configured(
    adr_dir: Path, db: Database, url: str, tmp_path: Path
) -> None:
    shared(adr_dir, db).sync()
    (adr_dir / SEED_FILE).unlink()  # the CLI reads the store, not the files
    listed = adr_cli("list", "--adr-dir", str(adr_dir), url=url)
    assert listed.exit_code == 0, listed.output
    assert f"{SEED}  accepted    2026-08-31" in listed.output
    assert f"(store: adr/{SEED_FILE})" in listed.output and "(store: adr/drafts/" in listed.output
    shown = adr_cli("show", SEED, url=url)
    assert shown.exit_code == 0 and shown.output.startswith(f"---\nid: {SEED}\n")
    assert "engine argv: --enable-chunked-prefill" in shown.output
    report = tmp_path / "report.json"
    report.write_text('{"metrics": {"ttft_p99_ms": 4500, "goodput_ratio": 0.6}}')
    matched = adr_cli("match", str(report), url=url)
    assert matched.exit_code == 0 and matched.output.startswith(f"{SEED}  ")
    files_only = adr_cli("list", "--adr-dir", str(adr_dir), url=None)
    assert SEED not in files_only.output  # without a database: the files, as before


def test_cli_export_writes_the_files_and_says_what_it_did(
    adr_dir: Path, db: Database, url: str, tmp_path: Path
) -> None:
    shared(adr_dir, db).sync()
    out = tmp_path / "git" / "adr"
    result = adr_cli("export", str(out), url=url)
    assert result.exit_code == 0, result.output
    assert result.output.endswith(f"3 written, 0 unchanged, 0 removed in {out}\n")
    assert files(out) == files(adr_dir)


def test_cli_refuses_a_store_without_adr_tables_and_a_missing_store(tmp_path: Path) -> None:
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    result = CliRunner().invoke(
        cli, ["adr", "list"], env={"RULELOOP_CONFIG": None, "RULELOOP_DATABASE_URL": empty}
    )
    assert result.exit_code == 2
    assert "has no ADR tables yet: run `ruleloop db upgrade`" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(
        cli,
        ["adr", "export", str(tmp_path / "out"), "--state-dir", str(tmp_path / "none")],
        env={"RULELOOP_CONFIG": None, "RULELOOP_DATABASE_URL": None},
    )
    assert result.exit_code == 2 and f"no store at {tmp_path / 'none' / 'ruleloop.db'}" in (
        result.output
    )


# --- two reviewers at once --------------------------------------------------------------------
REVIEW = {"diagnose": ["U1"], "apply": ["U1"], "approve": ["U1", "U2"], "review": ["U2", "U3"]}


@pytest.fixture
async def bots(tmp_path: Path, url: str) -> AsyncIterator[tuple[Harness, Harness]]:
    """Two bots (replicas) on one store, each with its own state directory."""
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
    pair = tuple(
        harness(tmp_path / name, slack=None, store={"url": url}, access=REVIEW)
        for name in ("one", "two")
    )
    yield pair  # type: ignore[misc]
    for bot in pair:
        await bot.close()


async def drafted(h: Harness) -> tuple[str, dict[str, str]]:
    """A diagnosed incident (TTFT out of its gate), drafted: the draft's id and its buttons."""
    with h.bot.db.transaction() as s:
        incident = store.create(s, key="k", source="slash", title="TTFT p99 high",
                                target="prod-a", labels={}, at=T0)  # fmt: skip
        incident.summary = {
            "headline": {"ttft_p99_ms": 900.0},
            "baseline": {"ttft_p99_ms": [350.0, SEED]},
        }
        incident_id = incident.id
    adr_id = await h.bot.drafts.draft(incident_id, author="U1")
    with h.bot.db.transaction() as s:
        tokens = {t.kind: t.token for t in s.scalars(select(ActionToken)) if adr_id in t.subject}
    return adr_id, tokens


def reader(h: Harness) -> SharedAdrStore:
    """What another part of that bot reads: the store, not files."""
    return SharedAdrStore(root=h.bot.remediation.settings.paths.adr, db=h.bot.db, sync=False)


def decisions(db: Database) -> list[str]:
    with db.transaction() as s:
        return [
            e.action for e in s.scalars(select(AuditEntry)) if e.action.startswith("adr_draft.")
        ]


async def test_two_reviewers_at_once_one_wins_the_other_is_told(
    bots: tuple[Harness, Harness], url: str
) -> None:
    one, two = bots
    adr_id, tokens = await drafted(one)
    race = asyncio.gather(
        one.bot.drafts.review(user_id="U2", token=tokens["accept"]),
        two.bot.drafts.review(user_id="U3", token=tokens["reject"]),
        return_exceptions=True,
    )
    if url.startswith("postgresql"):
        # hold the draft's row: both reviews pass their checks and wait on it, then race
        locker = create_engine(url)
        with locker.connect() as held:
            held.execute(text("SELECT 1 FROM adr_drafts WHERE adr_id = :i FOR UPDATE"),
                         {"i": adr_id})  # fmt: skip
            task = asyncio.ensure_future(race)
            await wait_for_lock_waiters(held, 2)
            held.rollback()
        locker.dispose()
        outcomes = await task
    else:
        outcomes = await race
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(lost) == 1 and outcomes.count(None) == 1, outcomes
    winner, state = ("U2", "accepted") if outcomes[0] is None else ("U3", "rejected")
    assert isinstance(lost[0], AlreadyDecided)
    assert str(lost[0]).startswith(f"{adr_id} was already {state} by <@{winner}> at ")
    assert str(lost[0]).endswith(". Nothing was changed.")
    assert decisions(one.bot.db) == ["adr_draft.written", f"adr_draft.{state}"]
    decided = record(one.bot.db, adr_id)
    assert (decided.status, decided.version, decided.draft) == (state, 2, False)
    with one.bot.db.transaction() as s:
        used = {t.used_by for t in s.scalars(select(ActionToken)) if adr_id in t.subject}
    assert used == {winner}


async def wait_for_lock_waiters(connection: Any, count: int) -> None:
    """Until ``count`` other sessions of this database wait on a lock."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    while connection.execute(query).scalar_one() < count:
        await asyncio.sleep(0.05)


async def test_a_decided_draft_is_decided_for_every_replica_at_once(
    bots: tuple[Harness, Harness],
) -> None:
    one, two = bots
    adr_id, tokens = await drafted(one)
    assert adr_id not in [a.id for a in reader(two).accepted()]
    await two.bot.drafts.review(user_id="U2", token=tokens["accept"])
    assert adr_id in [a.id for a in reader(one).accepted()]  # no restart, no file
    found = reader(one).find(adr_id)
    assert found is not None and found[0] == Path(f"adr/{record(one.bot.db, adr_id).name}")
    assert found[1].deciders == ["U1", "U2"] and "accepted by U2." in found[1].notes
    with pytest.raises(AlreadyDecided, match=f"{adr_id} was already accepted by <@U2> at "):
        await one.bot.drafts.review(user_id="U3", token=tokens["reject"])
    assert not list(reader(one).root.rglob(f"{adr_id}*"))


async def test_two_replicas_drafting_on_one_day_take_two_ids(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Another replica's draft, inserted but not yet committed, holds the id this one picked:
    the store refuses the second insert and the draft is made again with the next id."""
    url = new_url(request, tmp_path, "postgresql")
    (tmp_path / "one").mkdir()
    h = harness(tmp_path / "one", slack=None, store={"url": url}, access=REVIEW)
    try:
        taken = f"ADR-{h.wall.now():%Y%m%d}-01"
        other = create_engine(url)
        with other.connect() as held:
            held.execute(
                text(
                    "INSERT INTO adr_records (adr_id, name, draft, status, text, sha, version, "
                    "source, updated_by, updated_at) VALUES (:i, :n, true, 'proposed', '', '', "
                    "1, 'bot', 'U9', now())"
                ),
                {"i": taken, "n": f"{taken}-x.md"},
            )  # not committed yet: invisible to the draft's read of the free ids
            task = asyncio.ensure_future(drafted(h))
            await wait_for_lock_waiters(held, 1)  # its insert waits on the unique id
            held.commit()
        other.dispose()
        adr_id, tokens = await task
        assert adr_id == f"ADR-{h.wall.now():%Y%m%d}-02" and set(tokens) == {"accept", "reject"}
        assert record(h.bot.db, taken).updated_by == "U9"  # the other replica's draft is intact
    finally:
        await h.close()
