"""Pictures for the docs: the Slack thread `ruleloop demo` posts, and the demo's incident page.

Runs the demo's scenario on the local engine (real vLLM on the CPU) with Slack pointed at the
test suite's fake Web API, which records every message the bot posts; renders the recorded
Block Kit as a simple HTML imitation of a Slack thread; serves the demo's incident page from
its store; and screenshots both with Debian's chromium driven by Playwright. The recorded
messages are kept in the workspace (slack.json), so the pictures can be made again without
running the demo (--workspace).

    flock /tmp/ruleloop-engine.lock .venv/bin/python bench/doc_pictures.py
    .venv/bin/python bench/doc_pictures.py --workspace ~/.local/state/ruleloop/demo-...

Needs chromium, and fonts for the emoji and the seed ADR's Chinese headings
(fonts-noto-color-emoji, fonts-wqy-zenhei). Writes docs/img/{slack-thread,incident-page,
incident-page-phone}.png and docs/img/pictures.json: each picture's sha256 and the text it
shows, the incident's four numbers as the store holds them, and the sha256 of every module that
renders what the pictures show. tests/test_doc_pictures.py fails when those modules change or
when a picture's numbers are not what the product prints from its source: `make pictures`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import html
import json
import platform
import re
import socket
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the fake Slack lives in tests/

import uvicorn  # noqa: E402
from playwright.async_api import async_playwright  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from bot.app.demo import scenario  # noqa: E402
from bot.app.server import create_bot  # noqa: E402
from bot.engine.process import EngineManager, default_state_dir, free_port  # noqa: E402
from bot.kernel.config import Settings, WebSettings  # noqa: E402
from bot.surfaces.web.links import page_links  # noqa: E402
from tests.fakes.slack_api import BOT_TOKEN, SIGNING_SECRET, FakeSlack  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
SECRET = "doc-pictures-link-secret-0123456789abcdef"
PUBLIC_URL = "https://ruleloop.example.com"
EMOJI = {
    "rotating_light": "🚨", "white_check_mark": "✅", "x": "❌", "red_circle": "🔴",
    "large_orange_circle": "🟠", "information_source": "ℹ️", "mag": "🔍", "warning": "⚠️",
    "hourglass_flowing_sand": "⏳", "arrows_counterclockwise": "🔄", "rewind": "⏪",
    "lock": "🔒", "memo": "📝", "heavy_check_mark": "✔️", "no_entry": "⛔",
    "heavy_minus_sign": "➖", "world_map": "🗺️",
}  # fmt: skip


# --- 1. the demo, with Slack recorded ---------------------------------------------------------
def with_slack(slack: FakeSlack) -> Any:
    """The demo's settings, with the fake Slack and the incident page's link settings."""
    original = scenario.settings

    def settings(ws: Path, **kwargs: Any) -> Settings:
        demo = original(ws, **kwargs)
        tokens = {"bot_token": SecretStr(BOT_TOKEN), "signing_secret": SecretStr(SIGNING_SECRET),
                  "api_url": slack.api_url}  # fmt: skip
        web = WebSettings(link_secret=SecretStr(SECRET), public_url=PUBLIC_URL)
        return demo.model_copy(update={"slack": demo.slack.model_copy(update=tokens), "web": web})

    return settings


def run_demo() -> Path:
    """The demo on a fresh engine; the workspace, with every Slack call in slack.json."""
    root = default_state_dir()
    ws = scenario.workspace(root, ROOT / "adr")
    manager = EngineManager(state_dir=root)
    port = free_port()
    print(f"workspace {ws}; engine on port {port} ...", file=sys.stderr)
    begun = time.monotonic()
    info = manager.start(port=port, flags=scenario.BAD_FLAGS)
    start_s = time.monotonic() - begun  # the demo sizes its waits from it
    with FakeSlack() as slack:
        scenario.settings = with_slack(slack)
        try:
            demo = scenario.Demo(ws=ws, base_url=info.base_url, manager=manager,
                                 say=lambda s: print(s, file=sys.stderr),
                                 transcript=sys.stderr, start_s=start_s)  # fmt: skip
            asyncio.run(demo.run())
        finally:
            manager.stop(port)
        calls = [
            {"method": c.method, "args": c.args, "body": base64.b64encode(c.body).decode()}
            for c in slack.calls
        ]
        final = [{"channel": k[0], **v} for k, v in slack.messages.items()]
    (ws / "slack.json").write_text(json.dumps({"calls": calls, "messages": final}, default=str))
    return ws


# --- 2. the recorded thread as HTML -----------------------------------------------------------
def mrkdwn(text: str) -> str:
    """Slack mrkdwn as HTML (its text is already entity-escaped, as Slack requires)."""
    out = re.sub(r"```(.*?)```", lambda m: f"<pre>{m[1]}</pre>", text, flags=re.S)
    out = re.sub(r"<(https?://[^|>]+)\|([^>]+)>", r'<a href="\1">\2</a>', out)
    out = re.sub(r"<@([UW][A-Z0-9]+)>", r'<span class="mention">@\1</span>', out)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"<b>\1</b>", out)
    out = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"<i>\1</i>", out)
    return emoji(out).replace("\n", "<br>")


def emoji(text: str) -> str:
    """':rotating_light:' as the emoji (Slack shows them in plain text too)."""
    return re.sub(r":([a-z0-9_+-]+):", lambda m: EMOJI.get(m[1], m[0]), text)


def text_object(obj: dict[str, Any]) -> str:
    if obj.get("type") == "mrkdwn":
        return mrkdwn(str(obj.get("text", "")))
    return emoji(html.escape(str(obj.get("text", ""))))


def button_html(button: dict[str, Any]) -> str:
    return f'<span class="button {button.get("style", "")}">{text_object(button["text"])}</span>'


def blocks_html(blocks: list[dict[str, Any]]) -> str:
    parts = []
    for block in blocks:
        kind = block.get("type")
        if kind == "header":
            parts.append(f'<div class="header">{text_object(block["text"])}</div>')
        elif kind == "section":
            text = block.get("text")
            inner = f'<div class="text">{text_object(text)}</div>' if text else ""
            if block.get("fields"):
                cells = "".join(f"<div>{text_object(f)}</div>" for f in block["fields"])
                inner += f'<div class="fields">{cells}</div>'
            button = block.get("accessory") or {}
            if button.get("type") == "button":
                inner += button_html(button)
            parts.append(f'<div class="section">{inner}</div>')
        elif kind == "context":
            cells = " ".join(text_object(e) for e in block.get("elements", []))
            parts.append(f'<div class="context">{cells}</div>')
        elif kind == "divider":
            parts.append("<hr>")
        elif kind == "actions":
            buttons = "".join(button_html(e) for e in block.get("elements", []))
            parts.append(f'<div class="actions">{buttons}</div>')
    return "".join(parts)


def thread_items(recorded: dict[str, Any], images: Path) -> tuple[str, list[str]]:
    """The incident's root message and its thread's replies and files, in the order they were
    posted (the drift act's later thread is another incident's)."""
    final = {(m["channel"], m["ts"]): m for m in recorded["messages"]}
    posted = iter(sorted(final.values(), key=lambda m: m["ts"]))
    root, root_ts, replies, pending_name = "", None, [], None
    for call in recorded["calls"]:
        method, args = call["method"], call["args"]
        if method == "chat.postMessage":
            message = next(posted)
            body = blocks_html(message.get("blocks") or []) or mrkdwn(str(message.get("text")))
            if root_ts is None and not message.get("thread_ts"):
                root, root_ts = body, message["ts"]
            elif message.get("thread_ts") == root_ts:
                replies.append(body)
        elif method == "files.getUploadURLExternal":
            pending_name = str(args.get("filename"))
        elif method == "upload" and pending_name:
            data = base64.b64decode(call["body"])
            if pending_name.endswith(".png"):
                (images / pending_name).write_bytes(data)
                replies.append(f'<img class="upload" src="{pending_name}">')
            else:
                lines = data.decode(errors="replace").count("\n")
                replies.append(f'<div class="file">📄 <b>{html.escape(pending_name)}</b>'
                               f'<span>Markdown · {lines} lines</span></div>')  # fmt: skip
            pending_name = None
    return root, replies


PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin: 0; font: 15px/1.46 "Liberation Sans", Arial, "WenQuanYi Zen Hei",
       "Noto Color Emoji", sans-serif; color: #1d1c1d; background: #fff; width: 760px; }}
.bar {{ padding: 12px 20px; border-bottom: 1px solid #ddd; font-weight: 700; }}
.bar span {{ color: #616061; font-weight: 400; margin-left: 8px; }}
.msg {{ display: flex; gap: 10px; padding: 10px 20px; }}
.avatar {{ width: 36px; height: 36px; border-radius: 6px; background: #2f6f4f; color: #fff;
          font-weight: 700; display: flex; align-items: center; justify-content: center;
          flex: none; }}
.who b {{ margin-right: 6px; }} .who .app {{ background: #eee; color: #616061; font-size: 11px;
          padding: 1px 4px; border-radius: 3px; }}
.body {{ flex: 1; min-width: 0; }}
.header {{ font-size: 18px; font-weight: 700; margin: 4px 0; }}
.section {{ margin: 4px 0; position: relative; }}
.section .button {{ float: right; margin-left: 12px; }}
.fields {{ display: grid; grid-template-columns: 1fr 1fr; gap: 6px 16px; margin-top: 6px; }}
.context {{ color: #616061; font-size: 12.5px; margin: 4px 0; }}
.actions {{ margin: 6px 0; }}
.button {{ display: inline-block; border: 1px solid #bbb; border-radius: 4px; padding: 2px 12px;
          font-weight: 700; font-size: 13px; margin-right: 6px; }}
.button.primary {{ background: #007a5a; color: #fff; border-color: #007a5a; }}
.button.danger {{ background: #e01e5a; color: #fff; border-color: #e01e5a; }}
hr {{ border: 0; border-top: 1px solid #eee; }}
code {{ font-family: "Liberation Mono", monospace; font-size: 12px; background: #f6f6f6;
       border: 1px solid #e6e6e6; border-radius: 3px; padding: 0 3px; color: #c01343; }}
pre {{ font-family: "Liberation Mono", monospace; font-size: 12px; background: #f8f8f8;
      border: 1px solid #e6e6e6; border-radius: 4px; padding: 8px; white-space: pre-wrap; }}
a {{ color: #1264a3; text-decoration: none; }} .mention {{ color: #1264a3; background: #e8f5fa; }}
.replies {{ margin: 4px 20px 4px 66px; padding: 6px 0; color: #616061; font-size: 13px;
           border-top: 1px solid #eee; }}
img.upload {{ max-width: 100%; border: 1px solid #ddd; border-radius: 6px; margin-top: 4px; }}
.file {{ border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; }}
.file span {{ display: block; color: #616061; font-size: 12px; }}
</style></head><body><div class="bar"># inference-incidents<span>a rendering of what
`ruleloop demo` posts (Block Kit, approximated)</span></div>{messages}</body></html>"""


