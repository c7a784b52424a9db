"""One definition of a run's outcome and duration on the wire (`run_events.run_end`, `run_events.duration_ms`)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chat.delivery import agent_events
from chat.methods.agent import final_answer
from chat.methods.send import acks as send_acks
from chat.methods.send.acks import AckStatus
from chat.protocol import run_events
from sessions_app.models import Run, RunState

KEY = "agent:main:main"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ended_run(state: str, **fields: Any) -> Run:
    """An unsaved terminal run: queued at T0, dispatched 1 s later, running at 3 s, ended at 10 s."""
    values: dict[str, Any] = {
        "run_id": "r1",
        "session_generation": uuid.uuid4(),
        "message": "hi",
        "body_hash": "h",
        "timeout_ms": 60000,
        "state": state,
        "stream_seq": 4,
        "created_at": T0,
        "dispatched_at": T0 + timedelta(seconds=1),
        "started_at": T0 + timedelta(seconds=3),
        "ended_at": T0 + timedelta(seconds=10),
        **fields,
    }
    return Run(**values)


@pytest.mark.parametrize(
    ("state", "stop_reason", "error_kind", "error_text"),
    [
        (RunState.DONE, "stop", None, "run done"),
        (RunState.KILLED, "rpc", None, "run killed"),
        (RunState.TIMEOUT, "timeout", "timeout", "run timeout"),
        (RunState.FAILED, None, "unknown", "run failed"),
    ],
)
def test_defaults_of_each_terminal_state(
    state: RunState, stop_reason: str | None, error_kind: str | None, error_text: str
) -> None:
    end = run_events.run_end(ended_run(state))
    assert (end.state, end.stop_reason, end.error_kind, end.error_message, end.error_text) == (
        state,
        stop_reason,
        error_kind,
        "",
        error_text,
    )


def test_stored_values_win_over_the_defaults() -> None:
    end = run_events.run_end(ended_run(RunState.KILLED, stop_reason="delete"))
    assert end.stop_reason == "delete"
    end = run_events.run_end(ended_run(RunState.FAILED, error_kind="backend", error_message="boom"))
    assert (end.error_kind, end.error_message, end.error_text) == ("backend", "boom", "boom")


@pytest.mark.parametrize("state", [RunState.QUEUED, RunState.DISPATCHING, RunState.RUNNING])
def test_an_open_run_has_no_outcome(state: RunState) -> None:
    with pytest.raises(ValueError):
        run_events.run_end(ended_run(state))


@pytest.mark.parametrize("state", [RunState.DONE, RunState.KILLED, RunState.TIMEOUT, RunState.FAILED])
@pytest.mark.parametrize("stored", [False, True])
def test_chat_event_ack_and_agent_answer_agree(state: RunState, stored: bool) -> None:
    fields = {"stop_reason": "operator", "error_kind": "backend", "error_message": "boom"} if stored else {}
    run = ended_run(state, **fields)
    end = run_events.run_end(run)
    chat = run_events.chat_payload(run, KEY)
    ack = send_acks.ack_payload(run, send_acks.replay_ack(run), KEY, str(run.session_generation))
    answer, error = final_answer(run, run.run_id, KEY)
    events, _ = agent_events.agent_events(chat, agent_events.run_facts(run), 0)
    lifecycle = events[-1]["data"]

    if state == RunState.DONE:
        assert chat["stopReason"] == ack["stopReason"] == lifecycle["stopReason"] == end.stop_reason
        assert error is None
    elif state == RunState.KILLED:
        assert ack["status"] == AckStatus.TIMEOUT
        assert chat["stopReason"] == ack["stopReason"] == lifecycle["stopReason"] == end.stop_reason
        assert error is not None and error["details"]["stopReason"] == end.stop_reason
    else:
        assert error is not None
        assert chat["errorKind"] == lifecycle["errorKind"] == error["details"]["errorKind"] == end.error_kind
        assert answer["summary"] == error["message"] == end.error_text
        if state == RunState.TIMEOUT:
            assert ack["stopReason"] == error["details"]["stopReason"] == end.stop_reason
        else:
            assert ack["errorKind"] == end.error_kind and ack["summary"] == end.error_text


def test_agent_events_default_a_missing_stop_reason_from_the_one_definition() -> None:
    """An older layer message without stopReason still gets the protocol's default."""
    for state, run_state in (
        (run_events.ChatState.FINAL, RunState.DONE),
        (run_events.ChatState.ABORTED, RunState.KILLED),
    ):
        chat = {"runId": "r1", "sessionKey": KEY, "sessionId": "s", "seq": 3, "state": state.value}
        events, _ = agent_events.agent_events(chat, None, 0)
        assert events[-1]["data"]["stopReason"] == run_events.default_stop_reason(run_state)


def test_duration_counts_from_dispatch_everywhere() -> None:
    run = ended_run(RunState.DONE, reply="echo: hi")
    assert run_events.duration_ms(run) == 9000  # dispatched at 1 s, ended at 10 s (not from 3 s, nor from 0 s)
    answer, _ = final_answer(run, run.run_id, KEY)
    assert run_events.chat_payload(run, KEY)["durationMs"] == answer["result"]["meta"]["durationMs"] == 9000


def test_duration_is_unknown_until_dispatch_and_end_are() -> None:
    assert run_events.duration_ms(ended_run(RunState.KILLED, dispatched_at=None, started_at=None)) is None
    assert run_events.duration_ms(ended_run(RunState.RUNNING, ended_at=None)) is None
    assert "durationMs" not in run_events.chat_payload(
        ended_run(RunState.KILLED, dispatched_at=None, started_at=None), KEY
    )
