"""Session settings (thinkingLevel, verboseLevel, model), token counts on the row, `models.list`,
and the inline commands answered by the gateway (docs/protocol-notes.md, "Session settings and
inline commands"), over real WebSocket round trips against a real database."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat.checks import agent_table
from chat.protocol import session_rows
from chat.runtime.backends.openai import OpenAIBackend
from sessions_app import gateway_reads
from sessions_app.models import ChatSession, Message, Run
from tests.chat.test_openai_backend import make_ctx, run_backend
from tests.support.communicator import Client, open_client
from tests.support.db import counts, send_params
from tests.support.fake_openai import FakeOpenAI, Reply, agent_config

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "agent:main:main"
LEVELS = ["off", "minimal", "low", "medium", "high", "xhigh", "max"]


@pytest.fixture(autouse=True)
def two_models(settings: Any) -> None:
    """`main` (scripted) may run as `scripted` (its default) or `scripted-large`, with a token budget."""
    main = {**settings.GATEWAY_AGENTS["main"], "models": ["scripted-large"], "context_tokens": 8000}
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "main": main}


@database_sync_to_async
def stored(key: str = KEY) -> ChatSession:
    return ChatSession.objects.get(key=key)


@database_sync_to_async
def transcript(key: str = KEY) -> list[tuple[str, str, str]]:
    return list(Message.objects.filter(session__key=key).order_by("id").values_list("role", "text", "command_key"))


def changes(client: Client, reason: str | None = None) -> list[dict[str, Any]]:
    return [
        e["payload"]
        for e in client.events
        if e["event"] == "sessions.changed" and (reason is None or e["payload"]["reason"] == reason)
    ]


async def start_session(client: Client) -> dict[str, Any]:
    """`main` with one finished run."""
    await client.ok("chat.send", send_params("main", "one two three", "r1", waitMs=3000))
    return (await client.ok("sessions.list"))["sessions"][0]


# --- sessions.patch -------------------------------------------------------------------------------


async def test_patch_sets_the_settings_answers_in_openclaws_shape_and_announces_the_row(client):
    before = await start_session(client)
    assert (before["thinkingLevel"], before["verboseLevel"], before["model"]) == (None, None, "scripted")
    answer = await client.ok(
        "sessions.patch",
        {"key": KEY, "thinkingLevel": "High", "verboseLevel": "on", "model": "scripted/scripted-large"},
    )
    row = answer["session"]
    assert answer["ok"] is True and answer["key"] == KEY and answer["entry"] == row
    assert (row["thinkingLevel"], row["verboseLevel"], row["model"], row["modelProvider"]) == (
        "high",
        "on",
        "scripted-large",
        "scripted",
    )
    assert answer["resolved"] == {
        "modelProvider": "scripted",
        "model": "scripted-large",
        "thinkingLevel": "high",
        "thinkingLevels": [{"id": level, "label": level} for level in LEVELS],
    }
    assert row["version"] == before["version"] + 1 and row["label"] == before["label"]
    event = await client.wait_event(lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "patch")
    assert event["payload"]["session"] == row
    session = await stored()
    assert (session.thinking_level, session.verbose_level, session.model_override) == ("high", "on", "scripted-large")


async def test_null_clears_a_setting_and_fields_left_out_stay(client):
    await start_session(client)
    await client.ok("sessions.patch", {"key": KEY, "label": "work", "thinkingLevel": "low", "model": "scripted-large"})
    row = (await client.ok("sessions.patch", {"key": KEY, "thinkingLevel": None, "model": None}))["session"]
    assert (row["label"], row["thinkingLevel"], row["model"]) == ("work", None, "scripted")
    row = (await client.ok("sessions.patch", {"key": KEY, "label": None}))["session"]
    assert row["label"] == ""
    session = await stored()
    assert (session.label, session.thinking_level, session.model_override) == ("", "", "")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"thinkingLevel": "ultra"}, "thinkingLevel"),
        ({"thinkingLevel": 3}, "thinkingLevel"),
        ({"thinkingLevel": "high", "verboseLevel": "loud"}, "verboseLevel"),  # one bad field: nothing changes
        ({"model": "gpt-9"}, "model"),
        ({"model": "openai/scripted-large"}, "model"),  # another provider's
        ({"label": "x" * 201}, "label"),
        ({"label": "ok", "model": ""}, "model"),
    ],
)
async def test_a_bad_value_is_refused_and_changes_nothing(client, params, field):
    before = await start_session(client)
    await client.drain(0.1)
    seen = len(client.events)
    res = await client.call("sessions.patch", {"key": KEY, **params})
    assert res["ok"] is False and res["error"]["code"] == "INVALID_REQUEST"
    assert res["error"]["details"]["field"] == field
    await client.drain(0.2)
    assert not [e for e in client.events[seen:] if e["event"] == "sessions.changed"]
    assert (await client.ok("sessions.list"))["sessions"][0] == before


async def test_a_patch_needs_something_to_change(client):
    await start_session(client)
    res = await client.call("sessions.patch", {"key": KEY})
    assert res["error"]["code"] == "INVALID_REQUEST" and "nothing to change" in res["error"]["message"]


async def test_a_patch_of_a_key_not_used_yet_creates_the_session(client):
    """As OpenClaw's: a client may choose a model before the first message."""
    row = (await client.ok("sessions.patch", {"key": "fresh", "agentId": "main", "model": "scripted-large"}))["session"]
    assert row["key"] == "agent:main:fresh" and row["model"] == "scripted-large" and row["status"] is None
    await client.drain(0.2)
    assert [p["reason"] for p in changes(client) if p["sessionKey"] == "agent:main:fresh"] == ["create", "patch"]


