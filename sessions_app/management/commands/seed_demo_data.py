"""Fill the database with demo sessions and runs, fast (bulk inserts)."""

import time
from typing import Any

from django.core.management.base import CommandError, CommandParser

from sessions_app.management.opscommand import OpsCommand
from sessions_app.operations.seed import seed_demo_data


class Command(OpsCommand):
    help = (
        "Insert --sessions N sessions holding --runs M runs in total, spread over --users demo users "
        "(seed-user-*). A few sessions are left stuck under a dead process (--stuck). For demos and "
        "for measuring the admin at scale."
    )
    supports_dry_run = False

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--sessions", type=int, required=True, metavar="N")
        parser.add_argument("--runs", type=int, required=True, metavar="M")
        parser.add_argument("--users", type=int, default=20, help="demo users to spread sessions over")
        parser.add_argument(
            "--stuck",
            type=int,
            default=None,
            help="sessions left running under a dead process (default: one per thousand)",
        )
        parser.add_argument(
            "--transcripts", action="store_true", help="also write messages and one audit row per run (slower)"
        )
        parser.add_argument("--batch-size", type=int, default=1000, help="sessions per transaction")
        parser.add_argument("--seed", type=int, default=None, help="random seed, for repeatable data")

    def handle(self, *args: Any, **options: Any) -> None:
        self.setup(options)
        if options["sessions"] < 0 or options["runs"] < 0 or options["users"] < 1 or options["batch_size"] < 1:
            raise CommandError("--sessions and --runs must be >= 0; --users and --batch-size >= 1")
        if options["runs"] and not options["sessions"]:
            raise CommandError("runs need sessions")
        started = time.perf_counter()
        result = seed_demo_data(
            sessions=options["sessions"],
            runs=options["runs"],
            users=options["users"],
            stuck=options["stuck"],
            transcripts=options["transcripts"],
            batch_size=options["batch_size"],
            rng_seed=options["seed"],
            progress=self.progress(options["sessions"], "seeding sessions"),
        )
        self.close_bars()
        seconds = round(time.perf_counter() - started, 2)
        if self.as_json:
            self.emit_json({**result.__dict__, "seconds": seconds})
            return
        self.line(
            f"Seeded {result.sessions} sessions, {result.runs} runs, {result.messages} messages, "
            f"{result.audit} audit rows for {result.users} users in {seconds} s "
            f"({result.stuck} stuck under a dead process).",
            self.style.SUCCESS,
        )
