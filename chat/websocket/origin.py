"""Origin check for WebSocket handshakes (§2.6).

Channels' AllowedHostsOriginValidator refuses a missing Origin, but API clients send
none; so: no Origin header → allowed. An Origin must be the gateway's own origin
(scheme, host and port of the request, its host in ALLOWED_HOSTS), as Django's CSRF
check compares it, or one listed in GATEWAY_ALLOWED_ORIGINS (or CSRF_TRUSTED_ORIGINS).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


class OriginValidator:
    """ASGI middleware refusing cross-site WebSocket handshakes before accept."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket":
            headers = dict(scope.get("headers", []))
            origin = headers.get(b"origin")
            host = headers.get(b"host")
            secure = scope.get("scheme") in ("wss", "https")
            if origin is not None and not origin_allowed(
                origin.decode("latin1"), host.decode("latin1") if host is not None else None, secure=secure
            ):
                denier = WebsocketDenier()
                return await denier(scope, receive, send)  # type: ignore[arg-type]
        return await self.application(scope, receive, send)


def normalize_origin(origin: str) -> str | None:
    """`scheme://host[:port]` with the scheme's default port left out; None when not an http(s) origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    if port is None or port == DEFAULT_PORTS[parts.scheme]:
        return f"{parts.scheme}://{host}"
    return f"{parts.scheme}://{host}:{port}"


def trusted_origins() -> set[str]:
    listed = [*settings.GATEWAY_ALLOWED_ORIGINS, *settings.CSRF_TRUSTED_ORIGINS]
    return {o for o in (normalize_origin(item) for item in listed) if o is not None}


def origin_allowed(origin: str, host: str | None, *, secure: bool = False) -> bool:
    """Whether a handshake's Origin may open the gateway served at `host`."""
    seen = normalize_origin(origin)
    if seen is None:
        return False
    if seen in trusted_origins():
        return True
    if not host:
        return False
    domain, _port = split_domain_port(host)
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    if not domain or not validate_host(domain, allowed):
        return False
    return seen == normalize_origin(f"{'https' if secure else 'http'}://{host}")
