"""The messages the `openai` backend sends the model: the transcript trimmed to the budget, attachments,
and earlier replies' tool calls and results (no server needed)."""

from __future__ import annotations

from typing import Any

from chat.runtime.backends import RunContext
from chat.runtime.backends.attached import wrapped_document
from chat.runtime.backends.openai.conversation import build_messages
from chat.runtime.backends.openai.settings import AgentSettings
from sessions_app.run_requests import RunRequest, ToolResult
from tests.chat.test_openai_backend import make_ctx

KEY = "agent:llm:chat"


def test_transcript_is_trimmed_from_the_oldest_end_and_keeps_aborted_text():
    history = [
        {"role": "user", "text": "a" * 40, "aborted": False, "run": 1},
        {"role": "assistant", "text": "b" * 40, "aborted": False, "run": 1},
        {"role": "user", "text": "c" * 10, "aborted": False, "run": 2},
        {"role": "assistant", "text": "partial", "aborted": True, "run": 2},  # shown, then aborted
        {"role": "user", "text": "", "aborted": False, "run": 3},  # nothing to send
    ]
    ctx = make_ctx("now", history=history)
    settings = AgentSettings.from_config("llm", {"model": "m", "system_prompt": "S" * 5, "context_chars": 50})
    # budget 50 - 5 (system) - 3 (current) = 42: "partial" (7) and c*10 fit, b*40 would not.
    assert build_messages(ctx, settings) == [
        {"role": "system", "content": "SSSSS"},
        {"role": "user", "content": "c" * 10},
        {"role": "assistant", "content": "partial"},
        {"role": "user", "content": "now"},
    ]
    roomy = AgentSettings.from_config("llm", {"model": "m", "context_tokens": 1000})  # ~4000 chars
    assert roomy.context_chars == 4000
    assert [m["content"] for m in build_messages(ctx, roomy)] == ["a" * 40, "b" * 40, "c" * 10, "partial", "now"]
    # The run's own message is always sent, even alone over budget: the server decides.
    tiny = AgentSettings.from_config("llm", {"model": "m", "context_chars": 1})
    assert build_messages(ctx, tiny) == [{"role": "user", "content": "now"}]


def test_only_the_transcript_up_to_this_runs_message_is_sent_and_text_attachments_are_inlined():
    transcript = [
        {"role": "user", "text": "first", "aborted": False, "run": 1},
        {"role": "user", "text": "mine", "aborted": False, "run": 7},
        {"role": "user", "text": "later", "aborted": False, "run": 8},
    ]
    ctx = make_ctx("mine", attachments=[{"mimeType": "text/plain", "fileName": "notes.txt", "text": "N1"}])
    ctx.transcript = transcript
    settings = AgentSettings.from_config("llm", {"model": "m"})
    assert build_messages(ctx, settings) == [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "mine\n\n" + wrapped_document("notes.txt", "text/plain", "N1")},
    ]


# --- the history as the model is sent it, its tool calls included -----------------------------------------


def _ctx(transcript: list[dict[str, Any]]) -> RunContext:
    now = {"role": "user", "text": "now", "aborted": False, "run": 9}
    return RunContext(
        run_pk=9,
        run_id="r9",
        session_key=KEY,
        session_id="gen",
        agent_id="llm",
        agent={},
        message="now",
        transcript=[*transcript, now],
    )


def _tool(call_id: str, step: int, offset: int, status: str = "succeeded", **extra: Any) -> dict[str, Any]:
    item = {"id": call_id, "name": "demo__calculate", "arguments": '{"expression": "1"}', "result": f"r-{call_id}"}
    return {**item, "status": status, "step": step, "offset": offset, **extra}


def test_history_splits_the_reply_at_each_step_and_sends_only_complete_pairs():
    text = "Looking.\n\nOne more.\n\nDone."
    entry = {
        "role": "assistant",
        "text": text,
        "run": 3,
        "tools": [
            _tool("tc_1", 1, len("Looking.")),
            _tool("tc_2", 1, len("Looking."), status="failed", arguments='{"expression": ', name="demo.bad name"),
            _tool("tc_3", 2, len("Looking.\n\nOne more.")),
            _tool("tc_4", 2, len("Looking.\n\nOne more."), status="running"),  # not ended: left out
            _tool("tc_5", 3, len(text), status="cancelled", result=""),
        ],
    }
    ask = {"role": "user", "text": "go", "aborted": False, "run": 3}
    settings = AgentSettings.from_config("llm", {"model": "m"})
    messages = build_messages(_ctx([ask, entry]), settings)
    calls = [m.get("tool_calls") and [c["id"] for c in m["tool_calls"]] for m in messages]
    assert [m["role"] for m in messages] == [
        "user",
        *("assistant", "tool", "tool"),
        *("assistant", "tool"),
        *("assistant", "tool"),
        "user",
    ]
    assert calls == [None, ["tc_1", "tc_2"], None, None, ["tc_3"], None, ["tc_5"], None, None]
    assert [m["content"] for m in messages if m["role"] == "assistant"] == ["Looking.", "One more.", "Done."]
    bad = messages[1]["tool_calls"][1]["function"]
    assert bad == {"name": "demo_bad_name", "arguments": "{}"}  # a history every server accepts
    assert messages[7] == {"role": "tool", "tool_call_id": "tc_5", "content": "(no output; the call ended cancelled)"}

    # Trimming drops a run's calls and results with its text, never a tool message alone.
    tight = AgentSettings.from_config("llm", {"model": "m", "context_chars": 60})
    assert build_messages(_ctx([ask, entry]), tight) == [{"role": "user", "content": "now"}]


