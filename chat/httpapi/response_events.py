"""A response's object and its stream of events, derived from its run as stored (HTTP-API.md §14.5).

`timeline(record)` is a pure function of the stored run: its state, reply, marks (the reply's length
after each stored delta), usage, error, stop reason and tool calls with their approvals. Its events
are prefix-stable: the events of an earlier snapshot of a run are a prefix of those of any later one,
so a live stream, a resumed one (`starting_after=N`) and a replay send the same events with the same
sequence numbers, and nothing about them needs storing beyond the run itself.

What keeps it so: the walk through the run stops at the first thing that may still change.
- Text goes out cut at the marks, and only up to the last mark until the run ends (then the rest
  of the stored reply is one last delta): a mark never moves, and later text only adds marks.
- A tool call goes out once the text before it (its `reply_offset`) has, and each event of a call
  says only what is settled: `output_item.added` once the call has run or ended, its end once it has
  ended. A call still waiting stops the walk (what comes after it waits for it), so the calls' events
  never interleave differently in a later snapshot.
- An approval's `mcp_approval_request` item goes out as soon as it is asked for, and stays in the
  output (a record of the question) after it is answered.
- Every event's contents are what was settled when it was first sent: `response.created` and
  `response.queued` carry the response as it starts (queued, no output), `response.in_progress` once
  the run left the queue; the one terminal event carries the final object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sessions_app.models import TERMINAL_STATES, RunState, ToolCallState
from sessions_app.response_reads import CallView, ResponseRecord, RunView

# Run stop reasons that make a `done` run `incomplete`, with OpenAI's reason for each.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "max_tokens": "max_output_tokens", "tool_limit": "max_tool_calls"}
# A call's terminal state -> its OpenAI `mcp_call` status (the exact state goes in `state`).
MCP_STATUS: dict[str, str] = {
    ToolCallState.SUCCEEDED: "completed",
    ToolCallState.FAILED: "failed",
    ToolCallState.DENIED: "failed",
    ToolCallState.EXPIRED: "failed",
    ToolCallState.CANCELLED: "failed",
    ToolCallState.UNKNOWN: "incomplete",
}
# A response's terminal status -> the one event that ends its stream.
TERMINAL_EVENTS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.cancelled",
}


@dataclass
class Timeline:
    """The response now (`response`) and every event of its stream so far, numbered from 0."""

    response: dict[str, Any]
    events: list[dict[str, Any]]
    waiting: bool = False  # a call waits for its approval (the output holds the request)

    @property
    def ended(self) -> bool:
        return self.response["status"] in TERMINAL_EVENTS


def status_of(run: RunView) -> str:
    """The response's status, from its run and never ahead of it."""
    if run.state == RunState.QUEUED:
        return "queued"
    if run.state not in TERMINAL_STATES:
        return "in_progress"
    if run.state == RunState.DONE:
        return "incomplete" if run.stop_reason in INCOMPLETE_REASONS else "completed"
    if run.state == RunState.KILLED:
        return "cancelled"
    return "failed"


def _error(run: RunView, status: str) -> dict[str, Any] | None:
    if status == "failed":
        return {"code": run.error_kind or "unknown", "message": run.error_message or f"the run ended {run.state}"}
    if status == "cancelled":
        why = run.stop_reason or "abort"
        return {"code": "run_aborted", "message": f"the run was aborted (stopReason: {why})", "stop_reason": why}
    return None


def _usage(run: RunView) -> dict[str, Any] | None:
    if run.state not in TERMINAL_STATES:
        return None
    given, made = run.prompt_tokens or 0, run.completion_tokens or 0
    return {
        "input_tokens": given,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": made,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": given + made,
    }


def _tools(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": t.get("name", ""),
            "description": t.get("description") or None,
            "parameters": t.get("parameters") or {},
            "strict": False,
        }
        for t in request.get("client_tools") or []
    ]


def _tool_choice(request: dict[str, Any]) -> Any:
    choice = request.get("tool_choice") or "auto"
    if isinstance(choice, dict):
        return {"type": "function", "name": choice.get("name", "")}
    return choice


