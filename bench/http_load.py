"""The HTTP load client and rows of `make bench`: Chat Completions turns over `httpx`, beside the
WebSocket turns of `bench/load.py`, against the same gateway (and the HTTP floor,
`bench/floor_http.py`) in the same run.

Each client is one `httpx.AsyncClient` holding one keep-alive connection, authenticated as its own
user (client i is bench<i>, as WebSocket connection i is). A turn is one `POST
/v1/chat/completions` with the WebSocket turn's message, answered whole or streamed to `[DONE]`;
the scripted agent answers it the same way. Three shapes:

- `http_turns_10`: each client in a named session of its own (`x-agentgate-session-key`), not
  streamed: the like of a WebSocket turn in its session;
- `http_stream_10`: the same, streamed (`stream: true`, every line read);
- `http_stateless_10`: no session header: each request a stateless run in an `api` session of its
  own (what Open WebUI sends).

The server's CPU per turn is its process's CPU time over the timed turns (`/proc/<pid>/stat`),
the load client's own outside it; `derive` adds the HTTP / WebSocket ratio of each repeat.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

import httpx

from bench.load import TURN_MESSAGE, Target, new_key, pct
from bench.table import Row

Scenario = Callable[[Target], Awaitable[dict[str, float]]]
COMPLETIONS = "/v1/chat/completions"
RATIO = "http_vs_ws"  # the derived scenario: per-repeat ratios of CPU per turn
TARGET_RATIO = 1.5  # an HTTP turn within 1.5x the CPU of a WebSocket turn (issue 28)


class HttpClient:
    """One client on one keep-alive connection, as one user."""

    def __init__(self, base: str, token: str) -> None:
        self.http = httpx.AsyncClient(
            base_url=base,
            headers={"authorization": f"Bearer {token}"},
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
            timeout=httpx.Timeout(30.0),
        )

    async def turn(self, session: str | None, *, stream: bool, message: str = TURN_MESSAGE) -> float:
        """One completion, to its end; its seconds. Raises unless it finished with `stop` and text."""
        body = {"model": "main", "messages": [{"role": "user", "content": message}], "stream": stream}
        headers = {"x-agentgate-session-key": session} if session else {}
        sent = time.perf_counter()
        if not stream:
            res = await self.http.post(COMPLETIONS, json=body, headers=headers)
            data = res.json()
            if res.status_code != 200 or data["choices"][0]["finish_reason"] != "stop":
                raise RuntimeError(f"completion not finished: {res.status_code} {data}")
            return time.perf_counter() - sent
        finished = done = False
        async with self.http.stream("POST", COMPLETIONS, json=body, headers=headers) as res:
            if res.status_code != 200:
                raise RuntimeError(f"stream refused: {res.status_code} {(await res.aread())[:300]!r}")
            async for line in res.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                elif '"finish_reason":"stop"' in line:
                    finished = True
                elif line.startswith('data: {"error"'):
                    raise RuntimeError(f"stream ended in error: {line}")
        if not (finished and done):
            raise RuntimeError(f"stream ended without its finish_reason and [DONE] ({finished=}, {done=})")
        return time.perf_counter() - sent

    async def close(self) -> None:
        await self.http.aclose()


async def http_turns(target: Target, conns: int, seconds: float, *, stream: bool, named: bool) -> dict[str, float]:
    """Each client sends completion after completion for `seconds` (in its own named session, or
    stateless): turns/s, turn p50/p99 (ms), slowest turn (s), server CPU per turn (ms)."""
    clients = [HttpClient(target.http_base(i), target.token(f"bench{i}")) for i in range(conns)]
    tag = new_key("h")
    sessions = [f"{tag}-s{i}" if named else None for i in range(conns)]
    try:
        # one warm-up turn per client opens its connection (and creates its session); not counted
        await asyncio.gather(*(c.turn(sessions[i], stream=stream) for i, c in enumerate(clients)))
        durations: list[float] = []
        target.mark(True)
        cpu = target.cpu_seconds()
        start = time.perf_counter()
        deadline = start + seconds

        async def loop(i: int, c: HttpClient) -> None:
            while time.perf_counter() < deadline:
                durations.append(await c.turn(sessions[i], stream=stream))

        await asyncio.gather(*(loop(i, c) for i, c in enumerate(clients)))
        elapsed = time.perf_counter() - start
        cpu = target.cpu_seconds() - cpu
        target.mark(False)
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return {
        "turns": float(len(durations)),
        "turns_per_s": len(durations) / elapsed,
        "turn_p50_ms": pct(durations, 50) * 1000,
        "turn_p99_ms": pct(durations, 99) * 1000,
        "turn_max_s": max(durations, default=math.nan),
        "cpu_ms_per_turn": cpu * 1000 / max(1, len(durations)),
    }


def scenarios(conns: int, seconds: float) -> dict[str, Scenario]:
    return {
        "http_turns_10": lambda t: http_turns(t, conns, seconds, stream=False, named=True),
        "http_stream_10": lambda t: http_turns(t, conns, seconds, stream=True, named=True),
        "http_stateless_10": lambda t: http_turns(t, conns, seconds, stream=False, named=False),
    }


# The HTTP scenarios whose CPU per turn is set against the WebSocket's (`turns_10`), and the
# derived metric each ratio is recorded under.
RATIOS = {"http_turns_10": "named", "http_stream_10": "stream", "http_stateless_10": "stateless"}


def derive(results: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    """Add the `http_vs_ws` scenario to each side's results: for each repeat, the CPU per turn of
    each HTTP shape over that of the WebSocket turns of the same repeat (measured side by side)."""
    for by in results.values():
        ws = by.get("turns_10", [])
        ratios: list[dict[str, float]] = []
        for rep, base in enumerate(ws):
            found: dict[str, float] = {}
            for scenario, metric in RATIOS.items():
                runs = by.get(scenario, [])
                if rep < len(runs) and base.get("cpu_ms_per_turn") and "cpu_ms_per_turn" in runs[rep]:
                    found[metric] = runs[rep]["cpu_ms_per_turn"] / base["cpu_ms_per_turn"]
            if found:
                ratios.append(found)
        if ratios:
            by[RATIO] = ratios


def rows(conns: int) -> list[Row]:
    def within(metric: str) -> Callable[[Callable[[str, str], float]], bool]:
        return lambda m: m(RATIO, metric) <= TARGET_RATIO

    def cpu(row: str, label: str, scenario: str) -> Row:
        return Row(row, f"server CPU ms per turn, {label}", scenario, "cpu_ms_per_turn", fmt="{:.2f}")

    def ratio(row: str, label: str, metric: str, checked: bool) -> Row:
        label = f"CPU per turn, {label} / WebSocket"
        if not checked:
            return Row(row, label, RATIO, metric, fmt="{:.2f}", compare=False)
        return Row(row, label, RATIO, metric, "<= 1.5x", within(metric), "{:.2f}", compare=False)

    return [
        Row("http_turns_10", f"HTTP turns/s, {conns} clients, named sessions", "http_turns_10", "turns_per_s"),
        Row("http_stream_10", f"HTTP streamed turns/s, {conns} clients, named", "http_stream_10", "turns_per_s"),
        Row("http_stateless_10", f"HTTP stateless turns/s, {conns} clients", "http_stateless_10", "turns_per_s"),
        Row("http_turn_p99", f"HTTP turn p99 ms, {conns} clients, named", "http_turns_10", "turn_p99_ms"),
        cpu("cpu_turn_ws", f"WebSocket, {conns} conns", "turns_10"),
        cpu("cpu_turn_http", "HTTP named", "http_turns_10"),
        cpu("cpu_turn_http_stream", "HTTP streamed", "http_stream_10"),
        cpu("cpu_turn_http_stateless", "HTTP stateless", "http_stateless_10"),
        ratio("http_cpu_ratio", "HTTP named", "named", True),
        ratio("http_stream_cpu_ratio", "HTTP streamed", "stream", True),
        ratio("http_stateless_cpu_ratio", "HTTP stateless", "stateless", False),
    ]
