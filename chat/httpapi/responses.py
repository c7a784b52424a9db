"""The Responses API (HTTP-API.md §14.5): `POST /v1/responses` and a response's retrieve, resume,
cancel, delete and input items.

A request becomes a run the way every HTTP request does (`chat.httpapi.runs`: its session, its
Idempotency-Key, the disconnect rules), and its response row is written in the transaction that
admits the run. The response is then derived from the run (`response_events`) and followed as it
goes (`response_stream`). A background response's run outlives its connection; a request that
answers an approval (`mcp_approval_response` with `previous_response_id`) resolves it through the
approvals lifecycle (the first decision wins) and answers with the same response, continuing.
"""

from __future__ import annotations

from typing import Any

from chat.base.db import db_read, db_write
from chat.httpapi import runs
from chat.httpapi.auth import require
from chat.httpapi.client_tools import check_clash
from chat.httpapi.conversation import (
    Conversation,
    read_messages,
    resolve_files,
    run_request,
    unknown_call,
)
from chat.httpapi.errors import ApiError, bad_request, from_protocol
from chat.httpapi.follow import Follower
from chat.httpapi.http import Answer, JsonAnswer, Request
from chat.httpapi.models import agent_of, backend_model
from chat.httpapi.response_events import timeline
from chat.httpapi.response_request import ResponsesAsk, parse_responses, renamed
from chat.httpapi.response_stream import reread, settled, streamed
from chat.httpapi.routes import route
from chat.methods.registry import call
from chat.methods.send import attach
from chat.protocol.errors import ProtocolError
from chat.protocol.keys import canonical_key
from chat.runtime.gateway import runtime
from sessions_app import gateway_reads, response_reads
from sessions_app.lifecycle import responses, sessions, toolcalls
from sessions_app.models import OPEN_STATES, ApprovalDecision, KeyScope, SessionKind
from sessions_app.response_reads import ResponseRecord

RESPONSE = r"^/v1/responses/(?P<response_id>[^/]+)"
CANCEL_STOP_REASON = "cancel"  # the stopReason of a run whose response was cancelled
PAGE_LIMIT = 100


def not_found(response_id: str, param: str | None = None) -> ApiError:
    """The same 404 for an unknown, another user's, a deleted and a `store: false` response."""
    return ApiError(404, f"no response with id {response_id!r}", param=param, code="response_not_found")


def record_headers(record: ResponseRecord) -> dict[str, str]:
    return {"x-agentgate-run-id": record.run.run_id, "x-agentgate-session-key": record.run.session_key}


async def _find(req: Request, response_id: str, param: str | None = None) -> ResponseRecord:
    record = await db_read(response_reads.find, req.user.user_id, response_id)
    if record is None:
        raise not_found(response_id, param)
    return record


def _follower(req: Request, record: ResponseRecord) -> Follower:
    """A follower of a response's run for a request that did not admit it (a resume, an approval)."""
    caller = req.user
    return Follower(caller.user_id, record.run.pk, token_hash=caller.token_hash)


# --- POST /v1/responses ------------------------------------------------------------------------


@route("POST", r"^/v1/responses$")
async def create_response(req: Request) -> Answer:
    body = req.json()
    ask = parse_responses(body)
    agent_id = agent_of(ask.model)
    if ask.approvals:
        return await _answer_approvals(req, ask, agent_id)
    model = backend_model(req, agent_id)
    key = runs.idempotency_key(req)
    # a retry under its key is answered from its run, even if what it continued is gone since
    taken = await runs.key_taken(req, key)
    retry = taken is not None
    previous = None
    if taken is not None and ask.previous_response_id:
        where = runs.Target(taken, agent_id, SessionKind.DIRECT)  # the continued session, as `_target` finds it
    else:
        if ask.previous_response_id:
            previous = await _find(req, ask.previous_response_id, "previous_response_id")
        where = _target(req, ask, agent_id, key, previous)
    try:
        convo = read_messages(ask.messages, named=where.named, agent_id=agent_id)
    except ApiError as error:
        raise renamed(error, ask.sources) from None
    async with attach.unsent_forgotten(convo.stored_now):
        admitted = await _admit(req, ask, agent_id, model, key, where, previous, convo, body, retry=retry)
    record = await db_read(response_reads.of_run, admitted.run.pk)
    if record is None:  # a retry under the key of a response forgotten since
        raise ApiError(404, "the response of this Idempotency-Key was deleted", code="response_not_found")
    headers = admitted.headers
    if ask.background and not ask.stream:
        return JsonAnswer(timeline(record).response, headers=headers)
    follower = runs.follower(req, admitted)
    if ask.stream:
        return streamed(record, follower, headers)
    return JsonAnswer((await settled(record, follower)).response, headers=headers)


