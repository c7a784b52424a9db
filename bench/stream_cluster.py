"""Many replies streaming at once over a PostgreSQL + Redis cluster, beside the embedded floor.

Starts what it measures, in one run: N gateway processes (default 2) on a fresh PostgreSQL
database and a Redis prefix of their own, and one process on the embedded defaults (a fresh
SQLite file, the in-memory channel layer) as the floor. The same streaming load goes to both:
`--runs` runs at once (the scripted agent's `[[words:N]] [[tick:MS]]`: N words, one per tick),
each run's user watching on `--watchers` connections spread round-robin over the processes
(so every run's deltas cross Redis to the other process), the first of them sending.

Per configuration it prints: runs completed, terminal events missed, how far behind the
model's schedule deltas arrive (receipt minus the send time plus one tick per word already in
the delta: the gateway's whole path, from the send's admission to the reader's socket), the
same for each run's first delta and, after it, counted from it (admission and start, then
streaming), the delivery lag (receipt minus the delta's server stamp), acks, the slowest run,
the gateway processes' CPU time over the stream (user + system, every thread; the load
client's is shown apart) and, for the cluster, the Redis server's commands and CPU over the
stream (`INFO commandstats` / `INFO cpu` deltas: the whole server, so other clients of a
shared Redis count too).

    .venv/bin/python bench/stream_cluster.py                       # 200 runs x 200 words x 20 ms, 3 watchers
    .venv/bin/python bench/stream_cluster.py --runs 20 --words 40  # quick
    .venv/bin/python bench/stream_cluster.py --repeat 3 --json out.json
    .venv/bin/python bench/stream_cluster.py --profile DIR         # the cluster's processes under cProfile

`measure(...)` returns the same figures for a table row (`bench/run.py`); it needs PostgreSQL and
Redis (`BENCH_POSTGRES_URL`, `BENCH_REDIS_URL`; `bench.run.services_reachable()` says whether they
answer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import load  # noqa: E402
from bench.load import Client, Target, pct  # noqa: E402
from bench.run import (  # noqa: E402
    PG_URL,
    REDIS_URL,
    Processes,
    gateway_env,
    manage,
    raise_fd_limit,
    seed,
    start_gateway,
)

CLUSTER = "cluster"
EMBEDDED = "embedded"


def redis_stats(url: str) -> dict[str, float]:
    """The Redis server's command calls (all commands) and CPU seconds so far."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        commands = client.info("commandstats")
        cpu = client.info("cpu")
    finally:
        client.close()
    calls = {name.removeprefix("cmdstat_"): float(stat["calls"]) for name, stat in commands.items()}
    calls["_cpu_s"] = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    return calls


def _stats_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0) > 0}


async def stream(
    target: Target,
    runs: int,
    words: int,
    tick_ms: int,
    watchers: int,
    redis_url: str = "",
    ready: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, float]:
    """`runs` runs stream at once, each watched by `watchers` connections of its user: the figures
    above. `ready` is awaited once the connections are open, before the runs are sent (a profiler's cue)."""
    users = [f"bench{i}" for i in range(runs) for _ in range(watchers)]
    clients = await load.open_many(target, users)
    if ready is not None:
        await ready()
    tag = load.new_key("sc")
    behind: list[float] = []
    streaming: list[float] = []
    lags: list[float] = []
    sent_at: dict[str, float] = {}
    ended: dict[str, float] = {}
    first_delta: dict[str, float] = {}
    acked: dict[str, float] = {}
    finals: list[dict[str, Any]] = []

    def on_delta(payload: dict[str, Any], now: float) -> None:
        lag, late = load.delta_timing(payload, now, sent_at, tick_ms)
        if lag is not None:
            lags.append(lag)
        if late is not None:
            behind.append(late)
            # the same, counted from the run's first delta (how far it fell behind once streaming)
            streaming.append(late - first_delta.setdefault(payload["runId"], late))

    def on_terminal(payload: dict[str, Any], now: float) -> None:
        finals.append(payload)
        ended[payload["runId"]] = max(ended.get(payload["runId"], 0.0), now)

    for c in clients:
        c.on_delta, c.on_terminal = on_delta, on_terminal
    message = f"[[words:{words}]] [[tick:{tick_ms}]]"
    budget = words * tick_ms / 1000 * 8 + 60
    redis_before = redis_stats(redis_url) if redis_url else {}
    target.mark(True)
    cpu = target.cpu_seconds()
    client_cpu = time.process_time()
    try:
        watched = []
        sends = []
        for r in range(runs):
            group: Sequence[Client] = clients[r * watchers : (r + 1) * watchers]
            run_id = load.new_key(tag)
            sent_at[run_id] = time.time()
            watched += [asyncio.wait_for(c.expect_terminal(run_id), budget) for c in group]
            params = {"sessionKey": f"{tag}-s{r}", "idempotencyKey": run_id, "message": message}
            sends.append(_timed_ack(group[0], params, budget, acked))
        start = time.time()
        acks = await asyncio.gather(*sends)
        results = await asyncio.gather(*watched, return_exceptions=True)
        slowest = time.time() - start
        cpu = target.cpu_seconds() - cpu
        target.mark(False)
        client_cpu = time.process_time() - client_cpu
        redis_delta = _stats_delta(redis_before, redis_stats(redis_url)) if redis_url else {}
    finally:
        await load.close_all(clients)
    started = sum(1 for a in acks if a.get("ok") and a["payload"]["status"] == "started")
    got = [r for r in results if isinstance(r, dict)]
    completed = len({r["runId"] for r in got if r["state"] == "final"})
    run_times = [ended[k] - sent_at[k] for k in ended if k in sent_at]
    firsts = list(first_delta.values())
    ack_ms = [v * 1000 for v in acked.values()]
    figures = {
        "runs": float(runs),
        "runs_completed": float(min(completed, started)),
        "missed_terminals": float(runs * watchers - len(got)),
        "behind_p50_ms": pct(behind, 50),
        "behind_p99_ms": pct(behind, 99),
        "behind_max_ms": max(behind, default=float("nan")),
        "lag_p50_ms": pct(lags, 50),
        "lag_p99_ms": pct(lags, 99),
        "ack_p50_ms": pct(ack_ms, 50),
        "ack_p99_ms": pct(ack_ms, 99),
        "first_behind_p50_ms": pct(firsts, 50),
        "first_behind_p99_ms": pct(firsts, 99),
        "streaming_behind_p50_ms": pct(streaming, 50),
        "streaming_behind_p99_ms": pct(streaming, 99),
        "deltas_received": float(len(behind)),
        "slowest_run_s": slowest,
        "run_p50_s": pct(run_times, 50),
        "gateway_cpu_s": cpu,
        "client_cpu_s": client_cpu,
    }
    if redis_url:
        figures["redis_commands"] = sum(v for k, v in redis_delta.items() if not k.startswith("_"))
        figures["redis_cpu_s"] = redis_delta.get("_cpu_s", 0.0)
        figures["redis_commands_per_run"] = figures["redis_commands"] / max(1, runs)
        for name, calls in sorted(redis_delta.items()):
            if not name.startswith("_"):
                figures[f"redis_{name}"] = calls
    return figures


