"""The gateway survives its own services: Redis killed and started again, PostgreSQL stopped
(immediate) and started again, both at once, and one right after the other, under two `serve`
processes while eight connections of three users chat, abort, resend and reconnect.

PostgreSQL and Redis are private instances (PostgreSQL on a Unix socket in a folder of its own,
Redis on a reserved port below the ephemeral range), children of the test that die with it, so
restarting them touches nothing else. Redis is given a small retry budget (`REDIS_RETRIES`), so
every Redis outage outlasts redis-py's retries: the process channel is lost and reopened, the
path a long outage takes in production. After the load, everything quiesces and the promises
of docs/deployment.md ("When PostgreSQL or Redis goes away") are checked:

- no process died, each is ready again after every outage (and said unready during it); no
  connection was closed with 1011, nor any other code than the documented 4013 for a handshake
  refused while the database was away;
- every request got an answer; a request refused for an outage got `UNAVAILABLE` (retryable,
  with `retryAfterMs`) within a few seconds, never `INTERNAL`; every request made during an
  outage (but a `waitMs` send, which waits for its run) was answered within as long, refused
  or not;
- every acked send (resends of refused ones, with the same key, included) has its run and its
  message in history; every run ended exactly once (one terminal row in its audit trail); every
  connection that stayed got exactly that terminal for every run it saw or was acked live;
- a run streaming through PostgreSQL's longest outage (longer than the pool's wait plus
  GATEWAY_RUN_DB_WAIT_SECONDS) stopped, and ended `failed` with errorKind `unavailable`;
- no live process was declared dead (no run ended `interrupted`); nothing left open, no row
  running, `gateway_doctor` clean;
- after Redis came back, events crossed processes and a cross-process abort stopped its run
  within seconds (the group refresh interval is left at its 30 s default);
- each process logged each outage (a line when it began, one when it ended, as many of each,
  not a traceback per request) and counted it in /metrics.

The seed is printed; `AGENTGATE_OUTAGE_SEED` replays its choices (the order and length of the
outages, each connection's actions; how they interleave with the servers still varies).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import websockets
import websockets.exceptions

from tests.support import services
from tests.support.client import TERMINAL
from tests.support.cluster import Cluster, cluster, contradictions
from tests.support.db import send_params
from tests.support.servers import WsClient, manage
from tests.support.services import PostgresProcess, RedisProcess

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(240)]

USERS = ("ada", "bo", "cy")
CONNECTIONS = 8  # of the three users, spread over the processes
PROCESSES = 2
REQUEST_DEADLINE = 20.0  # no request may go unanswered longer than this
REFUSED_WITHIN = 9.0  # an outage's UNAVAILABLE comes this fast (the pool's 5 s wait, on a busy machine)
READY_WITHIN = 30.0
RUN_DB_WAIT = 4.0  # GATEWAY_RUN_DB_WAIT_SECONDS here: the longer outages outlast it
# GATEWAY_RECOVERY_SECONDS here: above the pool's wait plus a heartbeat, and a window (half of it)
# that a loaded 2-core machine's late heartbeats stay within; the longest outage still outlasts it
RECOVERY = 12.0
REDIS_RETRIES = 2  # redis-py's retries here: about a second, so every Redis outage outlasts them
READY_AFTER_REDIS = 10.0  # ready this soon after Redis is back (the channel is reopened each second)
STATE_OF_EVENT = {"final": ("done",), "error": ("failed", "timeout"), "aborted": ("killed",)}


@dataclass
class Life:
    """One connection, from its handshake to its close."""

    client: WsClient
    ws: Any
    user: str
    server: int
    live_acked: set[tuple[str, str]] = field(default_factory=set)  # (sessionKey, runId) acked non-terminal
    # acked with the run's end (a `waitMs` held until it ended, or a resend): no event after that ack
    terminal_acked: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class Answered:
    """A request made while a service was down (or not yet ready again), and how long it took."""

    method: str
    seconds: float
    ok: bool


@dataclass
class Refusal:
    method: str
    seconds: float
    retryable: bool
    retry_after_ms: int | None


class Outages:
    """The load, the outages, and what was seen of both."""

    def __init__(self, c: Cluster, pg: PostgresProcess, redis: RedisProcess, tokens: dict[str, str], seed: int) -> None:
        self.c, self.pg, self.redis, self.tokens = c, pg, redis, tokens
        self.rng = random.Random(seed)
        self.slot_rngs = [random.Random(seed * 100 + slot) for slot in range(CONNECTIONS)]
        self.ids = itertools.count()
        self.lives: list[Life] = []
        self.current: dict[int, Life | None] = {}
        self.pending: dict[int, list[tuple[str, str, str, dict[str, Any]]]] = defaultdict(list)
        self.acked: dict[tuple[str, str, str], str] = {}  # (user, sessionKey, runId) -> first ack status
        self.refusals: list[Refusal] = []
        self.during_outage: list[Answered] = []
        self.outage_active = False  # from a service going down until both processes are ready again
        self.redis_ready_after: list[float] = []
        self.long_run = ""  # streams through the longest PostgreSQL outage
        self.problems: list[str] = []
        self.closes: Counter[int] = Counter()
        self.actions: Counter[str] = Counter()
        self.timeline: list[tuple[float, str]] = []
        self.watchers: list[Life] = []
        self.watcher_id = 0  # the watchers' user id
        self.done = asyncio.Event()
        self.t0 = time.monotonic()

    def mark(self, what: str) -> None:
        self.timeline.append((round(time.monotonic() - self.t0, 1), what))
        print(f"outages: {self.timeline[-1][0]:6.1f}s {what}")

    # --- connections and requests ---------------------------------------------------------------

    async def connect(self, user: str, server: int) -> Life | None:
        """A handshake; None if it was refused for an outage (then the socket closed with 4013)."""
        handle = self.c.servers[server]
        try:
            # The test reads a connection only when it asks something of it. With the default
            # queue of 16 frames an idle watcher's socket stops being read once its runs' deltas
            # fill the queue, so the server's pong goes unread too, and the client's keepalive
            # closes the connection 20 s after a ping (1006 here, and its groups leave Redis).
            ws = await websockets.connect(handle.ws_url, open_timeout=10, max_size=2**21, max_queue=None)
        except Exception as exc:
            self.problems.append(f"process {server} refused a connection: {exc!r}")
            return None
        client = WsClient(ws)
        params = {
            "minProtocol": 4,
            "maxProtocol": 4,
            "client": {"id": "outages", "version": "1"},
            "auth": {"token": self.tokens[user]},
        }
        life = Life(client, ws, user, server)
        with contextlib.suppress(Exception):
            await client._pump_one(5)  # connect.challenge
        res = await self.request(life, "connect", params)
        if res is None or not res["ok"]:
            if res is not None and not self.refused(res):
                self.problems.append(f"connect failed: {res}")
            with contextlib.suppress(Exception):
                await client.wait_closed(5)
            if res is not None and self.refused(res) and client.closed != 4013:
                self.problems.append(f"a refused handshake was not closed with 4013 but {client.closed}")
            self.note_close(client.closed)
            with contextlib.suppress(Exception):
                await ws.close()
            return None
        client.hello = res["payload"]
        res = await self.request(life, "sessions.subscribe", {})
        if res is None or not res["ok"]:
            with contextlib.suppress(Exception):
                await ws.close()
            return None
        self.lives.append(life)
        return life

    def note_close(self, code: int | None) -> None:
        if code is None:
            return
        self.closes[code] += 1
        if code not in (1000, 4013):
            self.problems.append(f"a connection was closed with {code}")

    def refused(self, res: dict[str, Any]) -> bool:
        """An outage's UNAVAILABLE (not a run's `error` ack, which carries its payload)."""
        error = res.get("error") or {}
        return error.get("code") == "UNAVAILABLE" and str(error.get("details", {}).get("reason", "")).endswith(
            "-unavailable"
        )

    async def request(self, life: Life, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """One request and its answer (None if the socket closed under it)."""
        started = time.monotonic()
        during = self.outage_active and "waitMs" not in params  # a held answer waits for its run
        try:
            res = await life.client.call(method, params, timeout=REQUEST_DEADLINE)
        except (AssertionError, websockets.exceptions.ConnectionClosed):
            if life.client.closed is None:
                self.problems.append(f"{method} unanswered within {REQUEST_DEADLINE:.0f}s ({life.user})")
            return None
        took = time.monotonic() - started
        if during:
            self.during_outage.append(Answered(method, took, bool(res.get("ok"))))
        if self.refused(res):
            error = res["error"]
            self.refusals.append(Refusal(method, took, error.get("retryable") is True, error.get("retryAfterMs")))
        elif not res["ok"] and res["error"]["code"] in ("INTERNAL", "INVALID_REQUEST"):
            self.problems.append(f"{method} answered {res['error']}")
        return res

    # --- the load -------------------------------------------------------------------------------

    def note_send(self, life: Life, key: str, run_id: str, res: dict[str, Any]) -> bool:
        """Record a chat.send's answer; False when it must be sent again (refused for an outage)."""
        if self.refused(res):
            return False
        payload = res.get("payload") or {}
        status = payload.get("status")
        if payload.get("runId") == run_id and status:
            canonical = payload["sessionKey"]
            self.acked.setdefault((life.user, canonical, run_id), status)
            if status in ("started", "queued", "in_flight"):
                life.live_acked.add((canonical, run_id))
            else:
                life.terminal_acked.add((canonical, run_id))
        elif res["error"]["code"] != "RATE_LIMITED":  # a full queue stores nothing: dropped
            self.problems.append(f"chat.send {run_id}: {res}")
        return True

    async def act(self, slot: int, life: Life) -> None:
        rng = self.slot_rngs[slot]
        keys = [f"{life.user}-{i}" for i in range(3)]
        roll, key, words, tick, wait, pick = (
            rng.random(),
            rng.choice(keys),
            rng.randint(2, 10),
            rng.randint(20, 120),
            rng.random(),
            rng.random(),
        )
        pending = self.pending[slot]
        if pending and roll < 0.5:
            self.actions["resend"] += 1
            key, run_id, text, extra = pending[0]
            res = await self.request(life, "chat.send", send_params(key, text, run_id, **extra))
            if res is not None and self.note_send(life, key, run_id, res):
                pending.pop(0)
        elif roll < 0.62:
            self.actions["send"] += 1
            run_id = f"{life.user}-{slot}-{next(self.ids)}"
            text = f"{run_id} [[words:{words}]] [[tick:{tick}]]"
            extra = {"waitMs": int(500 + 2000 * pick)} if wait < 0.15 else {}
            res = await self.request(life, "chat.send", send_params(key, text, run_id, **extra))
            if res is not None and not self.note_send(life, key, run_id, res):
                pending.append((key, run_id, text, extra))
        elif roll < 0.72:
            self.actions["abort"] += 1
            params: dict[str, Any] = {"sessionKey": key}
            mine = [r for k, r in life.live_acked if k == f"agent:main:{key}"]
            if mine and pick < 0.5:
                params["runId"] = sorted(mine)[-1]
            await self.request(life, "chat.abort", params)
        elif roll < 0.86:
            self.actions["history"] += 1
            await self.request(life, "chat.history", {"sessionKey": key, "limit": 20})
        elif roll < 0.96:
            self.actions["list"] += 1
            await self.request(life, "sessions.list", {"limit": 100})
        else:  # a new handshake (during a database outage: UNAVAILABLE, then 4013)
            self.actions["reconnect"] += 1
            with contextlib.suppress(Exception):
                await life.ws.close()
            life.client.closed = 1000
            return
        with contextlib.suppress(websockets.exceptions.ConnectionClosed):
            await life.client.drain(rng.uniform(0.0, 0.15))

    async def slot_loop(self, slot: int) -> None:
        user, server = USERS[slot % len(USERS)], slot % PROCESSES
        while not self.done.is_set():
            life = self.current.get(slot)
            if life is None or life.client.closed is not None:
                if life is not None:
                    self.note_close(life.client.closed)
                self.current[slot] = life = await self.connect(user, server)
                if life is None:
                    await asyncio.sleep(2.0)  # the refusal's retryAfterMs
                    continue
            await self.act(slot, life)

    async def resend_all(self) -> None:
        """After the outages: every refused send again, until it is acked."""
        deadline = time.monotonic() + 30
        while any(self.pending.values()) and time.monotonic() < deadline:
            for slot, pending in self.pending.items():
                life = self.current.get(slot)
                if not pending or life is None or life.client.closed is not None:
                    continue
                key, run_id, text, extra = pending[0]
                res = await self.request(life, "chat.send", send_params(key, text, run_id, **extra))
                if res is not None and self.note_send(life, key, run_id, res):
                    pending.pop(0)
            await asyncio.sleep(0.2)
        left = [p for pending in self.pending.values() for p in pending]
        if left:
            self.problems.append(f"{len(left)} sends never acked after the outages: {left[:3]}")

    # --- the outages ----------------------------------------------------------------------------

    async def readyz(self, server: int) -> tuple[int, dict[str, Any]]:
        status, body = await asyncio.to_thread(self.c.servers[server].get, "/readyz", 5)
        return status, json.loads(body)

    async def says_unready(self, check: str, until: float) -> None:
        """Each process's /readyz reports the outage (503, `check` failing) before `until`."""

        async def one(server: int) -> None:
            while time.monotonic() < until:
                with contextlib.suppress(OSError, ValueError):
                    status, body = await self.readyz(server)
                    if status == 503 and not body["checks"][check]["ok"]:
                        return
                await asyncio.sleep(0.2)
            self.problems.append(f"process {server}: /readyz never reported {check} unready during the outage")

        await asyncio.gather(*(one(s) for s in range(PROCESSES)))

    async def until_ready(self, what: str) -> float:
        """Both processes ready again: how long that took."""
        started = time.monotonic()

        async def one(server: int) -> None:
            last: Any = None
            while time.monotonic() - started < READY_WITHIN:
                if not self.c.servers[server].alive():
                    self.problems.append(f"process {server} died")
                    return
                with contextlib.suppress(OSError, ValueError):
                    status, last = await self.readyz(server)
                    if status == 200:
                        return
                await asyncio.sleep(0.2)
            self.problems.append(f"process {server} not ready {READY_WITHIN:.0f}s after {what}: {last}")

        await asyncio.gather(*(one(s) for s in range(PROCESSES)))
        took = time.monotonic() - started
        self.mark(f"both ready {took:.1f}s after {what}")
        return took

    async def outage(self, kinds: tuple[str, ...], down: float) -> None:
        """Take the services down together, keep them down `down` seconds, start them again."""
        until = time.monotonic() + down
        self.outage_active = True
        for kind in kinds:
            await asyncio.to_thread(self.redis.kill if kind == "redis" else self.pg.stop)
        self.mark(f"{' + '.join(kinds)} down for {down:.1f}s")
        if "redis" in kinds:
            await self.says_unready("channelLayer", until)
        if "postgres" in kinds:
            await self.says_unready("database", until)
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        for kind in kinds:
            # spawned from this (the test's main) thread: the servers die with it, not with a worker thread
            server = self.redis if kind == "redis" else self.pg
            server.spawn()
            await asyncio.to_thread(server.wait_ready)
        self.mark(f"{' + '.join(kinds)} started again")

    async def layer_works_again(self) -> None:
        """The processes' groups are back in Redis, events cross processes again, and a
        cross-process abort stops its run, within seconds (the group refresh is left at 30 s)."""
        a, b = self.watchers  # one user, a connection on each process
        started = time.monotonic()
        groups: dict[str, int] = {}
        while time.monotonic() - started < 5:
            groups = await asyncio.to_thread(self.layer_groups)
            procs = [n for g, n in groups.items() if g.startswith("proc.")]
            if procs == [1] * PROCESSES and groups.get(f"user.{self.watcher_id}") == PROCESSES:
                break
            await asyncio.sleep(0.2)
        else:
            self.problems.append(f"the processes' groups did not come back to Redis: {groups}")
        regrouped = time.monotonic() - started
        n = next(self.ids)
        for life, side in ((a, "a"), (b, "b")):  # a run on each process, in sessions of their own
            run_id = f"w-{n}-{side}"
            await self.send_until_acked(life, f"w{side}", f"{run_id} [[words:30]] [[tick:100]]", run_id)
        for watcher, run_id in ((b, f"w-{n}-a"), (a, f"w-{n}-b")):
            try:
                await watcher.client.wait_event(lambda e, r=run_id: is_delta(e, r), timeout=8)
            except AssertionError:
                self.problems.append(f"no live delta of {run_id} reached process {watcher.server} after Redis was back")
                await self.diagnose(watcher, run_id)
        crossed = time.monotonic() - started
        # a run held in `dispatching` by its model stops only when told: the abort must reach its process
        held = f"w-{n}-held"
        await self.send_until_acked(a, "wheld", f"{held} [[delay:30000]]", held)
        res = await self.request(b, "chat.abort", {"sessionKey": "wheld", "runId": held})
        if res is None or not res["ok"] or not res["payload"].get("aborted"):
            self.problems.append(f"the cross-process abort of {held} failed: {res}")
        aborted = time.monotonic()
        stopped = None
        while time.monotonic() - aborted < 8:
            ((cancel_ms,),) = await asyncio.to_thread(
                self.c.query, "select cancel_ms from sessions_app_run where run_id = %s", held
            )
            if cancel_ms is not None:  # the owner's task was cancelled: the abort reached its process
                stopped = round(time.monotonic() - aborted, 2)
                break
            await asyncio.sleep(0.1)
        if stopped is None:
            self.problems.append(f"the cross-process abort of {held} never stopped its task")
        self.mark(
            f"layer works again: groups back in {regrouped:.1f}s, deltas crossed within {crossed:.1f}s, "
            f"a cross-process abort stopped its run in {stopped}s"
        )

    async def stream_through_the_outage(self) -> None:
        """A run that streams for longer than PostgreSQL will be away: it must stop once it has
        been unable to write for RUN_DB_WAIT, and end `unavailable` (checked in `check`)."""
        run_id = self.long_run = f"w-{next(self.ids)}-long"
        await self.send_until_acked(self.watchers[0], "wlong", f"{run_id} [[words:40]] [[tick:500]]", run_id)

    async def send_until_acked(self, life: Life, key: str, text: str, run_id: str) -> None:
        """A watcher's send, resent (same key) while it is refused, as a client would."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            res = await self.request(life, "chat.send", send_params(key, text, run_id))
            if res is not None and self.note_send(life, key, run_id, res):
                return
            await asyncio.sleep(0.5)
        self.problems.append(f"the watchers' send {run_id} was never acked")

    async def diagnose(self, watcher: Life, run_id: str) -> None:
        """What the processes and Redis say when live events did not cross."""
        wanted = ("delivery_lag_seconds_sum", "delivery_lag_seconds_count", "channel_layer_failures", "dependency")
        for index, server in enumerate(self.c.servers):
            _status, text = await asyncio.to_thread(server.get, "/metrics")
            lines = [line for line in text.splitlines() if not line.startswith("#") and any(w in line for w in wanted)]
            print(f"outages: process {index}: {lines}")
        print(f"outages: groups {await asyncio.to_thread(self.layer_groups)}")
        got = [(e["payload"]["runId"], e["payload"]["state"]) for e in watcher.client.events if e["event"] == "chat"]
        print(f"outages: the watcher on process {watcher.server} got {got[-8:]} (waiting for {run_id})")

    def layer_groups(self) -> dict[str, int]:
        """The layer's groups in Redis (proc.*, user.*) and how many channels each holds."""
        import redis

        client = redis.Redis.from_url(self.redis.url, socket_timeout=3)
        prefix = f"{self.c.env['REDIS_LAYER_PREFIX']}:group:"
        try:
            return {
                key.decode().removeprefix(prefix): int(client.zcard(key))
                for key in client.scan_iter(match=f"{prefix}*", count=1000)
            }
        finally:
            client.close()

    async def schedule(self, plan: Plan) -> None:
        """Each step's outages one right after the other; then both processes ready, and the layer checked."""
        await asyncio.sleep(3.0)
        for step in plan:
            if step == [(("postgres",), step[0][1])]:
                await self.stream_through_the_outage()
            for kinds, down in step:
                await self.outage(kinds, down)
            what = " then ".join("+".join(kinds) for kinds, _down in step)
            took = await self.until_ready(what)
            self.outage_active = False
            if "redis" in step[-1][0]:  # Redis was the last service back
                self.redis_ready_after.append(took)
            if any("redis" in kinds for kinds, _down in step):
                await self.layer_works_again()
            await asyncio.sleep(self.rng.uniform(1.5, 2.5))
        self.done.set()


