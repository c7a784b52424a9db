"""Fixtures of the gateway's own tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.support.fake_openai import FakeOpenAI, agent_config, running_fake
from tests.support.run_requests import HttpRuns


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    """A fake OpenAI-compatible server (tests/support/fake_openai.py), running for the test."""
    async with running_fake() as server:
        yield server


@pytest.fixture
def use_agent(settings: Any, fake: FakeOpenAI) -> Callable[..., dict[str, Any]]:
    """Agent `llm`: the fake model, configured now and again by each call (`agent_config` overrides).
    A test file whose agent needs more (its MCP servers) has a `use_agent` of its own."""

    def configure(**overrides: Any) -> dict[str, Any]:
        config = agent_config(fake, **overrides)
        settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": config}
        return config

    configure()
    return configure


@pytest.fixture
def http_runs(monkeypatch: pytest.MonkeyPatch) -> HttpRuns:
    """Sends whose runIds are registered here are admitted as HTTP runs with a request (support/run_requests.py)."""
    runs = HttpRuns()
    runs.install(monkeypatch)
    return runs
