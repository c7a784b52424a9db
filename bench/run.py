"""`make bench`: the gateway beside a bare `websockets` floor server, one table of figures.

Starts what it measures: the floor (`bench/floor_server.py`) and one `manage.py serve`
on the embedded defaults (a fresh SQLite file in a temporary folder, the in-memory
channel layer, the scripted agent) with the per-connection rate limit lifted
(GATEWAY_RATE_PER_SEC=100000). Users, tokens and a 10,000-message session are
bulk-inserted first (`bench/seed.py`). Every scenario runs against the floor and
then the gateway, `--repeat` times, interleaved, so both see the same machine; the
table shows min/median/max of each, the ratio of the medians and the target from
issue 9. When PostgreSQL (127.0.0.1:5432, user postgres) and Redis (127.0.0.1:6379)
answer, a last row compares one gateway process with two behind the same clients.

    .venv/bin/python bench/run.py                  # the full table (about 6 minutes on 2 cores)
    .venv/bin/python bench/run.py --smoke          # about 10 s, tiny counts: checks it all still works
    .venv/bin/python bench/run.py --only turns_10,resend_10 --json out.json
    .venv/bin/python bench/run.py --target ws://127.0.0.1:8000/ws/gateway --target-pid PID --only turns_10
      (an already-running gateway; its DATABASE_URL must be in the environment so users can be seeded)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import load  # noqa: E402
from bench.load import Target  # noqa: E402

PYTHON = sys.executable
PG_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass
class Config:
    repeat: int = 3
    seconds: float = 3.0
    conns: tuple[int, int, int] = (1, 10, 50)
    fanout: int = 50
    ack_one_user: int = 10
    connect_count: int = 100
    many: int = 1000
    stream_runs: int = 100
    stream_words: int = 200
    stream_tick: int = 20
    stream_watchers: int = 3
    long_messages: int = 10_000
    pg_conns: int = 20
    idle_seconds: float = 1.0

    @classmethod
    def smoke(cls) -> Config:
        return cls(
            repeat=1,
            seconds=0.25,
            idle_seconds=0.1,
            conns=(1, 3, 5),
            fanout=5,
            ack_one_user=3,
            connect_count=5,
            many=20,
            stream_runs=3,
            stream_words=10,
            stream_tick=5,
            stream_watchers=2,
            long_messages=200,
            pg_conns=2,
        )


Scenario = Callable[[Target], Awaitable[dict[str, float]]]


def scenarios(cfg: Config) -> dict[str, Scenario]:
    c1, c10, c50 = cfg.conns
    s = cfg.seconds
    return {
        "turns_1": lambda t: load.turns(t, c1, s),
        "turns_10": lambda t: load.turns(t, c10, s),
        "turns_50": lambda t: load.turns(t, c50, s),
        "fanout": lambda t: load.turns(t, cfg.fanout, s, one_user="benchfan"),
        "ack_one_user": lambda t: load.turns(t, cfg.ack_one_user, s, one_user="benchfan"),
        "tool_turns_10": lambda t: load.turns(t, c10, s, message=load.TOOL_TURN_MESSAGE),
        "resend_1": lambda t: load.resends(t, c1, s * 0.6),
        "resend_10": lambda t: load.resends(t, c10, s * 0.6),
        "connect": lambda t: load.connect_latency(t, cfg.connect_count),
        "connect_many": lambda t: load.connect_many(t, cfg.many, cfg.idle_seconds),
        "stream": lambda t: load.streaming(t, cfg.stream_runs, cfg.stream_words, cfg.stream_tick, cfg.stream_watchers),
        "long_session": lambda t: load.long_session(t, s),
    }


@dataclass
class Row:
    """One line of the table: `scenario`'s `metric`, with a target check on the gateway's medians."""

    row: str
    label: str
    scenario: str
    metric: str
    target: str = "-"
    check: Callable[[Callable[[str, str], float]], bool] | None = None
    fmt: str = "{:.1f}"


def rows(cfg: Config) -> list[Row]:
    c1, c10, c50 = cfg.conns
    return [
        Row("turns_1", f"turns/s, {c1} conn", "turns_1", "turns_per_s"),
        Row(
            "turns_10",
            f"turns/s, {c10} conns",
            "turns_10",
            "turns_per_s",
            ">= 200",
            lambda m: m("turns_10", "turns_per_s") >= 200,
        ),
        Row(
            "turns_50",
            f"turns/s, {c50} conns",
            "turns_50",
            "turns_per_s",
            f">= {c10} conns",
            lambda m: m("turns_50", "turns_per_s") >= m("turns_10", "turns_per_s"),
        ),
        Row(
            "fanout",
            f"turns/s, {cfg.fanout} conns of 1 user",
            "fanout",
            "turns_per_s",
            f">= 1/4 of {c50} users",
            lambda m: m("fanout", "turns_per_s") >= 0.25 * m("turns_50", "turns_per_s"),
        ),
        Row(
            "fanout_max",
            f"slowest turn s, {cfg.fanout} conns of 1 user",
            "fanout",
            "turn_max_s",
            "<= 2 s",
            lambda m: m("fanout", "turn_max_s") <= 2.0,
            "{:.3f}",
        ),
        Row(
            "ack_p50_1",
            f"new-run ack p50 ms, {c1} conn",
            "turns_1",
            "ack_p50_ms",
            "<= 3 ms",
            lambda m: m("turns_1", "ack_p50_ms") <= 3.0,
            "{:.2f}",
        ),
        Row(
            "ack_p99_one_user",
            f"new-run ack p99 ms, {cfg.ack_one_user} conns of 1 user",
            "ack_one_user",
            "ack_p99_ms",
            fmt="{:.2f}",
        ),
        Row(
            "ack_p99_50",
            f"new-run ack p99 ms, {c50} conns",
            "turns_50",
            "ack_p99_ms",
            "<= 50 ms",
            lambda m: m("turns_50", "ack_p99_ms") <= 50.0,
            "{:.2f}",
        ),
        Row("tool_turns_10", f"tool turns/s, {c10} conns (one MCP call each)", "tool_turns_10", "turns_per_s"),
        Row("tool_turn_max", f"slowest tool turn (s), {c10} conns", "tool_turns_10", "turn_max_s", fmt="{:.2f}"),
        Row("resend_1", f"resend acks/s, {c1} conn", "resend_1", "acks_per_s", fmt="{:.0f}"),
        Row(
            "resend_10",
            f"resend acks/s, {c10} conns",
            "resend_10",
            "acks_per_s",
            ">= 1500",
            lambda m: m("resend_10", "acks_per_s") >= 1500,
            "{:.0f}",
        ),
        Row(
            "connect_p50",
            "connect to hello-ok p50 ms",
            "connect",
            "connect_p50_ms",
            "<= 5 ms",
            lambda m: m("connect", "connect_p50_ms") <= 5.0,
            "{:.2f}",
        ),
        Row(
            "connect_many",
            f"{cfg.many} connect at once, all hello-ok s",
            "connect_many",
            "open_all_s",
            "<= 10 s",
            lambda m: m("connect_many", "open_all_s") <= 10.0,
            "{:.2f}",
        ),
        Row(
            "rss_idle",
            f"RSS MB with {cfg.many} idle conns",
            "connect_many",
            "rss_idle_mb",
            "<= 120 MB",
            lambda m: m("connect_many", "rss_idle_mb") <= 120.0,
        ),
        Row(
            "stream_done",
            f"stream: runs completed of {cfg.stream_runs}",
            "stream",
            "runs_completed",
            "all",
            lambda m: m("stream", "runs_completed") >= cfg.stream_runs,
            "{:.0f}",
        ),
        Row(
            "stream_lag",
            f"stream: delta lag p99 ms ({cfg.stream_runs}x{cfg.stream_words} words, "
            f"{cfg.stream_tick} ms, {cfg.stream_watchers} watchers)",
            "stream",
            "lag_p99_ms",
            "<= 250 ms",
            lambda m: m("stream", "lag_p99_ms") <= 250.0,
        ),
        Row(
            "stream_behind",
            "stream: delta behind word schedule p99 ms",
            "stream",
            "behind_p99_ms",
        ),
        Row(
            "stream_missed",
            "stream: terminal events missed",
            "stream",
            "missed_terminals",
            "0",
            lambda m: m("stream", "missed_terminals") == 0,
            "{:.0f}",
        ),
        Row(
            "stream_slowest",
            f"stream: slowest run s (ideal {cfg.stream_words * cfg.stream_tick / 1000:.1f})",
            "stream",
            "slowest_run_s",
            fmt="{:.2f}",
        ),
        Row(
            "long_session",
            f"turn ms, {cfg.long_messages}-msg session / new session",
            "long_session",
            "long_over_new",
            "<= 1.5x",
            lambda m: m("long_session", "long_over_new") <= 1.5,
            "{:.2f}",
        ),
    ]


# --- processes --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"server on port {port} not up after {timeout} s:\n{log.read_text(errors='replace')}")


def wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    """Until /readyz answers 200 (database, channel layer through the hub, loops): what a load balancer waits for."""
    wait_port(port, proc, log, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3):
            return
        time.sleep(0.05)
    raise RuntimeError(f"gateway on port {port} never ready:\n{log.read_text(errors='replace')}")


class Processes:
    """Every subprocess this run starts; stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, args: list[str], env: dict[str, str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc, log

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def stop_all(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(Exception):
                self.stop(proc)


def gateway_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": "",
            "GATEWAY_RATE_PER_SEC": "100000",
            "GATEWAY_MAX_CONNECTIONS_PER_USER": "100000",
            "PYTHONUNBUFFERED": "1",
            "SECRET_KEY": env.get("SECRET_KEY") or secrets.token_urlsafe(40),
            "GATEWAY_LOG_LEVEL": "WARNING",
            "GATEWAY_SHUTDOWN_DRAIN_SECONDS": "1",
        }
    )
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def seed(env: dict[str, str], users: int, long_messages: int) -> dict[str, Any]:
    proc = subprocess.run(
        [PYTHON, "bench/seed.py", "--users", str(users), "--long-messages", str(long_messages)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"seeding failed:\n{proc.stdout}\n{proc.stderr}")
    seeded: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return seeded


def start_gateway(procs: Processes, env: dict[str, str], name: str) -> tuple[str, int]:
    port = free_port()
    proc, log = procs.spawn([PYTHON, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)], env, name)
    wait_ready(port, proc, log)
    return f"ws://127.0.0.1:{port}/ws/gateway", proc.pid


