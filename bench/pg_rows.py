"""The PostgreSQL + Redis rows of `make bench`, beside the embedded rows of the same run (issue 29).

`bench/run.py` starts the services (`bench/scaleout.py`: private servers by default), a fresh
database and two gateway processes on them, and measures three scenarios (`--only` names; `pg`
means all three):

- `pg_turns_10`: right after each repeat's embedded `turns_10`, the same turns (`load.turns`,
  the same connections and message) on one PostgreSQL + Redis process, with what the servers
  counted over the timed turns: the rows `pg_turns_10` and `pg_cpu_turn` (each against the
  embedded figure of the same repeat), then statements, write transactions, Redis commands and
  the servers' CPU per turn.
- `pg_two_procs`: after the repeats, `pg_conns` connections on one process, then split over
  two, interleaved `repeat` times, each gateway pinned to a CPU of its own (`bench/run.py`
  `pin_gateways`): turns/s, turns per gateway CPU-second, the cores each gateway got, and what
  the machine allows at most.
- `pg_stream_200`: 200 replies streaming over two processes, 3 watchers each, measured by
  `bench/stream_cluster.py` when it is there (`stream_200` passes it what of the services'
  URLs and the sizes its `measure` takes, and reads the keys `load.streaming` returns).

This module turns their results into the table's lines.
"""

from __future__ import annotations

import inspect
import json
import math
import statistics
from collections.abc import Callable
from typing import Any

from bench.table import Results, triple

SCENARIOS = ("pg_turns_10", "pg_two_procs", "pg_stream_200")
TURNS_RATIO = 0.5  # one process on PostgreSQL + Redis >= 0.5x the embedded turns/s
CPU_RATIO = 1.5  # CPU per turn <= 1.5x the embedded
TWO_PROCS = 1.7  # two processes >= 1.7x one
STATEMENTS = 12  # statements per turn on PostgreSQL
BEHIND_P99_MS = 250.0  # 200 streams: deltas behind the model's schedule, p99
STREAM_RUNS, STREAM_WATCHERS, STREAM_PROCS = 200, 3, 2

Line = list[str]


def wanted(only: set[str] | None) -> set[str]:
    """The PostgreSQL scenarios `--only` asks for (all of them without `--only`, or with `pg`)."""
    if only is None or "pg" in only:
        return set(SCENARIOS)
    return only & set(SCENARIOS)


def _runs(results: Results, scenario: str) -> list[dict[str, float]]:
    return results.get("agentgate", {}).get(scenario, [])


def _values(results: Results, scenario: str, key: str, scale: float = 1.0) -> list[float]:
    return [r[key] * scale for r in _runs(results, scenario) if key in r and not math.isnan(r[key])]


def _ratios(results: Results, scenario: str, key: str, base: str, base_key: str) -> list[float]:
    """`scenario`'s `key` over `base`'s `base_key`, repeat by repeat (both measured side by side)."""
    out = []
    for mine, theirs in zip(_runs(results, scenario), _runs(results, base), strict=False):
        if mine.get(key) and theirs.get(base_key):
            out.append(mine[key] / theirs[base_key])
    return out


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _met(ok: bool) -> str:
    return "yes" if ok else "NO"


