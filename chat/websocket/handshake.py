"""The `connect` handshake (§2): its parameters, the scopes granted, and `hello-ok`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from chat.files import content
from chat.protocol import fields, frames, keys
from chat.protocol.errors import ProtocolError, invalid
from chat.protocol.scopes import Scope

# close codes (§2)
CLOSE_POLICY = 4008
CLOSE_PROTOCOL_MISMATCH = 4002
CLOSE_TOO_MANY_CONNECTIONS = 4029  # GATEWAY_MAX_CONNECTIONS_PER_USER reached (docs/protocol-notes.md)
CLOSE_UNAVAILABLE = 4013  # the database is away: try again after retryAfterMs (docs/protocol-notes.md)


@dataclass
class ConnectParams:
    token: str | None
    has_token: bool
    requested_scopes: list[Any] | None
    caps: frozenset[str] = frozenset()
    client_id: str = ""


class HandshakeError(Exception):
    """A failed `connect`: the error to answer, then the close code."""

    def __init__(self, error: ProtocolError, close_code: int) -> None:
        super().__init__(error.message)
        self.error = error
        self.close_code = close_code


def parse_connect(params: dict[str, Any]) -> ConnectParams:
    """Validate `connect` params; raise HandshakeError."""
    try:
        lo = fields.get_int(params, "minProtocol", lo=0, hi=1_000_000, default=None)
        hi = fields.get_int(params, "maxProtocol", lo=0, hi=1_000_000, default=None)
        if lo is None or hi is None:
            raise invalid(
                "minProtocol and maxProtocol are required", field="minProtocol" if lo is None else "maxProtocol"
            )
        client = params.get("client")
        if not isinstance(client, dict) or not isinstance(client.get("id"), str) or not client["id"]:
            raise invalid("client.id is required", field="client.id")
        if params.get("role", "operator") != "operator":
            raise invalid("role must be 'operator'", field="role")
    except ProtocolError as exc:
        raise HandshakeError(exc, CLOSE_POLICY) from exc
    if not (lo <= frames.PROTOCOL_VERSION <= hi):
        err = invalid("protocol version mismatch", code="PROTOCOL_MISMATCH", expectedProtocol=frames.PROTOCOL_VERSION)
        raise HandshakeError(err, CLOSE_PROTOCOL_MISMATCH)
    auth = params.get("auth")
    has_token = isinstance(auth, dict) and "token" in auth and auth["token"] is not None
    token = auth.get("token") if has_token and isinstance(auth, dict) else None
    requested = params.get("scopes")
    caps = params.get("caps")
    return ConnectParams(
        token=token if isinstance(token, str) else None,
        has_token=has_token,
        requested_scopes=requested if isinstance(requested, list) and requested else None,
        caps=frozenset(c for c in caps if isinstance(c, str)) if isinstance(caps, list) else frozenset(),
        client_id=client["id"],
    )


# What a requested scope also grants, as OpenClaw grants it (`operatorScopeSatisfied`): admin holds
# every operator scope, write holds read. Scopes this gateway does not know are ignored.
IMPLIED: dict[str, tuple[str, ...]] = {
    Scope.ADMIN.value: (Scope.READ.value, Scope.WRITE.value, Scope.APPROVALS.value),
    Scope.WRITE.value: (Scope.READ.value,),
}
ORDER = (Scope.READ.value, Scope.WRITE.value, Scope.ADMIN.value, Scope.APPROVALS.value)


def granted_scopes(requested: list[Any] | None, *, staff: bool, key: frozenset[str] | None = None) -> list[str]:
    """What the client asked for (with what each scope implies), within what the user may have and,
    for an API key, within what the key may grant (`key`: operator scopes, `scopes.of_key`).

    Every user may have read, write and `operator.approvals` (their own tool approvals, TOOLS.md
    §13.5); only staff may have admin, so a non-staff user asking for admin gets what admin implies
    that they may have, never admin. No scopes asked: read and write, plus admin for staff
    (approvals only when asked for, so a page that never answers approvals is not sent them).
    A key with the default scopes (read, write, approvals) leaves all of this as it was.
    """
    if requested is None:
        wanted = {Scope.READ.value, Scope.WRITE.value, Scope.ADMIN.value}
    else:
        wanted = {s for s in requested if isinstance(s, str)}
        for scope in list(wanted):
            wanted.update(IMPLIED.get(scope, ()))
    return [s for s in ORDER if s in wanted and (staff or s != Scope.ADMIN.value) and (key is None or s in key)]


def attachment_policy() -> dict[str, Any]:
    """What a send may attach (docs/files.md): `attachments` exactly as OpenClaw's schema closes it
    ({maxBytes, maxImageBytes}); the rest beside it (inline within `maxPayload`, larger by upload)."""
    return {
        "attachments": {
            "maxBytes": settings.GATEWAY_MAX_ATTACHMENT_BYTES,
            "maxImageBytes": min(settings.GATEWAY_MAX_IMAGE_BYTES, settings.GATEWAY_MAX_ATTACHMENT_BYTES),
        },
        "maxAttachments": settings.GATEWAY_MAX_ATTACHMENTS,
        "maxImagePixels": settings.GATEWAY_MAX_IMAGE_PIXELS,
        "attachmentTypes": list(content.ACCEPTED_TYPES),
        "uploadUrl": "/api/files",
    }


def hello_ok(*, conn_id: str, scopes: list[str], username: str, methods: list[str]) -> dict[str, Any]:
    return {
        "type": "hello-ok",
        "protocol": frames.PROTOCOL_VERSION,
        "server": {"version": settings.GATEWAY_VERSION, "connId": conn_id},
        "features": {"methods": ["connect", *methods], "events": frames.EVENTS},
        "snapshot": {
            "sessionDefaults": {"defaultAgentId": "main", "mainKey": "main", "mainSessionKey": "agent:main:main"}
        },
        "auth": {"role": "operator", "scopes": scopes, "user": username},
        "policy": {
            "maxPayload": settings.GATEWAY_MAX_PAYLOAD,
            "maxBufferedBytes": settings.GATEWAY_MAX_BUFFERED_BYTES,
            "tickIntervalMs": settings.GATEWAY_TICK_INTERVAL_MS,
            "maxMessageChars": settings.GATEWAY_MAX_MESSAGE_CHARS,
            # whole-string patterns, in the syntax JavaScript's RegExp also reads
            "sessionKeyNamePattern": f"^{keys.KEY_NAME_RE.pattern}$",
            "agentIdPattern": f"^{keys.AGENT_ID_RE.pattern}$",
            "idempotencyKeyPattern": f"^{fields.RUN_ID_RE.pattern}$",
            **attachment_policy(),
        },
    }
