"""The measured run behind the capacity model of docs/deployment.md: 1, 2 and 3 gateway processes
on PostgreSQL + Redis, and what each turn and each streamed delta costs every part of the cluster.

Starts the services (`bench/scaleout.py`: by default a private PostgreSQL with
`pg_stat_statements` and a private Redis), a fresh database, and as many gateway processes as the
largest level; users and tokens are seeded first. Then, `--repeat` times:

- **short turns** (`[[tick:0]] the quick brown fox jumps`, one delta) on 1, 2, 3 processes, each
  with `--conns` connections of its own (each connection its own user and session): turns/s, and
  per turn the gateways' CPU, PostgreSQL's statements, transactions, write transactions, WAL and
  CPU, Redis's commands, bytes and CPU, and the load client's CPU; with how many cores each took and
  how busy the whole machine was (other work shares it);
- **streamed turns** (`[[words:40]] [[tick:60]]`: one delta per word, the delta interval being
  50 ms) on one process, and on two with a watcher of each user on the other process (every event
  crosses Redis to it): with the short turns, what one more delta costs.

Each figure is taken over a window inside continuous load (`scaleout.steady_turns`), so
PostgreSQL's transaction counts, which each backend reports up to a second late, are whole. No
process is pinned: three gateways on two CPUs share them as the kernel sees fit; each one's CPU is
read from /proc. Then the model: what one process, PostgreSQL and Redis each carry, and the turns/s
the 1-process figures predict for 2 and 3 processes on this machine (the CPUs other work left
free, over all the CPU a turn costs) against what was measured.

    .venv/bin/python bench/capacity.py                               # about 4 minutes on 2 cores
    .venv/bin/python bench/capacity.py --procs 1,2 --repeat 1 --seconds 5 --json out.json
    .venv/bin/python bench/capacity.py --services external           # BENCH_POSTGRES_URL / BENCH_REDIS_URL
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import run, scaleout  # noqa: E402
from bench.load import TURN_MESSAGE  # noqa: E402

Result = dict[str, float]

# (label, key, scale, format): the table's rows, each a median over the repeats
MEASURES: list[tuple[str, str, float, str]] = [
    ("turns/s", "turns_per_s", 1, "{:.1f}"),
    ("deltas per turn", "deltas_per_turn", 1, "{:.1f}"),
    ("gateway CPU ms per turn (all processes)", "gw_cpu_per_turn", 1000, "{:.2f}"),
    ("turns per gateway CPU-second", "turns_per_gw_cpu_s", 1, "{:.1f}"),
    ("cores the gateways took (sum)", "gw_cpu_per_s", 1, "{:.2f}"),
    ("PostgreSQL statements per turn", "pg_stmts_per_turn", 1, "{:.1f}"),
    ("PostgreSQL BEGIN/COMMIT per turn", "pg_txn_cmds_per_turn", 1, "{:.1f}"),
    ("PostgreSQL foreign-key checks per turn (at commit)", "pg_fk_checks_per_turn", 1, "{:.1f}"),
    ("PostgreSQL transactions per turn", "pg_xacts_per_turn", 1, "{:.1f}"),
    ("PostgreSQL write transactions per turn", "pg_write_xacts_per_turn", 1, "{:.2f}"),
    ("PostgreSQL WAL KB per turn", "pg_wal_kb_per_turn", 1, "{:.1f}"),
    ("PostgreSQL statements/s", "pg_stmts_per_s", 1, "{:.0f}"),
    ("PostgreSQL transactions/s", "pg_xacts_per_s", 1, "{:.0f}"),
    ("PostgreSQL CPU ms per turn", "pg_cpu_per_turn", 1000, "{:.2f}"),
    ("PostgreSQL cores", "pg_cpu_per_s", 1, "{:.2f}"),
    ("Redis commands per turn", "redis_cmds_per_turn", 1, "{:.1f}"),
    ("Redis KB in+out per turn", "redis_net_kb_per_turn", 1, "{:.1f}"),
    ("Redis commands/s", "redis_cmds_per_s", 1, "{:.0f}"),
    ("Redis CPU ms per turn", "redis_cpu_per_turn", 1000, "{:.2f}"),
    ("Redis cores", "redis_cpu_per_s", 1, "{:.2f}"),
    ("load client cores", "client_cpu_per_s", 1, "{:.2f}"),
    ("all our CPU ms per turn", "ours_cpu_per_turn", 1000, "{:.2f}"),
    ("machine: cores busy (all work)", "box_cpu_per_s", 1, "{:.2f}"),
    ("machine: cores other work took", "others_cpu_per_s", 1, "{:.2f}"),
]
# what one more delta costs: (label, key of a per-turn figure, scale, format)
PER_DELTA: list[tuple[str, str, float, str]] = [
    ("gateway CPU µs", "gw_cpu_per_turn", 1e6, "{:.0f}"),
    ("PostgreSQL statements", "pg_stmts_per_turn", 1, "{:.2f}"),
    ("PostgreSQL foreign-key checks", "pg_fk_checks_per_turn", 1, "{:.2f}"),
    ("PostgreSQL transactions", "pg_xacts_per_turn", 1, "{:.2f}"),
    ("PostgreSQL write transactions", "pg_write_xacts_per_turn", 1, "{:.2f}"),
    ("PostgreSQL WAL KB", "pg_wal_kb_per_turn", 1, "{:.2f}"),
    ("PostgreSQL CPU µs", "pg_cpu_per_turn", 1e6, "{:.0f}"),
    ("Redis commands", "redis_cmds_per_turn", 1, "{:.2f}"),
    ("Redis KB", "redis_net_kb_per_turn", 1, "{:.2f}"),
    ("Redis CPU µs", "redis_cpu_per_turn", 1e6, "{:.0f}"),
]


def enrich(r: Result) -> Result:
    """Derived figures: turns per gateway CPU-second, all our CPU, what other work took."""
    if r.get("gw_cpu_per_turn"):
        r["turns_per_gw_cpu_s"] = 1 / r["gw_cpu_per_turn"]
    parts = ("gw", "pg", "redis", "client")
    r["ours_cpu_per_turn"] = sum(r.get(f"{k}_cpu_per_turn", 0.0) for k in parts)
    ours = sum(r.get(f"{k}_cpu_per_s", 0.0) for k in parts)
    r["others_cpu_per_s"] = max(0.0, r.get("box_cpu_per_s", math.nan) - ours)
    return r


def med(runs: list[Result], key: str) -> float:
    values = [r[key] for r in runs if key in r and not math.isnan(r[key])]
    return statistics.median(values) if values else math.nan


def fmt(value: float, form: str) -> str:
    return "-" if math.isnan(value) else form.format(value)


def table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(header[i]), *(len(r[i]) for r in body)) for i in range(len(header))]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def per_delta(stream: list[Result], short: list[Result]) -> dict[str, float]:
    """What one more delta costs: the streamed turns' figure minus the short turns', over the
    difference in deltas per turn."""
    extra = med(stream, "deltas_per_turn") - med(short, "deltas_per_turn")
    return {key: (med(stream, key) - med(short, key)) / extra if extra > 0 else math.nan for _, key, _, _ in PER_DELTA}


def div(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def report(levels: dict[str, list[Result]], procs: list[int], ncpu: int, args: argparse.Namespace) -> str:
    """The tables and the model, as printed."""
    short = {n: levels.get(f"short_{n}", []) for n in procs}
    columns = [f"{n} proc{'s' if n > 1 else ''}" for n in procs]
    streams = [("stream_1", "streamed, 1 proc"), ("stream_2x", "streamed, 2 procs, watcher across")]
    streams = [(k, label) for k, label in streams if levels.get(k)]
    body = []
    for label, key, scale, form in MEASURES:
        row = [label] + [fmt(med(short[n], key) * scale, form) for n in procs]
        row += [fmt(med(levels[k], key) * scale, form) for k, _ in streams]
        body.append(row)
    turns_range = ["turns/s min - max"] + [
        f"{min(r['turns_per_s'] for r in short[n]):.1f} - {max(r['turns_per_s'] for r in short[n]):.1f}"
        if short[n]
        else "-"
        for n in procs
    ]
    body.insert(1, turns_range + ["-"] * len(streams))
    cores = ["cores each gateway took"] + [
        " + ".join(f"{med(short[n], f'gw{i}_cpu_per_s'):.2f}" for i in range(n)) for n in procs
    ]
    body.insert(
        1 + next(i for i, r in enumerate(body) if r[0] == "cores the gateways took (sum)"), cores + ["-"] * len(streams)
    )
    out = [
        f"short turns: {args.conns} connections per process; streamed: {args.words} words at {args.tick} ms; "
        "medians of the repeats",
        table(["measure", *columns, *(label for _, label in streams)], body),
    ]

    if levels.get("stream_1") and short.get(1):
        deltas = [("one process", per_delta(levels["stream_1"], short[1]))]
        if levels.get("stream_2x") and short.get(2):
            deltas.append(("a watcher on another process", per_delta(levels["stream_2x"], short[2])))
        rows = [[label] + [fmt(d[key] * scale, form) for _, d in deltas] for label, key, scale, form in PER_DELTA]
        out += ["", "one more delta costs", table(["per delta", *(name for name, _ in deltas)], rows)]

    one = short.get(1, [])
    if one:
        gw_ms = med(one, "gw_cpu_per_turn") * 1000
        pg_ms = med(one, "pg_cpu_per_turn") * 1000
        redis_ms = med(one, "redis_cpu_per_turn") * 1000
        stmts = med(one, "pg_stmts_per_turn")
        cmds = med(one, "redis_cmds_per_turn")
        all_ms = med(one, "ours_cpu_per_turn") * 1000
        t1 = med(one, "turns_per_s")
        model = [
            [
                "one gateway process",
                f"{div(1000, gw_ms):.0f} turns/s per core it gets ({gw_ms:.1f} ms a turn); "
                f"measured alone: {t1:.1f} turns/s on {med(one, 'gw_cpu_per_s'):.2f} cores",
            ],
            [
                "PostgreSQL",
                f"{div(1000, pg_ms):.0f} turns/s per core ({pg_ms:.2f} ms a turn: {stmts:.0f} statements, "
                f"{div(1000 * pg_ms, stmts):.0f} µs each): {div(1e6, div(1000 * pg_ms, stmts)):.0f} statements/s "
                "per core",
            ],
            [
                "Redis (one thread)",
                f"{div(1000, redis_ms):.0f} turns/s at most ({redis_ms:.2f} ms a turn: {cmds:.0f} commands, "
                f"{div(1000 * redis_ms, cmds):.1f} µs each)",
            ],
        ]
        out += ["", "the model (from the 1-process run)", table(["part", "carries"], model)]
        check = []
        for n in procs:
            runs = short[n]
            if not runs:
                continue
            free = ncpu - med(runs, "others_cpu_per_s")
            predicted = min(n * t1, div(free, all_ms / 1000))
            measured = med(runs, "turns_per_s")
            check.append(
                [
                    f"{n}",
                    f"{free:.2f}",
                    f"min({n} x {t1:.1f}, {free:.2f} / {all_ms / 1000:.4f}) = {predicted:.1f}",
                    f"{measured:.1f}",
                    f"{div(measured, predicted):.2f}",
                ]
            )
        out += [
            "",
            f"check: turns/s predicted from 1 process (its turns/s, and the {ncpu} CPUs less what other work "
            "took, over all our CPU per turn) against measured",
            table(["procs", "cores free", "predicted", "measured", "measured / predicted"], check),
        ]
    return "\n".join(out)


def top_per_turn(svc: scaleout.Services, db_url: str, runs: list[Result]) -> list[tuple[float, str]]:
    """The statements of the level just run, most called first, per turn: their calls scaled so
    that all of them add up to the window's statements, BEGIN/COMMIT and checks per turn."""
    if not runs:
        return []
    every = scaleout.top_statements(svc, db_url, 10_000)
    total = sum(calls for calls, _ in every)
    per_turn = sum(runs[0].get(k, 0.0) for k in ("pg_stmts_per_turn", "pg_txn_cmds_per_turn", "pg_fk_checks_per_turn"))
    return [(calls * per_turn / total, text) for calls, text in every if total]


