"""`recover_runs`: the restart-recovery sweep (PROTOCOL.md §8) run once, by an operator.

The same transitions as `recovery.sweep` (every server process runs that on each
heartbeat), one run at a time so a long list can show progress. Run from a
command, the queued successors of the interrupted runs start unowned and the next
live server process claims them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import lifecycle
from .models import ACTIVE_STATES, Actor, Run, RunState
from .recovery import INTERRUPTED_MESSAGE, orphaned_owners


@dataclass
class RecoverResult:
    dry_run: bool
    dead_processes: list[str] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)  # what was (or would be) ended
    ended: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"dryRun": self.dry_run, "deadProcesses": self.dead_processes, "runs": self.runs,
                "ended": self.ended}


def plan() -> RecoverResult:
    """Active runs whose owning process stopped heartbeating."""
    result = RecoverResult(dry_run=True, dead_processes=orphaned_owners())
    rows = Run.objects.filter(state__in=ACTIVE_STATES, owner_process__in=result.dead_processes).order_by("pk")
    result.runs = [
        {"runPk": r["pk"], "runId": r["run_id"], "state": r["state"], "ownerProcess": r["owner_process"],
         "sessionKey": r["session__key"], "owner": r["session__owner__username"]}
        for r in rows.values("pk", "run_id", "state", "owner_process", "session__key", "session__owner__username")
    ]
    return result


def recover(*, dry_run: bool = False, progress_factory: Callable[[int], Callable[[int], None] | None] | None = None,
            actor: str = Actor.REAPER) -> RecoverResult:
    """End the active runs of dead processes as failed (errorKind interrupted)."""
    result = plan()
    result.dry_run = dry_run
    if dry_run:
        return result
    progress = progress_factory(len(result.runs)) if progress_factory else None
    ended = []
    for run in result.runs:
        # First terminal wins: a run that ended meanwhile is left as it is.
        run["ended"] = lifecycle.finish_run(
            run["runPk"], RunState.FAILED, error_kind="interrupted", error_message=INTERRUPTED_MESSAGE,
            reason="run.interrupted", actor=actor,
        )
        if run["ended"]:
            ended.append(run)
        if progress is not None:
            progress(1)
    result.ended = len(ended)
    return result
