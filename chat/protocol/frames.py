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
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.conf import settings

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
    """Which param names the session: `sessionKey`, or its synonym `key` (OpenClaw's Node client)."""
    return "key" if params.get("sessionKey") is None and params.get("key") is not None else "sessionKey"


def session_key_param(params: dict[str, Any]) -> tuple[str, str]:
    """The canonical key and agent id of the session a request names by `sessionKey` or `key`.

    Errors name whichever of the two the client sent. Both present and different is an error.
    """
    name = session_key_name(params)
    if name == "sessionKey" and params.get("key") is not None and params.get("key") != params.get("sessionKey"):
        raise invalid("key and sessionKey name different sessions", field="key")
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
    agent_id = get_str(params, "agentId", required=False, max_len=64, pattern=AGENT_ID_RE)
    if agent_id is not None and agent_id not in settings.GATEWAY_AGENTS:
        raise ProtocolError("NOT_FOUND", f"unknown agent: {agent_id}", field="agentId")
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

    @property
    def body_hash(self) -> str:
        body = {
            "message": self.message,
            "attachments": [[a["mimeType"], a["fileName"], a["sha256"]] for a in self.attachments],
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()

    @property
    def command(self) -> str | None:
        text = self.message.strip()
        if not self.attachments and text in STOP_COMMANDS | RESET_COMMANDS:
            return text
        return None


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
    if queue_mode not in ("followup", "interrupt"):
        raise invalid("queueMode must be 'followup' or 'interrupt'", field="queueMode")
    return ChatSendParams(
        key=key,
        agent_id=agent_id,
        message=message,
        run_id=run_id,
        attachments=attachments,
        timeout_ms=timeout_ms or settings.GATEWAY_DEFAULT_TIMEOUT_MS,
        wait_ms=wait_ms or 0,
        queue_mode=queue_mode,
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
