"""Reading a Responses request (chat/httpapi/response_request.py): input items as the messages they
stand for, read by the one conversation reader, with errors naming the `input` item they came from."""

from __future__ import annotations

from typing import Any

import pytest

from chat.httpapi.conversation import read_messages
from chat.httpapi.errors import ApiError
from chat.httpapi.response_request import parse_responses, renamed


def ask(**body: Any) -> Any:
    return parse_responses({"model": "main", **body})


def read(**body: Any) -> Any:
    parsed = ask(**body)
    try:
        return read_messages(parsed.messages, named=False, agent_id="main")
    except ApiError as error:
        raise renamed(error, parsed.sources) from None


def test_a_string_is_one_user_message() -> None:
    parsed = ask(input="hi")
    assert parsed.messages == [{"role": "user", "content": "hi"}]
    assert parsed.items[0]["type"] == "message" and parsed.items[0]["content"] == [{"type": "input_text", "text": "hi"}]
    assert parsed.items[0]["id"].startswith("msg_")
    assert (parsed.store, parsed.background, parsed.stream) == (True, False, False)


def test_items_become_the_conversation_they_stand_for() -> None:
    convo = read(
        input=[
            {"role": "system", "content": "rules"},
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "mcp_call", "id": "tc_x", "name": "x", "server_label": "demo", "arguments": "{}"},
            {"role": "user", "content": "thanks"},
        ]
    )
    assert convo.instructions == ["rules"] and convo.message == "thanks"
    assert [m["role"] for m in convo.context] == ["user", "assistant", "tool"]
    assert convo.context[1]["tool_calls"][0]["id"] == "c1"  # the text and its call: one assistant turn


def test_tool_results_after_the_last_call_are_the_new_input() -> None:
    convo = read(
        input=[
            {"role": "user", "content": "go"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "ok"}]},
        ]
    )
    assert convo.message == "" and [(r.call_id, r.output) for r in convo.tool_results] == [("c1", "ok")]


def test_errors_name_the_input_item() -> None:
    with pytest.raises(ApiError) as bad:
        read(input=[{"role": "user", "content": "a"}, {"type": "function_call_output", "call_id": "x", "output": "1"}])
    assert bad.value.param == "input[1].call_id"
    with pytest.raises(ApiError) as bad:
        read(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}])
    assert bad.value.param == "input[0].content[0].image_url"
    with pytest.raises(ApiError) as bad:  # what the conversation reader cannot take is refused, never dropped
        read(input=[{"role": "user", "content": [{"type": "input_file", "file_data": "data:x", "filename": "a"}]}])
    assert bad.value.param is not None and bad.value.param.startswith("input[0].content[0]")
    for body, param in [
        ({"input": 3}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input[0].content[0]"),
        (
            {"input": [{"type": "mcp_approval_response", "approval_request_id": "ap", "approve": "yes"}]},
            "input[0].approve",
        ),
        ({"input": "x", "tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "f"}}, "tool_choice"),
        ({"input": "x", "reasoning": "high"}, "reasoning"),
        ({"input": "x", "instructions": ["a"]}, "instructions"),
        ({"input": "x", "metadata": {"k": 1}}, "metadata"),
        ({"input": "x", "user": 5}, "user"),
    ]:
        with pytest.raises(ApiError) as bad:
            ask(**body)
        assert bad.value.param == param, body


def test_fields_as_the_run_takes_them() -> None:
    parsed = ask(
        input="x",
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "f"},
        temperature=0.2,
        top_p=0.5,
        max_output_tokens=64,
        parallel_tool_calls=False,
        reasoning={"effort": "none"},
        conversation={"id": "c"},
        user="u",
    )
    assert [t.name for t in parsed.tools] == ["f"] and parsed.tool_choice == {"name": "f"}
    assert parsed.params == {"temperature": 0.2, "top_p": 0.5, "max_tokens": 64, "parallel_tool_calls": False}
    assert (parsed.reasoning_effort, parsed.conversation, parsed.user) == ("off", "c", "u")
    answer = ask(input=[{"type": "mcp_approval_response", "approval_request_id": "ap_1", "approve": False}])
    assert [(a.approval_id, a.approve) for a in answer.approvals] == [("ap_1", False)] and answer.messages == []
