"""Prometheus metrics of one gateway process, served at /metrics.

Two kinds:
- event metrics, counted in the process where the event happens: method calls (the
  consumer calls `call_handler` where it invokes a handler), run outcomes, latency and
  tokens (the `run_transitioned` receiver, connected in `ChatConfig.ready`), WebSocket
  closes, repair passes, sweeps and channel-layer failures (the run manager). Prometheus
  sums them over the processes it scrapes;
- state gauges (active, queued and stuck runs, oldest active run, live processes) are
  read from the database at scrape time with a few indexed queries, after a probe with
  a short connect timeout,
  so every process reports the same cluster-wide values (take `max`, not `sum`), and a
  scrape answers in seconds even when the database is down.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import django
from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone
from prometheus_client import REGISTRY, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chat.protocol.frames import ProtocolError
from chat.runtime import health
from chat.runtime.registry import connections as gateway_connections
from sessions_app import operator_reads
from sessions_app.models import ACTIVE_STATES, TERMINAL_STATES, ChatSession, Run, RunState
from sessions_app.operations.dbcheck import probe_database
from sessions_app.process import live_process_ids

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RUN_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60)

BUILD = Info("agentgate_build", "Version of the gateway and its runtime.")
BUILD.info(
    {
        "version": str(getattr(settings, "GATEWAY_VERSION", "")),
        "python": platform.python_version(),
        "django": django.get_version(),
    }
)

CHAT_SEND_SECONDS = Histogram(
    "agentgate_chat_send_seconds",
    "Time from a chat.send (or sessions.steer) request to its ack, held acks (waitMs) excluded.",
    ["method"],
    buckets=LATENCY_BUCKETS,
)
CHAT_SEND_ACKS = Counter(
    "agentgate_chat_send_acks",
    "chat.send / sessions.steer answers by ack status (started, queued, in_flight, ok, timeout, error) "
    "or by error code for rejected requests (invalid_request, conflict, rate_limited, ...).",
    ["method", "status"],
)
METHOD_CALLS = Counter(
    "agentgate_method_calls",
    "Gateway method calls by method and outcome (ok or the error code).",
    ["method", "outcome"],
)
METHOD_SECONDS = Histogram(
    "agentgate_method_seconds",
    "Time to answer a gateway method call (held acks excluded).",
    ["method"],
    buckets=LATENCY_BUCKETS,
)
RUN_DURATION_SECONDS = Histogram(
    "agentgate_run_duration_seconds",
    "Duration of runs from dispatch to their terminal state.",
    ["agent", "state"],
    buckets=RUN_BUCKETS,
)
RUNS_ENDED = Counter(
    "agentgate_runs_ended",
    "Runs that reached a terminal state (committed in this process), by agent, state and error kind.",
    ["agent", "state", "error_kind"],
)
TIME_TO_FIRST_TOKEN = Histogram(
    "agentgate_time_to_first_token_seconds",
    "From dispatch to the first streamed text of a run.",
    ["agent"],
    buckets=TTFT_BUCKETS,
)
TOKENS = Counter(
    "agentgate_tokens", "Tokens reported by backends, by agent and kind (prompt, completion).", ["agent", "kind"]
)
WS_CLOSES = Counter("agentgate_websocket_closes", "WebSocket connections closed, by close code.", ["code"])
CHANNEL_LAYER_FAILURES = Counter(
    "agentgate_channel_layer_failures", "Channel-layer operations that failed, by where they happened.", ["where"]
)
REPAIR_PASSES = Counter(
    "agentgate_repair_passes", "Repair passes of this process, by outcome (ok, error).", ["outcome"]
)
SWEEPS = Counter("agentgate_sweeps", "Heartbeat/recovery sweeps of this process, by outcome (ok, error).", ["outcome"])
SWEEP_RUNS_ENDED = Counter("agentgate_sweep_runs_ended", "Runs of dead processes ended by this process's sweep.")
SWEEP_PROCESSES_FORGOTTEN = Counter(
    "agentgate_sweep_processes_forgotten", "Rows of long-dead processes deleted by this process's sweep."
)
EVENT_DELIVERY_LAG = Histogram(
    "agentgate_event_delivery_lag_seconds",
    "Age of a run event when this process's hub hands it to its connections (broadcast queue plus channel "
    "layer): seconds of lag here mean live streaming is that late (terminals still come through repair).",
    buckets=(*LATENCY_BUCKETS, 30.0, 60.0),
)
BACKGROUND_RESTARTS = Counter(
    "agentgate_background_loop_restarts", "Background loops restarted after a failure, by loop.", ["loop"]
)


# --- state gauges ---------------------------------------------------------------------------------------------


def _database_gauges() -> dict[str, tuple[str, float]]:
    live = live_process_ids()
    return {
        "agentgate_active_runs": (
            "Runs dispatching or running (all processes).",
            Run.objects.filter(state__in=ACTIVE_STATES).count(),
        ),
        "agentgate_queued_runs": (
            "Runs waiting behind an active run (all processes).",
            Run.objects.filter(state=RunState.QUEUED).count(),
        ),
        "agentgate_stuck_sessions": (
            "Sessions the admin shows as stuck (operator_reads: no live process "
            "behind an active run, running too long, queue or row stranded).",
            operator_reads.stuck_count(live),
        ),
        "agentgate_oldest_active_run_age_seconds": (
            "Age of the oldest active run (0 when none).",
            operator_reads.oldest_active_run_age_seconds(),
        ),
        "agentgate_live_processes": ("Gateway processes with a recent heartbeat.", len(live)),
    }


# Exported only on PostgreSQL with the connection pool (DB_POOL, the default there).
POOL_METRIC_NAMES = (
    "agentgate_db_pool_size",
    "agentgate_db_pool_available",
    "agentgate_db_requests_waiting",
    "agentgate_db_pool_requests_errors",
    "agentgate_db_pool_requests_timeouts",
    "agentgate_db_pool_connections_errors",
)


def _pool_gauges() -> list[GaugeMetricFamily]:
    pool = getattr(connections["default"], "pool", None) if connections["default"].vendor == "postgresql" else None
    if pool is None:
        return []
    stats = pool.get_stats()
    out = []
    for key, doc in (
        ("pool_size", "Connections in the database pool."),
        ("pool_available", "Idle connections in the database pool."),
        ("requests_waiting", "Requests waiting for a pooled database connection."),
    ):
        gauge = GaugeMetricFamily(f"agentgate_db_{key}", doc)
        gauge.add_metric([], float(stats.get(key, 0)))
        out.append(gauge)
    for key, doc in (
        ("requests_errors", "Pool requests that failed (since start)."),
        ("requests_timeouts", "Pool requests that timed out waiting for a connection (since start)."),
        ("connections_errors", "Failed attempts to open a database connection (since start)."),
    ):
        gauge = GaugeMetricFamily(f"agentgate_db_pool_{key}", doc)
        gauge.add_metric([], float(stats.get(key, 0)))
        out.append(gauge)
    return out


def _layer_pool_gauges() -> list[GaugeMetricFamily]:
    """The Redis channel layer's connections in this process (none with the in-memory layer)."""
    # here: chat.delivery.layers imports channels_redis, needed only with Redis
    from chat.delivery.layers import pool_stats

    stats = pool_stats()
    if not stats["max"]:
        return []
    gauge = GaugeMetricFamily(
        "agentgate_channel_layer_redis_connections",
        "Redis connections of this process's channel-layer pool: open, in use, and the pool's maximum.",
        labels=["state"],
    )
    for key in ("open", "in_use", "max"):
        gauge.add_metric([key], float(stats[key]))
    return [gauge]


