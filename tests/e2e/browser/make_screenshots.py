"""Make docs/screenshots/chat-*.png: the chat page at desktop and phone width, light and dark.

Run: `.venv/bin/python -m tests.e2e.browser.make_screenshots` (needs /usr/bin/chromium).
It starts its own server on a temporary database, fills a few sessions through
the page itself (a failed one, a stopped one, one streaming with a queued
message) and takes the pictures. Not part of the test run.

`... make_screenshots tools` makes only docs/screenshots/chat-tools.png: a conversation with a tool
call that succeeded and one waiting for approval (the demo MCP server writes its notes to a
temporary folder).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from playwright.sync_api import expect, sync_playwright

from .conftest import AGENTS_ENV, login
from .server import CHROMIUM, CHROMIUM_ARGS, ROOT, GatewayServer

OUT = ROOT / "docs" / "screenshots"


def send(page: Any, text: str) -> None:
    page.get_by_test_id("composer").fill(text)
    page.get_by_test_id("composer").press("Enter")


def last_final(page: Any) -> Any:
    return page.locator('[data-testid="message"][data-role="assistant"][data-state="final"]').last


def new_session(page: Any, label: str) -> None:
    page.get_by_test_id("new-session").click()
    expect(page.locator('[data-testid="message"]')).to_have_count(0)
    page.get_by_test_id("rename-session").click()
    page.get_by_test_id("dialog-input").fill(label)
    page.get_by_test_id("dialog-confirm").click()
    expect(page.get_by_test_id("session-title")).to_have_text(label)


def fill_sessions(page: Any) -> None:
    new_session(page, "Deploy checklist")
    send(page, "Run the deploy checklist [[fail:dispatch]]")
    expect(page.locator('[data-testid="message"][data-state="error"]')).to_have_count(1)
    page.get_by_test_id("composer").fill("")

    new_session(page, "Research notes")
    send(page, "Collect sources on streaming protocols [[hang]]")
    page.get_by_test_id("stop").click()
    expect(page.locator('[data-testid="message"][data-state="aborted"]')).to_have_count(1)

    page.locator('[data-testid="session-row"][data-key="agent:main:main"]').click()
    send(page, "Hi! What can you do?")
    expect(last_final(page)).to_have_text("echo: Hi! What can you do?")
    send(
        page,
        "[[verbatim]] A short plan for the week:\n\n| day | task |\n|---|---|\n| Mon | review |\n| Tue | ship |\n\n"
        "```python\ndef ship(release: str) -> bool:\n    return deploy(release)  # on Tuesday\n```",
    )
    expect(last_final(page).locator("pre code.hljs")).to_have_count(1)
    send(page, "Now write the long version [[words:150]] [[tick:160]]")
    expect(page.locator('[data-testid="message"][data-state="streaming"]')).to_contain_text("word12")
    send(page, "And a summary for the team afterwards")
    expect(page.locator('[data-testid="message"][data-state="queued"]')).to_have_count(1)


def tools_screenshot(browser: Any, server: GatewayServer, username: str) -> None:
    """A succeeded tool call and a call waiting for approval, desktop width, light theme."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    page = context.new_page()
    login(page, server.base_url, username)
    new_session(page, "Home")
    send(page, 'How many minutes are in a week? [[tool:demo.calculate {"expression": "7 * 24 * 60"}]]')
    expect(last_final(page)).to_contain_text("= 10080", timeout=30_000)
    send(page, 'Remind me to call the plumber [[tool:demo.add_note {"text": "Call the plumber on Monday"}]]')
    prompt = page.locator('[data-testid="tool-approval"][data-state="pending"]')
    expect(prompt.get_by_test_id("approval-countdown")).to_have_text(re.compile(r"^\d+:\d\d left$"), timeout=30_000)
    expect(page.locator('[data-testid="session-row"][data-waiting="approval"]')).to_have_count(1)
    page.mouse.move(0, 0)
    page.screenshot(path=str(OUT / "chat-tools.png"))
    context.close()


def page_screenshots(browser: Any, server: GatewayServer, username: str) -> None:
    """The chat page at desktop and phone width, light and dark."""
    desktop = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    page = desktop.new_page()
    login(page, server.base_url, username)
    fill_sessions(page)
    page.mouse.move(0, 0)
    page.screenshot(path=str(OUT / "chat-desktop.png"))
    dark = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="dark")
    dark_page = dark.new_page()
    login(dark_page, server.base_url, username)
    expect(dark_page.locator('[data-testid="message"][data-state="streaming"]')).to_contain_text("word20")
    dark_page.screenshot(path=str(OUT / "chat-desktop-dark.png"))

    phone = browser.new_context(
        viewport={"width": 390, "height": 844},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
        color_scheme="light",
    )
    small = phone.new_page()
    login(small, server.base_url, username)
    expect(small.locator('[data-testid="message"][data-state="streaming"]')).to_contain_text("word30")
    small.screenshot(path=str(OUT / "chat-phone.png"))
    small.get_by_test_id("toggle-sidebar").click()
    small.wait_for_timeout(400)  # the slide-in transition
    small.screenshot(path=str(OUT / "chat-phone-sessions.png"))
    phone_dark = browser.new_context(
        viewport={"width": 390, "height": 844},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
        color_scheme="dark",
    )
    small_dark = phone_dark.new_page()
    login(small_dark, server.base_url, username)
    expect(small_dark.locator('[data-testid="message"][data-state="streaming"]')).to_contain_text("word40")
    small_dark.screenshot(path=str(OUT / "chat-phone-dark.png"))


def main(argv: list[str] | None = None) -> None:
    only_tools = (sys.argv[1:] if argv is None else argv) == ["tools"]
    OUT.mkdir(parents=True, exist_ok=True)
    server = GatewayServer(users=2, extra_env=AGENTS_ENV)
    server.env["AGENTGATE_NOTES_DIR"] = str(server.tmp / "notes")
    try:
        server.prepare()
        server.start()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            tools_screenshot(browser, server, "user2")
            if not only_tools:
                page_screenshots(browser, server, "user1")
            browser.close()
    finally:
        server.cleanup()
    names = (
        ("chat-tools.png",)
        if only_tools
        else (
            "chat-desktop.png",
            "chat-desktop-dark.png",
            "chat-phone.png",
            "chat-phone-sessions.png",
            "chat-phone-dark.png",
            "chat-tools.png",
        )
    )
    for name in names:
        path: Path = OUT / name
        print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