async def test_settings_persist_across_a_reconnect(alice):
    first = await open_client(alice[1])
    await start_session(first)
    await first.ok("sessions.patch", {"key": KEY, "thinkingLevel": "minimal", "verboseLevel": "full"})
    await first.close()
    again = await open_client(alice[1])
    row = (await again.ok("sessions.list"))["sessions"][0]
    assert (row["thinkingLevel"], row["verboseLevel"]) == ("minimal", "full")
    assert (await again.ok("chat.history", {"sessionKey": KEY}))["session"]["thinkingLevel"] == "minimal"
    await again.close()


# --- the row: model and token counts --------------------------------------------------------------


async def test_the_row_carries_the_last_runs_token_counts_until_a_reset(client):
    row = await start_session(client)
    run = await database_sync_to_async(Run.objects.get)(run_id="r1")
    assert run.prompt_tokens and run.completion_tokens  # the scripted agent counts words
    assert (row["inputTokens"], row["outputTokens"]) == (run.prompt_tokens, run.completion_tokens)
    assert row["totalTokens"] == run.prompt_tokens + run.completion_tokens and row["contextTokens"] == 8000
    done = [p for p in changes(client, "run.completed") if p["runId"] == "r1"]
    assert done and done[-1]["session"]["totalTokens"] == row["totalTokens"]
    # while the next run streams, the row keeps the last finished run's counts
    await client.ok("chat.send", send_params("main", "[[hang]]", "r2"))
    running = (await client.ok("sessions.list"))["sessions"][0]
    assert running["hasActiveRun"] and running["totalTokens"] == row["totalTokens"]
    reset = (await client.ok("sessions.reset", {"sessionKey": KEY}))["session"]
    assert (reset["inputTokens"], reset["outputTokens"], reset["totalTokens"]) == (None, None, None)


async def test_a_model_the_agent_no_longer_lists_is_not_shown_or_used(client, settings):
    await start_session(client)
    await client.ok("sessions.patch", {"key": KEY, "model": "scripted-large"})
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "main": {**settings.GATEWAY_AGENTS["main"], "models": []}}
    assert (await client.ok("sessions.list"))["sessions"][0]["model"] == "scripted"


