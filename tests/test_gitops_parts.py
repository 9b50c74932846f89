"""The parts of a GitOps change one by one, each against the real thing: the locator on real
YAML files (comments and quoting kept, only the changed values touched), the `git` CLI on a
bare repository (a push that is not a fast-forward is a conflict, never forced), landing a
commit, the forges' error answers, and publishing an accepted ADR as a pull request."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.change.actuators.yaml_flags import Locator, LocatorError
from bot.change.gitops.adr_publish import AdrPublisher, publish_accepted
from bot.change.gitops.errors import GitConflict, GitOpsError
from bot.change.gitops.forge import GitHub
from bot.change.gitops.git import GitRepo
from bot.change.gitops.landing import Landing, Proposal
from bot.change.gitops.secrets import scrub
from bot.kernel.config import AdrPublishSettings, ForgeSpec, GitLocatorSpec, GitRepoSpec
from tests.fakes.forge_api import FORGE_TOKEN, FakeForge
from tests.gitops_fleet import ARGS_PATH, EXAMPLE, MAIN_FILE, Fleet, git

PATCH = (EXAMPLE / MAIN_FILE).read_text()
VALUES = (EXAMPLE / "helm" / "values-prod.yaml").read_text()


def changed_lines(old: str, new: str) -> list[str]:
    """The diff's removed and added lines, as a reviewer sees them."""
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), n=0, lineterm="")
    return [ln for ln in diff if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


# --- the locator ------------------------------------------------------------------------------


def test_an_args_list_is_edited_in_place_with_comments_and_quotes_kept() -> None:
    locator = Locator(GitLocatorSpec(file=MAIN_FILE, args=ARGS_PATH))
    new = locator.write(PATCH, {"max-num-batched-tokens": 2048, "block-size": 32,
                                "enable-chunked-prefill": True})  # fmt: skip
    assert changed_lines(PATCH, new) == [
        '-            - "8192"',
        '+            - "2048"',
        "+            - --block-size",
        '+            - "32"',
        "+            - --enable-chunked-prefill",
    ]
    assert locator.read(new).flags == {"max-num-batched-tokens": 2048, "block-size": 32,
                                       "enable-chunked-prefill": True}  # fmt: skip
    # a flag turned off in the style it was written, on a flow-style list
    flow = 'args: ["--model", "/m", "--enable-chunked-prefill", "--max-num-seqs=256"]  # x\n'
    edited = Locator(GitLocatorSpec(file="f.yaml", args="args")).write(
        flow, {"enable-chunked-prefill": False, "max-num-seqs": 128}
    )
    # (the longer line pushes the comment out of its column: one space before it then)
    assert (
        edited
        == 'args: ["--model", "/m", "--no-enable-chunked-prefill", "--max-num-seqs=128"] # x\n'
    )


def test_helm_values_are_edited_in_place_keeping_their_types_and_comments() -> None:
    spec = GitLocatorSpec(file="values.yaml", flags={
        "max-num-batched-tokens": "vllm.maxNumBatchedTokens",
        "enable-chunked-prefill": "vllm.enableChunkedPrefill"})  # fmt: skip
    new = Locator(spec).write(VALUES, {"max-num-batched-tokens": 2048,
                                       "enable-chunked-prefill": True})  # fmt: skip
    assert changed_lines(VALUES, new) == [
        "-  maxNumBatchedTokens: 8192  # --max-num-batched-tokens",
        "-  enableChunkedPrefill: false  # --enable-chunked-prefill / --no-enable-chunked-prefill",
        "+  maxNumBatchedTokens: 2048  # --max-num-batched-tokens",
        # the comment stays in its column
        "+  enableChunkedPrefill: true   # --enable-chunked-prefill / --no-enable-chunked-prefill",
    ]
    with pytest.raises(LocatorError, match="has no path for --block-size: add `flags.block-size"):
        Locator(spec).write(VALUES, {"block-size": 32})


def test_a_json_6902_patch_and_a_multi_document_file_are_found() -> None:
    patch = ("- op: replace\n  path: /spec/template/spec/containers/0/args\n"
             "  value: [--model, /m, --max-num-seqs, '64']\n")  # fmt: skip
    loc = Locator(
        GitLocatorSpec(file="p.yaml", args="[path=/spec/template/spec/containers/0/args].value")
    )
    assert loc.read(patch).flags == {"max-num-seqs": 64}
    assert "'128'" in loc.write(patch, {"max-num-seqs": 128})
    docs = "---\nkind: ConfigMap\n---\nkind: Deployment\nargs:\n- --max-num-seqs\n- '8'\n"
    second = Locator(GitLocatorSpec(file="m.yaml", document=1, args="args"))
    assert second.read(docs).flags == {"max-num-seqs": 8}
    assert second.write(docs, {"max-num-seqs": 16}) == docs.replace("'8'", "'16'")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        (
            "spec.template.spec.containers[name=vlm].args",
            r"no item with name=vlm \(its names: vllm\)",
        ),
        (
            "spec.template.spec.pods",
            r"spec.template.spec has no key 'pods' \(its keys: containers\)",
        ),
        ("spec.template.spec.containers[3].args", r"has 1 items, the locator path .* wants item 3"),
        ("metadata.name", r"metadata.name is a str, not a list of arguments"),
    ],
)
def test_a_locator_that_does_not_find_the_args_says_where_it_stopped(path: str, why: str) -> None:
    with pytest.raises(LocatorError, match=why):
        Locator(GitLocatorSpec(file=MAIN_FILE, args=path)).read(PATCH)


