"""The process's hub: its receive loop, its probe, its stop."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from channels.layers import get_channel_layer

from chat.delivery.hub import HubNotListening
from chat.runtime.gateway import runtime
from tests.support.db import plant_run

pytestmark = pytest.mark.django_db(transaction=True)


async def test_the_probe_round_trips_through_the_receive_loop(client: Any) -> None:
    await asyncio.wait_for(runtime.hub.probe(), 2)
    assert not runtime.hub._probes


async def test_a_stopped_hub_does_not_receive_again_when_the_client_library_swallows_the_cancel(
    client: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py turns a cancellation into its own TimeoutError; the loop must still end."""
    layer = get_channel_layer()
    assert layer is not None
    receive = layer.receive

    async def like_redis_py(channel: str) -> dict[str, Any]:
        try:
            return await receive(channel)
        except asyncio.CancelledError:
            raise TimeoutError("Timeout reading from socket") from None

    monkeypatch.setattr(layer, "receive", like_redis_py)
    hub = runtime.hub
    await hub.probe()  # the loop is waiting in the patched receive
    task = hub.task
    assert task is not None
    with caplog.at_level(logging.ERROR, logger="chat.delivery.hub"):
        await hub.stop()
        await asyncio.sleep(1.3)  # longer than the loop's first back-off
    assert task.done(), "the receive loop went on after stop"
    assert hub.channel is None, "a stopped hub opened a channel again"
    assert "process channel failed" not in caplog.text
    with pytest.raises(HubNotListening):
        await hub.probe()


