"""The WebSocket Origin check: the gateway's own origin in full, or one listed; nothing else."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator

from chat.websocket.origin import normalize_origin, origin_allowed
from gatewayproject.asgi import application


@pytest.mark.parametrize(
    ("origin", "host", "secure", "allowed"),
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", False, True),
        ("http://localhost", "localhost:80", False, True),  # default port either way
        ("https://localhost", "localhost", True, True),
        ("http://127.0.0.1:9999", "127.0.0.1:8000", False, False),  # another port: another site
        ("https://127.0.0.1:8000", "127.0.0.1:8000", False, False),  # another scheme
        ("http://evil.example", "127.0.0.1:8000", False, False),
        ("http://evil.example:8000", "evil.example:8000", False, False),  # host not in ALLOWED_HOSTS
        ("http://127.0.0.1:8000", None, False, False),  # no Host to compare with
        ("null", "127.0.0.1:8000", False, False),
        ("file://", "127.0.0.1:8000", False, False),
        ("http://127.0.0.1:8000/path", "127.0.0.1:8000", False, False),
    ],
)
def test_origin_compared_in_full(origin: str, host: str | None, secure: bool, allowed: bool) -> None:
    assert origin_allowed(origin, host, secure=secure) is allowed


def test_listed_origins_are_allowed(settings: pytest.FixtureRequest) -> None:
    settings.GATEWAY_ALLOWED_ORIGINS = ["https://chat.example.com", "http://127.0.0.1:3000"]  # type: ignore[attr-defined]
    assert origin_allowed("https://chat.example.com", "127.0.0.1:8000")
    assert origin_allowed("http://127.0.0.1:3000", "127.0.0.1:8000")
    assert not origin_allowed("http://127.0.0.1:3001", "127.0.0.1:8000")


def test_normalize_origin() -> None:
    assert normalize_origin("HTTP://LocalHost:80") == "http://localhost"
    assert normalize_origin("https://[::1]:8443") == "https://[::1]:8443"
    assert normalize_origin("http://x:notaport") is None
    assert normalize_origin("ws://localhost") is None


@pytest.mark.django_db(transaction=True)
async def test_other_port_is_refused_before_accept() -> None:
    headers = [(b"origin", b"http://127.0.0.1:9999"), (b"host", b"127.0.0.1:8000")]
    comm = WebsocketCommunicator(application, "/ws/gateway", headers=headers)
    accepted, _ = await comm.connect()
    assert not accepted