def start_floor(procs: Processes) -> tuple[str, int]:
    port = free_port()
    proc, log = procs.spawn([PYTHON, "bench/floor_server.py", "--port", str(port)], dict(os.environ), "floor")
    wait_port(port, proc, log)
    return f"ws://127.0.0.1:{port}/", proc.pid


# --- PostgreSQL + Redis: one process against two -------------------------------------------------------


def services_reachable() -> bool:
    for url, port in ((PG_URL, 5432), (REDIS_URL, 6379)):
        parsed = urlparse(url)
        try:
            with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or port), timeout=1):
                pass
        except OSError:
            return False
    return True


async def pg_row(procs: Processes, cfg: Config) -> dict[str, Any]:
    """turns/s of `pg_conns` connections (each its own user) on one process, then split over two."""
    import psycopg

    name = f"agentgate_bench_{secrets.token_hex(5)}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db_url = urlparse(PG_URL)._replace(path=f"/{name}").geturl()
    started: list[subprocess.Popen[bytes]] = []
    try:
        env = gateway_env(db_url, REDIS_URL=REDIS_URL, REDIS_LAYER_PREFIX=f"bench{secrets.token_hex(4)}")
        manage(env, "migrate", "--noinput", "-v0")
        seeded = seed(env, cfg.pg_conns, 0)
        n_before = len(procs.procs)
        url_a, pid_a = start_gateway(procs, env, "gateway-pg-a")
        url_b, pid_b = start_gateway(procs, env, "gateway-pg-b")
        started = procs.procs[n_before:]
        one = Target("pg-one", [url_a], seeded["tokens"], [pid_a])
        two = Target("pg-two", [url_a, url_b], seeded["tokens"], [pid_a, pid_b])
        ones: list[float] = []
        twos: list[float] = []
        for _ in range(cfg.repeat):
            ones.append((await load.turns(one, cfg.pg_conns, cfg.seconds))["turns_per_s"])
            twos.append((await load.turns(two, cfg.pg_conns, cfg.seconds))["turns_per_s"])
        return {"one": ones, "two": twos}
    finally:
        for proc in started:
            procs.stop(proc)
        with contextlib.suppress(Exception), psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the table --------------------------------------------------------------------------------------------


