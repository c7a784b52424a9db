"""Approvals of tool calls (TOOLS.md §13.5): `plugin.approval.list` and `plugin.approval.resolve`.

Scope `operator.approvals`, for one's own approvals; staff (`operator.admin`) may see and
answer anyone's. Another user's approval is NOT_FOUND, exactly like an unknown id.
"""

from __future__ import annotations

from typing import Any

from chat.methods.handlers import Conn, Reply, call, method
from chat.protocol import frames, wire
from chat.protocol.frames import Scope
from chat.runtime.db import db_read
from sessions_app import gateway_reads
from sessions_app.lifecycle import tools
from sessions_app.models import ToolApproval


def _requests(approvals: list[ToolApproval]) -> list[dict[str, Any]]:
    return [wire.approval_request(a, a.tool_call, a.tool_call.run, a.tool_call.run.session.key) for a in approvals]


def _pending(user_id: int | None) -> list[dict[str, Any]]:
    return _requests(gateway_reads.pending_approvals(user_id=user_id))


@method("plugin.approval.list", scope=Scope.APPROVALS)
async def approval_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """The caller's pending approvals, as an array (as OpenClaw answers it)."""
    return Reply(await db_read(_pending, None if conn.state.is_admin else conn.state.user_id))


def _resolved(approval: ToolApproval) -> dict[str, Any]:
    call_ = approval.tool_call
    return wire.approval_resolved(approval, call_, call_.run, call_.run.session.key)


@method("plugin.approval.resolve", scope=Scope.APPROVALS)
async def approval_resolve(conn: Conn, params: dict[str, Any]) -> Reply:
    """Record a decision; the first wins, and a repeat (or a late one) gets the recorded decision back."""
    approval_id, decision = frames.parse_approval_resolve(params)
    state = conn.state
    approval = await call(
        tools.resolve_approval,
        approval_id,
        decision=decision,
        user_id=state.user_id,
        user_name=state.username,
        staff=state.is_admin,
    )
    return Reply(await db_read(_resolved, approval))
