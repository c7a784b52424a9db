"""The methods OpenClaw's own clients call (Control UI, TUI, ACP bridge), over the real consumer:
their shapes as OpenClaw answers them, errors on bad input, `agent.wait`'s real outcomes, scopes."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat.base import availability
from chat.methods import openclaw
from chat.methods.send import admission
from chat.methods.sessions import params as sessions_params
from chat.protocol import frames
from sessions_app.lifecycle import sessions as lifecycle_sessions
from sessions_app.models import ChatSession, Message, Run
from sessions_app.tokens import issue_token
from tests.support.communicator import Client, open_client
from tests.support.db import counts, send_params

pytestmark = pytest.mark.django_db(transaction=True)


async def finished(client: Client, key: str, message: str, run_id: str, **extra: Any) -> dict[str, Any]:
    """Send and wait for the run's terminal event."""
    await client.ok("chat.send", send_params(key, message, run_id, **extra))
    return await client.wait_terminal(run_id, 10)


def error_of(res: dict[str, Any]) -> tuple[str, str | None]:
    assert res["ok"] is False, res
    return res["error"]["code"], res["error"].get("details", {}).get("field")


# --- sessions.describe / resolve / get --------------------------------------------------------------


async def test_describe_answers_the_row_or_null(client, make_user):
    await client.ok("sessions.create", {"key": "notes", "label": "Notes"})
    described = await client.ok("sessions.describe", {"key": "notes"})
    assert described["session"]["key"] == "agent:main:notes" and described["session"]["label"] == "Notes"
    assert (await client.ok("sessions.describe", {"key": "agent:main:never"})) == {"session": None}
    assert error_of(await client.call("sessions.describe", {"key": "bad key!"})) == ("INVALID_REQUEST", "key")
    assert error_of(await client.call("sessions.describe", {})) == ("INVALID_REQUEST", "sessionKey")
    assert error_of(await client.call("sessions.describe", {"key": "x", "agentId": "ghost"})) == (
        "NOT_FOUND",
        "agentId",
    )
    # another user's session of the same key is not theirs to see
    _bob, bob_token = await database_sync_to_async(make_user)("bob")
    bob = await open_client(bob_token, subscribe=False)
    assert (await bob.ok("sessions.describe", {"key": "notes"})) == {"session": None}
    await bob.close()


async def test_resolve_by_key_session_id_label_and_short_id(client, make_user):
    row = (await client.ok("sessions.create", {"key": "plan", "label": "The plan"}))["session"]
    link_key = f"agent:main:dashboard:{uuid.uuid4()}"
    await client.ok("sessions.create", {"key": link_key})
    expected = {"ok": True, "key": "agent:main:plan", "agentId": "main", "displayName": "The plan"}
    assert await client.ok("sessions.resolve", {"key": "plan"}) == expected
    assert await client.ok("sessions.resolve", {"sessionId": row["sessionId"]}) == expected
    assert await client.ok("sessions.resolve", {"label": " The plan "}) == expected
    short = link_key.rsplit(":", 1)[1].replace("-", "")[:12]
    assert await client.ok("sessions.resolve", {"shortId": short.upper(), "agentId": "main"}) == {
        "ok": True,
        "key": link_key,
        "agentId": "main",
    }
    # missing: NOT_FOUND, or {ok: false} when the client allows it
    missing = await client.call("sessions.resolve", {"key": "nope"})
    assert error_of(missing) == ("NOT_FOUND", "key") and "agent:main:nope" in missing["error"]["message"]
    assert await client.ok("sessions.resolve", {"label": "nope", "allowMissing": True}) == {"ok": False}
    assert await client.ok("sessions.resolve", {"sessionId": "not-a-uuid", "allowMissing": True}) == {"ok": False}
    not_uuid = await client.call("sessions.resolve", {"sessionId": "not-a-uuid"})
    assert error_of(not_uuid) == ("NOT_FOUND", "sessionId")
    assert not_uuid["error"]["message"] == "No session found: not-a-uuid"
    # another user's sessions are not found
    _bob, bob_token = await database_sync_to_async(make_user)("bob")
    bob = await open_client(bob_token, subscribe=False)
    assert error_of(await bob.call("sessions.resolve", {"sessionId": row["sessionId"]}))[0] == "NOT_FOUND"
    await bob.close()


async def test_resolve_refuses_unclear_requests(client):
    await client.ok("sessions.create", {"key": "a", "label": "twin"})
    await client.ok("sessions.create", {"key": "b", "label": "twin"})
    twins = await client.call("sessions.resolve", {"label": "twin"})
    assert error_of(twins) == ("INVALID_REQUEST", "label") and "Multiple sessions" in twins["error"]["message"]
    assert error_of(await client.call("sessions.resolve", {"key": "a", "label": "twin"}))[0] == "INVALID_REQUEST"
    assert error_of(await client.call("sessions.resolve", {})) == ("INVALID_REQUEST", "key")
    assert error_of(await client.call("sessions.resolve", {"shortId": "xyz"})) == ("INVALID_REQUEST", "shortId")
    assert error_of(await client.call("sessions.resolve", {"key": "a", "slugHint": "s"})) == (
        "INVALID_REQUEST",
        "slugHint",
    )
    assert error_of(await client.call("sessions.resolve", {"label": "   "})) == ("INVALID_REQUEST", "label")


