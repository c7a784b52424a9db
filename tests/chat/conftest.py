"""Fixtures of the gateway's own tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.fake_openai import FakeOpenAI, running_fake
from tests.support.run_requests import HttpRuns


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    """A fake OpenAI-compatible server (tests/support/fake_openai.py), running for the test."""
    async with running_fake() as server:
        yield server


@pytest.fixture
def http_runs(monkeypatch: pytest.MonkeyPatch) -> HttpRuns:
    """Sends whose runIds are registered here are admitted as HTTP runs with a request (support/run_requests.py)."""
    runs = HttpRuns()
    runs.install(monkeypatch)
    return runs