def test_a_reply_of_only_tool_calls_is_still_sent():
    entry = {"role": "assistant", "text": "", "run": 3, "tools": [_tool("tc_1", 1, 0)]}
    messages = build_messages(_ctx([entry]), AgentSettings.from_config("llm", {"model": "m"}))
    assert messages[0]["content"] is None and messages[0]["tool_calls"][0]["id"] == "tc_1"
    assert messages[1] == {"role": "tool", "tool_call_id": "tc_1", "content": "r-tc_1"}
    assert len(messages) == 3


# --- what an HTTP request brings (HTTP-API.md §14.3-14.4) -------------------------------------------------


def _handed(call_id: str, model_id: str, offset: int = 0) -> dict[str, Any]:
    return _tool(call_id, 1, offset, status="client", result="", model_id=model_id, name="get_weather")


def test_results_answer_the_newest_call_a_repeated_model_id_names():
    """Servers that number calls per reply (`call_0`) repeat ids across runs: a result answers the newest."""
    old = {"role": "assistant", "text": "", "run": 3, "tools": [_handed("tc_old", "call_0")]}
    new = {"role": "assistant", "text": "", "run": 5, "tools": [_handed("tc_new", "call_0")]}
    asks = [{"role": "user", "text": f"ask {i}", "aborted": False, "run": i} for i in (3, 5)]
    answered_old = {"role": "user", "text": "", "aborted": False, "run": 4, "results": {"call_0": "old answer"}}
    ctx = _ctx([asks[0], old, answered_old, asks[1], new])
    ctx.request = RunRequest(tool_results=[ToolResult("call_0", "new answer")])
    ctx.message = ""
    ctx.transcript[-1]["text"] = ""
    messages = build_messages(ctx, AgentSettings.from_config("llm", {"model": "m"}))
    tools = [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"]
    assert tools == [("tc_old", "old answer"), ("tc_new", "new answer")]
    assert messages[-1]["role"] == "tool"  # results only: no empty user message after them


def test_the_answered_call_is_kept_over_budget_and_an_unknown_result_is_told_in_words():
    entry = {"role": "assistant", "text": "x" * 500, "run": 3, "tools": [_handed("tc_1", "call_a", 500)]}
    ctx = _ctx([{"role": "user", "text": "y" * 500, "aborted": False, "run": 3}, entry])
    ctx.request = RunRequest(tool_results=[ToolResult("call_a", "done"), ToolResult("call_zz", "lost")])
    tight = AgentSettings.from_config("llm", {"model": "m", "context_chars": 100})
    messages = build_messages(ctx, tight)
    assert [m["role"] for m in messages] == ["assistant", "tool", "user", "user"]  # the old question is dropped
    assert messages[0]["content"] == "x" * 500 and messages[1] == {
        "role": "tool",
        "tool_call_id": "tc_1",
        "content": "done",
    }
    assert messages[2] == {"role": "user", "content": "Result of tool call call_zz:\nlost"}


def test_a_stateless_context_is_grouped_checked_and_its_system_texts_join_the_prompt():
    context = [
        {"role": "developer", "content": "Dev note."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "k1", "type": "function", "function": {"name": "bad name!", "arguments": "not json"}},
                {"id": "k2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "k1", "content": "one"},
        {"role": "function", "content": "ignored"},
    ]
    ctx = make_ctx("now", request=RunRequest(context=context, instructions=["Inst."]))
    settings = AgentSettings.from_config("llm", {"model": "m", "system_prompt": "Sys."})
    messages = build_messages(ctx, settings)
    assert messages[0] == {"role": "system", "content": "Sys.\n\nInst.\n\nDev note."}
    assert messages[1]["content"] == context[1]["content"]  # parts that are not all text are sent as parts
    assert messages[2]["content"] is None
    assert [c["function"] for c in messages[2]["tool_calls"]] == [
        {"name": "bad_name_", "arguments": "{}"},
        {"name": "f", "arguments": "{}"},
    ]
    # k2 has no result in the request: it is told so, so the request stays valid
    assert [(m["tool_call_id"], m["content"][:12]) for m in messages[3:5]] == [("k1", "one"), ("k2", "(no result: ")]
    assert messages[5:] == [{"role": "user", "content": "now"}]