async def test_a_short_id_of_several_sessions_answers_the_candidates(client):
    # two Control UI links whose UUIDs begin alike, and one that does not
    twins = [f"agent:main:dashboard:abcdef12-0000-4000-8000-00000000000{i}" for i in (1, 2)]
    for key in [*twins, f"agent:main:dashboard:{uuid.uuid4()}"]:
        await client.ok("sessions.create", {"key": key, "label": key[-1]})
    candidates = [{"key": k, "agentId": "main", "displayName": k[-1]} for k in reversed(twins)]  # newest first
    resolved = await client.ok("sessions.resolve", {"shortId": "ABCDEF12", "agentId": "main"})
    assert resolved == {"ok": False, "candidates": candidates}
    startup = await client.ok("chat.startup", {"shortId": "abcdef12", "agentId": "main"})
    assert startup == {"resolution": {"ok": False, "candidates": candidates}}
    # more digits tell them apart
    one = await client.ok("sessions.resolve", {"shortId": "abcdef12000040008000000000000002", "agentId": "main"})
    assert one == {"ok": True, "key": twins[1], "agentId": "main", "displayName": "2"}


async def test_sessions_get_answers_the_messages(client):
    await finished(client, "main", "hello", "g1")
    got = await client.ok("sessions.get", {"key": "main"})
    assert [(m["role"], m["content"][0]["text"]) for m in got["messages"]] == [
        ("user", "hello"),
        ("assistant", "echo: hello"),
    ]
    assert list(got) == ["messages"]
    assert await client.ok("sessions.get", {"key": "never-used"}) == {"messages": []}
    assert error_of(await client.call("sessions.get", {"key": "main", "limit": 0})) == ("INVALID_REQUEST", "limit")
    # OpenClaw's ACP bridge replays a session with limit 1e6
    assert len((await client.ok("sessions.get", {"key": "main", "limit": 1_000_000}))["messages"]) == 2


async def test_message_subscriptions_are_acknowledged_honestly(client):
    assert await client.ok("sessions.messages.subscribe", {"key": "main"}) == {
        "subscribed": True,
        "key": "agent:main:main",
    }
    assert await client.ok("sessions.messages.unsubscribe", {"key": "main"}) == {
        "subscribed": False,
        "key": "agent:main:main",
    }
    # approvals are for connections that hold operator.approvals
    refused = await client.call("sessions.messages.subscribe", {"key": "main", "includeApprovals": True})
    assert error_of(refused) == ("INVALID_REQUEST", "includeApprovals")
    not_a_flag = await client.call("sessions.messages.subscribe", {"key": "main", "includeApprovals": "yes"})
    assert error_of(not_a_flag) == ("INVALID_REQUEST", "includeApprovals")
    assert "boolean" in not_a_flag["error"]["message"]
    reviewer = await open_client(
        (await database_sync_to_async(_token_of)("alice")),
        subscribe=False,
        params={"scopes": ["operator.read", "operator.approvals"]},
    )
    answer = await reviewer.ok("sessions.messages.subscribe", {"key": "main", "includeApprovals": True})
    assert answer["approvalReplay"]["approvals"] == [] and answer["approvalReplay"]["sessionKey"] == "agent:main:main"
    await reviewer.close()


def _token_of(username: str) -> str:
    """Another token of an existing user (another client of theirs)."""
    _token, raw = issue_token(get_user_model().objects.get(username=username))
    return raw


# --- history identity -----------------------------------------------------------------------------


async def test_history_messages_carry_openclaw_identity(client):
    await finished(client, "main", "one", "r1")
    await finished(client, "main", "two", "r2")
    history = await client.ok("chat.history", {"sessionKey": "main"})
    identities = [m["__openclaw"] for m in history["messages"]]
    ids = [m["id"] for m in history["messages"]]
    assert identities == [
        {"id": ids[0], "seq": 1, "runId": "r1", "idempotencyKey": "r1:user"},
        {"id": ids[1], "seq": 2, "runId": "r1", "idempotencyKey": "r1"},
        {"id": ids[2], "seq": 3, "runId": "r2", "idempotencyKey": "r2:user"},
        {"id": ids[3], "seq": 4, "runId": "r2", "idempotencyKey": "r2"},
    ]
    # a page that is not the transcript's start still numbers messages by their place in it
    newest = await client.ok("chat.history", {"sessionKey": "main", "limit": 1})
    assert newest["messages"][0]["__openclaw"]["seq"] == 4
    older = await client.ok("chat.history", {"sessionKey": "main", "limit": 2, "beforeId": ids[3]})
    assert [m["__openclaw"]["seq"] for m in older["messages"]] == [2, 3]