async def _timed_ack(client: Client, params: dict[str, Any], budget: float, acked: dict[str, float]) -> dict[str, Any]:
    sent = time.time()
    answer = await client.request("chat.send", params, budget)
    acked[params["idempotencyKey"]] = time.time() - sent
    return answer


async def measure(
    runs: int = 200,
    words: int = 200,
    tick_ms: int = 20,
    watchers: int = 3,
    procs: int = 2,
    repeat: int = 1,
    *,
    pg_url: str = PG_URL,
    redis_url: str = REDIS_URL,
    embedded: bool = True,
    profile_dir: str = "",
    extra_env: dict[str, str] | None = None,
    log: bool = True,
) -> dict[str, Any]:
    """Start the cluster (`procs` processes on a fresh PostgreSQL database and a Redis prefix of its
    own) and, unless `embedded` is False, the embedded floor; stream the same load `repeat` times
    on each, interleaved; stop them. Returns {"config": …, "cluster": [figures…], "embedded":
    [figures…]}, and beside them the cluster's figures (their median over the repeats) as they are
    named in each (`behind_p99_ms`, `missed_terminals`, `runs_completed`, …) and the floor's as
    `floor_<name>`: what a table row reads."""
    import psycopg

    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="agentgate-stream-"))
    processes = Processes(tmp)
    name = f"agentgate_stream_{secrets.token_hex(5)}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    out: dict[str, Any] = {
        "config": {"runs": runs, "words": words, "tick_ms": tick_ms, "watchers": watchers, "procs": procs},
        CLUSTER: [],
        EMBEDDED: [],
    }
    try:
        extra = dict(extra_env or {})
        db_url = urlparse(pg_url)._replace(path=f"/{name}").geturl()
        prefix = f"bench{secrets.token_hex(4)}"
        env = gateway_env(db_url, REDIS_URL=redis_url, REDIS_LAYER_PREFIX=prefix, **extra)
        manage(env, "migrate", "--noinput", "-v0")
        seeded = seed(env, runs, 0)
        urls, pids = [], []
        for i in range(procs):
            profile = _profile_file(profile_dir, i)
            url, pid = start_gateway(processes, env, f"gateway-pg-{i}", profile)
            urls.append(url)
            pids.append(pid)
        cluster = Target(CLUSTER, urls, seeded["tokens"], pids, profiled=bool(profile_dir))
        targets = [(CLUSTER, cluster, redis_url)]
        if embedded:
            env_e = gateway_env(f"sqlite:///{tmp / 'embedded.sqlite3'}", **extra)
            manage(env_e, "migrate", "--noinput", "-v0")
            seeded_e = seed(env_e, runs, 0)
            url_e, pid_e = start_gateway(processes, env_e, "gateway-embedded")
            targets.append((EMBEDDED, Target(EMBEDDED, [url_e], seeded_e["tokens"], [pid_e]), ""))
        for rep in range(repeat):
            for label, target, redis in targets:
                t0 = time.perf_counter()
                figures = await stream(target, runs, words, tick_ms, watchers, redis)
                out[label].append(figures)
                if log:
                    shown = ", ".join(
                        f"{k}={v:.4g}"
                        for k, v in figures.items()
                        if not k.startswith("redis_")
                        or k in ("redis_commands", "redis_cpu_s", "redis_commands_per_run")
                    )
                    print(f"  [{rep + 1}] {label:<8} {time.perf_counter() - t0:5.1f} s  {shown}", file=sys.stderr)
                await asyncio.sleep(1.0)
    finally:
        processes.stop_all()
        with contextlib.suppress(Exception), psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        with contextlib.suppress(Exception):
            _drop_prefix(redis_url, prefix)
        if profile_dir:
            _keep_logs(tmp, profile_dir)
        shutil.rmtree(tmp, ignore_errors=True)
    out.update(_medians(out[CLUSTER]))
    out.update({f"floor_{k}": v for k, v in _medians(out[EMBEDDED]).items()})
    return out


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for run in runs for k in run}
    return {k: statistics.median(run[k] for run in runs if k in run) for k in sorted(keys)}