class GatewayStateCollector(Collector):
    """Gauges read at scrape time: database state (bounded by a deadline), the pool, this process."""

    def describe(self) -> list[Any]:
        return []  # no database access when the collector is registered

    def collect(self) -> Iterator[GaugeMetricFamily]:
        sockets = GaugeMetricFamily(
            "agentgate_connected_sockets", "Authenticated WebSocket connections of this process."
        )
        sockets.add_metric([], len(gateway_connections))
        yield sockets
        loops = GaugeMetricFamily(
            "agentgate_background_loop_ok", "1 if the background loop's last pass succeeded.", labels=["loop"]
        )
        for name, state in sorted(health.snapshot().items()):
            loops.add_metric([name], 1.0 if state.ok else 0.0)
        yield loops
        yield from _pool_gauges()
        yield from _layer_pool_gauges()
        error = GaugeMetricFamily(
            "agentgate_scrape_database_error", "1 if the database gauges could not be read (database unreachable)."
        )
        try:
            # A short-timeout probe first: the pool would wait 30 s for a dead database.
            probe_database()
            values = _database_gauges()
        except Exception as exc:  # a scrape must still answer (quickly) when the database is down
            log.warning("metrics: database gauges failed: %s", f"{type(exc).__name__}: {exc}".strip()[:300])
            error.add_metric([], 1)
            yield error
            return
        error.add_metric([], 0)
        yield error
        for name, (doc, value) in values.items():
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], float(value))
            yield gauge


