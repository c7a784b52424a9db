"""`make bench`: the gateway beside a bare `websockets` floor server, one table of figures.

Starts what it measures: the floor (`bench/floor_server.py`, serving the HTTP floor
`bench/floor_http.py` beside it for the HTTP rows of `bench/http_load.py`) and one `manage.py serve`
on the embedded defaults (a fresh SQLite file in a temporary folder, the in-memory
channel layer, the scripted agent) with the per-connection rate limit lifted
(GATEWAY_RATE_PER_SEC=100000). Users, tokens and a 10,000-message session are
bulk-inserted first (`bench/seed.py`). Every scenario runs against the floor and
then the gateway, `--repeat` times, interleaved, so both see the same machine; the
table shows min/median/max of each, the ratio of the medians and the target from
issue 9. The turns scenarios also measure the server's CPU per turn, and the HTTP rows set
it against the WebSocket's (issue 28). The last rows run the same turns on PostgreSQL + Redis
(`bench/pg_rows.py`, issue 29): one process beside the embedded one in each repeat, with what
the servers counted (statements, transactions, Redis commands, their CPU); one process against
two; 200 streams over two. The services are a private PostgreSQL and Redis started for the run
when their programs are installed (`--services private`), else BENCH_POSTGRES_URL and
BENCH_REDIS_URL (`--services external`; 127.0.0.1:5432, user postgres, and 127.0.0.1:6379).

    .venv/bin/python bench/run.py                  # the full table (about 7 minutes on 2 cores)
    .venv/bin/python bench/run.py --smoke          # about 10 s, tiny counts: checks it all still works
    .venv/bin/python bench/run.py --only turns_10,resend_10 --json out.json
    .venv/bin/python bench/run.py --only pg --repeat 5      (the PostgreSQL + Redis rows, and turns_10 beside them)
    .venv/bin/python bench/run.py --target ws://127.0.0.1:8000/ws/gateway --target-pid PID --only turns_10
      (an already-running gateway; its DATABASE_URL must be in the environment so users can be seeded)
    .venv/bin/python bench/run.py --only http_turns_10 --no-floor --profile DIR
      (the gateway under cProfile, every thread, its timed turns only: DIR/gateway.prof;
       bench/profile_report.py DIR/gateway.prof --turns N reads it, N the `turns` of the --json file)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import secrets
import shutil
import socket
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

from bench import http_load, load, pg_rows, scaleout  # noqa: E402
from bench.load import Target  # noqa: E402
from bench.table import Results, Row, render  # noqa: E402

PYTHON = sys.executable
PG_URL = scaleout.PG_URL
REDIS_URL = scaleout.REDIS_URL


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
    http_conns: int = 10

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
            http_conns=3,
        )


Scenario = Callable[[Target], Awaitable[dict[str, float]]]


def scenarios(cfg: Config) -> dict[str, Scenario]:
    c1, c10, c50 = cfg.conns
    s = cfg.seconds
    return {
        "turns_1": lambda t: load.turns(t, c1, s),
        "turns_10": lambda t: load.turns(t, c10, s),
        # right after turns_10, so each repeat's CPU per turn is set against the WebSocket's on a like machine
        **http_load.scenarios(cfg.http_conns, s),
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
        *http_load.rows(cfg.http_conns),
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


def start_gateway(procs: Processes, env: dict[str, str], name: str, profile: str = "") -> tuple[str, int]:
    """A gateway process (under cProfile, its stats written to `profile` when it stops, if given)."""
    port = free_port()
    serve = ["bench/profile_serve.py", profile] if profile else ["manage.py"]
    proc, log = procs.spawn([PYTHON, *serve, "serve", "--host", "127.0.0.1", "--port", str(port)], env, name)
    wait_ready(port, proc, log)
    return f"ws://127.0.0.1:{port}/ws/gateway", proc.pid


def start_floor(procs: Processes) -> tuple[str, str, int]:
    """The floor process: its WebSocket URL, its HTTP API base (bench/floor_http.py) and its pid."""
    port, http_port = free_port(), free_port()
    args = [PYTHON, "bench/floor_server.py", "--port", str(port), "--http-port", str(http_port)]
    proc, log = procs.spawn(args, dict(os.environ), "floor")
    wait_port(port, proc, log)
    wait_port(http_port, proc, log)
    return f"ws://127.0.0.1:{port}/", f"http://127.0.0.1:{http_port}", proc.pid


# --- PostgreSQL + Redis (bench/pg_rows.py) ------------------------------------------------------------


def services_reachable() -> bool:
    """Whether BENCH_POSTGRES_URL and BENCH_REDIS_URL answer (the external services)."""
    for url, port in ((PG_URL, 5432), (REDIS_URL, 6379)):
        parsed = urlparse(url)
        try:
            with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or port), timeout=1):
                pass
        except OSError:
            return False
    return True


@dataclass
class PgCluster:
    """Gateway processes on PostgreSQL + Redis (a fresh database), and what the servers count."""

    svc: scaleout.Services
    db_url: str
    tokens: dict[str, str]
    gateways: list[tuple[str, int]]
    meter: scaleout.Meter

    def target(self, name: str, count: int) -> Target:
        """The first `count` gateways, their CPU and the servers' counters metered."""
        urls = [url for url, _ in self.gateways[:count]]
        pids = [pid for _, pid in self.gateways[:count]]
        return Target(name, urls, self.tokens, pids, meter=self.meter.reader(pids))


