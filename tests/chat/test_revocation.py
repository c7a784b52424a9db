"""Issue 11, Medium: revocation open sockets feel at once; the per-user connection cap."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client as HttpClient

from chat.delivery import broadcaster
from chat.websocket import handshake
from sessions_app.models import ApiToken
from sessions_app.tokens import revoke_token
from tests.support.communicator import Client, open_client
from tests.support.db import send_params

pytestmark = pytest.mark.django_db(transaction=True)


def _login(user: Any) -> HttpClient:
    http = HttpClient()
    http.force_login(user)
    return http


async def _cookie_client(http: HttpClient) -> Client:
    cookie = http.cookies["sessionid"].value
    return await open_client(None, headers=[(b"cookie", f"sessionid={cookie}".encode())])


def _update_user(user_id: int, **fields: Any) -> None:
    user = get_user_model().objects.get(pk=user_id)
    for name, value in fields.items():
        if name == "password":
            user.set_password(value)
        else:
            setattr(user, name, value)
    user.save()


async def test_token_revoke_closes_at_once(make_user: Any) -> None:
    user, raw = await database_sync_to_async(make_user)("tess")
    _other, raw2 = await database_sync_to_async(make_user)("tess2")
    revoked = await open_client(raw)
    kept = await open_client(raw2)
    token = await database_sync_to_async(lambda: ApiToken.objects.get(user=user))()
    assert await database_sync_to_async(revoke_token)(token_id=token.pk) == 1
    assert await revoked.wait_closed(timeout=2) == handshake.CLOSE_POLICY
    assert (await kept.ok("health", {}))["ok"] is True
    await kept.close()


async def test_deactivation_closes_token_and_cookie_sockets(make_user: Any) -> None:
    user, raw = await database_sync_to_async(make_user)("dana")
    http = await database_sync_to_async(_login)(user)
    by_token = await open_client(raw)
    by_cookie = await _cookie_client(http)
    await database_sync_to_async(_update_user)(user.pk, is_active=False)
    assert await by_token.wait_closed(timeout=2) == handshake.CLOSE_POLICY
    assert await by_cookie.wait_closed(timeout=2) == handshake.CLOSE_POLICY


async def test_password_change_closes_cookie_sockets_not_tokens(make_user: Any) -> None:
    user, raw = await database_sync_to_async(make_user)("pat")
    http = await database_sync_to_async(_login)(user)
    by_token = await open_client(raw)
    by_cookie = await _cookie_client(http)
    await database_sync_to_async(_update_user)(user.pk, password="another-password-1")
    assert await by_cookie.wait_closed(timeout=2) == handshake.CLOSE_POLICY
    assert (await by_token.ok("health", {}))["ok"] is True
    await by_token.close()


async def test_logout_closes_the_sockets_of_that_login(make_user: Any) -> None:
    user, _raw = await database_sync_to_async(make_user)("lou")
    first = await database_sync_to_async(_login)(user)
    second = await database_sync_to_async(_login)(user)
    out = await _cookie_client(first)
    stays = await _cookie_client(second)
    await database_sync_to_async(first.post)("/logout/")
    assert await out.wait_closed(timeout=2) == handshake.CLOSE_POLICY
    assert (await stays.ok("health", {}))["ok"] is True
    await stays.close()


async def test_loss_of_staff_downgrades_at_once(make_user: Any) -> None:
    root, root_token = await database_sync_to_async(make_user)("root", staff=True)
    _alice, alice_token = await database_sync_to_async(make_user)("ann")
    admin = await open_client(root_token, subscribe=False)
    await admin.ok("sessions.subscribe", {"scope": "all"})
    alice = await open_client(alice_token)
    await database_sync_to_async(_update_user)(root.pk, is_staff=False)
    await asyncio.sleep(0.3)
    await alice.ok("chat.send", send_params("main", "private words", "p1"))
    await alice.wait_terminal("p1")
    await admin.drain(0.5)
    assert not [e for e in admin.events if e["event"] == "chat" and e["payload"]["runId"] == "p1"]
    denied = await admin.call("sessions.subscribe", {"scope": "all"})
    assert denied["error"]["code"] == "FORBIDDEN"
    await admin.close()
    await alice.close()


async def test_tick_is_the_backstop(make_user: Any, settings: Any, monkeypatch: Any) -> None:
    """With the revocation message lost, the next tick still closes or narrows."""
    monkeypatch.setattr(broadcaster.broadcaster, "route", lambda group, message: None)
    settings.GATEWAY_TICK_INTERVAL_MS = 300
    user, raw = await database_sync_to_async(make_user)("bea", staff=True)
    http = await database_sync_to_async(_login)(user)
    by_cookie = await _cookie_client(http)
    by_token = await open_client(raw, subscribe=False)
    await by_token.ok("sessions.subscribe", {"scope": "all"})
    await database_sync_to_async(_update_user)(user.pk, password="changed-password-1", is_staff=False)
    assert await by_cookie.wait_closed(timeout=3) == handshake.CLOSE_POLICY
    await by_token.drain(0.8)
    assert (await by_token.call("sessions.subscribe", {"scope": "all"}))["error"]["code"] == "FORBIDDEN"
    await by_token.close()


async def test_per_user_connection_cap(make_user: Any, settings: Any) -> None:
    settings.GATEWAY_MAX_CONNECTIONS_PER_USER = 2
    _u, raw = await database_sync_to_async(make_user)("cap")
    _v, other = await database_sync_to_async(make_user)("free")
    first, second = await open_client(raw), await open_client(raw)
    third = await open_client(raw, connect=False)
    res = await third.call(
        "connect", {"minProtocol": 4, "maxProtocol": 4, "client": {"id": "t", "version": "1"}, "auth": {"token": raw}}
    )
    assert res["error"]["code"] == "RATE_LIMITED" and res["error"]["details"]["reason"] == "too-many-connections"
    assert await third.wait_closed() == handshake.CLOSE_TOO_MANY_CONNECTIONS
    assert (await (await open_client(other)).ok("health", {}))["ok"] is True  # another user is not affected
    await first.close()
    await asyncio.sleep(0.05)
    again = await open_client(raw)  # a slot came free
    await again.close()
    await second.close()