def test_rows_of_a_page_cost_one_query_whatever_their_number(alice):
    """The settings and counts are columns of the row and the agent's config: no query per row."""
    owner, _ = alice
    ChatSession.objects.bulk_create(
        ChatSession(owner=owner, key=f"agent:main:s{i}", thinking_level="high", input_tokens=i, output_tokens=1)
        for i in range(40)
    )
    page = gateway_reads.list_sessions(owner.pk, limit=40)
    with CaptureQueriesContext(connection) as captured:
        rows = session_rows.session_rows(page.sessions, gateway_reads.queues_of(page.sessions))
    assert len(rows) == 40 and len(captured) == 1  # the page's queued runIds
    assert {r["thinkingLevel"] for r in rows} == {"high"} and rows[0]["totalTokens"] == rows[0]["inputTokens"] + 1


# --- models.list ----------------------------------------------------------------------------------


async def test_models_list_is_the_configured_agents_models_in_openclaws_shape(client, settings, fake):
    settings.GATEWAY_AGENTS = {
        **settings.GATEWAY_AGENTS,
        "llm": agent_config(fake, models=["fake-large", "fake-model"]),
    }
    every = (await client.ok("models.list"))["models"]
    assert [(m["provider"], m["id"]) for m in every] == [
        ("scripted", "scripted"),
        ("scripted", "scripted-large"),
        ("openai", "fake-model"),
        ("openai", "fake-large"),
    ]
    assert every[0]["name"] == "scripted" and every[0]["contextTokens"] == 8000
    assert every[0]["thinkingLevels"][-1] == {"id": "max", "label": "max"}
    one = (await client.ok("models.list", {"agentId": "llm", "includeDetails": True}))["models"]
    assert [m["id"] for m in one] == ["fake-model", "fake-large"] and "contextTokens" not in one[0]
    by_key = (await client.ok("models.list", {"sessionKey": "agent:llm:x"}))["models"]
    assert by_key == one
    res = await client.call("models.list", {"agentId": "ghost"})
    assert res["error"]["code"] == "NOT_FOUND" and res["error"]["details"]["field"] == "agentId"
    assert client.hello is not None and "models.list" in client.hello["features"]["methods"]


# --- inline commands --------------------------------------------------------------------------------


async def command(client: Client, text: str, run_id: str, name: str | None = None) -> dict[str, Any]:
    """A command's ack, checked to be what every command's is: terminal `ok`, no run behind it, its
    answer sent first to this connection as the `chat` `final` of its runId."""
    before = (await counts())["runs"]
    rid = await client.send("chat.send", send_params("main", text, run_id))
    res = await client.response(rid)
    assert res["ok"], res
    ack = res["payload"]
    assert ack["status"] == "ok" and ack["runId"] == run_id and ack["sessionKey"] == KEY
    assert ack["command"] == (name or text.split()[0]) and isinstance(ack["reply"], str) and ack["reply"]
    assert (await counts())["runs"] == before
    # on the socket: the final, then the ack, nothing of this runId in between or after
    mine = [f for f in client.frames if f is res or (f.get("event") == "chat" and f["payload"]["runId"] == run_id)]
    assert [f.get("event", "ack") for f in mine] == ["chat", "ack"], mine
    final = mine[0]["payload"]
    assert (final["state"], final["seq"], final["stopReason"]) == ("final", 1, "stop")
    assert (final["sessionKey"], final["sessionId"]) == (KEY, ack["sessionId"])
    message = final["message"]
    assert (message["role"], message["content"], message["command"]) == (
        "assistant",
        [{"type": "text", "text": ack["reply"]}],
        True,
    )
    return ack


async def no_events_for(client: Client, run_id: str) -> None:
    await client.drain(0.2)
    assert client.chat_events(run_id) == []
    assert not [e for e in client.events if e["event"] == "agent" and e["payload"]["runId"] == run_id]


