"""The chat page's richer features, through their data-testid hooks: Markdown, actions, agents, search, outbox, a11y."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, expect

from .conftest import login
from .server import GatewayServer

pytestmark = pytest.mark.browser

AXE_VERSION = "4.14.1"


def messages(page: Page, role: str | None = None, state: str | None = None) -> Locator:
    selector = '[data-testid="message"]'
    if role:
        selector += f'[data-role="{role}"]'
    if state:
        selector += f'[data-state="{state}"]'
    return page.locator(selector)


def rows(page: Page) -> Locator:
    """Message rows: the bubble plus its run details and actions."""
    return page.locator(".msg-row")


def send(page: Page, text: str) -> None:
    composer = page.get_by_test_id("composer")
    composer.fill(text)
    composer.press("Enter")


def clipboard(page: Page) -> str:
    return str(page.evaluate("navigator.clipboard.readText()"))


def with_clipboard(page: Page) -> Page:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    return page


MARKDOWN = (
    "[[verbatim]] # Plan\n\n"
    "Some *emphasis* and `inline code`, and a [link](https://example.com/docs).\n\n"
    "| name | size |\n|---|---:|\n| alpha | 1 |\n| beta | 22 |\n\n"
    "```python\ndef add(a, b):\n    return a + b  # sum\n```\n\n"
    "- one\n- two\n"
)

HOSTILE = (
    '<img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> '
    "[click me](javascript:window.__pwned=3) "
    '<a href="javascript:window.__pwned=4" onclick="window.__pwned=5">raw link</a> '
    '<svg onload="window.__pwned=6"></svg>'
)


# --- Markdown -------------------------------------------------------------------------------------------


def test_reply_renders_markdown_tables_and_highlighted_code_with_copy(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = with_clipboard(open_page(gateway_server, new_user()))
    send(page, MARKDOWN)
    reply = messages(page, "assistant", "final")
    md = reply.get_by_test_id("markdown")
    expect(md.locator("h1")).to_have_text("Plan")
    expect(md.locator("em")).to_have_text("emphasis")
    expect(md.locator("table th")).to_have_text(["name", "size"])
    expect(md.locator("table td")).to_have_text(["alpha", "1", "beta", "22"])
    expect(md.locator("li")).to_have_text(["one", "two"])
    link = md.locator("a", has_text="link")
    expect(link).to_have_attribute("href", "https://example.com/docs")
    expect(link).to_have_attribute("rel", "noopener noreferrer")
    code = md.locator("pre code")
    expect(code).to_have_class(re.compile(r"\bhljs\b"))
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    expect(md.locator(".code-lang")).to_have_text("python")
    md.get_by_test_id("copy-code").click()
    expect(md.get_by_test_id("copy-code")).to_have_text("Copied")
    assert clipboard(page) == "def add(a, b):\n    return a + b  # sum"
    # User messages stay plain text with their line breaks.
    user = messages(page, "user")
    expect(user.locator("table, h1, pre")).to_have_count(0)
    assert "| name | size |\n|---|---:|" in user.locator(".msg-text").inner_text()


def test_streaming_keeps_finished_blocks_and_highlights_a_code_block_once_it_closes(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    tail = " ".join(f"w{i}" for i in range(60))
    send(page, f"[[verbatim]] [[tick:60]] First paragraph here.\n\n```js\nconst a = 1;\n```\n\n{tail}")
    streaming = messages(page, "assistant", "streaming").get_by_test_id("markdown")
    expect(streaming).to_contain_text("w3")
    # The paragraph and the closed code block are rendered and highlighted while the tail still streams.
    expect(streaming.locator("pre code.hljs .hljs-keyword")).to_have_text("const")
    page.evaluate(
        """() => {
          const md = document.querySelector('[data-state="streaming"] [data-testid="markdown"]');
          [...md.children].find((b) => b.textContent.includes("First paragraph")).dataset.mark = "kept";
          md.querySelector("pre").dataset.mark = "kept";
        }"""
    )
    expect(streaming).to_contain_text("w20")
    final = messages(page, "assistant", "final").get_by_test_id("markdown")
    expect(final).to_contain_text("w59", timeout=15_000)
    # The same nodes: completed blocks were never rendered again while the tail grew.
    expect(final.locator('.md-block[data-mark="kept"]')).to_have_text("First paragraph here.")
    expect(final.locator('pre[data-mark="kept"]')).to_have_count(1)


@pytest.mark.parametrize("verbatim", [True, False], ids=["verbatim", "folded"])
def test_hostile_html_in_messages_and_replies_never_runs(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str], verbatim: bool
) -> None:
    page = open_page(gateway_server, new_user())
    page.evaluate("window.__pwned = 0")
    send(page, ("[[verbatim]] " if verbatim else "") + HOSTILE)
    reply = messages(page, "assistant", "final")
    expect(reply).to_contain_text("click me")
    user = messages(page, "user")
    # The user's message is text, exactly as typed.
    expect(user.locator(".msg-text")).to_contain_text('<img src=x onerror="window.__pwned=1">')
    # The reply shows the markup as text; none of it became an element.
    md = reply.get_by_test_id("markdown")
    expect(md).to_contain_text("<script>window.__pwned=2</script>")
    log = page.locator("#message-list")
    expect(log.locator("img, script, svg, iframe, [onerror], [onclick], [onload]")).to_have_count(0)
    assert page.evaluate("document.querySelectorAll('#message-list a[href^=\"javascript\" i]').length") == 0
    for anchor in md.locator("a").all():
        anchor.dispatch_event("click")
    page.wait_for_timeout(200)
    assert page.evaluate("window.__pwned") == 0


# --- agents -------------------------------------------------------------------------------------------


def test_new_chat_with_a_chosen_agent_shows_agent_and_model(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    picker = page.get_by_test_id("agent-picker")
    expect(picker).to_be_visible()
    expect(picker.locator("option")).to_have_text(["main (scripted)", "Helper (scripted-helper)"])
    expect(picker).to_have_value("main")
    expect(page.get_by_test_id("session-agent")).to_have_text("Agent: main · model scripted")
    picker.select_option("helper")
    page.get_by_test_id("new-session").click()
    current = page.locator('[data-testid="session-row"][data-current="true"]')
    expect(current).to_have_attribute("data-key", re.compile(r"^agent:helper:s-"))
    expect(page.get_by_test_id("session-agent")).to_have_text("Agent: Helper · model scripted-helper")
    send(page, "hi helper")
    expect(messages(page, "assistant", "final")).to_have_text("echo: hi helper")


# --- message actions ----------------------------------------------------------------------------------------


def test_copy_and_regenerate_and_edit_as_branches(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = with_clipboard(open_page(gateway_server, new_user()))
    send(page, "first question")
    expect(messages(page, "assistant", "final")).to_have_text("echo: first question")
    user_row = rows(page).filter(has=messages(page, "user"))
    reply_row = rows(page).filter(has=messages(page, "assistant"))
    reply_row.get_by_test_id("copy").click()
    assert clipboard(page) == "echo: first question"
    user_row.get_by_test_id("copy").click()
    assert clipboard(page) == "first question"

    # Regenerate: a new reply to the same message, as a sibling branch; the first stays, one click away.
    regenerate = page.get_by_test_id("regenerate").locator("visible=true")
    expect(regenerate).to_have_count(1)
    expect(page.get_by_test_id("retry").locator("visible=true")).to_have_count(0)
    first_run = messages(page, "assistant").first.get_attribute("data-run-id")
    regenerate.click()
    position = reply_row.get_by_test_id("branch-position")
    expect(position).to_have_text("2/2")
    expect(messages(page, "user")).to_have_text(["first question"])
    expect(messages(page, "assistant", "final")).to_have_count(1)
    second_run = messages(page, "assistant").first.get_attribute("data-run-id")
    assert second_run and second_run != first_run
    rows(page).filter(has=messages(page, "assistant")).get_by_test_id("branch-prev").click()
    expect(rows(page).filter(has=messages(page, "assistant")).get_by_test_id("branch-position")).to_have_text("1/2")
    expect(messages(page, "assistant")).to_have_attribute("data-run-id", first_run or "")

    # While a run is active there is nothing to regenerate (the last reply is the one streaming).
    send(page, "long one [[words:60]] [[tick:80]]")
    expect(messages(page, "assistant", "streaming")).to_contain_text("word2")
    expect(page.get_by_test_id("regenerate").locator("visible=true")).to_have_count(0)
    page.get_by_test_id("stop").click()
    expect(messages(page, "assistant", "aborted")).to_have_count(1)
    expect(page.get_by_test_id("regenerate").locator("visible=true")).to_be_enabled()

    # Edit: the last user message, changed in place, goes as a sibling of it; the model gets the new text.
    edit = page.get_by_test_id("edit").locator("visible=true")
    expect(edit).to_have_count(1)
    edit.click()
    box = page.get_by_test_id("edit-box").locator("visible=true")
    expect(box).to_have_value("long one [[words:60]] [[tick:80]]")
    box.fill("short one")
    page.get_by_test_id("edit-send").locator("visible=true").click()
    expect(messages(page, "assistant", "final").last).to_have_text("echo: short one")
    expect(messages(page, "user")).to_have_text(["first question", "short one"])
    edited = rows(page).filter(has=messages(page, "user")).last
    expect(edited.get_by_test_id("branch-position")).to_have_text("2/2")
    edited.get_by_test_id("branch-prev").click()
    expect(messages(page, "user")).to_have_text(["first question", "long one [[words:60]] [[tick:80]]"])
    expect(messages(page, "assistant", "aborted")).to_have_count(1)
    # and the page after a reload shows the same branch
    page.reload()
    expect(messages(page, "user")).to_have_text(["first question", "long one [[words:60]] [[tick:80]]"])
    expect(rows(page).filter(has=messages(page, "user")).last.get_by_test_id("branch-position")).to_have_text("1/2")


def test_failed_reply_shows_kind_and_message_and_regenerates(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    send(page, "break it [[fail:dispatch]]")
    failed = messages(page, "assistant", "error")
    expect(failed).to_contain_text("Error (dispatch): scripted agent failed to dispatch")
    page.get_by_test_id("regenerate").locator("visible=true").click()
    expect(rows(page).filter(has=messages(page, "user")).get_by_test_id("branch-position")).to_have_text("2/2")
    expect(messages(page, "assistant", "error")).to_have_count(1)
    expect(messages(page, "user")).to_have_text(["break it [[fail:dispatch]]"])


def test_run_details_show_duration_and_usage_after_reload(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    send(page, "three little words")
    expect(messages(page, "assistant", "final")).to_have_text("echo: three little words")
    meta = page.get_by_test_id("run-meta")
    pattern = re.compile(r"^\d+(\.\d)? (ms|s) · 3 in / 4 out tokens$")
    expect(meta).to_have_text(pattern)
    page.reload()
    expect(page.get_by_test_id("run-meta")).to_have_text(pattern)


# --- sessions: search and paging ----------------------------------------------------------------------------


def make_sessions(server: GatewayServer, username: str, needles: int, bulk: int) -> None:
    """Sessions straight in the database: the needles first (oldest), then the bulk.

    They are dated an hour back (order kept): a server's delivery repair announces rows changed
    in the last seconds to their owner's open pages, which would put rows beyond the first page
    on the page before anyone scrolls or searches."""
    code = (
        "from datetime import timedelta\n"
        "from django.db.models import F\n"
        "from django.contrib.auth import get_user_model\n"
        "from sessions_app.models import ChatSession\n"
        "from sessions_app.lifecycle import sessions\n"
        f"u = get_user_model().objects.get(username={username!r})\n"
        f"for i in range({needles}):\n"
        "    sessions.create_session(\n"
        "        owner_id=u.pk, key=f'agent:main:needle-{i}', label=f'Needle {i}', agent_id='main')\n"
        f"for i in range({bulk}):\n"
        "    sessions.create_session(owner_id=u.pk, key=f'agent:main:bulk-{i:03d}', label='', agent_id='main')\n"
        "ChatSession.objects.filter(owner=u).update(updated_at=F('updated_at') - timedelta(hours=1))\n"
    )
    server._manage("shell", "-c", code)


def test_sidebar_search_is_server_side_and_pages_beyond_200(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    user = new_user()
    make_sessions(gateway_server, user, needles=3, bulk=205)
    page = open_page(gateway_server, user)
    session_rows = page.get_by_test_id("session-row")
    expect(session_rows).to_have_count(201)  # the first page of 200, plus the main session's placeholder
    expect(page.locator('[data-testid="session-row"][data-key^="agent:main:needle-"]')).to_have_count(0)

    # Scrolling to the end of the list loads the next page.
    page.get_by_test_id("session-list").evaluate("el => { el.scrollTop = el.scrollHeight; }")
    expect(session_rows).to_have_count(209)
    expect(page.get_by_test_id("load-more-sessions")).to_be_hidden()

    page.reload()
    # the first page at least (a browser that restores the list's scroll position loads the next one too)
    expect(session_rows.nth(200)).to_be_attached()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online", timeout=10_000)
    search = page.get_by_test_id("session-search")
    search.fill("NEEDLE")  # by label, case-insensitively, found on the server beyond the first page
    expect(session_rows).to_have_count(3)
    expect(session_rows.first).to_have_attribute("data-key", re.compile(r"^agent:main:needle-"))
    search.fill("bulk-20")  # by key
    expect(session_rows).to_have_count(5)
    search.fill("")
    # Back to the whole list: the first page again, with the rows the page already knows.
    expect(page.locator('[data-testid="session-row"][data-key="agent:main:bulk-100"]')).to_be_visible()
    expect(session_rows.nth(200)).to_be_attached()


# --- offline outbox and drafts ---------------------------------------------------------------------------


def test_message_sent_offline_and_draft_survive_a_reload(own_server: GatewayServer, open_page: Any) -> None:
    page = open_page(own_server, "user1")
    status = page.get_by_test_id("connection-status")
    own_server.stop()
    expect(status).to_have_attribute("data-state", re.compile("offline|connecting"))
    send(page, "written on the train")
    waiting = messages(page, "user", "sending")
    expect(waiting).to_have_text(re.compile("^written on the train"))
    run_id = waiting.get_attribute("data-run-id")
    page.get_by_test_id("composer").fill("half a thought")
    stored = json.loads(page.evaluate("localStorage.getItem('agentgate:user1:outbox')"))
    assert stored == [{"key": "agent:main:main", "runId": run_id, "text": "written on the train"}]
    page.close()

    own_server.start()
    again = open_page(own_server, "user1")
    expect(again.get_by_test_id("composer")).to_have_value("half a thought")
    expect(messages(again, "assistant", "final")).to_have_text("echo: written on the train", timeout=15_000)
    expect(messages(again, "user")).to_have_count(1)
    expect(messages(again, "user")).to_have_attribute("data-run-id", run_id or "")
    again.wait_for_function("localStorage.getItem('agentgate:user1:outbox') === null")
    again.reload()
    expect(messages(again, "user")).to_have_count(1)


# --- accessibility ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def axe_source() -> str:
    """axe-core from the npm registry (pinned), cached outside the project; only tests use it."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed; axe-core cannot be fetched")
    cache = Path(tempfile.gettempdir()) / f"agentgate-axe-core-{AXE_VERSION}"
    script = cache / "node_modules" / "axe-core" / "axe.min.js"
    if not script.exists():
        cache.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--prefix",
                str(cache),
                f"axe-core@{AXE_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0 or not script.exists():
            pytest.skip(f"could not install axe-core@{AXE_VERSION}: {result.stderr[-500:]}")
    return script.read_text(encoding="utf-8")


