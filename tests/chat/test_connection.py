"""The per-connection view, without a socket: run and row filters, and its share of a repair."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from chat.delivery.broadcaster import chat_message
from chat.delivery.connection import ConnectionState, HeldRun
from chat.delivery.first_sight import Stored
from chat.delivery.repair import EndedRun, Snapshot, connection_events
from chat.protocol import session_rows
from tests.support.db import plant_run


def chat(run_id: str, seq: int, state: str = "delta") -> dict[str, Any]:
    return {"runId": run_id, "sessionKey": "agent:main:main", "sessionId": "g", "seq": seq, "state": state}


def row(key: str, version: int, **extra: Any) -> dict[str, Any]:
    return session_rows.row_event({"key": key, "version": version, **extra}, "patch")


def test_rows_from_the_layer_are_filtered_the_same_way() -> None:
    from chat.delivery.broadcaster import session_message

    s = state(subscribed=True)
    assert s.admit_encoded_row(session_message(1, 5, row("k", 2)))
    assert not s.admit_encoded_row(session_message(1, 5, row("k", 1)))
    assert s.rows[5].full() == {"key": "k", "version": 2}


def state(**kwargs: Any) -> ConnectionState:
    return ConnectionState(user_id=1, authed=True, scopes=["operator.read", "operator.write"], **kwargs)


def test_events_in_seq_order_and_nothing_after_the_terminal() -> None:
    s = state()
    assert s.admit_chat(7, chat("r", 1, "status"))
    assert s.admit_chat(7, chat("r", 3))
    assert not s.admit_chat(7, chat("r", 2))  # older than what was sent
    assert not s.admit_chat(7, chat("r", 3))  # a duplicate
    assert s.admit_chat(7, chat("r", 4, "final"))
    assert not s.admit_chat(7, chat("r", 5, "aborted"))  # one terminal per run
    assert s.open_run_pks() == []


def test_a_terminal_ack_closes_the_run_for_this_connection() -> None:
    s = state()
    s.track_run(7, terminal=True, run_id="r", session_key="k", session_id="g")
    assert not s.admit_chat(7, chat("r", 9, "final"))


def test_rows_never_go_backwards_and_need_a_subscription() -> None:
    s = state()
    assert not s.admit_row(1, row("k", 2))
    s.set_subscription(True)
    assert s.admit_row(1, row("k", 2))
    assert not s.admit_row(1, row("k", 1))
    assert s.admit_row(1, row("k", 3, deleted=True))
    assert not s.admit_row(1, row("k", 9))  # nothing after a deletion


def test_who_sees_what() -> None:
    user, admin = state(), state()
    admin.scopes.append("operator.admin")
    admin.set_subscription(True, all_sessions=True)
    assert user.may_see(1) and not user.may_see(2) and not user.may_see(2, via_operators=True)
    assert admin.may_see(2, via_operators=True) and not admin.may_see(1, via_operators=True)


def test_repair_sends_the_stored_terminal_once() -> None:
    s = state()
    s.track_run(7, terminal=False, run_id="r", session_key="k", session_id="g")
    final = chat("r", 4, "final")
    snap = Snapshot(asked={7}, runs={7: {"state": "done", "payload": final}})
    events = connection_events(s, snap)
    assert events[0] == ("chat", final)
    # its `agent` events come with it (§12): the end, at the terminal's seq
    assert [(name, p["seq"], p["data"]["phase"]) for name, p in events[1:]] == [("agent", 4, "end")]
    assert connection_events(s, snap) == []


def test_repair_never_makes_up_a_terminal_for_a_run_gone_with_its_session() -> None:
    """A lagging connection gets the run's real terminal or nothing (never an invented `aborted`)."""
    s = state()
    s.track_run(7, terminal=False, run_id="r", session_key="k", session_id="g")
    assert connection_events(s, Snapshot(asked={7})) == []
    assert s.open_run_pks() == []
    # and the real terminal, if it comes late through the layer, is still not a second one
    assert not s.admit_chat(7, chat("r", 9, "final"))


def test_repair_skips_runs_that_ended_before_the_connection() -> None:
    s = state()
    old = EndedRun(owner_id=1, ended_at=s.connected_at - timedelta(seconds=1), payload=chat("old", 3, "final"))
    new = EndedRun(owner_id=1, ended_at=timezone.now() + timedelta(seconds=1), payload=chat("new", 3, "final"))
    other = EndedRun(owner_id=2, ended_at=timezone.now() + timedelta(seconds=1), payload=chat("x", 3, "final"))
    events = connection_events(s, Snapshot(ended={1: old, 2: new, 3: other}))
    assert [e for e in events if e[0] == "chat"] == [("chat", new.payload)]
    assert {p["runId"] for name, p in events if name == "agent"} == {"new"}


