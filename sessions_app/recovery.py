"""Restart recovery (§8): end the active runs of processes that stopped heartbeating."""

from __future__ import annotations

from dataclasses import dataclass, field

from .lifecycle import interrupt_runs_of_process
from .models import ACTIVE_STATES, Actor, Run
from .process import live_process_ids

INTERRUPTED_MESSAGE = "the gateway process running this run stopped; the run was interrupted"


@dataclass
class SweepResult:
    dead_processes: list[str] = field(default_factory=list)
    ended_runs: list[int] = field(default_factory=list)


def orphaned_owners(exclude: str = "") -> list[str]:
    """Owners of active runs that are not live processes ('' = unowned, claimed elsewhere)."""
    live = live_process_ids()
    if exclude:
        live.add(exclude)
    owners = set(
        Run.objects.filter(state__in=ACTIVE_STATES).exclude(owner_process="").values_list("owner_process", flat=True)
    )
    return sorted(owners - live)


def sweep(self_id: str = "", *, dry_run: bool = False, actor: str = Actor.REAPER) -> SweepResult:
    """End active runs whose owning process is dead; the next queued runs start as usual."""
    result = SweepResult(dead_processes=orphaned_owners(self_id))
    if dry_run:
        result.ended_runs = list(
            Run.objects.filter(state__in=ACTIVE_STATES, owner_process__in=result.dead_processes).values_list(
                "pk", flat=True
            )
        )
        return result
    for owner in result.dead_processes:
        result.ended_runs += interrupt_runs_of_process(owner, actor=actor, message=INTERRUPTED_MESSAGE)
    return result