def start_pg_cluster(
    procs: Processes, stack: contextlib.ExitStack, svc: scaleout.Services, users: int, count: int
) -> PgCluster:
    """A fresh database on `svc`, migrated and seeded, and `count` gateway processes on it with
    `svc`'s Redis; all stopped (the database dropped) when `stack` closes."""
    db_url = svc.new_database()
    stack.callback(svc.drop_database, db_url)
    env = gateway_env(db_url, REDIS_URL=svc.redis_url, REDIS_LAYER_PREFIX=f"bench{secrets.token_hex(4)}")
    manage(env, "migrate", "--noinput", "-v0")
    seeded = seed(env, users, 0)
    gateways: list[tuple[str, int]] = []
    started: list[subprocess.Popen[bytes]] = []

    def stop_started() -> None:  # before the database is dropped and the services stop (the stack unwinds)
        for proc in started:
            procs.stop(proc)

    stack.callback(stop_started)
    for i in range(count):
        n_before = len(procs.procs)
        try:
            gateways.append(start_gateway(procs, env, f"gateway-pg-{i}"))
        finally:
            started += procs.procs[n_before:]
    meter = scaleout.Meter(svc, db_url)
    stack.callback(meter.close)
    return PgCluster(svc, db_url, seeded["tokens"], gateways, meter)


def pin_gateways(cluster: PgCluster) -> Callable[[], None]:
    """Each of the first two gateways on a CPU of its own, the way one process per core is deployed;
    the private servers and this load client on the CPUs left, when there are any (with two CPUs
    there are none: they run where the kernel finds room, beside the gateways). Returns the undoing."""
    cpus = scaleout.ALL_CPUS
    mine = os.sched_getaffinity(0)
    if len(cpus) < 2:
        return lambda: None
    for cpu, (_, pid) in zip(cpus, cluster.gateways[:2], strict=False):
        scaleout.pin(pid, {cpu})
    if cpus[2:]:
        cluster.svc.pin(cpus[2:])
        scaleout.pin(os.getpid(), cpus[2:])

    def undo() -> None:
        for _, pid in cluster.gateways:
            scaleout.pin(pid, cpus)
        cluster.svc.pin(cpus)
        scaleout.pin(os.getpid(), mine)

    return undo


async def timed(rep: int, name: str, target: Target, scenario: Scenario) -> dict[str, float]:
    """Run one scenario on one target: its figures, or {} (reported) when it failed."""
    t0 = time.perf_counter()
    try:
        result = await scenario(target)
    except Exception as exc:
        print(f"  [{rep + 1}] {name} on {target.name} FAILED: {exc!r}", file=sys.stderr, flush=True)
        result = {}
    shown = ", ".join(f"{k}={v:.4g}" for k, v in result.items() if not k.endswith("_per_s") or k == "turns_per_s")
    print(
        f"  [{rep + 1}] {name:<13} {target.name:<9} {time.perf_counter() - t0:5.1f} s  {shown}",
        file=sys.stderr,
        flush=True,
    )
    return result