def message(body: str) -> str:
    return (
        '<div class="msg"><div class="avatar">rl</div><div class="body"><div class="who">'
        '<b>ruleloop</b><span class="app">APP</span></div>' + body + "</div></div>"
    )


def slack_html(ws: Path, images: Path) -> Path:
    recorded = json.loads((ws / "slack.json").read_text())
    root, replies = thread_items(recorded, images)
    thread = f'<div class="replies">{len(replies)} replies</div>' + "".join(map(message, replies))
    out = images / "slack.html"
    out.write_text(PAGE.format(messages=message(root) + thread), encoding="utf-8")
    return out


# --- 3. screenshots ------------------------------------------------------------------------
# What the pictures show is rendered by these: when one changes, the pictures are remade.
RENDERERS = (
    "bot/kernel/chat", "bot/surfaces/slack/notifier.py", "bot/surfaces/slack/views.py",
    "bot/surfaces/slack/remediation_views.py",
    "bot/surfaces/web", "bot/templates", "bot/kernel/numbers/text.py", "bot/diagnosis/chart.py",
    "bot/diagnosis/replica_text.py", "bot/app/demo/ADR-20261129-02-cpu-demo-scheduler-step.md",
    "bench/doc_pictures.py",
)  # fmt: skip


def renderer_digests(root: Path = ROOT) -> dict[str, str]:
    """sha256 of every file that renders what the pictures show, by path from the repo root."""
    files: list[Path] = []
    for name in RENDERERS:
        path = root / name
        files.extend(sorted(f for f in path.rglob("*") if f.is_file() and "__pycache__" not in
                            f.parts) if path.is_dir() else [path])  # fmt: skip
    return {str(f.relative_to(root)): sha256(f) for f in files}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def incident_summary(ws: Path) -> dict[str, Any]:
    """The diagnosis summary of the demo's incident, as the store holds it."""
    with sqlite3.connect(ws / "ruleloop.db") as db:
        (summary,) = db.execute("SELECT summary FROM incidents ORDER BY id LIMIT 1").fetchone()
    keep = ("headline", "bounds", "spans", "normal", "normal_bounds", "normal_spans")
    return {k: v for k, v in json.loads(summary).items() if k in keep}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


