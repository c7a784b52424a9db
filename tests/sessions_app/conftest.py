"""Fixtures for direct tests of the domain services (no socket, no runtime)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from chat.delivery import broadcaster
from sessions_app.lifecycle.runs import SendRequest
from tests.support.db import send_request


@pytest.fixture
def owner(db: None) -> Any:
    return get_user_model().objects.create_user(username="owner", password="pw-12345678")


@pytest.fixture
def request_for(owner: Any) -> Callable[..., SendRequest]:
    def make(run_id: str, message: str = "hello", *, key: str = "agent:main:main", **extra: Any) -> SendRequest:
        return send_request(owner.pk, run_id, message, key=key, **extra)

    return make


@pytest.fixture
def broadcasts(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every layer message the gateway hands to the broadcaster (after commit)."""
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(broadcaster.broadcaster, "send", lambda owner_id, message: sent.append(message))
    monkeypatch.setattr(broadcaster.broadcaster, "route", lambda group, message: sent.append(message))
    return sent


def chat_states(messages: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(runId, state or phase, seq) of each chat event."""
    chats = [json.loads(m["json"]) for m in messages if m["type"] == "gateway.chat"]
    return [(p["runId"], p.get("phase") or p["state"], p["seq"]) for p in chats]


def rows(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(reason, row) of each sessions.changed."""
    return [(m["reason"], json.loads(m["row"])) for m in messages if m["type"] == "gateway.session"]
