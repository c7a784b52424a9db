"""`usage.status` and `sessions.usage` in OpenClaw's shapes (docs/usage.md), from the gateway's own
usage rows and budgets: the caller's own usage only.

`usage.status` is OpenClaw's provider quota summary: here one provider, the gateway, whose windows are
the caller's budgets (used percent, reset time). `sessions.usage` is its per-session usage summary
with its totals and aggregates; what the gateway does not count (latency, message counts, tools by
name, channels) is empty.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any

from django.utils import timezone

from chat.base.db import db_read
from chat.methods.registry import Conn, Reply, method
from chat.protocol import fields
from chat.protocol.errors import invalid
from chat.protocol.frames import ms
from chat.protocol.scopes import Scope
from sessions_app import usage_reads

DEFAULT_DAYS = 30
PROVIDER = "agentgate"


def _day(params: dict[str, Any], name: str, default: dt.date) -> dt.date:
    value = fields.get_str(params, name, required=False, max_len=10)
    if not value:
        return default
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise invalid(f"{name} must be a date (YYYY-MM-DD)", field=name) from None


def cost_totals(row: dict[str, Any] | None) -> dict[str, Any]:
    """OpenClaw's usage totals (`createEmptyCostUsageTotals`) of one roll-up row."""
    row = row or {}
    cost = row.get("cost")
    return {
        "input": row.get("input") or 0,
        "output": row.get("output") or 0,
        "cacheRead": row.get("cached") or 0,
        "cacheWrite": 0,
        "totalTokens": (row.get("input") or 0) + (row.get("output") or 0),
        "totalCost": (cost or 0) / 1e6,
        "inputCost": 0,
        "outputCost": 0,
        "cacheReadCost": 0,
        "cacheWriteCost": 0,
        "missingCostEntries": 0 if cost is not None else row.get("calls", 0),
    }


def _status(owner_id: int) -> dict[str, Any]:
    windows = []
    for state in usage_reads.budget_states(owner_id):
        window: dict[str, Any] = {"label": str(state.budget), "usedPercent": min(100.0, state.used_fraction * 100)}
        if state.resets_at is not None:
            window["resetAt"] = ms(state.resets_at)
        windows.append(window)
    return {
        "updatedAt": ms(timezone.now()),
        "providers": [{"provider": PROVIDER, "displayName": "Budgets", "windows": windows}] if windows else [],
    }


@method("usage.status", scope=Scope.READ)
async def usage_status(conn: Conn, params: dict[str, Any]) -> Reply:
    return Reply(await db_read(_status, conn.state.user_id))


def _sessions_usage(owner_id: int, start: dt.date, end: dt.date, key: str | None, limit: int) -> dict[str, Any]:
    rows = usage_reads.usage_rows(owner_id, start, end, **({"session_key": key} if key else {}))
    per_session = usage_reads.rollup(rows, "session_pk", "session_key", "agent_id")
    per_session.sort(key=lambda r: (-(r["cost"] or 0), -((r["input"] or 0) + (r["output"] or 0))))
    shown = per_session[:limit]
    # the shown sessions' days and models: a roll-up for all of them each (not a query per session)
    of_shown = rows.filter(session_pk__in=[r["session_pk"] for r in shown])
    daily = _by_session(usage_reads.rollup(of_shown, "session_pk", "day"))
    model_days = _by_session(usage_reads.rollup(of_shown, "session_pk", "model", "agent_id", "day"))
    model_totals = _by_session(usage_reads.rollup(of_shown, "session_pk", "model", "agent_id"))
    stored = usage_reads.sessions_of([r["session_pk"] for r in shown if r["session_pk"] is not None])
    sessions = []
    for row in shown:
        session = stored.get(row["session_pk"])
        mine = model_days[row["session_pk"]]
        usage = {
            **cost_totals(row),
            "firstActivity": ms(row["first"]),
            "lastActivity": ms(row["last"]),
            "dailyBreakdown": [
                {"date": d["day"].isoformat(), "tokens": d["input"] + d["output"], "cost": (d["cost"] or 0) / 1e6}
                for d in daily[row["session_pk"]]
            ],
            "dailyModelUsage": [_model_day(m) for m in mine],
            "modelUsage": [
                {"provider": m["agent_id"], "model": m["model"], "count": m["calls"], "totals": cost_totals(m)}
                for m in model_totals[row["session_pk"]]
            ],
        }
        sessions.append(
            {
                "key": row["session_key"],
                "label": session.label if session else None,
                "sessionId": str(session.session_id) if session else None,
                "updatedAt": ms(session.updated_at) if session else ms(row["last"]),
                "agentId": row["agent_id"],
                "model": mine[0]["model"] if mine else None,
                "usage": usage,
            }
        )
    totals = usage_reads.rollup(rows, "user_id")
    by_model = usage_reads.rollup(rows, "agent_id", "model")
    by_agent = usage_reads.rollup(rows, "agent_id")
    by_day = usage_reads.rollup(rows, "day")
    return {
        "updatedAt": ms(timezone.now()),
        "startDate": start.isoformat(),
        "endDate": end.isoformat(),
        "sessions": sessions,
        "totals": cost_totals(totals[0] if totals else None),
        "aggregates": {
            "sessionCount": len(per_session),
            "messages": {"total": 0, "user": 0, "assistant": 0, "toolCalls": 0, "toolResults": 0, "errors": 0},
            "tools": {"totalCalls": 0, "uniqueTools": 0, "tools": []},
            "byModel": [
                {"provider": m["agent_id"], "model": m["model"], "count": m["calls"], "totals": cost_totals(m)}
                for m in by_model
            ],
            "byProvider": [],
            "byAgent": [{"agentId": a["agent_id"], "totals": cost_totals(a)} for a in by_agent],
            "byChannel": [],
            "byCreator": [],
            "costDaily": [{"date": d["day"].isoformat(), **cost_totals(d)} for d in by_day],
            "dailyLatency": [],
            "modelDaily": [_model_day(m) for m in usage_reads.rollup(rows, "day", "agent_id", "model")],
            "daily": [
                {
                    "date": d["day"].isoformat(),
                    "tokens": d["input"] + d["output"],
                    "cost": (d["cost"] or 0) / 1e6,
                    "messages": 0,
                    "toolCalls": 0,
                    "errors": 0,
                }
                for d in by_day
            ],
        },
        "creatorOptions": [],
    }


def _by_session(rows: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """Roll-up rows grouped by their `session_pk`, in their order."""
    grouped: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[row["session_pk"]].append(row)
    return grouped


def _model_day(m: dict[str, Any]) -> dict[str, Any]:
    return {
        "date": m["day"].isoformat(),
        "provider": m["agent_id"],
        "model": m["model"],
        "tokens": m["input"] + m["output"],
        "cost": (m["cost"] or 0) / 1e6,
        "count": m["calls"],
    }


@method("sessions.usage", scope=Scope.READ)
async def sessions_usage(conn: Conn, params: dict[str, Any]) -> Reply:
    today = timezone.now().date()
    end = _day(params, "endDate", today)
    start = _day(params, "startDate", end - dt.timedelta(days=DEFAULT_DAYS - 1))
    if start > end:
        raise invalid("startDate is after endDate", field="startDate")
    key = fields.get_str(params, "key", required=False, max_len=220) or None
    limit = fields.get_int(params, "limit", lo=1, hi=1000, default=50) or 50
    return Reply(await db_read(_sessions_usage, conn.state.user_id, start, end, key, limit))
