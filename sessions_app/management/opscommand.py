"""Shared shell of the operator commands: --json, --dry-run, a progress bar, exit codes.

Commands stay thin: they parse flags, call one service function and print.
Human output goes to stdout; with --json stdout holds exactly one JSON document
(progress bars and warnings go to stderr), so scripts can pipe it.

Exit codes, for cron and alerting: 0 clean, 1 findings (`gateway_doctor`), 2 error
(bad arguments, database unreachable, anything unexpected). An error is one line on
stderr (`--traceback` shows the stack) and, under --json, `{"ok": false, "error": ...}`
on stdout. The database is probed with a short connect timeout before the command
runs, so an outage fails in seconds instead of waiting for the connection pool.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from sessions_app import audit
from sessions_app.operations.dbcheck import DatabaseUnreachable, probe_database

PROGRESS_MIN_ROWS = 500  # fewer rows finish before a bar would be worth drawing
EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class Findings(CommandError):
    """The command ran and found problems (exit 1): not an error of the command itself."""

    def __init__(self, message: str) -> None:
        super().__init__(message, returncode=EXIT_FINDINGS)


class OpsCommand(BaseCommand):
    """Base for operator commands."""

    dry_run_help = "show what would change; change nothing"
    supports_dry_run = True
    needs_database = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON document (for scripts)")
        if self.supports_dry_run:
            parser.add_argument("--dry-run", action="store_true", help=self.dry_run_help)
        parser.add_argument(
            "--progress",
            choices=("auto", "always", "never"),
            default="auto",
            help="progress bar on stderr: auto = on a terminal when there are many rows",
        )

    def execute(self, *args: Any, **options: Any) -> Any:
        """Run the command; turn every failure into exit code 2 with one line (and JSON under --json)."""
        self.as_json = bool(options.get("json"))
        name = type(self).__module__.rsplit(".", 1)[-1]
        try:
            if self.needs_database:
                probe_database()
            with audit.acting_as(None, f"{name} ({_os_user()})"):
                return super().execute(*args, **options)
        except Findings:
            raise
        except CommandError as exc:
            self._fail(str(exc), traceback=bool(options.get("traceback")))
            raise CommandError(str(exc), returncode=EXIT_ERROR) from exc
        except DatabaseUnreachable as exc:
            self._fail(str(exc), traceback=False)
            raise CommandError(str(exc), returncode=EXIT_ERROR) from exc
        except Exception as exc:
            if options.get("traceback"):
                raise
            message = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            self._fail(message, traceback=False)
            raise CommandError(message, returncode=EXIT_ERROR) from exc

    def _fail(self, message: str, *, traceback: bool) -> None:
        self.close_bars()
        if self.as_json:
            self.stdout.write(json.dumps({"ok": False, "error": message, "exitCode": EXIT_ERROR}, sort_keys=True))

    def setup(self, options: dict[str, Any]) -> None:
        self.as_json = bool(options.get("json"))
        self.dry_run = bool(options.get("dry_run"))
        self.progress_mode = options.get("progress", "auto")
        self._bars: list[tqdm] = []

    def progress(self, total: int, desc: str) -> Callable[[int], None] | None:
        """A callback advancing a tqdm bar by n, or None when no bar is wanted."""
        if self.progress_mode == "never" or total <= 0:
            return None
        isatty = self.stderr.isatty()
        if self.progress_mode == "auto" and (total < PROGRESS_MIN_ROWS or not isatty):
            return None
        # The raw stream: OutputWrapper.write would end every carriage-return redraw with a newline.
        bar = tqdm(total=total, desc=desc, unit="row", file=self.stderr._out, leave=False, dynamic_ncols=True)
        self._bars.append(bar)
        return bar.update

    def close_bars(self) -> None:
        for bar in getattr(self, "_bars", []):
            bar.close()
        self._bars = []

    def emit_json(self, data: dict[str, Any]) -> None:
        self.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str))

    def line(self, text: str = "", style: Callable[[str], str] | None = None) -> None:
        self.stdout.write(style(text) if style else text)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return "unknown"


__all__ = ["EXIT_ERROR", "EXIT_FINDINGS", "EXIT_OK", "Findings", "OpsCommand"]
