"""The `agent` event stream (PROTOCOL.md §12): OpenClaw's view of the same runs (its answers: `chat.methods.agent`).

There is no second event stream. Every `chat` event a connection delivers (live, or
from repair) is translated here, by one pure function, into the `agent` events that
go with it, so every connection that gets a run's `chat` events gets its `agent`
events too, numbered the same way: an `agent` event takes the `seq` of the `chat`
event it comes from, and the events of a terminal `chat` event take that `seq` and
the next ones. Exactly one `end` or `error` per run, and nothing after it, follows
from the `chat` terminal rule (`ConnectionState.admit_chat`).
"""

from __future__ import annotations

from typing import Any

from chat.protocol import frames, keys, run_events
from chat.protocol.run_events import ChatState
from sessions_app.models import Run, RunState

# chat `status` phases as lifecycle phases: `dispatching` is OpenClaw's `start`
_LIFECYCLE_PHASE = {"queued": "queued", "dispatching": "start", "running": "running"}


def run_facts(run: Run) -> dict[str, Any]:
    """What the `agent` events need of a run beyond its `chat` payload (JSON-safe, for the layer)."""
    return {
        "startedAt": frames.ms(run.dispatched_at),
        "endedAt": frames.ms(run.ended_at),
        "outputTokens": run.completion_tokens,
    }


def agent_events(chat: dict[str, Any], facts: dict[str, Any] | None, replied: int) -> tuple[list[dict[str, Any]], int]:
    """The `agent` payloads for one `chat` payload, and how much reply text they leave delivered.

    `replied` is how much of the reply the connection has already been given as assistant
    text: a `delta` is always the rest, so a delta the layer dropped is not lost, and a
    terminal event brings whatever text is still missing.
    """
    facts = facts or {}
    seq = int(chat["seq"])
    ts = frames.now_ms()
    base = {
        "runId": chat["runId"],
        "sessionKey": chat["sessionKey"],
        "sessionId": chat.get("sessionId"),
        "agentId": keys.agent_id_of(chat["sessionKey"]),
    }
    out: list[dict[str, Any]] = []

    def add(stream: str, data: dict[str, Any]) -> None:
        out.append({**base, "stream": stream, "data": data, "seq": seq + len(out), "ts": ts})

    state = chat["state"]
    if state == ChatState.STATUS:
        phase = _LIFECYCLE_PHASE.get(chat.get("phase", ""), chat.get("phase", ""))
        data: dict[str, Any] = {"phase": phase}
        if phase == "start":
            data["startedAt"] = facts.get("startedAt") or ts
        add("lifecycle", data)
        return out, replied
    text = _text(chat)
    if state == ChatState.DELTA or len(text) > replied:
        add("assistant", {"text": text, "delta": text[replied:]})
        replied = max(replied, len(text))
    if state == ChatState.DELTA:
        return out, replied
    ended = facts.get("endedAt") or (chat.get("message") or {}).get("timestamp") or ts
    if state == ChatState.FINAL:
        if facts.get("outputTokens") is not None:
            add("usage", {"outputTokens": facts["outputTokens"]})
        add(
            "lifecycle",
            {
                "phase": "end",
                "startedAt": facts.get("startedAt"),
                "endedAt": ended,
                "aborted": False,
                # chat_payload always sets it; the default is for a payload that lacks it
                "stopReason": chat.get("stopReason", run_events.default_stop_reason(RunState.DONE)),
            },
        )
    elif state == ChatState.ABORTED:
        add(
            "lifecycle",
            {
                "phase": "end",
                "startedAt": facts.get("startedAt"),
                "endedAt": ended,
                "aborted": True,
                "stopReason": chat.get("stopReason", run_events.default_stop_reason(RunState.KILLED)),
            },
        )
    else:
        add(
            "lifecycle",
            {
                "phase": "error",
                "error": chat.get("errorMessage") or "run failed",
                "endedAt": ended,
                "errorKind": chat.get("errorKind"),
            },
        )
    return out, replied


def _text(chat: dict[str, Any]) -> str:
    message = chat.get("message") or {}
    parts = message.get("content") or []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))
