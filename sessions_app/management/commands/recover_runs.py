"""End the active runs of dead gateway processes (the recovery sweep, run once)."""

from typing import Any

from sessions_app.management.opscommand import OpsCommand
from sessions_app.operations.recovery import recover


class Command(OpsCommand):
    help = (
        "End, as failed (errorKind interrupted), the active runs of gateway processes that stopped "
        "heartbeating; their sessions' next queued runs start. Every server process already does this "
        "every GATEWAY_HEARTBEAT_SECONDS; this command is for when none is running."
    )
    dry_run_help = "list the runs that would be ended; change nothing"

    def handle(self, *args: Any, **options: Any) -> None:
        self.setup(options)
        result = recover(dry_run=self.dry_run, progress_factory=lambda n: self.progress(n, "recovering runs"))
        self.close_bars()
        if self.as_json:
            self.emit_json(result.as_dict())
            return
        if not result.runs:
            self.line("No active runs of dead processes.", self.style.SUCCESS)
            return
        self.line(f"Dead processes: {', '.join(result.dead_processes)}")
        for run in result.runs:
            state = "would end" if self.dry_run else ("ended" if run.get("ended") else "already ended")
            self.line(
                f"  {state}: run {run['runId']} ({run['state']}) of {run['sessionKey']} "
                f"[{run['owner']}] on {run['ownerProcess']}"
            )
        if self.dry_run:
            self.line(f"Dry run: {len(result.runs)} run(s) would be ended as failed/interrupted.", self.style.WARNING)
        else:
            self.line(f"Ended {result.ended} run(s) as failed/interrupted.", self.style.SUCCESS)
