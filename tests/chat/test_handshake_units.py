"""The handshake's rules without a socket: parameters, close codes, scopes, hello-ok."""

from __future__ import annotations

from typing import Any

import pytest

from chat.protocol import scopes
from chat.websocket import handshake
from sessions_app.models import default_key_scopes

BASE: dict[str, Any] = {"minProtocol": 4, "maxProtocol": 4, "client": {"id": "c", "version": "1"}}


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({}, handshake.CLOSE_POLICY),
        ({**BASE, "client": {}}, handshake.CLOSE_POLICY),
        ({**BASE, "role": "node"}, handshake.CLOSE_POLICY),
        ({**BASE, "minProtocol": 5, "maxProtocol": 6}, handshake.CLOSE_PROTOCOL_MISMATCH),
    ],
)
def test_bad_connect_params_close_with_the_right_code(params: dict[str, Any], code: int) -> None:
    with pytest.raises(handshake.HandshakeError) as exc:
        handshake.parse_connect(params)
    assert exc.value.close_code == code


def test_token_and_scopes_are_read() -> None:
    p = handshake.parse_connect({**BASE, "auth": {"token": "agt_x"}, "scopes": ["operator.read"]})
    assert p.has_token and p.token == "agt_x" and p.requested_scopes == ["operator.read"]
    assert not handshake.parse_connect(BASE).has_token
    odd = handshake.parse_connect({**BASE, "auth": {"token": 5}})
    assert odd.has_token and odd.token is None  # a token that is not a string authenticates nobody


def test_scopes_granted() -> None:
    assert handshake.granted_scopes(None, staff=False) == ["operator.read", "operator.write"]
    assert handshake.granted_scopes(None, staff=True)[-1] == "operator.admin"
    # as OpenClaw grants them: admin implies the operator scopes, write implies read, admin is staff-only
    assert handshake.granted_scopes(["operator.admin", "operator.read"], staff=False) == [
        "operator.read",
        "operator.write",
        "operator.approvals",
    ]
    assert handshake.granted_scopes(["operator.admin"], staff=True) == [
        "operator.read",
        "operator.write",
        "operator.admin",
        "operator.approvals",
    ]
    assert handshake.granted_scopes(["operator.write"], staff=True) == ["operator.read", "operator.write"]
    assert handshake.granted_scopes(["operator.read", 7, "operator.talk"], staff=True) == ["operator.read"]


def test_a_keys_scopes_cap_what_is_granted() -> None:
    """KeyScope read/write/approvals/admin grant operator.read/write/approvals/admin, and no more."""
    assert scopes.of_key(["read", "write", "approvals", "admin", "root"]) == {
        "operator.read",
        "operator.write",
        "operator.approvals",
        "operator.admin",
    }
    default = scopes.of_key(default_key_scopes())
    for asked in (None, ["operator.read"], ["operator.admin"], ["operator.write", "operator.approvals"]):
        # a key with the default scopes: what a user who is not staff was granted before
        assert handshake.granted_scopes(asked, staff=False, key=default) == handshake.granted_scopes(asked, staff=False)
    assert handshake.granted_scopes(None, staff=True, key=default) == ["operator.read", "operator.write"]
    read_only = scopes.of_key(["read"])
    assert handshake.granted_scopes(["operator.admin"], staff=True, key=read_only) == ["operator.read"]
    assert handshake.granted_scopes(["operator.write"], staff=False, key=frozenset()) == []


def test_hello_lists_methods_and_announces_the_page_limits(settings: Any) -> None:
    settings.GATEWAY_MAX_MESSAGE_CHARS = 1234
    hello = handshake.hello_ok(conn_id="c1", scopes=["operator.read"], username="u", methods=["health"])
    assert hello["features"]["methods"] == ["connect", "health"]
    assert hello["policy"]["maxMessageChars"] == 1234
