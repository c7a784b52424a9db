"""The broadcaster (`chat.delivery.broadcaster`): committed broadcasts sent in the order they were
queued, from any thread, in batches; a failed batch never stops the ones after it; `stop` returns
in bounded time even when a send swallows its cancellation (redis-py turns it into its own timeout)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from chat.delivery import broadcaster as broadcasting
from chat.delivery.broadcaster import Broadcaster, Sends

pytestmark = pytest.mark.asyncio


def recording(monkeypatch: pytest.MonkeyPatch, sent: list[Any], batches: list[int] | None = None) -> None:
    """`send_batch` records the messages' `n` (and each batch's size) instead of sending."""

    async def send_batch(sends: Sends) -> None:
        await asyncio.sleep(0.001 * (len(sent) % 3))  # uneven sends: order is the queue's, not theirs
        sent.extend(message["n"] for _group, message in sends)
        if batches is not None:
            batches.append(len(sends))

    monkeypatch.setattr(broadcasting, "send_batch", send_batch)


def one(n: int) -> Sends:
    return [("g", {"type": "x", "n": n})]


async def test_sends_go_out_in_the_order_they_were_queued_from_any_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    recording(monkeypatch, sent)
    b = Broadcaster()
    b.start()
    b._enqueue(one(0))
    worker = threading.Thread(target=lambda: [b._enqueue(one(n)) for n in range(1, 200)])
    worker.start()
    await asyncio.to_thread(worker.join)
    b._enqueue(one(200))
    await b.stop()
    assert sent == list(range(201))


async def test_what_queues_up_meanwhile_goes_out_as_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    batches: list[int] = []
    recording(monkeypatch, sent, batches)
    b = Broadcaster()
    b.start()
    for n in range(b.MAX_BATCH + 10):
        b._enqueue(one(n))
    await b.stop()
    assert sent == list(range(b.MAX_BATCH + 10))
    assert batches == [b.MAX_BATCH, 10]


async def test_a_tracked_send_is_done_once_the_layer_has_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    handed: list[Sends] = []
    release = asyncio.Event()

    async def send_batch(sends: Sends) -> None:
        await release.wait()
        handed.append(sends)

    monkeypatch.setattr(broadcasting, "send_batch", send_batch)
    b = Broadcaster()
    b.start()
    message: Any = {"type": "gateway.chat", "owner": 7}
    waiting = b.send_tracked(7, message)
    assert waiting is not None
    await asyncio.sleep(0.05)
    assert not waiting.done()
    release.set()
    await asyncio.wait_for(waiting, 2)
    assert [group for group, _message in handed[0]] == ["user.7", "operators"]
    assert "at" in handed[0][0][1]  # stamped when queued
    await b.stop()


async def test_a_waiter_is_released_when_the_broadcaster_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(sends: Sends) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(broadcasting, "send_batch", never)
    monkeypatch.setattr(broadcasting, "STOP_WAIT_SECONDS", 0.1)
    b = Broadcaster()
    b.start()
    b._enqueue(one(0))
    await asyncio.sleep(0.01)  # the first batch is being sent (and never ends)
    message: Any = {"type": "gateway.chat", "owner": 7}
    waiting = b.send_tracked(7, message)
    assert waiting is not None
    stopping = asyncio.ensure_future(b.stop())
    await asyncio.wait_for(waiting, 5)
    await stopping


async def test_a_failed_batch_does_not_stop_the_ones_after_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sent: list[int] = []

    async def send_batch(sends: Sends) -> None:
        if sends[0][1]["n"] == 0:
            raise RuntimeError("layer said no")
        sent.extend(message["n"] for _group, message in sends)

    monkeypatch.setattr(broadcasting, "send_batch", send_batch)
    b = Broadcaster()
    b.start()
    b._enqueue(one(0))
    await asyncio.sleep(0.01)
    b._enqueue(one(1))
    await b.stop()
    assert sent == [1] and "broadcast failed" in caplog.text


async def test_stop_returns_in_bounded_time_when_a_send_swallows_its_cancellation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A send that turns cancellation into going on (as redis-py's timeout handling can) must not hold
    a process's stop: `stop` waits for it at most STOP_WAIT_SECONDS, and the queue behind it is not sent."""
    sent: list[str] = []
    release = asyncio.Event()

    async def send_batch(sends: Sends) -> None:
        if sends[0][1]["n"] != 0:
            sent.append("behind")
            return
        while not release.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # swallowed
        sent.append("stubborn")

    monkeypatch.setattr(broadcasting, "send_batch", send_batch)
    b = Broadcaster()
    b.start()
    b._enqueue(one(0))
    await asyncio.sleep(0.01)  # the stubborn batch is under way
    for n in range(1, 51):
        b._enqueue(one(n))
    started = time.monotonic()
    await b.stop()
    took = time.monotonic() - started
    release.set()
    await asyncio.sleep(0.2)
    assert took < 2 + broadcasting.STOP_WAIT_SECONDS + 1.0, took
    assert sent == ["stubborn"], sent  # the loop noticed the stop: nothing queued behind went out