async def only_the_answer(client: Client, run_id: str) -> None:
    """Nothing for a command's runId but its one `final` (no run: no status, delta, agent event)."""
    await client.drain(0.2)
    assert [e["state"] for e in client.chat_events(run_id)] == ["final"]
    assert not [e for e in client.events if e["event"] == "agent" and e["payload"]["runId"] == run_id]


async def test_status_answers_with_the_session_and_stores_the_exchange_for_history(client):
    await start_session(client)
    await client.ok("sessions.patch", {"key": KEY, "thinkingLevel": "low"})
    ack = await command(client, "/status", "st1")
    reply = ack["reply"]
    for part in (KEY, "model scripted/scripted", "Thinking low", "verbose default", "last run done (r1)", "8000"):
        assert part in reply, part
    assert ack["aborted"] is False and ack["runIds"] == []
    await only_the_answer(client, "st1")
    history = (await client.ok("chat.history", {"sessionKey": KEY}))["messages"]
    assert [(m["role"], m.get("command"), m.get("runId")) for m in history[-2:]] == [
        ("user", True, "st1"),
        ("assistant", True, "st1"),
    ]
    assert history[-1]["content"][0]["text"] == reply
    health = await client.ok("health")
    assert health["activeRuns"] == 0 and health["queuedRuns"] == 0


async def test_status_during_a_run_reports_it_and_leaves_it_alone(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "h"))
    await client.ok("chat.send", send_params("main", "later", "q"))
    reply = (await command(client, "/status", "st"))["reply"]
    assert "running h, 1 queued" in reply
    row = (await client.ok("sessions.list"))["sessions"][0]
    assert row["activeRunIds"] == ["h"] and row["queuedRunIds"] == ["q"]


async def test_think_reports_sets_and_clears_the_level(client):
    await start_session(client)
    assert (await command(client, "/think", "t1"))["reply"].startswith("Current thinking level: default.")
    ack = await command(client, "/think HIGH", "t2")
    assert ack["reply"] == "Thinking level set to high."
    patch = await client.wait_event(lambda e: e["event"] == "sessions.changed" and e["payload"]["reason"] == "patch")
    assert patch["payload"]["session"]["thinkingLevel"] == "high"
    assert "Current thinking level: high." in (await command(client, "/think", "t3"))["reply"]
    assert (await command(client, "/think default", "t4"))["reply"] == "Thinking level reset to default."
    assert (await stored()).thinking_level == ""
    await only_the_answer(client, "t2")


async def test_verbose_and_model_commands(client):
    await start_session(client)
    assert (await command(client, "/verbose on", "v1"))["reply"] == "Verbose level set to on."
    assert "Current verbose level: on." in (await command(client, "/verbose", "v2"))["reply"]
    listed = (await command(client, "/model", "m1"))["reply"]
    assert "Current model: scripted/scripted." in listed and "scripted (default), scripted-large" in listed
    assert (await command(client, "/model scripted/scripted-large", "m2"))["reply"] == (
        "Model set to scripted/scripted-large."
    )
    session = await stored()
    assert (session.verbose_level, session.model_override) == ("on", "scripted-large")
    assert (await command(client, "/model default", "m3"))["reply"] == "Model reset to default: scripted/scripted."


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("/think hgih", "thinkingLevel must be one of off, minimal"),
        ("/think loud", "thinkingLevel must be one of"),
        ("/verbose maybe", "verboseLevel must be one of off, on, full"),
        ("/model gpt-9", "has no model 'gpt-9' (its models: scripted, scripted-large)"),
    ],
)
async def test_a_command_with_a_bad_argument_is_refused_and_changes_nothing(client, text, says):
    await start_session(client)
    before = await counts()
    row = (await client.ok("sessions.list"))["sessions"][0]
    res = await client.call("chat.send", send_params("main", text, "bad"))
    assert res["ok"] is False and res["error"]["code"] == "INVALID_REQUEST"
    assert res["error"]["details"]["field"] == "message" and says in res["error"]["message"]
    assert await counts() == before
    assert (await client.ok("sessions.list"))["sessions"][0] == row
    await no_events_for(client, "bad")


