"""What reaches the model through the HTTP API (HTTP-API.md §14.3-14.5), against a real server whose
agent `oa` is on the `openai` backend, pointed at the fake model server; the fake answers with what it
received (`Reply(echo=True)`) unless a test pushes another reply, so the answer shows what the model
was sent. The official SDK drives every request."""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from chat.runtime.backends.attached import wrapped_document
from tests.e2e.http.support import Gateway, model_server, start_gateway
from tests.support.fake_openai import FakeOpenAI, Reply, ToolCallReply, agent_config, tool_reply

pytestmark = pytest.mark.server

SESSION_HEADER = "x-agentgate-session-key"
# notes.txt as the model reads it: wrapped as untrusted content
TIDE = wrapped_document("notes.txt", "text/plain", "the tide is at noon")
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    with model_server(Reply(echo=True)) as server:
        yield server


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, fake: FakeOpenAI) -> Iterator[Gateway]:
    agents = {"oa": agent_config(fake)}
    gateway = start_gateway(tmp_path_factory.mktemp("model-input"), GATEWAY_AGENTS=json.dumps(agents))
    yield gateway
    gateway.stop()


def sent(answer_text: str) -> list[dict[str, Any]]:
    """The messages the model was sent, from an echoed answer."""
    return list(json.loads(answer_text)["messages"])


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


# --- a stateless request continued (finding: the model got only the new input) ---------------------------


def test_a_chain_onto_a_stateless_response_sends_the_whole_conversation(gw: Gateway, fake: FakeOpenAI) -> None:
    client = gw.sdk()
    fake.push(Reply(chunks=["Noted."]))
    first = client.responses.with_raw_response.create(
        model="oa",
        input=[user("I am Zed."), assistant("Hello Zed."), user("remember my name")],
        instructions="Be brief.",
    )
    second = client.responses.create(model="oa", input="what is my name?", previous_response_id=first.parse().id)
    conversation = [user("I am Zed."), assistant("Hello Zed."), user("remember my name"), assistant("Noted.")]
    # the first request's instructions were that run's alone (§14.3)
    assert sent(second.output_text) == [*conversation, user("what is my name?")]

    # the session header set to the key the stateless request returned continues it the same way
    key = first.headers[SESSION_HEADER]
    assert key.startswith("agent:oa:api-")
    third = client.chat.completions.create(model="oa", messages=[user("and now?")], extra_headers={SESSION_HEADER: key})
    text = third.choices[0].message.content or ""
    assert sent(text) == [*conversation, user("what is my name?"), assistant(second.output_text), user("and now?")]

    # and so does `conversation` naming it
    fourth = client.responses.create(model="oa", input="last", conversation=key)
    assert sent(fourth.output_text)[:4] == conversation and sent(fourth.output_text)[-1] == user("last")


def test_a_chat_completion_continued_by_its_session_key_sends_its_first_context(gw: Gateway) -> None:
    client = gw.sdk()
    first = client.chat.completions.with_raw_response.create(
        model="oa", messages=[{"role": "system", "content": "Be kind."}, user("2+2?"), assistant("4"), user("3+3?")]
    )
    reply = first.parse().choices[0].message.content or ""
    again = client.chat.completions.create(
        model="oa", messages=[user("and 4+4?")], extra_headers={SESSION_HEADER: first.headers[SESSION_HEADER]}
    )
    assert sent(again.choices[0].message.content or "") == [
        user("2+2?"),
        assistant("4"),
        user("3+3?"),
        assistant(reply),
        user("and 4+4?"),
    ]


def test_a_client_call_of_a_stateless_response_is_answered_on_its_chain_as_a_call(
    gw: Gateway, fake: FakeOpenAI
) -> None:
    client = gw.sdk()
    fake.push(tool_reply(ToolCallReply("get_weather", '{"city": "Oslo"}', id="call_w")))
    first = client.responses.create(model="oa", input=[user("I am Zed."), user("weather in Oslo?")], tools=[WEATHER])
    (call,) = [item for item in first.output if item.type == "function_call"]
    second = client.responses.create(
        model="oa",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "-3 °C"}],
        tools=[WEATHER],
    )
    handed = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    assert sent(second.output_text) == [
        user("I am Zed."),
        user("weather in Oslo?"),
        {"role": "assistant", "content": None, "tool_calls": [handed]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "-3 °C"},
    ]


# --- images and files: what the agent's backend cannot take is a 400 naming the part ----------------------

PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c63f8cfc0f01f0005000201e5273de40000000049454e44ae426082"
    )
).decode()
IMAGE_URL = f"data:image/png;base64,{PNG}"
NOTES = "data:text/plain;base64," + base64.b64encode(b"the tide is at noon").decode()


