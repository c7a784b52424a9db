"""§1, §2, §10: handshake, auth, origin, scopes, limits — over real WebSocket round-trips."""

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client as HttpClient

from gatewayproject.asgi import application
from sessions_app.models import ChatSession, Run
from tests.support.communicator import open_client

pytestmark = pytest.mark.django_db(transaction=True)

CONNECT = {"minProtocol": 4, "maxProtocol": 4, "client": {"id": "t", "version": "1"}}


async def test_hello_ok_shape(alice):
    c = await open_client(alice[1], subscribe=False)
    hello = c.hello
    assert hello["type"] == "hello-ok" and hello["protocol"] == 4
    assert hello["auth"] == {"role": "operator", "scopes": ["operator.read", "operator.write"], "user": "alice"}
    assert hello["snapshot"]["sessionDefaults"]["mainSessionKey"] == "agent:main:main"
    assert hello["policy"] == {
        "maxPayload": 1048576,
        "maxBufferedBytes": 8388608,
        "tickIntervalMs": 30000,
        "maxMessageChars": 32000,
        "sessionKeyNamePattern": "^[A-Za-z0-9._:-]{1,200}$",
        "agentIdPattern": "^[A-Za-z0-9_-]{1,64}$",
        "idempotencyKeyPattern": "^[A-Za-z0-9._:-]{1,128}$",
        "attachments": {"maxBytes": 5 * 1024 * 1024, "maxImageBytes": 5 * 1024 * 1024},
        "maxAttachments": 4,
        "maxImagePixels": 40_000_000,
        "attachmentTypes": [
            "image/png",
            "image/jpeg",
            "image/gif",
            "image/webp",
            "image/bmp",
            "text/plain",
            "text/markdown",
            "text/csv",
            "application/json",
            "application/pdf",
        ],
        "uploadUrl": "/api/files",
    }
    assert "chat.send" in hello["features"]["methods"] and "sessions.changed" in hello["features"]["events"]
    assert c.events[0]["seq"] == 1 and set(c.events[0]["payload"]) == {"nonce", "ts"}
    await c.close()


async def test_root_path_serves_the_gateway(alice):
    c = await open_client(alice[1], path="/", subscribe=False)
    assert c.hello["protocol"] == 4
    await c.close()


async def test_protocol_mismatch_closes_4002(alice):
    c = await open_client(connect=False)
    res = await c.call("connect", {**CONNECT, "minProtocol": 5, "maxProtocol": 6, "auth": {"token": alice[1]}})
    assert res["error"]["code"] == "INVALID_REQUEST"
    assert res["error"]["details"] == {"code": "PROTOCOL_MISMATCH", "expectedProtocol": 4}
    await c.drain(0.5)
    assert c.closed == 4002


@pytest.mark.parametrize("first", ['{"type":"req","id":"x","method":"health"}', "garbage"])
async def test_first_frame_must_be_connect(first):
    c = await open_client(connect=False)
    await c.send_raw(first)
    await c.drain(0.5)
    res = [f for f in c.responses.values()]
    assert res and res[0]["error"]["message"] == "first request must be connect"
    assert c.closed == 4008


@pytest.mark.parametrize("token", [None, "agt_wrong", 17])
async def test_unauthorized(token, alice):
    c = await open_client(connect=False)
    params = dict(CONNECT)
    if token is not None:
        params["auth"] = {"token": token}
    res = await c.call("connect", params)
    assert res["error"]["code"] == "UNAUTHORIZED"
    await c.drain(0.3)
    assert c.closed == 4008


async def test_connect_timeout_closes_4008(settings):
    settings.GATEWAY_CONNECT_TIMEOUT_MS = 200
    c = await open_client(connect=False)
    await c.drain(1.0)
    assert c.closed == 4008


async def test_browser_session_cookie_authenticates(make_user):
    user, _ = await database_sync_to_async(make_user)("bob")

    def login_cookie() -> str:
        http = HttpClient()
        http.force_login(user)
        return http.cookies["sessionid"].value

    cookie = await database_sync_to_async(login_cookie)()
    c = await open_client(None, headers=[(b"cookie", f"sessionid={cookie}".encode())], subscribe=False)
    assert c.hello["auth"]["user"] == "bob"
    await c.close()


async def test_foreign_origin_is_refused_before_accept(alice):
    comm = WebsocketCommunicator(application, "/ws/gateway", headers=[(b"origin", b"http://evil.example")])
    accepted, _ = await comm.connect()
    assert not accepted
    ok = WebsocketCommunicator(
        application, "/ws/gateway", headers=[(b"origin", b"http://localhost:8000"), (b"host", b"localhost:8000")]
    )
    accepted, _ = await ok.connect()
    assert accepted
    await ok.disconnect()


