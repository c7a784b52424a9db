"""Usage for a period, for billing: summed by user, agent, model or day, as JSON or CSV on stdout."""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from sessions_app import usage_reads


class Command(BaseCommand):
    help = (
        "Model usage (tokens, cached and reasoning tokens, calls, cost by the agents' price tables) for a "
        "period, summed by user, agent, model or day, as JSON or CSV on stdout; progress on stderr. "
        "Usage rows outlive pruned transcripts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--start", help="first day, YYYY-MM-DD (default: the first of this month)")
        parser.add_argument("--end", help="last day, YYYY-MM-DD (default: today)")
        parser.add_argument(
            "--by", choices=sorted(usage_reads.GROUPINGS), default="user", help="what to sum by (default user)"
        )
        parser.add_argument("--format", choices=("json", "csv"), default="json")

    def handle(self, *args: Any, **options: Any) -> None:
        today = timezone.now().date()
        end = _day(options["end"], today, "--end")
        start = _day(options["start"], end.replace(day=1), "--start")
        if start > end:
            raise CommandError("--start is after --end")
        by = usage_reads.GROUPINGS[options["by"]]
        self.stderr.write(f"usage_report: summing usage from {start} to {end} by {options['by']}...")
        rows = usage_reads.summary_rows(start, end, by)
        self.stderr.write(f"usage_report: {len(rows)} rows")
        if options["format"] == "csv":
            out = io.StringIO()
            usage_reads.write_summary_csv(out, rows, by)
            self.stdout.write(out.getvalue(), ending="")
            return
        fields = [*by, *usage_reads.SUMMARY_FIELDS]
        report = {
            "start": start.isoformat(),
            "end": end.isoformat(),
            "by": options["by"],
            "rows": [{f: _plain(row[f]) for f in fields} for row in rows],
        }
        self.stdout.write(json.dumps(report, indent=2))


def _day(value: str | None, default: dt.date, flag: str) -> dt.date:
    if not value:
        return default
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise CommandError(f"{flag} must be a date (YYYY-MM-DD)") from None


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.date) else value
