"""`manage.py serve` under cProfile, every thread of it (the event loop, the database threads, the
executor's), counting only the bench's timed windows: SIGUSR1 opens a window, SIGUSR2 closes it
(the bench's `Target.mark` sends them around each scenario's timed turns, so start-up and warm-up
turns are left out). What the windows added up is written to OUT when the server stops (SIGTERM),
before it exits, as a pstats file.

`bench/run.py --profile DIR` starts the gateway through this; by hand:

    DATABASE_URL=sqlite:///db.sqlite3 .venv/bin/python bench/profile_serve.py out.prof serve --port 8000
    kill -USR1 PID; ...load...; kill -USR2 PID; kill PID
    .venv/bin/python bench/profile_report.py out.prof --turns N

Each thread is timed by its own CPU clock (`time.thread_time`): on a shared machine a wall clock
would charge the time a thread sat preempted to whatever function it was in. That clock costs a
Python call per event, so the profiled server runs several times slower, unevenly (Python-heavy
code more): compare two profiles taken the same way (a WebSocket turn against an HTTP one) rather
than read absolute times from one. BENCH_PROFILE_CLOCK=wall uses cProfile's own wall clock
(cheaper; `bench/profile_report.py` then leaves out the waits: a queue, a lock, `epoll`).
"""

from __future__ import annotations

import cProfile
import marshal
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# a function's key (file, line, name) -> [primitive calls, calls, own time, cumulative time]
Totals = dict[tuple[str, int, str], list[float]]


class Windows:
    """Every thread's profiler, and the sum of what they recorded inside the windows."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self.opened: Totals | None = None
        self.total: Totals = {}

    def snapshot(self) -> Totals:
        """What all profilers have recorded so far (read under the GIL, the threads running on)."""
        found: Totals = {}
        for prof in list(self.profiles):
            prof.snapshot_stats()
            for key, (cc, nc, tt, ct, _callers) in prof.stats.items():  # type: ignore[attr-defined]
                row = found.setdefault(key, [0, 0, 0.0, 0.0])
                row[0] += cc
                row[1] += nc
                row[2] += tt
                row[3] += ct
        return found

    def open(self, *_: Any) -> None:
        self.opened = self.snapshot()

    def close(self, *_: Any) -> None:
        if self.opened is None:
            return
        before, self.opened = self.opened, None
        for key, row in self.snapshot().items():
            base = before.get(key, [0, 0, 0.0, 0.0])
            total = self.total.setdefault(key, [0, 0, 0.0, 0.0])
            for i in range(4):
                total[i] += row[i] - base[i]

    def dump(self, out: str) -> None:
        """The windows' sum as a pstats file (callers left out)."""
        stats = {key: (int(cc), int(nc), tt, ct, {}) for key, (cc, nc, tt, ct) in self.total.items() if nc > 0}
        Path(out).write_bytes(marshal.dumps(stats))


def new_profile() -> cProfile.Profile:
    """A profiler on this thread's CPU clock (BENCH_PROFILE_CLOCK=wall: cProfile's own, cheaper one)."""
    if os.environ.get("BENCH_PROFILE_CLOCK") == "wall":
        return cProfile.Profile()
    return cProfile.Profile(time.thread_time)


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    windows = Windows()

    def profile_thread(frame: Any, event: str, arg: Any) -> None:
        """A new thread's first call: give it a profiler of its own (it replaces this hook)."""
        prof = new_profile()
        windows.profiles.append(prof)
        prof.enable()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gatewayproject.settings")
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    from chat.management.commands import serve

    exit_now = serve._exit_now

    def dump_then_exit() -> None:
        windows.close()
        windows.dump(out)
        exit_now()

    serve._exit_now = dump_then_exit  # the server leaves through os._exit: write the stats first
    signal.signal(signal.SIGUSR1, windows.open)
    signal.signal(signal.SIGUSR2, windows.close)
    threading.setprofile(profile_thread)
    main_profile = new_profile()
    windows.profiles.append(main_profile)
    main_profile.enable()
    execute_from_command_line(["manage.py", *args])  # args: `serve --port N ...`


if __name__ == "__main__":
    main()
