"""Issue 11, Low: operator endpoints need a token or an allowed address; CSP; health per user."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client as HttpClient

from tests.support.communicator import open_client
from tests.support.db import send_params

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/metrics", "/readyz"])
def test_operator_endpoints_refuse_strangers(path: str, settings: Any) -> None:
    settings.GATEWAY_METRICS_TOKEN = "s3cret-token"
    stranger = HttpClient(REMOTE_ADDR="203.0.113.9")
    assert stranger.get(path).status_code == 404
    assert stranger.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 404
    assert stranger.get(path, headers={"Authorization": "Bearer s3cret-token"}).status_code in (200, 503)
    assert HttpClient(REMOTE_ADDR="127.0.0.1").get(path).status_code in (200, 503)  # loopback by default
    settings.GATEWAY_METRICS_ALLOW = ["203.0.113.0/24"]
    assert stranger.get(path).status_code in (200, 503)
    settings.GATEWAY_METRICS_ALLOW = []
    assert HttpClient(REMOTE_ADDR="127.0.0.1").get(path).status_code == 404
    assert HttpClient(REMOTE_ADDR="203.0.113.9").get("/healthz").status_code == 200  # liveness stays open


def test_pages_carry_a_strict_csp() -> None:
    user = get_user_model().objects.create_user("csp", password="pw-12345678")
    http = HttpClient()
    login_page = http.get("/login/")
    http.force_login(user)
    page = http.get("/", HTTP_HOST="127.0.0.1:8000")
    for response in (login_page, page):
        policy = response.headers["Content-Security-Policy"]
        directives = {d.split()[0]: d.split()[1:] for d in policy.split("; ")}
        assert directives["script-src"] == ["'self'"]
        assert directives["style-src"] == ["'self'"]
        assert directives["object-src"] == ["'none'"]
        assert directives["base-uri"] == ["'none'"]
        assert directives["frame-ancestors"] == ["'none'"]
        assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
    connect = dict(d.split(" ", 1) for d in page.headers["Content-Security-Policy"].split("; "))["connect-src"]
    assert connect.split() == ["'self'", "ws://127.0.0.1:8000", "wss://127.0.0.1:8000"]


@pytest.mark.django_db(transaction=True)
async def test_health_counts_only_own_runs_for_non_admins(make_user: Any) -> None:
    _a, alice = await database_sync_to_async(make_user)("hal")
    _b, bob = await database_sync_to_async(make_user)("hob")
    _r, root = await database_sync_to_async(make_user)("hroot", staff=True)
    a, b, r = await open_client(alice), await open_client(bob), await open_client(root)
    await a.ok("chat.send", send_params("main", "wait [[hang]]", "h1"))
    assert (await a.ok("health", {}))["activeRuns"] == 1
    assert (await b.ok("health", {}))["activeRuns"] == 0
    assert (await r.ok("health", {}))["activeRuns"] == 1
    await a.ok("chat.abort", {"sessionKey": "main"})
    for c in (a, b, r):
        await c.close()
