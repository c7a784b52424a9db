"""The run state machine as data: which transitions are allowed (no ORM here)."""

from __future__ import annotations

from sessions_app.models import TERMINAL_STATES, RunState

ALLOWED: dict[str, frozenset[str]] = {
    RunState.QUEUED: frozenset({RunState.DISPATCHING, *TERMINAL_STATES}) - {RunState.DONE},
    RunState.DISPATCHING: frozenset({RunState.RUNNING, *TERMINAL_STATES}) - {RunState.DONE},
    RunState.RUNNING: frozenset(TERMINAL_STATES),
}
for _terminal in TERMINAL_STATES:
    ALLOWED[_terminal] = frozenset()


def sources_for(target: str) -> list[str]:
    """Return the states from which `target` may be entered."""
    return [src for src, targets in ALLOWED.items() if target in targets]