# --- chat.startup, chat.metadata, commands.list ---------------------------------------------------


async def test_chat_startup_is_history_with_session_info_and_defaults(client):
    await finished(client, "main", "hello", "s1")
    startup = await client.ok("chat.startup", {"sessionKey": "agent:main:main", "limit": 80, "maxBytes": 262144})
    assert [m["role"] for m in startup["messages"]] == ["user", "assistant"]
    assert startup["sessionInfo"]["key"] == "agent:main:main" and startup["sessionInfo"] == startup["session"]
    assert startup["defaults"]["modelSelectionTarget"] == "session"
    assert startup["defaults"]["model"] == "scripted" and startup["defaults"]["mainSessionKey"] == "agent:main:main"
    fresh = await client.ok("chat.startup", {"sessionKey": "agent:main:fresh"})
    assert fresh["messages"] == [] and fresh["sessionInfo"] is None and fresh["defaults"]["agentId"] == "main"
    assert error_of(await client.call("chat.startup", {"sessionKey": "main", "maxBytes": 10})) == (
        "INVALID_REQUEST",
        "maxBytes",
    )


async def test_chat_startup_pages_by_max_bytes(client):
    for i in range(6):
        await finished(client, "main", f"message {i} [[words:300]] [[tick:0]]", f"big{i}")
    whole = await client.ok("chat.startup", {"sessionKey": "main"})
    assert len(whole["messages"]) == 12 and len(frames.encode(whole).encode()) > 8192
    startup = await client.ok("chat.startup", {"sessionKey": "main", "maxBytes": 8192})
    assert 0 < len(startup["messages"]) < 12 and startup["hasMore"] is True
    # the payload as the frame carries it (compact JSON, UTF-8), newest messages kept
    assert len(frames.encode(startup).encode()) <= 8192
    assert startup["messages"] == whole["messages"][-len(startup["messages"]) :]


async def test_chat_startup_by_short_id(client):
    key = f"agent:main:dashboard:{uuid.uuid4()}"
    await finished(client, key, "hi", "l1")
    short = key.rsplit(":", 1)[1].replace("-", "")[:8]
    startup = await client.ok("chat.startup", {"shortId": short, "agentId": "main", "limit": 20})
    assert startup["resolution"] == {"ok": True, "key": key, "agentId": "main"}
    assert startup["sessionKey"] == key and len(startup["messages"]) == 2
    assert await client.ok("chat.startup", {"shortId": "00000000", "agentId": "main"}) == {"resolution": {"ok": False}}
    assert error_of(await client.call("chat.startup", {"shortId": short})) == ("INVALID_REQUEST", "agentId")


async def test_metadata_and_commands_list_the_inline_commands(client):
    names = ["status", "think", "verbose", "model", "new", "reset", "stop"]
    listed = (await client.ok("commands.list", {}))["commands"]
    assert [c["name"] for c in listed] == names
    assert all(c["textAliases"] == [f"/{c['name']}"] and c["source"] == "native" for c in listed)
    think = next(c for c in listed if c["name"] == "think")
    assert think["acceptsArgs"] is True and {"value": "high", "label": "high"} in think["args"][0]["choices"]
    metadata = await client.ok("chat.metadata", {"agentId": "main", "sessionKey": "agent:main:main"})
    assert [c["name"] for c in metadata["commands"]] == names and metadata["agentId"] == "main"
    assert error_of(await client.call("commands.list", {"agentId": "ghost"})) == ("NOT_FOUND", "agentId")


# --- the gateway and its agents -------------------------------------------------------------------


async def test_status_reports_version_load_and_recent_sessions(client):
    await finished(client, "main", "hi", "st1")
    status = await client.ok("status")
    assert status["runtimeVersion"] and status["activeRuns"] == 0 and status["queuedRuns"] == 0
    assert status["sessions"]["count"] == 1 and status["sessions"]["recent"][0]["key"] == "agent:main:main"
    assert status["sessions"]["defaults"]["model"] == "scripted"


async def test_status_counts_the_whole_gateway_for_an_admin_only(client, make_user):
    await client.ok("chat.send", send_params("main", "[[hang]]", "busy"))
    await client.ok("chat.send", send_params("main", "after", "waiting"))
    _bob, bob_token = await database_sync_to_async(make_user)("bob")
    _root, root_token = await database_sync_to_async(make_user)("root", staff=True)
    bob = await open_client(bob_token, subscribe=False)
    root = await open_client(root_token, subscribe=False, params={"scopes": ["operator.admin"]})
    try:
        mine = await client.ok("status")
        assert (mine["activeRuns"], mine["queuedRuns"], mine["sessions"]["count"]) == (1, 1, 1)
        # another user sees neither alice's runs nor her sessions
        theirs = await bob.ok("status")
        assert (theirs["activeRuns"], theirs["queuedRuns"], theirs["sessions"]["count"]) == (0, 0, 0)
        assert theirs["sessions"]["recent"] == []
        # an operator sees the gateway's load, and only their own sessions
        gateway = await root.ok("status")
        assert (gateway["activeRuns"], gateway["queuedRuns"], gateway["sessions"]["count"]) == (1, 1, 0)
        assert "1 active run(s), 1 queued" in gateway["channelSummary"][0]
    finally:
        await bob.close()
        await root.close()