async def test_a_retried_command_replays_its_answer(client):
    await start_session(client)
    ack = await command(client, "/think high", "same")
    await client.ok("sessions.patch", {"key": KEY, "thinkingLevel": "low"})
    stored_before, version = await transcript(), (await client.ok("sessions.list"))["sessions"][0]["version"]
    await client.drain(0.2)
    seen = len(client.events)
    # the same send again (its ack was lost): the stored answer, nothing applied or stored again,
    # and, as for a terminal run's resend, the ack alone (no second `final` after the first ack)
    again = await client.ok("chat.send", send_params("main", "/think high", "same"))
    assert (again["status"], again["command"], again["reply"]) == ("ok", "/think", ack["reply"])
    assert ack["reply"] == "Thinking level set to high."
    assert await transcript() == stored_before and (await stored()).thinking_level == "low"
    await client.drain(0.2)
    assert not [e for e in client.events[seen:] if e["event"] == "sessions.changed"]
    assert [e["state"] for e in client.chat_events("same")] == ["final"]
    assert (await client.ok("sessions.list"))["sessions"][0]["version"] == version
    # /status replays its first answer too, even after a run changed what it would say now
    status = (await command(client, "/status", "st"))["reply"]
    await client.ok("chat.send", send_params("main", "more", "r2", waitMs=3000))
    assert (await client.ok("chat.send", send_params("main", "/status", "st")))["reply"] == status


@pytest.mark.parametrize("text", ["/new", "/reset", "/stop"])
async def test_a_retried_stop_new_or_reset_answers_its_first_answer_and_does_nothing_again(client, text):
    await start_session(client)
    await client.ok("chat.send", send_params("main", "[[hang]]", "a"))
    first = await command(client, text, "cmd")
    assert (first["aborted"], first["runIds"]) == (True, ["a"])
    await client.wait_terminal("a")
    # a run of the session as the command left it, then the command's send again (its ack was lost)
    await client.ok("chat.send", send_params("main", "[[hang]]", "b"))
    running = {"runId": "b", "state": "status", "phase": "running"}
    await client.wait_event(lambda e: e["event"] == "chat" and running.items() <= e["payload"].items())
    row = (await client.ok("sessions.list"))["sessions"][0]
    history = await client.ok("chat.history", {"sessionKey": KEY})
    before = await counts()
    await client.drain(0.2)
    seen = len(client.events)
    again = await client.ok("chat.send", send_params("main", text, "cmd"))
    # its first answer (the runs it stopped then, the sessionId it started), and nothing done now:
    # `b` runs on, the sessionId, transcript and row are as they were, nothing is announced
    assert again == first
    assert (await client.ok("sessions.list"))["sessions"][0] == row and row["activeRunIds"] == ["b"]
    assert await client.ok("chat.history", {"sessionKey": KEY}) == history
    assert await counts() == before
    await client.ok("health")
    await client.drain(0.2)
    assert [e for e in client.events[seen:] if e["event"] in ("chat", "sessions.changed", "agent")] == []


@pytest.mark.parametrize(
    ("first", "then"),
    [
        (("/think high", "cmd"), "/think low"),  # another command under a command's key
        (("/status", "cmd"), "/verbose on"),
        (("one two three", "r1"), "/status"),  # a command under a run's key
        (("one two three", "r1"), "/think high"),
        (("/new", "cmd"), "/stop"),  # /new, /reset and /stop keep their keys too
        (("/stop", "cmd"), "/reset"),
        (("/status", "cmd"), "/new"),
        (("one two three", "r1"), "/new"),
        (("one two three", "r1"), "/stop"),
    ],
)
async def test_a_command_under_a_used_key_is_a_conflict_and_changes_nothing(client, first, then):
    await start_session(client)
    text, key = first
    if key != "r1":
        await command(client, text, key)
    before, row = await counts(), (await client.ok("sessions.list"))["sessions"][0]
    res = await client.call("chat.send", send_params("main", then, key))
    assert res["ok"] is False and res["error"]["code"] == "CONFLICT"
    assert res["error"]["details"] == {"field": "idempotencyKey", "reason": "idempotency-conflict"}
    assert await counts() == before
    assert (await client.ok("sessions.list"))["sessions"][0] == row


