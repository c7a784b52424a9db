"""Protocol v4 input: frame parsing, parameter validation, error envelopes and frames.

All parsing and validation of client input lives here; what the gateway says about
its state (rows, chat events, acks) is encoded in `chat.protocol.wire`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.conf import settings

from chat.runtime import catalog

PROTOCOL_VERSION = 4

EVENTS = [
    "connect.challenge",
    "chat",
    "agent",
    "sessions.changed",
    "plugin.approval.requested",
    "plugin.approval.resolved",
    "tick",
    "shutdown",
]


class Scope(StrEnum):
    """Operator scopes (§2.4); each method declares the one it needs."""

    READ = "operator.read"
    WRITE = "operator.write"
    ADMIN = "operator.admin"
    APPROVALS = "operator.approvals"  # see and answer one's own tool approvals (TOOLS.md §13.5)


# `connect` caps this gateway acts on: `tool-events` asks for the `agent` stream `tool` (§13.3)
CAP_TOOL_EVENTS = "tool-events"


# Always matched whole (`fullmatch`): `$` would let a trailing newline through.
KEY_NAME_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")
AGENT_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
RUN_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MIME_RE = re.compile(r"(image|text)/[A-Za-z0-9.+-]+")
MESSAGE_ID_RE = re.compile(r"[0-9]{1,19}")
APPROVAL_ID_RE = re.compile(r"ap_[0-9a-f]{24}")
APPROVAL_DECISIONS = ("allow-once", "deny")
# Control characters other than tab, LF and CR are stripped from messages.
CONTROL_RE = re.compile(r"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]")
FRAME_KEYS = {"type", "id", "method", "params"}
STOP_COMMANDS = {"/stop"}
RESET_COMMANDS = {"/new", "/reset"}
STATUS_COMMAND = "/status"
# OpenClaw's ACP bridge (`openclaw acp`) puts this line and a blank line before every prompt, so an
# editor's `/status` arrives as "[Working directory: /x]\n\n/status": a command after exactly this
# header is still a command (docs/protocol-notes.md, "Session settings and inline commands").
ACP_CWD_HEADER_RE = re.compile(r"\[Working directory: [^\n]*\]\n\n")
# chat.send's queueMode values; `steer` is OpenClaw's name for what sessions.steer does here.
QUEUE_MODES = ("followup", "interrupt", "steer")
# Inline commands that take one optional argument, and the session setting each reads or sets.
SETTING_COMMANDS = {"/think": "thinkingLevel", "/verbose": "verboseLevel", "/model": "model"}
# Session settings (docs/protocol-notes.md): OpenClaw's thinking levels this gateway can honour
# (the catalog's, which the backends read too) and its verbose levels.
THINKING_LEVELS = catalog.THINKING_LEVELS
VERBOSE_LEVELS = ("off", "on", "full")
# The argument of /think, /verbose and /model that clears the session's setting (OpenClaw's word).
DEFAULT_SETTING = "default"


class ProtocolError(Exception):
    """An error response: code, message and optional details (§1)."""

    def __init__(
        self,
        code: str,
        message: str,
        /,
        *,
        field: str | None = None,
        retry_after_ms: int | None = None,
        retryable: bool | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details)
        if field is not None:
            self.details["field"] = field
        self.retry_after_ms = retry_after_ms
        self.retryable = retryable

    def to_error(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            err["details"] = self.details
        if self.retryable is not None:
            err["retryable"] = self.retryable
        if self.retry_after_ms is not None:
            err["retryAfterMs"] = self.retry_after_ms
        return err


_SURROGATE = re.compile("[\ud800-\udfff]")


def encode(value: Any) -> str:
    """Compact JSON, as every frame and event payload is sent: UTF-8 text, not ASCII escapes
    (a reply in Chinese is a third the size); a lone surrogate, which UTF-8 cannot carry,
    is escaped instead, as JSON allows (then the whole value is)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if not text.isascii() and _SURROGATE.search(text):
        return json.dumps(value, separators=(",", ":"))
    return text


def invalid(message: str, /, *, field: str | None = None, **details: Any) -> ProtocolError:
    return ProtocolError("INVALID_REQUEST", message, field=field, **details)


