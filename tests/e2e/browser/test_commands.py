"""The chat page goes by the gateway's inline commands (`commands.list`, static/chat/commands.js)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import WebSocketRoute, expect

from .server import GatewayServer

pytestmark = pytest.mark.browser

GATEWAY_WS = re.compile(r"/ws/gateway$")
# A command this gateway has not got: the page must learn it from the answer, not know it.
HALT = {"name": "halt", "textAliases": ["/halt"], "description": "halt", "category": "session", "acceptsArgs": False}


def by_arguments(commands: list[dict[str, Any]]) -> dict[str, list[str]]:
    """A `commands.list` answer as the page keeps it: `{bare, withArgs}` text aliases, in order."""
    return {
        "bare": [alias for c in commands if not c["acceptsArgs"] for alias in c["textAliases"]],
        "withArgs": [alias for c in commands if c["acceptsArgs"] for alias in c["textAliases"]],
    }


def test_the_page_takes_its_inline_commands_from_the_gateway(
    gateway_server: GatewayServer, open_page: Any, new_user: Callable[[], str]
) -> None:
    """After connecting the page asks `commands.list` and keeps what it answers (here with a command
    added on the way); its own fallback, used until then, is the gateway's list as it is."""
    page = open_page(gateway_server, new_user())
    asked: set[str] = set()
    answers: list[list[dict[str, Any]]] = []

    def route(ws: WebSocketRoute) -> None:
        server = ws.connect_to_server()

        def from_page(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("method") == "commands.list":
                asked.add(frame["id"])
            server.send(message)

        def from_server(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") == "res" and frame.get("id") in asked and frame.get("ok"):
                answers.append(list(frame["payload"]["commands"]))
                frame["payload"]["commands"].append(HALT)
                message = json.dumps(frame)
            ws.send(message)

        ws.on_message(from_page)
        server.on_message(from_server)

    page.route_web_socket(GATEWAY_WS, route)
    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    page.wait_for_function("() => window.agentgate.state.commands.bare.includes('/halt')")
    assert len(answers) == 1, answers
    kept = page.evaluate("() => window.agentgate.state.commands")
    assert kept == by_arguments([*answers[0], HALT])

    fallback = page.evaluate(
        "async () => JSON.parse(JSON.stringify((await import('/static/chat/commands.js')).FALLBACK_COMMANDS))"
    )
    gateway = by_arguments(answers[0])
    assert sorted(fallback["bare"]) == sorted(gateway["bare"])
    assert sorted(fallback["withArgs"]) == sorted(gateway["withArgs"])
