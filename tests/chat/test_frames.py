"""The frame envelope: frame parsing and JSON encoding (no database)."""

import pytest

from chat.protocol import frames
from chat.protocol.errors import ProtocolError


@pytest.mark.parametrize(
    "text, field",
    [
        ("not json", None),
        ("[1,2]", None),
        ('{"type":"req","id":"1","method":"x","extra":1}', "extra"),
        ('{"type":"event","id":"1","method":"x"}', "type"),
        ('{"type":"req","method":"x"}', "id"),
        ('{"type":"req","id":"","method":"x"}', "id"),
        ('{"type":"req","id":"1"}', "method"),
        ('{"type":"req","id":"1","method":"x","params":[]}', "params"),
    ],
)
def test_bad_frames_are_invalid_request(text: str, field: str | None) -> None:
    with pytest.raises(ProtocolError) as err:
        frames.parse_frame(text)
    assert err.value.code == "INVALID_REQUEST"
    assert err.value.details.get("field") == field


def test_request_id_is_echoed_when_readable() -> None:
    with pytest.raises(ProtocolError) as err:
        frames.parse_frame('{"type":"req","id":"abc","method":""}')
    assert err.value.request_id == "abc"  # type: ignore[attr-defined]


def test_encode_is_utf8_text_and_escapes_a_lone_surrogate() -> None:
    """One encoding for every frame and event: UTF-8 (smaller than ASCII escapes), except that
    a lone surrogate, which UTF-8 cannot carry, is escaped so the frame can still be sent."""
    import json

    assert frames.encode({"text": "你好"}) == '{"text":"你好"}'
    escaped = frames.encode({"text": "a\ud800b"})
    assert escaped == '{"text":"a\\ud800b"}' and escaped.isascii()
    escaped.encode("utf-8")  # sendable
    assert json.loads(escaped) == {"text": "a\ud800b"}