async def pictures(ws: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    settings = with_slack_settings(ws)
    bot = create_bot(settings, state_dir=ws)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(bot.app, lifespan="off", log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    links = page_links(settings.web, clock=time.time)
    assert links is not None
    link = links.incident_url(1).replace(PUBLIC_URL, f"http://127.0.0.1:{port}")
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            # the top of the page: the incident, the four numbers, the chart, the findings
            page = await browser.new_page(viewport={"width": 1100, "height": 1250})
            await page.goto(link)
            await page.screenshot(path=str(out / "incident-page.png"))
            texts = {"incident-page.png": await page.inner_text("body")}
            phone = await browser.new_page(viewport={"width": 390, "height": 844},
                                           device_scale_factor=2)  # fmt: skip
            await phone.goto(link)
            await phone.screenshot(path=str(out / "incident-page-phone.png"))
            with tempfile.TemporaryDirectory() as tmp:
                thread = slack_html(ws, Path(tmp))
                slack = await browser.new_page(viewport={"width": 760, "height": 900})
                await slack.goto(thread.as_uri())
                await slack.screenshot(path=str(out / "slack-thread.png"), full_page=True)
                texts["slack-thread.png"] = await slack.inner_text("body")
            await browser.close()
        write_manifest(ws, out, texts)
    finally:
        server.should_exit = True
        await serving
        await bot.http.aclose()
        bot.db.dispose()


def write_manifest(ws: Path, out: Path, texts: dict[str, str]) -> None:
    """docs/img/pictures.json: what each picture is and what made it."""
    names = ("incident-page.png", "incident-page-phone.png", "slack-thread.png")
    manifest = {
        "made_on": cpu_name(),
        "pictures": {name: sha256(out / name) for name in names},
        "texts": texts,
        "summary": incident_summary(ws),
        "renderers": renderer_digests(),
    }
    (out / "pictures.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")


def with_slack_settings(ws: Path) -> Settings:
    """The settings the demo ran with (its engine is gone; the page reads only the store)."""
    with FakeSlack() as slack:  # only its address goes into the settings
        return with_slack(slack)(ws, base_url="http://127.0.0.1:1", state_dir=ws)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workspace", type=Path, help="a demo run this script made before")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    ws = args.workspace or run_demo()
    asyncio.run(pictures(ws, args.out))
    print(f"pictures in {args.out} (workspace {ws})")


if __name__ == "__main__":
    main()
