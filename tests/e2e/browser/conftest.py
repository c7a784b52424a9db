"""Fixtures for browser tests: a real server process, Debian's Chromium via Playwright, logged-in pages.

These tests use no pytest-django database: the server is a subprocess with its
own temporary SQLite file. Each test logs in as a user of its own (user1..userN)
through the styled sign-in form, so tests never see each other's sessions.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .server import CHROMIUM, PASSWORD, GatewayServer, launched_chromium

USERS = 60
# A second agent, so the page offers a choice of agent for a new chat.
AGENTS_ENV = {"GATEWAY_AGENTS": '{"helper": {"backend": "scripted", "model": "scripted-helper", "name": "Helper"}}'}
_user_numbers = itertools.count(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every browser test, saying why, when Chromium or Playwright is missing."""
    reason = None
    if not os.path.exists(CHROMIUM):
        reason = f"{CHROMIUM} is missing (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright package is not installed"
    if reason is None:
        return
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def gateway_server() -> Iterator[GatewayServer]:
    """One server for the whole browser suite (DEBUG off, temporary SQLite, users user1..userN)."""
    server = GatewayServer(users=USERS, extra_env=AGENTS_ENV)
    server.env["AGENTGATE_NOTES_DIR"] = str(server.tmp / "notes")  # the demo MCP server's notes
    try:
        server.prepare()
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def own_server() -> Iterator[GatewayServer]:
    """A server of the test's own, to stop and start again (same port, same database)."""
    server = GatewayServer(users=1, extra_env={"GATEWAY_SHUTDOWN_DRAIN_SECONDS": "0.5"})
    try:
        server.prepare()
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture(autouse=True)
def _fresh_runtime() -> Iterator[None]:
    """Replaces the suite's async runtime reset: these tests run the gateway in a subprocess.

    It must not be async here: while Playwright's sync API is started, its event loop
    counts as running in this thread, so pytest-asyncio could not run an async fixture.
    """
    yield


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright (never Playwright's own browser download).

    Module scope: stopping Playwright after each module releases its event loop, so
    asyncio tests that run later in the same pytest process are not disturbed.
    """
    with launched_chromium() as browser:
        yield browser


@pytest.fixture
def new_user() -> Callable[[], str]:
    """Hand out a user nobody else in this run has used."""

    def take() -> str:
        number = next(_user_numbers)
        if number > USERS:
            raise RuntimeError("out of test users: raise USERS in tests/browser/conftest.py")
        return f"user{number}"

    return take


def login(page: Any, base_url: str, username: str, password: str = PASSWORD) -> None:
    """Sign in through the styled form and wait for the chat page to connect."""
    from playwright.sync_api import expect

    page.goto(f"{base_url}/")
    page.get_by_test_id("login-username").fill(username)
    page.get_by_test_id("login-password").fill(password)
    page.get_by_test_id("login-submit").click()
    page.wait_for_url(f"{base_url}/#*")
    expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online", timeout=10_000)


@pytest.fixture
def open_page(chromium: Any) -> Iterator[Callable[..., Any]]:
    """Open logged-in pages: `open_page(server, user)`; a second call with the same user shares the login."""
    contexts: dict[tuple[str, str], Any] = {}
    errors: list[str] = []

    def open_(server: GatewayServer, username: str, *, viewport: dict[str, int] | None = None) -> Any:
        key = (server.base_url, username)
        context = contexts.get(key)
        fresh = context is None
        if fresh:
            context = chromium.new_context(viewport=viewport or {"width": 1280, "height": 800})
            context.set_default_timeout(10_000)
            contexts[key] = context
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(f"{username}: {exc}"))
        if fresh:
            login(page, server.base_url, username)
        else:
            page.goto(f"{server.base_url}/")
            from playwright.sync_api import expect

            expect(page.get_by_test_id("connection-status")).to_have_attribute("data-state", "online")
        return page

    yield open_
    for context in contexts.values():
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
