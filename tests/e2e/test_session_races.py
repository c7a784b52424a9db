"""Sends and deletes on the same sessions from two processes: no row ever contradicts itself.

A row read in two steps that a delete splits said `running` and named no run
(`{"status": "running", "hasActiveRun": true, "activeRunIds": [], "lastRunId": null}`).
Here two processes hammer two keys with sends and deletes while readers call
`sessions.list` and `chat.history`; every row seen — listed, in a history, or in a
`sessions.changed` — is checked. The run tasks that reach a deleted session end quietly:
no traceback in the servers' logs.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import cluster, contradictions
from tests.support.db import send_params
from tests.support.servers import WsClient, ws_client

pytestmark = [pytest.mark.server, pytest.mark.postgres, pytest.mark.redis]

SECONDS = 15.0
KEYS = ("hot0", "hot1")


async def test_sends_and_deletes_from_two_processes_never_make_a_contradictory_row(tmp_path: Path) -> None:
    rng = random.Random(10)
    ids = itertools.count()
    seen: list[tuple[str, dict[str, Any]]] = []
    done = {"deleted": 0, "sent": 0}

    def check(where: str, row: dict[str, Any] | None) -> None:
        if row is not None:
            seen.append((where, row))

    async def writer(c: WsClient, stop: float) -> None:
        while time.monotonic() < stop:
            key = rng.choice(KEYS)
            if rng.random() < 0.3:
                res = await c.call("sessions.delete", {"sessionKey": key}, timeout=10)
                done["deleted"] += bool(res["ok"])
            else:
                words = rng.randint(1, 4)
                res = await c.call(
                    "chat.send", send_params(key, f"[[words:{words}]] [[tick:5]]", f"w{next(ids)}"), timeout=10
                )
                done["sent"] += bool(res["ok"])

    async def reader(c: WsClient, stop: float) -> None:
        while time.monotonic() < stop:
            res = await c.call("sessions.list", {"limit": 50}, timeout=10)
            for row in res["payload"]["sessions"] if res["ok"] else []:
                check("sessions.list", row)
            key = rng.choice(KEYS)
            res = await c.call("chat.history", {"sessionKey": key, "limit": 5}, timeout=10)
            if res["ok"]:
                check("chat.history", res["payload"].get("session"))

    with cluster(tmp_path, 2) as c:
        token = c.token("racer")
        a_srv, b_srv = c.servers
        async with (
            ws_client(a_srv, token) as a1,
            ws_client(a_srv, token) as a2,
            ws_client(b_srv, token) as b1,
            ws_client(b_srv, token) as b2,
        ):
            stop = time.monotonic() + SECONDS
            await asyncio.gather(writer(a1, stop), writer(b1, stop), reader(a2, stop), reader(b2, stop))
            await asyncio.gather(*(x.drain(2.0) for x in (a1, a2, b1, b2)))
            for x in (a1, a2, b1, b2):
                for e in x.events:
                    if e["event"] == "sessions.changed":
                        check(f"sessions.changed/{e['payload']['reason']}", e["payload"]["session"])
        bad = [(where, row, contradictions(row)) for where, row in seen if contradictions(row)]
        assert len(seen) > 200, len(seen)
        assert not bad, f"{len(bad)} of {len(seen)} rows contradict themselves, e.g. {bad[:3]}"
        assert done["deleted"] > 20 and done["sent"] > 50, done
        logs = c.logs()
        assert "Traceback" not in logs, logs[logs.index("Traceback") - 500 :][:4000]