def lines(
    results: Results, status: dict[str, str], conns: int, pg_conns: int, ncpu: int, shown: set[str]
) -> list[Line]:
    """The PostgreSQL + Redis lines of the `shown` scenarios; a scenario not run says why (`status`)."""
    out: list[Line] = []

    def line(row: str, label: str, cell: str, ratio: str = "-", target: str = "-", met: str = "-") -> None:
        out.append([row, label, "-", cell, ratio, target, met])

    def absent(scenario: str, rows: list[tuple[str, str]]) -> None:
        reason = status.get(scenario) or "not run"
        for row, label in rows:
            line(row, label, reason)

    # --- one process, beside the embedded turns_10 ---------------------------------------------------------
    one_rows = [
        ("pg_turns_10", f"PostgreSQL+Redis turns/s, {conns} conns, 1 proc (ratio: / turns_10)"),
        ("pg_cpu_turn", f"PostgreSQL+Redis server CPU ms per turn, {conns} conns (ratio: / cpu_turn_ws)"),
        ("pg_statements", "PostgreSQL statements per turn (server-side, BEGIN/COMMIT apart)"),
        ("pg_commands", "PostgreSQL statements + BEGIN/COMMIT per turn (not the pool's empty checks)"),
        ("pg_fk_checks", "PostgreSQL foreign-key checks per turn (run at commit, not sent)"),
        ("pg_write_xacts", "PostgreSQL transactions with a write per turn (xids)"),
        ("pg_redis_cmds", "Redis commands per turn (INFO commandstats)"),
        ("pg_db_cpu", "PostgreSQL CPU ms per turn (its processes)"),
        ("pg_redis_cpu", "Redis CPU ms per turn (INFO cpu)"),
    ]
    if "pg_turns_10" not in shown:
        pass
    elif not _runs(results, "pg_turns_10"):
        absent("pg_turns_10", one_rows)
    else:
        labels = dict(one_rows)
        turns = _values(results, "pg_turns_10", "turns_per_s")
        turns_ratio = _ratios(results, "pg_turns_10", "turns_per_s", "turns_10", "turns_per_s")
        line(
            "pg_turns_10",
            labels["pg_turns_10"],
            triple(turns, "{:.1f}"),
            f"{_med(turns_ratio):.2f}x",
            f">= {TURNS_RATIO}x",
            _met(_med(turns_ratio) >= TURNS_RATIO),
        )
        cpu = _values(results, "pg_turns_10", "cpu_ms_per_turn")
        cpu_ratio = _ratios(results, "pg_turns_10", "cpu_ms_per_turn", "turns_10", "cpu_ms_per_turn")
        line(
            "pg_cpu_turn",
            labels["pg_cpu_turn"],
            triple(cpu, "{:.2f}"),
            f"{_med(cpu_ratio):.2f}x",
            f"<= {CPU_RATIO}x",
            _met(_med(cpu_ratio) <= CPU_RATIO),
        )
        stmts = _values(results, "pg_turns_10", "pg_stmts_per_turn")
        ctl = _values(results, "pg_turns_10", "pg_txn_cmds_per_turn")
        if stmts:
            line(
                "pg_statements",
                labels["pg_statements"],
                triple(stmts, "{:.1f}"),
                target=f"<= {STATEMENTS}",
                met=_met(_med(stmts) <= STATEMENTS),
            )
            line(
                "pg_commands",
                labels["pg_commands"],
                triple([a + b for a, b in zip(stmts, ctl, strict=False)], "{:.1f}"),
            )
            fks = _values(results, "pg_turns_10", "pg_fk_checks_per_turn")
            line("pg_fk_checks", labels["pg_fk_checks"], triple(fks, "{:.1f}"))
        else:
            for row in ("pg_statements", "pg_commands", "pg_fk_checks"):
                line(row, labels[row], "n/a: pg_stat_statements not loaded")
        writes = _values(results, "pg_turns_10", "pg_write_xacts_per_turn")
        line("pg_write_xacts", labels["pg_write_xacts"], triple(writes, "{:.1f}"))
        redis_cmds = _values(results, "pg_turns_10", "redis_cmds_per_turn")
        line("pg_redis_cmds", labels["pg_redis_cmds"], triple(redis_cmds, "{:.1f}"))
        pg_cpu = _values(results, "pg_turns_10", "pg_cpu_per_turn", 1000)
        line("pg_db_cpu", labels["pg_db_cpu"], triple(pg_cpu, "{:.2f}") if pg_cpu else "n/a: not a private server")
        redis_cpu = _values(results, "pg_turns_10", "redis_cpu_per_turn", 1000)
        line("pg_redis_cpu", labels["pg_redis_cpu"], triple(redis_cpu, "{:.2f}"))

    # --- one process against two ---------------------------------------------------------------------------
    two_rows = [
        ("pg_two_procs", f"PostgreSQL+Redis turns/s, {pg_conns} conns, 1 proc -> 2 procs"),
        ("pg_two_procs_cpu", "turns per gateway CPU-second, 1 proc -> 2 procs"),
        ("pg_two_procs_cores", "cores each gateway got, 1 proc -> 2 procs"),
        ("pg_two_procs_box", f"cores busy: ours / whole machine ({ncpu} CPUs), 1 -> 2 procs (ratio: most it allows)"),
    ]
    if "pg_two_procs" not in shown:
        pass
    elif not _runs(results, "pg_two") or not _runs(results, "pg_one"):
        absent("pg_two_procs", two_rows)
    else:
        labels = dict(two_rows)
        one = _values(results, "pg_one", "turns_per_s")
        two = _values(results, "pg_two", "turns_per_s")
        gain = _ratios(results, "pg_two", "turns_per_s", "pg_one", "turns_per_s")
        line(
            "pg_two_procs",
            labels["pg_two_procs"],
            f"{triple(one, '{:.0f}')} -> {triple(two, '{:.0f}')}",
            f"{_med(gain):.2f}x",
            f">= {TWO_PROCS}x",
            _met(_med(gain) >= TWO_PROCS),
        )
        eff_one = _values(results, "pg_one", "cpu_ms_per_turn")
        eff_two = _values(results, "pg_two", "cpu_ms_per_turn")
        per_one, per_two = 1000 / _med(eff_one), 1000 / _med(eff_two)
        line(
            "pg_two_procs_cpu",
            labels["pg_two_procs_cpu"],
            f"{per_one:.1f} -> {per_two:.1f}",
            f"{per_two / per_one:.2f}x",
        )
        cores_one = _gateway_cores(_runs(results, "pg_one"))
        cores_two = _gateway_cores(_runs(results, "pg_two"))
        line(
            "pg_two_procs_cores",
            labels["pg_two_procs_cores"],
            f"{' + '.join(f'{c:.2f}' for c in cores_one[:1])} -> {' + '.join(f'{c:.2f}' for c in cores_two)}",
        )
        ours_one, box_one = _busy(_runs(results, "pg_one"))
        ours_two, box_two = _busy(_runs(results, "pg_two"))
        # all CPU a turn costs here (gateways, PostgreSQL, Redis, the load client): the machine's
        # CPUs give at most ncpu / that turns/s, against one process's turns/s
        per_turn = _med([_ours(r, per="turn") for r in _runs(results, "pg_two")])
        allows = ncpu / per_turn / _med(one) if per_turn else math.nan
        line(
            "pg_two_procs_box",
            labels["pg_two_procs_box"],
            f"{ours_one:.2f} / {box_one:.2f} -> {ours_two:.2f} / {box_two:.2f}",
            f"<= {allows:.2f}x",
        )

    # --- 200 streams over two processes ----------------------------------------------------------------
    label = f"{STREAM_RUNS} streams over {STREAM_PROCS} procs, {STREAM_WATCHERS} watchers: behind p99 ms, missed"
    target = f"<= {BEHIND_P99_MS:.0f} ms, 0 missed"
    streams = _runs(results, "pg_stream_200")
    if "pg_stream_200" not in shown:
        pass
    elif not streams:
        line("pg_stream_200", label, status.get("pg_stream_200") or "not run", target=target)
    else:
        line("pg_stream_200", label, *_stream_cells(streams, target))
    return out


