"""DB helpers for tests: what a chat.send carries, admitting one directly, and inspecting rows."""

from __future__ import annotations

import hashlib
from typing import Any

from channels.db import database_sync_to_async

from sessions_app.lifecycle import runs
from sessions_app.lifecycle.runs import SendRequest
from sessions_app.models import ChatSession, LifecycleEvent, Message, Run


@database_sync_to_async
def run_row(run_id: str) -> Run:
    return Run.objects.get(run_id=run_id)


@database_sync_to_async
def counts() -> dict[str, int]:
    return {
        "sessions": ChatSession.objects.count(),
        "runs": Run.objects.count(),
        "messages": Message.objects.count(),
        "audit": LifecycleEvent.objects.count(),
    }


@database_sync_to_async
def audit(run_id: str) -> list[tuple[str, str, str, str]]:
    return list(
        LifecycleEvent.objects.filter(run__run_id=run_id)
        .order_by("id")
        .values_list("from_state", "to_state", "reason", "actor")
    )


@database_sync_to_async
def terminal_audit_count(run_id: str) -> int:
    return LifecycleEvent.objects.filter(
        run__run_id=run_id, to_state__in=["done", "failed", "killed", "timeout"]
    ).count()


def send_params(key: str, message: str, run_id: str, **extra: Any) -> dict[str, Any]:
    """The params of a `chat.send` frame, as a client sends them over the socket."""
    return {"sessionKey": key, "message": message, "idempotencyKey": run_id, **extra}


def send_request(
    owner_id: int,
    run_id: str,
    message: str = "hi",
    *,
    key: str = "agent:main:main",
    timeout_ms: int = 60_000,
    **extra: Any,
) -> SendRequest:
    """The same `chat.send`, as the lifecycle service receives it (no socket)."""
    return SendRequest(
        owner_id=owner_id,
        key=key,
        agent_id="main",
        run_id=run_id,
        message=message,
        body_hash=hashlib.sha256(message.encode()).hexdigest(),
        timeout_ms=timeout_ms,
        **extra,
    )


def admit_send(owner: Any, run_id: str, message: str = "hi", **request: Any) -> runs.SendOutcome:
    """Admit a `chat.send` straight through the lifecycle service (synchronous, no socket)."""
    return runs.admit_send(send_request(owner.pk, run_id, message, **request), owner_process="")


def terminal_events(events: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [
        e["payload"]
        for e in events
        if e["event"] == "chat"
        and e["payload"]["runId"] == run_id
        and e["payload"]["state"] in ("final", "error", "aborted")
    ]


def rows_from_events(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Apply sessions.changed events in order, keeping the highest version per key."""
    rows: dict[str, dict[str, Any]] = {}
    for e in events:
        if e["event"] != "sessions.changed":
            continue
        row = e["payload"]["session"]
        known = rows.get(row["key"])
        if known is None or row["version"] >= known["version"]:
            rows[row["key"]] = row
    return {k: v for k, v in rows.items() if not v.get("deleted")}


def drop_broadcasts(monkeypatch: Any, lost: Any) -> None:
    """Make the channel layer lose every broadcast for which `lost(message)` is true."""
    from chat.delivery import broadcaster

    real = broadcaster.send_batch

    async def lossy(sends: list[tuple[str, dict[str, Any]]]) -> None:
        await real([(group, message) for group, message in sends if not lost(message)])

    monkeypatch.setattr(broadcaster, "send_batch", lossy)


def is_row_message(message: dict[str, Any]) -> bool:
    return message["type"] == "gateway.session"


def is_terminal_message(message: dict[str, Any]) -> bool:
    return message["type"] == "gateway.chat" and message["state"] in ("final", "error", "aborted")


@database_sync_to_async
def open_tool_calls() -> int:
    """Tool calls not in a terminal state (none may outlive its run)."""
    from sessions_app.models import TOOL_OPEN_STATES, ToolCall

    return ToolCall.objects.filter(state__in=TOOL_OPEN_STATES).count()


@database_sync_to_async
def plant_run(
    owner_id: int, run_id: str, state: str = "running", *, key: str = "agent:main:main", **fields: Any
) -> Run:
    """A run written straight to the database, as another process would have left it: no event,
    no executor (its `owner_process` is no process that runs here or that a sweep ends)."""
    session, _ = ChatSession.objects.get_or_create(owner_id=owner_id, key=key, defaults={"agent_id": "main"})
    return Run.objects.create(
        session=session,
        run_id=run_id,
        session_generation=session.session_id,
        message="m",
        body_hash="h",
        timeout_ms=60_000,
        state=state,
        owner_process=fields.pop("owner_process", "elsewhere"),
        queue_seq=Run.objects.filter(session=session).count() + 1,
        **fields,
    )
