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

from chat.files import content
from chat.methods.commands import command_line, parse_command
from chat.protocol.errors import invalid
from chat.protocol.fields import CONTROL_RE, RUN_ID_RE, get_int, get_str, require_unicode
from chat.protocol.keys import session_key_param
from sessions_app.lifecycle.branches import Regeneration
from sessions_app.models import Run, RunSurface, SessionKind

MIME_RE = re.compile(r"(image|text)/[A-Za-z0-9.+-]+|application/(pdf|json)")
FILE_ID_RE = re.compile(r"file-[0-9a-f]{32}")
# chat.send's queueMode values: `steer` delivers the message into the session's working run (as
# sessions.steer does), `interrupt` stops that run and starts the message (docs/protocol-notes.md, "Steering").
QUEUE_MODES = ("followup", "interrupt", "steer")
# An inline image's bytes, carried from the params to admission (which stores them and drops this key).
INLINE_BYTES = "_bytes"


def sniff(data: bytes) -> str:
    """Best-effort type of `data`: an image/* type, 'application/pdf', 'text', or 'binary'."""
    return content.sniff(data)


def attachment(item: Any, where: str) -> dict[str, Any]:
    """One attachment checked and sniffed; errors name `where`. Either a stored file (`{fileId}`, from
    `POST /api/files`: resolved for its owner at admission) or inline (`{mimeType, fileName?, content}`,
    base64): an image, or a document whose text is kept (text, Markdown, CSV, JSON, PDF)."""
    if not isinstance(item, dict):
        raise invalid("attachment must be an object", field=where)
    if item.get("fileId") is not None:
        file_id = item["fileId"]
        if not isinstance(file_id, str) or not FILE_ID_RE.fullmatch(file_id):
            raise invalid("fileId must be the id POST /api/files answered", field=f"{where}.fileId")
        if item.get("content") is not None:
            raise invalid("an attachment has either fileId or content, not both", field=f"{where}.content")
        return {"fileId": file_id, "where": f"{where}.fileId"}  # `where`: the field an error names
    mime = item.get("mimeType")
    if not isinstance(mime, str) or not MIME_RE.fullmatch(mime):
        raise invalid(
            "mimeType must be image/*, text/*, application/pdf or application/json", field=f"{where}.mimeType"
        )
    name = item.get("fileName")
    if name is not None and (not isinstance(name, str) or len(name) > 255):
        raise invalid("fileName must be a string of at most 255 chars", field=f"{where}.fileName")
    if name is not None:
        require_unicode(name, f"{where}.fileName")
    raw = item.get("content")
    if not isinstance(raw, str) or not raw:
        raise invalid("content must be a non-empty base64 string", field=f"{where}.content")
    if len(raw) > (settings.GATEWAY_MAX_ATTACHMENT_BYTES * 4) // 3 + 8:
        raise invalid("attachment is larger than allowed", field=f"{where}.content")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid("content is not valid base64", field=f"{where}.content") from exc
    if len(data) > settings.GATEWAY_MAX_ATTACHMENT_BYTES:
        raise invalid("attachment is larger than allowed", field=f"{where}.content")
    kind = sniff(data)
    major = mime.split("/", 1)[0]
    if major == "image" or mime == "application/pdf":
        normalized = "image/jpeg" if mime == "image/jpg" else mime
        if kind != normalized:
            raise invalid("mimeType does not match the content", field=f"{where}.mimeType", sniffed=kind)
    elif kind != "text":
        raise invalid("mimeType does not match the content", field=f"{where}.mimeType", sniffed=kind)
    try:
        found = content.inspect(data, name=name, declared=mime)
    except content.FileRefused as exc:
        raise invalid(exc.message, field=f"{where}.content", reason=exc.reason) from exc
    out: dict[str, Any] = {
        "mimeType": mime,
        "fileName": name,
        "size": len(data),
        "sha256": found.sha256,
        "text": found.text,
    }
    if found.is_image:
        out[INLINE_BYTES] = data
    return out


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
    # A steer (sessions.steer, or queueMode "steer"): delivered into the active run when it can take it
    # (`lifecycle.steering`), else queued as a follow-up.
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
    # Branches (docs/branches.md): `expectedLeafEntryId` (`SendRequest.check_leaf`), chat.regenerate's
    # sibling, a `previous_response_id`'s own branch (`SendRequest.follows`).
    check_leaf: bool = False
    expected_leaf: int | None = None
    regeneration: Regeneration | None = None
    follows: int | None = None
    api_token_id: int | None = None  # the API key an HTTP request came with (its budgets apply)

    @property
    def body_hash(self) -> str:
        if self.request_hash:
            return self.request_hash
        body = {
            "message": self.message,
            "attachments": [
                [a["mimeType"], a["fileName"], a["sha256"]] if "sha256" in a else ["file", a["fileId"]]
                for a in self.attachments
            ],
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
    check_leaf, expected_leaf = expected_leaf_param(params)
    return ChatSendParams(
        check_leaf=check_leaf,
        expected_leaf=expected_leaf,
        key=key,
        agent_id=agent_id,
        message=message,
        run_id=run_id,
        attachments=attachments,
        timeout_ms=timeout_ms or settings.GATEWAY_DEFAULT_TIMEOUT_MS,
        wait_ms=wait_ms or 0,
        queue_mode=queue_mode,
        steer=steer,
        command=command[0] if command else None,
        command_arg=command[1] if command else None,
        command_text=text.strip() if command else "",
    )


def expected_leaf_param(params: dict[str, Any]) -> tuple[bool, int | None]:
    """`expectedLeafEntryId` (OpenClaw's): absent, no check; null, the active branch must be empty; an
    entry id, it must be the active leaf (an id of no message here never is)."""
    if "expectedLeafEntryId" not in params:
        return False, None
    value = params["expectedLeafEntryId"]
    if value is None:
        return True, None
    if not isinstance(value, str) or not value.strip():
        raise invalid("expectedLeafEntryId must be a non-empty string or null", field="expectedLeafEntryId")
    value = value.strip()
    return True, int(value) if value.isdigit() and len(value) < 19 else -1
