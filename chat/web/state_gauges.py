"""State gauges, read from the database at scrape time (registered with Prometheus on import).

Active, queued and stuck runs, the oldest active run, live processes, open tool calls by state
and pending approvals: a few indexed queries after a probe with a short connect timeout, so
every process reports the same cluster-wide values (take `max`, not `sum`) and a scrape answers
in seconds even when the database is down. Also this process's database and channel-layer pools,
and whether it can reach the database and the layer (`chat.base.availability`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from django.db import connections
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chat.base import availability, health
from chat.runtime.registry import connections as gateway_connections
from sessions_app import files, gateway_reads, operator_reads
from sessions_app.operations.dbcheck import probe_database
from sessions_app.process import live_process_ids

log = logging.getLogger(__name__)


def _database_gauges() -> dict[str, tuple[str, float]]:
    live = live_process_ids()
    active, queued = gateway_reads.open_run_counts()  # the figures `health` gives an admin
    stored, stored_bytes = files.stored_totals()
    return {
        "agentgate_stored_files": ("Files kept in the attachments storage (uploads and attachments).", stored),
        "agentgate_stored_file_bytes": ("Bytes of the files kept in the attachments storage.", stored_bytes),
        "agentgate_active_runs": ("Runs dispatching or running (all processes).", active),
        "agentgate_queued_runs": ("Runs waiting behind an active run (all processes).", queued),
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


def _tool_gauges() -> list[GaugeMetricFamily]:
    """Open tool calls by state and pending approvals (one grouped query over the open calls)."""
    counts = operator_reads.tool_counts()
    calls = GaugeMetricFamily(
        "agentgate_open_tool_calls",
        "Tool calls not ended yet, by state: pending (recorded, not started), pending_approval, running "
        "(all processes).",
        labels=["state"],
    )
    for state, number in counts.open_calls.items():
        calls.add_metric([state], float(number))
    approvals = GaugeMetricFamily(
        "agentgate_pending_approvals", "Tool approvals waiting for a decision (all processes)."
    )
    approvals.add_metric([], float(counts.pending_approvals))
    return [calls, approvals]


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
        yield from _dependency_gauges()
        yield from _pool_gauges()
        yield from _layer_pool_gauges()
        error = GaugeMetricFamily(
            "agentgate_scrape_database_error", "1 if the database gauges could not be read (database unreachable)."
        )
        if not availability.database.available:
            # Known to be away: say so without another probe (the outage is logged once, there).
            error.add_metric([], 1)
            yield error
            return
        try:
            # A short-timeout probe first: the pool would make a scrape wait for a dead database.
            probe_database()
            values = _database_gauges()
            tool_gauges = _tool_gauges()
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
        yield from tool_gauges


def _dependency_gauges() -> Iterator[GaugeMetricFamily]:
    up = GaugeMetricFamily(
        "agentgate_dependency_available",
        "1 while this process can reach the service (database, channel_layer), 0 during an outage.",
        labels=["dependency"],
    )
    lasting = GaugeMetricFamily(
        "agentgate_dependency_outage_age_seconds",
        "How long the current outage of the service has lasted (0 when it is available).",
        labels=["dependency"],
    )
    for dependency in (availability.database, availability.channel_layer):
        up.add_metric([dependency.name], 1.0 if dependency.available else 0.0)
        lasting.add_metric([dependency.name], round(dependency.outage_seconds(), 3))
    yield up
    yield lasting


STATE_COLLECTOR = GatewayStateCollector()
REGISTRY.register(STATE_COLLECTOR)
