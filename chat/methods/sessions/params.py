"""`sessions.*` params, validated completely before anything is stored."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from chat.methods.send.params import ChatSendParams, parse_chat_send
from chat.methods.session_settings import setting_value
from chat.protocol.errors import invalid
from chat.protocol.fields import ANY_COUNT, get_bool, get_int, get_str
from chat.protocol.keys import agent_session, named_session, optional_agent, short_id
from sessions_app.models import SessionKind


@dataclass
class ListParams:
    """`sessions.list`: a page of the caller's sessions (OpenClaw's `limit` goes up to 10000)."""

    limit: int
    offset: int
    status: str | None
    active_only: bool
    search: str | None
    agent_id: str | None
    spawned_by: str | None  # sessions spawned by another: this gateway has none
    active_minutes: int | None = None  # only sessions updated within this many minutes
    kinds: tuple[str, ...] = (SessionKind.DIRECT,)  # `api` sessions only when asked (HTTP-API.md §14.3)


LIST_STATUSES = frozenset({"running", "done", "failed", "killed", "timeout", "none"})
# OpenClaw puts no bound on `limit` (its Control UI asks for 10000, its ACP bridge for up to 10101):
# a page is bounded anyway (at most `sizes.MAX_LIST_ROWS` rows, and one frame), so any positive
# number is taken.
MAX_LIST_LIMIT = ANY_COUNT


def parse_kinds(params: dict[str, Any]) -> tuple[str, ...]:
    """`kinds`: the session kinds to list or be told of (`direct`, `api`); `["direct"]` when not given."""
    kinds = params.get("kinds")
    if kinds is None:
        return (SessionKind.DIRECT,)
    allowed = [k.value for k in SessionKind]
    if not isinstance(kinds, list) or not kinds or not all(k in allowed for k in kinds):
        raise invalid("kinds must be a non-empty list of " + ", ".join(allowed), field="kinds")
    return tuple(dict.fromkeys(kinds))


def parse_sessions_list(params: dict[str, Any]) -> ListParams:
    """Validate `sessions.list` params; OpenClaw's display options (`includeGlobal`, …) are ignored."""
    limit = get_int(params, "limit", lo=1, hi=MAX_LIST_LIMIT, default=100) or 100
    offset = get_int(params, "offset", lo=0, hi=10_000_000, default=0) or 0
    status = get_str(params, "status", required=False, max_len=16)
    if status is not None and status not in LIST_STATUSES:
        raise invalid("status must be one of " + ", ".join(sorted(LIST_STATUSES)), field="status")
    search = get_str(params, "search", required=False, min_len=0, max_len=200)
    spawned_by = get_str(params, "spawnedBy", required=False, min_len=0, max_len=220)
    return ListParams(
        limit=limit,
        offset=offset,
        status=status,
        active_only=get_bool(params, "activeOnly"),
        search=search or None,
        agent_id=optional_agent(params),
        spawned_by=spawned_by or None,
        active_minutes=get_int(params, "activeMinutes", lo=1, hi=100_000_000, default=None),
        kinds=parse_kinds(params),
    )


@dataclass
class CreateParams:
    """`sessions.create`: the session to create and its optional first message."""

    key: str | None  # None: a generated name
    agent_id: str
    label: str
    first: ChatSendParams | None = None
    # The key was derived from the first message's idempotencyKey (no key given): a retry of this
    # create names the same session, so it is answered as a replay and runs nothing twice.
    derived_key: bool = False


def parse_sessions_create(params: dict[str, Any]) -> CreateParams:
    """Validate `sessions.create {key?, agentId?, label?, message?, attachments?, timeoutMs?,
    idempotencyKey?}` completely, its first message included, before anything is stored."""
    key, agent_id = agent_session(params, default_name=None)
    label = get_str(params, "label", required=False, min_len=0, max_len=200) or ""
    first = parse_first_message(params, agent_id)
    derived = False
    if key is None and first is not None and params.get("idempotencyKey") is not None:
        key, derived = f"agent:{agent_id}:{derived_name(first.run_id)}", True
    return CreateParams(key=key, agent_id=agent_id, label=label, first=first, derived_key=derived)


def derived_name(idempotency_key: str) -> str:
    """The session name a key-less `sessions.create` with a first message gets from its
    idempotencyKey: `s-` and 10 hex digits, as a generated name, but the same on every retry."""
    return "s-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:10]


def parse_first_message(params: dict[str, Any], agent_id: str) -> ChatSendParams | None:
    """`sessions.create`'s optional first message (`message`, `attachments`, `timeoutMs`), validated
    as the `chat.send` it becomes, before anything is stored; None without one. Its runId is the
    create's `idempotencyKey` when one is sent (a retried create replays the run instead of
    running it again), else a fresh one, as OpenClaw gives it. Its `key` is set once the session
    exists."""
    if params.get("message") in (None, "") and not params.get("attachments"):
        return None
    run_id = params.get("idempotencyKey")
    send = {
        "sessionKey": f"agent:{agent_id}:main",  # a stand-in: the created session's key replaces it
        "message": params.get("message"),
        "attachments": params.get("attachments"),
        "timeoutMs": params.get("timeoutMs"),
        "idempotencyKey": uuid.uuid4().hex if run_id is None else run_id,
    }
    return parse_chat_send({k: v for k, v in send.items() if v is not None})