async def test_a_command_names_a_session_not_used_yet_into_being(client):
    ack = await command(client, "/think low", "c1")
    assert ack["sessionId"]
    await client.drain(0.2)
    assert [p["reason"] for p in changes(client)] == ["create", "patch"]


async def test_new_and_reset_start_a_fresh_transcript_under_the_same_key(client):
    await start_session(client)
    first = (await client.ok("sessions.list"))["sessions"][0]
    await client.ok("sessions.patch", {"key": KEY, "thinkingLevel": "high"})
    for text, run_id in (("/new", "n1"), ("/reset", "n2")):
        ack = await command(client, text, run_id)
        assert ack["sessionId"] != first["sessionId"] and ack["sessionKey"] == KEY
        assert ack["reply"] == f"New conversation started (sessionId {ack['sessionId']})."
        history = await client.ok("chat.history", {"sessionKey": KEY})
        assert history["messages"] == [] and history["sessionId"] == ack["sessionId"]
    row = (await client.ok("sessions.list"))["sessions"][0]
    assert row["thinkingLevel"] == "high"  # settings belong to the session, not to one transcript


async def test_stop_says_what_it_stopped(client):
    await client.ok("chat.send", send_params("main", "[[hang]]", "a"))
    ack = await command(client, "/stop", "s1")
    assert ack["aborted"] is True and ack["runIds"] == ["a"] and ack["reply"] == "Stopped 1 run: a."
    assert (await client.wait_terminal("a"))["stopReason"] == "stop"
    assert (await command(client, "/stop", "s2"))["reply"] == "Nothing to stop."
    assert (await transcript())[-1][0] == "user"  # /stop leaves the transcript as the run left it


async def test_the_agent_method_answers_a_command_once(client):
    res = await client.call("agent", {"message": "/status", "idempotencyKey": "ag1"})
    assert res["ok"] and res["payload"]["status"] == "ok" and "Session agent:main:main" in res["payload"]["reply"]
    await client.drain(0.3)
    assert [f for f in client.frames if f.get("type") == "res" and f.get("id") == res["id"]] == [res]
    await no_events_for(client, "ag1")


@pytest.mark.parametrize(
    "text", ["/status please", "/new topic", "/think about this bug", "/model is great", "/verbose output, please"]
)
async def test_a_message_that_only_starts_like_a_command_goes_to_the_model(client, text):
    """A command word followed by a sentence (more than one word for /think, /verbose, /model) is
    a message: the model answers it, and no setting changes."""
    ack = await client.ok("chat.send", send_params("main", text, "m", waitMs=3000))
    assert ack["status"] == "ok" and "command" not in ack and ack["reply"] == f"echo: {text}"
    session = await stored()
    assert (session.thinking_level, session.verbose_level, session.model_override) == ("", "", "")


