"""What the chat page reads from the gateway: agents.list, hello-ok policy, run details."""

import re

import pytest

from chat.protocol import keys
from tests.support.communicator import open_client
from tests.support.db import send_params

pytestmark = pytest.mark.django_db(transaction=True)


async def test_agents_list_round_trip(settings, alice):
    settings.GATEWAY_AGENTS = {
        "main": {"backend": "scripted", "model": "scripted"},
        "helper": {"backend": "scripted", "model": "tiny-1", "name": "Helper bot"},
        "bare": {"backend": "scripted"},
    }
    c = await open_client(alice[1], subscribe=False)
    assert "agents.list" in c.hello["features"]["methods"]
    payload = await c.ok("agents.list", {})
    # `model` is OpenClaw's `{primary}` (its Control UI reads agents[].model.primary)
    assert payload == {
        "agents": [
            {"id": "main", "name": "main", "model": {"primary": "scripted"}, "backend": "scripted"},
            {"id": "helper", "name": "Helper bot", "model": {"primary": "tiny-1"}, "backend": "scripted"},
            {"id": "bare", "name": "bare", "model": {}, "backend": "scripted"},
        ],
        "defaultId": "main",
        "mainKey": "main",
        "scope": "per-sender",
    }
    await c.close()


async def test_agents_list_needs_read_scope(alice):
    c = await open_client(alice[1], subscribe=False, params={"scopes": ["operator.approvals"]})
    res = await c.call("agents.list", {})
    assert res["ok"] is False and res["error"]["code"] == "FORBIDDEN"
    await c.close()


async def test_hello_policy_carries_page_limits(settings, alice):
    settings.GATEWAY_MAX_MESSAGE_CHARS = 1234
    c = await open_client(alice[1], subscribe=False)
    policy = c.hello["policy"]
    assert policy["maxMessageChars"] == 1234
    assert policy["sessionKeyNamePattern"] == f"^{keys.KEY_NAME_RE.pattern}$"
    assert policy["agentIdPattern"] == f"^{keys.AGENT_ID_RE.pattern}$"
    # The patterns are plain enough for a JavaScript RegExp, and mean the same there.
    assert re.fullmatch(policy["sessionKeyNamePattern"], "work.notes-1:a") is not None
    await c.close()


async def test_final_event_and_history_carry_duration_and_usage(client):
    await client.ok("chat.send", send_params("main", "count my words", "d1"))
    final = await client.wait_terminal("d1")
    assert final["state"] == "final"
    assert isinstance(final["durationMs"], int) and final["durationMs"] >= 0
    assert final["usage"] == {"promptTokens": 3, "completionTokens": 4}
    history = await client.ok("chat.history", {"sessionKey": "main"})
    user, reply = history["messages"]
    assert "durationMs" not in user and "usage" not in user
    assert reply["usage"] == {"promptTokens": 3, "completionTokens": 4}
    assert reply["durationMs"] == final["durationMs"]


async def test_failed_run_has_no_usage(client):
    await client.ok("chat.send", send_params("main", "boom [[fail:stream]]", "d2"))
    error = await client.wait_terminal("d2")
    assert error["state"] == "error" and "usage" not in error and error["durationMs"] >= 0