def unavailable(dependency: str, *, retry_after_ms: int) -> ProtocolError:
    """A service the request needs is away (docs/protocol-notes.md): retry after `retry_after_ms`
    (a `chat.send` with the same idempotencyKey, which is safe whether or not it was stored)."""
    what = "the database" if dependency == "database" else f"the {dependency.replace('_', ' ')}"
    return ProtocolError(
        "UNAVAILABLE",
        f"{what} is unavailable; try again shortly",
        reason=f"{dependency.replace('_', '-')}-unavailable",
        retryable=True,
        retry_after_ms=retry_after_ms,
    )


# --- frames --------------------------------------------------------------------------


@dataclass
class Request:
    id: str
    method: str
    params: dict[str, Any]


def parse_frame(text: str) -> Request:
    """Parse one client frame; raise ProtocolError with `.request_id` set when it was readable."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _frame_error("frame is not valid JSON", None) from exc
    if not isinstance(data, dict):
        raise _frame_error("frame must be a JSON object", None)
    raw_id = data.get("id")
    rid = raw_id if isinstance(raw_id, str) and 1 <= len(raw_id) <= 128 else None
    extra = set(data) - FRAME_KEYS
    if extra:
        raise _frame_error(f"unknown frame keys: {', '.join(sorted(extra))}", rid, field=sorted(extra)[0])
    if data.get("type") != "req":
        raise _frame_error("frame type must be 'req'", rid, field="type")
    if rid is None:
        raise _frame_error("id must be a string of 1..128 chars", None, field="id")
    method = data.get("method")
    if not isinstance(method, str) or not method:
        raise _frame_error("method must be a non-empty string", rid, field="method")
    params = data.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise _frame_error("params must be an object", rid, field="params")
    return Request(rid, method, params)


def _frame_error(message: str, rid: str | None, **details: Any) -> ProtocolError:
    err = invalid(message, **details)
    err.request_id = rid  # type: ignore[attr-defined]
    return err


def response_ok(rid: str, payload: dict[str, Any] | list[Any]) -> dict[str, Any]:
    return {"type": "res", "id": rid, "ok": True, "payload": payload}


def response_error(
    rid: str, error: dict[str, Any], payload: dict[str, Any] | list[Any] | None = None
) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "res", "id": rid, "ok": False, "error": error}
    if payload is not None:
        frame["payload"] = payload
    return frame


def event_frame(name: str, payload: dict[str, Any], seq: int) -> dict[str, Any]:
    return {"type": "event", "event": name, "payload": payload, "seq": seq}


def event_frame_json(name: str, payload_json: str, seq: int) -> str:
    """`event_frame` as text, around a payload already encoded (`name` is one of ours: no escaping needed)."""
    return f'{{"type":"event","event":"{name}","payload":{payload_json},"seq":{seq}}}'


# --- parameter helpers -----------------------------------------------------------------


def get_str(
    params: dict[str, Any],
    name: str,
    *,
    required: bool = True,
    min_len: int = 1,
    max_len: int = 10_000,
    pattern: re.Pattern[str] | None = None,
) -> str | None:
    value = params.get(name)
    if value is None:
        if required:
            raise invalid(f"{name} is required", field=name)
        return None
    if not isinstance(value, str):
        raise invalid(f"{name} must be a string", field=name)
    require_unicode(value, name)
    if not (min_len <= len(value) <= max_len):
        raise invalid(f"{name} must be {min_len}..{max_len} characters", field=name)
    if pattern is not None and not pattern.fullmatch(value):
        raise invalid(f"{name} has invalid characters", field=name)
    return value


def require_unicode(value: str, name: str) -> None:
    """Refuse a lone surrogate (JSON lets `"\\ud800"` through; UTF-8, the database and hashing do not)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(f"{name} must be valid Unicode text (no lone surrogates)", field=name) from exc


def get_message_id(params: dict[str, Any], name: str) -> int | None:
    """A message id: ASCII digits (or an integer) that fit a 64-bit primary key."""
    raw = params.get(name)
    if raw is None:
        return None
    text = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if not isinstance(text, str) or not MESSAGE_ID_RE.fullmatch(text) or int(text) >= 2**63:
        raise invalid(f"{name} must be a message id", field=name)
    return int(text)