def test_a_yaml_alias_bomb_is_refused_at_once_and_small_aliases_still_read() -> None:
    # 687 bytes of aliases of aliases took more than 60 s on the event loop (str() of nodes)
    import time

    lines = ['a0: &a0 ["--max-num-seqs", "8", "--x", "--x", "--x", "--x", "--x", "--x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    bomb = "\n".join([*lines, "args: *a11", ""])
    started = time.monotonic()
    for locator in (Locator(GitLocatorSpec(file="bomb.yaml", args="args")),
                    Locator(GitLocatorSpec(file="bomb.yaml", args="a0"))):  # fmt: skip
        with pytest.raises(LocatorError, match="aliases expand to more than 50,000 nodes"):
            locator.read(bomb)
        with pytest.raises(LocatorError, match="an alias bomb"):
            locator.write(bomb, {"max-num-seqs": 16})
    assert time.monotonic() - started < 5
    small = 'base: &base ["--max-num-seqs", "8"]\nvllm:\n  args: *base\n'
    found = Locator(GitLocatorSpec(file="f.yaml", args="vllm.args")).read(small)
    assert found.flags == {"max-num-seqs": 8}


def test_values_off_the_allowlist_or_out_of_range_are_never_written() -> None:
    locator = Locator(GitLocatorSpec(file=MAIN_FILE, args=ARGS_PATH))
    with pytest.raises(LocatorError, match="out of range"):
        locator.write(PATCH, {"block-size": 7})
    with pytest.raises(LocatorError, match="is not a tunable flag"):
        locator.write(PATCH, {"api-key": "sk-x"})
    with pytest.raises(LocatorError, match="is not valid YAML"):
        locator.read("args: [unclosed\n")


# --- git, landing, the forge ------------------------------------------------------------------


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return Fleet.create(tmp_path)


@pytest.fixture
def forge(fleet: Fleet) -> Iterator[FakeForge]:
    with FakeForge(fleet.bare) as fake:
        yield fake


def repo_spec(fleet: Fleet, tmp_path: Path, **settings: object) -> GitRepoSpec:
    return GitRepoSpec(repo_url=str(fleet.bare), direct_push=True, workdir=tmp_path / "work",
                       **settings)  # type: ignore[arg-type]  # fmt: skip


async def test_a_push_that_is_not_a_fast_forward_is_a_conflict_and_nothing_is_forced(
    fleet: Fleet, tmp_path: Path
) -> None:
    repo = GitRepo(repo_spec(fleet, tmp_path), key="t")
    base = await repo.sync()
    await repo.start("work", base)
    await repo.write("NOTES.md", "mine\n")
    await repo.commit("notes: mine")
    theirs = fleet.commit("NOTES.md", "theirs\n", "notes: theirs")
    with pytest.raises(GitConflict, match="refused as not a fast-forward"):
        await repo.push("HEAD", "main")
    assert fleet.head() == theirs  # theirs is kept: nothing was forced
    landing = Landing(repo, None, repo.spec)
    with pytest.raises(GitConflict):
        await landing.land(Proposal(branch="x", title="t", body="", message="m"))
    assert fleet.branches() == ["main"]


async def test_a_token_in_the_repository_url_is_never_shown(fleet: Fleet, tmp_path: Path) -> None:
    url = f"file://x-access-token:ghp_in-url-secret@localhost{fleet.bare}"
    repo = GitRepo(repo_spec(fleet, tmp_path, branch="release").model_copy(
        update={"repo_url": url}), key="t")  # fmt: skip
    with pytest.raises(GitOpsError) as failed:
        await repo.sync()
    assert "has no branch 'release'" in str(failed.value)
    assert "ghp_in-url-secret" not in str(failed.value) and "file://***@localhost" in str(
        failed.value
    )
    assert (
        scrub("token ghp_abcdef and https://u:p@h/x", ["ghp_abcdef"])
        == "token *** and https://***@h/x"
    )


async def test_git_children_get_only_the_environment_git_needs(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # they inherited the bot's whole environment, SLACK_BOT_TOKEN included
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-not-for-git")
    monkeypatch.setenv("RULELOOP_DATABASE_URL", "postgresql://u:pw@db/x")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/agent.sock")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    repo = GitRepo(repo_spec(fleet, tmp_path), key="t")
    printed = await repo.run("-c", "alias.env-of-git=!env", "env-of-git", cwd=tmp_path)
    seen = dict(line.split("=", 1) for line in printed.splitlines() if "=" in line)
    assert "SLACK_BOT_TOKEN" not in seen and "RULELOOP_DATABASE_URL" not in seen
    assert "xoxb-not-for-git" not in printed and "GIT_DIR" not in seen
    assert seen["SSH_AUTH_SOCK"] == "/run/agent.sock" and seen["HTTPS_PROXY"] == "http://proxy:3128"
    assert seen["PATH"] and seen["GIT_TERMINAL_PROMPT"] == "0" and seen["LC_ALL"] == "C"
    assert await repo.sync()  # and git still clones with it


async def test_forge_refusals_say_what_the_token_needs_never_the_token(
    forge: FakeForge, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = tmp_path / "token"
    token.write_text("ghp_not-the-right-one")
    github = GitHub(ForgeSpec(kind="github", project="acme/fleet", api_url=forge.github_api,
                              token_file=token))  # fmt: skip
    with pytest.raises(GitOpsError) as refused:
        await github.find_open("ruleloop/x")
    assert "GitHub refused the token in" in str(refused.value)
    assert "Contents and Pull requests: Read and write" in str(refused.value)
    assert "ghp_not-the-right-one" not in str(refused.value) + caplog.text
    missing = GitHub(ForgeSpec(kind="github", project="acme/fleet", api_url=forge.github_api,
                               token_file=tmp_path / "absent"))  # fmt: skip
    with pytest.raises(GitOpsError, match="cannot read the github token from .*absent"):
        await missing.find_open("ruleloop/x")
    with pytest.raises(GitOpsError, match="is not owner/repo"):
        GitHub(ForgeSpec(kind="github", project="fleet", token_file=token))
    token.write_text(FORGE_TOKEN)
    wrong = GitHub(ForgeSpec(kind="github", project="acme/other", api_url=forge.github_api,
                             token_file=token))  # fmt: skip
    with pytest.raises(GitOpsError, match="does not know acme/other"):
        await wrong.find_open("ruleloop/x")


async def test_a_token_the_forge_or_a_proxy_echoes_is_scrubbed_from_every_message(
    tmp_path: Path,
) -> None:
    # the forge's words were shown as they came: an echoed token reached the message
    import httpx

    token = tmp_path / "token"
    token.write_text("ghp_echoed-0123456789abcdef")
    for code in (401, 403, 404, 422, 500, 502):
        for words in ("bad: {}", "x" * 290 + "{}"):  # also where the 300-character cut falls

            def echo(
                request: httpx.Request, code: int = code, words: str = words
            ) -> httpx.Response:
                said = words.format(request.headers["Authorization"])
                return httpx.Response(code, json={"message": said})

            http = httpx.AsyncClient(transport=httpx.MockTransport(echo))
            github = GitHub(ForgeSpec(kind="github", project="acme/fleet", token_file=token),
                            http=http)  # fmt: skip
            with pytest.raises(GitOpsError) as refused:
                await github.find_open("ruleloop/x")
            shown = str(refused.value)
            assert "ghp_" not in shown and "0123456789" not in shown, shown


async def test_a_token_is_never_sent_over_plain_http_to_another_host(
    fleet: Fleet, tmp_path: Path
) -> None:
    import httpx

    token = tmp_path / "token"
    token.write_text(FORGE_TOKEN)
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json=[])

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    spec = ForgeSpec(kind="github", project="acme/fleet", token_file=token,
                     api_url="http://forge.example.com/api/v3")  # fmt: skip
    with pytest.raises(GitOpsError, match="refusing to send the github token over plain http to "
                       "forge.example.com: use an https:// URL"):  # fmt: skip
        await GitHub(spec, http=http).find_open("ruleloop/x")
    assert seen == []
    local = spec.model_copy(update={"api_url": "http://127.0.0.1:9/api/v3"})
    assert await GitHub(local, http=http).find_open("ruleloop/x") is None  # this host: allowed
    plain = repo_spec(fleet, tmp_path, forge=spec).model_copy(
        update={"repo_url": "http://git.example.com/acme/fleet.git"})  # fmt: skip
    with pytest.raises(GitOpsError, match="over plain http to git.example.com"):
        await GitRepo(plain, key="t").sync()


# --- accepted ADRs to git ----------------------------------------------------------------------


@dataclass
class Record:
    adr_id: str
    name: str
    text: str
    draft: bool = False


ADR_TEXT = "---\nid: ADR-20261201-01\ntitle: Prefix caching for agent prompts\nstatus: accepted\n---\n# x\n"


async def test_an_accepted_adr_becomes_one_pull_request_that_removes_its_draft(
    fleet: Fleet, forge: FakeForge, tmp_path: Path
) -> None:
    fleet.commit("adr/drafts/ADR-20261201-01-prefix.md", "draft\n", "adr: the draft")
    token = tmp_path / "token"
    token.write_text(FORGE_TOKEN)
    spec = AdrPublishSettings(repo_url=str(fleet.bare), workdir=tmp_path / "work",
                              forge=ForgeSpec(kind="github", project="acme/fleet",
                                              api_url=forge.github_api, token_file=token))  # fmt: skip
    record = Record("ADR-20261201-01", "ADR-20261201-01-prefix-caching.md", ADR_TEXT)
    published = await AdrPublisher(spec).publish(record, reviewer="<@U034LEAD>")
    assert published.pull_request == "https://github.com/acme/fleet/pull/1"
    (pull,) = forge.pulls.values()
    assert pull.title == "ADR-20261201-01: Prefix caching for agent prompts"
    assert "<@U034LEAD>" in pull.body and pull.state == "open"  # people merge it
    branch = "ruleloop/adr/ADR-20261201-01"
    assert (
        git("show", f"{branch}:adr/ADR-20261201-01-prefix-caching.md", cwd=fleet.bare) == ADR_TEXT
    )
    files = git("ls-tree", "-r", "--name-only", branch, "--", "adr", cwd=fleet.bare).split()
    assert files == ["adr/ADR-20261201-01-prefix-caching.md"]  # the draft is gone
    message = git("log", "-1", "--format=%B", branch, cwd=fleet.bare)
    assert "Ruleloop-Adr: ADR-20261201-01" in message
    # accepting twice (a retry) opens nothing new
    again = await AdrPublisher(spec).publish(record, reviewer="<@U034LEAD>")
    assert again.pull_request == published.pull_request and len(forge.pulls) == 1


async def test_adr_publishing_by_direct_push_and_what_it_refuses(
    fleet: Fleet, tmp_path: Path
) -> None:
    spec = AdrPublishSettings(repo_url=str(fleet.bare), direct_push=True, directory="decisions",
                              workdir=tmp_path / "work")  # fmt: skip
    record = Record("ADR-20261201-01", "ADR-20261201-01-prefix-caching.md", ADR_TEXT)
    published = await AdrPublisher(spec).publish(record, reviewer="U1")
    assert published.commit == fleet.head()
    assert fleet.read("decisions/ADR-20261201-01-prefix-caching.md") == ADR_TEXT
    nothing = await AdrPublisher(spec).publish(record, reviewer="U1")
    assert "already on main" in nothing.note and fleet.head() == published.commit
    with pytest.raises(GitOpsError, match="still a draft"):
        await AdrPublisher(spec).publish(Record(record.adr_id, record.name, ADR_TEXT, True),
                                         reviewer="U1")  # fmt: skip
    with pytest.raises(GitOpsError, match="is not a file name of that ADR"):
        await AdrPublisher(spec).publish(Record(record.adr_id, "../../etc/x.md", ADR_TEXT),
                                         reviewer="U1")  # fmt: skip


async def test_adr_publishing_never_follows_a_committed_symlink_out_of_the_clone(
    fleet: Fleet, tmp_path: Path
) -> None:
    # a committed `decisions -> /somewhere` link had the ADR written outside the clone
    outside = tmp_path / "outside"
    outside.mkdir()
    git("pull", "-q", "--ff-only", "origin", "main", cwd=fleet.person)
    (fleet.person / "decisions").symlink_to(outside)
    (fleet.person / "hooks").symlink_to(".git/hooks")
    git("add", "decisions", "hooks", cwd=fleet.person)
    git("commit", "-q", "-m", "links", cwd=fleet.person)
    git("push", "-q", "origin", "main", cwd=fleet.person)
    before = fleet.head()
    record = Record("ADR-20261201-01", "ADR-20261201-01-prefix-caching.md", ADR_TEXT)
    for directory in ("decisions", "hooks"):
        spec = AdrPublishSettings(repo_url=str(fleet.bare), direct_push=True,
                                  directory=directory, workdir=tmp_path / "work")  # fmt: skip
        with pytest.raises(GitOpsError, match="refusing to write .*: in the repository it leads"):
            await AdrPublisher(spec).publish(record, reviewer="U1")
    assert list(outside.iterdir()) == [] and fleet.head() == before
    assert not list((tmp_path / "work").rglob("hooks/ADR-*"))


async def test_the_review_flows_one_call_says_where_the_adr_went_and_never_raises(
    fleet: Fleet, forge: FakeForge, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(FORGE_TOKEN)
    record = Record("ADR-20261201-01", "ADR-20261201-01-prefix-caching.md", ADR_TEXT)
    rows = {record.adr_id: record}
    assert await publish_accepted(None, rows.get, record.adr_id, reviewer="U1") == ""

    def spec(api_url: str) -> AdrPublishSettings:
        return AdrPublishSettings(repo_url=str(fleet.bare), workdir=tmp_path / "work",
                                  forge=ForgeSpec(kind="github", project="acme/fleet",
                                                  api_url=api_url, token_file=token))  # fmt: skip

    note = await publish_accepted(spec(forge.github_api), rows.get, record.adr_id, reviewer="U1")
    assert (
        note
        == " Pull request for adr/ADR-20261201-01-prefix-caching.md: https://github.com/acme/fleet/pull/1"
    )
    down = await publish_accepted(spec("http://127.0.0.1:9"), rows.get, "ADR-20261201-01",
                                  reviewer="U1")  # fmt: skip
    assert down.startswith(
        " It could not be proposed to main of the team's repository: cannot reach GitHub"
    )
    assert await publish_accepted(spec(forge.github_api), rows.get, "ADR-20991231-09",
                                  reviewer="U1") == " ADR-20991231-09 is not in the store: nothing was published."  # fmt: skip
