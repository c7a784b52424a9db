"""OpenClaw's ACP bridge (`openclaw acp`, pinned, unchanged) against a real server.

The bridge speaks the Agent Client Protocol (JSON-RPC 2.0 over stdio) to an editor and the
gateway protocol to us. This module is the editor: initialize, session/new, session/prompt
(a streamed reply), session/cancel, failures, the slash commands an editor sends as prompts
(/status, /think, /model, as the bridge forwards them: after its "[Working directory: …]"
line), the thought-level setting and a second session. The server must agree after each step.
The tests share one bridge process, as one editor session would, and each stands on its own
(test workers may split the module).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.openclaw.conftest import OpenClawServer
from tests.support.openclaw import AcpBridge, AcpError, Gateway, OpenClaw, error_lines, wait_for

pytestmark = [pytest.mark.server, pytest.mark.timeout(300)]


@dataclass
class AcpSession:
    id: str
    key: str  # the gateway's session key the bridge uses for it


@pytest.fixture(scope="module")
def user(oc_server: OpenClawServer) -> Gateway:
    return oc_server.user("ocacp")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("acp")


@pytest.fixture(scope="module")
def bridge(openclaw: OpenClaw, oc_server: OpenClawServer, user: Gateway, workdir: Path) -> Iterator[AcpBridge]:
    token_file = workdir / "gateway.token"
    token_file.write_text(user.token)
    acp = AcpBridge(openclaw, oc_server.ws_url, workdir, "--token-file", str(token_file))
    try:
        yield acp
    finally:
        acp.close()


def new_session(bridge: AcpBridge, cwd: Path) -> tuple[AcpSession, dict[str, Any]]:
    result = bridge.request("session/new", {"cwd": str(cwd), "mcpServers": []})
    session_id = result["sessionId"]
    # the bridge's default: an isolated gateway session `acp-bridge:<ACP session id>` of agent main
    return AcpSession(session_id, f"agent:main:acp-bridge:{session_id}"), result


@pytest.fixture(scope="module")
def session(bridge: AcpBridge, workdir: Path) -> AcpSession:
    init = bridge.request(
        "initialize",
        {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False},
            "clientInfo": {"name": "agentgate-tests", "version": "1"},
        },
        timeout=60,
    )
    assert init["agentInfo"]["name"] == "openclaw-acp", init
    created, _ = new_session(bridge, workdir)
    return created


@pytest.fixture(autouse=True)
def _leave_nothing_running(user: Gateway) -> Iterator[None]:
    """A failed step must not poison the next one: end whatever it left open (after its checks)."""
    yield
    for row in user.busy():
        user.call("chat.abort", {"sessionKey": row["key"]})


def prompt(bridge: AcpBridge, session: AcpSession, text: str, timeout: float = 20) -> tuple[str, str]:
    """Send a prompt; return its stop reason and the reply text streamed for it."""
    mark = bridge.mark()
    result = bridge.request(
        "session/prompt", {"sessionId": session.id, "prompt": [{"type": "text", "text": text}]}, timeout
    )
    return result["stopReason"], bridge.text(session.id, mark)


def test_prompt_streams_the_reply(bridge: AcpBridge, session: AcpSession, user: Gateway) -> None:
    words = "acp-stream alpha beta gamma delta epsilon zeta eta theta iota kappa"
    mark = bridge.mark()
    stop, text = prompt(bridge, session, f"{words} [[tick:100]]")
    assert stop == "end_turn", bridge.dump()
    assert text.startswith("echo:") and text.endswith(words), text
    assert text.count(words) == 1, f"the reply came twice: {text!r}"
    chunks = [u for u in bridge.updates(session.id, mark) if u.get("sessionUpdate") == "agent_message_chunk"]
    assert len(chunks) >= 3, f"the reply was not streamed: {chunks}"
    user.wait_row(session.key, lambda r: r["status"] == "done", "the run done")
    user.assert_idle()


def test_cancel_ends_the_run(bridge: AcpBridge, session: AcpSession, user: Gateway) -> None:
    mark = bridge.mark()
    request = bridge.start(
        "session/prompt",
        {"sessionId": session.id, "prompt": [{"type": "text", "text": "acp-cancel [[tick:200]] [[words:300]]"}]},
    )
    wait_for(
        lambda: request in bridge.responses or "word3" in bridge.text(session.id, mark),
        timeout=15,
        what="the reply streaming",
        dump=bridge.dump,
    )
    assert request not in bridge.responses, f"the prompt ended before the cancel: {bridge.responses[request]}"
    bridge.notify("session/cancel", {"sessionId": session.id})
    assert bridge.result(request)["stopReason"] == "cancelled", bridge.dump()
    assert "word300" not in bridge.text(session.id, mark)
    row = user.wait_row(session.key, lambda r: r["status"] == "killed" and not r["hasActiveRun"], "the run killed")
    assert row["abortedLastRun"] is True
    user.assert_idle()


def test_failures_end_the_prompt(bridge: AcpBridge, session: AcpSession, user: Gateway) -> None:
    # a run that fails mid-stream ends the prompt (OpenClaw's bridge maps a chat error to end_turn)
    stop, _ = prompt(bridge, session, "acp-fail [[fail:stream]] [[tick:50]]")
    assert stop == "end_turn", bridge.dump()
    user.wait_row(session.key, lambda r: r["status"] == "failed" and not r["hasActiveRun"], "the run failed")
    # one refused before it started is a JSON-RPC error the editor shows
    with pytest.raises(AcpError) as refused:
        prompt(bridge, session, "acp-refused [[fail:setup]]")
    assert "refused the run during setup" in str(refused.value.error.get("data")), refused.value
    user.assert_idle()


def test_status_is_the_gateways_answer(bridge: AcpBridge, session: AcpSession, user: Gateway) -> None:
    stop, text = prompt(bridge, session, "/status")
    assert stop == "end_turn", bridge.dump()
    assert "echo:" not in text, f"/status went to the agent instead of the gateway: {text!r}"
    assert session.key in text and "scripted" in text, f"/status does not show the editor the session: {text!r}"
    user.assert_idle()


def test_thought_level_and_think_persist(bridge: AcpBridge, session: AcpSession, user: Gateway) -> None:
    bridge.request("session/set_config_option", {"sessionId": session.id, "configId": "thought_level", "value": "low"})
    user.wait_row(session.key, lambda r: r.get("thinkingLevel") == "low", "thinkingLevel low stored")
    stop, text = prompt(bridge, session, "/think high")
    assert stop == "end_turn", bridge.dump()
    assert "echo:" not in text, f"/think high went to the agent instead of the gateway: {text!r}"
    assert "high" in text, f"/think high is not confirmed to the editor: {text!r}"
    user.wait_row(session.key, lambda r: r.get("thinkingLevel") == "high", "thinkingLevel high stored")


def test_model_lists_and_sets_the_agents_models(bridge: AcpBridge, session: AcpSession, user: Gateway) -> None:
    stop, text = prompt(bridge, session, "/model")
    assert stop == "end_turn", bridge.dump()
    assert "echo:" not in text, f"/model went to the agent instead of the gateway: {text!r}"
    assert "scripted-alt" in text, f"/model does not show the editor the agent's models: {text!r}"
    stop, text = prompt(bridge, session, "/model scripted-alt")
    assert stop == "end_turn" and "echo:" not in text, f"/model scripted-alt went to the agent: {text!r}"
    user.wait_row(session.key, lambda r: r.get("model") == "scripted-alt", "the model choice stored")


def test_new_session_is_fresh(bridge: AcpBridge, session: AcpSession, user: Gateway, workdir: Path) -> None:
    before = user.row(session.key)
    fresh, created = new_session(bridge, workdir)
    assert fresh.id != session.id and fresh.key != session.key
    levels = {o["id"]: o.get("currentValue") for o in created.get("configOptions", [])}
    assert "thought_level" in levels, created
    # an editor may set the thought level before the first prompt: the session does not exist yet
    bridge.request("session/set_config_option", {"sessionId": fresh.id, "configId": "thought_level", "value": "high"})
    user.wait_row(fresh.key, lambda r: r.get("thinkingLevel") == "high", "the new session's thinking level")
    stop, text = prompt(bridge, fresh, "acp-fresh hello")
    assert stop == "end_turn" and text.endswith("acp-fresh hello") and text.count("acp-fresh hello") == 1, text
    row = user.wait_row(fresh.key, lambda r: r["status"] == "done", "the new session's run done")
    assert row["sessionId"] != (before or {}).get("sessionId")
    after = user.row(session.key)
    assert (after or {}).get("lastRunId") == (before or {}).get("lastRunId"), "the new session's turn ran in the old"


def test_nothing_left_running_and_no_errors(bridge: AcpBridge, user: Gateway) -> None:
    assert bridge.proc.poll() is None, f"the bridge exited with {bridge.proc.poll()}\n{bridge.dump()}"
    assert not bridge.unparsed, f"the bridge wrote lines that are not JSON-RPC on stdout: {bridge.unparsed[:5]}"
    user.assert_idle()
    stderr = bridge.stderr_path.read_text(errors="replace")
    bad = error_lines(stderr)
    assert not bad, f"the bridge logged errors: {bad}"