def run_count(gw: Gateway, table: str = "sessions_app_run") -> int:
    with sqlite3.connect(gw.env["DATABASE_URL"].removeprefix("sqlite:///"), timeout=10) as db:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def refused(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as bad:
        call()
    return dict(bad.value.body)


def test_an_image_the_agents_backend_cannot_take_is_a_400_naming_the_part(gw: Gateway) -> None:
    client = gw.sdk()
    before = run_count(gw)
    files_before = run_count(gw, "sessions_app_storedfile")
    image = {"type": "image_url", "image_url": {"url": IMAGE_URL}}
    with_image = [
        {"role": "system", "content": "Look."},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]},
    ]
    error = refused(lambda: client.chat.completions.create(model="oa", messages=with_image))
    assert (error["param"], error["code"]) == ("messages[1].content[1]", "unsupported_content")
    assert "not marked `vision: true`" in error["message"]
    earlier = [{"role": "user", "content": [image]}, assistant("A dot."), user("and now?")]
    assert refused(lambda: client.chat.completions.create(model="oa", messages=earlier))["param"] == (
        "messages[0].content[0]"
    )
    parts = [{"type": "input_text", "text": "what is this?"}, {"type": "input_image", "image_url": IMAGE_URL}]
    error = refused(lambda: client.responses.create(model="oa", input=[{"role": "user", "content": parts}]))
    assert (error["param"], error["code"]) == ("input[0].content[1]", "unsupported_content")
    as_file = [{"type": "input_file", "filename": "dot.png", "file_data": IMAGE_URL}]
    assert (
        refused(lambda: client.responses.create(model="oa", input=[user("x"), {"role": "user", "content": as_file}]))[
            "param"
        ]
        == "input[1].content[0]"
    )
    assert run_count(gw) == before  # nothing admitted
    assert run_count(gw, "sessions_app_storedfile") == files_before  # nor any inline image kept
    # an agent whose backend takes images runs the same request
    assert client.chat.completions.create(model="main", messages=with_image).choices[0].message.content == (
        "echo: what is this? (+1 attachment)"
    )


def test_input_files_are_attachments_within_the_limits(gw: Gateway) -> None:
    client = gw.sdk()
    notes = {"type": "input_file", "filename": "notes.txt", "file_data": NOTES}
    new_input = [{"type": "input_text", "text": "when is the tide?"}, notes]
    answer = client.responses.create(model="oa", input=[{"role": "user", "content": new_input}])
    assert sent(answer.output_text)[-1] == user("when is the tide?\n\n" + TIDE)
    earlier = [{"role": "user", "content": [notes]}, assistant("Read."), user("so?")]
    answer = client.responses.create(model="oa", input=earlier)
    assert sent(answer.output_text) == [user(TIDE), assistant("Read."), user("so?")]
    chat_file = {"type": "file", "file": {"filename": "notes.txt", "file_data": NOTES}}
    completion = client.chat.completions.create(model="oa", messages=[{"role": "user", "content": [chat_file]}])
    assert sent(completion.choices[0].message.content or "")[-1] == user(TIDE)

    before = run_count(gw)
    archive = {
        **notes,
        "filename": "a.zip",
        "file_data": "data:application/zip;base64," + base64.b64encode(b"PK\x03\x04").decode(),
    }
    for part, param, words in [
        (archive, "input[0].content[1].file_data", "image/*, text/*, application/pdf or application/json"),
        ({"type": "input_file", "file_id": "file-abc"}, "input[0].content[1].file_id", "fileId must be"),
        ({**notes, "file_data": "data:text/plain;base64,!!"}, "input[0].content[1].file_data", "base64"),
        ({**notes, "filename": 7}, "input[0].content[1].filename", "fileName"),
    ]:
        error = refused(
            lambda part=part: client.responses.create(
                model="oa", input=[{"role": "user", "content": [{"type": "input_text", "text": "x"}, part]}]
            )
        )
        assert error["param"] == param and words in error["message"], error
    too_many = [notes] * 5
    assert (
        refused(lambda: client.responses.create(model="oa", input=[{"role": "user", "content": too_many}]))["param"]
        == "input[0].content"
    )
    assert run_count(gw) == before


# --- a response continued twice: each continuation is a branch of its own ---------------------------------


def test_two_continuations_of_one_response_each_send_the_model_their_own_branch(gw: Gateway, fake: FakeOpenAI) -> None:
    client = gw.sdk()
    first = client.responses.create(model="oa", input="I am Zed.")
    left = client.responses.create(model="oa", input="left", previous_response_id=first.id)
    right = client.responses.create(model="oa", input="right", previous_response_id=first.id)
    start = [user("I am Zed."), assistant(first.output_text)]
    assert sent(right.output_text) == [*start, user("right")]  # not `left` and its answer
    more = client.responses.create(model="oa", input="more", previous_response_id=left.id)
    assert sent(more.output_text) == [*start, user("left"), assistant(left.output_text), user("more")]
