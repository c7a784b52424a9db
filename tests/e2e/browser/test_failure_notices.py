"""What the page says when a request fails: the gateway's error, a timeout, a closed socket, a fault of its own.

Only a closed socket may say "not connected". Each test steers the page's WebSocket through
Playwright's WebSocket routing; the gateway behind it is the real one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, WebSocketRoute, expect

from .server import GatewayServer

pytestmark = pytest.mark.browser

GATEWAY_WS = re.compile(r"/ws/gateway$")


def routed(page: Page, route: Callable[[WebSocketRoute], None]) -> None:
    """Reconnect the page through `route` and wait until it is online again."""
    page.route_web_socket(GATEWAY_WS, route)
    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")


def forward_except(ws: WebSocketRoute, method: str, handle: Callable[[WebSocketRoute, dict[str, Any]], bool]) -> None:
    """Pass every frame through, except requests of `method` that `handle` takes (it returns True)."""
    server = ws.connect_to_server()

    def from_page(message: str | bytes) -> None:
        frame = json.loads(message)
        if frame.get("method") != method or not handle(ws, frame):
            server.send(message)

    ws.on_message(from_page)


def notice(page: Page) -> Locator:
    return page.get_by_test_id("notice").locator(".notice-text")


def expect_online_with_notice(page: Page, text: str | re.Pattern[str]) -> None:
    expect(notice(page)).to_have_text(text)
    expect(page.get_by_test_id("connection-status")).to_have_text("Connected")


def test_gateway_error_while_connected_shows_the_gateway_error(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    """The agent list names an agent the gateway has not got (its table changed, say): the real
    gateway refuses sessions.create, and the page says so, with the gateway's code."""
    page = open_page(gateway_server, new_user())

    def route(ws: WebSocketRoute) -> None:
        server = ws.connect_to_server()

        def from_server(message: str | bytes) -> None:
            frame = json.loads(message)
            payload = frame.get("payload") or {}
            if frame.get("type") == "res" and isinstance(payload.get("agents"), list):
                payload["agents"].append({"id": "ghost", "name": "Ghost", "model": "", "backend": "scripted"})
                message = json.dumps(frame)
            ws.send(message)

        server.on_message(from_server)

    routed(page, route)
    page.get_by_test_id("agent-picker").select_option("ghost")
    page.get_by_test_id("new-session").click()
    expect_online_with_notice(page, "sessions.create failed: unknown agent: ghost (NOT_FOUND)")
    expect(page.locator('[data-testid="session-row"][data-current="true"]')).to_have_attribute(
        "data-key", "agent:main:main"
    )


def test_a_request_without_an_answer_is_a_timeout(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    """The socket stays up, the gateway never answers: after the client's 30 s the page says it timed out."""
    page = open_page(gateway_server, new_user())
    page.clock.install()  # fake timers from the reload on: the test moves time past the 30 s
    routed(page, lambda ws: forward_except(ws, "sessions.create", lambda _ws, _frame: True))
    page.get_by_test_id("new-session").click()
    page.wait_for_timeout(200)  # the request is out, its timer set
    page.clock.fast_forward(31_000)
    expect_online_with_notice(
        page,
        "sessions.create timed out: no answer from the gateway within 30 s. "
        "It may still take effect; check before trying again.",
    )


def test_an_exception_in_the_page_is_named_as_one(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    """An answer the page cannot handle is a fault of the page, shown as such (and no uncaught error)."""
    page = open_page(gateway_server, new_user())

    def answer_without_a_session(ws: WebSocketRoute, frame: dict[str, Any]) -> bool:
        ws.send(json.dumps({"type": "res", "id": frame["id"], "ok": True, "payload": {}}))
        return True

    routed(page, lambda ws: forward_except(ws, "sessions.create", answer_without_a_session))
    page.get_by_test_id("new-session").click()
    expect_online_with_notice(page, re.compile(r"^New chat failed in this page: TypeError: "))


def test_a_closed_socket_says_not_connected(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    page = open_page(gateway_server, new_user())
    status = page.get_by_test_id("connection-status")
    live: list[WebSocketRoute] = []
    cut = {"on": False}

    def route(ws: WebSocketRoute) -> None:
        if cut["on"]:
            ws.close()  # the gateway cannot be reached: every attempt fails at once
            return
        ws.connect_to_server()
        live.append(ws)

    routed(page, route)
    cut["on"] = True
    live[-1].close()
    expect(status).not_to_have_attribute("data-state", "online")
    page.get_by_test_id("new-session").click()
    expect(notice(page)).to_have_text(
        "Not connected: sessions.create was not sent. Try again when the connection is back."
    )
    expect(status).not_to_have_attribute("data-state", "online")

    cut["on"] = False  # back: the same button works
    page.evaluate("window.dispatchEvent(new Event('online'))")
    expect(status).to_have_attribute("data-state", "online", timeout=15_000)
    page.get_by_test_id("new-session").click()
    expect(page.get_by_test_id("session-row")).to_have_count(2)


def test_a_socket_closed_before_the_answer_says_so(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    """The request went out and the socket dropped before its answer: not connected, and it may have happened."""
    page = open_page(gateway_server, new_user())
    dropped: list[str] = []

    def drop_the_first(ws: WebSocketRoute, frame: dict[str, Any]) -> bool:
        if dropped:
            return False
        dropped.append(frame["id"])
        ws.close()
        return True

    routed(page, lambda ws: forward_except(ws, "sessions.create", drop_the_first))
    page.get_by_test_id("new-session").click()
    expect_online_with_notice(  # it reconnects by itself; the notice says what happened
        page,
        "Not connected: the connection closed before sessions.create was answered. "
        "Check whether it took effect once the connection is back.",
    )
