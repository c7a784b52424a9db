"""A background response outlives its process (HTTP-API.md §14.5): kill -9 the server under it, start
another, and the response ends `failed` with `error.code: "interrupted"` once recovery has run; a
stream resumed on the new process before that ends so, with the same events as a replay after."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.http.support import Gateway, start_gateway
from tests.support.servers import start_server

pytestmark = pytest.mark.server

RECOVERY_SECONDS = 3.0


def dumped(events: Any) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json", exclude_unset=True) for e in events]


def test_kill_9_under_a_background_response_then_restart_ends_it_failed_interrupted(tmp_path: Path) -> None:
    first = start_gateway(tmp_path, GATEWAY_RECOVERY_SECONDS=str(RECOVERY_SECONDS))
    client = first.sdk()
    got = client.responses.create(model="main", input="hold on [[hang]]", background=True)
    deadline = time.monotonic() + 10
    while client.responses.retrieve(got.id).status != "in_progress" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.responses.retrieve(got.id).status == "in_progress"
    first.server.kill()
    killed_at = time.monotonic()

    second = Gateway(start_server(env=first.env, log_dir=tmp_path), first.env, first.keys)
    try:
        second.server.wait_ready()
        resumed = dumped(second.sdk().responses.retrieve(got.id, stream=True))  # live until recovery ends it
        assert time.monotonic() - killed_at < RECOVERY_SECONDS + 10
        assert [e["sequence_number"] for e in resumed] == list(range(len(resumed)))
        assert resumed[-1]["type"] == "response.failed"
        assert resumed[-1]["response"]["error"]["code"] == "interrupted"
        ended = second.sdk().responses.retrieve(got.id)
        assert ended.status == "failed" and ended.error is not None and ended.error.code == "interrupted"
        assert ended.output_text == ""  # never `completed`, and no text it did not store
        assert dumped(second.sdk().responses.retrieve(got.id, stream=True)) == resumed
    finally:
        second.stop()
