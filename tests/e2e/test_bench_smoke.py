"""`bench/run.py --smoke` still runs end to end and prints every row of its table.

No speed is asserted here: the figures and their targets live in the benchmark
(`make bench`, docs/performance.md), not in the test suite.
"""

from __future__ import annotations

import os
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
    "http_turns_10",
    "http_stream_10",
    "http_stateless_10",
    "http_turn_p99",
    "cpu_turn_ws",
    "cpu_turn_http",
    "cpu_turn_http_stream",
    "cpu_turn_http_stateless",
    "http_cpu_ratio",
    "http_stream_cpu_ratio",
    "http_stateless_cpu_ratio",
    "pg_turns_10",
    "pg_cpu_turn",
    "pg_statements",
    "pg_commands",
    "pg_fk_checks",
    "pg_write_xacts",
    "pg_redis_cmds",
    "pg_db_cpu",
    "pg_redis_cpu",
    "pg_two_procs",
    "pg_two_procs_cpu",
    "pg_two_procs_cores",
    "pg_two_procs_box",
    "pg_stream_200",
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
        if not cells[0].startswith("pg_"):  # without --only, --smoke leaves PostgreSQL + Redis out, and says so
            assert cells[3] != "n/a", f"no agentgate figure: {line}"


@pytest.mark.server
def test_bench_smoke_measures_the_postgresql_rows() -> None:
    """`--smoke --only pg`: the PostgreSQL + Redis rows, on private servers when PostgreSQL's and
    Redis's programs are installed (else the services at BENCH_POSTGRES_URL / BENCH_REDIS_URL),
    each with a figure; the streaming row may say its module is not there."""
    proc = subprocess.run(
        [sys.executable, "bench/run.py", "--smoke", "--only", "pg"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("row "))
    cells = {c[0]: c for c in ([x.strip() for x in line.split("|")] for line in lines[header + 2 :] if "|" in line)}
    assert list(cells) == ["turns_10", "cpu_turn_ws"] + [r for r in ROWS if r.startswith("pg_")], proc.stdout
    if cells["pg_turns_10"][3].startswith("not run"):
        reason = cells["pg_turns_10"][3]
        if os.environ.get("AGENTGATE_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason}; AGENTGATE_REQUIRE_SERVICES=1")
        pytest.skip(reason)
    for row, line in cells.items():
        if row != "pg_stream_200":
            # (n/a: a figure an external server cannot give, e.g. statements without pg_stat_statements)
            assert not line[3].startswith(("not run", "failed")), line
    assert float(cells["pg_turns_10"][3].split(" / ")[1]) > 0
    assert float(cells["pg_redis_cmds"][3].split(" / ")[1]) > 0