Plan = list[list[tuple[tuple[str, ...], float]]]


def outage_plan(rng: random.Random) -> Plan:
    """Redis alone, PostgreSQL alone, both at once, and one right after the other, in a seeded order.

    PostgreSQL alone is away longer than the pool's wait (DB_POOL_TIMEOUT_SECONDS, 5 s: the
    latest a process learns of the outage) plus RUN_DB_WAIT, so a run streaming through it stops.
    """
    first, second = rng.sample(["redis", "postgres"], 2)
    steps: Plan = [
        [(("redis",), rng.uniform(3.0, 4.5))],
        [(("postgres",), rng.uniform(RUN_DB_WAIT + 6.0, RUN_DB_WAIT + 7.0))],
        [(("redis", "postgres"), rng.uniform(3.0, 6.0))],
        [((first,), rng.uniform(3.0, 4.0)), ((second,), rng.uniform(3.0, 4.0))],
    ]
    rng.shuffle(steps)
    return steps


def is_delta(event: dict[str, Any], run_id: str) -> bool:
    return event["event"] == "chat" and event["payload"]["runId"] == run_id and event["payload"]["state"] == "delta"


def metric(server: Any, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    _status, text = server.get("/metrics")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


@pytest.fixture
def private_services(tmp_path: Path) -> Iterator[tuple[PostgresProcess, RedisProcess]]:
    bindir = services.postgres_bindir()
    services.require_programs({"redis-server": shutil.which("redis-server"), "postgres (initdb, postgres)": bindir})
    assert bindir is not None
    pg = PostgresProcess(bindir, tmp_path)
    redis = RedisProcess(tmp_path)
    try:
        pg.init()
        pg.start()
        redis.start()
        yield pg, redis
    finally:
        redis.destroy()
        pg.destroy()


async def test_redis_and_postgres_restarted_under_load(
    tmp_path: Path, private_services: tuple[PostgresProcess, RedisProcess]
) -> None:
    seed = int(os.environ.get("AGENTGATE_OUTAGE_SEED", str(random.SystemRandom().randrange(1_000_000))))
    print(f"outages seed: {seed} (AGENTGATE_OUTAGE_SEED={seed} replays it)")
    pg, redis = private_services
    extra = {
        "GATEWAY_RUN_DB_WAIT_SECONDS": str(RUN_DB_WAIT),
        "REDIS_RETRIES": str(REDIS_RETRIES),
        # after an outage a peer may get its heartbeat through up to the pool's 5 s wait later
        # than another: the recovery period must exceed that (docs/deployment.md); the suite's 3 s does not
        "GATEWAY_RECOVERY_SECONDS": str(RECOVERY),
    }
    with cluster(tmp_path, PROCESSES, postgres_url=pg.admin_url, redis_url=redis.url, **extra) as c:
        tokens = c.tokens(*USERS, "w")
        run = Outages(c, pg, redis, tokens, seed)
        ((run.watcher_id,),) = c.query("select id from auth_user where username = 'w'")
        for server in range(PROCESSES):
            life = await run.connect("w", server)
            assert life is not None
            run.watchers.append(life)
        plan = outage_plan(run.rng)
        run.mark(f"plan {[[('+'.join(k), round(d, 1)) for k, d in step] for step in plan]}")
        await asyncio.gather(run.schedule(plan), *(run.slot_loop(s) for s in range(CONNECTIONS)))
        await run.resend_all()
        survivors = [life for life in run.current.values() if life is not None and life.client.closed is None]
        survivors += run.watchers
        await quiesce(run, survivors)
        failures = check(run, survivors)
        if any("terminals on a connection" in f for f in failures):
            # diagnosis: late (patience) or never (a hole)?
            await asyncio.gather(*(life.client.drain(10.0) for life in survivors))
            still = [f for f in terminal_problems(run, survivors, stored_runs(c)) if "terminals on" in f]
            print(f"outages: 10 s later {len(still)} terminals still missing")
        assert not failures, f"seed {seed}: " + "\n".join(failures[:25])


async def quiesce(run: Outages, survivors: list[Life]) -> None:
    """Every run ends (none hangs here), then repair has two windows to deliver what was lost."""
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        ((n,),) = run.c.query("select count(*) from sessions_app_run where state in ('queued','dispatching','running')")
        if n == 0:
            break
        await asyncio.gather(*(life.client.drain(0.5) for life in survivors))
    else:
        run.problems.append("runs still open 40 s after the load")
    await asyncio.gather(*(life.client.drain(3.0) for life in survivors))


def stored_runs(c: Cluster) -> dict[tuple[str, str, str], tuple[Any, ...]]:
    """(user, sessionKey, runId) -> (state, errorKind, user messages, dispatched, owner process, ended at, seq)."""
    return {
        (user, key, run_id): rest
        for user, key, run_id, *rest in c.query(
            "select u.username, s.key, r.run_id, r.state, r.error_kind, "
            "(select count(*) from sessions_app_message m where m.run_id = r.id and m.role = 'user'), "
            "r.dispatched_at is not null, r.owner_process, extract(epoch from r.ended_at), r.stream_seq "
            "from sessions_app_run r join sessions_app_chatsession s on s.id = r.session_id "
            "join auth_user u on u.id = s.owner_id"
        )
    }


def terminal_problems(
    run: Outages, survivors: list[Life], stored: dict[tuple[str, str, str], tuple[Any, ...]]
) -> list[str]:
    """Every connection that stayed: exactly one terminal, the stored one, for every run it saw or was acked live."""
    problems = []
    for life in survivors:
        if life.client.closed is not None:
            problems.append(f"a connection of {life.user} closed with {life.client.closed} at the end")
            continue
        by_run: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for e in life.client.events:
            if e["event"] == "chat":
                by_run[(e["payload"]["sessionKey"], e["payload"]["runId"])].append(e["payload"])
        for key, run_id in set(by_run) | life.live_acked:
            events = by_run.get((key, run_id), [])
            seqs = [p["seq"] for p in events]
            terminals = [p for p in events if p["state"] in TERMINAL]
            facts = stored.get((life.user, key, run_id), ("?", "", 0, False, "", None, None))
            if seqs != sorted(set(seqs)):
                problems.append(f"{run_id}: seq not strictly increasing {seqs}")
            # after a terminal ack no event follows; the end may have come before it
            expected = (0, 1) if (key, run_id) in life.terminal_acked else (1,)
            if len(terminals) not in expected:
                connection = (life.client.hello or {}).get("server", {}).get("connId")
                problems.append(
                    f"{run_id} ({facts[0]}): {len(terminals)} terminals on a connection of {life.user} to process "
                    f"{life.server} ({connection}); acked live {(key, run_id) in life.live_acked}; got "
                    f"{[(p['state'], p['seq']) for p in events][-4:]}; stored (owner, ended, seq) {facts[4:]}"
                )
            elif terminals and facts[0] not in STATE_OF_EVENT[terminals[0]["state"]]:
                problems.append(f"{run_id}: terminal {terminals[0]['state']} but stored {facts[0]}")
            elif terminals and events[-1] is not terminals[0]:
                problems.append(f"{run_id}: events after its terminal")
    return problems


def check(run: Outages, survivors: list[Life]) -> list[str]:
    c = run.c
    problems = list(run.problems)
    # the processes: alive, ready, each saw the outages and logged them once each way
    logs = c.logs()
    outages_seen = {}
    for index, server in enumerate(c.servers):
        if not server.alive():
            problems.append(f"process {index} died")
            continue
        status, body = server.get("/readyz")
        if status != 200:
            problems.append(f"process {index} not ready at the end: {body}")
        outages_seen[index] = {
            dep: metric(server, "agentgate_dependency_outages_total", dependency=dep)
            for dep in ("database", "channel_layer")
        }
        for dep, count in outages_seen[index].items():
            if not count:
                problems.append(f"process {index} counted no {dep} outage")
            if metric(server, "agentgate_dependency_available", dependency=dep) != 1.0:
                problems.append(f"process {index}: {dep} not available at the end")
    for index, server in enumerate(c.servers):
        text = server.log_path.read_text(errors="replace")
        for dep in ("database", "channel_layer"):
            began, ended = text.count(f"{dep} unavailable:"), text.count(f"{dep} available again after")
            if not began or began != ended or began > 20:
                problems.append(f"process {index}'s log lines of {dep} outages: {began} began, {ended} ended")
    if "Traceback" in logs:
        problems.append("a traceback in the logs: " + logs[logs.index("Traceback") - 300 :][:2500])

    # requests during the outages: answered, UNAVAILABLE, fast
    slow = [r for r in run.refusals if r.seconds > REFUSED_WITHIN]
    bad = [r for r in run.refusals if not r.retryable or not r.retry_after_ms]
    if not run.refusals:
        problems.append("no request was refused during the outages: were they felt?")
    problems += [f"refused after {r.seconds:.1f}s: {r.method}" for r in slow[:5]]
    problems += [f"refusal without retryable/retryAfterMs: {r}" for r in bad[:5]]
    late = [a for a in run.during_outage if a.seconds > REFUSED_WITHIN]
    problems += [f"answered after {a.seconds:.1f}s during an outage (ok {a.ok}): {a.method}" for a in late[:5]]
    slow_back = [round(t, 1) for t in run.redis_ready_after if t > READY_AFTER_REDIS]
    if slow_back:
        problems.append(f"ready again only {slow_back} s after Redis was back")

    # the database: every acked send has its run and its message; every run ended once; none interrupted
    stored = stored_runs(c)
    for acked in run.acked:
        found = stored.get(acked)
        if found is None:
            problems.append(f"acked send {acked} has no run")
        elif found[2] != (1 if found[3] else 0):  # (its message joins the history when the run starts)
            problems.append(f"acked send {acked} ({found[0]}, started {found[3]}): {found[2]} user messages")
    open_runs = [k for k, v in stored.items() if v[0] in ("queued", "dispatching", "running")]
    problems += [f"run left open: {k}" for k in open_runs[:5]]
    interrupted = c.query(
        "select run_id, owner_process, error_message, extract(epoch from ended_at) from sessions_app_run "
        "where error_kind = 'interrupted'"
    )
    problems += [f"run ended interrupted although no process died: {row}" for row in interrupted[:5]]
    long_run = [tuple(v[:2]) for (_u, _k, run_id), v in stored.items() if run_id == run.long_run]
    if long_run != [("failed", "unavailable")]:
        problems.append(f"{run.long_run}, streaming through PostgreSQL's longest outage, ended {long_run}")
    # the audit trail: one terminal transition per run, none for a run still open
    terminal_rows = dict(
        c.query(
            "select r.run_id || ' ' || r.state, count(e.id) from sessions_app_run r "
            "left join sessions_app_lifecycleevent e on e.run_id = r.id and e.tool_call_id is null "
            "and e.to_state in ('done', 'failed', 'killed', 'timeout') group by r.id, r.run_id, r.state"
        )
    )
    wrong = {run_state: n for run_state, n in terminal_rows.items() if n != 1}
    problems += [f"run with {n} terminal audit rows: {run_state}" for run_state, n in list(wrong.items())[:5]]

    problems += terminal_problems(run, survivors, stored)

    # rows: nothing says running, nothing contradicts itself; the doctor agrees
    rows = c.query("select key, status from sessions_app_chatsession where status = 'running'")
    problems += [f"session left running: {row}" for row in rows[:5]]
    for life in survivors:
        for e in life.client.events:
            if e["event"] == "sessions.changed" and contradictions(e["payload"]["session"]):
                problems.append(f"self-contradicting row {e['payload']['session']}")
                break
    doctor = manage(c.env, "gateway_doctor", "--json", timeout=60)  # exits 1 on findings (raises)
    findings = json.loads(doctor.stdout).get("findings")
    if findings:
        problems.append(f"doctor findings: {findings[:3]}")

    states = Counter(v[0] for v in stored.values())
    kinds = Counter(v[1] for v in stored.values() if v[1])
    seconds = [r.seconds for r in run.refusals]
    summary = {
        "actions": dict(run.actions),
        "acked": len(run.acked),
        "runs": dict(states),
        "error_kinds": dict(kinds),
        "refused": dict(Counter(r.method for r in run.refusals)),
        "during_outages": {
            "requests": len(run.during_outage),
            "max_seconds": round(max((a.seconds for a in run.during_outage), default=0.0), 2),
        },
        "ready_after_redis": [round(t, 1) for t in run.redis_ready_after],
        "refused_seconds": {
            "median": round(statistics.median(seconds), 3) if seconds else None,
            "max": round(max(seconds), 2) if seconds else None,
        },
        "closes": dict(run.closes),
        "outages_counted": outages_seen,
        "problems": len(problems),
    }
    print("outages:", json.dumps(summary))
    return problems