async def _admit(
    req: Request,
    ask: ResponsesAsk,
    agent_id: str,
    model: str,
    key: str | None,
    where: runs.Target,
    previous: ResponseRecord | None,
    convo: Conversation,
    body: dict[str, Any],
    *,
    retry: bool,
) -> runs.Admitted:
    """The request's files resolved and its tools and results checked (not for a `retry` under its
    key: its run answers it), then its run admitted."""
    if not retry:
        try:
            await resolve_files(convo, req.user.user_id, agent_id)
        except ApiError as error:
            raise renamed(error, ask.sources) from None
        await _check_tools(agent_id, ask)
        if where.named and convo.tool_results:
            await _check_results(req, where, convo, ask)
    spec = responses.ResponseSpec(
        owner_id=req.user.user_id,
        model=ask.model,
        store=ask.store,
        background=ask.background,
        previous_response_id=ask.previous_response_id,
        input_items=ask.items,
        metadata=ask.metadata,
    )
    send = runs.HttpSend(
        agent_id,
        convo.message,
        run_request(
            ask,
            convo,
            model,
            stateless=not where.named,
            instructions=[ask.instructions] if ask.instructions.strip() else None,
        ),
        body,
        convo.attachments,
        on_admitted=responses.recorder(spec),
        follows=await db_read(gateway_reads.reply_of, previous.run.pk) if previous is not None else None,
    )
    # a background response's run goes on whatever its client does (no disconnect rules)
    return await runs.start(req, send, where, key, watch=not ask.background)


def _target(
    req: Request, ask: ResponsesAsk, agent_id: str, key: str | None, previous: ResponseRecord | None
) -> runs.Target:
    """The session: the previous response's, a named one, or the request's own."""
    if previous is None:
        return runs.target(req, agent_id, key=key, conversation=ask.conversation)
    if req.header(*runs.SESSION_HEADERS) is not None:
        raise bad_request(
            "previous_response_id continues that response's session: leave out x-agentgate-session-key",
            "previous_response_id",
        )
    _check_agent(previous, agent_id)
    return runs.Target(previous.run.session_key, agent_id, SessionKind.DIRECT)


def _check_agent(previous: ResponseRecord, agent_id: str) -> None:
    """A response is continued, or its approvals answered, with a `model` of its own agent."""
    _key, owner_agent = canonical_key(previous.run.session_key, field="previous_response_id")
    if owner_agent != agent_id:
        raise bad_request(
            f"the previous response is of agent {owner_agent!r}, not of the model's agent {agent_id!r}", "model"
        )


async def _check_tools(agent_id: str, ask: ResponsesAsk) -> None:
    try:
        await check_clash(agent_id, ask.tools)
    except ApiError as error:
        error.param = (error.param or "tools").replace(".function", "")
        raise


async def _check_results(req: Request, where: runs.Target, convo: Conversation, ask: ResponsesAsk) -> None:
    """Results sent to a named session (or a chain) must answer calls its runs handed to the client."""
    handed = await db_read(gateway_reads.client_call_ids, req.user.user_id, where.key)
    for result in convo.tool_results:
        if result.call_id not in handed:
            raise renamed(unknown_call(result.call_id, convo.result_params[result.call_id]), ask.sources)


async def _answer_approvals(req: Request, ask: ResponsesAsk, agent_id: str) -> Answer:
    """Resolve the approvals the input answers (the first decision wins), then answer with the response
    that asked for them, continuing."""
    require(req.user, KeyScope.APPROVALS)
    if not ask.previous_response_id:
        raise bad_request(
            "an mcp_approval_response answers the response that asked: send its id as previous_response_id",
            "previous_response_id",
        )
    if ask.messages:
        raise bad_request("send mcp_approval_response items alone; new input goes in a request of its own", "input")
    record = await _find(req, ask.previous_response_id, "previous_response_id")
    _check_agent(record, agent_id)
    asked = {c.approval_id for c in record.run.calls if c.approval_id}
    for answer in ask.approvals:
        if answer.approval_id not in asked:
            raise bad_request(
                f"approval {answer.approval_id!r} is not one this response asked for",
                f"{answer.param}.approval_request_id",
                "unknown_approval_request",
            )
    caller = req.user
    for answer in ask.approvals:
        try:
            await call(
                toolcalls.resolve_approval,
                answer.approval_id,
                decision=ApprovalDecision.ALLOW_ONCE if answer.approve else ApprovalDecision.DENY,
                user_id=caller.user_id,
                user_name=caller.username,
            )
        except ProtocolError as exc:
            raise from_protocol(exc, param=f"{answer.param}.approval_request_id") from exc
    await runtime.ensure_started()
    record = await reread(record)
    follower = _follower(req, record)
    if ask.stream:
        return streamed(record, follower, record_headers(record))
    return JsonAnswer((await settled(record, follower)).response, headers=record_headers(record))


