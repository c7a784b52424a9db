"""Session keys (§3): the canonical `agent:<agentId>:<name>`, how requests name a session and its agent."""

from __future__ import annotations

import re
from typing import Any

from chat.base import agents
from chat.protocol.errors import ProtocolError, invalid
from chat.protocol.fields import get_str

# Always matched whole (`fullmatch`): `$` would let a trailing newline through.
KEY_NAME_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")
AGENT_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def canonical_key(raw: str, *, field: str = "sessionKey") -> tuple[str, str]:
    """Return (canonical key, agent id) for `raw`; NOT_FOUND for an unknown agent."""
    if raw.startswith("agent:"):
        parts = raw.split(":", 2)
        if len(parts) != 3 or not AGENT_ID_RE.fullmatch(parts[1]) or not KEY_NAME_RE.fullmatch(parts[2]):
            raise invalid(f"{field} must be agent:<agentId>:<name>", field=field)
        agent_id, name = parts[1], parts[2]
    else:
        if not KEY_NAME_RE.fullmatch(raw):
            raise invalid(f"{field} name must be 1..200 chars of [A-Za-z0-9._:-]", field=field)
        agent_id, name = agents.DEFAULT_AGENT, raw
    if not agents.known(agent_id):
        raise ProtocolError("NOT_FOUND", f"unknown agent: {agent_id}", field=field)
    return f"agent:{agent_id}:{name}", agent_id


def session_key_name(params: dict[str, Any]) -> str:
    """Which param names the session: `sessionKey`, or its synonym `key` (OpenClaw's Node client).

    Both present and different is an error (the two would name different sessions).
    """
    key, session_key = params.get("key"), params.get("sessionKey")
    if key is not None and session_key is not None and key != session_key:
        raise invalid("key and sessionKey name different sessions", field="key")
    return "key" if session_key is None and key is not None else "sessionKey"


def optional_agent(params: dict[str, Any]) -> str | None:
    """An optional configured `agentId` (NOT_FOUND when it names no agent)."""
    agent_id = get_str(params, "agentId", required=False, max_len=64, pattern=AGENT_ID_RE)
    if agent_id is not None and not agents.known(agent_id):
        raise ProtocolError("NOT_FOUND", f"unknown agent: {agent_id}", field="agentId")
    return agent_id


def session_key_param(params: dict[str, Any]) -> tuple[str, str]:
    """The canonical key and agent id of the session a request names by `sessionKey` or `key`.

    Errors name whichever of the two the client sent. Both present and different is an error.
    """
    name = session_key_name(params)
    raw = get_str(params, name, max_len=220)
    assert raw is not None
    return canonical_key(raw, field=name)


def agent_session(params: dict[str, Any], *, default_name: str | None) -> tuple[str | None, str]:
    """The agent and session a request names with `agentId` and a key (`sessionKey` or `key`),
    as `agent` and `sessions.create` take them: a bare key with `agentId` means
    `agent:<agentId>:<key>`, and `agentId` must agree with a full key. No key: the agent's
    `default_name` session, or None when there is no default (a new session). NOT_FOUND for
    an unknown agent.
    """
    agent_id = optional_agent(params)
    name = session_key_name(params)
    raw_key = get_str(params, name, required=False, max_len=220)
    if raw_key is None:
        if default_name is None:
            return None, agent_id or agents.DEFAULT_AGENT
        raw_key = f"agent:{agent_id or agents.DEFAULT_AGENT}:{default_name}"
    elif agent_id is not None and not raw_key.startswith("agent:"):
        raw_key = f"agent:{agent_id}:{raw_key}"
    key, key_agent = canonical_key(raw_key, field=name)
    if agent_id is not None and agent_id != key_agent:
        raise invalid(f"agentId does not match {name}", field="agentId")
    return key, key_agent


def named_session(params: dict[str, Any]) -> tuple[str, str]:
    """A session named by `key` (or `sessionKey`), with `agentId` for a bare key, as OpenClaw's
    clients name one: the canonical key and its agent. The key is required."""
    key, agent_id = agent_session(params, default_name=None)
    if key is None:
        raise invalid("sessionKey is required", field="sessionKey")  # as every method says it
    return key, agent_id


MAIN_KEY = "main"


def agent_id_of(session_key: str) -> str:
    """The agent of a canonical key `agent:<agentId>:<name>`."""
    return session_key.split(":", 2)[1]


# A Control UI link names a session by the first 8..32 hex digits of the UUID its key ends with.
SHORT_ID_RE = re.compile(r"[0-9a-fA-F]{8,32}")
UUID_SUFFIX_RE = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", re.IGNORECASE)


def dashed_uuid_prefix(hex_digits: str) -> str:
    """The start of a UUID as written (8-4-4-4-12, dashes) that these first hex digits are."""
    groups, at = [], 0
    for width in (8, 4, 4, 4, 12):
        if at >= len(hex_digits):
            break
        groups.append(hex_digits[at : at + width])
        at += width
    return "-".join(groups)


def short_id(params: dict[str, Any]) -> str:
    """`shortId`: 8..32 hex digits, lower-cased (the start of a session key's UUID, dashes left out)."""
    value = get_str(params, "shortId", max_len=32)
    assert value is not None
    if not SHORT_ID_RE.fullmatch(value):
        raise invalid("shortId must be 8-32 hexadecimal characters", field="shortId")
    return value.lower()
