"""`bench/run.py --smoke` still runs end to end and prints every row of its table.

No speed is asserted here: the figures and their targets live in the benchmark
(`make bench`, docs/performance.md), not in the test suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    "turns_1",
    "turns_10",
    "turns_50",
    "fanout",
    "fanout_max",
    "ack_p50_1",
    "ack_p99_one_user",
    "ack_p99_50",
    "tool_turns_10",
    "tool_turn_max",
    "resend_1",
    "resend_10",
    "connect_p50",
    "connect_many",
    "rss_idle",
    "stream_done",
    "stream_lag",
    "stream_behind",
    "stream_missed",
    "stream_slowest",
    "long_session",
    "pg_two_procs",
]


@pytest.mark.server
def test_bench_smoke_prints_the_whole_table() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--smoke"], cwd=ROOT, capture_output=True, text=True, timeout=110
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("row "))
    assert "floor min/med/max" in lines[header] and "agentgate min/med/max" in lines[header]
    printed = [line.split("|")[0].strip() for line in lines[header + 2 :] if "|" in line]
    assert printed == ROWS, proc.stdout
    for line in lines[header + 2 :]:
        cells = [c.strip() for c in line.split("|")]
        if cells[0] != "pg_two_procs":
            assert cells[3] != "n/a", f"no agentgate figure: {line}"
