"""Reads of the Responses API (HTTP-API.md §14.5): a caller's response by id, and the run behind it
as plain data (its state, text, marks and tool calls with their approvals), in two statements at most.

A response is found only by its owner, and only while it is stored: another user's, a deleted or
a `store: false` response reads as missing (the API answers 404 for each, so ids do not leak).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from django.db.models import QuerySet

from sessions_app.models import ApiResponse, ApprovalDecision, Run, ToolApproval, ToolCall


@dataclass(frozen=True)
class CallView:
    """One tool call of the run, with its approval (if it needed one)."""

    call_id: str
    seq: int
    server: str
    tool: str
    arguments: str
    state: str
    result: str = ""
    is_error: bool = False
    error_kind: str = ""
    reply_offset: int = 0
    started: bool = False  # it reached `running` (a call that never ran ends without it)
    approval_id: str = ""
    approval_decision: str = ""  # "" while its approval waits

    @property
    def approval_pending(self) -> bool:
        return bool(self.approval_id) and not self.approval_decision

    @property
    def approved(self) -> bool:
        return self.approval_decision == ApprovalDecision.ALLOW_ONCE


@dataclass(frozen=True)
class RunView:
    """What the response is derived from: the run as stored, and its calls in order."""

    pk: int
    run_id: str
    session_key: str
    state: str
    reply: str = ""
    marks: tuple[int, ...] = ()  # the reply's length after each stored delta
    dispatched: bool = False  # it left the queue (it has a `dispatched_at`)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error_kind: str = ""
    error_message: str = ""
    stop_reason: str = ""
    calls: tuple[CallView, ...] = ()
    request: dict[str, Any] = field(default_factory=dict)  # RunRequest.as_json(), {} for none


@dataclass(frozen=True)
class ResponseRecord:
    """A response row with its run."""

    pk: int
    response_id: str
    owner_id: int
    model: str
    store: bool
    background: bool
    previous_response_id: str
    input_items: list[dict[str, Any]]
    metadata: dict[str, Any]
    created_at: int  # seconds since the epoch, as OpenAI gives it
    run: RunView


def _responses() -> QuerySet[ApiResponse]:
    return ApiResponse.objects.select_related("run__session").defer("run__message", "run__attachments")


def _calls(run: Run) -> tuple[CallView, ...]:
    if not run.tool_calls:  # the run's own count: no statement for a run without calls
        return ()
    rows = ToolCall.objects.filter(run_id=run.pk).select_related("approval").order_by("seq")
    return tuple(_call_view(c) for c in rows)


def _call_view(call: ToolCall) -> CallView:
    try:
        approval: ToolApproval | None = call.approval
    except ToolApproval.DoesNotExist:
        approval = None
    return CallView(
        call_id=call.call_id,
        seq=call.seq,
        server=call.server,
        tool=call.tool,
        arguments=call.arguments,
        state=call.state,
        result=call.result,
        is_error=call.is_error,
        error_kind=call.error_kind,
        reply_offset=call.reply_offset,
        started=call.started_at is not None,
        approval_id=approval.approval_id if approval is not None else "",
        approval_decision=approval.decision if approval is not None else "",
    )


def run_view(run: Run, session_key: str) -> RunView:
    """The run (its session's key given) and its calls, as plain data."""
    return RunView(
        pk=run.pk,
        run_id=run.run_id,
        session_key=session_key,
        state=run.state,
        reply=run.reply,
        marks=tuple(int(m) for m in (run.marks or [])),
        dispatched=run.dispatched_at is not None,
        prompt_tokens=run.prompt_tokens,
        completion_tokens=run.completion_tokens,
        error_kind=run.error_kind,
        error_message=run.error_message,
        stop_reason=run.stop_reason,
        calls=_calls(run),
        request=dict(run.request or {}),
    )


def _record(row: ApiResponse) -> ResponseRecord:
    return ResponseRecord(
        pk=row.pk,
        response_id=row.response_id,
        owner_id=row.owner_id,
        model=row.model,
        store=row.store,
        background=row.background,
        previous_response_id=row.previous_response_id,
        input_items=list(row.input_items or []),
        metadata=dict(row.metadata or {}),
        created_at=int(row.created_at.timestamp()),
        run=run_view(row.run, row.run.session.key),
    )


def find(owner_id: int, response_id: str) -> ResponseRecord | None:
    """The caller's stored response with this id, or None (unknown, another user's, deleted, `store: false`)."""
    row = _responses().filter(response_id=response_id, owner_id=owner_id, store=True).first()
    return None if row is None else _record(row)


def of_run(run_pk: int) -> ResponseRecord | None:
    """The response a run answers (stored or not: the request that made it follows it by its run)."""
    row = _responses().filter(run_id=run_pk).first()
    return None if row is None else _record(row)


def refreshed(record: ResponseRecord) -> ResponseRecord | None:
    """The same response with its run read again (None: the run went with its deleted session). The
    row itself is not read again: a response forgotten meanwhile still follows its run to the end."""
    run = Run.objects.defer("message", "attachments").filter(pk=record.run.pk).first()
    return None if run is None else replace(record, run=run_view(run, record.run.session_key))


def input_items(owner_id: int, response_id: str) -> list[dict[str, Any]] | None:
    """The input items of the caller's stored response, oldest first; None when it is not found."""
    found = (
        ApiResponse.objects.filter(response_id=response_id, owner_id=owner_id, store=True)
        .values_list("input_items", flat=True)
        .first()
    )
    return None if found is None else list(found or [])
