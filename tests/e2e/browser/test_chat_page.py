"""The browser chat page against a real server, driven through its data-testid hooks."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, expect

from .server import GatewayServer

pytestmark = pytest.mark.browser

MAIN = "agent:main:main"


# --- helpers ------------------------------------------------------------------------------------


def messages(page: Page, role: str | None = None, state: str | None = None) -> Locator:
    selector = '[data-testid="message"]'
    if role:
        selector += f'[data-role="{role}"]'
    if state:
        selector += f'[data-state="{state}"]'
    return page.locator(selector)


def send(page: Page, text: str) -> None:
    composer = page.get_by_test_id("composer")
    composer.fill(text)
    composer.press("Enter")


def row(page: Page, key: str = MAIN) -> Locator:
    return page.locator(f'[data-testid="session-row"][data-key="{key}"]')


def words(n: int) -> str:
    return "echo: " + " ".join(f"word{i}" for i in range(1, n + 1))


# --- sign-in, static files ------------------------------------------------------------------------


def test_login_required_styled_form_and_logout(
    gateway_server: GatewayServer, chromium: Any, new_user: Callable[[], str]
) -> None:
    """`/` needs a login; the styled form rejects a bad password, signs in, and logout signs out."""
    base = gateway_server.base_url
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.goto(f"{base}/")
        assert re.search(r"/login/\?next=/$", page.url), page.url
        # Static files come from the ASGI app itself with DEBUG off (no proxy, no CDN).
        css = page.request.get(f"{base}/static/chat/app.css")
        assert css.status == 200 and "text/css" in css.headers["content-type"]
        for name in ("state.js", "client.js", "app.js"):
            js = page.request.get(f"{base}/static/chat/{name}")
            assert js.status == 200 and "javascript" in js.headers["content-type"], name
        background = page.evaluate("getComputedStyle(document.querySelector('.auth-card')).backgroundColor")
        assert background not in ("", "rgba(0, 0, 0, 0)"), "the sign-in form is styled"

        user = new_user()
        page.get_by_test_id("login-username").fill(user)
        page.get_by_test_id("login-password").fill("wrong-password")
        page.get_by_test_id("login-submit").click()
        expect(page.get_by_test_id("login-error")).to_be_visible()

        page.get_by_test_id("login-password").fill("browser-pass-1234")
        page.get_by_test_id("login-submit").click()
        expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
        assert page.evaluate('document.querySelectorAll(\'script[src^="http"], link[href^="http"]\').length') == 0

        page.get_by_test_id("logout").click()
        page.wait_for_url(re.compile(r".*/login/$"))
        page.goto(f"{base}/")
        assert "/login/" in page.url
    finally:
        context.close()


# --- sending ----------------------------------------------------------------------------------------


def test_send_shows_message_at_once_and_streams(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    send(page, "hello streaming world [[tick:250]]")
    user_msg = messages(page, "user").last
    expect(user_msg).to_have_text("hello streaming world [[tick:250]]")
    expect(user_msg).to_have_attribute("data-run-id", re.compile(r"^web-"))
    expect(page.get_by_test_id("composer")).to_have_value("")

    streaming = messages(page, "assistant", "streaming")
    expect(streaming).to_have_count(1)
    expect(page.get_by_test_id("stop")).to_be_visible()
    expect(streaming).to_contain_text("echo: hello")  # partial text while the run streams
    expect(row(page)).to_have_attribute("data-status", "running")

    expect(messages(page, "assistant", "final")).to_have_text("echo: hello streaming world")
    expect(page.get_by_test_id("stop")).to_be_hidden()
    expect(row(page)).to_have_attribute("data-status", "done")
    expect(messages(page, "user")).to_have_attribute("data-state", "final")


def test_shift_enter_adds_a_line(gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]) -> None:
    page = open_page(gateway_server, new_user())
    composer = page.get_by_test_id("composer")
    composer.type("line one")
    composer.press("Shift+Enter")
    composer.type("line two")
    expect(composer).to_have_value("line one\nline two")
    expect(messages(page)).to_have_count(0)
    page.get_by_test_id("send").click()
    expect(messages(page, "assistant", "final")).to_have_text("echo: line one line two")


def test_fail_setup_errors_at_once_and_restores_the_draft(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    """A terminal `error` ack: failure shown inline, draft back, no spinner, no Stop (A.1)."""
    page = open_page(gateway_server, new_user())
    text = "please work [[fail:setup]]"
    send(page, text)
    failed = messages(page, "user", "error")
    expect(failed).to_have_count(1)
    expect(failed).to_contain_text("setup")
    expect(page.get_by_test_id("composer")).to_have_value(text)
    expect(page.get_by_test_id("stop")).to_be_hidden()
    expect(messages(page, state="streaming")).to_have_count(0)
    expect(row(page)).to_have_attribute("data-status", "failed")
    time.sleep(0.5)  # and it stays that way: nothing is waiting for events that will never come
    expect(messages(page, state="streaming")).to_have_count(0)
    expect(page.get_by_test_id("stop")).to_be_hidden()
    expect(page.get_by_test_id("composer-status")).to_have_text("")


def test_fail_dispatch_shows_the_failure_and_the_row_turns_failed(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    send(page, "go [[fail:dispatch]]")
    failed = messages(page, "assistant", "error")
    expect(failed).to_contain_text("dispatch")
    expect(row(page)).to_have_attribute("data-status", "failed")
    expect(row(page)).to_have_attribute("title", re.compile("dispatch"))
    expect(row(page)).to_contain_text("dispatch")  # the detail line
    expect(page.get_by_test_id("stop")).to_be_hidden()
    expect(page.get_by_test_id("composer")).to_have_value("go [[fail:dispatch]]")
    # The failed session takes the next message.
    page.get_by_test_id("composer").fill("again")
    page.get_by_test_id("composer").press("Enter")
    expect(messages(page, "assistant", "final")).to_have_text("echo: again")
    expect(row(page)).to_have_attribute("data-status", "done")


def test_stop_ends_a_hanging_run(gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]) -> None:
    page = open_page(gateway_server, new_user())
    send(page, "think forever [[hang]]")
    stop = page.get_by_test_id("stop")
    expect(stop).to_be_visible()
    expect(row(page)).to_have_attribute("data-status", "running")
    stop.click()
    aborted = messages(page, "assistant", "aborted")
    expect(aborted).to_have_count(1)
    expect(aborted).to_contain_text("Stopped")
    expect(stop).to_be_hidden()
    expect(row(page)).to_have_attribute("data-status", "killed")
    expect(page.get_by_test_id("composer")).to_have_value("")  # a stopped run is not a failed send


def test_status_is_answered_once(gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]) -> None:
    """The answer comes as a `chat` final, then in the ack and in history: the page shows it once."""
    page = open_page(gateway_server, new_user())
    send(page, "hello")
    expect(messages(page, "assistant", "final")).to_have_text("echo: hello")
    send(page, "/status")
    answer = messages(page, "assistant").filter(has_text=f"Session {MAIN}")
    expect(answer).to_have_count(1)
    expect(messages(page, "user").filter(has_text="/status")).to_have_count(1)
    page.wait_for_timeout(1000)  # the history reload after the ack: still once
    expect(answer).to_have_count(1)
    expect(messages(page, "assistant")).to_have_count(2)


def test_a_command_whose_ack_was_lost_is_not_sent_again(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    sent: list[str] = []
    drop = {"armed": True}

    def route(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_page(message: str | bytes) -> None:
            frame = json.loads(message)
            server.send(message)
            if frame.get("method") != "chat.send":
                return
            sent.append(frame["params"]["message"])
            if frame["params"]["message"] == "/stop" and drop["armed"]:
                drop["armed"] = False
                ws.close()  # the server got /stop; the page's socket drops before the ack

        ws.on_message(from_page)

    page.route_web_socket(re.compile(r"/ws/gateway$"), route)
    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    send(page, "think forever [[hang]]")
    expect(page.get_by_test_id("stop")).to_be_visible()
    send(page, "/stop")
    unconfirmed = messages(page, "user", "error").filter(has_text="/stop")
    expect(unconfirmed).to_contain_text("not sent again")
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    expect(messages(page, "assistant", "aborted")).to_have_count(1)  # it did stop the run, as history shows
    send(page, "after")
    expect(messages(page, "assistant", "final")).to_have_text("echo: after")
    assert sent.count("/stop") == 1, sent
    expect(unconfirmed).to_have_count(1)


def test_second_message_while_busy_is_queued_then_runs(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    send(page, "first [[words:12]] [[tick:120]]")
    expect(messages(page, "assistant", "streaming")).to_have_count(1)
    send(page, "second")
    queued = messages(page, "user", "queued")
    expect(queued).to_have_text(re.compile(r"^second"))
    expect(queued).to_have_attribute("data-position", "1")
    expect(queued).to_contain_text("Queued")
    expect(page.get_by_test_id("composer-status")).to_contain_text("1 queued")
    expect(row(page)).to_have_attribute("data-queued", "1")

    finals = messages(page, "assistant", "final")
    expect(finals).to_have_count(2, timeout=15_000)
    expect(finals.nth(0)).to_have_text(words(12))
    expect(finals.nth(1)).to_have_text("echo: second")
    expect(messages(page, "user", "queued")).to_have_count(0)
    expect(page.get_by_test_id("stop")).to_be_hidden()
    expect(row(page)).to_have_attribute("data-queued", "0")


def test_two_pages_of_one_user_stay_in_step(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    user = new_user()
    a = open_page(gateway_server, user)
    b = open_page(gateway_server, user)
    send(a, "shared [[words:15]] [[tick:120]]")
    for page in (a, b):
        expect(messages(page, "assistant", "streaming")).to_have_count(1)
        expect(page.get_by_test_id("stop")).to_be_visible()
    # Page b did not send it, yet shows the user's message and the stream.
    expect(messages(b, "user")).to_have_text("shared [[words:15]] [[tick:120]]")
    expect(messages(b, "assistant", "streaming")).to_contain_text("word")
    for page in (a, b):
        expect(messages(page, "assistant", "final")).to_have_text(words(15), timeout=15_000)
        expect(page.get_by_test_id("stop")).to_be_hidden()
        expect(row(page)).to_have_attribute("data-status", "done")
    # And the other way round.
    send(b, "from b")
    for page in (a, b):
        expect(messages(page, "assistant", "final").last).to_have_text("echo: from b")
        expect(messages(page, "user")).to_have_count(2)


def test_reload_mid_stream_resumes_the_reply(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    send(page, "long one [[words:30]] [[tick:100]]")
    expect(messages(page, "assistant", "streaming")).to_contain_text("word3")
    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    streaming = messages(page, "assistant", "streaming")
    expect(streaming).to_have_count(1)
    expect(streaming).to_contain_text("word3")  # text so far came back from inFlightRun
    expect(page.get_by_test_id("stop")).to_be_visible()
    expect(messages(page, "assistant", "final")).to_have_text(words(30), timeout=15_000)
    expect(messages(page, "assistant")).to_have_count(1)
    expect(page.get_by_test_id("stop")).to_be_hidden()


def test_sessions_new_rename_reset_delete(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    send(page, "in main")
    expect(messages(page, "assistant", "final")).to_have_text("echo: in main")

    page.get_by_test_id("new-session").click()
    rows = page.get_by_test_id("session-row")
    expect(rows).to_have_count(2)
    current = page.locator('[data-testid="session-row"][data-current="true"]')
    new_key = current.get_attribute("data-key")
    assert new_key and new_key != MAIN
    expect(messages(page)).to_have_count(0)
    send(page, "in the new one")
    expect(messages(page, "assistant", "final")).to_have_text("echo: in the new one")

    page.get_by_test_id("rename-session").click()
    page.get_by_test_id("dialog-input").fill("Project notes")
    page.get_by_test_id("dialog-confirm").click()
    expect(row(page, new_key)).to_contain_text("Project notes")
    expect(page.get_by_test_id("session-title")).to_have_text("Project notes")

    page.get_by_test_id("reset-session").click()
    page.get_by_test_id("dialog-confirm").click()
    expect(messages(page)).to_have_count(0)

    # Back to main: its conversation is still there.
    row(page, MAIN).click()
    expect(messages(page, "assistant", "final")).to_have_text("echo: in main")
    row(page, new_key).click()

    page.get_by_test_id("delete-session").click()
    expect(page.get_by_test_id("dialog")).to_be_visible()
    page.get_by_test_id("dialog-cancel").click()
    expect(row(page, new_key)).to_have_count(1)
    page.get_by_test_id("delete-session").click()
    page.get_by_test_id("dialog-confirm").click()
    expect(row(page, new_key)).to_have_count(0)
    expect(row(page, MAIN)).to_have_attribute("data-current", "true")
    expect(messages(page, "assistant", "final")).to_have_text("echo: in main")


def test_older_messages_load_on_scroll_up(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    for i in range(1, 29):  # 56 messages: more than one page of 50
        send(page, f"m{i}")
        expect(messages(page, "assistant", "final").last).to_have_text(f"echo: m{i}")
    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    expect(messages(page)).to_have_count(50)
    expect(messages(page).first).to_have_text("m4")
    page.get_by_test_id("messages").evaluate("el => { el.scrollTop = 0; }")
    expect(messages(page)).to_have_count(56)
    expect(messages(page).first).to_have_text("m1")
    expect(page.get_by_test_id("load-older")).to_be_hidden()


def test_phone_width_layout(gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]) -> None:
    page = open_page(gateway_server, new_user(), viewport={"width": 390, "height": 844})
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"no sideways scrolling at phone width ({width}px)"
    new_session = page.get_by_test_id("new-session")
    expect(new_session).not_to_be_in_viewport()
    page.get_by_test_id("toggle-sidebar").click()
    expect(new_session).to_be_in_viewport()
    page.get_by_test_id("sidebar-backdrop").click(position={"x": 370, "y": 400})
    expect(new_session).not_to_be_in_viewport()
    send(page, "small screen")
    expect(messages(page, "assistant", "final")).to_have_text("echo: small screen")
    box = page.get_by_test_id("composer").bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390


def test_phone_width_sidebar_takes_focus_only_while_open(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user(), viewport={"width": 390, "height": 844})
    toggle = page.get_by_test_id("toggle-sidebar")
    new_session = page.get_by_test_id("new-session")
    in_sidebar = "() => Boolean(document.activeElement && document.activeElement.closest('#sidebar'))"
    expect(new_session).to_be_hidden()
    toggle.focus()
    for _ in range(4):
        page.keyboard.press("Tab")
        focused = page.evaluate("() => document.activeElement.dataset.testid || document.activeElement.tagName")
        assert not page.evaluate(in_sidebar), f"Tab reached the closed sidebar ({focused})"
    toggle.focus()
    page.keyboard.press("Enter")
    expect(new_session).to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    assert page.evaluate(in_sidebar), "opening the sidebar moves focus into it"
    page.keyboard.press("Escape")
    expect(toggle).to_be_focused()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    expect(new_session).to_be_hidden()


def test_malformed_hash_falls_back_to_the_default_session(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.evaluate("() => { location.hash = '#100%'; }")  # not valid percent-encoding
    expect(page).to_have_url(re.compile(f"#{MAIN}$"))
    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    expect(page.get_by_test_id("session-title")).to_have_text("main")
    expect(page).to_have_url(re.compile(f"#{MAIN}$"))
    assert errors == []
    send(page, "still works")
    expect(messages(page, "assistant", "final")).to_have_text("echo: still works")


# --- restart ------------------------------------------------------------------------------------------


def test_server_restart_reconnects_and_sends_what_waited(own_server: GatewayServer, open_page: Any) -> None:
    page = open_page(own_server, "user1")
    status = page.get_by_test_id("connection-status")
    send(page, "before the restart [[words:200]] [[tick:100]]")
    expect(messages(page, "assistant", "streaming")).to_contain_text("word2")

    own_server.stop()
    expect(status).to_have_attribute("data-state", re.compile("offline|connecting"))
    send(page, "sent while down")
    waiting = messages(page, "user", "sending")
    expect(waiting).to_have_text(re.compile("^sent while down"))
    expect(page.get_by_test_id("composer-status")).to_contain_text("Offline")

    own_server.start()
    expect(status).to_have_attribute("data-state", "online", timeout=15_000)
    # The run that the restart cut off ends (failed, interrupted): no endless spinner.
    interrupted = messages(page, "assistant").first
    expect(interrupted).to_have_attribute("data-state", re.compile("error|aborted"))
    # The message typed while down went out once, with its key, and got its reply.
    expect(messages(page, "assistant", "final")).to_have_text("echo: sent while down", timeout=15_000)
    expect(page.get_by_test_id("stop")).to_be_hidden()
    page.reload()
    expect(status).to_have_attribute("data-state", "online")
    expect(messages(page, "user").filter(has_text="sent while down")).to_have_count(1)
    expect(messages(page, "assistant", "final")).to_have_text("echo: sent while down")
