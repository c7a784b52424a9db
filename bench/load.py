"""The load client: asyncio over real WebSockets (`websockets`), one scenario per function.

Every scenario takes a `Target` (the WebSocket URL(s) and a token per user) so the
same code measures the gateway and the floor server (`bench/floor_server.py`).
Users are named bench0, bench1, … (`bench/seed.py` creates them for the gateway);
"each connection its own user" means connection i authenticates as bench<i>.

The client reads every frame on a reader task; responses resolve the request's
future, terminal `chat` events resolve the run's future on every connection that
waits for it. Deltas are skipped unparsed unless a scenario measures their lag,
so that the client spends as little of the shared CPU as it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import secrets
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

TERMINAL = ("final", "error", "aborted")
TURN_MESSAGE = "[[tick:0]] the quick brown fox jumps"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_ids = itertools.count(1)


@dataclass
class Target:
    """Where to connect and as whom: `urls` are used round-robin by connection index."""

    name: str
    urls: list[str]
    tokens: dict[str, str]
    pids: list[int] = field(default_factory=list)
    long_key: str = "agent:main:long"
    # where the HTTP API is (`http://host:port`); by default the WebSocket URLs' hosts
    http_bases: list[str] = field(default_factory=list)
    profiled: bool = False  # the server runs under bench/profile_serve.py: `mark` its timed windows
    # running totals (CPU seconds, statements, commands…) read at a timed window's edges: the
    # scenario adds each one's change per turn (`<key>_per_turn`) and per second (`<key>_per_s`)
    meter: Callable[[], dict[str, float]] | None = None

    def url(self, i: int) -> str:
        return self.urls[i % len(self.urls)]

    def http_base(self, i: int) -> str:
        if self.http_bases:
            return self.http_bases[i % len(self.http_bases)]
        parsed = urlparse(self.url(i))
        return f"{'https' if parsed.scheme == 'wss' else 'http'}://{parsed.netloc}"

    def token(self, user: str) -> str:
        return self.tokens[user]

    def rss_mb(self) -> float:
        """Resident memory of the server process(es), from /proc/<pid>/status (VmRSS)."""
        total = 0.0
        for pid in self.pids:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        return total

    def cpu_seconds(self) -> float:
        """CPU time (user + system, all threads) the server process(es) have used so far, from
        /proc/<pid>/stat; NaN when no process is known (a `--target` given without its pid)."""
        if not self.pids:
            return math.nan
        total = 0.0
        for pid in self.pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
        return total

    def mark(self, opening: bool) -> None:
        """Open (SIGUSR1) or close (SIGUSR2) a timed window of a profiled server's profile."""
        if self.profiled:
            for pid in self.pids:
                os.kill(pid, signal.SIGUSR1 if opening else signal.SIGUSR2)


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def new_key(tag: str) -> str:
    return f"{tag}-{next(_ids)}-{secrets.token_hex(3)}"


