"""`chat.send` params (§4), validated completely before anything is stored: the message, its
attachments (sniffed), the key, the budgets.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from chat.methods.commands import command_line, parse_command
from chat.protocol.errors import invalid
from chat.protocol.fields import CONTROL_RE, RUN_ID_RE, get_int, get_str, require_unicode
from chat.protocol.keys import session_key_param
from sessions_app.models import Run, RunSurface, SessionKind

MIME_RE = re.compile(r"(image|text)/[A-Za-z0-9.+-]+")
# chat.send's queueMode values; `steer` is OpenClaw's name for what sessions.steer does here.
QUEUE_MODES = ("followup", "interrupt", "steer")


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


def attachment(item: Any, where: str) -> dict[str, Any]:
    """One attachment (`{mimeType, fileName?, content}`, base64) checked and sniffed; errors name `where`."""
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
    # The HTTP API's additions (HTTP-API.md §14): the door, what the request adds to the run, the
    # kind of a session it creates, and the hash of the whole request (what a reused key is checked
    # against, instead of the message alone).
    surface: str = RunSurface.WEBSOCKET
    request: dict[str, Any] | None = None
    session_kind: str = SessionKind.DIRECT
    request_hash: str = ""
    on_admitted: Callable[[Run], None] | None = None  # `SendRequest.on_admitted`
    owner_scoped_key: bool = False  # `SendRequest.owner_scoped_key`
    api_token_id: int | None = None  # the API key an HTTP request came with (its budgets apply)

    @property
    def body_hash(self) -> str:
        if self.request_hash:
            return self.request_hash
        body = {
            "message": self.message,
            "attachments": [[a["mimeType"], a["fileName"], a["sha256"]] for a in self.attachments],
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


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
    attachments = [attachment(item, f"attachments[{i}]") for i, item in enumerate(raw_attachments)]
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
