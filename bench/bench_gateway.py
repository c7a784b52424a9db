"""Throughput and latency of one gateway process under many streaming runs.

Starts a real server (`manage.py serve`) on a fresh SQLite file (or on the
DATABASE_URL / REDIS_URL you pass with --database-url / --redis-url), opens
--clients WebSocket connections for one user, and has each send --runs messages
to its own session, one after another, each streaming --words words with --tick ms
between them. Prints ack latency, time to the final event, delivered events per
second and the server's resident memory.

    .venv/bin/python bench/bench_gateway.py --clients 20 --runs 10 --words 40 --tick 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.servers import ServerHandle, base_env, create_token, manage, start_server, ws_client


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def one_client(
    server: ServerHandle,
    token: str,
    idx: int,
    args: argparse.Namespace,
    acks: list[float],
    finals: list[float],
    counts: list[int],
) -> None:
    async with ws_client(server, token, subscribe=True) as c:
        for r in range(args.runs):
            run_id = f"c{idx}r{r}"
            sent = time.perf_counter()
            ack = await c.ok(
                "chat.send",
                {
                    "sessionKey": f"bench{idx}",
                    "idempotencyKey": run_id,
                    "message": f"[[words:{args.words}]] [[tick:{args.tick}]]",
                },
                timeout=60,
            )
            acks.append((time.perf_counter() - sent) * 1000)
            assert ack["status"] == "started", ack
            await c.wait_event(
                lambda e, rid=run_id: (
                    e["event"] == "chat" and e["payload"]["runId"] == rid and e["payload"]["state"] == "final"
                ),
                timeout=120,
            )
            finals.append((time.perf_counter() - sent) * 1000)
        counts.append(len(c.events))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--tick", type=int, default=5)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--redis-url", default="")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="agentgate-bench-"))
    env = base_env(tmp / "bench.sqlite3", GATEWAY_RATE_PER_SEC="1000", GATEWAY_RATE_BURST="1000")
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url
    manage(env, "migrate", "--noinput", "-v0")
    token = create_token(env, "bench")
    server = start_server(env=env, log_dir=tmp)
    server.wait_ready()
    rss_before = rss_mb(server.pid)
    acks: list[float] = []
    finals: list[float] = []
    counts: list[int] = []
    started = time.perf_counter()
    try:
        await asyncio.gather(*(one_client(server, token, i, args, acks, finals, counts) for i in range(args.clients)))
    finally:
        elapsed = time.perf_counter() - started
        rss_after = rss_mb(server.pid) if server.alive() else 0.0
        server.stop()
    runs = args.clients * args.runs
    events = sum(counts)
    db = "postgresql" if "postgres" in env["DATABASE_URL"] else "sqlite"
    layer = "redis" if env.get("REDIS_URL") else "in-memory"
    print(
        f"agentgate bench: {args.clients} clients x {args.runs} runs, {args.words} words, tick {args.tick} ms "
        f"({db}, {layer} layer)"
    )
    print(f"  runs completed      {runs} in {elapsed:.1f} s  ({runs / elapsed:.1f} runs/s)")
    print(f"  chat.send ack ms    p50 {statistics.median(acks):.1f}  p95 {pct(acks, 95):.1f}  max {max(acks):.1f}")
    print(
        f"  send->final ms      p50 {statistics.median(finals):.1f}  p95 {pct(finals, 95):.1f}  max {max(finals):.1f}"
    )
    print(f"  events delivered    {events}  ({events / elapsed:.0f} events/s)")
    print(f"  server RSS MiB      {rss_before:.1f} before, {rss_after:.1f} after")


if __name__ == "__main__":
    asyncio.run(main())
