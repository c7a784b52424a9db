"""Shared fixtures: users, tokens, a protocol-speaking WebSocket client, runtime reset."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from django.contrib.auth import get_user_model

from chat.runtime.gateway import runtime
from gatewayproject.settings import BASE_DIR
from sessions_app.lifecycle.usage import forget_budget_check
from sessions_app.models import KeyScope, default_key_scopes
from sessions_app.tokens import issue_token
from tests.support.communicator import Client, open_client


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove what is left of this process's SQLite test database (its WAL side files, and under
    xdist the worker's copy), once everything that used it is gone."""
    for leftover in Path(BASE_DIR).glob(f"test_db_{os.getpid()}.sqlite3*"):
        leftover.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
async def _fresh_runtime() -> AsyncIterator[None]:
    """Each test gets a fresh channel layer and a runtime bound to its own loop."""
    channel_layers.backends.clear()
    forget_budget_check()  # a test's database starts without budgets (a flush sends no signal)
    yield
    await runtime.stop()
    channel_layers.backends.clear()


@pytest.fixture
def make_user(transactional_db: None) -> Callable[..., Any]:
    def make(username: str = "alice", *, staff: bool = False) -> tuple[Any, str]:
        user = get_user_model().objects.create_user(username=username, password="pw-12345678", is_staff=staff)
        # a staff user's key as operators make it for an admin client: with the admin scope
        _token, raw = issue_token(user, scopes=[*default_key_scopes(), KeyScope.ADMIN] if staff else None)
        return user, raw

    return make


@pytest.fixture
async def alice(make_user: Callable[..., Any]) -> tuple[Any, str]:
    return await database_sync_to_async(make_user)("alice")


@pytest.fixture
async def client(alice: tuple[Any, str]) -> AsyncIterator[Client]:
    c = await open_client(alice[1])
    yield c
    await c.close()
