"""The Responses timeline (chat/httpapi/response_events.py): a pure function of the stored run.

The property tests drive a simulated run through the steps a real one takes (queued, dispatched,
text yielded and stored in deltas that append marks, tool steps recorded at the text's length,
approvals asked and answered, calls run and ended, client calls, every kind of end with its open
calls closed as the lifecycle closes them) and check, at every snapshot, that the events are a
prefix of every later snapshot's, numbered from 0, with one terminal event only once the run has
ended, and that the official SDK's stream accumulator takes them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from chat.httpapi.response_events import TERMINAL_EVENTS, timeline
from sessions_app.models import ApprovalDecision, RunState, ToolCallState
from sessions_app.response_reads import CallView, ResponseRecord, RunView

RESPONSE_ID = "resp_" + "ab" * 16


def record(run: RunView, **fields: Any) -> ResponseRecord:
    base: dict[str, Any] = dict(
        pk=1,
        response_id=RESPONSE_ID,
        owner_id=1,
        model="main",
        store=True,
        background=False,
        previous_response_id="",
        input_items=[],
        metadata={},
        created_at=1_700_000_000,
        run=run,
    )
    return ResponseRecord(**{**base, **fields})


def view(**fields: Any) -> RunView:
    base: dict[str, Any] = dict(pk=1, run_id="r1", session_key="agent:main:api-x", state=RunState.RUNNING)
    base["dispatched"] = fields.get("state", RunState.RUNNING) != RunState.QUEUED
    return RunView(**{**base, **fields})


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


# --- a simulated run ------------------------------------------------------------------------------


@dataclasses.dataclass
class SimCall:
    call_id: str
    seq: int
    offset: int
    client: bool = False
    needs_approval: bool = False
    state: str = ToolCallState.PENDING
    started: bool = False
    approval_id: str = ""
    decision: str = ""
    result: str = ""

    def view(self) -> CallView:
        return CallView(
            call_id=self.call_id,
            seq=self.seq,
            server="" if self.client else "demo",
            tool="lookup",
            arguments='{"q": 1}',
            state=self.state,
            result=self.result,
            is_error=self.state not in (ToolCallState.SUCCEEDED, ToolCallState.CLIENT, *OPEN),
            reply_offset=self.offset,
            started=self.started,
            approval_id=self.approval_id,
            approval_decision=self.decision,
        )


OPEN = (ToolCallState.PENDING, ToolCallState.PENDING_APPROVAL, ToolCallState.RUNNING)


@dataclasses.dataclass
class SimRun:
    """A run as the executor, the tool host and the lifecycle would store it, step by step."""

    state: str = RunState.QUEUED
    dispatched: bool = False
    yielded: str = ""  # what the model produced
    reply: str = ""  # what is stored
    marks: list[int] = dataclasses.field(default_factory=list)
    calls: list[SimCall] = dataclasses.field(default_factory=list)
    stop_reason: str = ""
    error_kind: str = ""

    @property
    def ended(self) -> bool:
        return self.state in (RunState.DONE, RunState.FAILED, RunState.KILLED, RunState.TIMEOUT)

    def open_call(self) -> SimCall | None:
        return next((c for c in self.calls if c.state in OPEN), None)

    def snapshot(self) -> ResponseRecord:
        return record(
            RunView(
                pk=1,
                run_id="r1",
                session_key="k",
                state=self.state,
                reply=self.reply,
                marks=tuple(self.marks),
                dispatched=self.dispatched,
                prompt_tokens=3 if self.ended else None,
                completion_tokens=len(self.reply.split()) if self.ended else None,
                error_kind=self.error_kind,
                error_message="boom" if self.error_kind else "",
                stop_reason=self.stop_reason,
                calls=tuple(c.view() for c in self.calls),
            )
        )

    # --- steps ---

    def flush(self) -> None:
        if self.yielded != self.reply:
            self.reply = self.yielded
            self.marks.append(len(self.reply))

    def end(self, state: str, *, stop_reason: str = "", error_kind: str = "") -> None:
        if state != RunState.KILLED:
            self.reply = self.yielded  # the ending stores text held back
        self.state, self.stop_reason, self.error_kind = state, stop_reason, error_kind
        stopped = state in (RunState.KILLED, RunState.TIMEOUT)
        for call in self.calls:  # close_open
            if call.state not in OPEN:
                continue
            if call.approval_id and not call.decision:
                call.decision = ApprovalDecision.CANCELLED
                call.state, call.result = ToolCallState.CANCELLED, "not run"
            elif call.state != ToolCallState.RUNNING or stopped:
                call.state, call.result = ToolCallState.CANCELLED, "cancelled"
            else:
                call.state, call.result = ToolCallState.UNKNOWN, "outcome unknown"

    def advance_call(self, call: SimCall, choice: int) -> None:
        if call.state == ToolCallState.PENDING and call.needs_approval and not call.approval_id:
            call.approval_id, call.state = f"ap_{call.seq}", ToolCallState.PENDING_APPROVAL
        elif call.state == ToolCallState.PENDING_APPROVAL:
            call.decision = [ApprovalDecision.ALLOW_ONCE, ApprovalDecision.DENY, ApprovalDecision.EXPIRED][choice % 3]
            if call.decision == ApprovalDecision.ALLOW_ONCE:
                call.state = ToolCallState.PENDING
            else:
                call.state = ToolCallState.DENIED if call.decision == ApprovalDecision.DENY else ToolCallState.EXPIRED
                call.result = "not run"
        elif call.state == ToolCallState.PENDING:
            if choice % 4 == 0 and not call.approval_id:
                call.state, call.result = ToolCallState.FAILED, "bad arguments"  # never reached a server
            else:
                call.state, call.started = ToolCallState.RUNNING, True
        else:
            call.state = ToolCallState.SUCCEEDED if choice % 3 else ToolCallState.FAILED
            call.result = "42" if call.state == ToolCallState.SUCCEEDED else "tool error"

    def step(self, action: str, choice: int) -> None:
        """One thing happening to the run (an action that does not apply now changes nothing)."""
        if self.ended:
            return
        if self.state == RunState.QUEUED:
            if action in ("kill", "fail"):
                self.end(RunState.KILLED, stop_reason="rpc")
            else:
                self.state, self.dispatched = RunState.DISPATCHING, True
            return
        if self.state == RunState.DISPATCHING and action not in ("kill", "fail"):
            self.state = RunState.RUNNING
            return
        call = self.open_call()
        if action == "text" and call is None:
            self.yielded += f" w{choice}"
        elif action == "flush":
            self.flush()
        elif action == "tools" and call is None:
            first = len(self.calls) + 1
            for i in range(1 + choice % 3):
                needs = (choice + i) % 2 == 1
                self.calls.append(SimCall(f"tc_{first + i}", first + i, len(self.yielded), needs_approval=needs))
        elif action == "advance" and call is not None:
            self.advance_call(call, choice)
        elif action == "client" and call is None:
            first = len(self.calls) + 1
            for i in range(1 + choice % 2):
                self.calls.append(SimCall(f"tc_{first + i}", first + i, len(self.yielded), client=True))
                self.calls[-1].state = ToolCallState.CLIENT
            self.end(RunState.DONE, stop_reason="tool_calls")
        elif action == "done" and call is None:
            self.end(RunState.DONE, stop_reason=["", "", "length", "tool_limit"][choice % 4])
        elif action == "kill":
            self.end(RunState.KILLED, stop_reason="rpc")
        elif action == "fail":
            self.end(RunState.FAILED if choice % 2 else RunState.TIMEOUT, error_kind="backend")


# weighted towards longer lives: text, stored deltas and calls carried along, now and then an end
ACTIONS = ["text"] * 4 + ["flush"] * 3 + ["tools"] * 2 + ["advance"] * 6 + ["client", "done", "kill", "fail"]


def simulate(data: st.DataObject, *, max_steps: int = 60) -> list[ResponseRecord]:
    sim = SimRun()
    snapshots = [sim.snapshot()]
    for _ in range(max_steps):
        if sim.ended:
            break
        action = data.draw(st.sampled_from(ACTIONS))
        sim.step(action, data.draw(st.integers(0, 11)))
        snapshots.append(sim.snapshot())
    return snapshots


def sdk_accepts(events: list[dict[str, Any]]) -> Any:
    """Feed the events to the official SDK's stream accumulator; the snapshot it ends with."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        typed = construct_type(type_=ResponseStreamEvent, value=json.loads(json.dumps(event)))
        state.handle_event(typed)  # type: ignore[arg-type]
    return state._ResponseStreamState__current_snapshot  # type: ignore[attr-defined]