async def test_identity_questions_auth_status_and_config(settings, client):
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "helper": {"backend": "scripted", "name": "Helper"}}
    assert await client.ok("agent.identity.get", {}) == {"agentId": "main", "name": "main", "nameSource": "default"}
    assert await client.ok("agent.identity.get", {"agentId": "helper"}) == {
        "agentId": "helper",
        "name": "Helper",
        "nameSource": "config",
    }
    assert (await client.ok("agent.identity.get", {"sessionKey": "agent:helper:x"}))["agentId"] == "helper"
    assert error_of(await client.call("agent.identity.get", {"agentId": "ghost"})) == ("NOT_FOUND", "agentId")
    assert await client.ok("question.list", {}) == {"questions": []}
    assert (await client.ok("models.authStatus", {"agentId": "main"}))["providers"] == []
    config = await client.ok("config.get", {})
    assert config["readOnly"] is True and config["exists"] is False and config["config"] == {}


async def test_features_this_gateway_lacks_are_answered_honestly(client):
    listed = set(client.hello["features"]["methods"])
    # what answers UNAVAILABLE is not announced; what answers (an empty result included) is
    assert not listed & {*openclaw.ABSENT, *openclaw.ABSENT_CHANGES}
    assert {*openclaw.NOTHING, "config.get", "question.list", "sessions.resolve", "chat.startup"} <= listed
    absent = await client.call("cron.list", {})
    assert error_of(absent)[0] == "UNAVAILABLE" and absent["error"]["retryable"] is False
    assert absent["error"]["details"] == {"reason": "not-supported", "method": "cron.list"}
    assert "no scheduled automations" in absent["error"]["message"]
    assert await client.ok("tasks.list", {}) == {"tasks": []}
    assert await client.ok("progressCard.get", {"sessionKey": "main"}) == {"card": None}
    reader = await open_client(
        await database_sync_to_async(_token_of)("alice"), subscribe=False, params={"scopes": ["operator.read"]}
    )
    assert error_of(await reader.call("config.set", {"raw": "{}"}))[0] == "FORBIDDEN"
    await reader.close()


# --- sessions.create / reset / list, agents.list ------------------------------------------------


async def test_create_and_reset_answer_openclaw_shapes(client):
    created = await client.ok("sessions.create", {"key": f"tui-{uuid.uuid4()}", "agentId": "main"})
    assert created["ok"] is True and created["runStarted"] is False
    assert created["key"].startswith("agent:main:tui-") and created["entry"] == created["session"]
    assert created["sessionId"] == created["entry"]["sessionId"]
    await finished(client, "notes", "hi", "n1")
    reset = await client.ok("sessions.reset", {"key": "notes", "agentId": "main", "reason": "reset"})
    assert reset["key"] == "agent:main:notes" and reset["entry"]["status"] is None
    assert reset["sessionId"] == reset["session"]["sessionId"]
    history = await client.ok("chat.history", {"sessionKey": "notes"})
    assert history["messages"] == [] and history["sessionId"] == reset["sessionId"]
    assert error_of(await client.call("sessions.reset", {"key": "notes", "agentId": "ghost"})) == (
        "NOT_FOUND",
        "agentId",
    )


async def test_create_with_a_first_message_sends_it(client):
    # OpenClaw's Control UI opens a new chat this way
    created = await client.ok("sessions.create", {"agentId": "main", "message": "first words"})
    assert created["runStarted"] is True and created["status"] == "started" and created["sessionKey"] == created["key"]
    final = await client.wait_terminal(created["runId"])
    assert final["state"] == "final" and final["message"]["content"][0]["text"] == "echo: first words"
    failed = await client.ok("sessions.create", {"key": "doomed", "message": "[[fail:setup]]"})
    assert failed["runStarted"] is False and failed["runError"]["code"] == "UNAVAILABLE"
    assert failed["entry"]["key"] == "agent:main:doomed"
    # a first message that chat.send would refuse creates nothing
    before = await counts()
    bad = await client.call("sessions.create", {"key": "never", "message": "x" * 40_000})
    assert error_of(bad) == ("INVALID_REQUEST", "message")
    assert await counts() == before


