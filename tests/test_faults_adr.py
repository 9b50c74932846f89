"""Faults of the decision store and its command line (docs/reliability.md): a malformed ADR file
costs only itself, ids are exact, slugs stay in drafts/, a closed pipe is no failure."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.adr.store import AdrStore
from bot.app.cli import cli
from tests.fakes.bot import ROOT, Harness, harness
from tests.fakes.slack_api import FakeSlack

pytestmark = pytest.mark.faults

SEED = "ADR-20260831-01"
BROKEN = "ADR-20261201-01-broken.md"


@pytest.fixture
async def h(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[Harness]:
    harness_ = harness(tmp_path, slack=slack, matching_adr=True)
    yield harness_
    await harness_.close()


def seed_store(tmp_path: Path) -> Path:
    """A copy of the repository's decision store."""
    target = tmp_path / "adr"
    shutil.copytree(ROOT / "adr", target)
    return target


async def test_a_malformed_adr_is_skipped_and_reported_and_the_diagnosis_posted(
    h: Harness, slack: FakeSlack, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 14: one malformed file in adr/ made every diagnosis fail."""
    (tmp_path / "adr" / BROKEN).write_text("---\nid: [\n---\n# nothing\n")
    with caplog.at_level(logging.WARNING, logger="ruleloop.adr"):
        await h.slash("prod-a")
        await slack.until("chat.update")
        await h.bot.tasks.drain()
    root, findings, adrs = slack.of("chat.postMessage")
    shown = json.dumps(findings.args["blocks"], ensure_ascii=False)
    assert f"skipped ADR file {BROKEN}: front matter: line 2: not valid YAML" in shown
    assert "TTFT p99" in shown  # the runbook's findings are all there
    assert adrs.args["text"] == f"Matching accepted ADRs: {SEED}"  # the good ADR still matched
    assert "diagnosed" in json.dumps(slack.of("chat.update")[-1].args["blocks"])
    assert any(BROKEN in r.getMessage() for r in caplog.records), caplog.text


def test_the_store_skips_malformed_files_and_names_them(tmp_path: Path) -> None:
    store = AdrStore(root=seed_store(tmp_path))
    (store.root / BROKEN).write_text("no front matter\n")
    assert [a.id for a in store.accepted()] == [SEED]
    ((path, why),) = store.skipped()
    assert path.name == BROKEN and why.startswith("front matter: the file must start with")


@pytest.mark.parametrize("prefix", ["ADR", "ADR-20260831", "ADR-20260831-0", "adr-20260831-01"])
def test_an_adr_id_must_be_exact_not_a_prefix(tmp_path: Path, prefix: str) -> None:
    """Item 15: `ADR` and `ADR-20260831` resolved to ADR-20260831-01."""
    adr_dir = seed_store(tmp_path)
    store = AdrStore(root=adr_dir)
    assert store.find(prefix) is None
    assert store.find(SEED) is not None
    result = CliRunner().invoke(cli, ["adr", "show", prefix, "--adr-dir", str(adr_dir)])
    assert result.exit_code == 2 and f"no ADR {prefix} under" in result.output


async def test_apply_adr_with_an_id_prefix_is_refused(h: Harness, slack: FakeSlack) -> None:
    await h.slash("ADR prod-a", command="/apply-adr")
    (reply,) = await slack.until("response_url")
    assert reply.args["text"].startswith("no ADR ADR (known: ")  # no server path (issue 22)
    assert slack.of("chat.postMessage") == []


@pytest.mark.parametrize("slug", ["../../x", "a/../../../x", "/etc/x", "UPPER", "a b", "a..b", ""])
def test_adr_new_refuses_a_slug_that_is_not_a_file_name_word(tmp_path: Path, slug: str) -> None:
    """Item 16: `--slug ../../x` wrote outside drafts/ (given the directory it passes through)."""
    adr_dir = tmp_path / "adr"
    (adr_dir / "drafts" / "ADR-20261129-01-a").mkdir(parents=True)
    before = {p for p in tmp_path.rglob("*")}
    result = CliRunner().invoke(
        cli,
        [
            "adr",
            "new",
            "--title",
            "x",
            "--slug",
            slug,
            "--date",
            "2026-11-29",
            "--adr-dir",
            str(adr_dir),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "--slug must be lowercase letters, digits and single hyphens" in result.output
    assert {p for p in tmp_path.rglob("*")} == before  # nothing written anywhere
    ok = CliRunner().invoke(
        cli, ["adr", "new", "--title", "x", "--slug", "prefix-caching-2", "--date", "2026-11-29",
              "--adr-dir", str(adr_dir)],
    )  # fmt: skip
    assert ok.exit_code == 0 and ok.output.startswith(str(adr_dir / "drafts" / "ADR-20261129-01-"))


def test_adr_show_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """Item 19: `ruleloop adr show ... | head -1` printed "unexpected failure" and logged a
    traceback (BrokenPipeError)."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    ruleloop = Path(sys.executable).parent / "ruleloop"  # the console script, as installed
    command = [str(ruleloop), "adr", "show", SEED, "--adr-dir", str(ROOT / "adr")]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # the reader is gone before the first line is written
        stderr = process.stderr.read().decode()
        process.wait(timeout=120)
    assert stderr == "", stderr
    assert process.returncode == 1  # as click (and most CLIs) exit on a closed pipe
    assert not (tmp_path / "state" / "ruleloop" / "errors.log").exists()


SHIPPED = ROOT / "bot" / "shipped"


def test_the_shipped_defaults_are_the_repositorys_runbooks_and_seed_adr() -> None:
    """The package carries copies (a wheel cannot reach runbooks/ and adr/); they stay equal."""
    for name in ("runbooks", "adr"):
        ours = sorted(p.name for p in (ROOT / name).glob("*.*"))
        shipped = sorted(p.name for p in (SHIPPED / name).glob("*.*"))
        assert shipped == ours, f"bot/shipped/{name} differs from {name}/: copy it again"
        for file in ours:
            assert (SHIPPED / name / file).read_bytes() == (ROOT / name / file).read_bytes(), file


def test_serve_outside_the_checkout_uses_the_shipped_runbooks_and_seed_adr(
    tmp_path: Path,
) -> None:
    """Item 21: started elsewhere, serve stopped with "runbook directory runbooks does not
    exist"; with no [paths] set it now uses the packaged runbooks and imports the packaged seed
    ADR in place (nothing is copied: the store holds ADRs, the directory is only read)."""
    import signal
    import time

    import httpx

    from bot.engine.process import free_port

    port = free_port()
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RULELOOP_", "SLACK_"))}
    ruleloop = Path(sys.executable).parent / "ruleloop"
    state = tmp_path / "state"
    command = [str(ruleloop), "serve", "--port", str(port), "--state-dir", str(state)]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir
    ) as process:
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None, process.communicate()[0]
                assert time.monotonic() < deadline, "serve did not start"
                time.sleep(0.3)
        finally:
            process.send_signal(signal.SIGTERM)
            out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    assert not (state / "adr").exists()  # read in place, not copied
    from bot.kernel.store.adrs import listed
    from bot.kernel.store.db import Database

    db = Database(f"sqlite:///{state / 'ruleloop.db'}")
    with db.transaction() as session:
        imported = sorted(row.name for row in listed(session))
    db.dispose()
    assert imported == sorted(p.name for p in (ROOT / "adr").glob("ADR-*.md"))
    assert list(workdir.iterdir()) == []  # nothing written where it was started


def test_a_state_dir_adr_written_by_an_earlier_version_is_still_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.kernel.config import Settings
    from bot.kernel.runtime.defaults import SEED_ADRS, with_defaults

    elsewhere = Settings.model_validate({})
    monkeypatch.chdir(tmp_path)  # no adr/ here
    assert with_defaults(elsewhere, state_dir=tmp_path / "state").paths.adr == SEED_ADRS
    (tmp_path / "state" / "adr" / "drafts").mkdir(parents=True)  # an earlier version's store
    earlier = with_defaults(elsewhere, state_dir=tmp_path / "state")
    assert earlier.paths.adr == tmp_path / "state" / "adr"
    configured = Settings.model_validate({"paths": {"adr": str(tmp_path / "mine")}})
    assert with_defaults(configured, state_dir=tmp_path / "state").paths.adr == tmp_path / "mine"