# --- properties -------------------------------------------------------------------------------------


@hsettings(max_examples=300, deadline=None)
@given(st.data())
def test_events_are_prefix_stable_over_a_runs_life(data: st.DataObject) -> None:
    snapshots = simulate(data)
    lines = [timeline(s) for s in snapshots]
    for earlier, later in itertools.pairwise(lines):
        assert later.events[: len(earlier.events)] == earlier.events
    for line in lines:
        assert [e["sequence_number"] for e in line.events] == list(range(len(line.events)))
        terminal = [e for e in line.events if e["type"] in TERMINAL_EVENTS.values()]
        assert len(terminal) == (1 if line.ended else 0)
        if line.ended:
            assert line.events[-1] is terminal[0]
            assert terminal[0]["response"] == line.response


@hsettings(max_examples=200, deadline=None)
@given(st.data())
def test_a_finished_timeline_tells_the_whole_run(data: st.DataObject) -> None:
    snapshots = simulate(data, max_steps=80)
    final = snapshots[-1]
    line = timeline(final)
    run = final.run
    if not line.ended:
        return
    output = line.response["output"]
    # the text items, in order, are the stored reply; the deltas are the same text
    texts = "".join(p["text"] for i in output if i["type"] == "message" for p in i["content"])
    assert texts == (run.reply if run.dispatched else "")
    deltas = "".join(e["delta"] for e in line.events if e["type"] == "response.output_text.delta")
    assert deltas == texts
    # every item added is done, once, with the same id, and the output lists them by index
    added = {e["output_index"]: e["item"] for e in line.events if e["type"] == "response.output_item.added"}
    done = {e["output_index"]: e["item"] for e in line.events if e["type"] == "response.output_item.done"}
    assert sorted(added) == sorted(done) == list(range(len(output)))
    assert all(added[i]["id"] == done[i]["id"] == output[i]["id"] for i in added)
    # each call once: an mcp_call with its exact state, or a function_call for a client call
    calls = {i["id"]: i for i in output if i["type"] == "mcp_call"}
    functions = {i["call_id"]: i for i in output if i["type"] == "function_call"}
    for call in run.calls if run.dispatched else ():
        if call.state == ToolCallState.CLIENT:
            assert functions[call.call_id]["arguments"] == call.arguments
        else:
            assert calls[call.call_id]["state"] == call.state
    snapshot = sdk_accepts(line.events)
    assert snapshot.id == RESPONSE_ID