def triple(values: list[float], fmt: str) -> str:
    if not values:
        return "n/a"
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def render(
    cfg: Config, results: dict[str, dict[str, list[dict[str, float]]]], pg: dict[str, Any] | str, only: set[str] | None
) -> tuple[str, bool]:
    def values(side: str, scenario: str, metric: str) -> list[float]:
        return [r[metric] for r in results.get(side, {}).get(scenario, []) if metric in r]

    def med(scenario: str, metric: str) -> float:
        vals = values("agentgate", scenario, metric)
        return statistics.median(vals) if vals else math.nan

    header = ["row", "measure", "floor min/med/max", "agentgate min/med/max", "ratio", "target", "met?"]
    table: list[list[str]] = []
    all_met = True
    for row in rows(cfg):
        if only is not None and row.scenario not in only:
            continue
        floor, gate = values("floor", row.scenario, row.metric), values("agentgate", row.scenario, row.metric)
        ratio = "-"
        if floor and gate and statistics.median(floor):
            ratio = f"{statistics.median(gate) / statistics.median(floor):.2f}x"
        met = "-"
        if row.check is not None and gate:
            try:
                ok = row.check(med)
            except (KeyError, ValueError):
                ok = False
            met = "yes" if ok else "NO"
            all_met = all_met and ok
        table.append([row.row, row.label, triple(floor, row.fmt), triple(gate, row.fmt), ratio, row.target, met])
    if only is None or "pg" in only:
        if isinstance(pg, str):
            table.append(["pg_two_procs", "PostgreSQL+Redis turns/s, 2 procs / 1 proc", "-", pg, "-", ">= 1.6x", "-"])
        else:
            one, two = pg["one"], pg["two"]
            gain = statistics.median(two) / statistics.median(one)
            table.append(
                [
                    "pg_two_procs",
                    f"PostgreSQL+Redis turns/s, {cfg.pg_conns} conns, 1 proc -> 2 procs",
                    "-",
                    f"{triple(one, '{:.0f}')} -> {triple(two, '{:.0f}')}",
                    f"{gain:.2f}x",
                    ">= 1.6x",
                    "yes" if gain >= 1.6 else "NO",
                ]
            )
    widths = [max(len(header[i]), *(len(r[i]) for r in table)) for i in range(len(header))]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    return "\n".join(lines), all_met