def serious_violations(page: Page, axe: str) -> list[str]:
    # evaluated, not added as a <script>: the page's Content-Security-Policy forbids inline scripts
    page.evaluate(axe)
    results = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:5]}"
        for v in results["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_no_serious_violations(
    gateway_server: GatewayServer, chromium: Any, new_user: Callable[[], str], axe_source: str, scheme: str
) -> None:
    context = chromium.new_context(viewport={"width": 1280, "height": 800}, color_scheme=scheme)
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        page.goto(f"{gateway_server.base_url}/login/")
        expect(page.get_by_test_id("login-username")).to_be_visible()
        assert serious_violations(page, axe_source) == []

        login(page, gateway_server.base_url, new_user())
        send(page, MARKDOWN)
        expect(messages(page, "assistant", "final").locator("pre code.hljs")).to_have_count(1)
        send(page, "no luck [[fail:dispatch]]")
        expect(messages(page, "assistant", "error")).to_have_count(1)
        send(page, "slow [[words:100]] [[tick:200]]")
        expect(messages(page, "assistant", "streaming")).to_contain_text("word1")
        send(page, "waiting behind it")
        expect(messages(page, "user", "queued")).to_have_count(1)
        assert serious_violations(page, axe_source) == []
        page.get_by_test_id("stop").click()

        page.goto(f"{gateway_server.base_url}/api/keys")
        page.get_by_test_id("key-name").fill("axe")
        page.get_by_test_id("create-key").click()
        expect(page.get_by_test_id("new-key")).to_be_visible()
        assert serious_violations(page, axe_source) == []
        page.get_by_test_id("revoke-key").click()
        expect(page.get_by_test_id("dialog")).to_be_visible()
        assert serious_violations(page, axe_source) == []
    finally:
        context.close()
