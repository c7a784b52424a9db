"""`POST /v1/chat/completions` (HTTP-API.md §14.4): a request read and checked, its run admitted the
way every run is (`chat.httpapi.runs`), then answered whole or streamed as the run goes.

A stream shows nothing before its run runs (queued, dispatching); then the role, the run's stored text as it comes,
and exactly one end: the finish_reason (and the usage chunk if asked) then `[DONE]`, or an error
object then `[DONE]` (the run's error, or the answer's own: a revoked key, the database away too
long, a fault). A run that ends in error before anything was sent is answered with that status
instead of a stream; a run queued longer than a keep-alive interval has had its headers sent by
then (a keep-alive comment), so it ends with the error object instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from chat.base.db import db_read
from chat.httpapi import completion_answers as answers
from chat.httpapi import runs
from chat.httpapi.client_tools import check_clash
from chat.httpapi.completion_answers import Identity
from chat.httpapi.completion_request import parse_completion
from chat.httpapi.conversation import (
    Conversation,
    read_messages,
    resolve_files,
    run_request,
    unknown_call,
)
from chat.httpapi.errors import ApiError
from chat.httpapi.follow import Ended, Follower, Status, Text
from chat.httpapi.http import Answer, EventStream, JsonAnswer, Request, SseEvent
from chat.httpapi.models import agent_of, backend_model
from chat.httpapi.routes import route
from chat.methods.send import attach
from sessions_app import gateway_reads
from sessions_app.models import RunState

DONE = SseEvent("[DONE]")


@route("POST", r"^/v1/chat/completions$")
async def create_completion(req: Request) -> Answer:
    body = req.json()
    asked = parse_completion(body)
    agent_id = agent_of(asked.model)
    model = backend_model(req, agent_id)
    key = runs.idempotency_key(req)
    where = runs.target(req, agent_id, key=key)
    convo = read_messages(asked.messages, named=where.named, agent_id=agent_id)
    retry = await runs.key_taken(req, key) is not None
    async with attach.unsent_forgotten(convo.stored_now):
        if not retry:  # (a retry's tool results answered calls its own run has since made history of)
            await resolve_files(convo, req.user.user_id, agent_id)
            await check_clash(agent_id, asked.tools)
            if where.named and convo.tool_results:
                await _check_results(req, where, convo)
        request = run_request(asked, convo, model, stateless=not where.named)
        send = runs.HttpSend(agent_id, convo.message, request, body, convo.attachments)
        admitted = await runs.start(req, send, where, key)
    who = Identity.of(admitted.run, asked.model)
    follower = runs.follower(req, admitted)
    if asked.stream:
        events = _stream(follower, who, asked.include_usage)
        return EventStream(events, headers=admitted.headers, ending=_error_end)
    return await _whole(follower, who, admitted.headers)


async def _check_results(req: Request, where: runs.Target, convo: Conversation) -> None:
    """A named session's tool results must answer calls its runs handed to the client."""
    handed = await db_read(gateway_reads.client_call_ids, req.user.user_id, where.key)
    for result in convo.tool_results:
        if result.call_id not in handed:
            raise unknown_call(result.call_id, convo.result_params[result.call_id])


async def _whole(follower: Follower, who: Identity, headers: dict[str, str]) -> JsonAnswer:
    """The answer once the run has ended; its error if it did not complete. (Any error raised here
    is answered with the run's headers, and the run left as by a client that went: `app`.)"""
    ended: Ended | None = None
    async for update in follower.updates():  # (they stop after the end)
        if isinstance(update, Ended):
            ended = update
    if ended is None:
        raise ApiError(500, "the run could not be followed to its end", code="internal_error")
    return _ended(ended, who, headers)


def _ended(update: Ended, who: Identity, headers: dict[str, str]) -> JsonAnswer:
    """The whole answer of an ended run, or its error (raised)."""
    error = answers.run_error(update.run)
    if error is not None or update.run is None:
        assert error is not None
        raise error
    return JsonAnswer(answers.completion(update.run, list(update.calls), who), headers=headers)


async def _stream(follower: Follower, who: Identity, include_usage: bool) -> AsyncIterator[SseEvent]:
    """The stream's events; an error raised here ends it (`_error_end`), or is its answer if nothing was sent."""
    started = False  # the role chunk sent: nothing shows before the run runs (queued, dispatching)
    async for update in follower.updates():
        if isinstance(update, Status) and update.run.state != RunState.RUNNING:
            continue
        if not started:
            if isinstance(update, Ended) and not (update.run is not None and update.run.reply):
                error = answers.run_error(update.run)
                if error is not None:  # nothing was sent: the answer is the error's status, not a stream
                    raise error
            started = True
            yield SseEvent(answers.chunk(who, {"role": "assistant", "content": ""}))
        if isinstance(update, Text):
            yield SseEvent(answers.chunk(who, {"content": update.delta}))
        elif isinstance(update, Ended):
            for event in _ending(update, who, include_usage):
                yield event


def _error_end(error: ApiError, last: SseEvent | None) -> list[SseEvent]:
    """How a stream that cannot go on ends: the error object, then `[DONE]` (never `[DONE]` alone)."""
    return [SseEvent(error.body()), DONE]


def _ending(update: Ended, who: Identity, include_usage: bool) -> list[SseEvent]:
    """The stream's one end: finish_reason (and usage) or the error object; then `[DONE]`."""
    run = update.run
    error = answers.run_error(run)
    if error is not None or run is None:
        return [SseEvent({"error": error.error_object() if error else {}}), DONE]
    events = [SseEvent(chunk) for chunk in answers.ending_chunks(run, list(update.calls), who)]
    if include_usage:
        events.append(SseEvent(answers.usage_chunk(who, run)))
    return [*events, DONE]
