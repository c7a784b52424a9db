"""OpenClaw's Node client (npm `openclaw-node`, pinned) against a real `manage.py serve` process.

The package is installed from the npm registry into the pytest cache once; each test
runs a small script (`node/scenario.cjs`) with the machine's Node and reads what the
client saw. Skipped, saying why, when Node or npm is missing or the registry cannot be
reached.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.openclaw import pinned_node_modules
from tests.support.servers import ServerHandle, create_token, prepare_database, start_server

pytestmark = pytest.mark.server

PACKAGE = "openclaw-node"
VERSION = "0.14.0"
SCRIPT = Path(__file__).parent / "node" / "scenario.cjs"


@pytest.fixture(scope="session")
def node_modules(request: pytest.FixtureRequest) -> Path:
    """The pinned package's `node_modules`, installed into the pytest cache when missing."""
    return pinned_node_modules(request, PACKAGE, VERSION)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerHandle, str, Path]]:
    tmp = tmp_path_factory.mktemp("openclaw-node")
    env = prepare_database(tmp)
    token = create_token(env, "nodebot")
    server = start_server(env=env, log_dir=tmp)
    server.wait_ready()
    yield server, token, tmp
    server.stop()


def run_node(node_modules: Path, gateway: tuple[ServerHandle, str, Path], scenario: str, key: str) -> Any:
    server, token, tmp = gateway
    env = {
        **os.environ,
        "NODE_PATH": str(node_modules),
        # OpenClaw clients connect to the root path
        "OPENCLAW_URL": f"ws://127.0.0.1:{server.port}/",
        "OPENCLAW_TOKEN": token,
        "OPENCLAW_DEVICE_FILE": str(tmp / "device-identity.json"),
        "NODE_NO_WARNINGS": "1",
    }
    proc = subprocess.run(["node", str(SCRIPT), scenario, key], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{proc.stderr}\n--- server log ---\n{server.output()[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def texts(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["text"] for c in chunks if c["type"] == "text")


def row(listing: dict[str, Any], key: str) -> dict[str, Any]:
    found: dict[str, Any] = next(s for s in listing["sessions"] if s["key"] == f"agent:main:{key}")
    return found


def test_stream(node_modules, gateway):
    out = run_node(node_modules, gateway, "stream", "ocnode")
    kinds = [c["type"] for c in out["chunks"]]
    assert kinds[0] == "agent_start" and kinds[-2:] == ["agent_end", "done"] and "error" not in kinds
    assert texts(out["chunks"]) == "echo: hello from openclaw-node"
    assert kinds.count("text") > 1  # streamed, not one block
    assert "agent" in out["hello"]["methods"] and "agent" in out["hello"]["events"]


def test_chat_sync(node_modules, gateway):
    assert run_node(node_modules, gateway, "sync", "ocnode-sync")["text"] == "echo: sync hello"


def test_dispatch_and_setup_failures_are_one_error_chunk(node_modules, gateway):
    out = run_node(node_modules, gateway, "failure", "ocnode-fail")
    for chunks in (out["dispatch"], out["setup"]):
        errors = [c for c in chunks if c["type"] == "error"]
        assert len(errors) == 1 and errors[0]["text"], chunks
        assert chunks[-1]["type"] == "done" and texts(chunks) == ""
    assert "dispatch" in next(c for c in out["dispatch"] if c["type"] == "error")["text"]
    session = row(out["sessions"], "ocnode-fail")
    assert session["status"] == "failed" and session["hasActiveRun"] is False


def test_chat_abort_mid_stream(node_modules, gateway):
    out = run_node(node_modules, gateway, "abort", "ocnode-abort")
    run_id = out["chunks"][0]["runId"]
    assert out["aborted"] == {"aborted": True, "runIds": [run_id]}
    assert 0 < len(texts(out["chunks"])) < len("echo: go") + 400 * 3
    assert out["after"] == "echo: after the abort"
    session = row(out["sessions"], "ocnode-abort")
    assert session["status"] == "done" and session["hasActiveRun"] is False


def test_sessions_list_history_and_reset_by_key(node_modules, gateway):
    out = run_node(node_modules, gateway, "sessions", "ocnode-sessions")
    assert row(out["list"], "ocnode-sessions")["status"] == "done"
    history = out["history"]
    assert history["sessionKey"] == "agent:main:ocnode-sessions"
    assert [m["role"] for m in history["messages"]] == ["user", "assistant"]
    assert history["messages"][1]["content"][0]["text"] == "echo: remember me"
    assert out["reset"]["session"]["key"] == "agent:main:ocnode-sessions"
    assert out["reset"]["session"]["sessionId"] != history["sessionId"]
    assert out["afterReset"]["messages"] == []
    assert out["send"] == {"ok": False, "message": "idempotencyKey is required"}
    assert out["health"]["ok"] is True
