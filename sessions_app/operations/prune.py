"""The prune (retention): delete sessions that have been idle for a while, in batches.

Selection is a cheap indexed read (`updated_at` index) of `lifecycle.idle.idle_sessions`,
the one definition of an idle session; each batch is then
re-checked and deleted by `lifecycle.prune_idle_sessions` under row locks, so a
session that got an active or queued run meanwhile is never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from sessions_app import audit
from sessions_app.lifecycle.idle import idle_sessions, prune_idle_sessions
from sessions_app.models import ChatSession, LifecycleEvent, Message, Run


@dataclass
class PruneResult:
    """Totals of a prune (or, with dry_run, of what a prune would delete)."""

    cutoff: datetime
    dry_run: bool
    sessions: int = 0
    runs: int = 0
    messages: int = 0
    audit: int = 0
    skipped: int = 0
    keys: list[str] = field(default_factory=list)  # the first few, for human output

    def as_dict(self) -> dict[str, object]:
        return {
            "cutoff": self.cutoff.isoformat(),
            "dryRun": self.dry_run,
            "sessions": self.sessions,
            "runs": self.runs,
            "messages": self.messages,
            "audit": self.audit,
            "skipped": self.skipped,
            "sampleKeys": self.keys,
        }


def _batches(cutoff: datetime, batch_size: int) -> Iterator[list[int]]:
    """Candidate pks in ascending batches (keyset pagination, so deletions don't shift pages)."""
    last = 0
    while True:
        pks = list(idle_sessions(cutoff).filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not pks:
            return
        yield pks
        last = pks[-1]


def prune_sessions(
    *,
    older_than_days: float,
    dry_run: bool = False,
    batch_size: int = 500,
    broadcast: bool = True,
    progress: Callable[[int], None] | None = None,
    now: datetime | None = None,
) -> PruneResult:
    """Delete sessions idle for `older_than_days` with their runs, messages and audit rows.

    `progress(n)` is called with the number of candidate sessions handled per batch.
    Every deleted session leaves a `SessionTombstone` (reason `prune`) and a log line.
    """
    if older_than_days < 0:
        raise ValueError("older_than_days must be >= 0")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    cutoff = (now or timezone.now()) - timedelta(days=older_than_days)
    result = PruneResult(cutoff=cutoff, dry_run=dry_run)
    for pks in _batches(cutoff, batch_size):
        if dry_run:
            result.sessions += len(pks)
            result.runs += Run.objects.filter(session_id__in=pks).count()
            result.messages += Message.objects.filter(session_id__in=pks).count()
            result.audit += LifecycleEvent.objects.filter(session_id__in=pks).count()
            if len(result.keys) < 10:
                result.keys += list(
                    ChatSession.objects.filter(pk__in=pks[: 10 - len(result.keys)]).values_list("key", flat=True)
                )
        else:
            with audit.deleting_because("prune"):
                batch = prune_idle_sessions(pks, idle_before=cutoff, broadcast=broadcast)
            result.sessions += batch.sessions
            result.runs += batch.runs
            result.messages += batch.messages
            result.audit += batch.audit
            result.skipped += batch.skipped
            result.keys += batch.keys[: max(0, 10 - len(result.keys))]
        if progress is not None:
            progress(len(pks))
    return result


def count_candidates(older_than_days: float, *, now: datetime | None = None) -> int:
    """How many sessions a prune would look at (for sizing a progress bar)."""
    cutoff = (now or timezone.now()) - timedelta(days=older_than_days)
    return idle_sessions(cutoff).count()