STATE_COLLECTOR = GatewayStateCollector()
REGISTRY.register(STATE_COLLECTOR)


# --- event hooks ------------------------------------------------------------------------------------

ACK_METHODS = ("chat.send", "sessions.steer")


def _count_ack(method: str, reply: Any) -> None:
    payload = reply.payload or {}
    status = payload.get("status") or ("error" if reply.error is not None else "ok")
    CHAT_SEND_ACKS.labels(method, str(status)).inc()


async def call_handler(method: str, handler: Callable[..., Awaitable[Any]], conn: Any, params: dict[str, Any]) -> Any:
    """Invoke a method handler, metering its latency and outcome (and chat.send's ack status)."""
    started = time.perf_counter()
    acks = method in ACK_METHODS
    try:
        reply = await handler(conn, params)
    except ProtocolError as exc:
        METHOD_CALLS.labels(method, exc.code.lower()).inc()
        if acks:
            CHAT_SEND_ACKS.labels(method, exc.code.lower()).inc()
        raise
    except Exception:
        METHOD_CALLS.labels(method, "internal").inc()
        if acks:
            CHAT_SEND_ACKS.labels(method, "internal").inc()
        raise
    finally:
        seconds = time.perf_counter() - started
        METHOD_SECONDS.labels(method).observe(seconds)
        if acks:
            CHAT_SEND_SECONDS.labels(method).observe(seconds)
    METHOD_CALLS.labels(method, "ok" if reply.error is None else "error").inc()
    if not acks:
        return reply
    if reply.wait is None:
        _count_ack(method, reply)
        return reply
    inner = reply.wait

    async def wait() -> Any:
        final = await inner()
        _count_ack(method, final)
        return final

    return dataclasses.replace(reply, wait=wait)


def sweep_done(ended: int, forgotten: int) -> None:
    SWEEPS.labels("ok").inc()
    SWEEP_RUNS_ENDED.inc(ended)
    SWEEP_PROCESSES_FORGOTTEN.inc(forgotten)


def websocket_closed(code: int | None) -> None:
    WS_CLOSES.labels(str(code if code is not None else "none")).inc()


def channel_layer_failed(where: str) -> None:
    CHANNEL_LAYER_FAILURES.labels(where).inc()


def first_token(agent_id: str, dispatched_at: Any) -> None:
    if dispatched_at is None:
        return
    TIME_TO_FIRST_TOKEN.labels(agent_id).observe(max(0.0, (timezone.now() - dispatched_at).total_seconds()))


def _observe_end(
    agent: str, state: str, error_kind: str, seconds: float | None, prompt: int | None, completion: int | None
) -> None:
    RUNS_ENDED.labels(agent, state, error_kind or "").inc()
    if seconds is not None:
        RUN_DURATION_SECONDS.labels(agent, state).observe(seconds)
    if prompt:
        TOKENS.labels(agent, "prompt").inc(prompt)
    if completion:
        TOKENS.labels(agent, "completion").inc(completion)


def on_run_transition(
    sender: Any, run: Run, from_state: str, to_state: str, session: ChatSession | None = None, **kwargs: Any
) -> None:
    """`run_transitioned` receiver (connected in ChatConfig.ready): outcomes, duration, tokens."""
    if to_state not in TERMINAL_STATES:
        return
    seconds = None
    if from_state in ACTIVE_STATES and run.dispatched_at is not None and run.ended_at is not None:
        seconds = max(0.0, (run.ended_at - run.dispatched_at).total_seconds())
    agent = session.agent_id if session is not None else ""
    # Counted after commit: a transition that rolls back never happened.
    transaction.on_commit(
        partial(_observe_end, agent, to_state, run.error_kind, seconds, run.prompt_tokens, run.completion_tokens)
    )