class Client:
    """One connection: requests by id, terminal events by runId, optional delta hook."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.on_delta: Callable[[dict[str, Any], float], None] | None = None
        self.on_terminal: Callable[[dict[str, Any], float], None] | None = None
        self.reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, url: str, token: str, *, subscribe: bool = True, timeout: float = 30.0) -> Client:
        ws = await websockets.connect(
            url, open_timeout=timeout, max_size=2**22, compression=None, ping_interval=None, close_timeout=2
        )
        client = cls(ws)
        try:
            challenge = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            if challenge.get("event") != "connect.challenge":
                raise RuntimeError(f"expected connect.challenge, got {challenge}")
            await ws.send(
                json.dumps(
                    {
                        "type": "req",
                        "id": "c",
                        "method": "connect",
                        "params": {
                            "minProtocol": 4,
                            "maxProtocol": 4,
                            "client": {"id": "bench-load", "version": "1"},
                            "auth": {"token": token},
                        },
                    }
                )
            )
            hello = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            if not hello.get("ok"):
                raise RuntimeError(f"connect refused: {hello}")
        except BaseException:
            await ws.close()
            raise
        client.reader = asyncio.get_running_loop().create_task(client._read())
        if subscribe:
            await client.request("sessions.subscribe", {})
        return client

    async def _read(self) -> None:
        try:
            async for text in self.ws:
                assert isinstance(text, str)
                if self.on_delta is None and self.on_terminal is None and not self._wanted(text):
                    continue
                frame = json.loads(text)
                if frame["type"] == "res":
                    fut = self.pending.pop(frame["id"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(frame)
                    continue
                if frame.get("event") != "chat":
                    continue
                payload = frame["payload"]
                state = payload.get("state")
                if state == "delta":
                    if self.on_delta is not None:
                        self.on_delta(payload, time.time())
                elif state in TERMINAL:
                    if self.on_terminal is not None:
                        self.on_terminal(payload, time.time())
                    waiter = self.waiting.pop(payload["runId"], None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(payload)
        except ConnectionClosed:
            pass
        finally:
            for fut in [*self.pending.values(), *self.waiting.values()]:
                if not fut.done():
                    fut.set_exception(ConnectionError("connection closed"))

    def _wanted(self, text: str) -> bool:
        """Whether a frame matters to a scenario without hooks: responses, and terminal `chat`
        events of runs waited for here (found by a string scan, without parsing the JSON)."""
        head = text[:48]
        if '"type":"res"' in head:
            return True
        if '"event":"chat"' not in head or '"state":"delta"' in text:
            return False
        at = text.find('"runId":"')
        if at < 0:
            return True
        at += 9
        return text[at : text.find('"', at)] in self.waiting

    async def request(self, method: str, params: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        rid = f"r{next(_ids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        await self.ws.send(json.dumps({"type": "req", "id": rid, "method": method, "params": params}))
        return await asyncio.wait_for(fut, timeout)

    def expect_terminal(self, run_id: str) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[run_id] = fut
        return fut

    async def turn(
        self, session_key: str, run_id: str, message: str = TURN_MESSAGE, timeout: float = 30.0
    ) -> tuple[float, float]:
        """Send a new run and wait for its terminal event: (ack seconds, turn seconds)."""
        done = self.expect_terminal(run_id)
        sent = time.perf_counter()
        res = await self.request(
            "chat.send", {"sessionKey": session_key, "idempotencyKey": run_id, "message": message}, timeout
        )
        acked = time.perf_counter()
        if not res.get("ok") or res["payload"]["status"] != "started":
            self.waiting.pop(run_id, None)
            raise RuntimeError(f"chat.send not started: {res}")
        terminal = await asyncio.wait_for(done, timeout)
        ended = time.perf_counter()
        if terminal["state"] != "final":
            raise RuntimeError(f"run ended {terminal['state']}: {terminal}")
        return acked - sent, ended - sent

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()
        if self.reader is not None:
            with contextlib.suppress(BaseException):
                await self.reader


async def open_many(
    target: Target, users: Sequence[str], *, subscribe: bool = True, concurrency: int = 100
) -> list[Client]:
    """Open one connection per entry of `users` (names may repeat), `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, user: str) -> Client:
        async with gate:
            return await Client.open(target.url(i), target.token(user), subscribe=subscribe)

    results = await asyncio.gather(*(one(i, u) for i, u in enumerate(users)), return_exceptions=True)
    clients = [r for r in results if isinstance(r, Client)]
    errors = [r for r in results if not isinstance(r, Client)]
    if errors:
        await close_all(clients)
        raise RuntimeError(f"{len(errors)} of {len(users)} connections failed: {errors[0]!r}")
    return clients


async def close_all(clients: Sequence[Client]) -> None:
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def users_for(conns: int, one_user: str | None) -> list[str]:
    return [one_user] * conns if one_user else [f"bench{i}" for i in range(conns)]


# --- scenarios ------------------------------------------------------------------------------------------


async def turns(
    target: Target, conns: int, seconds: float, *, one_user: str | None = None, message: str = TURN_MESSAGE
) -> dict[str, float]:
    """Each connection sends turn after turn in its own session for `seconds`: complete turns/s,
    new-run ack p50/p99 (ms), slowest turn (s), and the server's CPU per turn (ms: its process's
    CPU time over the timed turns, the load client's own outside it). `message` is what each turn
    sends (a tool turn's directive, say: the floor server just echoes it)."""
    clients = await open_many(target, users_for(conns, one_user))
    tag = new_key("t")
    try:
        # one warm-up turn per connection creates its session; not counted
        await asyncio.gather(*(c.turn(f"{tag}-s{i}", new_key(tag), message) for i, c in enumerate(clients)))
        acks: list[float] = []
        durations: list[float] = []
        target.mark(True)
        counted = target.meter() if target.meter else {}
        cpu = target.cpu_seconds()
        start = time.perf_counter()
        deadline = start + seconds

        async def loop(i: int, c: Client) -> None:
            while time.perf_counter() < deadline:
                ack, turn = await c.turn(f"{tag}-s{i}", new_key(tag), message)
                acks.append(ack)
                durations.append(turn)

        await asyncio.gather(*(loop(i, c) for i, c in enumerate(clients)))
        elapsed = time.perf_counter() - start
        cpu = target.cpu_seconds() - cpu
        after = target.meter() if target.meter else {}
        target.mark(False)
    finally:
        await close_all(clients)
    done = len(durations)
    out = {
        "turns": float(done),
        "turns_per_s": done / elapsed,
        "ack_p50_ms": pct(acks, 50) * 1000,
        "ack_p99_ms": pct(acks, 99) * 1000,
        "turn_max_s": max(durations, default=float("nan")),
        "cpu_ms_per_turn": cpu * 1000 / max(1, done),
    }
    for key, value in counted.items():
        if key in after:
            out[f"{key}_per_turn"] = (after[key] - value) / max(1, done)
            out[f"{key}_per_s"] = (after[key] - value) / elapsed
    return out


# one read-only call of the built-in demo MCP server per turn (TOOLS.md §13.8), no approval
TOOL_TURN_MESSAGE = TURN_MESSAGE + ' [[tool:demo.calculate {"expression": "6*7"}]]'


async def resends(target: Target, conns: int, seconds: float) -> dict[str, float]:
    """Each connection finishes one run, then re-sends its key for `seconds`: terminal `ok` acks/s."""
    clients = await open_many(target, users_for(conns, None))
    tag = new_key("r")
    keys = [new_key(tag) for _ in clients]
    try:
        await asyncio.gather(*(c.turn(f"{tag}-s{i}", keys[i]) for i, c in enumerate(clients)))
        count = 0
        start = time.perf_counter()
        deadline = start + seconds

        async def loop(i: int, c: Client) -> None:
            nonlocal count
            params = {"sessionKey": f"{tag}-s{i}", "idempotencyKey": keys[i], "message": TURN_MESSAGE}
            while time.perf_counter() < deadline:
                res = await c.request("chat.send", params)
                if not res.get("ok") or res["payload"]["status"] != "ok":
                    raise RuntimeError(f"resend not acked ok: {res}")
                count += 1

        await asyncio.gather(*(loop(i, c) for i, c in enumerate(clients)))
        elapsed = time.perf_counter() - start
    finally:
        await close_all(clients)
    return {"acks_per_s": count / elapsed}


async def connect_latency(target: Target, count: int) -> dict[str, float]:
    """Open (upgrade to hello-ok) and close `count` connections one after another: p50/p99 ms."""
    times: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        client = await Client.open(target.url(0), target.token("bench0"), subscribe=False)
        times.append(time.perf_counter() - start)
        await client.close()
    return {"connect_p50_ms": pct(times, 50) * 1000, "connect_p99_ms": pct(times, 99) * 1000}


async def connect_many(target: Target, conns: int, idle_seconds: float = 1.0) -> dict[str, float]:
    """`conns` clients (each its own user) connect at once: seconds until all have hello-ok,
    then the server's RSS while they sit idle."""
    rss_before = target.rss_mb()
    start = time.perf_counter()
    clients = await open_many(target, users_for(conns, None), subscribe=False, concurrency=conns)
    opened = time.perf_counter() - start
    try:
        await asyncio.sleep(idle_seconds)
        rss = target.rss_mb()
    finally:
        await close_all(clients)
    return {"open_all_s": opened, "rss_idle_mb": rss, "rss_before_mb": rss_before}


def delta_timing(
    payload: dict[str, Any], now: float, sent_at: dict[str, float], tick_ms: int
) -> tuple[float | None, float | None]:
    """A `chat` delta's lag (ms: receipt minus the server's timestamp) and how far it arrived
    behind the scripted agent's schedule (ms: chunk i of the reply, "echo:", " word1", …, is due
    i ticks after the send); None where the delta has no timestamp or its run no send time."""
    message = payload.get("message", {})
    ts = message.get("timestamp")
    lag = now * 1000 - ts if ts else None
    start = sent_at.get(payload["runId"])
    if start is None:
        return lag, None
    chunks = len(message.get("content", [{}])[0].get("text", "").split())
    return lag, (now - start) * 1000 - (chunks - 1) * tick_ms


async def streaming(target: Target, runs: int, words: int, tick_ms: int, watchers: int) -> dict[str, float]:
    """`runs` runs stream at once, each run's user watching on `watchers` connections (the first sends):
    runs completed, delta delivery lag (ms, receipt minus the delta's server timestamp), how far
    behind the backend's schedule deltas arrive (ms, receipt minus send time plus one tick per chunk
    in the delta's text: includes the server's time to store the delta before it is stamped, and
    the sleep drift of its own run), terminal events missed, slowest run (s)."""
    users = [f"bench{i}" for i in range(runs) for _ in range(watchers)]
    clients = await open_many(target, users)
    tag = new_key("st")
    lags: list[float] = []
    behind: list[float] = []
    sent_at: dict[str, float] = {}
    terminals: list[dict[str, Any]] = []

    def on_delta(payload: dict[str, Any], now: float) -> None:
        lag, late = delta_timing(payload, now, sent_at, tick_ms)
        if lag is not None:
            lags.append(lag)
        if late is not None:
            behind.append(late)

    def on_terminal(payload: dict[str, Any], now: float) -> None:
        terminals.append(payload)

    for c in clients:
        c.on_delta, c.on_terminal = on_delta, on_terminal
    message = f"[[words:{words}]] [[tick:{tick_ms}]]"
    budget = words * tick_ms / 1000 * 4 + 20
    try:
        watched: list[Awaitable[dict[str, Any]]] = []
        sends = []
        for r in range(runs):
            group = clients[r * watchers : (r + 1) * watchers]
            run_id = new_key(tag)
            sent_at[run_id] = time.time()
            watched += [asyncio.wait_for(c.expect_terminal(run_id), budget) for c in group]
            sends.append(
                group[0].request(
                    "chat.send", {"sessionKey": f"{tag}-s{r}", "idempotencyKey": run_id, "message": message}, budget
                )
            )
        start = time.perf_counter()
        acks = await asyncio.gather(*sends)
        not_started = sum(1 for a in acks if not a.get("ok") or a["payload"]["status"] != "started")
        results = await asyncio.gather(*watched, return_exceptions=True)
        slowest = time.perf_counter() - start
    finally:
        await close_all(clients)
    finals = [r for r in results if isinstance(r, dict)]
    completed = len({r["runId"] for r in finals if r["state"] == "final"})
    return {
        "runs_completed": float(completed - not_started),
        "runs": float(runs),
        "lag_p99_ms": pct(lags, 99),
        "lag_p50_ms": pct(lags, 50),
        "behind_p99_ms": pct(behind, 99),
        "missed_terminals": float(runs * watchers - len(finals)),
        "slowest_run_s": slowest,
    }


async def long_session(target: Target, seconds: float) -> dict[str, float]:
    """Turns alternate between a new session and the seeded long one (user benchlong):
    median turn ms in each and their ratio."""
    client = await Client.open(target.url(0), target.token("benchlong"))
    fresh = new_key("new")
    new_times: list[float] = []
    long_times: list[float] = []
    try:
        await client.turn(fresh, new_key("w"))
        await client.turn(target.long_key, new_key("w"))
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            new_times.append((await client.turn(fresh, new_key("n")))[1])
            long_times.append((await client.turn(target.long_key, new_key("l")))[1])
    finally:
        await client.close()
    new_ms = statistics.median(new_times) * 1000
    long_ms = statistics.median(long_times) * 1000
    return {"new_turn_ms": new_ms, "long_turn_ms": long_ms, "long_over_new": long_ms / new_ms}