async def test_create_answers_the_row_as_its_first_message_left_it(client):
    created = await client.ok("sessions.create", {"key": "fresh", "message": "hello [[tick:50]]"})
    entry = created["entry"]
    # read again after the send: the row knows the run, and every sessionId in the answer is its own
    assert entry["lastRunId"] == created["runId"] and entry["version"] > 1 and entry == created["session"]
    assert created["sessionId"] == entry["sessionId"]
    renewed = await client.ok("sessions.create", {"key": "renewed", "message": "/new"})
    assert renewed["command"] == "/new" and renewed["sessionId"] == renewed["entry"]["sessionId"]


def _created(owner_key: str) -> tuple[int, int, list[str]]:
    sessions = list(ChatSession.objects.filter(key__startswith=owner_key))
    runs = list(Run.objects.filter(session__in=sessions).values_list("run_id", flat=True))
    return len(sessions), Run.objects.count(), runs


async def test_a_retried_create_replays_its_first_message(client):
    params = {"agentId": "main", "message": "first words", "idempotencyKey": "create-1"}
    first = await client.ok("sessions.create", params)
    key = first["key"]
    assert first["runId"] == "create-1" and first["runStarted"] is True
    assert key == "agent:main:" + sessions_params.derived_name("create-1")
    await client.wait_terminal("create-1")
    # the same create again (its answer was lost): the same session, the stored run, nothing new
    again = await client.ok("sessions.create", params)
    assert (again["key"], again["runId"], again["status"], again["runStarted"]) == (key, "create-1", "ok", False)
    assert again["reply"] == "echo: first words" and again["entry"]["lastRunId"] == "create-1"
    assert await database_sync_to_async(_created)("agent:main:s-") == (1, 1, ["create-1"])
    # the same key with another message is a conflict, and stores nothing
    other = await client.call("sessions.create", {**params, "message": "other words"})
    assert error_of(other) == ("CONFLICT", "idempotencyKey")
    assert other["error"]["details"]["reason"] == "idempotency-conflict"
    # an explicit key: its retry replays too; another create of that key is still a conflict
    named = {"key": "named", "message": "hi", "idempotencyKey": "create-2"}
    assert (await client.ok("sessions.create", named))["runStarted"] is True
    assert (await client.ok("sessions.create", named))["runId"] == "create-2"
    for clash in ({"key": "named"}, {**named, "idempotencyKey": "create-3"}):
        res = await client.call("sessions.create", clash)
        assert error_of(res)[0] == "CONFLICT" and res["error"]["details"]["reason"] == "session-exists"
    stored = await counts()
    assert (stored["sessions"], stored["runs"]) == (2, 2)
    # a first message that is a command is replayed from its stored answer
    status = {"message": "/status", "idempotencyKey": "create-4"}
    reply = (await client.ok("sessions.create", status))["reply"]
    assert (await client.ok("sessions.create", status))["reply"] == reply
    exchange = await database_sync_to_async(
        lambda: list(Message.objects.filter(command_key="create-4").values_list("role", "text"))
    )()
    assert exchange == [("user", "/status"), ("assistant", reply)]


def _database_away() -> None:
    """The database went away, and the one call allowed to try it has not come back: every other
    call is refused. (Blocking on purpose: no other call may end the outage meanwhile.)"""
    availability.database.failed(OSError("connection refused"))
    time.sleep(availability.TRIAL_SECONDS)
    assert availability.database.admit() is True


async def test_an_outage_after_the_create_is_a_run_error_and_the_session_is_kept(client, monkeypatch):
    async def database_gone(*_args: Any) -> Any:
        _database_away()
        raise availability.database.refuse()

    monkeypatch.setattr(admission, "_admit", database_gone)
    params = {"agentId": "main", "message": "hello", "idempotencyKey": "out-1"}
    try:
        created = await client.ok("sessions.create", params)
    finally:
        availability.database.reset()
    assert created["runStarted"] is False and created["entry"]["key"] == created["key"]
    assert created["runError"]["code"] == "UNAVAILABLE" and created["runError"]["retryable"] is True
    assert created["sessionId"] == created["entry"]["sessionId"] and "runId" not in created
    assert created["entry"]["version"] == 1  # the row as created: the database could not be read again
    assert (await counts())["sessions"] == 1 and (await counts())["runs"] == 0
    # the database is back: the same create sends the message into the same session, once
    monkeypatch.undo()
    again = await client.ok("sessions.create", params)
    assert (again["key"], again["runId"], again["runStarted"]) == (created["key"], "out-1", True)
    assert (await client.wait_terminal("out-1"))["state"] == "final"
    assert (await counts())["sessions"] == 1 and (await counts())["runs"] == 1


