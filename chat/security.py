"""Origin check for WebSocket handshakes (§2.6).

Channels' AllowedHostsOriginValidator refuses a missing Origin, but API clients
send none; so: no Origin header → allowed, an Origin → must match ALLOWED_HOSTS.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port
from django.utils.http import is_same_domain


class OriginValidator:
    """ASGI middleware refusing cross-site WebSocket handshakes before accept."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket":
            origin = next((v for k, v in scope.get("headers", []) if k == b"origin"), None)
            if origin is not None and not origin_allowed(origin.decode("latin1")):
                denier = WebsocketDenier()
                return await denier(scope, receive, send)  # type: ignore[arg-type]
        return await self.application(scope, receive, send)


def origin_allowed(origin: str) -> bool:
    parsed = urlparse(origin)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return False
    host, _port = split_domain_port(parsed.netloc)
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return any(pattern == "*" or is_same_domain(host, pattern) for pattern in allowed)
