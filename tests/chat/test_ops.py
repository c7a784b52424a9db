"""/healthz, /readyz and /metrics."""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import AsyncClient, Client
from prometheus_client.parser import text_string_to_metric_families

from chat.runtime.gateway import runtime
from chat.web import ops
from tests.support import opsdata
from tests.support.communicator import open_client


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a Prometheus text exposition."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_healthz() -> None:
    res = Client().get("/healthz")
    assert res.status_code == HTTPStatus.OK and res.json() == {"ok": True}
    assert "no-cache" in res["Cache-Control"]


@pytest.mark.django_db
def test_readyz_ok() -> None:
    res = Client().get("/readyz")
    assert res.status_code == HTTPStatus.OK, res.content
    body = res.json()
    assert body["ok"] is True
    assert body["checks"]["database"]["ok"] and body["checks"]["channelLayer"]["ok"]


@pytest.mark.django_db
def test_readyz_503_when_the_database_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("database is gone")

    monkeypatch.setattr(ops, "_check_database", broken)
    res = Client().get("/readyz")
    assert res.status_code == HTTPStatus.SERVICE_UNAVAILABLE
    checks = res.json()["checks"]
    assert checks["database"]["ok"] is False and "database is gone" in checks["database"]["detail"]
    assert checks["channelLayer"]["ok"] is True


@pytest.mark.django_db
def test_readyz_503_without_a_channel_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "get_channel_layer", lambda: None)
    res = Client().get("/readyz")
    assert res.status_code == HTTPStatus.SERVICE_UNAVAILABLE
    assert res.json()["checks"]["channelLayer"]["ok"] is False


@pytest.mark.django_db
def test_readyz_503_while_draining(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "accepting", False)
    res = Client().get("/readyz")
    assert res.status_code == HTTPStatus.SERVICE_UNAVAILABLE
    assert res.json()["checks"]["accepting"]["ok"] is False


@pytest.mark.django_db
def test_readyz_503_while_the_runtime_could_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The services may answer again, but the process serves nothing until its start is retried."""
    monkeypatch.setattr(runtime, "start_error", "ChannelLayerUnavailable: channel_layer unavailable")
    res = Client().get("/readyz")
    assert res.status_code == HTTPStatus.SERVICE_UNAVAILABLE
    check = res.json()["checks"]["runtime"]
    assert check["ok"] is False and "not started" in check["detail"]


@pytest.mark.django_db
def test_metrics_state_gauges() -> None:
    owner = opsdata.user()
    opsdata.own(opsdata.send(owner, "stuck", "s1"), "dead-process")
    opsdata.send(owner, "stuck", "s2")  # queued behind it
    res = Client().get("/metrics")
    assert res.status_code == HTTPStatus.OK
    assert res["Content-Type"].startswith("text/plain")
    found = samples(res.content.decode())
    assert found[("agentgate_active_runs", ())] == 1
    assert found[("agentgate_queued_runs", ())] == 1
    assert found[("agentgate_stuck_sessions", ())] == 1
    assert found[("agentgate_live_processes", ())] == 0
    assert found[("agentgate_scrape_database_error", ())] == 0
    assert found[("agentgate_oldest_active_run_age_seconds", ())] >= 0
    assert ("agentgate_connected_sockets", ()) in found


@pytest.mark.django_db(transaction=True)
async def test_metrics_count_acks_latency_runs_and_sockets(alice: tuple[Any, str]) -> None:
    def scrape() -> dict[Any, float]:
        return samples(Client().get("/metrics").content.decode())

    before = await database_sync_to_async(scrape)()
    client = await open_client(alice[1])
    try:
        ack = await client.ok("chat.send", {"sessionKey": "main", "message": "one two", "idempotencyKey": "m1"})
        assert ack["status"] == "started"
        assert (await client.wait_terminal("m1"))["state"] == "final"
        again = await client.ok("chat.send", {"sessionKey": "main", "message": "one two", "idempotencyKey": "m1"})
        assert again["status"] == "ok"
        bad = await client.call("chat.send", {"sessionKey": "main", "message": "x", "idempotencyKey": "m1"})
        assert bad["error"]["code"] == "CONFLICT"
        ended = (
            "agentgate_runs_ended_total",
            (("agent", "main"), ("error_kind", ""), ("state", "done"), ("surface", "ws")),
        )
        for _ in range(40):  # the run-end metric is counted on commit, beside the broadcast
            after = await database_sync_to_async(scrape)()
            if after.get(ended, 0.0) > before.get(ended, 0.0):
                break
            await asyncio.sleep(0.05)
    finally:
        await client.close()

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("agentgate_chat_send_acks_total", method="chat.send", status="started") == 1
    assert delta("agentgate_chat_send_acks_total", method="chat.send", status="ok") == 1
    assert delta("agentgate_chat_send_acks_total", method="chat.send", status="conflict") == 1
    assert delta("agentgate_chat_send_seconds_count", method="chat.send") == 3
    assert delta("agentgate_runs_ended_total", agent="main", state="done", error_kind="", surface="ws") == 1
    assert delta("agentgate_runs_started_total", agent="main", surface="ws") == 1
    assert delta("agentgate_run_duration_seconds_count", agent="main", state="done") == 1
    assert delta("agentgate_time_to_first_token_seconds_count", agent="main") == 1
    assert delta("agentgate_method_calls_total", method="chat.send", outcome="ok") == 2
    assert delta("agentgate_connected_sockets") == 1  # other tests of this process may hold sockets


async def test_healthz_under_the_async_client() -> None:
    res = await AsyncClient().get("/healthz")
    assert res.status_code == HTTPStatus.OK


@pytest.mark.django_db(transaction=True)
async def test_readyz_goes_through_the_hubs_receive_loop(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Serving, readiness is the hub's round trip: a hub that stops handing messages on is unready."""
    assert runtime.running and runtime.hub.task is not None
    res = await AsyncClient().get("/readyz")
    assert res.status_code == HTTPStatus.OK, res.content

    delivered = runtime.hub.deliver

    async def drop_probes(message: dict[str, Any]) -> None:
        if message.get("type") != "hub.probe":
            await delivered(message)

    monkeypatch.setattr(runtime.hub, "deliver", drop_probes)
    monkeypatch.setattr(ops, "READY_TIMEOUT_SECONDS", 0.3)
    res = await AsyncClient().get("/readyz")
    assert res.status_code == HTTPStatus.SERVICE_UNAVAILABLE
    assert res.json()["checks"]["channelLayer"] == {"ok": False, "detail": "timed out after 0.3s", "ms": ANY_MS}
    assert not runtime.hub._probes, "an abandoned probe is forgotten"


@pytest.mark.django_db(transaction=True)
async def test_readyz_503_while_the_hubs_channel_is_closed(client: Any) -> None:
    task = runtime.hub.task
    assert task is not None
    task.cancel()
    await asyncio.wait([task])
    res = await AsyncClient().get("/readyz")
    assert res.status_code == HTTPStatus.SERVICE_UNAVAILABLE
    detail = res.json()["checks"]["channelLayer"]["detail"]
    assert "HubNotListening" in detail and "not open" in detail, detail


class _AnyMs:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, float) and other >= 0


ANY_MS = _AnyMs()