async def test_the_probe_does_not_wait_to_leave_its_group(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer that hangs on group_discard must not hold readiness past its deadline."""
    layer = get_channel_layer()
    assert layer is not None
    hang = asyncio.Event()

    async def hanging_discard(group: str, channel: str) -> None:
        await hang.wait()

    monkeypatch.setattr(layer, "group_discard", hanging_discard)
    await asyncio.wait_for(runtime.hub.probe(), 1)
    assert runtime.hub._leaving  # still leaving, in the background
    hang.set()
    await asyncio.sleep(0.05)
    assert not runtime.hub._leaving


async def test_an_odd_message_does_not_restart_the_listener(client: Any) -> None:
    """A `gateway.chat` without `at` (an older release's) is handed on; the channel stays."""
    from chat.delivery import groups
    from chat.delivery.broadcaster import chat_message

    layer = get_channel_layer()
    assert layer is not None
    channel, task = runtime.hub.channel, runtime.hub.task
    conn = next(iter(runtime.connections))
    run = await plant_run(conn.state.user_id, "old")  # open: a run first heard of is followed once found open
    payload = {"runId": "old", "sessionKey": "agent:main:main", "sessionId": "g", "seq": 1, "state": "status"}
    message = dict(chat_message(conn.state.user_id, run.pk, payload))  # not sent through the broadcaster: no `at`
    await layer.group_send(groups.user_group(conn.state.user_id), message)
    await layer.group_send(groups.user_group(conn.state.user_id), {"type": "gateway.nonsense", "owner": "x"})
    await client.drain(0.3)
    assert [e["payload"]["runId"] for e in client.events if e["event"] == "chat"] == ["old"]
    assert runtime.hub.channel == channel and runtime.hub.task is task


def test_a_chat_event_is_stamped_when_it_is_sent_not_when_it_was_built() -> None:
    """Built in the transaction, sent once committed: a slow commit is not an old event."""
    from chat.delivery.broadcaster import broadcaster, chat_message

    payload = {"runId": "r", "sessionKey": "agent:main:main", "sessionId": "g", "seq": 1, "state": "status"}
    message = chat_message(1, 5, payload)
    message["at"] = 0.0
    broadcaster.send(1, message)
    assert message["at"] > 1e9


def _members(group: str) -> set[str]:
    layer = get_channel_layer()
    return set(getattr(layer, "groups", {}).get(group, {}))


async def test_a_regroup_racing_a_lost_channel_leaves_only_the_new_channel_in_the_groups(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receive loop opens a new channel while a regroup re-adds the old one: the old one must not
    stay a member of the process's groups (it would gather messages nobody reads until it expires)."""
    hub = runtime.hub
    process_group = hub.process_group
    assert process_group is not None and hub.channel is not None
    layer = get_channel_layer()
    assert layer is not None
    add = layer.group_add
    reopened = False

    async def lost_meanwhile(group: str, channel: str) -> None:
        nonlocal reopened
        await add(group, channel)
        if not reopened:  # the channel is lost while the regroup's first add is on its way
            reopened = True
            await hub._open(process_group)

    monkeypatch.setattr(layer, "group_add", lost_meanwhile)
    old = hub.channel
    await hub.regroup()
    assert hub.channel != old
    assert _members(process_group) == {hub.channel}


async def test_a_channel_reopened_on_a_layer_that_kept_its_groups_leaves_the_lost_one(client: Any) -> None:
    hub = runtime.hub
    process_group = hub.process_group
    assert process_group is not None
    old = hub.channel
    await hub._open(process_group)
    assert hub.channel != old and _members(process_group) == {hub.channel}


def _delta(run_pk: int, seq: int, text: str, said: str, via: str | None = None) -> dict[str, Any]:
    from chat.delivery.broadcaster import chat_message
    from chat.protocol import run_events

    payload = run_events.delta_payload(f"r{run_pk}", "agent:main:main", "g", seq, said, text, 1)
    message: dict[str, Any] = dict(chat_message(1, run_pk, payload))
    if via is not None:
        message["via"] = via
    return message


def test_a_batch_hands_on_consecutive_deltas_of_a_run_as_one() -> None:
    """In the later one's place, with the text of both; never across a gap in `seq`, another event
    of the run, or the operators' copy; other runs' events keep their order."""
    from chat.delivery.hub import coalesced

    a1, a2, a3 = (
        _delta(1, 2, "echo:", "echo:"),
        _delta(1, 3, "echo: one", " one"),
        _delta(1, 4, "echo: one two", " two"),
    )
    b1, b2 = _delta(2, 5, "x", "x"), _delta(2, 7, "x y z", " z")  # seq 6 went elsewhere: not merged
    tool = {"type": "gateway.tool", "owner": 1, "run": 1, "call": "c", "event": "start", "agent": {}}
    a5 = _delta(1, 6, "echo: one two three", " three")
    ops = _delta(1, 7, "echo: one two three four", " four", via="operators")
    out = coalesced([a1, b1, a2, a3, b2, tool, a5, ops])
    assert [(m.get("run"), m.get("seq")) for m in out] == [(2, 5), (1, 4), (2, 7), (1, None), (1, 6), (1, 7)]
    merged = out[1]
    assert merged["payload"]["deltaText"] == "echo: one two" and merged["payload"]["seq"] == 4
    assert json.loads(merged["json"]) == merged["payload"]
    assert coalesced([a1]) == [a1]


async def test_deltas_the_hub_reads_together_reach_a_connection_as_one(client: Any) -> None:
    """A hub behind its layer hands each connection a run's text once per batch, not once per delta."""
    layer = get_channel_layer()
    assert layer is not None
    channel = runtime.hub.channel
    assert channel is not None
    conn = next(iter(runtime.connections))
    run = await plant_run(conn.state.user_id, "behind")
    conn.state.track_run(run.pk, terminal=False, run_id="behind", session_key="agent:main:main", session_id="g")
    words = ["echo:", " one", " two", " three"]
    for seq in range(2, 6):  # queued without a pause: the hub reads them in one batch
        text = "".join(words[: seq - 1])
        payload = {**_delta(run.pk, seq, text, words[seq - 2])["payload"], "runId": "behind"}
        message = _delta(run.pk, seq, text, words[seq - 2])
        message.update({"owner": conn.state.user_id, "runId": "behind", "payload": payload})
        message["json"] = json.dumps(payload)
        await layer.send(channel, message)
    await client.drain(0.3)
    deltas = [e["payload"] for e in client.events if e["event"] == "chat" and e["payload"]["runId"] == "behind"]
    assert [(d["seq"], d["deltaText"]) for d in deltas] == [(5, "echo: one two three")]
