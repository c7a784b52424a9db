"""LangChain's `ChatOpenAI` (package `langchain-openai`, pinned in the test extras) pointed at a real
gateway's `/v1` (HTTP-API.md §14): invoke and stream, sync and async, a whole conversation sent
statelessly, a named session through `default_headers`, and its errors as LangChain raises them."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.e2e.http.support import Gateway, start_gateway

langchain_openai = pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (test extras)")
messages = pytest.importorskip("langchain_core.messages")

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("langchain"))
    yield gateway
    gateway.stop()


def chat_model(gw: Gateway, **kwargs: object) -> langchain_openai.ChatOpenAI:
    """As an application would make it: the agent as the model, the gateway as the base URL."""
    return langchain_openai.ChatOpenAI(
        model="main", base_url=gw.base_url, api_key=gw.keys["alice"], max_retries=0, timeout=30, **kwargs
    )


def test_invoke_and_stream(gw: Gateway) -> None:
    llm = chat_model(gw, stream_usage=True)
    answer = llm.invoke("hello from langchain")
    assert answer.content == "echo: hello from langchain"
    assert answer.response_metadata["finish_reason"] == "stop"
    assert answer.response_metadata["model_name"] == "main"
    assert answer.usage_metadata is not None and answer.usage_metadata["total_tokens"] > 0
    chunks = list(llm.stream("[[tick:30]] streamed from langchain word by word"))
    assert len([c for c in chunks if c.content]) > 1  # streamed, not one block
    assert "".join(str(c.content) for c in chunks) == "echo: streamed from langchain word by word"
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.response_metadata["finish_reason"] == "stop"
    assert whole.usage_metadata is not None and whole.usage_metadata["output_tokens"] > 0


async def test_ainvoke_and_astream(gw: Gateway) -> None:
    llm = chat_model(gw)
    answer = await llm.ainvoke("async from langchain")
    assert answer.content == "echo: async from langchain"
    parts = [str(chunk.content) async for chunk in llm.astream("[[tick:5]] async stream")]
    assert "".join(parts) == "echo: async stream"


async def test_a_conversation_sent_whole_is_one_stateless_run(gw: Gateway) -> None:
    conversation = [
        messages.SystemMessage("You answer briefly."),
        messages.HumanMessage("first"),
        messages.AIMessage("echo: first"),
        messages.HumanMessage("second"),
    ]
    raw = chat_model(gw, include_response_headers=True).invoke(conversation)
    assert raw.content == "echo: second"
    key = raw.response_metadata["headers"]["x-agentgate-session-key"]
    assert key.startswith("agent:main:api-")
    async with gw.ws() as ws:
        history = await ws.ok("chat.history", {"sessionKey": key})
        # the run's own input and reply: the earlier messages were its context, not new turns
        assert [m["content"][0]["text"] for m in history["messages"]] == ["second", "echo: second"]
        listed = await ws.ok("sessions.list", {})
        assert key not in [row["key"] for row in listed["sessions"]]


async def test_a_named_session_through_default_headers(gw: Gateway) -> None:
    llm = chat_model(gw, default_headers={"x-agentgate-session-key": "lc-notes"})
    assert llm.invoke("one").content == "echo: one"
    assert llm.invoke(
        [messages.HumanMessage("one"), messages.AIMessage("echo: one"), messages.HumanMessage("two")]
    ).content == ("echo: two")
    async with gw.ws() as ws:
        history = await ws.ok("chat.history", {"sessionKey": "agent:main:lc-notes"})
    assert [m["content"][0]["text"] for m in history["messages"]] == ["one", "echo: one", "two", "echo: two"]


def test_errors_reach_the_application_as_the_sdk_raises_them(gw: Gateway) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        langchain_openai.ChatOpenAI(
            model="no-such-agent", base_url=gw.base_url, api_key=gw.keys["alice"], max_retries=0
        ).invoke("x")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        langchain_openai.ChatOpenAI(model="main", base_url=gw.base_url, api_key="agt_wrong", max_retries=0).invoke("x")