@hsettings(max_examples=100, deadline=None)
@given(st.data())
def test_the_sdk_accumulates_every_snapshot(data: st.DataObject) -> None:
    for snap in simulate(data, max_steps=40):
        sdk_accepts(timeline(snap).events)


# --- examples -------------------------------------------------------------------------------------


def test_a_plain_reply_cut_at_its_marks() -> None:
    line = timeline(record(view(state=RunState.DONE, reply="echo: hi there", marks=(5, 8, 14))))
    assert types(line.events) == [
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["delta"] for e in line.events if e["type"] == "response.output_text.delta"] == ["echo:", " hi", " there"]
    assert line.response["status"] == "completed"
    assert line.response["output"][0]["content"][0]["text"] == "echo: hi there"
    assert line.response["output"][0]["status"] == "completed"


def test_while_running_text_goes_only_to_the_last_mark() -> None:
    running = timeline(record(view(reply="echo: hi there", marks=(5,))))
    assert [e["delta"] for e in running.events if e["type"] == "response.output_text.delta"] == ["echo:"]
    assert running.response["status"] == "in_progress"
    assert running.response["output"][0]["content"][0]["text"] == "echo:"


def test_without_marks_the_reply_is_one_delta_at_the_end() -> None:
    running = timeline(record(view(reply="echo: hi")))
    assert types(running.events) == ["response.created", "response.queued", "response.in_progress"]
    ended = timeline(record(view(state=RunState.DONE, reply="echo: hi")))
    assert [e["delta"] for e in ended.events if e["type"] == "response.output_text.delta"] == ["echo: hi"]


def test_a_queued_run_then_cancelled_never_was_in_progress() -> None:
    queued = timeline(record(view(state=RunState.QUEUED)))
    assert types(queued.events) == ["response.created", "response.queued"]
    assert queued.response["status"] == "queued"
    cancelled = timeline(record(view(state=RunState.KILLED, dispatched=False, stop_reason="cancel")))
    assert types(cancelled.events) == ["response.created", "response.queued", "response.cancelled"]
    assert cancelled.response["error"]["code"] == "run_aborted"


