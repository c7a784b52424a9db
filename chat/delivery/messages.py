"""The channel-layer messages of the gateway, as mypy checks them.

Every message a process receives comes through its hub (`chat.delivery.hub`): events for
its connections (`gateway.*`, fanned out to the members of the group they were sent to),
and messages for the process itself (`run.cancel`, `hub.probe`). Events travel encoded
once (`json`), beside the few fields a connection's filters read.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict, cast

OPERATORS_VIA = "operators"  # `via` of a copy sent through the operators' group


class ChatMessage(TypedDict):
    """`gateway.chat`: one `chat` event of a run (`broadcaster.chat_message`)."""

    type: Literal["gateway.chat"]
    owner: int  # the session's owner: the user group it was sent to
    run: int  # the run's pk
    runId: str
    sessionKey: str
    sessionId: str
    seq: int
    state: str
    # when it was sent, once committed (time.time(), set by `Broadcaster.send`): a connection
    # opened well after it ignores it; an older release's messages have none
    at: NotRequired[float]
    json: str  # the payload, encoded once for every connection
    payload: dict[str, Any]  # the same payload, for the `agent` events derived from it
    agent: NotRequired[dict[str, Any]]  # what those events add (agent_events.run_facts)
    via: NotRequired[str]


class SessionMessage(TypedDict):
    """`gateway.session`: one `sessions.changed` event (`broadcaster.session_message`)."""

    type: Literal["gateway.session"]
    owner: int
    session: int  # the session's pk
    version: int
    deleted: bool
    reason: str
    kind: NotRequired[str]  # the session's kind (`direct`, `api`): connections subscribe to some kinds
    row: str  # the row, encoded
    json: str  # the whole event payload, encoded
    via: NotRequired[str]


class ToolMessage(TypedDict):
    """`gateway.tool`: a tool call's or approval's event (TOOLS.md §13.3, §13.5; `broadcaster.tool_message`)."""

    type: Literal["gateway.tool"]
    owner: int
    run: int  # the run's pk
    call: str  # its toolCallId
    event: str  # start | update | result | approval | approval.resolved
    agent: dict[str, Any]  # the `agent` event (stream tool or approval): to connections with the cap tool-events
    plugin: NotRequired[dict[str, Any]]  # plugin.approval.requested / .resolved: to those with operator.approvals
    via: NotRequired[str]


class AccessMessage(TypedDict):
    """`gateway.access`: something this user's sockets relied on was revoked (`access.tell`)."""

    type: Literal["gateway.access"]
    owner: int
    change: str  # logout, inactive, password, demoted, token
    session: NotRequired[str | None]  # logout: the digest of the login session that ended
    tokens: NotRequired[list[str]]  # token: the hashes revoked
    via: NotRequired[str]


class RunCancel(TypedDict):
    """`run.cancel`: abort a run this process executes (sent to its `proc.<server_id>` group)."""

    type: Literal["run.cancel"]
    run: int


class HubProbe(TypedDict):
    """`hub.probe`: readiness's round trip through the hub (`Hub.probe`)."""

    type: Literal["hub.probe"]
    token: str


GatewayMessage = ChatMessage | SessionMessage | ToolMessage | AccessMessage
ProcessMessage = RunCancel | HubProbe


def untyped(message: GatewayMessage | ProcessMessage) -> dict[str, Any]:
    """The message as Channels' API takes it: the one place the typed shapes meet the layer."""
    return cast(dict[str, Any], message)