# --- main -------------------------------------------------------------------------------------------------


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536) if hard > 0 else 65536, hard))


Results = dict[str, dict[str, list[dict[str, float]]]]


def config(args: argparse.Namespace) -> Config:
    cfg = Config.smoke() if args.smoke else Config()
    if args.repeat:
        cfg.repeat = args.repeat
    if args.seconds:
        cfg.seconds = args.seconds
    return cfg


async def measure(args: argparse.Namespace, cfg: Config) -> tuple[Results, dict[str, Any] | str]:
    """Start the servers, run every chosen scenario on both, `cfg.repeat` times; stop them."""
    all_scenarios = scenarios(cfg)
    only = set(args.only.split(",")) if args.only else None
    if only is not None:
        unknown = only - set(all_scenarios) - {"pg"}
        if unknown:
            print(
                f"unknown scenario(s): {', '.join(sorted(unknown))}; known: {', '.join(all_scenarios)}, pg",
                file=sys.stderr,
            )
            raise SystemExit(2)
    chosen = {k: v for k, v in all_scenarios.items() if only is None or k in only}
    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="agentgate-bench-"))
    procs = Processes(tmp)
    began = time.perf_counter()
    results: Results = {"floor": {}, "agentgate": {}}
    users = max(cfg.many, cfg.stream_runs, *cfg.conns)
    try:
        floor_url, floor_pid = start_floor(procs)
        names = [f"bench{i}" for i in range(users)] + ["benchfan", "benchlong"]
        floor = Target("floor", [floor_url], {n: n for n in names}, [floor_pid])
        if args.target:
            seeded = seed(gateway_env(os.environ.get("DATABASE_URL", "")), users, cfg.long_messages)
            pids = [args.target_pid] if args.target_pid else []
            gate = Target("agentgate", [args.target], seeded["tokens"], pids, seeded["long_session"])
        else:
            env = gateway_env(f"sqlite:///{tmp / 'bench.sqlite3'}")
            manage(env, "migrate", "--noinput", "-v0")
            seeded = seed(env, users, cfg.long_messages)
            url, pid = start_gateway(procs, env, "gateway")
            gate = Target("agentgate", [url], seeded["tokens"], [pid], seeded["long_session"])
        print(
            f"set up in {time.perf_counter() - began:.1f} s; measuring {', '.join(chosen)} "
            f"x{cfg.repeat} (floor, then agentgate)",
            file=sys.stderr,
            flush=True,
        )
        for rep in range(cfg.repeat):
            for name, scenario in chosen.items():
                for target in (gate,) if args.no_floor else (floor, gate):
                    t0 = time.perf_counter()
                    try:
                        result = await scenario(target)
                    except Exception as exc:
                        print(f"  [{rep + 1}] {name} on {target.name} FAILED: {exc!r}", file=sys.stderr, flush=True)
                        result = {}
                    results[target.name].setdefault(name, []).append(result)
                    shown = ", ".join(f"{k}={v:.4g}" for k, v in result.items())
                    print(
                        f"  [{rep + 1}] {name:<13} {target.name:<9} {time.perf_counter() - t0:5.1f} s  {shown}",
                        file=sys.stderr,
                        flush=True,
                    )
                    await asyncio.sleep(0.2)
        pg: dict[str, Any] | str
        if only is not None and "pg" not in only:
            pg = "not run (--only)"
        elif args.smoke or args.target:
            pg = "not run (--smoke / --target)"
        elif not services_reachable():
            pg = "not run: PostgreSQL or Redis not reachable"
        else:
            try:
                pg = await pg_row(procs, cfg)
                print(f"  pg: {pg}", file=sys.stderr, flush=True)
            except Exception as exc:
                pg = f"failed: {exc!r}"[:80]
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    return results, pg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="about 10 s, tiny counts, one repeat")
    parser.add_argument("--only", default="", help="comma-separated scenarios (turns_1, turns_10, …, pg)")
    parser.add_argument("--json", default="", help="write every raw figure to this file")
    parser.add_argument("--repeat", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=0.0, help="seconds per timed scenario")
    parser.add_argument("--target", default="", help="an already-running gateway's WebSocket URL")
    parser.add_argument("--target-pid", type=int, default=0, help="its process id (for RSS)")
    parser.add_argument("--no-floor", action="store_true", help="measure the gateway only (profiling)")
    args = parser.parse_args()
    cfg = config(args)
    began = time.perf_counter()
    results, pg = asyncio.run(measure(args, cfg))
    elapsed = time.perf_counter() - began
    table, _all_met = render(cfg, results, pg, set(args.only.split(",")) if args.only else None)
    mode = "smoke" if args.smoke else "full"
    print(
        f"agentgate vs floor ({mode}, {cfg.repeat} repeats, {cfg.seconds:g} s per scenario, "
        f"{os.cpu_count()} CPUs, {elapsed:.0f} s total); ratio = agentgate median / floor median"
    )
    print(table)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"config": cfg.__dict__, "results": results, "pg": pg, "elapsed_s": elapsed}, indent=2, default=str
            )
        )
    failed = [(side, name) for side, by in results.items() for name, rs in by.items() if any(not r for r in rs)]
    if failed:
        print(f"scenario failures: {failed}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