def test_repair_of_rows_and_deletions() -> None:
    s = state(subscribed=True)
    assert s.admit_row(5, row("gone", 3))
    snap = Snapshot(rows={6: (1, {"key": "k6", "version": 2})}, checked={5}, existing=set())
    events = connection_events(s, snap)
    assert [(name, p["reason"], p["session"]["key"]) for name, p in events] == [
        ("sessions.changed", "resync", "k6"),
        ("sessions.changed", "delete", "gone"),
    ]
    assert events[1][1]["session"]["deleted"] is True and events[1][1]["session"]["version"] == 4


def test_an_unknown_runs_event_written_well_before_the_connection_is_not_its_news() -> None:
    """A lagging layer hands a new connection old events: taken, it would follow a run that
    ended before it connected, whose terminal no repair sends it."""
    s = state()
    opened = s.connected_at.timestamp()
    assert not s.admit_chat(7, chat("old", 1, "status"), written_at=opened - 10) and 7 not in s.runs
    assert s.admit_chat(8, chat("close", 1, "status"), written_at=opened - 1)  # within the clocks' slack
    s.track_run(9, terminal=False, run_id="known", session_key="agent:main:main", session_id="g")
    assert s.admit_chat(9, chat("known", 2), written_at=opened - 10)  # acked here: its events are news
    assert s.admit_chat(10, chat("new", 1, "status"), written_at=opened + 1)  # written now
    assert s.admit_chat(11, chat("repaired", 3, "final"))  # from the database (repair): no written_at


def test_a_run_first_heard_of_is_settled_by_how_it_is_stored() -> None:
    """Held events of a run never heard of become: themselves (open, or not known), its terminal
    (ended since the connection opened), or nothing (ended before, or gone with its session)."""
    s = state()
    opened = s.connected_at.timestamp()
    assert s.first_heard(1, chat("a", 2), written_at=opened)
    assert not s.first_heard(1, chat("a", 2, "aborted"), written_at=opened)  # a terminal leaves nothing open
    assert not s.first_heard(1, chat("a", 2), written_at=opened - 10)  # stale: dropped as before
    ended = {**chat_message(1, 4, chat("ended", 5, "aborted")), "agent": {}}
    cases = {
        1: (Stored(0.0), None),
        2: (None, None),  # the database away: followed, as before (repair ends it)
        3: (Stored(0.0, terminal=ended, ended_at=timezone.now() + timedelta(seconds=1)), "aborted"),
        4: (Stored(0.0, terminal=ended, ended_at=s.connected_at - timedelta(seconds=1)), "nothing"),
        5: (Stored(0.0, found=False), "nothing"),
    }
    for pk, (stored, outcome) in cases.items():
        delta = {**chat_message(1, pk, chat(f"r{pk}", 2)), "via": "operators"}
        s.held[pk] = HeldRun(delta, [delta])
        s.settle(pk, stored)
        events = s.held.pop(pk).events
        if outcome is None:
            assert events == [delta] and pk in s.open_run_pks()
        elif outcome == "nothing":
            assert events == [] and s.runs[pk].terminal
        else:
            assert [(e["payload"]["state"], e.get("via")) for e in events] == [(outcome, "operators")]
            assert pk in s.open_run_pks()  # until the terminal is admitted


@pytest.mark.django_db(transaction=True)
async def test_a_new_connection_is_not_handed_a_stale_event_by_the_hub(client: Any) -> None:
    from chat.delivery.broadcaster import chat_message
    from chat.runtime.gateway import runtime

    conn = next(iter(runtime.connections))
    owner = conn.state.user_id
    stale = {**chat_message(owner, 99, chat("ancient", 1, "status")), "at": conn.state.connected_at.timestamp() - 30}
    recent = await plant_run(owner, "recent")  # open: a run first heard of is followed once found open
    fresh = chat_message(owner, recent.pk, chat("recent", 1, "status"))
    await runtime.hub.deliver(stale)
    await runtime.hub.deliver(fresh)
    await client.drain(0.3)
    assert [e["payload"]["runId"] for e in client.events if e["event"] == "chat"] == ["recent"]