# --- main -------------------------------------------------------------------------------------------------


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536) if hard > 0 else 65536, hard))


def config(args: argparse.Namespace) -> Config:
    cfg = Config.smoke() if args.smoke else Config()
    if args.repeat:
        cfg.repeat = args.repeat
    if args.seconds:
        cfg.seconds = args.seconds
    return cfg


async def measure(args: argparse.Namespace, cfg: Config) -> tuple[Results, dict[str, str]]:
    """Start the servers, run every chosen scenario on both, `cfg.repeat` times; stop them. The
    PostgreSQL + Redis scenarios run beside them (`bench/pg_rows.py`); what of them did not run, and why."""
    all_scenarios = scenarios(cfg)
    only = set(args.only.split(",")) if args.only else None
    if only is not None:
        unknown = only - set(all_scenarios) - {"pg", *pg_rows.SCENARIOS}
        if unknown:
            known = ", ".join([*all_scenarios, "pg", *pg_rows.SCENARIOS])
            print(f"unknown scenario(s): {', '.join(sorted(unknown))}; known: {known}", file=sys.stderr)
            raise SystemExit(2)
    pg_wanted = pg_rows.wanted(only)
    status: dict[str, str] = {}
    if args.target:
        status = dict.fromkeys(pg_wanted, "not run (--target)")
    elif args.smoke and only is None:
        status = dict.fromkeys(pg_wanted, "not run (--smoke)")
    elif args.smoke:
        status["pg_stream_200"] = "not run (--smoke)"
    pg_wanted -= set(status)
    # the PostgreSQL turns are set against the embedded turns_10 of the same repeat
    chosen = {
        k: v
        for k, v in all_scenarios.items()
        if only is None or k in only or (k == "turns_10" and "pg_turns_10" in pg_wanted)
    }
    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="agentgate-bench-"))
    procs = Processes(tmp)
    began = time.perf_counter()
    results: Results = {"floor": {}, "agentgate": {}}
    users = max(cfg.many, cfg.stream_runs, *cfg.conns)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        stack.callback(procs.stop_all)
        floor_url, floor_http, floor_pid = start_floor(procs)
        names = [f"bench{i}" for i in range(users)] + ["benchfan", "benchlong"]
        floor = Target("floor", [floor_url], {n: n for n in names}, [floor_pid], http_bases=[floor_http])
        if args.target:
            seeded = seed(gateway_env(os.environ.get("DATABASE_URL", "")), users, cfg.long_messages)
            pids = [args.target_pid] if args.target_pid else []
            gate = Target("agentgate", [args.target], seeded["tokens"], pids, seeded["long_session"])
        else:
            env = gateway_env(f"sqlite:///{tmp / 'bench.sqlite3'}")
            manage(env, "migrate", "--noinput", "-v0")
            seeded = seed(env, users, cfg.long_messages)
            url, pid = start_gateway(procs, env, "gateway", args.profile_file)
            gate = Target("agentgate", [url], seeded["tokens"], [pid], seeded["long_session"])
            gate.profiled = bool(args.profile)
        svc: scaleout.Services | None = None
        cluster: PgCluster | None = None
        if pg_wanted:
            try:
                svc = scaleout.open_services(args.services, stack)
                cluster = start_pg_cluster(procs, stack, svc, max(cfg.pg_conns, cfg.conns[1]), 2)
                print(f"PostgreSQL + Redis: {svc.description}", file=sys.stderr, flush=True)
            except scaleout.NotAvailable as exc:
                status.update(dict.fromkeys(pg_wanted, f"not run: {exc}"[:80]))
            except Exception as exc:
                status.update(
                    dict.fromkeys(pg_wanted - {"pg_stream_200"} if svc else pg_wanted, f"failed: {exc!r}"[:80])
                )
        print(
            f"set up in {time.perf_counter() - began:.1f} s; measuring {', '.join(chosen)} "
            f"x{cfg.repeat} (floor, then agentgate)",
            file=sys.stderr,
            flush=True,
        )
        pg_one = cluster.target("pg-one", 1) if cluster else None
        c10 = cfg.conns[1]

        def pg_turns(conns: int) -> Scenario:
            return lambda t: load.turns(t, conns, cfg.seconds)

        for rep in range(cfg.repeat):
            for name, scenario in chosen.items():
                for target in (gate,) if args.no_floor else (floor, gate):
                    results[target.name].setdefault(name, []).append(await timed(rep, name, target, scenario))
                    await asyncio.sleep(0.2)
                if name == "turns_10" and pg_one is not None and "pg_turns_10" not in status:
                    result = await timed(rep, "pg_turns_10", pg_one, pg_turns(c10))
                    results["agentgate"].setdefault("pg_turns_10", []).append(result)
                    await asyncio.sleep(0.2)
        if cluster is not None and "pg_two_procs" in pg_wanted - set(status):
            undo = (lambda: None) if args.no_pin else pin_gateways(cluster)
            try:
                for rep in range(cfg.repeat):
                    for key, count in (("pg_one", 1), ("pg_two", 2)):
                        target = cluster.target(f"pg-{count}proc", count)
                        result = await timed(rep, key, target, pg_turns(cfg.pg_conns))
                        results["agentgate"].setdefault(key, []).append(result)
                        await asyncio.sleep(0.2)
            finally:
                undo()
        if svc is not None and "pg_stream_200" in pg_wanted - set(status):
            if cluster is not None:  # its gateways would only take CPU from the streams' own
                for proc in procs.procs:
                    if proc.pid in {pid for _, pid in cluster.gateways}:
                        procs.stop(proc)
            try:
                streamed = await pg_rows.stream_200(svc.admin_url, svc.redis_url, args.smoke)
            except Exception as exc:
                streamed = f"failed: {exc!r}"[:80]
            if isinstance(streamed, str):
                status["pg_stream_200"] = streamed
            else:
                results["agentgate"]["pg_stream_200"] = [streamed]
                print(f"  pg_stream_200: {streamed}", file=sys.stderr, flush=True)
    return results, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="about 10 s, tiny counts, one repeat")
    parser.add_argument(
        "--only", default="", help="comma-separated scenarios (turns_1, turns_10, …, pg_turns_10, pg_two_procs, pg)"
    )
    parser.add_argument("--json", default="", help="write every raw figure to this file")
    parser.add_argument("--repeat", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=0.0, help="seconds per timed scenario")
    parser.add_argument("--target", default="", help="an already-running gateway's WebSocket URL")
    parser.add_argument("--target-pid", type=int, default=0, help="its process id (for RSS)")
    parser.add_argument("--no-floor", action="store_true", help="measure the gateway only (profiling)")
    parser.add_argument(
        "--no-pin", action="store_true", help="pg_two_procs: leave the gateways where the kernel puts them"
    )
    parser.add_argument(
        "--services",
        choices=("auto", "private", "external"),
        default="auto",
        help="PostgreSQL + Redis rows: servers of the run's own, BENCH_POSTGRES_URL/BENCH_REDIS_URL, or "
        "private when installed (auto)",
    )
    parser.add_argument(
        "--profile", default="", help="run the gateway under cProfile (bench/profile_serve.py): DIR/gateway.prof"
    )
    args = parser.parse_args()
    args.profile_file = ""
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        args.profile_file = str(Path(args.profile).resolve() / "gateway.prof")
    cfg = config(args)
    began = time.perf_counter()
    results, pg_status = asyncio.run(measure(args, cfg))
    http_load.derive(results)
    elapsed = time.perf_counter() - began
    only = set(args.only.split(",")) if args.only else None
    shown = pg_rows.wanted(only)
    pg_lines = pg_rows.lines(results, pg_status, cfg.conns[1], cfg.pg_conns, len(scaleout.ALL_CPUS), shown)
    table, _all_met = render(rows(cfg), results, pg_lines, only)
    mode = "smoke" if args.smoke else "full"
    print(
        f"agentgate vs floor ({mode}, {cfg.repeat} repeats, {cfg.seconds:g} s per scenario, "
        f"{os.cpu_count()} CPUs, {elapsed:.0f} s total); ratio = agentgate median / floor median"
    )
    print(table)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"config": cfg.__dict__, "results": results, "pg": pg_status, "elapsed_s": elapsed},
                indent=2,
                default=str,
            )
        )
    failed = [(side, name) for side, by in results.items() for name, rs in by.items() if any(not r for r in rs)]
    if failed:
        print(f"scenario failures: {failed}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