# --- a response by id ----------------------------------------------------------------------------


def _flag(req: Request, name: str) -> bool:
    value = req.query.get(name)
    if value is None or value in ("false", "0", ""):
        return False
    if value in ("true", "1"):
        return True
    raise bad_request(f"{name} must be true or false", name)


def _starting_after(req: Request) -> int:
    value = req.query.get("starting_after")
    if value is None or value == "":
        return -1
    if not value.lstrip("-").isdigit() or int(value) < -1 or len(value) > 12:
        raise bad_request("starting_after must be a sequence number (an integer from -1)", "starting_after")
    return int(value)


@route("GET", RESPONSE + "$")
async def retrieve_response(req: Request, response_id: str) -> Answer:
    """The response now; with `stream=true`, its events after `starting_after`, then the live ones."""
    stream, after = _flag(req, "stream"), _starting_after(req)
    record = await _find(req, response_id)
    now = timeline(record)
    if not stream:
        return JsonAnswer(now.response, headers=record_headers(record))
    if now.ended and after >= len(now.events):  # after its last event, the terminal is sent again; past it, none
        raise bad_request(f"the response ended with event {len(now.events) - 1}: no event follows", "starting_after")
    await runtime.ensure_started()
    return streamed(record, _follower(req, record), record_headers(record), after)


@route("POST", RESPONSE + "/cancel$")
async def cancel_response(req: Request, response_id: str) -> Answer:
    """Abort a background response's run through the lifecycle; an ended one is answered as it is. Only
    background responses are cancelled (as OpenAI's): another's run ends with its request."""
    record = await _find(req, response_id)
    if not record.background:
        raise bad_request(
            "only a background response can be cancelled: close its request, or chat.abort its run",
            code="not_background",
        )
    if record.run.state in OPEN_STATES:
        await runtime.ensure_started()
        try:
            await call(
                sessions.abort,
                owner_id=req.user.user_id,
                key=record.run.session_key,
                run_id=record.run.run_id,
                owner_process=runtime.owner_for_new_runs(),
                stop_reason=CANCEL_STOP_REASON,
            )
        except ProtocolError as exc:
            raise from_protocol(exc) from exc
        record = await reread(record)
    return JsonAnswer(timeline(record).response, headers=record_headers(record))


@route("DELETE", RESPONSE + "$")
async def delete_response(req: Request, response_id: str) -> Answer:
    """Forget the response (its run and the session's transcript stay)."""
    if not await db_write(responses.forget, owner_id=req.user.user_id, response_id=response_id, urgent=True):
        raise not_found(response_id)
    return JsonAnswer({"id": response_id, "object": "response", "deleted": True})


def _page(items: list[dict[str, Any]], req: Request) -> dict[str, Any]:
    """One page of input items (`order`, `limit`, `after`), as OpenAI lists them."""
    order = req.query.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise bad_request("order must be asc or desc", "order")
    raw = req.query.get("limit") or "20"
    if not raw.isdigit() or not 1 <= int(raw) <= PAGE_LIMIT:
        raise bad_request(f"limit must be an integer from 1 to {PAGE_LIMIT}", "limit")
    ordered = items if order == "asc" else list(reversed(items))
    start = 0
    after = req.query.get("after")
    if after:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise bad_request(f"after names no input item of this response: {after!r}", "after")
        start = ids.index(after) + 1
    page = ordered[start : start + int(raw)]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + len(page) < len(ordered),
    }


@route("GET", RESPONSE + "/input_items$")
async def list_input_items(req: Request, response_id: str) -> Answer:
    items = await db_read(response_reads.input_items, req.user.user_id, response_id)
    if items is None:
        raise not_found(response_id)
    return JsonAnswer(_page(items, req))