@dataclass(frozen=True)
class SessionPatch:
    """`sessions.patch` params: for each field None when not given, "" to clear (JSON null)."""

    key: str
    agent_id: str
    label: str | None = None
    thinking_level: str | None = None
    verbose_level: str | None = None
    model: str | None = None


def parse_session_patch(params: dict[str, Any]) -> SessionPatch:
    """Validate `sessions.patch {key, label?, thinkingLevel?, verboseLevel?, model?}` completely.

    As in OpenClaw, `null` clears a field (no label; the agent's default level or model) and a
    field left out stays as it is; at least one must be given. A bad value changes nothing.
    """
    key, agent_id = named_session(params)  # OpenClaw's clients send `{key, agentId?}`
    values: dict[str, str | None] = {}
    for name in ("label", "thinkingLevel", "verboseLevel", "model"):
        if name not in params:
            values[name] = None
        elif params[name] is None:
            values[name] = ""
        elif name == "label":
            values[name] = get_str(params, "label", min_len=0, max_len=200)
        else:
            values[name] = setting_value(name, params[name], agent_id, field=name)
    if all(value is None for value in values.values()):
        raise invalid("nothing to change: give label, thinkingLevel, verboseLevel or model")
    return SessionPatch(
        key=key,
        agent_id=agent_id,
        label=values["label"],
        thinking_level=values["thinkingLevel"],
        verbose_level=values["verboseLevel"],
        model=values["model"],
    )


@dataclass
class ResolveParams:
    """`sessions.resolve`: exactly one of key, sessionId, label, shortId names the session."""

    agent_id: str | None
    allow_missing: bool
    key: str | None = None
    session_id: uuid.UUID | None = None
    label: str | None = None
    short_id: str | None = None
    unmatchable: bool = False  # a sessionId that is no UUID names no session here
    # the selector as errors name it: its param, and its value as given (a key made canonical)
    field: str = "key"
    value: str = ""


RESOLVE_SELECTORS = ("key", "sessionKey", "sessionId", "label", "shortId", "reference")


def parse_sessions_resolve(params: dict[str, Any]) -> ResolveParams:
    """Validate `sessions.resolve` params (OpenClaw's selectors; `reference.key` counts as `key`)."""
    given = [name for name in RESOLVE_SELECTORS if params.get(name) is not None]
    if "key" in given and "sessionKey" in given:
        given.remove("sessionKey")  # `session_key_param` rules on the pair
    if len(given) > 1:
        raise invalid("Provide either key, sessionId, label, shortId, or reference (not multiple)", field=given[1])
    if not given:
        raise invalid("Either key, sessionId, label, shortId, or reference is required", field="key")
    if params.get("slugHint") is not None and given != ["shortId"]:
        raise invalid("slugHint requires shortId", field="slugHint")
    agent_id = optional_agent(params)
    resolved = ResolveParams(agent_id=agent_id, allow_missing=get_bool(params, "allowMissing"))
    selector = given[0]
    if selector in ("key", "sessionKey"):
        resolved.key, _agent = named_session(params)
    elif selector == "reference":
        reference = params["reference"]
        if not isinstance(reference, dict):
            raise invalid("reference must be an object", field="reference")
        key = get_str(reference, "key", max_len=220)
        resolved.key, _agent = named_session({"key": key, "agentId": agent_id})
    elif selector == "sessionId":
        raw = get_str(params, "sessionId", max_len=64)
        assert raw is not None
        resolved.field, resolved.value = "sessionId", raw  # as given: one that is no UUID is named too
        try:
            resolved.session_id = uuid.UUID(raw)
        except ValueError:
            resolved.unmatchable = True
    elif selector == "label":
        label = get_str(params, "label", max_len=200)
        assert label is not None
        if not label.strip():
            raise invalid("label must not be blank", field="label")
        resolved.label = resolved.value = label.strip()
        resolved.field = "label"
    else:
        resolved.short_id = resolved.value = short_id(params)
        resolved.field = "shortId"
    if resolved.key is not None:
        resolved.value = resolved.key
    return resolved


def parse_messages_subscribe(params: dict[str, Any]) -> tuple[str, bool]:
    """`sessions.messages.subscribe {key, agentId?, includeApprovals?}`: the session, and whether
    approvals are asked for (the handler checks the scope they need)."""
    key, _agent = named_session(params)
    return key, get_bool(params, "includeApprovals")
