"""Health of this process's background loops (heartbeat + sweep, reconcile, repair, listener).

Each loop reports success or failure here; `/readyz` reads `problems()`, so a loop
that died, or keeps failing, takes the process out of rotation instead of hiding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class LoopState:
    ok: bool = False
    last_ok: float = 0.0  # time.monotonic() of the last success
    error: str = ""
    restarts: int = 0


_loops: dict[str, LoopState] = {}


def reset() -> None:
    _loops.clear()


def ok(name: str) -> None:
    state = _loops.setdefault(name, LoopState())
    state.ok, state.last_ok, state.error = True, time.monotonic(), ""


def failed(name: str, exc: BaseException | str, *, restart: bool = False) -> None:
    state = _loops.setdefault(name, LoopState())
    state.ok = False
    state.error = (str(exc) if isinstance(exc, str) else f"{type(exc).__name__}: {exc}")[:300]
    state.restarts += int(restart)


def snapshot() -> dict[str, LoopState]:
    return dict(_loops)


def problems(stale_after: dict[str, float]) -> dict[str, str]:
    """Loops that failed last time, or have not succeeded within their allowed age (seconds)."""
    now = time.monotonic()
    found: dict[str, str] = {}
    for name, max_age in stale_after.items():
        state = _loops.get(name)
        if state is None:
            continue  # not started (no run manager in this process yet)
        if not state.ok:
            found[name] = state.error or "failing"
        elif max_age and now - state.last_ok > max_age:
            found[name] = f"no success for {int(now - state.last_ok)}s"
    return found