def test_failures_and_limits() -> None:
    failed = timeline(record(view(state=RunState.FAILED, reply="echo:", error_kind="interrupted", error_message="x")))
    assert failed.events[-1]["type"] == "response.failed"
    assert failed.response["error"] == {"code": "interrupted", "message": "x"}
    assert failed.response["output"][0]["status"] == "incomplete"
    limited = timeline(record(view(state=RunState.DONE, reply="a", stop_reason="length")))
    assert limited.events[-1]["type"] == "response.incomplete"
    assert limited.response["incomplete_details"] == {"reason": "max_output_tokens"}
    usage = timeline(record(view(state=RunState.DONE, prompt_tokens=2, completion_tokens=3))).response["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (2, 3, 5)


def _call(**fields: Any) -> CallView:
    base: dict[str, Any] = dict(call_id="tc_1", seq=1, server="demo", tool="add", arguments='{"a":1}', state="pending")
    return CallView(**{**base, **fields})


def test_an_mcp_call_between_texts() -> None:
    call = _call(state=ToolCallState.SUCCEEDED, started=True, result="2", reply_offset=5)
    line = timeline(record(view(state=RunState.DONE, reply="echo: done", marks=(5, 10), calls=(call,))))
    kinds = [i["type"] for i in line.response["output"]]
    assert kinds == ["message", "mcp_call", "message"]
    item = line.response["output"][1]
    assert (item["status"], item["state"], item["output"], item["server_label"], item["name"]) == (
        "completed",
        "succeeded",
        "2",
        "demo",
        "add",
    )
    assert "response.mcp_call.in_progress" in types(line.events)
    assert "response.mcp_call.completed" in types(line.events)


def test_a_call_waiting_for_approval_shows_the_request_and_holds_what_follows() -> None:
    waiting = _call(state=ToolCallState.PENDING_APPROVAL, approval_id="ap_1")
    line = timeline(record(view(reply="", calls=(waiting,))))
    assert [i["type"] for i in line.response["output"]] == ["mcp_approval_request"]
    assert line.response["output"][0]["id"] == "ap_1"
    denied = _call(
        state="denied", approval_id="ap_1", approval_decision="deny", result="Not run: bob", error_kind="deny"
    )
    line = timeline(record(view(state=RunState.DONE, reply="ok", marks=(2,), calls=(denied,))))
    assert [i["type"] for i in line.response["output"]] == ["mcp_approval_request", "mcp_call", "message"]
    assert line.response["output"][1]["status"] == "failed"
    assert line.response["output"][1]["state"] == "denied"
    assert line.response["output"][1]["error"]["content"] == [{"type": "text", "text": "Not run: bob"}]
    assert line.response["output"][1]["error_kind"] == "deny"


def test_a_call_of_unknown_outcome_says_so() -> None:
    call = _call(state=ToolCallState.UNKNOWN, started=True, result="Outcome unknown")
    line = timeline(record(view(state=RunState.FAILED, error_kind="interrupted", calls=(call,))))
    item = line.response["output"][0]
    assert (item["status"], item["state"]) == ("incomplete", "unknown")


def test_client_calls_are_function_calls() -> None:
    call = _call(server="", tool="get_weather", state=ToolCallState.CLIENT, arguments='{"city":"Oslo"}')
    line = timeline(record(view(state=RunState.DONE, stop_reason="tool_calls", calls=(call,))))
    item = line.response["output"][0]
    assert (item["type"], item["call_id"], item["name"], item["arguments"]) == (
        "function_call",
        "tc_1",
        "get_weather",
        '{"city":"Oslo"}',
    )
    assert line.response["status"] == "completed"
    deltas = [e for e in line.events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas[0]["delta"] == '{"city":"Oslo"}'


def test_the_response_echoes_its_request() -> None:
    request = {
        "instructions": ["be brief"],
        "client_tools": [{"name": "f", "description": "", "parameters": {"type": "object"}}],
        "tool_choice": {"name": "f"},
        "params": {"temperature": 0.5, "top_p": 0.9, "max_tokens": 50},
        "reasoning_effort": "low",
        "user": "u1",
    }
    rec = record(view(request=request), metadata={"k": "v"}, previous_response_id="resp_x", background=True)
    obj = timeline(rec).response
    assert obj["instructions"] == "be brief"
    assert obj["tools"][0]["name"] == "f"
    assert obj["tool_choice"] == {"type": "function", "name": "f"}
    assert (obj["temperature"], obj["top_p"], obj["max_output_tokens"]) == (0.5, 0.9, 50)
    assert obj["reasoning"]["effort"] == "low"
    assert (obj["user"], obj["metadata"], obj["previous_response_id"], obj["background"]) == (
        "u1",
        {"k": "v"},
        "resp_x",
        True,
    )
