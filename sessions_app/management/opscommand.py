"""Shared shell of the operator commands: --json, --dry-run and a progress bar.

Commands stay thin: they parse flags, call one service function and print.
Human output goes to stdout; with --json stdout holds exactly one JSON document
(progress bars and warnings go to stderr), so scripts can pipe it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from tqdm import tqdm

PROGRESS_MIN_ROWS = 500  # fewer rows finish before a bar would be worth drawing


class OpsCommand(BaseCommand):
    """Base for operator commands."""

    dry_run_help = "show what would change; change nothing"
    supports_dry_run = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON document (for scripts)")
        if self.supports_dry_run:
            parser.add_argument("--dry-run", action="store_true", help=self.dry_run_help)
        parser.add_argument(
            "--progress", choices=("auto", "always", "never"), default="auto",
            help="progress bar on stderr: auto = on a terminal when there are many rows",
        )

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
        for bar in self._bars:
            bar.close()
        self._bars.clear()

    def emit_json(self, data: dict[str, Any]) -> None:
        self.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str))

    def line(self, text: str = "", style: Callable[[str], str] | None = None) -> None:
        self.stdout.write(style(text) if style else text)