def response_object(
    record: ResponseRecord,
    status: str,
    output: list[dict[str, Any]],
    *,
    error: dict[str, Any] | None = None,
    incomplete: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object of §14.5 (OpenAI's fields) in the given state."""
    request = record.run.request
    params = request.get("params") or {}
    instructions = "\n\n".join(request.get("instructions") or [])
    return {
        "id": record.response_id,
        "object": "response",
        "created_at": record.created_at,
        "status": status,
        "background": record.background,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": instructions or None,
        "max_output_tokens": params.get("max_tokens"),
        "metadata": record.metadata,
        "model": record.model,
        "output": output,
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "previous_response_id": record.previous_response_id or None,
        "reasoning": {"effort": request.get("reasoning_effort") or None, "summary": None},
        "store": record.store,
        "temperature": params.get("temperature"),
        "text": {"format": {"type": "text"}},
        "tool_choice": _tool_choice(request),
        "tools": _tools(request),
        "top_p": params.get("top_p"),
        "truncation": "disabled",
        "usage": usage,
        "user": request.get("user") or None,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


@dataclass
class _Walk:
    """Builds the events and output items of one snapshot, in order."""

    record: ResponseRecord
    events: list[dict[str, Any]] = field(default_factory=list)
    items: list[dict[str, Any]] = field(default_factory=list)  # by output_index, as they are now
    message: int | None = None  # the output_index of the open message item
    message_start: int = 0  # where in the reply its text starts
    pos: int = 0  # how much of the reply has been sent

    @property
    def run(self) -> RunView:
        return self.record.run

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, "sequence_number": len(self.events), **fields})

    def add_item(self, item: dict[str, Any]) -> int:
        index = len(self.items)
        self.items.append(item)
        self.emit("response.output_item.added", output_index=index, item=dict(item))
        return index

    def done_item(self, index: int, item: dict[str, Any]) -> None:
        self.items[index] = item
        self.emit("response.output_item.done", output_index=index, item=dict(item))

    # --- text ------------------------------------------------------------------------------

    def text_to(self, end: int, cuts: list[int]) -> None:
        """Send the reply up to `end`, one delta per mark passed and one ending at `end`."""
        for cut in [*(c for c in cuts if self.pos < c < end), end]:
            if cut <= self.pos:
                continue
            index = self._open_message()
            delta, self.pos = self.run.reply[self.pos : cut], cut
            where = {"item_id": self.items[index]["id"], "output_index": index, "content_index": 0}
            self.emit("response.output_text.delta", **where, delta=delta, logprobs=[])

    def _open_message(self) -> int:
        if self.message is None:
            item_id = f"msg_{self.record.response_id.removeprefix('resp_')}_{len(self.items)}"
            index = self.add_item(
                {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []}
            )
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            self.emit("response.content_part.added", **where, part=_text_part(""))
            self.message, self.message_start = index, self.pos
        return self.message

    def message_now(self) -> None:
        """The open message item as it is so far (the response of a run still going)."""
        if self.message is not None:
            text = self.run.reply[self.message_start : self.pos]
            self.items[self.message] = {**self.items[self.message], "content": [_text_part(text)]}

    def close_message(self, status: str = "completed") -> None:
        if self.message is None:
            return
        index, self.message = self.message, None
        item = self.items[index]
        text = self.run.reply[self.message_start : self.pos]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        self.emit("response.output_text.done", **where, text=text, logprobs=[])
        self.emit("response.content_part.done", **where, part=_text_part(text))
        self.done_item(index, {**item, "status": status, "content": [_text_part(text)]})

    # --- tool calls ------------------------------------------------------------------------

    def call(self, call: CallView, ended_run: bool) -> bool:
        """Send what is settled of one call; False when the walk must wait for it."""
        if call.state == ToolCallState.CLIENT:
            self._function_call(call)
            return True
        if call.approval_id:
            self.emit_approval(call)
            if call.approval_pending and not ended_run:
                return False
        if call.state in (ToolCallState.PENDING, ToolCallState.PENDING_APPROVAL) and not ended_run:
            return False  # not started, not ended: nothing about it is settled yet
        item = {
            "id": call.call_id,
            "type": "mcp_call",
            "server_label": call.server,
            "name": call.tool,
            "arguments": call.arguments,
            "approval_request_id": call.approval_id or None,
            "output": None,
            "error": None,
            "status": "calling",
            "state": ToolCallState.RUNNING if call.started else ToolCallState.PENDING,
        }
        index = self.add_item(item)
        where = {"item_id": call.call_id, "output_index": index}
        if call.started:
            self.emit("response.mcp_call.in_progress", **where)
        if call.state == ToolCallState.RUNNING and not ended_run:
            return False
        status = MCP_STATUS.get(call.state, "incomplete")  # (open at the run's end: a database to repair)
        failed = status != "completed"
        self.emit("response.mcp_call.failed" if failed else "response.mcp_call.completed", **where)
        final = {
            **item,
            "status": status,
            "state": call.state,
            "output": None if failed else call.result,
            "error": _call_error(call) if failed else None,
        }
        if call.error_kind:
            final["error_kind"] = call.error_kind
        self.done_item(index, final)
        return True

    def emit_approval(self, call: CallView) -> None:
        item = {
            "id": call.approval_id,
            "type": "mcp_approval_request",
            "server_label": call.server,
            "name": call.tool,
            "arguments": call.arguments,
        }
        index = self.add_item(item)
        self.done_item(index, dict(item))

    def _function_call(self, call: CallView) -> None:
        item = {
            "id": f"fc_{call.call_id.removeprefix('tc_')}",
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.tool,
            "arguments": "",
            "status": "in_progress",
        }
        index = self.add_item(item)
        where = {"item_id": item["id"], "output_index": index}
        self.emit("response.function_call_arguments.delta", **where, delta=call.arguments)
        self.emit("response.function_call_arguments.done", **where, arguments=call.arguments, name=call.tool)
        self.done_item(index, {**item, "arguments": call.arguments, "status": "completed"})


def _call_error(call: CallView) -> dict[str, Any]:
    """A call's failure as OpenAI's `mcp_tool_execution_error`, its text what the model was told."""
    text = call.result or f"the call ended {call.state}"
    return {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": text}]}


def _cuts(run: RunView) -> list[int]:
    """The marks that cut the stored reply, in order (a mark past the reply is not trusted)."""
    size = len(run.reply)
    return sorted({m for m in run.marks if 0 < m <= size})


def _walk_body(walk: _Walk, ended: bool) -> None:
    """Text and calls, in the order they came, as far as they are settled."""
    run = walk.run
    cuts = _cuts(run)
    text_end = len(run.reply) if ended else (cuts[-1] if cuts else 0)
    for call in sorted(run.calls, key=lambda c: c.seq):
        offset = max(call.reply_offset, walk.pos)
        if ended:
            offset = min(offset, text_end)  # text yielded but never stored (an abort): the call follows what was
        if offset > text_end:
            walk.text_to(text_end, cuts)  # the text before this call is not all stored yet
            return
        walk.text_to(offset, cuts)
        walk.close_message()
        if not walk.call(call, ended):
            return
    walk.text_to(text_end, cuts)


def timeline(record: ResponseRecord) -> Timeline:
    """The response now and the events of its stream so far (see the module's docstring)."""
    run = record.run
    status = status_of(run)
    ended = status in TERMINAL_EVENTS
    walk = _Walk(record)
    walk.emit("response.created", response=response_object(record, "queued", []))
    walk.emit("response.queued", response=response_object(record, "queued", []))
    if run.dispatched:
        walk.emit("response.in_progress", response=response_object(record, "in_progress", []))
        _walk_body(walk, ended)
    if not ended:
        walk.message_now()
        waiting = any(c.approval_pending for c in run.calls)
        return Timeline(response_object(record, status, [dict(i) for i in walk.items]), walk.events, waiting)
    walk.close_message("completed" if run.state == RunState.DONE else "incomplete")
    reason = INCOMPLETE_REASONS.get(run.stop_reason) if status == "incomplete" else None
    final = response_object(
        record,
        status,
        [dict(i) for i in walk.items],
        error=_error(run, status),
        incomplete={"reason": reason} if reason else None,
        usage=_usage(run),
    )
    walk.emit(TERMINAL_EVENTS[status], response=final)
    return Timeline(final, walk.events)