async def test_any_other_failure_after_the_create_is_a_run_error_too(client, monkeypatch):
    async def broken(conn: Any, send: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(admission, "_admit", broken)
    created = await client.ok("sessions.create", {"key": "kept", "message": "hello"})
    assert created["runError"]["code"] == "INTERNAL" and created["entry"]["key"] == "agent:main:kept"
    assert (await counts())["sessions"] == 1


async def test_list_has_defaults_filters_and_accepts_openclaw_limits(settings, client):
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "helper": {"backend": "scripted", "model": "tiny"}}
    await client.ok("sessions.create", {"key": "a"})
    await client.ok("sessions.create", {"key": "b", "agentId": "helper"})
    listed = await client.ok("sessions.list", {"limit": 10101, "includeGlobal": True, "configuredAgentsOnly": True})
    assert listed["count"] == 2 and listed["defaults"]["modelSelectionTarget"] == "session"
    helper = await client.ok("sessions.list", {"agentId": "helper", "limit": 1})
    assert [r["key"] for r in helper["sessions"]] == ["agent:helper:b"] and helper["defaults"]["model"] == "tiny"
    # sub-sessions spawned by another: there are none here
    spawned = await client.ok("sessions.list", {"spawnedBy": "agent:main:main", "limit": 10000})
    assert spawned["sessions"] == [] and spawned["totalCount"] == 0 and spawned["hasMore"] is False
    assert error_of(await client.call("sessions.list", {"agentId": "ghost"})) == ("NOT_FOUND", "agentId")


@database_sync_to_async
def create_sessions(owner: Any, keys: list[str]) -> None:
    for key in keys:
        lifecycle_sessions.create_session(owner_id=owner.pk, key=key)


async def test_a_big_list_is_cut_to_one_frame_with_honest_paging(settings, alice, client):
    settings.GATEWAY_MAX_PAYLOAD = 16 * 1024
    await create_sessions(alice[0], [f"agent:main:s{i:02d}" for i in range(60)])
    seen: list[str] = []
    offset = 0
    while True:
        page = await client.ok("sessions.list", {"limit": 10000, "offset": offset})
        assert page["totalCount"] == 60 and page["count"] == len(page["sessions"]) > 0
        seen += [r["key"] for r in page["sessions"]]
        if not page["hasMore"]:
            assert page["nextOffset"] is None
            break
        assert page["nextOffset"] == offset + page["count"]
        offset = page["nextOffset"]
    assert offset > 0, "one frame of 16 KiB cannot hold 60 rows"
    assert sorted(seen) == sorted(f"agent:main:s{i:02d}" for i in range(60))


async def test_a_page_reads_at_most_a_thousand_rows_whatever_the_limit(alice, client):
    """OpenClaw's Control UI asks for 10000: a frame could hold more rows than are worth reading."""
    owner = alice[0]
    await database_sync_to_async(
        lambda: ChatSession.objects.bulk_create(
            ChatSession(owner=owner, key=f"agent:main:b{i:04d}") for i in range(1200)
        )
    )()
    first = await client.ok("sessions.list", {"limit": 10000})
    assert (first["count"], first["totalCount"], first["hasMore"], first["nextOffset"]) == (1000, 1200, True, 1000)
    rest = await client.ok("sessions.list", {"limit": 10000, "offset": first["nextOffset"]})
    assert (rest["count"], rest["hasMore"], rest["nextOffset"]) == (200, False, None)
    keys = [r["key"] for r in first["sessions"] + rest["sessions"]]
    assert sorted(keys) == [f"agent:main:b{i:04d}" for i in range(1200)]
    assert (await client.ok("sessions.list", {"limit": 10}))["count"] == 10


async def test_defaults_say_the_agents_thinking_default(settings, client):
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "deep": {"backend": "scripted", "thinking": "high"}}
    listed = await client.ok("sessions.list", {})
    assert listed["defaults"]["thinkingDefault"] == "off"  # `main` configures none
    deep = await client.ok("chat.startup", {"sessionKey": "agent:deep:x"})
    assert deep["defaults"]["thinkingDefault"] == "high" and deep["thinkingLevel"] is None
    assert (await client.ok("chat.metadata", {"agentId": "deep"}))["defaults"]["thinkingDefault"] == "high"


async def test_a_session_of_an_agent_no_longer_configured_has_no_provider(settings, client):
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "gone": {"backend": "scripted", "model": "m"}}
    await client.ok("sessions.create", {"key": "agent:gone:x"})
    settings.GATEWAY_AGENTS = {k: v for k, v in settings.GATEWAY_AGENTS.items() if k != "gone"}
    row = (await client.ok("sessions.list", {}))["sessions"][0]
    assert (row["agentId"], row["modelProvider"], row["model"]) == ("gone", None, None)
    assert "gone" not in [a["id"] for a in (await client.ok("agents.list", {}))["agents"]]


# --- agent.wait -------------------------------------------------------------------------------------


