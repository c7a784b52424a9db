"""Reads: session rows, lists, history. Every payload here is JSON-safe primitives."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.db.models import Q, QuerySet

from chat.protocol import ms, run_details

from .models import ACTIVE_STATES, OPEN_STATES, ChatSession, Message, Run, RunState


def _row(session: ChatSession, open_runs: Sequence[Run], run_ids: dict[int, str]) -> dict[str, Any]:
    # `running`, `hasActiveRun` and `activeRunIds` come from the session row itself (its
    # active_run slot), never from a second read that another commit could tear apart.
    running = session.active_run_id is not None
    active = [run_ids[session.active_run_id]] if running and session.active_run_id in run_ids else []
    queued = [r.run_id for r in sorted(open_runs, key=lambda r: (r.queue_seq, r.pk)) if r.state == RunState.QUEUED]
    started = session.started_at
    ended = None if running else session.ended_at
    runtime = None
    if not running and started is not None and ended is not None:
        runtime = max(0, ms(ended) - ms(started))  # type: ignore[operator]
    return {
        "key": session.key,
        "sessionId": str(session.session_id),
        "agentId": session.agent_id,
        "label": session.label,
        "kind": "direct",
        # `running` iff an active run: both come from the same committed state.
        "status": "running" if running else (None if session.status == "running" else session.status),
        "hasActiveRun": running,
        "activeRunIds": active,
        "queuedRunIds": queued,
        "lastRunId": run_ids.get(session.last_run_id) if session.last_run_id else None,
        "startedAt": ms(started),
        "endedAt": ms(ended),
        "runtimeMs": runtime,
        "abortedLastRun": session.aborted_last_run,
        "lastRunError": session.last_run_error or None,
        "version": session.version,
        "createdAt": ms(session.created_at),
        "updatedAt": ms(session.updated_at),
    }


def session_rows(sessions: Sequence[ChatSession]) -> list[dict[str, Any]]:
    """Rows for many sessions with two queries, whatever their number."""
    if not sessions:
        return []
    pks = [s.pk for s in sessions]
    open_by_session: dict[int, list[Run]] = defaultdict(list)
    wanted = {pk for s in sessions for pk in (s.last_run_id, s.active_run_id) if pk}
    runs = Run.objects.filter(Q(session_id__in=pks, state=RunState.QUEUED) | Q(pk__in=wanted)).only(
        "id", "run_id", "state", "queue_seq", "session_id"
    )
    run_ids: dict[int, str] = {}
    for run in runs:
        if run.state == RunState.QUEUED:
            open_by_session[run.session_id].append(run)
        run_ids[run.pk] = run.run_id  # run ids never change: safe to read apart from the row
    return [_row(s, open_by_session.get(s.pk, []), run_ids) for s in sessions]


def session_row(session_pk: int) -> dict[str, Any] | None:
    session = ChatSession.objects.filter(pk=session_pk).first()
    return session_rows([session])[0] if session else None


def owner_sessions(owner_id: int | None) -> QuerySet[ChatSession]:
    """Sessions of one owner, or all sessions when owner_id is None (admin scope)."""
    qs = ChatSession.objects.all()
    return qs if owner_id is None else qs.filter(owner_id=owner_id)


def list_sessions(
    owner_id: int,
    *,
    limit: int = 100,
    offset: int = 0,
    status: str | None = None,
    active_only: bool = False,
    search: str | None = None,
) -> dict[str, Any]:
    """sessions.list, newest `updatedAt` first."""
    qs = owner_sessions(owner_id)
    if active_only:
        qs = qs.filter(active_run__isnull=False)
    if status == "running":
        qs = qs.filter(active_run__isnull=False)
    elif status == "none":
        qs = qs.filter(status__isnull=True)
    elif status:
        qs = qs.filter(status=status, active_run__isnull=True)
    if search:
        qs = qs.filter(Q(key__icontains=search) | Q(label__icontains=search))
    total = qs.count()
    page = list(qs.order_by("-updated_at", "-id")[offset : offset + limit])
    rows = session_rows(page)
    has_more = offset + len(rows) < total
    return {
        "count": len(rows),
        "totalCount": total,
        "hasMore": has_more,
        "nextOffset": offset + len(rows) if has_more else None,
        "sessions": rows,
    }


def find_session(owner_id: int, key: str) -> ChatSession | None:
    return ChatSession.objects.filter(owner_id=owner_id, key=key).first()


def message_dict(msg: Message, runs: dict[int, Run]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": str(msg.pk),
        "role": msg.role,
        "content": [{"type": "text", "text": msg.text}],
        "timestamp": ms(msg.created_at),
    }
    run = runs.get(msg.run_id) if msg.run_id is not None else None
    if run is not None:
        item["runId"] = run.run_id
    if msg.aborted:
        item["aborted"] = True
    if run is not None and msg.role == "assistant" and run.is_terminal:
        item.update(run_details(run))  # not in the spec: durationMs and usage of the run
    return item


def history(session: ChatSession, *, limit: int = 200, before_id: int | None = None) -> dict[str, Any]:
    """chat.history for the session's current generation, oldest first."""
    qs = Message.objects.filter(session=session, session_generation=session.session_id)
    if before_id is not None:
        qs = qs.filter(pk__lt=before_id)
    newest_first = list(qs.order_by("-id")[: limit + 1])
    has_more = len(newest_first) > limit
    msgs = list(reversed(newest_first[:limit]))
    run_pks = {m.run_id for m in msgs if m.run_id is not None}
    fields = ("pk", "run_id", "state", "dispatched_at", "started_at", "ended_at", "prompt_tokens", "completion_tokens")
    runs = {r.pk: r for r in Run.objects.filter(pk__in=run_pks).only(*fields)}
    payload: dict[str, Any] = {
        "sessionKey": session.key,
        "sessionId": str(session.session_id),
        "messages": [message_dict(m, runs) for m in msgs],
        "hasMore": has_more,
        "session": session_rows([session])[0],
    }
    open_runs = list(
        Run.objects.filter(session=session, state__in=OPEN_STATES).order_by("queue_seq", "id")
    )
    active = next((r for r in open_runs if r.state in ACTIVE_STATES), None)
    if active is not None:
        payload["inFlightRun"] = {"runId": active.run_id, "seq": active.stream_seq, "text": active.reply}
    queued = [r for r in open_runs if r.state == RunState.QUEUED]
    # Not in the spec: the queued messages themselves, so a reloaded page can show them.
    payload["queuedRuns"] = [
        {"runId": r.run_id, "text": r.message, "position": i + 1} for i, r in enumerate(queued)
    ]
    return payload

