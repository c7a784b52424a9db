"""The metrics of one gateway process (Prometheus, served at /metrics) and the few helpers
that count events where they happen: WebSocket closes, repair passes, sweeps, channel-layer
failures, first tokens, event delivery lag. Prometheus sums them over the processes it scrapes.

Beside them: method calls are timed by `chat.methods.timing`, run outcomes counted by
`chat.web.run_metrics` (a `run_transitioned` receiver), and the cluster's state read at
scrape time by `chat.web.state_gauges`.
"""

from __future__ import annotations

import logging
import platform
from typing import Any

import django
from django.conf import settings
from django.utils import timezone
from prometheus_client import Counter, Histogram, Info

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
RUNS_STARTED = Counter(
    "agentgate_runs_started",
    "Runs started (dispatched, from the queue or at once; committed in this process), by agent and surface "
    "(ws: the WebSocket, http: the HTTP API).",
    ["agent", "surface"],
)
RUNS_ENDED = Counter(
    "agentgate_runs_ended",
    "Runs that reached a terminal state (committed in this process), by agent, state, error kind and "
    "surface (ws: the WebSocket, http: the HTTP API).",
    ["agent", "state", "error_kind", "surface"],
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
MODEL_TOKENS = Counter(
    "agentgate_model_tokens",
    "Tokens of recorded model calls (committed in this process), by agent, model and kind (input, output, "
    "cached, reasoning); estimated counts included.",
    ["agent", "model", "kind"],
)
MODEL_COST = Counter(
    "agentgate_model_cost_usd",
    "Cost of recorded model calls by the agents' price tables (committed in this process), by agent and model.",
    ["agent", "model"],
)
MODEL_CALLS = Counter(
    "agentgate_model_calls",
    "Recorded model calls (committed in this process), by agent, model and whether usage was reported "
    "(reported, estimated, unknown).",
    ["agent", "model", "usage"],
)
TOOL_CALLS = Counter(
    "agentgate_tool_calls",
    "Tool calls that reached their terminal state (committed in this process), by server, status and error kind.",
    ["server", "status", "error_kind"],
)
TOOL_CALL_SECONDS = Histogram(
    "agentgate_tool_call_seconds",
    "From a tool call's start (running) to its terminal state, by server and status.",
    ["server", "status"],
    buckets=RUN_BUCKETS,
)
WS_CLOSES = Counter("agentgate_websocket_closes", "WebSocket connections closed, by close code.", ["code"])
CHANNEL_LAYER_FAILURES = Counter(
    "agentgate_channel_layer_failures", "Channel-layer operations that failed, by where they happened.", ["where"]
)
REPAIR_PASSES = Counter(
    "agentgate_repair_passes", "Repair passes of this process, by outcome (ok, error).", ["outcome"]
)
SWEEPS = Counter("agentgate_sweeps", "Heartbeat/recovery sweeps of this process, by outcome (ok, error).", ["outcome"])
HEARTBEAT_LATENESS = Histogram(
    "agentgate_heartbeat_lateness_seconds",
    "How late each heartbeat of this process was written against its schedule (from when the first "
    "beat it owed was due): peers declare the process dead once that passes their window.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
)
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
DEPENDENCY_OUTAGES = Counter(
    "agentgate_dependency_outages",
    "Outages of a service this process needs (database, channel_layer), counted when first seen.",
    ["dependency"],
)
DEPENDENCY_OUTAGE_SECONDS = Histogram(
    "agentgate_dependency_outage_seconds",
    "How long each outage lasted, from the first failed call to the first successful one.",
    ["dependency"],
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600),
)
UNAVAILABLE_ANSWERS = Counter(
    "agentgate_unavailable_answers",
    "Requests (and handshakes) answered UNAVAILABLE because a service they needed was away, by dependency.",
    ["dependency"],
)
BACKGROUND_RESTARTS = Counter(
    "agentgate_background_loop_restarts", "Background loops restarted after a failure, by loop.", ["loop"]
)

HTTP_REQUESTS = Counter(
    "agentgate_http_requests",
    "Requests to the HTTP API (/v1/), by route template and answer status.",
    ["route", "status"],
)
HTTP_REQUEST_SECONDS = Histogram(
    "agentgate_http_request_seconds",
    "Time from an HTTP API request to its answer's headers (a stream's first event), by route template.",
    ["route"],
    buckets=LATENCY_BUCKETS,
)


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


def tool_call_ended(server: str, status: str, error_kind: str, seconds: float | None) -> None:
    """A tool call's terminal state committed (called on commit)."""
    TOOL_CALLS.labels(server or "-", status, error_kind or "-").inc()
    if seconds is not None:
        TOOL_CALL_SECONDS.labels(server or "-", status).observe(seconds)