async def test_wait_answers_each_real_outcome(client):
    await finished(client, "main", "fine", "ok1")
    done = await client.ok("agent.wait", {"runId": "ok1", "timeoutMs": 1000})
    assert done["status"] == "ok" and done["stopReason"] == "stop" and done["endedAt"] >= done["startedAt"]
    assert done["terminalReply"] == {"disposition": "visible", "text": "echo: fine"}
    await finished(client, "main", "bad [[fail:stream]]", "err1")
    failed = await client.ok("agent.wait", {"runId": "err1"})
    assert failed["status"] == "error" and failed["errorKind"] == "backend" and failed["error"]
    await client.ok("chat.send", send_params("main", "long [[words:500]] [[tick:50]]", "ab1"))
    await client.wait_event(lambda e: e["event"] == "chat" and e["payload"]["state"] == "delta")
    await client.ok("chat.abort", {"sessionKey": "main", "runId": "ab1"})
    aborted = await client.ok("agent.wait", {"runId": "ab1", "timeoutMs": 5000})
    assert aborted["status"] == "error" and aborted["aborted"] is True and aborted["stopReason"] == "rpc"
    await finished(client, "main", "stuck [[hang]]", "to1", timeoutMs=1000)
    timed_out = await client.ok("agent.wait", {"runId": "to1", "timeoutMs": 0})
    assert timed_out["status"] == "timeout" and timed_out["stopReason"] == "timeout" and timed_out["endedAt"]
    assert timed_out["terminalReply"] == {"disposition": "empty"}
    # each answer is the stored run's outcome: `ok` exactly for the run that completed
    stored = await database_sync_to_async(
        lambda: {r.run_id: r for r in Run.objects.filter(run_id__in=["ok1", "err1", "ab1", "to1"])}
    )()
    for result in (done, failed, aborted, timed_out):
        run = stored[result["runId"]]
        assert (result["status"] == "ok") == (run.state == "done"), (result, run.state)
        assert result["sessionKey"] == "agent:main:main" and result["sessionId"] == str(run.session_generation)
        assert result["endedAt"] == int(run.ended_at.timestamp() * 1000)


async def test_wait_for_a_run_still_going_says_pending_and_then_its_end(client):
    await client.ok("chat.send", send_params("main", "slow [[words:40]] [[tick:50]]", "slow1"))
    await client.ok("chat.send", send_params("main", "after", "next1"))
    running = await client.ok("agent.wait", {"runId": "slow1", "timeoutMs": 200})
    assert running["status"] == "pending" and running["phase"] == "running" and "endedAt" not in running
    queued = await client.ok("agent.wait", {"runId": "next1", "timeoutMs": 0})
    assert queued == {**queued, "status": "pending", "phase": "queued", "timeoutPhase": "queue"}
    # held like a waitMs ack: the connection answers other requests while it waits
    rid = await client.send("agent.wait", {"runId": "next1", "timeoutMs": 10000})
    assert (await client.ok("health"))["ok"] is True
    answer = await client.response(rid, 10)
    assert answer["payload"]["status"] == "ok" and answer["payload"]["runId"] == "next1"


async def test_wait_for_a_run_deleted_with_its_session(client):
    await client.ok("chat.send", send_params("doomed", "long [[hang]]", "gone1"))
    await client.wait_event(lambda e: e["event"] == "chat" and e["payload"].get("phase") == "dispatching")
    rid = await client.send("agent.wait", {"runId": "gone1", "timeoutMs": 10000})
    await asyncio.sleep(0.1)
    await client.ok("sessions.delete", {"sessionKey": "doomed"})
    answer = (await client.response(rid, 10))["payload"]
    assert answer["status"] == "error" and answer["aborted"] is True and answer["stopReason"] == "delete"


async def test_wait_names_the_newest_run_of_a_run_id_unless_a_session_is_given(client):
    await finished(client, "first", "one [[fail:stream]]", "same")
    await finished(client, "second", "two", "same")
    assert (await client.ok("agent.wait", {"runId": "same"}))["sessionKey"] == "agent:main:second"
    older = await client.ok("agent.wait", {"runId": "same", "sessionKey": "first"})
    assert older["sessionKey"] == "agent:main:first" and older["status"] == "error"


async def test_wait_refuses_bad_input_and_other_users_runs(client, make_user):
    await finished(client, "main", "mine", "mine1")
    assert error_of(await client.call("agent.wait", {"runId": "nobody"})) == ("NOT_FOUND", "runId")
    assert error_of(await client.call("agent.wait", {})) == ("INVALID_REQUEST", "runId")
    assert error_of(await client.call("agent.wait", {"runId": "mine1", "timeoutMs": -1})) == (
        "INVALID_REQUEST",
        "timeoutMs",
    )
    assert error_of(await client.call("agent.wait", {"runId": "mine1", "timeoutMs": "5"})) == (
        "INVALID_REQUEST",
        "timeoutMs",
    )
    assert error_of(await client.call("agent.wait", {"runId": "mine1", "sessionKey": "other"})) == (
        "NOT_FOUND",
        "runId",
    )
    _bob, bob_token = await database_sync_to_async(make_user)("bob")
    bob = await open_client(bob_token, subscribe=False)
    assert error_of(await bob.call("agent.wait", {"runId": "mine1"})) == ("NOT_FOUND", "runId")
    await bob.close()
    reader = await open_client(
        await database_sync_to_async(_token_of)("alice"), subscribe=False, params={"scopes": ["operator.read"]}
    )
    assert error_of(await reader.call("agent.wait", {"runId": "mine1"}))[0] == "FORBIDDEN"
    await reader.close()