def _gateway_cores(runs: list[dict[str, float]]) -> list[float]:
    """Median cores used by each gateway (gw0, gw1, …) over the repeats."""
    found = sorted({int(k[2:].split("_", 1)[0]) for r in runs for k in r if k.startswith("gw") and k[2].isdigit()})
    return [_med([r[f"gw{i}_cpu_per_s"] for r in runs if f"gw{i}_cpu_per_s" in r]) for i in found]


def _ours(result: dict[str, float], per: str) -> float:
    """CPU the gateways, PostgreSQL, Redis and the load client took, per turn or per second."""
    return sum(result.get(f"{k}_cpu_per_{per}", 0.0) for k in ("gw", "pg", "redis", "client"))


def _busy(runs: list[dict[str, float]]) -> tuple[float, float]:
    """Median cores busy with our processes, and on the whole machine."""
    return _med([_ours(r, per="s") for r in runs]), _med([r.get("box_cpu_per_s", math.nan) for r in runs])


def _stream_cells(streams: list[dict[str, Any]], target: str) -> tuple[str, str, str, str]:
    """The agentgate cell, ratio, target and met of the streaming row, from whatever keys
    `bench/stream_cluster.py` returns (those of `load.streaming` where it has them)."""
    first = streams[0]
    behind = [float(s["behind_p99_ms"]) for s in streams if "behind_p99_ms" in s]
    missed = [float(s["missed_terminals"]) for s in streams if "missed_terminals" in s]
    done = [float(s["runs_completed"]) for s in streams if "runs_completed" in s]
    if not behind:
        return json.dumps(first, default=str)[:90], "-", target, "-"
    cell = f"{triple(behind, '{:.0f}')} ms"
    if missed:
        cell += f", missed {max(missed):.0f}"
    if done:
        cell += f", done {min(done):.0f}/{STREAM_RUNS}"
    ok = _med(behind) <= BEHIND_P99_MS and (not missed or max(missed) == 0)
    ok = ok and (not done or min(done) >= STREAM_RUNS)
    return cell, "-", target, _met(ok)


async def stream_200(admin_url: str, redis_url: str, smoke: bool) -> dict[str, Any] | str:
    """`bench/stream_cluster.py`'s `measure` (200 streams over two processes on PostgreSQL + Redis),
    given what of these arguments it takes; a sentence when it is not there."""
    try:
        from bench import stream_cluster  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return "not available (no bench/stream_cluster.py)"
    measure: Callable[..., Any] | None = getattr(stream_cluster, "measure", None)
    if measure is None or not inspect.iscoroutinefunction(measure):
        return "not available (bench/stream_cluster.py has no async measure)"
    offered: dict[str, Any] = {
        "postgres_url": admin_url,
        "pg_url": admin_url,
        "database_url": admin_url,
        "redis_url": redis_url,
        "runs": STREAM_RUNS,
        "streams": STREAM_RUNS,
        "watchers": STREAM_WATCHERS,
        "processes": STREAM_PROCS,
        "procs": STREAM_PROCS,
        "smoke": smoke,
    }
    params = inspect.signature(measure).parameters
    kwargs = {k: v for k, v in offered.items() if k in params}
    result = await measure(**kwargs)
    return dict(result) if isinstance(result, dict) else {"result": result}