def get_int(params: dict[str, Any], name: str, *, lo: int, hi: int, default: int | None) -> int | None:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{name} must be an integer", field=name)
    if not (lo <= value <= hi):
        raise invalid(f"{name} must be between {lo} and {hi}", field=name)
    return value


def get_bool(params: dict[str, Any], name: str, *, default: bool = False) -> bool:
    value = params.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{name} must be a boolean", field=name)
    return value


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
        agent_id, name = "main", raw
    if agent_id not in settings.GATEWAY_AGENTS:
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
    if agent_id is not None and agent_id not in settings.GATEWAY_AGENTS:
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
            return None, agent_id or "main"
        raw_key = f"agent:{agent_id or 'main'}:{default_name}"
    elif agent_id is not None and not raw_key.startswith("agent:"):
        raw_key = f"agent:{agent_id}:{raw_key}"
    key, key_agent = canonical_key(raw_key, field=name)
    if agent_id is not None and agent_id != key_agent:
        raise invalid(f"agentId does not match {name}", field="agentId")
    return key, key_agent


# --- chat.send ---------------------------------------------------------------------------

_IMAGE_MAGIC: list[tuple[bytes, str]] = [
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
]


def sniff(data: bytes) -> str:
    """Best-effort type of `data`: an image/* type, 'text', or 'binary'."""
    for magic, mime in _IMAGE_MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if b"\x00" in data:
        return "binary"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    return "text"


def _attachment(item: Any, index: int) -> dict[str, Any]:
    where = f"attachments[{index}]"
    if not isinstance(item, dict):
        raise invalid("attachment must be an object", field=where)
    mime = item.get("mimeType")
    if not isinstance(mime, str) or not MIME_RE.fullmatch(mime):
        raise invalid("mimeType must be image/* or text/*", field=f"{where}.mimeType")
    name = item.get("fileName")
    if name is not None and (not isinstance(name, str) or len(name) > 255):
        raise invalid("fileName must be a string of at most 255 chars", field=f"{where}.fileName")
    if name is not None:
        require_unicode(name, f"{where}.fileName")
    content = item.get("content")
    if not isinstance(content, str) or not content:
        raise invalid("content must be a non-empty base64 string", field=f"{where}.content")
    if len(content) > (settings.GATEWAY_MAX_ATTACHMENT_BYTES * 4) // 3 + 8:
        raise invalid("attachment is larger than allowed", field=f"{where}.content")
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid("content is not valid base64", field=f"{where}.content") from exc
    if len(data) > settings.GATEWAY_MAX_ATTACHMENT_BYTES:
        raise invalid("attachment is larger than allowed", field=f"{where}.content")
    kind = sniff(data)
    major = mime.split("/", 1)[0]
    if major == "image":
        normalized = "image/jpeg" if mime == "image/jpg" else mime
        if kind != normalized:
            raise invalid("mimeType does not match the content", field=f"{where}.mimeType", sniffed=kind)
    elif kind != "text":
        raise invalid("mimeType does not match the content", field=f"{where}.mimeType", sniffed=kind)
    return {
        "mimeType": mime,
        "fileName": name,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "text": data.decode("utf-8") if major == "text" else None,
    }


