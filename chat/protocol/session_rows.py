"""Session rows (§7) and `sessions.changed`: one row per session, made from the row as read and
its queue (read by the caller: nothing here reads the database)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chat.base import agents as catalog
from chat.protocol.frames import ms, now_ms
from sessions_app import statements
from sessions_app.models import (
    ChatSession,
    SessionStatus,
)


def session_row(session: ChatSession, queued: Sequence[str]) -> dict[str, Any]:
    """The row of a session read with its runs (`gateway_reads.sessions_with_runs`)."""
    # `running`, `hasActiveRun` and `activeRunIds` all come from the one active-run slot,
    # read in the same statement as the row: they can never contradict each other.
    active = statements.run_id_of(session, "active_run")
    running = active is not None
    started = session.started_at
    ended = None if running else session.ended_at
    runtime = None
    if not running and started is not None and ended is not None:
        runtime = max(0, int((ended - started).total_seconds() * 1000))
    last = statements.run_id_of(session, "last_run")
    return {
        "key": session.key,
        "sessionId": str(session.session_id),
        "agentId": session.agent_id,
        "label": session.label,
        "kind": session.kind,  # `direct`, or `api` for a stateless HTTP request's own (HTTP-API.md §14.3)
        "status": SessionStatus.RUNNING.value
        if running
        else (None if session.status == SessionStatus.RUNNING else session.status),
        "hasActiveRun": running,
        "activeRunIds": [active] if active is not None else [],
        "queuedRunIds": list(queued),
        "lastRunId": last,
        "startedAt": ms(started),
        "endedAt": ms(ended),
        "runtimeMs": runtime,
        "abortedLastRun": session.aborted_last_run,
        "lastRunError": session.last_run_error or None,
        # TOOLS.md §13.2: "approval" while an approval of its run waits for a decision
        "waitingFor": (session.waiting_for or None) if running else None,
        **session_settings(session),
        "version": session.version,
        "createdAt": ms(session.created_at),
        "updatedAt": ms(session.updated_at),
    }


def session_settings(session: ChatSession) -> dict[str, Any]:
    """The row's settings and token counts (docs/protocol-notes.md, "Session settings"), read from
    the row and the agent's configuration alone: no query, whatever the number of rows."""
    agent = catalog.of(session.agent_id)
    inputs, outputs = session.input_tokens, session.output_tokens
    return {
        "thinkingLevel": session.thinking_level or None,
        "verboseLevel": session.verbose_level or None,
        # the model a run of this session would use now (an override the agent no longer lists is not)
        "model": catalog.session_model(agent, session.model_override) or None,
        "modelProvider": agent.provider,
        "inputTokens": inputs,
        "outputTokens": outputs,
        "totalTokens": inputs + outputs if inputs is not None and outputs is not None else None,
        "contextTokens": agent.context_tokens,
    }


def session_rows(sessions: Sequence[ChatSession], queued: Mapping[int, Sequence[str]]) -> list[dict[str, Any]]:
    """Rows for many sessions read with their runs, and their queues (`statements.queued_run_ids`:
    one compiled statement for one session, one query for a page)."""
    return [session_row(s, queued.get(s.pk, ())) for s in sessions]


def row_event(row: dict[str, Any], reason: str, run_id: str | None = None) -> dict[str, Any]:
    """A `sessions.changed` payload."""
    payload: dict[str, Any] = {"sessionKey": row["key"], "reason": reason, "ts": now_ms(), "session": row}
    if run_id:
        payload["runId"] = run_id
    return payload
