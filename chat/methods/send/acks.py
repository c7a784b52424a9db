"""`chat.send` acks (§4): live (`started`, `queued`, `in_flight`) or over (`ok`, `timeout`, `error`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from chat.protocol.run_events import run_end
from sessions_app.lifecycle.runs import SendOutcome
from sessions_app.models import (
    OPEN_STATES,
    Run,
    RunState,
)


class AckStatus(StrEnum):
    """`chat.send` ack statuses (§4): a live run, or one that is already over."""

    STARTED = "started"
    QUEUED = "queued"
    IN_FLIGHT = "in_flight"
    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"


LIVE_ACKS = (AckStatus.STARTED, AckStatus.QUEUED, AckStatus.IN_FLIGHT)
TERMINAL_ACKS = (AckStatus.OK, AckStatus.TIMEOUT, AckStatus.ERROR)
# the ack a repeated key gets for its run's stored state (§4)
_REPLAY_ACK = {
    RunState.DONE: AckStatus.OK,
    RunState.KILLED: AckStatus.TIMEOUT,
    RunState.TIMEOUT: AckStatus.TIMEOUT,
    RunState.FAILED: AckStatus.ERROR,
}


def replay_ack(run: Run) -> AckStatus:
    """The ack status a repeated key gets for `run`: `in_flight` while open, else its outcome."""
    if run.state in OPEN_STATES:
        return AckStatus.IN_FLIGHT
    return _REPLAY_ACK[RunState(run.state)]


def ack_status(admitted: SendOutcome) -> AckStatus:
    """The ack status of an admission that produced a run (not a conflict or a full queue)."""
    if admitted.admission == "existing":
        assert admitted.run is not None
        return replay_ack(admitted.run)
    if admitted.admission == "rejected":
        return AckStatus.ERROR
    if admitted.admission == "steered":
        return AckStatus.STARTED  # the active run's id, `steered: true` (`ack_payload`)
    return AckStatus(admitted.admission)


def ack_payload(run: Run | None, status: AckStatus, session_key: str, session_id: str, **extra: Any) -> dict[str, Any]:
    """The chat.send acknowledgement for `status` (§4)."""
    payload: dict[str, Any] = {
        "runId": run.run_id if run else extra.pop("runId", None),
        "status": status.value,
        "sessionKey": session_key,
        "sessionId": session_id,
    }
    if run is not None and status in TERMINAL_ACKS:
        # a terminal status is the replay ack of the run's own terminal state (`_REPLAY_ACK`)
        end = run_end(run)
        if status == AckStatus.OK:
            payload["reply"] = run.reply
            payload["stopReason"] = end.stop_reason
        elif status == AckStatus.TIMEOUT:
            payload["stopReason"] = end.stop_reason
            if end.error_message:
                payload["summary"] = end.error_message
        else:
            payload["summary"] = end.error_text
            payload["errorKind"] = end.error_kind
    payload.update({k: v for k, v in extra.items() if v is not None})
    return payload
