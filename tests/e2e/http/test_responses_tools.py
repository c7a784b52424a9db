"""The agent's MCP tools in the Responses API (HTTP-API.md §14.5): `mcp_call` items with OpenAI's
status and the exact state, approvals as `mcp_approval_request` items answered with an
`mcp_approval_response` (the same response continues), and an approval answered over HTTP while
the page's WebSocket answers it too (the first decision wins, and both sides say which)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.http.support import Gateway, start_gateway
from tests.support.tools import TOOL_CONNECT

pytestmark = pytest.mark.server

CALC = 'calc [[tool:demo.calculate {"expression": "6*7"}]]'
KEYS = {"alice": ("alice", None), "bob": ("bob", None), "alice_no_approvals": ("alice", ["read", "write"])}


def note(text: str) -> str:
    return f'remember [[tool:demo.add_note {{"text": "{text}"}}]]'


@pytest.fixture(scope="module")
def notes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("notes")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, notes: Path) -> Iterator[Gateway]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("responses-tools"),
        keys=KEYS,
        AGENTGATE_NOTES_DIR=str(notes),
        GATEWAY_AGENTS=json.dumps({"research": {"backend": "scripted", "model": "scripted"}}),
    )
    yield gateway
    gateway.stop()


def noted(notes: Path) -> list[str]:
    found = notes / "notes.jsonl"
    return [json.loads(line)["text"] for line in found.read_text().splitlines()] if found.exists() else []


def types(output: list[Any]) -> list[str]:
    return [item.type for item in output]


def waiting_for_approval(client: openai.OpenAI, response_id: str, timeout: float = 10) -> Any:
    """The response once it holds an approval request (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = client.responses.retrieve(response_id)
        if "mcp_approval_request" in types(found.output):
            return found
        time.sleep(0.05)
    raise AssertionError(f"{response_id} never asked for an approval")


def approval(approval_id: str, approve: bool) -> list[dict[str, Any]]:
    return [{"type": "mcp_approval_response", "approval_request_id": approval_id, "approve": approve}]


def test_mcp_calls_are_items_with_their_exact_state(gw: Gateway) -> None:
    got = gw.sdk().responses.create(model="main", input=CALC)
    assert types(got.output) == ["mcp_call", "message"]
    call = got.output[0]
    assert (call.server_label, call.name, json.loads(call.arguments)) == ("demo", "calculate", {"expression": "6*7"})
    assert (call.status, call.model_extra["state"], call.error) == ("completed", "succeeded", None)
    assert call.output == "6*7 = 42"
    assert got.output_text == "echo: calc 6*7 = 42"
    events = [e.type for e in gw.sdk().responses.retrieve(got.id, stream=True)]
    assert events.index("response.mcp_call.in_progress") < events.index("response.mcp_call.completed")
    assert events.index("response.mcp_call.completed") < events.index("response.output_text.delta")


def test_an_approval_answered_over_http_continues_the_same_response(gw: Gateway, notes: Path) -> None:
    client = gw.sdk()
    asked = client.responses.create(model="main", input=note("from http"))
    # a request that does not stream is answered while the approval waits, holding its request
    assert asked.status == "in_progress" and types(asked.output) == ["mcp_approval_request"]
    request = asked.output[0]
    assert (request.server_label, request.name) == ("demo", "add_note")
    assert request.id.startswith("ap_")
    answered = client.responses.create(model="main", previous_response_id=asked.id, input=approval(request.id, True))
    assert answered.id == asked.id and answered.status == "completed"
    assert types(answered.output) == ["mcp_approval_request", "mcp_call", "message"]
    call = answered.output[1]
    assert (call.status, call.model_extra["state"], call.approval_request_id) == ("completed", "succeeded", request.id)
    assert "from http" in noted(notes)
    # answered again: the first decision stands, and the response is answered as it is
    late = client.responses.create(model="main", previous_response_id=asked.id, input=approval(request.id, False))
    assert late.model_dump() == answered.model_dump()


def test_a_denied_call_is_a_failed_mcp_call_that_says_denied(gw: Gateway, notes: Path) -> None:
    client = gw.sdk()
    asked = client.responses.create(model="main", input=note("never written"))
    denied = client.responses.create(
        model="main", previous_response_id=asked.id, input=approval(asked.output[0].id, False)
    )
    call = denied.output[1]
    assert (call.status, call.model_extra["state"]) == ("failed", "denied")
    assert call.error is not None and "denied" in json.dumps(call.error.model_dump())
    assert "never written" not in noted(notes)


def test_a_streamed_approval_shows_the_request_and_both_streams_tell_the_same_events(gw: Gateway) -> None:
    client = gw.sdk()
    stream = client.responses.create(model="main", input=note("streamed"), stream=True)
    seen = []
    for event in stream:
        seen.append(event.model_dump(mode="json", exclude_unset=True))
        if event.type == "response.output_item.done" and event.item.type == "mcp_approval_request":
            break
    request_id = seen[-1]["item"]["id"]
    continued = client.responses.create(
        model="main", previous_response_id=seen[0]["response"]["id"], input=approval(request_id, True), stream=True
    )
    replayed = [e.model_dump(mode="json", exclude_unset=True) for e in continued]
    seen += [e.model_dump(mode="json", exclude_unset=True) for e in stream]
    assert replayed == seen
    assert seen[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in seen] == list(range(len(seen)))


def test_approvals_need_the_approvals_scope_and_the_responses_own_request(gw: Gateway) -> None:
    asked = gw.sdk().responses.create(model="main", input=note("scoped"), background=True)
    request = waiting_for_approval(gw.sdk(), asked.id).output[0]
    with pytest.raises(openai.PermissionDeniedError):
        gw.sdk("alice_no_approvals").responses.create(
            model="main", previous_response_id=asked.id, input=approval(request.id, True)
        )
    other = gw.sdk().responses.create(model="main", input="other")
    with pytest.raises(openai.BadRequestError) as bad:
        gw.sdk().responses.create(model="main", previous_response_id=other.id, input=approval(request.id, True))
    assert bad.value.body["param"] == "input[0].approval_request_id"
    with pytest.raises(openai.NotFoundError):
        gw.sdk("bob").responses.create(model="main", previous_response_id=asked.id, input=approval(request.id, True))
    with pytest.raises(openai.BadRequestError) as other_agent:  # answered as the response's own agent only
        gw.sdk().responses.create(model="research", previous_response_id=asked.id, input=approval(request.id, True))
    assert other_agent.value.body["param"] == "model"
    assert waiting_for_approval(gw.sdk(), asked.id).status == "in_progress"  # still waiting: nothing decided
    assert gw.sdk().responses.cancel(asked.id).status == "cancelled"


async def test_an_approval_answered_over_http_and_on_the_page_at_once_has_one_decision(gw: Gateway) -> None:
    client = gw.async_sdk()

    async def page_answers(approval_id: str, after: float) -> dict[str, Any]:
        await asyncio.sleep(after)  # the page a little later each time: either side may come first
        return await page.ok("plugin.approval.resolve", {"id": approval_id, "decision": "deny"})

    async with gw.ws("alice", params=TOOL_CONNECT) as page:
        for attempt in range(6):
            asked = await client.responses.create(model="main", input=note(f"race {attempt}"), background=True)
            requested = await page.wait_event(lambda e: e["event"] == "plugin.approval.requested", timeout=10)
            approval_id = requested["payload"]["id"]
            page.events.remove(requested)
            http_answer, page_answer = await asyncio.gather(
                client.responses.create(model="main", previous_response_id=asked.id, input=approval(approval_id, True)),
                page_answers(approval_id, attempt * 0.0015),
            )
            decided = page_answer["decision"]
            assert decided in ("allow-once", "deny")
            assert http_answer.id == asked.id
            final = http_answer
            while final.status not in ("completed", "failed", "cancelled"):
                await asyncio.sleep(0.05)
                final = await client.responses.retrieve(asked.id)
            call = next(item for item in final.output if item.type == "mcp_call")
            assert call.model_extra["state"] == ("succeeded" if decided == "allow-once" else "denied"), attempt
