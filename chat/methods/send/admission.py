"""Admission of a validated send, one path for every door (chat.send, sessions.steer, agent,
sessions.create's first message, the HTTP API).
"""

from __future__ import annotations

from django.conf import settings

from chat.base import agents as catalog
from chat.base import metering
from chat.base.db import db_read
from chat.methods.registry import call
from chat.methods.send import attach
from chat.methods.send import params as send_params
from chat.protocol.errors import ProtocolError
from chat.runtime.backends import get_backend
from chat.runtime.gateway import runtime
from chat.runtime.tools.host import setup_error as tool_setup_error
from sessions_app import files, gateway_reads
from sessions_app.lifecycle import runs
from sessions_app.lifecycle.runs import SendOutcome, SendRequest
from sessions_app.models import ChatSession


def refuse_unadmitted(admitted: SendOutcome) -> None:
    """Raise the error of an admission that produced no run of its own: a conflict, a full queue."""
    if admitted.admission == "conflict":
        raise ProtocolError(
            "CONFLICT",
            "idempotencyKey was already used with a different message",
            field="idempotencyKey",
            reason="idempotency-conflict",
        )
    if admitted.admission == "budget":
        raise budget_error(admitted)
    if admitted.admission == "queue_full":
        raise ProtocolError(
            "RATE_LIMITED",
            f"the session queue is full ({settings.GATEWAY_QUEUE_MAX})",
            reason="queue-full",
            retryable=True,
            retry_after_ms=1000,
        )


def budget_error(admitted: SendOutcome) -> ProtocolError:
    """A send refused by a budget (docs/usage.md): nothing admitted; the same key may be sent again
    once the budget allows (HTTP: 429 `insufficient_quota`)."""
    over = admitted.over_budget
    assert over is not None
    resets = over.resets_at.isoformat() if over.resets_at is not None else None
    return ProtocolError(
        "RATE_LIMITED",
        str(over),
        reason="insufficient_quota",
        errorKind="budget",
        budget=over.name,
        resetsAt=resets,
    )


async def admit(owner_id: int, send: send_params.ChatSendParams) -> SendOutcome:
    """Admission of a validated send of this owner (chat.send, sessions.steer, agent, the HTTP API):
    one path for all."""
    if not runtime.accepting:
        raise ProtocolError("UNAVAILABLE", "server is shutting down", retryable=True, retry_after_ms=1000)
    # stored files named by id resolved for this owner, inline images' bytes stored (chat.files.attach)
    stored_now: list[files.StoredNow] = []
    send.attachments = await attach.prepare(owner_id, send.attachments, stored_now)
    async with attach.unsent_forgotten(stored_now):  # a send not admitted keeps none of them
        # A key seen before is answered from what is stored, without a write (§4).
        known = await db_read(_known_send, owner_id, send)
        if isinstance(known, SendOutcome):
            return known
        return await _admit(owner_id, send, known)


def _known_send(owner_id: int, send: send_params.ChatSendParams) -> SendOutcome | ChatSession | None:
    """The admission of a send whose key its session already has (one statement); for a new key, the
    session as that statement read it (admission checks it is still so), or None: no such session."""
    known = gateway_reads.find_run(owner_id, send.key, send.run_id)
    if known is None:
        return None
    if known.run is None:
        return known.session
    return runs.replay_of(known.run, known.session, send.body_hash, lambda: known.queue_position)


async def _admit(owner_id: int, send: send_params.ChatSendParams, seen: ChatSession | None) -> SendOutcome:
    backend = get_backend(send.agent_id)
    setup_error = (
        f"agent {send.agent_id!r} has no usable backend"
        if backend is None
        else backend.check_setup(send.message, send.attachments)
    )
    if setup_error is None and backend is not None and backend.uses_tools(send.message):
        # bad tool settings, or an MCP server that cannot start: a setup failure (TOOLS.md §13.1)
        setup_error = await tool_setup_error(send.agent_id, backend.config)
    request = SendRequest(
        owner_id=owner_id,
        key=send.key,
        agent_id=send.agent_id,
        run_id=send.run_id,
        message=send.message,
        body_hash=send.body_hash,
        timeout_ms=send.timeout_ms,
        attachments=send.attachments,
        queue_mode=send.queue_mode,
        interrupt_reason="interrupt",
        steerable=backend is not None and backend.takes_steering(send.message),
        setup_error=setup_error,
        surface=send.surface,
        request=send.request,
        session_kind=send.session_kind,
        on_admitted=send.on_admitted,
        owner_scoped_key=send.owner_scoped_key,
        seen=seen,
        check_leaf=send.check_leaf,
        expected_leaf=send.expected_leaf,
        regeneration=send.regeneration,
        follows=send.follows,
        estimate=metering.admission_estimate(
            catalog.get(send.agent_id), send.message, send.attachments, send.request, send.api_token_id
        ),
    )
    admitted: SendOutcome = await call(runs.admit_send, request, owner_process=runtime.owner_for_new_runs())
    return admitted
