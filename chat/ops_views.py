"""Operator endpoints: liveness, readiness and Prometheus metrics.

/healthz   the process answers HTTP (no dependency checked: a restart would not help them)
/readyz    the database and the channel layer are reachable, and the process is not draining;
           503 otherwise, so a load balancer stops sending it new connections
/metrics   Prometheus text format (sessions_app.metrics)
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from .runtime.gateway import runtime

READY_TIMEOUT_SECONDS = 2.0


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Process alive."""
    return JsonResponse({"ok": True})


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


async def _check_channel_layer() -> None:
    """A message to a fresh channel of this process comes back: the layer works end to end."""
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer configured")
    channel = await layer.new_channel()
    token = uuid.uuid4().hex
    await layer.send(channel, {"type": "readyz.ping", "token": token})
    message = await layer.receive(channel)
    if message.get("token") != token:
        raise RuntimeError("channel layer returned another message")


async def _timed(check: Any) -> tuple[bool, str, float]:
    started = time.perf_counter()
    try:
        await asyncio.wait_for(check(), READY_TIMEOUT_SECONDS)
    except TimeoutError:
        return False, f"timed out after {READY_TIMEOUT_SECONDS}s", time.perf_counter() - started
    except Exception as exc:  # the reason goes to the operator, not a stack trace
        return False, f"{type(exc).__name__}: {exc}"[:300], time.perf_counter() - started
    return True, "ok", time.perf_counter() - started


@never_cache
@require_GET
async def readyz(request: HttpRequest) -> JsonResponse:
    """Database and channel layer reachable (503 otherwise, or while the process drains)."""
    db_ok, db_msg, db_s = await _timed(sync_to_async(_check_database))
    layer_ok, layer_msg, layer_s = await _timed(_check_channel_layer)
    draining = not runtime.accepting
    checks = {
        "database": {"ok": db_ok, "detail": db_msg, "ms": round(db_s * 1000, 1)},
        "channelLayer": {"ok": layer_ok, "detail": layer_msg, "ms": round(layer_s * 1000, 1)},
        "accepting": {"ok": not draining, "detail": "draining for shutdown" if draining else "ok"},
    }
    ok = db_ok and layer_ok and not draining
    return JsonResponse({"ok": ok, "checks": checks}, status=200 if ok else 503)


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition of this process's registry."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
