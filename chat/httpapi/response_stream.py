"""Following a response (HTTP-API.md §14.5): its timeline again at each change of its run.

The run's follower (`chat.httpapi.follow`) says when the run, its text or its tool calls changed;
the response is then read again and its timeline derived anew (`response_events.timeline`). Its
events are prefix-stable, so a stream sends each event once, by number: the live stream of a
request, a retry's reattached stream and a resumed one (`starting_after=N`) send the same events.

A stream that cannot go on (its key revoked, the database away too long, a fault) ends with an
`error` event (OpenAI's `ResponseErrorEvent`) numbered after the last event sent. It ends the
stream, not the response: that is not stored, and the response says how its run ended when
retrieved (the disconnect rule applies to the run, as for a client that left).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncGenerator

from chat.base.db import db_read
from chat.httpapi.errors import ApiError
from chat.httpapi.follow import Follower, read_patiently
from chat.httpapi.http import EventStream, SseEvent
from chat.httpapi.response_events import Timeline, timeline
from sessions_app import response_reads
from sessions_app.models import RunState
from sessions_app.response_reads import ResponseRecord


def gone(record: ResponseRecord) -> ResponseRecord:
    """A response whose run went with its deleted session: that deletion aborted it (stopReason `delete`)."""
    return dataclasses.replace(record, run=dataclasses.replace(record.run, state=RunState.KILLED, stop_reason="delete"))


async def reread(record: ResponseRecord, *, patient: bool = False) -> ResponseRecord:
    """The response with its run as it is now (`patient`: riding out an outage, as a follower does)."""
    fresh = await (read_patiently if patient else db_read)(response_reads.refreshed, record)
    return gone(record) if fresh is None else fresh


async def timelines(record: ResponseRecord, follower: Follower) -> AsyncGenerator[Timeline, None]:
    """The response's timeline now, then at each change of its run, until it has ended."""
    line = timeline(record)
    yield line
    if line.ended:
        return
    updates = follower.updates()
    try:
        async for _update in updates:
            fresh = await reread(record, patient=True)
            if fresh.run == record.run:
                continue  # nothing the response is made of changed (an event already read)
            record = fresh
            line = timeline(record)
            yield line
            if line.ended:
                return
    finally:
        await updates.aclose()  # type: ignore[attr-defined]  # (an async generator: leaves the hub at once)
    # the follower stops only after the run's end: read it once more so the stream ends with it
    yield timeline(await reread(record, patient=True))


async def events(record: ResponseRecord, follower: Follower, after: int = -1) -> AsyncGenerator[SseEvent, None]:
    """The response's stream: every event numbered after `after`, then the live ones, to its one end. A
    stream always ends with the response's terminal event: resumed at or past it, that event again."""
    sent = after + 1
    async with contextlib.aclosing(timelines(record, follower)) as lines:
        async for line in lines:
            for event in line.events[sent:]:
                yield SseEvent(event, event["type"])
            if line.ended and sent >= len(line.events):
                yield SseEvent(line.events[-1], line.events[-1]["type"])
            sent = max(sent, len(line.events))


def error_event(error: ApiError, number: int) -> SseEvent:
    body = {
        "type": "error",
        "code": error.code,
        "message": error.message,
        "param": error.param,
        "sequence_number": number,
    }
    return SseEvent(body, "error")


def streamed(record: ResponseRecord, follower: Follower, headers: dict[str, str], after: int = -1) -> EventStream:
    """The response's stream (`events`) as an answer, ended by an `error` event if it cannot go on."""

    def ending(error: ApiError, last: SseEvent | None) -> list[SseEvent]:
        return [error_event(error, last.data["sequence_number"] + 1 if last is not None else after + 1)]

    return EventStream(events(record, follower, after), headers=headers, ending=ending)


async def settled(record: ResponseRecord, follower: Follower) -> Timeline:
    """The response once it has ended, or while one of its calls waits for an approval (the answer
    then holds the `mcp_approval_request`, so a client that does not stream can answer it)."""
    async with contextlib.aclosing(timelines(record, follower)) as lines:
        async for line in lines:
            if line.ended or line.waiting:
                return line
    raise AssertionError("a response's timelines end with its end")  # pragma: no cover
