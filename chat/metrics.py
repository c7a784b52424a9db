"""Prometheus metrics of one gateway process, served at /metrics.

Two kinds:
- event metrics (ack statuses, chat.send latency, run durations, ended runs) are
  counted in the process where the event happens, once `install()` has hooked them
  into the method table and the lifecycle signal (the `serve` command does that);
  Prometheus sums them over the processes it scrapes;
- state gauges (active, queued and stuck runs, oldest active run, live processes)
  are read from the database at scrape time with a few indexed queries, so every
  process reports the same cluster-wide values; take `max` of them, not `sum`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

from django.db import transaction
from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sessions_app import ops_selectors
from sessions_app.models import ACTIVE_STATES, TERMINAL_STATES, Run, RunState
from sessions_app.process import live_process_ids

from .protocol import ProtocolError
from .runtime.gateway import runtime

log = logging.getLogger(__name__)

CHAT_SEND_SECONDS = Histogram(
    "agentgate_chat_send_seconds",
    "Time from a chat.send (or sessions.steer) request to its ack, held acks (waitMs) excluded.",
    ["method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
CHAT_SEND_ACKS = Counter(
    "agentgate_chat_send_acks",
    "chat.send / sessions.steer answers by ack status (started, queued, in_flight, ok, timeout, error) "
    "or by error code for rejected requests (invalid_request, conflict, rate_limited, ...).",
    ["method", "status"],
)
RUN_DURATION_SECONDS = Histogram(
    "agentgate_run_duration_seconds",
    "Duration of runs from dispatch to their terminal state, by terminal state.",
    ["state"],
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
RUNS_ENDED = Counter(
    "agentgate_runs_ended",
    "Runs that reached a terminal state (committed in this process), by state and error kind.",
    ["state", "error_kind"],
)


class GatewayStateCollector(Collector):
    """Gauges read at scrape time: database state and this process's sockets."""

    def describe(self) -> list[Any]:
        return []  # no database access when the collector is registered

    def collect(self) -> Iterator[GaugeMetricFamily]:
        sockets = GaugeMetricFamily(
            "agentgate_connected_sockets", "Authenticated WebSocket connections of this process."
        )
        sockets.add_metric([], len(runtime.connections))
        yield sockets
        error = GaugeMetricFamily("agentgate_scrape_database_error", "1 if the database gauges could not be read.")
        try:
            live = live_process_ids()
            values = {
                "agentgate_active_runs": ("Runs dispatching or running (all processes).",
                                          Run.objects.filter(state__in=ACTIVE_STATES).count()),
                "agentgate_queued_runs": ("Runs waiting behind an active run (all processes).",
                                          Run.objects.filter(state=RunState.QUEUED).count()),
                "agentgate_stuck_sessions": ("Sessions running or queued with no live process behind them, "
                                             "or running longer than GATEWAY_STUCK_RUN_SECONDS.",
                                             ops_selectors.stuck_sessions(live).count()),
                "agentgate_oldest_active_run_age_seconds": ("Age of the oldest active run (0 when none).",
                                                            ops_selectors.oldest_active_run_age_seconds()),
                "agentgate_live_processes": ("Gateway processes with a recent heartbeat.", len(live)),
            }
        except Exception:  # a scrape must still answer when the database is down
            log.exception("metrics: database gauges failed")
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


def _count_ack(method: str, reply: Any) -> None:
    payload = reply.payload or {}
    status = payload.get("status") or ("error" if reply.error is not None else "ok")
    CHAT_SEND_ACKS.labels(method, str(status)).inc()


METERED = ("chat.send", "sessions.steer")


async def metered(method: str, handler: Any, conn: Any, params: dict[str, Any]) -> Any:
    """Call a method handler, observing the latency to its ack and the ack's status."""
    started = time.perf_counter()
    try:
        reply = await handler(conn, params)
    except ProtocolError as exc:
        CHAT_SEND_ACKS.labels(method, exc.code.lower()).inc()
        raise
    except Exception:
        CHAT_SEND_ACKS.labels(method, "internal").inc()
        raise
    finally:
        CHAT_SEND_SECONDS.labels(method).observe(time.perf_counter() - started)
    if reply.wait is None:
        _count_ack(method, reply)
        return reply
    inner = reply.wait

    async def wait() -> Any:
        final = await inner()
        _count_ack(method, final)
        return final

    return dataclasses.replace(reply, wait=wait)


def _observe_end(state: str, error_kind: str, seconds: float | None) -> None:
    RUNS_ENDED.labels(state, error_kind or "").inc()
    if seconds is not None:
        RUN_DURATION_SECONDS.labels(state).observe(seconds)


def on_run_transitioned(sender: Any, run: Run, from_state: str, to_state: str, **kwargs: Any) -> None:
    """Count a run's end and observe its duration, once committed (connected in ChatConfig.ready)."""
    if to_state not in TERMINAL_STATES:
        return
    seconds = None
    if from_state in ACTIVE_STATES and run.dispatched_at is not None and run.ended_at is not None:
        seconds = max(0.0, (run.ended_at - run.dispatched_at).total_seconds())
    # Counted after commit: a transition that rolls back never happened.
    transaction.on_commit(partial(_observe_end, to_state, run.error_kind, seconds))
