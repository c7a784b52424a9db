"""Steering from the chat page, in Chromium, against a real server (docs/browser.md, "Typing while the
agent works"): the agent is the `openai` backend pointed at the fake OpenAI-compatible server (run in a
thread of this process), with the test MCP server's `count` tool, so its runs take steers.

A message typed while the agent works goes into its run: it shows between the reply so far and the
rest, the call it stopped shows "Skipped", nothing shows as stopped, and a reload shows the same.
Alt+Enter queues it after the reply instead.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support.fake_openai import FakeOpenAI, Reply, ToolCallReply, agent_config, tool_reply
from tests.support.tools import TEST_SERVER, executions

from .server import GatewayServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SLOW = 30_000  # the first tool call starts the MCP server (a Python subprocess)


class ThreadedFake:
    """The fake model server on an event loop of its own thread (the browser tests are synchronous)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.fake = FakeOpenAI()
        self._call(self.fake.start())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def push(self, *replies: Reply) -> None:
        self.loop.call_soon_threadsafe(self.fake.push, *replies)

    def close(self) -> None:
        self._call(self.fake.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def steer_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayServer, ThreadedFake, Path]]:
    """A server whose agent `llm` can take steers, the fake model behind it, and the tool's count file."""
    fake = ThreadedFake()
    count_file = tmp_path_factory.mktemp("steer") / "count.txt"
    tools = {"t": {"command": sys.executable, "args": [TEST_SERVER], "env": {"MCP_COUNT_FILE": str(count_file)}}}
    agents = {
        "llm": agent_config(
            fake.fake,
            mcp_servers=tools,
            approval={"*": "never"},
            name="Counter",
            # a busy machine must not turn a slow first token into a retry (which takes the next reply)
            first_token_timeout_ms=30_000,
            idle_timeout_ms=30_000,
        )
    }
    server = GatewayServer(users=2, extra_env={"GATEWAY_AGENTS": json.dumps(agents)})
    try:
        server.prepare()
        server.start()
        yield server, fake, count_file
    finally:
        server.cleanup()
        fake.close()


def count(arg: str, ms: int, call_id: str) -> ToolCallReply:
    return ToolCallReply("t__count", json.dumps({"arg": arg, "ms": ms}), id=call_id, pieces=2)


def open_session(page: Page, server: GatewayServer, key: str) -> None:
    page.goto(f"{server.base_url}/?open={key}#{key}")  # a new load: the page opens the hash's session
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    # the page has switched to it (a hash change is taken after the page loaded): sends go there
    expect(page.get_by_test_id("session-title")).to_have_text(key.split(":")[-1])


def type_and(page: Page, text: str, key: str = "Enter") -> None:
    composer = page.get_by_test_id("composer")
    composer.fill(text)
    composer.press(key)


def shown(page: Page) -> list[str]:
    """The conversation as it reads: each message as `role: text`, each tool card as `tool: state`."""
    return page.locator('[data-testid="message"], [data-testid="tool-card"]').evaluate_all(
        """els => els.map(el => el.dataset.testid === "tool-card"
            ? `tool: ${el.dataset.state}`
            : `${el.dataset.role}: ${el.querySelector('.msg-text').textContent.trim()}`)"""
    )


STEERED = [
    "user: count twice",
    "tool: succeeded",
    "tool: skipped",
    "assistant: Counting.",
    "user: stop counting",
    "assistant: Changed course.",
]


def test_a_message_typed_while_the_agent_works_goes_into_its_reply(
    steer_world: tuple[GatewayServer, ThreadedFake, Path], open_page: Callable[..., Any]
) -> None:
    server, fake, count_file = steer_world
    page = open_page(server, "user1")
    open_session(page, server, "agent:llm:steer")
    fake.push(
        tool_reply(count("first", 6000, "call_a"), count("second", 0, "call_b"), chunks=["Counting."]),
        Reply(chunks=["Changed ", "course."], first_delay=0.5),
    )
    type_and(page, "count twice")
    expect(page.locator('[data-testid="tool-card"][data-state="running"]').first).to_be_visible(timeout=SLOW)
    # the page says what Enter does now
    expect(page.locator("#composer-hint")).to_contain_text("into the current reply")

    type_and(page, "stop counting")
    steer = page.locator('[data-testid="message"][data-role="user"]').last
    expect(steer).to_have_attribute("data-state", "steering")
    expect(steer).to_contain_text("the agent reads it at its next step")

    expect(page.locator('[data-testid="message"][data-role="assistant"][data-state="final"]')).to_have_count(
        2, timeout=SLOW
    )
    assert shown(page) == STEERED, server.log_tail(40)
    expect(page.locator('[data-testid="tool-card"][data-state="skipped"]')).to_contain_text("Skipped")
    expect(page.locator('[data-testid="message"][data-state="aborted"]')).to_have_count(0)
    expect(page.locator('[data-testid="message"][data-state="error"]')).to_have_count(0)
    assert executions(count_file) == 1  # the running call finished; the skipped one never ran

    page.reload()
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
    expect(page.locator('[data-testid="message"][data-role="assistant"]')).to_have_count(2)
    assert shown(page) == STEERED
    expect(page.locator('[data-testid="message"][data-state="aborted"]')).to_have_count(0)


def test_alt_enter_queues_the_message_after_the_reply(
    steer_world: tuple[GatewayServer, ThreadedFake, Path], open_page: Callable[..., Any]
) -> None:
    server, fake, _count_file = steer_world
    page = open_page(server, "user2")
    open_session(page, server, "agent:llm:queue")
    fake.push(
        tool_reply(count("slow", 4000, "call_q"), chunks=["Working."]),
        Reply(chunks=["Done working."]),
        Reply(chunks=["Queued answer."]),
    )
    type_and(page, "work")
    expect(page.locator('[data-testid="tool-card"][data-state="running"]').first).to_be_visible(timeout=SLOW)
    type_and(page, "afterwards", "Alt+Enter")
    queued = page.locator('[data-testid="message"][data-role="user"]').last
    expect(queued).to_have_attribute("data-state", "queued")
    expect(queued).to_contain_text("Queued")
    expect(page.locator('[data-testid="message"][data-role="assistant"][data-state="final"]')).to_have_count(
        2, timeout=SLOW
    )
    assert shown(page) == [
        "user: work",
        "tool: succeeded",
        "assistant: Working.\nDone working.",  # one reply: the message waited for its end
        "user: afterwards",
        "assistant: Queued answer.",
    ]
