"""Session keys: canonical keys, and how requests name a session (no database)."""

from typing import Any

import pytest

from chat.methods.sessions import params as sessions_params
from chat.protocol import keys
from chat.protocol.errors import ProtocolError


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("main", ("agent:main:main", "main")),
        ("agent:main:a.b-c:d", ("agent:main:a.b-c:d", "main")),
        ("x:y", ("agent:main:x:y", "main")),
    ],
)
def test_canonical_keys(raw: str, expected: tuple[str, str]) -> None:
    assert keys.canonical_key(raw) == expected


@pytest.mark.parametrize("raw", ["", "a b", "agent:main:", "agent::x", "é", "x" * 201])
def test_bad_keys(raw: str) -> None:
    with pytest.raises(ProtocolError) as err:
        keys.canonical_key(raw)
    assert err.value.code == "INVALID_REQUEST" and err.value.details["field"] == "sessionKey"


def test_unknown_agent_is_not_found() -> None:
    with pytest.raises(ProtocolError) as err:
        keys.canonical_key("agent:ghost:main")
    assert err.value.code == "NOT_FOUND"


@pytest.mark.parametrize(
    "parse",
    [
        keys.session_key_param,
        keys.named_session,
        lambda params: keys.agent_session(params, default_name=None),
        sessions_params.parse_sessions_create,
    ],
)
def test_key_and_session_key_naming_different_sessions_is_refused(parse: Any) -> None:
    with pytest.raises(ProtocolError) as err:
        parse({"key": "a", "sessionKey": "b"})
    assert (err.value.code, err.value.details["field"]) == ("INVALID_REQUEST", "key")
    parse({"key": "a", "sessionKey": "a"})  # the same session twice is fine
