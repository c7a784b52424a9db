"""PostgreSQL + Redis for the benchmarks: the servers, CPU pinning, and what the servers count.

`make bench`'s PostgreSQL rows (`bench/pg_rows.py`) and the capacity run (`bench/capacity.py`)
share this:

- `open_services`: by default a **private** PostgreSQL (initdb in a temporary folder, the
  server's own defaults but `pg_stat_statements` preloaded) and a private `redis-server`
  (no persistence), both started here and stopped at the end, when the server programs are
  installed. The counters below are then the bench's alone, and the servers' processes can be
  pinned to CPUs and their CPU time read from /proc. `--services external` uses
  BENCH_POSTGRES_URL / BENCH_REDIS_URL instead (a fresh database on that server): what Redis
  counts is then shared with every other client of that Redis, and PostgreSQL's CPU is not read.
- `Meter`: cumulative counters, read before and after a timed window — statements
  (`pg_stat_statements`, by the bench database; BEGIN/COMMIT/ROLLBACK and the foreign-key
  checks PostgreSQL runs at commit apart), transactions
  (`pg_stat_database`), write transactions (the xid horizon), WAL bytes, Redis commands
  (`INFO commandstats`, INFO itself left out) and bytes, the CPU time of each gateway, of
  PostgreSQL (the postmaster and all its children, reaped ones included), of Redis (`INFO cpu`)
  and of the load client itself.
- `pin`: a process's every thread (and its children's) to a set of CPUs.
- `steady_turns`: turns in a window inside continuous load (no ramp at either edge), with the
  meter's deltas per turn and per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import load  # noqa: E402
from bench.load import TURN_MESSAGE, Target  # noqa: E402
from chat.runtime.tools import leash  # noqa: E402  (stdlib only: no Django needed)
from tests.support.services import postgres_bindir  # noqa: E402

PG_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ALL_CPUS = sorted(os.sched_getaffinity(0))
# (PostgreSQL regular expressions: \y is its word boundary)
TXN_CONTROL = r"^\s*(BEGIN|COMMIT|ROLLBACK|START|SAVEPOINT|RELEASE|END)\y"
# what PostgreSQL's foreign-key triggers run: Django's constraints are DEFERRABLE INITIALLY
# DEFERRED, so these run at COMMIT, outside any statement, and pg_stat_statements counts them as
# top-level statements although no client sent them
FK_CHECK = r"^SELECT (1|\$\d+) FROM ONLY \S+ x WHERE .* FOR (KEY )?SHARE OF x$"


class NotAvailable(Exception):
    """The services cannot be had (programs missing, servers unreachable): the rows say why."""


# --- processes and CPUs --------------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (all its threads), from /proc/<pid>/stat."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def box_busy_seconds() -> float:
    """CPU time the whole machine has spent busy (every CPU, every process: /proc/stat), so that
    what other work on a shared machine took can be told from ours."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int(_stat(int(entry.name))[1]) == pid:
                    found.append(int(entry.name))
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a server and its children: its own, its reaped children's (cutime, cstime:
    PostgreSQL's postmaster reaps every backend), and its live children's."""
    fields = _stat(pid)
    total = sum(int(f) for f in fields[11:15]) / CLOCK_TICKS
    for child in children(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(child)
    return total


def pin(pid: int, cpus: set[int] | list[int], *, tree: bool = False) -> None:
    """Every thread of `pid` (and of its children with `tree`) to `cpus`; what they start later inherits it."""
    pids = [pid, *(children(pid) if tree else [])]
    for p in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), set(cpus))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the services ----------------------------------------------------------------------------------------


@dataclass
class Services:
    """Where PostgreSQL (a superuser URL) and Redis are, and their processes when they are ours."""

    admin_url: str
    redis_url: str
    private: bool
    description: str
    pg_pid: int | None = None
    redis_pid: int | None = None

    def pin(self, cpus: set[int] | list[int]) -> None:
        """Pin the private servers (every PostgreSQL process, Redis's threads); external ones are left alone."""
        if self.pg_pid:
            pin(self.pg_pid, cpus, tree=True)
        if self.redis_pid:
            pin(self.redis_pid, cpus)

    def new_database(self) -> str:
        """A fresh database on the PostgreSQL server; its URL. Dropped by `drop_database`."""
        import psycopg

        name = f"agentgate_bench_{secrets.token_hex(5)}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return urlparse(self.admin_url)._replace(path=f"/{name}").geturl()

    def drop_database(self, url: str) -> None:
        import psycopg

        name = urlparse(url).path.lstrip("/")
        with contextlib.suppress(Exception), psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _reachable(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=1):
            return True
    except OSError:
        return False


def _wait(check: Callable[[], object], what: str, proc: subprocess.Popen[bytes], log: Path | None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise NotAvailable(f"{what} exited with {proc.returncode}: {tail}")
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.05)
    raise NotAvailable(f"{what} did not start within 60 s")


def _stop(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _start_postgres(stack: contextlib.ExitStack) -> tuple[str, int, str]:
    """initdb and start a PostgreSQL of our own (as the `postgres` user when we are root): its
    superuser URL, the postmaster's pid, its version. It dies with this process (the leash)."""
    import psycopg

    bindir = postgres_bindir()
    if bindir is None:
        raise NotAvailable("PostgreSQL's server programs (initdb, postgres) are not installed")
    python = sys.executable
    as_user: dict[str, Any] = {}
    base = Path(tempfile.mkdtemp(prefix="agentgate-bench-pg-"))
    stack.callback(shutil.rmtree, base, True)
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise NotAvailable("running as root without a `postgres` user to run PostgreSQL as") from exc
        os.chown(base, pw.pw_uid, pw.pw_gid)
        as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        # that user may not read the checkout or its virtualenv: the launcher runs on the system python
        python = shutil.which("python3", path="/usr/bin:/bin") or python
    data = base / "data"
    init = subprocess.run(
        [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "-N"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=base,
        **as_user,
    )
    if init.returncode != 0:
        raise NotAvailable(f"initdb failed: {init.stderr.strip()[-300:]}")
    port = free_port()
    command = [
        str(bindir / "postgres"),
        *("-D", str(data), "-p", str(port), "-k", str(base), "-c", "listen_addresses=127.0.0.1"),
        # the server's defaults otherwise (fsync and synchronous_commit on, as a deployment has them)
        *("-c", "shared_preload_libraries=pg_stat_statements", "-c", "max_connections=200"),
    ]
    log = base / "postgres.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            leash.command_line(command, python),
            env={**os.environ, leash.PARENT_ENV: str(os.getpid())},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=base,
            **as_user,
        )
    stack.callback(_stop, proc, signal.SIGINT)  # a fast shutdown
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def ready() -> bool:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True

    _wait(ready, "postgres", proc, log)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    return url, proc.pid, version


def _start_redis(stack: contextlib.ExitStack) -> tuple[str, int, str]:
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise NotAvailable("redis-server is not installed")
    base = Path(tempfile.mkdtemp(prefix="agentgate-bench-redis-"))
    stack.callback(shutil.rmtree, base, True)
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        leash.command_line([*command, "--dir", str(base)]),
        env={**os.environ, leash.PARENT_ENV: str(os.getpid())},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stack.callback(_stop, proc, signal.SIGTERM)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_timeout=1)
    try:
        _wait(client.ping, "redis-server", proc, None)
        version = str(client.info("server")["redis_version"])
    finally:
        client.close()
    return url, proc.pid, version


def open_services(mode: str, stack: contextlib.ExitStack) -> Services:
    """`private` (servers of our own), `external` (BENCH_POSTGRES_URL, BENCH_REDIS_URL) or `auto`
    (private when the programs are installed, else external). Raises NotAvailable with the reason."""
    if mode == "auto":
        mode = "private" if postgres_bindir() and shutil.which("redis-server") else "external"
    if mode == "external":
        if not (_reachable(PG_URL, 5432) and _reachable(REDIS_URL, 6379)):
            raise NotAvailable("PostgreSQL or Redis not reachable")
        return Services(PG_URL, REDIS_URL, False, "external (shared) PostgreSQL and Redis")
    pg_url, pg_pid, pg_version = _start_postgres(stack)
    redis_url, redis_pid, redis_version = _start_redis(stack)
    return Services(
        pg_url,
        redis_url,
        True,
        f"private PostgreSQL {pg_version} (pg_stat_statements) and Redis {redis_version}",
        pg_pid,
        redis_pid,
    )


# --- what the servers count ------------------------------------------------------------------------------


class Meter:
    """Cumulative counters of one bench database's cluster; `read()` is called at a window's edges.

    Keys (each a running total): `gw{i}_cpu` (s) per gateway and `gw_cpu` their sum, `client_cpu`
    (s, this process), `box_cpu` (s, the whole machine busy), `pg_stmts` (statements the gateways
    sent to the bench database, transaction control apart), `pg_txn_cmds` (BEGIN / COMMIT /
    ROLLBACK / SAVEPOINT), `pg_fk_checks` (the foreign-key checks PostgreSQL ran at commits),
    `pg_xacts` (commits + rollbacks; each backend reports them up to a second late, so a window
    inside steady load is needed),
    `pg_write_xacts` (transaction ids handed out: the cluster's), `pg_wal_kb`, `pg_cpu` (s,
    private PostgreSQL only), `redis_cmds`, `redis_net_kb` (in + out), `redis_cpu` (s).
    The statement counts are left out when `pg_stat_statements` cannot be read. Not counted
    anywhere but in `pg_xacts`: the empty statement Django's pool sends to check a connection
    as it leaves the pool (one per database call).
    """

    def __init__(self, svc: Services, db_url: str) -> None:
        import psycopg
        import redis

        self.svc = svc
        self.db_name = urlparse(db_url).path.lstrip("/")
        self.pg = psycopg.connect(svc.admin_url, autocommit=True)
        self.redis = redis.Redis.from_url(svc.redis_url, socket_timeout=5)
        self.statements = True
        try:
            self.pg.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        except psycopg.Error:
            self.statements = False  # not created in the admin database, or not preloaded

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pg.close()
        with contextlib.suppress(Exception):
            self.redis.close()

    def reader(self, gateway_pids: list[int]) -> Callable[[], dict[str, float]]:
        """`read` for these gateways (a `Target.meter`)."""
        return lambda: self.read(gateway_pids)

    def read(self, gateway_pids: list[int]) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, pid in enumerate(gateway_pids):
            out[f"gw{i}_cpu"] = cpu_seconds(pid)
        out["gw_cpu"] = sum(out[f"gw{i}_cpu"] for i in range(len(gateway_pids)))
        out["client_cpu"] = cpu_seconds(os.getpid())
        out["box_cpu"] = box_busy_seconds()
        row = self.pg.execute(
            "SELECT d.xact_commit + d.xact_rollback,"
            " pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"
            " FROM pg_stat_database d WHERE d.datname = %s",
            (self.db_name,),
        ).fetchone()
        assert row is not None
        out["pg_xacts"], out["pg_write_xacts"], out["pg_wal_kb"] = float(row[0]), float(row[1]), float(row[2]) / 1024
        if self.statements:
            stmts = self.pg.execute(
                "SELECT coalesce(sum(calls) FILTER (WHERE kind = 0), 0),"
                " coalesce(sum(calls) FILTER (WHERE kind = 1), 0), coalesce(sum(calls) FILTER (WHERE kind = 2), 0)"
                " FROM (SELECT s.calls, CASE WHEN s.query ~* %s THEN 1 WHEN s.query ~ %s THEN 2 ELSE 0 END AS kind"
                " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s) q",
                (TXN_CONTROL, FK_CHECK, self.db_name),
            ).fetchone()
            assert stmts is not None
            out["pg_stmts"], out["pg_txn_cmds"], out["pg_fk_checks"] = (float(v) for v in stmts)
        if self.svc.pg_pid:
            out["pg_cpu"] = tree_cpu_seconds(self.svc.pg_pid)
        stats: dict[str, Any] = self.redis.info("commandstats")  # type: ignore[assignment]
        out["redis_cmds"] = float(sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info"))
        info: dict[str, Any] = self.redis.info()  # type: ignore[assignment]
        out["redis_net_kb"] = (info["total_net_input_bytes"] + info["total_net_output_bytes"]) / 1024
        out["redis_cpu"] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        return out


def deltas(before: dict[str, float], after: dict[str, float], turns: float, seconds: float) -> dict[str, float]:
    """Each counter's change per turn (`<key>_per_turn`) and per second (`<key>_per_s`)."""
    out: dict[str, float] = {}
    for key, start in before.items():
        if key in after:
            change = after[key] - start
            out[f"{key}_per_turn"] = change / turns if turns else math.nan
            out[f"{key}_per_s"] = change / seconds if seconds else math.nan
    return out


def redis_commands(svc: Services) -> dict[str, float]:
    """Calls of each Redis command so far (`INFO commandstats`, INFO itself left out)."""
    import redis

    client = redis.Redis.from_url(svc.redis_url, socket_timeout=5)
    try:
        stats: dict[str, Any] = client.info("commandstats")  # type: ignore[assignment]
    finally:
        client.close()
    return {k.removeprefix("cmdstat_"): float(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"}


def reset_statements(svc: Services) -> None:
    """Empty `pg_stat_statements` (only between windows: the meter's totals start again)."""
    import psycopg

    with psycopg.connect(svc.admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def top_statements(svc: Services, db_url: str, limit: int) -> list[tuple[float, str]]:
    """The bench database's statements by calls since the last reset: (calls, text shortened)."""
    import psycopg

    name = urlparse(db_url).path.lstrip("/")
    with psycopg.connect(svc.admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT s.calls, regexp_replace(s.query, '\\s+', ' ', 'g') FROM pg_stat_statements s"
            " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s ORDER BY s.calls DESC LIMIT %s",
            (name, limit),
        ).fetchall()
    return [(float(calls), str(text)) for calls, text in rows]


# --- steady turns ----------------------------------------------------------------------------------------


async def steady_turns(
    target: Target,
    conns: int,
    seconds: float,
    meter: Callable[[], dict[str, float]] | None,
    *,
    settle: float = 1.0,
    message: str = TURN_MESSAGE,
    watchers: int = 0,
) -> dict[str, float]:
    """Each connection (its own user, its own session) sends turn after turn; after `settle`
    seconds a window of `seconds` is measured while the load goes on: turns/s, turn p50/p99 (ms),
    deltas received per turn, and the meter's counters per turn and per second over the window.
    `watchers` more connections of each user only watch, each on the next process of the target
    (so that every event of the user's runs crosses to another process)."""
    clients = await load.open_many(target, load.users_for(conns, None))
    watching: list[load.Client] = []
    if watchers:
        shifted = Target(target.name, target.urls[1:] + target.urls[:1], target.tokens, target.pids)
        try:
            watching = await load.open_many(shifted, load.users_for(conns, None) * watchers)
        except BaseException:
            await load.close_all(clients)
            raise
    tag = load.new_key("c")
    finished: list[float] = []
    durations: list[float] = []
    received = [0]

    def on_delta(payload: dict[str, Any], now: float) -> None:
        received[0] += 1

    for c in clients:
        c.on_delta = on_delta
    stop = asyncio.Event()

    async def loop(i: int, c: load.Client) -> None:
        while not stop.is_set():
            _, turn = await c.turn(f"{tag}-s{i}", load.new_key(tag), message, timeout=60)
            finished.append(time.perf_counter())
            durations.append(turn)

    try:
        await asyncio.gather(*(c.turn(f"{tag}-s{i}", load.new_key(tag), message) for i, c in enumerate(clients)))
        tasks = [asyncio.create_task(loop(i, c)) for i, c in enumerate(clients)]
        try:
            await asyncio.sleep(settle)
            m0 = meter() if meter else {}
            n0, d0, t0 = len(finished), received[0], time.perf_counter()
            await asyncio.sleep(seconds)
            m1 = meter() if meter else {}
            n1, d1, t1 = len(finished), received[0], time.perf_counter()
        finally:
            stop.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise RuntimeError(f"{len(errors)} connections failed: {errors[0]!r}")
    finally:
        await load.close_all([*clients, *watching])
    turns, elapsed = n1 - n0, t1 - t0
    window = sorted(durations[n0:n1])
    out = {
        "turns": float(turns),
        "turns_per_s": turns / elapsed,
        "turn_p50_ms": load.pct(window, 50) * 1000,
        "turn_p99_ms": load.pct(window, 99) * 1000,
        "deltas_per_turn": (d1 - d0) / turns if turns else math.nan,
    }
    out.update(deltas(m0, m1, turns, elapsed))
    return out
