"""Retention: delete idle sessions with their runs, messages and audit rows, in batches."""

from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from sessions_app.management.opscommand import OpsCommand
from sessions_app.operations.prune import count_candidates, prune_sessions


class Command(OpsCommand):
    help = (
        "Delete sessions not changed for --older-than-days days, with their runs, messages and audit "
        "rows. A session with an active or queued run is never touched. Connected owners get "
        "sessions.changed (reason delete) for each deleted session. Each deleted session leaves a "
        "tombstone (SessionTombstone) and a log line. After a large prune, run VACUUM (ANALYZE) on PostgreSQL."
    )
    dry_run_help = "count what would be deleted; delete nothing"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--older-than-days",
            type=float,
            required=True,
            metavar="N",
            help="idle for at least N days (by the session's last change)",
        )
        parser.add_argument("--batch-size", type=int, default=500, help="sessions per transaction (default 500)")
        parser.add_argument(
            "--force", action="store_true", help="allow --older-than-days below GATEWAY_PRUNE_MIN_DAYS (default 7)"
        )
        parser.add_argument(
            "--no-broadcast",
            action="store_true",
            help="skip the per-session sessions.changed events (faster for huge backlogs)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.setup(options)
        days, batch = options["older_than_days"], options["batch_size"]
        if days < 0:
            raise CommandError("--older-than-days must be >= 0")
        minimum = float(settings.GATEWAY_PRUNE_MIN_DAYS)
        if days < minimum and not options["force"]:
            raise CommandError(
                f"--older-than-days {days:g} is below the minimum of {minimum:g} days "
                "(GATEWAY_PRUNE_MIN_DAYS); add --force to prune recent sessions anyway"
            )
        if batch < 1:
            raise CommandError("--batch-size must be >= 1")
        total = count_candidates(days)
        progress = self.progress(total, "pruning sessions")
        result = prune_sessions(
            older_than_days=days,
            dry_run=self.dry_run,
            batch_size=batch,
            broadcast=not options["no_broadcast"],
            progress=progress,
        )
        self.close_bars()
        if self.as_json:
            self.emit_json({"ok": True, **result.as_dict()})
            return
        verb = "Would delete" if self.dry_run else "Deleted"
        self.line(f"Sessions idle since {result.cutoff:%Y-%m-%d %H:%M} UTC.")
        self.line(
            f"{verb} {result.sessions} session(s), {result.runs} run(s), {result.messages} message(s), "
            f"{result.audit} audit row(s).",
            self.style.WARNING if self.dry_run else self.style.SUCCESS,
        )
        if result.skipped:
            self.line(f"Skipped {result.skipped} session(s) that became busy or changed meanwhile.")
        for key in result.keys:
            self.line(f"  {key}")
