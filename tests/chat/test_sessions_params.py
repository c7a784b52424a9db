"""`sessions.*` params (no database)."""

import pytest

from chat.methods.sessions import params as sessions_params
from chat.protocol.errors import ProtocolError


def test_a_create_without_a_key_derives_its_name_from_the_first_messages_key() -> None:
    first = sessions_params.parse_sessions_create({"message": "hi", "idempotencyKey": "k-1"})
    assert first.first is not None and first.first.run_id == "k-1" and first.derived_key
    assert first.key == sessions_params.parse_sessions_create({"message": "hi", "idempotencyKey": "k-1"}).key
    assert first.key == "agent:main:" + sessions_params.derived_name("k-1") and first.key != "agent:main:s-"
    # no first message, or no idempotencyKey: a generated name, a fresh runId
    assert sessions_params.parse_sessions_create({"idempotencyKey": "k-1"}).key is None
    fresh = sessions_params.parse_sessions_create({"message": "hi"})
    assert fresh.key is None and fresh.first is not None and fresh.first.run_id != "k-1"
    with pytest.raises(ProtocolError) as err:
        sessions_params.parse_sessions_create({"message": "hi", "idempotencyKey": "a b"})
    assert err.value.details["field"] == "idempotencyKey"
