"""The gateway itself: `health` (§9) and `status` (OpenClaw's gateway status)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings

from chat.base import agents
from chat.base.db import db_read
from chat.methods import session_settings
from chat.methods.registry import Conn, Reply, method
from chat.protocol.frames import now_ms
from chat.protocol.scopes import Scope
from chat.protocol.session_rows import session_rows
from sessions_app import gateway_reads


@method("health", scope=Scope.READ)
async def health(conn: Conn, params: dict[str, Any]) -> Reply:
    # gateway-wide load is for operators; a user sees the runs of their own sessions
    active, queued = await db_read(gateway_reads.open_run_counts, None if conn.state.is_admin else conn.state.user_id)
    return Reply(
        {
            "ok": True,
            "ts": now_ms(),
            "version": settings.GATEWAY_VERSION,
            "activeRuns": active,
            "queuedRuns": queued,
        }
    )


def status_answer(
    *, version: str, active: int, queued: int, total: int, recent: Sequence[dict[str, Any]], defaults: dict[str, Any]
) -> dict[str, Any]:
    """`status` (OpenClaw's gateway status, as its TUI's /gateway-status shows it), for the caller."""
    return {
        "ok": True,
        "ts": now_ms(),
        "runtimeVersion": version,
        "activeRuns": active,
        "queuedRuns": queued,
        "linkChannel": {"label": "Link channel", "linked": False},
        "channelSummary": [f"agentgate {version}: {active} active run(s), {queued} queued"],
        "heartbeat": {"defaultAgentId": agents.DEFAULT_AGENT, "agents": []},
        "queuedSystemEvents": [],
        "sessions": {
            "paths": [],
            "count": total,
            "defaults": defaults,
            "recent": [
                {
                    "key": row["key"],
                    "kind": row["kind"],
                    "age": max(0, now_ms() - row["updatedAt"]) if row.get("updatedAt") else None,
                    "model": row.get("model"),
                    "totalTokens": row.get("totalTokens"),
                    "contextTokens": row.get("contextTokens"),
                    "flags": [],
                }
                for row in recent
            ],
        },
    }


def _status(owner_id: int | None, user_id: int) -> dict[str, Any]:
    active, queued = gateway_reads.open_run_counts(owner_id)
    page = gateway_reads.list_sessions(user_id, limit=10)
    return status_answer(
        version=settings.GATEWAY_VERSION,
        active=active,
        queued=queued,
        total=page.total,
        recent=session_rows(page.sessions, gateway_reads.queues_of(page.sessions)),
        defaults=session_settings.session_defaults(agents.DEFAULT_AGENT),
    )


@method("status", scope=Scope.READ)
async def gateway_status(conn: Conn, params: dict[str, Any]) -> Reply:
    """The gateway's status: version, load (as `health` counts it), the caller's recent sessions."""
    state = conn.state
    return Reply(await db_read(_status, None if state.is_admin else state.user_id, state.user_id))
