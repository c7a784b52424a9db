"""Approvals of tool calls (TOOLS.md §13.5): `plugin.approval.list` and `plugin.approval.resolve`."""

from __future__ import annotations

import re
from typing import Any

from chat.base.db import db_read
from chat.methods.registry import Conn, Reply, call, method
from chat.protocol import tool_events
from chat.protocol.errors import ProtocolError, invalid
from chat.protocol.fields import get_str
from chat.protocol.scopes import Scope
from sessions_app import gateway_reads
from sessions_app.lifecycle import toolcalls
from sessions_app.models import ToolApproval

APPROVAL_ID_RE = re.compile(r"ap_[0-9a-f]{24}")
APPROVAL_DECISIONS = ("allow-once", "deny")


def parse_approval_resolve(params: dict[str, Any]) -> tuple[str, str]:
    """`plugin.approval.resolve {id, decision}` (TOOLS.md §13.5): the approval id and the decision."""
    approval_id = get_str(params, "id", max_len=64)
    assert approval_id is not None
    if not APPROVAL_ID_RE.fullmatch(approval_id):
        raise ProtocolError("NOT_FOUND", "approval not found")  # no such id can exist: as for another user's
    decision = get_str(params, "decision", max_len=32)
    if decision not in APPROVAL_DECISIONS:
        raise invalid("decision must be allow-once or deny", field="decision")
    return approval_id, decision


def _requests(approvals: list[ToolApproval]) -> list[dict[str, Any]]:
    return [
        tool_events.approval_request(a, a.tool_call, a.tool_call.run, a.tool_call.run.session.key) for a in approvals
    ]


def _pending(user_id: int | None) -> list[dict[str, Any]]:
    return _requests(gateway_reads.pending_approvals(user_id=user_id))


@method("plugin.approval.list", scope=Scope.APPROVALS)
async def approval_list(conn: Conn, params: dict[str, Any]) -> Reply:
    """The caller's pending approvals, as an array (as OpenClaw answers it)."""
    return Reply(await db_read(_pending, None if conn.state.is_admin else conn.state.user_id))


def _resolved(approval: ToolApproval) -> dict[str, Any]:
    call_ = approval.tool_call
    return tool_events.approval_resolved(approval, call_, call_.run, call_.run.session.key)


@method("plugin.approval.resolve", scope=Scope.APPROVALS)
async def approval_resolve(conn: Conn, params: dict[str, Any]) -> Reply:
    """Record a decision; the first wins, and a repeat (or a late one) gets the recorded decision back."""
    approval_id, decision = parse_approval_resolve(params)
    state = conn.state
    approval = await call(
        toolcalls.resolve_approval,
        approval_id,
        decision=decision,
        user_id=state.user_id,
        user_name=state.username,
        staff=state.is_admin,
    )
    return Reply(await db_read(_resolved, approval))