async def test_the_stored_exchange_reaches_the_owners_other_connections_once(alice, client):
    """/think high from one tab: the owner's other tab sees its answer live, as the `chat` `final`
    the sender got before its ack, exactly once; the sender too gets it exactly once."""
    other = await open_client(alice[1])
    try:
        await start_session(client)
        ack = await command(client, "/think high", "t-live")
        mine = client.chat_events("t-live")
        seen = (await other.wait_event(lambda e: e["event"] == "chat" and e["payload"]["runId"] == "t-live"))["payload"]
        assert seen == mine[0] and ack["reply"] == "Thinking level set to high."
        # the `agent` method has no event of its own for the command; the other tab sees the exchange
        agent = await client.call("agent", {"message": "/status", "idempotencyKey": "ag-live"})
        status = await other.wait_event(lambda e: e["event"] == "chat" and e["payload"]["runId"] == "ag-live")
        assert status["payload"]["message"]["content"][0]["text"] == agent["payload"]["reply"]
        # a retry stores nothing and announces nothing
        assert (await client.ok("chat.send", send_params("main", "/think high", "t-live")))["reply"] == ack["reply"]
        for tab in (client, other):
            await tab.ok("health")  # a round trip: anything sent before it has arrived
            await tab.drain(0.3)
        assert len(client.chat_events("t-live")) == 1 and len(other.chat_events("t-live")) == 1
        assert client.chat_events("ag-live") == [] and len(other.chat_events("ag-live")) == 1
        for tab in (client, other):
            assert tab.agent_events("t-live") == [] and tab.agent_events("ag-live") == []
        # what the other tab was told is what its history says
        history = (await other.ok("chat.history", {"sessionKey": KEY}))["messages"]
        assert [(m["role"], m["runId"], m["content"][0]["text"]) for m in history if m.get("command")][:2] == [
            ("user", "t-live", "/think high"),
            ("assistant", "t-live", ack["reply"]),
        ]
    finally:
        await other.close()


# OpenClaw's ACP bridge puts this before every prompt an editor sends
HEADER = "[Working directory: /home/me/project [x]]\n\n"


async def test_a_command_after_the_acp_bridges_header_is_a_command(client):
    await start_session(client)
    status = (await command(client, HEADER + "/status", "h1", name="/status"))["reply"]
    assert f"Session {KEY}" in status and "last run done (r1)" in status
    ack = await command(client, HEADER + " /think  high \n", "h2", name="/think")
    assert ack["reply"] == "Thinking level set to high." and (await stored()).thinking_level == "high"
    await only_the_answer(client, "h2")
    # the transcript keeps the command as typed, without the bridge's header
    assert (await transcript())[-4:] == [
        ("user", "/status", "h1"),
        ("assistant", status, "h1"),
        ("user", "/think  high", "h2"),
        ("assistant", "Thinking level set to high.", "h2"),
    ]
    ack = await command(client, HEADER + "/new", "h3", name="/new")
    assert ack["reply"].startswith("New conversation started")
    res = await client.call("chat.send", send_params("main", HEADER + "/think loud", "h4"))
    assert res["error"]["code"] == "INVALID_REQUEST" and res["error"]["details"]["field"] == "message"


@pytest.mark.parametrize(
    "text",
    [
        HEADER + "hello there",
        HEADER + "/status please",
        "[Working directory: /x]\n/status",  # no blank line
        " [Working directory: /x]\n\n/status",  # not at the very start
        "note\n[Working directory: /x]\n\n/status",
        "[Working directory: /x]\n\n[Working directory: /y]\n\n/status",  # one header only is skipped
        "[Working dir: /x]\n\n/status",
    ],
)
async def test_anything_else_with_a_header_goes_to_the_model_unchanged(client, text):
    ack = await client.ok("chat.send", send_params("main", text, "m", waitMs=3000))
    assert ack["status"] == "ok" and "command" not in ack and ack["reply"] == "echo: " + " ".join(text.split())
    assert (await transcript())[0] == ("user", text, "")
    assert [e["state"] for e in client.chat_events("m")][-1] == "final"


# --- the settings reach the model ------------------------------------------------------------------


@pytest.fixture
def llm(settings: Any, fake: FakeOpenAI) -> str:
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": agent_config(fake, models=["fake-large"])}
    return "agent:llm:chat"


async def ask(client: Client, key: str, text: str, run_id: str) -> dict[str, Any]:
    return await client.ok("chat.send", send_params(key, text, run_id, waitMs=5000))


