"""Operator endpoints: liveness, readiness and Prometheus metrics.

/healthz   the process answers HTTP (no dependency checked: a restart would not help them)
/readyz    the database answers, a group message reaches this process's connections (through
           the hub's channel and receive loop, the path every event takes), this process's background loops
           (heartbeat + sweep, reconcile, repair, cross-process listener) are healthy, and the
           process is not draining; 503 otherwise, so a load balancer stops sending it new
           connections. Every check has its own deadline, so the answer comes within ~2.5 s
           even when a dependency hangs; one this process knows to be away
           (`chat.base.availability`) fails at once.
/metrics   Prometheus text format (chat.base.metrics, state_gauges, run_metrics; chat.methods.timing)

/readyz and /metrics answer only an allowed caller (`operator_allowed`): the bearer token
GATEWAY_METRICS_TOKEN, or a client address in GATEWAY_METRICS_ALLOW (loopback by default);
anyone else gets 404, so their existence is not advertised. /healthz stays open.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import time
import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from chat.base import availability, health
from chat.base.metrics import channel_layer_failed
from chat.runtime.gateway import runtime

READY_TIMEOUT_SECONDS = 2.0


def operator_allowed(request: HttpRequest) -> bool:
    """The bearer token, when one is configured, or an address on the allowlist."""
    token = settings.GATEWAY_METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    if token and given.startswith("Bearer ") and constant_time_compare(given[7:].strip(), token):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR") or "")
    except ValueError:
        return False
    for allowed in settings.GATEWAY_METRICS_ALLOW:
        try:
            if address in ipaddress.ip_network(allowed, strict=False):
                return True
        except ValueError:
            continue
    return False


def operators_only(view: Callable[..., Any]) -> Callable[..., Any]:
    """404 for callers `operator_allowed` refuses (sync or async view)."""
    if asyncio.iscoroutinefunction(view):

        @wraps(view)
        async def async_wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if not operator_allowed(request):
                raise Http404
            return await view(request, *args, **kwargs)

        return async_wrapped

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if not operator_allowed(request):
            raise Http404
        return view(request, *args, **kwargs)

    return wrapped


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Process alive."""
    return JsonResponse({"ok": True})


# Its own threads: a check stuck on a dead database must not hold the ORM's workers, and
# a probe that times out is abandoned (its thread finishes on its own) instead of awaited.
_probe_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="agentgate-readyz")


def _select_one() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _check_database_sync(candidate: bool) -> None:
    try:
        availability.guarded(_select_one, (), {}, candidate)
    finally:
        connection.close()  # back to the pool


async def _check_database() -> None:
    # While the database is known to be away this fails at once, or (on its thread) is the
    # outage's trial; a check cancelled by its deadline before it ran holds nothing.
    candidate = availability.database.admit()
    await asyncio.wrap_future(_probe_pool.submit(_check_database_sync, candidate))


async def _check_channel_layer() -> None:
    """A group message reaches this process's connections: through the hub's channel and
    receive loop when the runtime serves (what every event of a connection takes), else
    through a fresh channel (no connection yet: the first one starts the runtime)."""
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer configured")
    if runtime.running:
        loop = runtime.loop
        assert loop is not None
        if loop is asyncio.get_running_loop():
            await runtime.hub.probe()
        else:  # a view served on another loop (a test client): ask the serving loop
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(runtime.hub.probe(), loop))
        return
    channel = await layer.new_channel()
    token = uuid.uuid4().hex
    group = f"readyz.{token[:12]}"
    await layer.group_add(group, channel)
    try:
        await layer.group_send(group, {"type": "readyz.ping", "token": token})
        message = await layer.receive(channel)
    finally:
        await layer.group_discard(group, channel)
    if message.get("token") != token:
        raise RuntimeError("channel layer returned another message")


def _loop_limits() -> dict[str, float]:
    """How long each background loop may go without a success before the process is unready."""
    beat = float(settings.GATEWAY_HEARTBEAT_SECONDS)
    repair = float(settings.GATEWAY_REPAIR_SECONDS)
    return {
        "sweep": max(30.0, beat * 6),
        "reconcile": max(30.0, repair * 6),
        "repair": max(30.0, repair * 6),
        "listener": 0.0,
    }


async def _timed(check: Any) -> tuple[bool, str, float]:
    started = time.perf_counter()
    try:
        await asyncio.wait_for(check(), READY_TIMEOUT_SECONDS)
    except TimeoutError:
        return False, f"timed out after {READY_TIMEOUT_SECONDS}s", time.perf_counter() - started
    except Exception as exc:  # the reason goes to the operator, not a stack trace
        return False, f"{type(exc).__name__}: {exc}".splitlines()[0][:300], time.perf_counter() - started
    return True, "ok", time.perf_counter() - started


@never_cache
@require_GET
@operators_only
async def readyz(request: HttpRequest) -> JsonResponse:
    """Database, channel layer and background loops healthy (503 otherwise, or while the process drains)."""
    (db_ok, db_msg, db_s), (layer_ok, layer_msg, layer_s) = await asyncio.gather(
        _timed(_check_database), _timed(_check_channel_layer)
    )
    if not layer_ok:
        channel_layer_failed("readyz")
    draining = not runtime.accepting
    loop_problems = health.problems(_loop_limits()) if runtime.running else {}
    # A start that failed (or is under way) is unready, though the services may answer now.
    starting = runtime.start_error or ("starting" if runtime.running and not runtime.started() else "")
    checks = {
        "database": {"ok": db_ok, "detail": db_msg, "ms": round(db_s * 1000, 1)},
        "channelLayer": {"ok": layer_ok, "detail": layer_msg, "ms": round(layer_s * 1000, 1)},
        "backgroundLoops": {"ok": not loop_problems, "detail": loop_problems or "ok"},
        "accepting": {"ok": not draining, "detail": "draining for shutdown" if draining else "ok"},
        "runtime": {"ok": not starting, "detail": f"not started: {starting}" if starting else "ok"},
    }
    ok = db_ok and layer_ok and not loop_problems and not draining and not starting
    return JsonResponse({"ok": ok, "checks": checks}, status=200 if ok else 503)


@never_cache
@require_GET
@operators_only
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of this process's registry."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
