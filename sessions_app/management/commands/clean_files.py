"""Stored files that linger: uploads no run uses (older than GATEWAY_FILE_ORPHAN_HOURS) and bytes in
storage that no file row names are removed; rows whose bytes are gone are reported."""

from typing import Any

from django.core.management.base import CommandParser

from sessions_app import files
from sessions_app.management.opscommand import OpsCommand


class Command(OpsCommand):
    help = (
        "Find and remove orphaned stored files: uploads no run uses, older than GATEWAY_FILE_ORPHAN_HOURS "
        "(default 24), and bytes in the attachments storage that no file names. Files whose bytes are "
        "missing are reported, not changed. Deleting a session (or a prune) removes its files itself."
    )
    dry_run_help = "list what would be removed; remove nothing"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        self.setup(options)
        self.line("Looking for orphaned files...")

        def stage(name: str, total: int) -> Any:
            if not self.as_json:
                self.line(f"  checking {total} {name}")
            return self.progress(total, f"checking {name}")

        report = files.orphans(dry_run=self.dry_run, progress=stage)
        self.close_bars()
        if self.as_json:
            self.emit_json({"ok": True, **report.as_dict()})
            return
        verb = "Would remove" if self.dry_run else "Removed"
        self.line(
            f"{verb} {len(report.unused_rows)} unused file(s) and {len(report.stray_bytes)} stray stored object(s).",
            self.style.WARNING if self.dry_run else self.style.SUCCESS,
        )
        for name in [*report.unused_rows, *report.stray_bytes][:20]:
            self.line(f"  {name}")
        if report.missing_bytes:
            self.line(f"{len(report.missing_bytes)} file(s) have lost their bytes:", self.style.ERROR)
            for file_id in report.missing_bytes[:20]:
                self.line(f"  {file_id}")
