"""Tool call and approval events (TOOLS.md §13.3, §13.5): the `agent` stream `tool` and `approval`
data, `plugin.approval.*` payloads.
"""

from __future__ import annotations

import json
from typing import Any

from chat.protocol.frames import ms
from chat.protocol.keys import agent_id_of
from sessions_app.models import (
    Run,
    ToolApproval,
    ToolCall,
)


def tool_args(call: ToolCall) -> Any:
    """A call's arguments as the model sent them: the object, or the text when it is not valid JSON."""
    try:
        return json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        return call.arguments


def tool_content(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text}]


def tool_error_kind(call: ToolCall) -> dict[str, str]:
    """`errorKind` of an ended call that has one (TOOLS.md §13.6), the same in events, history and lists."""
    return {"errorKind": str(call.error_kind)} if call.is_terminal and call.error_kind else {}


def tool_start_data(call: ToolCall) -> dict[str, Any]:
    return {"phase": "start", "name": call.name, "toolCallId": call.call_id, "args": tool_args(call)}


def tool_result_data(call: ToolCall) -> dict[str, Any]:
    data: dict[str, Any] = {
        "phase": "result",
        "name": call.name,
        "toolCallId": call.call_id,
        "isError": call.is_error,
        "status": call.state,
        **tool_error_kind(call),
        "result": {"content": tool_content(call.result)},
    }
    if call.duration_ms is not None:
        data["meta"] = {"durationMs": call.duration_ms}
    return data


def approval_data(approval: ToolApproval, call: ToolCall) -> dict[str, Any]:
    """The `agent` stream `approval` data of an approval's request or resolution."""
    return {
        "phase": "resolved" if approval.decision else "requested",
        "approvalId": approval.approval_id,
        "toolCallId": call.call_id,
        "status": approval.decision or "pending",
    }


def approval_request(approval: ToolApproval, call: ToolCall, run: Run, session_key: str) -> dict[str, Any]:
    """A `plugin.approval.requested` payload (and an item of `plugin.approval.list`)."""
    args = call.arguments if len(call.arguments) <= 2000 else call.arguments[:2000] + "…"
    return {
        "id": approval.approval_id,
        "request": {
            "title": f"Run {call.name}?",
            "description": f"The agent wants to call {call.name} with {args or '{}'}",
            "severity": "warning",
            "toolName": call.name,
            "toolCallId": call.call_id,
            "mcpTool": {"server": call.server, "tool": call.tool},
            "allowedDecisions": ["allow-once", "deny"],
            "agentId": agent_id_of(session_key),
            "sessionKey": session_key,
            "runId": run.run_id,
        },
        "createdAtMs": ms(approval.created_at),
        "expiresAtMs": ms(approval.expires_at),
    }


def approval_resolved(approval: ToolApproval, call: ToolCall, run: Run, session_key: str) -> dict[str, Any]:
    """A `plugin.approval.resolved` payload (and `plugin.approval.resolve`'s answer)."""
    return {
        "id": approval.approval_id,
        "decision": approval.decision,
        "resolvedBy": approval.decided_by,
        "ts": ms(approval.resolved_at),
        "request": approval_request(approval, call, run, session_key)["request"],
    }


def tool_item(call: ToolCall) -> dict[str, Any]:
    """One call of a run still open (`inFlightRun.tools`)."""
    item: dict[str, Any] = {
        "toolCallId": call.call_id,
        "name": call.name,
        "args": tool_args(call),
        "status": call.state,
    }
    if call.is_terminal:
        item["isError"] = call.is_error
        item.update(tool_error_kind(call))
        item["result"] = {"content": tool_content(call.result)}
    return item