def redis_per_turn(before: dict[str, float], after: dict[str, float], runs: list[Result]) -> list[tuple[float, str]]:
    """Each Redis command's calls over a level, most called first, scaled as `top_per_turn`."""
    if not runs:
        return []
    calls = {name: n - before.get(name, 0.0) for name, n in after.items() if n > before.get(name, 0.0)}
    total = sum(calls.values())
    per_turn = runs[0].get("redis_cmds_per_turn", 0.0)
    return sorted(((n * per_turn / total, name) for name, n in calls.items()), reverse=True)


Top = list[tuple[float, str]]


async def measure(args: argparse.Namespace) -> tuple[dict[str, list[Result]], str, Top, Top]:
    procs_wanted = sorted({int(p) for p in args.procs.split(",")})
    levels: dict[str, list[Result]] = {}
    top: Top = []
    redis_top: Top = []
    tmp = Path(tempfile.mkdtemp(prefix="agentgate-capacity-"))
    processes = run.Processes(tmp)
    run.raise_fd_limit()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        stack.callback(processes.stop_all)
        svc = scaleout.open_services(args.services, stack)
        began = time.perf_counter()
        count = max(max(procs_wanted), 2)
        cluster = run.start_pg_cluster(processes, stack, svc, args.conns * count, count)
        print(f"{svc.description}; {count} gateways up in {time.perf_counter() - began:.0f} s", file=sys.stderr)

        async def one(key: str, n: int, message: str, conns: int, watchers: int = 0) -> None:
            target = cluster.target(key, n)
            t0 = time.perf_counter()
            try:
                r = await scaleout.steady_turns(
                    target, conns, args.seconds, target.meter, settle=args.settle, message=message, watchers=watchers
                )
            except Exception as exc:
                print(f"  {key}: FAILED {exc!r}", file=sys.stderr, flush=True)
                return
            levels.setdefault(key, []).append(enrich(r))
            print(
                f"  {key:<10} {time.perf_counter() - t0:5.1f} s  turns/s {r['turns_per_s']:.1f}  "
                f"gw ms/turn {r.get('gw_cpu_per_turn', math.nan) * 1000:.2f}  "
                f"stmts/turn {r.get('pg_stmts_per_turn', math.nan):.1f}  "
                f"redis cmds/turn {r.get('redis_cmds_per_turn', math.nan):.1f}  "
                f"box {r.get('box_cpu_per_s', math.nan):.2f} cores",
                file=sys.stderr,
                flush=True,
            )
            await asyncio.sleep(0.5)

        stream = f"[[words:{args.words}]] [[tick:{args.tick}]]"
        for rep in range(args.repeat):
            for n in procs_wanted:
                if rep == 0 and n == procs_wanted[0]:
                    # what the level's statements and Redis commands were, scaled to its window's per turn
                    if cluster.meter.statements:
                        scaleout.reset_statements(svc)  # (before the level: its window's totals are whole)
                    commands = scaleout.redis_commands(svc)
                    await one(f"short_{n}", n, TURN_MESSAGE, n * args.conns)
                    runs = levels.get(f"short_{n}", [])
                    if cluster.meter.statements:
                        top[:] = top_per_turn(svc, cluster.db_url, runs)
                    redis_top[:] = redis_per_turn(commands, scaleout.redis_commands(svc), runs)
                    continue
                await one(f"short_{n}", n, TURN_MESSAGE, n * args.conns)
            if not args.no_stream:
                await one("stream_1", 1, stream, args.conns)
                await one("stream_2x", 2, stream, args.conns, watchers=1)
    return levels, svc.description, top, redis_top


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", default="1,2,3", help="gateway processes at each level")
    parser.add_argument("--conns", type=int, default=10, help="connections per process (short turns)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window at each level")
    parser.add_argument("--settle", type=float, default=2.0, help="load before the window opens")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--words", type=int, default=40, help="streamed turns: words (one delta each)")
    parser.add_argument("--tick", type=int, default=60, help="streamed turns: ms between words")
    parser.add_argument("--no-stream", action="store_true", help="short turns only")
    parser.add_argument("--services", choices=("auto", "private", "external"), default="auto")
    parser.add_argument("--top", type=int, default=25, help="statements shown by calls per turn")
    parser.add_argument("--json", default="", help="write every raw figure to this file")
    args = parser.parse_args()
    began = time.perf_counter()
    try:
        levels, services, top, redis_top = asyncio.run(measure(args))
    except scaleout.NotAvailable as exc:
        print(f"not run: {exc}", file=sys.stderr)
        sys.exit(2)
    ncpu = len(os.sched_getaffinity(0))
    procs = sorted({int(p) for p in args.procs.split(",")})
    print(
        f"capacity on PostgreSQL + Redis ({services}; {ncpu} CPUs, {args.repeat} repeats of "
        f"{args.seconds:g} s windows, {time.perf_counter() - began:.0f} s total)"
    )
    print(report(levels, procs, ncpu, args))
    if top:
        print(
            f"\nPostgreSQL statements per turn, {procs[0]} proc, short turns (pg_stat_statements; the first {args.top})"
        )
        for calls, text in top[: args.top]:
            print(f"  {calls:5.2f}  {text[:110]}")
    if redis_top:
        print(f"\nRedis commands per turn, {procs[0]} proc, short turns (INFO commandstats; a script's own count)")
        print("  " + ", ".join(f"{name} {calls:.1f}" for calls, name in redis_top))
    if args.json:
        raw: dict[str, Any] = {
            "args": vars(args),
            "services": services,
            "levels": levels,
            "statements": top,
            "redis_commands": redis_top,
        }
        Path(args.json).write_text(json.dumps(raw, indent=2, default=str))
    wanted: Callable[[str], bool] = lambda k: k.startswith("short_") or not args.no_stream  # noqa: E731
    missing = [k for k in [*(f"short_{n}" for n in procs), "stream_1", "stream_2x"] if wanted(k) and not levels.get(k)]
    if missing:
        print(f"levels that failed every repeat: {missing}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
