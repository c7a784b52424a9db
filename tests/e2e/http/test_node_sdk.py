"""The official `openai` npm package under Node against a real gateway's `/v1` (HTTP-API.md §14):
models, whole and streamed Chat Completions, its error classes, a named session, a stream the
application stops reading, and a Responses stream.

The package (version pinned in `node/package.json`) is installed from the npm registry into the
pytest cache once; each test runs `node/openai_sdk.cjs SCENARIO` with the machine's Node and reads
what the client saw, then checks the gateway's side over the WebSocket. Skipped, saying why, when
Node or npm is missing or the registry cannot be reached.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.http.support import Gateway, start_gateway
from tests.support.openclaw import pinned_node_modules

pytestmark = pytest.mark.server

HERE = Path(__file__).parent / "node"
SCRIPT = HERE / "openai_sdk.cjs"
VERSION = json.loads((HERE / "package.json").read_text())["dependencies"]["openai"]


@pytest.fixture(scope="session")
def node_modules(request: pytest.FixtureRequest) -> Path:
    """`openai@VERSION`'s node_modules, installed into the pytest cache when missing."""
    return pinned_node_modules(request, "openai", VERSION)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("node-sdk"))
    yield gateway
    gateway.stop()


def run_node(node_modules: Path, gw: Gateway, scenario: str) -> Any:
    env = {
        **os.environ,
        "NODE_PATH": str(node_modules),
        "AGENTGATE_BASE_URL": gw.base_url,
        "AGENTGATE_KEY": gw.keys["alice"],
        "NODE_NO_WARNINGS": "1",
    }
    proc = subprocess.run(["node", str(SCRIPT), scenario], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{proc.stderr}\n--- server log ---\n{gw.server.output()[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


async def test_models_completions_streams_and_errors(node_modules: Path, gw: Gateway) -> None:
    out = run_node(node_modules, gw, "basics")
    assert out["models"] == [{"id": "main", "object": "model", "owned_by": "agentgate"}]
    whole = out["whole"]
    assert whole["object"] == "chat.completion" and whole["model"] == "main"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "echo: hello from node"}
    assert whole["choices"][0]["finish_reason"] == "stop"
    chunks = out["chunks"]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == (
        "echo: streamed from node"
    )
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == [
        "stop"
    ]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert {c["model"] for c in chunks} == {"openclaw/main"}
    assert out["notFound"] == {
        "name": "NotFoundError",
        "status": 404,
        "code": "model_not_found",
        "param": "model",
        "type": "not_found_error",
    }
    assert out["badBody"]["name"] == "BadRequestError" and out["badBody"]["param"] == "n"
    assert out["unauthorized"]["name"] == "AuthenticationError" and out["unauthorized"]["status"] == 401
    # the request was a run of the gateway like any other, in its own `api` session
    key, run_id = out["headers"]["sessionKey"], out["headers"]["runId"]
    assert key.startswith("agent:main:api-")
    async with gw.ws() as ws:
        waited = await ws.ok("agent.wait", {"runId": run_id, "sessionKey": key, "timeoutMs": 0})
        assert waited["status"] == "ok"
        history = await ws.ok("chat.history", {"sessionKey": key})
        assert [m["content"][0]["text"] for m in history["messages"]] == ["hello from node", "echo: hello from node"]


async def test_a_named_session_takes_only_the_new_input(node_modules: Path, gw: Gateway) -> None:
    out = run_node(node_modules, gw, "named")
    assert out == {"first": "echo: first note", "second": "echo: second note"}
    async with gw.ws() as ws:
        history = await ws.ok("chat.history", {"sessionKey": "agent:main:node-notes"})
        assert [m["content"][0]["text"] for m in history["messages"]] == [
            "first note",
            "echo: first note",
            "second note",
            "echo: second note",
        ]


async def test_a_stream_the_application_stops_reading_aborts_its_run(node_modules: Path, gw: Gateway) -> None:
    out = run_node(node_modules, gw, "leave")
    assert out["text"].startswith("echo: word1 word2 word3")
    async with gw.ws() as ws:
        waited = await ws.ok("agent.wait", {"runId": out["runId"], "sessionKey": out["sessionKey"], "timeoutMs": 5000})
        history = await ws.ok("chat.history", {"sessionKey": out["sessionKey"]})
    assert waited["aborted"] is True and waited["stopReason"] == "disconnect"
    assert waited["endedAt"] - out["left"] < 1000  # the same clock: the run ended within a second of the break
    reply = history["messages"][-1]["content"][0]["text"]
    assert reply.startswith(out["text"]) and len(reply.split()) < 100  # it stopped: not 400 words


@pytest.mark.skipif(
    importlib.util.find_spec("chat.httpapi.responses") is None, reason="this gateway has no /v1/responses yet"
)
async def test_a_responses_stream_and_a_chained_response(node_modules: Path, gw: Gateway) -> None:
    out = run_node(node_modules, gw, "responses")
    events = out["events"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert sum(t in ("response.completed", "response.incomplete", "response.failed") for t in types) == 1
    text = "".join(e["delta"] or "" for e in events if e["type"] == "response.output_text.delta")
    assert text == "echo: responses from node"
    assert out["final"]["status"] == "completed"
    assert out["whole"]["status"] == "completed" and out["whole"]["output_text"] == "echo: whole from node"
    assert out["retrieved"] == out["whole"]
    chained = {"status": "completed", "output_text": "echo: and then", "previous_response_id": out["whole"]["id"]}
    assert out["next"] == chained
