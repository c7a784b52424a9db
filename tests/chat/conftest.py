"""Fixtures of the gateway's own tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.fake_openai import FakeOpenAI, running_fake


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    """A fake OpenAI-compatible server (tests/support/fake_openai.py), running for the test."""
    async with running_fake() as server:
        yield server
