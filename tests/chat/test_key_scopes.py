"""An API key's scopes on the WebSocket (PROTOCOL.md §2.4, HTTP-API.md §14.1): a `connect` with
`auth.token` gets at most what the key may grant, intersected with what the client asked for; a
key with the default scopes is granted what it was before keys had scopes."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from sessions_app.models import ChatSession, Run
from sessions_app.tokens import issue_token
from tests.support.communicator import open_client

pytestmark = pytest.mark.django_db(transaction=True)

READ, WRITE, ADMIN, APPROVALS = "operator.read", "operator.write", "operator.admin", "operator.approvals"
SEND = {"sessionKey": "main", "message": "hi", "idempotencyKey": "k1"}


def _key(username: str, scopes: list[str] | None, *, staff: bool = False) -> str:
    user = get_user_model().objects.filter(username=username).first()
    user = user or get_user_model().objects.create_user(username=username, password="pw-12345678", is_staff=staff)
    return issue_token(user, name="test", scopes=scopes)[1]


async def _hello_scopes(raw: str, asked: list[str] | None) -> list[str]:
    client = await open_client(raw, subscribe=False, params={} if asked is None else {"scopes": asked})
    scopes: list[str] = client.hello["auth"]["scopes"]
    await client.close()
    return scopes


async def test_a_read_only_key_cannot_send() -> None:
    raw = await database_sync_to_async(_key)("reader", ["read"])
    client = await open_client(raw, subscribe=False, params={"scopes": [READ, WRITE, APPROVALS]})
    assert client.hello["auth"]["scopes"] == [READ]
    denied = await client.call("chat.send", SEND)
    assert denied["error"]["code"] == "FORBIDDEN"
    assert denied["error"]["message"] == "chat.send needs scope operator.write"
    assert (await client.call("chat.abort", {"sessionKey": "main"}))["error"]["code"] == "FORBIDDEN"
    # what read allows still works, and nothing was stored by the refused send
    assert (await client.ok("sessions.list", {}))["sessions"] == []
    assert not await database_sync_to_async(Run.objects.exists)()
    assert not await database_sync_to_async(ChatSession.objects.exists)()
    await client.close()


@pytest.mark.parametrize(
    ("key", "asked", "granted"),
    [
        # the default scopes: as before keys had scopes
        (None, None, [READ, WRITE]),
        (None, [READ, WRITE, APPROVALS], [READ, WRITE, APPROVALS]),
        (None, [ADMIN], [READ, WRITE, APPROVALS]),
        (None, [WRITE], [READ, WRITE]),
        # narrower keys cap what is asked
        (["read"], None, [READ]),
        (["read"], [ADMIN], [READ]),
        (["read", "approvals"], [READ, APPROVALS], [READ, APPROVALS]),
        (["read", "write"], [READ, WRITE, APPROVALS], [READ, WRITE]),
        # a key grants no more than the client asked for
        (["read", "write", "approvals"], [READ], [READ]),
    ],
)
async def test_granted_is_the_key_within_what_was_asked(
    key: list[str] | None, asked: list[str] | None, granted: list[str]
) -> None:
    raw = await database_sync_to_async(_key)("kim", key)
    assert await _hello_scopes(raw, asked) == granted


async def test_admin_needs_both_a_staff_user_and_a_key_with_admin() -> None:
    with_admin = await database_sync_to_async(_key)("root", ["read", "write", "approvals", "admin"], staff=True)
    without = await database_sync_to_async(_key)("root", None)
    assert await _hello_scopes(with_admin, None) == [READ, WRITE, ADMIN]
    assert await _hello_scopes(with_admin, [ADMIN]) == [READ, WRITE, ADMIN, APPROVALS]
    assert await _hello_scopes(without, None) == [READ, WRITE]  # a staff user's key without admin
    client = await open_client(without, subscribe=False, params={"scopes": [ADMIN]})
    assert ADMIN not in client.hello["auth"]["scopes"]
    assert (await client.call("sessions.subscribe", {"scope": "all"}))["error"]["code"] == "FORBIDDEN"
    await client.close()


async def test_a_read_and_write_key_runs_a_send() -> None:
    raw = await database_sync_to_async(_key)("writer", ["read", "write"])
    client = await open_client(raw, subscribe=False)
    await client.ok("chat.send", SEND)
    assert (await client.wait_terminal("k1"))["state"] == "final"
    await client.close()
