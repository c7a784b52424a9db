"""Restart recovery (§8): end the active runs of processes that stopped heartbeating.

Every server process runs `sweep` on each heartbeat; `recover_runs` runs `recover`
once, with progress. Either way each run goes through `runs.finish_run`, so the
first terminal transition wins, the sessions' next queued runs start, and clients
hear about it. Run from a command, the successors start unowned and the next live
server process claims them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from sessions_app.lifecycle import runs
from sessions_app.models import ACTIVE_STATES, Actor, GatewayProcess, Run
from sessions_app.process import Blind, blind_seconds, live_process_ids

log = logging.getLogger(__name__)

INTERRUPTED_MESSAGE = "the gateway process running this run stopped; the run was interrupted"


def orphaned_owners(exclude: str = "", blind: Blind = ()) -> list[str]:
    """Owners of active runs that are not live processes ('' = unowned, claimed elsewhere).

    `blind`: when the caller could not reach the database (`process.live_process_ids`).
    """
    live = live_process_ids(blind)
    if exclude:
        live.add(exclude)
    owners = set(
        Run.objects.filter(state__in=ACTIVE_STATES).exclude(owner_process="").values_list("owner_process", flat=True)
    )
    return sorted(owners - live)


@dataclass
class RecoverResult:
    dry_run: bool
    dead_processes: list[str] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)  # what was (or would be) ended
    ended: int = 0
    heartbeats: dict[str, datetime] = field(default_factory=dict)  # the dead processes' last, when judged

    def as_dict(self) -> dict[str, Any]:
        return {"dryRun": self.dry_run, "deadProcesses": self.dead_processes, "runs": self.runs, "ended": self.ended}


def plan(exclude: str = "", blind: Blind = ()) -> RecoverResult:
    """Active runs whose owning process stopped heartbeating."""
    result = RecoverResult(dry_run=True, dead_processes=orphaned_owners(exclude, blind))
    if not result.dead_processes:
        return result
    result.heartbeats = dict(
        GatewayProcess.objects.filter(server_id__in=result.dead_processes).values_list("server_id", "heartbeat_at")
    )
    rows = Run.objects.filter(state__in=ACTIVE_STATES, owner_process__in=result.dead_processes).order_by("pk")
    result.runs = [
        {
            "runPk": r["pk"],
            "runId": r["run_id"],
            "state": r["state"],
            "ownerProcess": r["owner_process"],
            "sessionKey": r["session__key"],
            "owner": r["session__owner__username"],
        }
        for r in rows.values("pk", "run_id", "state", "owner_process", "session__key", "session__owner__username")
    ]
    return result


def recover(
    *,
    dry_run: bool = False,
    exclude: str = "",
    progress_factory: Callable[[int], Callable[[int], None] | None] | None = None,
    actor: str = Actor.REAPER,
    blind: Blind = (),
) -> RecoverResult:
    """End the active runs of dead processes as failed (errorKind interrupted)."""
    result = plan(exclude, blind)
    result.dry_run = dry_run
    if dry_run or not result.runs:
        return result
    progress = progress_factory(len(result.runs)) if progress_factory else None
    for run in result.runs:
        # First terminal wins: a run that ended meanwhile is left as it is.
        run["ended"] = runs.interrupt_run(run["runPk"], message=INTERRUPTED_MESSAGE, actor=actor)
        result.ended += int(run["ended"])
        if progress is not None:
            progress(1)
    return result


def forget_dead_processes(now: datetime | None = None) -> int:
    """Delete rows of processes dead for GATEWAY_PROCESS_RETENTION_HOURS that own no active run."""
    cutoff = (now or timezone.now()) - timedelta(hours=settings.GATEWAY_PROCESS_RETENTION_HOURS)
    busy = Run.objects.filter(state__in=ACTIVE_STATES, owner_process=OuterRef("server_id"))
    old = GatewayProcess.objects.filter(heartbeat_at__lt=cutoff).exclude(Exists(busy))
    return int(old.delete()[0])


@dataclass
class SweepResult:
    ended: int
    forgotten: int


def sweep(self_id: str, blind: Blind = ()) -> SweepResult:
    """The periodic sweep of a live server process (never ends its own runs).

    `blind`: when this process could not reach the database; a peer's heartbeat age counts
    without that time (`process.live_process_ids`).
    """
    result = recover(exclude=self_id, blind=blind)
    if result.ended:
        # Rare, and the one decision an operator must be able to check: whom, and on what grounds.
        now = timezone.now()
        grounds = [
            f"{server_id} (last heartbeat {(now - beat).total_seconds():.1f} s ago, "
            f"{blind_seconds(blind, beat):.1f} s of it unseen here)"
            for server_id, beat in result.heartbeats.items()
        ]
        log.warning("ended %d runs of dead processes: %s", result.ended, "; ".join(grounds) or result.dead_processes)
    return SweepResult(ended=result.ended, forgotten=forget_dead_processes())
