"""Check the lifecycle invariants (PROTOCOL.md §8) across the database; --fix repairs them."""

from typing import Any

from django.core.management.base import CommandParser

from sessions_app.management.opscommand import Findings, OpsCommand
from sessions_app.operations import doctor


class Command(OpsCommand):
    help = (
        "Check every session, open run, open tool call and pending approval against the lifecycle rules. "
        "Exit 0: clean; 1: findings remain; 2: the check itself failed (e.g. database unreachable). --fix "
        "repairs each finding through the lifecycle service (audited, broadcast to clients); report-only "
        "findings are left to the repair of their run."
    )
    dry_run_help = "with --fix: show the repairs; change nothing"

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--fix", action="store_true", help="repair the findings")
        parser.add_argument("--list-checks", action="store_true", help="describe the checks and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        self.setup(options)
        if options["list_checks"]:
            if self.as_json:
                self.emit_json({"checks": doctor.CHECKS})
            else:
                for kind, text in doctor.CHECKS.items():
                    self.line(f"{kind:32} {text}")
            return
        report = doctor.run(
            fix_findings=options["fix"],
            dry_run=self.dry_run,
            progress_factory=lambda n: self.progress(n, "repairing"),
        )
        self.close_bars()
        if self.as_json:
            self.emit_json({**report.as_dict(), "fix": options["fix"], "dryRun": self.dry_run})
        else:
            self._print(report, fix=options["fix"])
        if not report.ok:
            raise Findings(f"{len(report.remaining)} finding(s)")

    def _print(self, report: doctor.DoctorReport, *, fix: bool) -> None:
        if not report.findings:
            self.line("No findings: every session and open run follows the lifecycle rules.", self.style.SUCCESS)
            return
        for finding in report.findings:
            run = f" run {finding.run_id}" if finding.run_id else ""
            self.line(f"{finding.kind}: {finding.session_key} [{finding.owner}]{run}: {finding.detail}")
        for kind, count in doctor.summary(report.findings).items():
            self.line(f"  {count} x {kind}: {doctor.CHECKS[kind]}")
        if fix:
            for repair in report.repairs:
                if repair.finding.kind in doctor.REPORT_ONLY:
                    verb = "report only:"
                else:
                    verb = "would" if self.dry_run else ("did" if repair.changed else "no change:")
                self.line(f"  {verb} {repair.action} ({repair.finding.kind}, {repair.finding.session_key})")
        if report.ok:
            self.line(f"Repaired: {len(report.findings)} finding(s) cleared.", self.style.SUCCESS)
        elif not fix:
            self.line("Run with --fix to repair them through the lifecycle service.", self.style.WARNING)