async def test_the_openai_request_carries_the_sessions_model_and_reasoning_effort(client, fake, llm):
    fake.push(Reply(chunks=["a"]), Reply(chunks=["b"]), Reply(chunks=["c"]), Reply(chunks=["d"]))
    await ask(client, llm, "first", "k1")
    assert fake.requests[0].body["model"] == "fake-model" and "reasoning_effort" not in fake.requests[0].body

    await client.ok("sessions.patch", {"key": llm, "thinkingLevel": "high", "model": "openai/fake-large"})
    await ask(client, llm, "second", "k2")
    assert (fake.requests[1].body["model"], fake.requests[1].body["reasoning_effort"]) == ("fake-large", "high")

    for text, run_id in (("/status", "c1"), ("/think off", "c2"), ("/model default", "c3")):
        assert (await client.ok("chat.send", send_params(llm, text, run_id)))["status"] == "ok"
    assert len(fake.requests) == 2  # commands never reach the model
    await ask(client, llm, "third", "k3")
    third = fake.requests[2].body
    assert third["model"] == "fake-model" and "reasoning_effort" not in third
    # the commands and their answers are not part of the conversation the model is sent
    assert [m["content"] for m in third["messages"]] == ["first", "a", "second", "b", "third"]


async def test_a_model_the_agent_stopped_listing_is_not_sent(client, fake, llm, settings):
    await client.ok("sessions.patch", {"key": llm, "model": "fake-large"})
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": agent_config(fake)}
    fake.push(Reply(chunks=["ok"]))
    await ask(client, llm, "hi", "k1")
    assert fake.requests[0].body["model"] == "fake-model"


@pytest.mark.parametrize(
    ("level", "effort"),
    [(lvl, lvl) for lvl in ("minimal", "low", "medium", "high", "xhigh")]
    + [("max", "xhigh"), ("off", None), ("", None)],  # OpenAI's API goes up to xhigh: max is sent as that
)
async def test_each_thinking_level_maps_to_a_reasoning_effort(fake, level, effort):
    fake.push(Reply(chunks=["x"]))
    await run_backend(OpenAIBackend("llm", agent_config(fake)), make_ctx(thinking_level=level))
    assert fake.requests[0].body.get("reasoning_effort") == effort


@pytest.mark.parametrize(("chosen", "effort"), [("", "medium"), ("high", "high"), ("off", None)])
async def test_the_agents_thinking_default_applies_to_sessions_that_chose_none(fake, chosen, effort):
    fake.push(Reply(chunks=["x"]))
    backend = OpenAIBackend("llm", agent_config(fake, thinking="medium"))
    await run_backend(backend, make_ctx(thinking_level=chosen))
    assert fake.requests[0].body.get("reasoning_effort") == effort


@pytest.mark.parametrize("thinking", ["ultra", 3, ""])
def test_a_bad_thinking_default_is_a_setup_error_and_a_failed_check(settings, fake, thinking):
    config = agent_config(fake, thinking=thinking)
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": config}
    assert "thinking must be one of off, minimal" in (OpenAIBackend("llm", config).check_setup("hi", []) or "")
    assert [e.id for e in agent_table()] == ["agentgate.E005"]


@pytest.mark.parametrize("models", ["fake-large", ["ok", 3], [""]])
def test_a_bad_models_list_is_a_setup_error_and_a_failed_check(settings, fake, models):
    config = agent_config(fake, models=models)
    settings.GATEWAY_AGENTS = {**settings.GATEWAY_AGENTS, "llm": config}
    assert "models must be a list" in (OpenAIBackend("llm", config).check_setup("hi", []) or "")
    assert [e.id for e in agent_table()] == ["agentgate.E004"]


async def test_settings_apply_to_a_queued_run_when_it_starts(client, fake, llm):
    # (the tick comes between chunks: two, so that the first run is still going when the patch lands)
    fake.push(Reply(chunks=["slow", "ly"], tick=0.3), Reply(chunks=["next"]))
    await client.ok("chat.send", send_params(llm, "one", "k1"))
    await client.ok("chat.send", send_params(llm, "two", "k2"))
    await client.ok("sessions.patch", {"key": llm, "thinkingLevel": "low"})
    await client.wait_terminal("k2")
    assert "reasoning_effort" not in fake.requests[0].body and fake.requests[1].body["reasoning_effort"] == "low"