def _profile_file(profile_dir: str, i: int) -> str:
    return str(Path(profile_dir).resolve() / f"gateway-{i}.prof") if profile_dir else ""


def _keep_logs(tmp: Path, into: str) -> None:
    for log_file in tmp.glob("*.log"):
        shutil.copy(log_file, Path(into) / log_file.name)


def _drop_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


ROWS = [
    ("runs completed", "runs_completed", "{:.0f}"),
    ("terminal events missed", "missed_terminals", "{:.0f}"),
    ("behind schedule p50 ms", "behind_p50_ms", "{:.0f}"),
    ("behind schedule p99 ms", "behind_p99_ms", "{:.0f}"),
    ("behind schedule max ms", "behind_max_ms", "{:.0f}"),
    ("delivery lag p50 ms", "lag_p50_ms", "{:.0f}"),
    ("delivery lag p99 ms", "lag_p99_ms", "{:.0f}"),
    ("slowest run s", "slowest_run_s", "{:.2f}"),
    ("ack p50 / p99 ms", ("ack_p50_ms", "ack_p99_ms"), "{:.0f}"),
    ("first delta behind p50 / p99", ("first_behind_p50_ms", "first_behind_p99_ms"), "{:.0f}"),
    ("  then behind it p50 / p99", ("streaming_behind_p50_ms", "streaming_behind_p99_ms"), "{:.0f}"),
    ("deltas received", "deltas_received", "{:.0f}"),
    ("gateway CPU s (all procs)", "gateway_cpu_s", "{:.1f}"),
    ("load client CPU s", "client_cpu_s", "{:.1f}"),
    ("Redis commands (server)", "redis_commands", "{:.0f}"),
    ("Redis commands per run", "redis_commands_per_run", "{:.0f}"),
    ("Redis CPU s", "redis_cpu_s", "{:.2f}"),
]


def _cell(values: list[dict[str, float]], key: str | tuple[str, ...], fmt: str) -> str:
    if isinstance(key, tuple):
        return " / ".join(_cell(values, k, fmt) for k in key)
    got = [v[key] for v in values if key in v]
    if not got:
        return "-"
    if len(got) == 1:
        return fmt.format(got[0])
    return "..".join(fmt.format(x) for x in (min(got), statistics.median(got), max(got)))


def render(result: dict[str, Any]) -> str:
    cfg = result["config"]
    head_c = f"{cfg['procs']} procs, PostgreSQL + Redis"
    head_e = "1 proc, embedded (floor)"
    lines = [
        f"{cfg['runs']} runs x {cfg['words']} words x {cfg['tick_ms']} ms, {cfg['watchers']} watchers each"
        f" (ideal run {cfg['words'] * cfg['tick_ms'] / 1000:.1f} s); several repeats: min..median..max",
        f"{'measure':<28} | {head_c:<28} | {head_e:<28}",
        f"{'-' * 28}-+-{'-' * 28}-+-{'-' * 28}",
    ]
    for label, key, fmt in ROWS:
        lines.append(f"{label:<28} | {_cell(result[CLUSTER], key, fmt):<28} | {_cell(result[EMBEDDED], key, fmt):<28}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--words", type=int, default=200)
    parser.add_argument("--tick", type=int, default=20, help="ms per word")
    parser.add_argument("--watchers", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-embedded", action="store_true", help="the cluster only")
    parser.add_argument("--json", default="", help="write every raw figure to this file")
    parser.add_argument("--profile", default="", help="run the cluster's processes under cProfile: DIR/gateway-N.prof")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for every gateway process")
    args = parser.parse_args()
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    extra = dict(item.split("=", 1) for item in args.env)
    began = time.perf_counter()
    result = asyncio.run(
        measure(
            args.runs,
            args.words,
            args.tick,
            args.watchers,
            args.procs,
            args.repeat,
            embedded=not args.no_embedded,
            profile_dir=args.profile,
            extra_env=extra,
        )
    )
    print(f"stream over a cluster ({os.cpu_count()} CPUs, {time.perf_counter() - began:.0f} s total)")
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