# --- scopes -----------------------------------------------------------------------------------------


async def test_admin_implies_the_operator_scopes_as_openclaw_grants_them(make_user):
    _alice, alice_token = await database_sync_to_async(make_user)("alice")
    _root, root_token = await database_sync_to_async(make_user)("root", staff=True)
    # the ACP bridge asks for admin alone; a user who is not staff gets everything else it implies
    acp = await open_client(alice_token, subscribe=False, params={"scopes": ["operator.admin"]})
    assert acp.hello["auth"]["scopes"] == ["operator.read", "operator.write", "operator.approvals"]
    await finished(acp, "main", "from acp", "acp1")
    assert (await acp.call("sessions.subscribe", {"scope": "all"}))["error"]["code"] == "FORBIDDEN"
    await acp.close()
    root = await open_client(root_token, subscribe=False, params={"scopes": ["operator.admin"]})
    assert root.hello["auth"]["scopes"] == ["operator.read", "operator.write", "operator.admin", "operator.approvals"]
    assert (await root.ok("sessions.subscribe", {"scope": "all"}))["subscribed"] is True
    await root.close()
    # write implies read
    writer = await open_client(alice_token, subscribe=False, params={"scopes": ["operator.write"]})
    assert writer.hello["auth"]["scopes"] == ["operator.read", "operator.write"]
    assert (await writer.ok("sessions.list", {}))["totalCount"] == 1
    await writer.close()


async def test_read_only_clients_change_nothing(alice):
    reader = await open_client(alice[1], subscribe=False, params={"scopes": ["operator.read"]})
    for name, params in [
        ("chat.send", send_params("main", "hi", "x1")),
        ("sessions.create", {"key": "x"}),
        ("sessions.reset", {"key": "main"}),
        ("agent.wait", {"runId": "x1"}),
    ]:
        assert error_of(await reader.call(name, params))[0] == "FORBIDDEN", name
    assert (await counts())["sessions"] == 0
    assert not await database_sync_to_async(ChatSession.objects.exists)()
    await reader.close()


# --- what OpenClaw's Control UI is told of a run's status --------------------------------------------


async def test_the_control_ui_gets_status_phases_in_its_own_words(alice):
    ui = await open_client(alice[1], subscribe=False, params={"client": {"id": "openclaw-control-ui", "version": "1"}})
    page = await open_client(alice[1], subscribe=False)
    await page.ok("chat.send", send_params("main", "first [[words:20]] [[tick:30]]", "p1"))
    await page.ok("chat.send", send_params("main", "queued behind", "p2"))
    for client in (ui, page):
        await client.wait_terminal("p2", 10)

    def phases(client: Client, run_id: str) -> list[str]:
        return [
            e["payload"]["phase"]
            for e in client.events
            if e["event"] == "chat" and e["payload"]["runId"] == run_id and e["payload"]["state"] == "status"
        ]

    assert phases(page, "p2") == ["queued", "dispatching", "running"]
    # OpenClaw's startup phase for a run leaving the queue; none for the phases it has no word for
    assert phases(ui, "p1") == ["starting_model"] and phases(ui, "p2") == ["starting_model"]
    # everything else is the same, and the connection's event seq has no gap
    finals = [
        [e["payload"]["state"] for e in c.events if e["event"] == "chat" and e["payload"]["runId"] == "p2"]
        for c in (ui, page)
    ]
    assert finals[0][-1] == finals[1][-1] == "final"
    assert [e["seq"] for e in ui.events] == list(range(1, len(ui.events) + 1))
    assert any(e["event"] == "agent" and e["payload"]["data"].get("phase") == "queued" for e in ui.events)
    await ui.close()
    await page.close()


async def test_list_active_minutes_keeps_recent_sessions(alice, client):
    await client.ok("sessions.create", {"key": "recent"})
    await client.ok("sessions.create", {"key": "old"})
    await database_sync_to_async(
        lambda: ChatSession.objects.filter(key="agent:main:old").update(updated_at=timezone.now() - timedelta(days=8))
    )()
    recent = await client.ok("sessions.list", {"limit": 50, "activeMinutes": 10080})  # the TUI's picker: 7 days
    assert [r["key"] for r in recent["sessions"]] == ["agent:main:recent"] and recent["totalCount"] == 1
    assert (await client.ok("sessions.list", {}))["totalCount"] == 2
    assert error_of(await client.call("sessions.list", {"activeMinutes": 0})) == ("INVALID_REQUEST", "activeMinutes")