@dataclass
class ChatSendParams:
    key: str
    agent_id: str
    message: str
    run_id: str
    attachments: list[dict[str, Any]] = field(default_factory=list)
    timeout_ms: int = 600_000
    wait_ms: int = 0
    queue_mode: str = "followup"
    # A steer (sessions.steer, or queueMode "steer"): queue mode interrupt, the active run stopped
    # with stopReason `steer`.
    steer: bool = False
    # An inline command (§4): its name ("/think"), and for /think, /verbose and /model the value it
    # sets, validated ("" = back to the default; None = no argument: report the current value);
    # `command_text` is the command as typed (without the ACP bridge's header).
    command: str | None = None
    command_arg: str | None = None
    command_text: str = ""

    @property
    def body_hash(self) -> str:
        body = {
            "message": self.message,
            "attachments": [[a["mimeType"], a["fileName"], a["sha256"]] for a in self.attachments],
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def command_line(message: str) -> str:
    """The text a command is read from: the message without the ACP bridge's leading
    `[Working directory: …]` line and blank line when it starts with exactly that (nothing else
    is stripped)."""
    header = ACP_CWD_HEADER_RE.match(message)
    return message[header.end() :] if header else message


def parse_command(message: str, agent_id: str) -> tuple[str, str | None] | None:
    """The inline command a message is, with its validated argument; None for a message to the model.

    /stop, /new, /reset and /status are commands only as the whole message. /think, /verbose and
    /model are commands with at most one argument: a wrong one is INVALID_REQUEST with
    `details.field: "message"`, so a mistyped setting never reaches the model; followed by more
    than one word ("/think about this bug") the message is a sentence, for the model.
    """
    words = message.split()
    if not words:
        return None
    name, args = words[0], words[1:]
    if name in STOP_COMMANDS | RESET_COMMANDS | {STATUS_COMMAND}:
        return (name, None) if not args else None
    if name not in SETTING_COMMANDS:
        return None
    setting = SETTING_COMMANDS[name]
    if len(args) > 1:
        return None
    if not args:
        return name, None
    if args[0].lower() == DEFAULT_SETTING:
        return name, ""
    value = setting_value(setting, args[0], agent_id, field="message")
    return name, value


def setting_choices(setting: str, agent_id: str) -> list[str]:
    """The values a session setting accepts, as an error message lists them."""
    if setting == "thinkingLevel":
        return [*THINKING_LEVELS, DEFAULT_SETTING]
    if setting == "verboseLevel":
        return [*VERBOSE_LEVELS, DEFAULT_SETTING]
    return [*catalog.models_of(catalog.config_of(agent_id)), DEFAULT_SETTING]


def setting_value(setting: str, raw: Any, agent_id: str, *, field: str) -> str:
    """A session setting's value from client input (levels case-insensitively; a model by its id or
    `provider/id`), or INVALID_REQUEST naming `field` and what it accepts."""
    if not isinstance(raw, str):
        raise invalid(f"{setting} must be a string or null", field=field)
    require_unicode(raw, field)
    text = raw.strip()
    if setting == "model":
        model = catalog.resolve_model(agent_id, text)
        if model is None:
            allowed = ", ".join(catalog.models_of(catalog.config_of(agent_id))) or "none"
            raise invalid(f"agent {agent_id!r} has no model {text[:200]!r} (its models: {allowed})", field=field)
        return model
    levels = THINKING_LEVELS if setting == "thinkingLevel" else VERBOSE_LEVELS
    if text.lower() not in levels:
        raise invalid(f"{setting} must be one of {', '.join(levels)}", field=field)
    return text.lower()


def parse_models_list(params: dict[str, Any]) -> list[str]:
    """`models.list {agentId?, sessionKey?}`: the agents whose models to list — the one named (by
    `agentId`, or by a session's key), else every configured agent. OpenClaw's other params
    (`includeDetails`, `view`, ...) are ignored: there is no catalog beyond the configured models."""
    agent_id = optional_agent(params)
    if agent_id is not None:
        return [agent_id]
    if params.get("sessionKey") is not None or params.get("key") is not None:
        return [session_key_param(params)[1]]
    return list(settings.GATEWAY_AGENTS)


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


def parse_chat_send(params: dict[str, Any]) -> ChatSendParams:
    """Validate chat.send params completely; nothing is stored before this passes."""
    key, agent_id = session_key_param(params)
    message = params.get("message", "")
    if message is None:
        message = ""
    if not isinstance(message, str):
        raise invalid("message must be a string", field="message")
    if "\x00" in message:
        raise invalid("message must not contain NUL bytes", field="message")
    require_unicode(message, "message")
    message = CONTROL_RE.sub("", message)
    if len(message) > settings.GATEWAY_MAX_MESSAGE_CHARS:
        raise invalid(f"message is longer than {settings.GATEWAY_MAX_MESSAGE_CHARS} characters", field="message")
    raw_attachments = params.get("attachments")
    if raw_attachments is None:
        raw_attachments = []
    if not isinstance(raw_attachments, list):
        raise invalid("attachments must be an array", field="attachments")
    if len(raw_attachments) > settings.GATEWAY_MAX_ATTACHMENTS:
        raise invalid(f"at most {settings.GATEWAY_MAX_ATTACHMENTS} attachments", field="attachments")
    attachments = [_attachment(item, i) for i, item in enumerate(raw_attachments)]
    if not message.strip() and not attachments:
        raise invalid("message must not be empty", field="message")
    run_id = get_str(params, "idempotencyKey", max_len=128, pattern=RUN_ID_RE)
    assert run_id is not None
    timeout_ms = get_int(params, "timeoutMs", lo=1000, hi=3_600_000, default=settings.GATEWAY_DEFAULT_TIMEOUT_MS)
    wait_ms = get_int(params, "waitMs", lo=0, hi=120_000, default=0)
    queue_mode = params.get("queueMode", "followup")
    if queue_mode not in QUEUE_MODES:
        raise invalid("queueMode must be 'followup', 'interrupt' or 'steer'", field="queueMode")
    steer = queue_mode == "steer"  # OpenClaw's Control UI sends it when typing during a run
    text = command_line(message)
    command = None if attachments else parse_command(text, agent_id)
    return ChatSendParams(
        key=key,
        agent_id=agent_id,
        message=message,
        run_id=run_id,
        attachments=attachments,
        timeout_ms=timeout_ms or settings.GATEWAY_DEFAULT_TIMEOUT_MS,
        wait_ms=wait_ms or 0,
        queue_mode="interrupt" if steer else queue_mode,
        steer=steer,
        command=command[0] if command else None,
        command_arg=command[1] if command else None,
        command_text=text.strip() if command else "",
    )


# --- agent (PROTOCOL.md §12) ----------------------------------------------------------------

# `agent` params this gateway accepts and ignores (docs/protocol-notes.md).
AGENT_IGNORED = ("thinking", "deliver", "channel", "provider", "model", "extraSystemPrompt", "label")


def parse_agent(params: dict[str, Any]) -> ChatSendParams:
    """Validate `agent` params as the `chat.send` they stand for: same checks, same admission.

    `sessionKey` (or `key`) is optional: without it the run goes to the agent's main session.
    `timeout` is in seconds (OpenClaw's unit). A bare key plus `agentId` means
    `agent:<agentId>:<key>`, as in `sessions.create`.
    """
    key, _agent = agent_session(params, default_name="main")
    assert key is not None
    timeout = params.get("timeout")
    timeout_ms: int | None = None
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 1 <= timeout <= 3600:
            raise invalid("timeout must be a number of seconds between 1 and 3600", field="timeout")
        timeout_ms = int(timeout * 1000)
    mapped: dict[str, Any] = {
        "sessionKey": key,
        "message": params.get("message"),
        "idempotencyKey": params.get("idempotencyKey"),
        "attachments": params.get("attachments"),
        "timeoutMs": timeout_ms,
        "queueMode": params.get("queueMode"),
    }
    return parse_chat_send({k: v for k, v in mapped.items() if v is not None})


def parse_approval_resolve(params: dict[str, Any]) -> tuple[str, str]:
    """`plugin.approval.resolve {id, decision}` (TOOLS.md §13.5): the approval id and the decision."""
    approval_id = get_str(params, "id", max_len=64)
    assert approval_id is not None
    if not APPROVAL_ID_RE.fullmatch(approval_id):
        raise ProtocolError("NOT_FOUND", "approval not found")  # no such id can exist: as for another user's
    decision = get_str(params, "decision", max_len=32)
    if decision not in APPROVAL_DECISIONS:
        raise invalid("decision must be allow-once or deny", field="decision")
    return approval_id, decision


# --- OpenClaw's client methods (docs/protocol-notes.md, "OpenClaw's own clients") ---------------

# A Control UI link names a session by the first 8..32 hex digits of the UUID its key ends with.
SHORT_ID_RE = re.compile(r"[0-9a-fA-F]{8,32}")
UUID_SUFFIX_RE = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", re.IGNORECASE)
# setTimeout's largest delay, the bound OpenClaw's clients put on a wait
MAX_WAIT_MS = 2_147_483_647
DEFAULT_AGENT_WAIT_MS = 30_000


def named_session(params: dict[str, Any]) -> tuple[str, str]:
    """A session named by `key` (or `sessionKey`), with `agentId` for a bare key, as OpenClaw's
    clients name one: the canonical key and its agent. The key is required."""
    key, agent_id = agent_session(params, default_name=None)
    if key is None:
        raise invalid("sessionKey is required", field="sessionKey")  # as every method says it
    return key, agent_id


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


@dataclass
class StartupParams:
    """`chat.startup`: a session's first page, named by its key or by a link's shortId."""

    limit: int
    max_bytes: int | None
    key: str | None = None
    short_id: str | None = None
    agent_id: str | None = None


def parse_chat_startup(params: dict[str, Any]) -> StartupParams:
    """Validate `chat.startup` params: `sessionKey` (as `chat.history`), or `shortId` with `agentId`."""
    limit = get_int(params, "limit", lo=1, hi=1000, default=200) or 200
    max_bytes = get_int(params, "maxBytes", lo=1024, hi=MAX_WAIT_MS, default=None)
    if params.get("shortId") is not None and params.get("sessionKey") is None and params.get("key") is None:
        agent_id = optional_agent(params)
        if agent_id is None:
            raise invalid("agentId is required with shortId", field="agentId")
        return StartupParams(limit, max_bytes, short_id=short_id(params), agent_id=agent_id)
    key, agent_id = named_session(params)
    return StartupParams(limit, max_bytes, key=key, agent_id=agent_id)


@dataclass
class AgentWaitParams:
    """`agent.wait {runId, timeoutMs?}`; an optional session key narrows a runId used in several."""

    run_id: str
    timeout_ms: int
    key: str | None


def parse_agent_wait(params: dict[str, Any]) -> AgentWaitParams:
    run_id = get_str(params, "runId", max_len=128, pattern=RUN_ID_RE)
    assert run_id is not None
    timeout_ms = get_int(params, "timeoutMs", lo=0, hi=MAX_WAIT_MS, default=DEFAULT_AGENT_WAIT_MS)
    key = None
    if params.get("sessionKey") is not None or params.get("key") is not None:
        key, _agent = named_session(params)
    return AgentWaitParams(run_id, DEFAULT_AGENT_WAIT_MS if timeout_ms is None else timeout_ms, key)


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


LIST_STATUSES = frozenset({"running", "done", "failed", "killed", "timeout", "none"})
# OpenClaw puts no bound on `limit` (its Control UI asks for 10000, its ACP bridge for up to 10101):
# a page is bounded anyway (at most `outbound.MAX_LIST_ROWS` rows, and one frame), so any positive
# number is taken.
MAX_LIST_LIMIT = MAX_WAIT_MS


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


MAX_HISTORY_LIMIT = 1000


def parse_sessions_get(params: dict[str, Any]) -> tuple[str, int]:
    """`sessions.get {key, limit?}`: the session, and how many of its newest messages (default 200).

    OpenClaw bounds `limit` only below (its ACP bridge asks for a million): more than
    `chat.history`'s 1000 is read as 1000.
    """
    key, _agent = named_session(params)
    limit = get_int(params, "limit", lo=1, hi=MAX_WAIT_MS, default=200) or 200
    return key, min(limit, MAX_HISTORY_LIMIT)


def parse_messages_subscribe(params: dict[str, Any]) -> tuple[str, bool]:
    """`sessions.messages.subscribe {key, agentId?, includeApprovals?}`: the session, and whether
    approvals are asked for (the handler checks the scope they need)."""
    key, _agent = named_session(params)
    return key, get_bool(params, "includeApprovals")


def parse_identity(params: dict[str, Any]) -> str:
    """`agent.identity.get {agentId?, sessionKey?}`: the agent asked about (`main` by default)."""
    if params.get("sessionKey") is not None or params.get("key") is not None:
        _key, agent_id = named_session(params)
        return agent_id
    return optional_agent(params) or "main"