async def test_scopes_are_intersected_and_enforced(alice):
    c = await open_client(alice[1], subscribe=False, params={"scopes": ["operator.read", "operator.nonsense"]})
    assert c.hello["auth"]["scopes"] == ["operator.read"]
    res = await c.call("chat.send", {"sessionKey": "main", "message": "hi", "idempotencyKey": "k"})
    assert res["error"]["code"] == "FORBIDDEN"
    assert not await database_sync_to_async(Run.objects.exists)()
    await c.close()
    # admin is staff-only: a user asking for it gets what it implies that they may have, not admin
    c = await open_client(alice[1], subscribe=False, params={"scopes": ["operator.read", "operator.admin"]})
    assert c.hello["auth"]["scopes"] == ["operator.read", "operator.write", "operator.approvals"]
    assert (await c.call("sessions.subscribe", {"scope": "all"}))["error"]["code"] == "FORBIDDEN"
    await c.close()


async def test_unknown_method_and_bad_frames_keep_socket_open(client):
    res = await client.call("nope.nothing", {})
    assert res["error"]["code"] == "INVALID_REQUEST" and res["error"]["details"]["code"] == "UNKNOWN_METHOD"
    await client.send_raw("{not json")
    await client.send_raw(json.dumps({"type": "req", "id": "e1", "method": "health", "x": 1}))
    await client.drain(0.3)
    assert client.responses["invalid"]["error"]["code"] == "INVALID_REQUEST"
    assert client.responses["e1"]["error"]["details"]["field"] == "x"
    assert (await client.ok("health"))["ok"] is True
    assert client.closed is None


async def test_rate_limit(settings, alice):
    settings.GATEWAY_RATE_PER_SEC = 1
    settings.GATEWAY_RATE_BURST = 3
    c = await open_client(alice[1], subscribe=False)
    results = [await c.call("health") for _ in range(5)]
    limited = [r for r in results if not r["ok"]]
    assert limited and limited[0]["error"]["code"] == "RATE_LIMITED"
    assert limited[0]["error"]["retryAfterMs"] > 0
    await c.close()


async def test_oversize_frame_closes_1009_and_stores_nothing(settings, alice):
    settings.GATEWAY_MAX_PAYLOAD = 2000
    c = await open_client(alice[1], subscribe=False)
    await c.send("chat.send", {"sessionKey": "main", "message": "x" * 3000, "idempotencyKey": "big"})
    await c.drain(0.5)
    assert c.closed == 1009
    assert not await database_sync_to_async(ChatSession.objects.exists)()


async def test_tick_events(settings, alice):
    settings.GATEWAY_TICK_INTERVAL_MS = 100
    c = await open_client(alice[1], subscribe=False)
    await c.wait_event(lambda e: e["event"] == "tick", 2)
    seqs = [e["seq"] for e in c.events]
    assert seqs == list(range(1, len(seqs) + 1))
    await c.close()


async def test_admin_scope_all_sees_other_users(make_user):
    _alice, alice_token = await database_sync_to_async(make_user)("alice")
    _root, root_token = await database_sync_to_async(make_user)("root", staff=True)
    root = await open_client(root_token, subscribe=False)
    assert "operator.admin" in root.hello["auth"]["scopes"]
    await root.ok("sessions.subscribe", {"scope": "all"})
    alice = await open_client(alice_token)
    denied = await alice.call("sessions.subscribe", {"scope": "all"})
    assert denied["error"]["code"] == "FORBIDDEN"
    await alice.ok("chat.send", {"sessionKey": "main", "message": "hi", "idempotencyKey": "k"})
    assert (await root.wait_terminal("k"))["state"] == "final"
    await root.wait_event(lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "run.completed")
    # the admin's own session events arrive once, not once per group
    await root.ok("chat.send", {"sessionKey": "mine", "message": "hi", "idempotencyKey": "m"})
    await root.wait_terminal("m")
    await root.drain(0.3)
    own_rows = [
        e for e in root.events if e["event"] == "sessions.changed" and e["payload"]["sessionKey"] == "agent:main:mine"
    ]
    versions = [e["payload"]["session"]["version"] for e in own_rows]
    reasons = [e["payload"]["reason"] for e in own_rows]
    assert len(set(zip(versions, reasons, strict=True))) == len(own_rows)
    await alice.close()
    await root.close()


async def test_revoked_token_closes_open_connection(settings, alice):
    from sessions_app.tokens import hash_token, revoke_token

    settings.GATEWAY_TICK_INTERVAL_MS = 150
    c = await open_client(alice[1], subscribe=False)
    await c.wait_event(lambda e: e["event"] == "tick", 2)
    prefix = alice[1][:12]
    assert await database_sync_to_async(revoke_token)(prefix=prefix) == 1
    await c.drain(1.0)
    assert c.closed == 4008
    assert hash_token(alice[1])  # the raw token is never stored, only its hash
