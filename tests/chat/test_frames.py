"""Frame parsing and parameter validation (no database)."""

import base64
from typing import Any

import pytest

from chat.protocol import frames
from chat.protocol.frames import ProtocolError
from tests.support.db import send_params


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


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("main", ("agent:main:main", "main")),
        ("agent:main:a.b-c:d", ("agent:main:a.b-c:d", "main")),
        ("x:y", ("agent:main:x:y", "main")),
    ],
)
def test_canonical_keys(raw: str, expected: tuple[str, str]) -> None:
    assert frames.canonical_key(raw) == expected


@pytest.mark.parametrize("raw", ["", "a b", "agent:main:", "agent::x", "é", "x" * 201])
def test_bad_keys(raw: str) -> None:
    with pytest.raises(ProtocolError) as err:
        frames.canonical_key(raw)
    assert err.value.code == "INVALID_REQUEST" and err.value.details["field"] == "sessionKey"


def test_unknown_agent_is_not_found() -> None:
    with pytest.raises(ProtocolError) as err:
        frames.canonical_key("agent:ghost:main")
    assert err.value.code == "NOT_FOUND"


def _send(**over: object) -> dict:
    """A valid chat.send's params with some fields replaced (or set to bad values)."""
    return {**send_params("main", "hi", "k"), **over}


@pytest.mark.parametrize(
    "params, field",
    [
        (_send(message=5), "message"),
        (_send(message="a\x00b"), "message"),
        (_send(message=""), "message"),
        (_send(message="x" * 32001), "message"),
        (_send(sessionKey=None), "sessionKey"),
        (_send(idempotencyKey=""), "idempotencyKey"),
        (_send(idempotencyKey="a" * 129), "idempotencyKey"),
        (_send(idempotencyKey="a b"), "idempotencyKey"),
        (_send(timeoutMs=999), "timeoutMs"),
        (_send(timeoutMs="1000"), "timeoutMs"),
        (_send(waitMs=120001), "waitMs"),
        (_send(queueMode="later"), "queueMode"),
        (_send(attachments={}), "attachments"),
        (_send(attachments=[{"mimeType": "application/pdf", "content": "AAAA"}]), "attachments[0].mimeType"),
        (_send(attachments=[{"mimeType": "image/png", "content": "!!!"}]), "attachments[0].content"),
        (
            _send(attachments=[{"mimeType": "image/png", "content": base64.b64encode(b"hello").decode()}]),
            "attachments[0].mimeType",
        ),
        (
            _send(attachments=[{"mimeType": "text/plain", "content": base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()}]),
            "attachments[0].mimeType",
        ),
        (_send(attachments=[{"mimeType": "text/plain", "content": "aGk="}] * 5), "attachments"),
    ],
)
def test_chat_send_validation(params: dict, field: str, settings: object) -> None:
    with pytest.raises(ProtocolError) as err:
        frames.parse_chat_send(params)
    assert err.value.code == "INVALID_REQUEST"
    assert err.value.details["field"] == field


def test_control_chars_are_stripped_and_attachments_sniffed() -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 8).decode()
    parsed = frames.parse_chat_send(
        _send(message="a\x07b\tc\n", attachments=[{"mimeType": "image/png", "content": png, "fileName": "x.png"}])
    )
    assert parsed.message == "ab\tc\n"
    assert parsed.attachments[0]["size"] == 16 and parsed.attachments[0]["mimeType"] == "image/png"


def test_empty_message_allowed_with_attachment() -> None:
    parsed = frames.parse_chat_send(_send(message="", attachments=[{"mimeType": "text/plain", "content": "aGk="}]))
    assert parsed.message == "" and len(parsed.attachments) == 1


def test_body_hash_distinguishes_messages() -> None:
    a = frames.parse_chat_send(_send(message="a")).body_hash
    b = frames.parse_chat_send(_send(message="b")).body_hash
    assert a != b and a == frames.parse_chat_send(_send(message="a")).body_hash


@pytest.mark.parametrize(
    "msg, cmd, arg",
    [
        ("/stop", "/stop", None),
        (" /new ", "/new", None),
        ("/reset", "/reset", None),
        ("/stop now", None, None),
        ("/think", "/think", None),
        ("/think HIGH", "/think", "high"),
        ("/think default", "/think", ""),
        # a command word and a sentence: a message for the model
        ("/think about this bug", None, None),
        ("/model is great", None, None),
        ("/verbose on please", None, None),
    ],
)
def test_commands(msg: str, cmd: str | None, arg: str | None) -> None:
    parsed = frames.parse_chat_send(_send(message=msg))
    assert (parsed.command, parsed.command_arg) == (cmd, arg)


@pytest.mark.parametrize("msg", ["/think hgih", "/verbose loud", "/model gpt-9"])
def test_a_command_with_one_bad_argument_is_refused(msg: str) -> None:
    with pytest.raises(ProtocolError) as err:
        frames.parse_chat_send(_send(message=msg))
    assert (err.value.code, err.value.details["field"]) == ("INVALID_REQUEST", "message")


@pytest.mark.parametrize(
    "parse",
    [
        frames.session_key_param,
        frames.named_session,
        lambda params: frames.agent_session(params, default_name=None),
        frames.parse_sessions_create,
    ],
)
def test_key_and_session_key_naming_different_sessions_is_refused(parse: Any) -> None:
    with pytest.raises(ProtocolError) as err:
        parse({"key": "a", "sessionKey": "b"})
    assert (err.value.code, err.value.details["field"]) == ("INVALID_REQUEST", "key")
    parse({"key": "a", "sessionKey": "a"})  # the same session twice is fine


def test_a_create_without_a_key_derives_its_name_from_the_first_messages_key() -> None:
    first = frames.parse_sessions_create({"message": "hi", "idempotencyKey": "k-1"})
    assert first.first is not None and first.first.run_id == "k-1" and first.derived_key
    assert first.key == frames.parse_sessions_create({"message": "hi", "idempotencyKey": "k-1"}).key
    assert first.key == "agent:main:" + frames.derived_name("k-1") and first.key != "agent:main:s-"
    # no first message, or no idempotencyKey: a generated name, a fresh runId
    assert frames.parse_sessions_create({"idempotencyKey": "k-1"}).key is None
    fresh = frames.parse_sessions_create({"message": "hi"})
    assert fresh.key is None and fresh.first is not None and fresh.first.run_id != "k-1"
    with pytest.raises(ProtocolError) as err:
        frames.parse_sessions_create({"message": "hi", "idempotencyKey": "a b"})
    assert err.value.details["field"] == "idempotencyKey"


def test_encode_is_utf8_text_and_escapes_a_lone_surrogate() -> None:
    """One encoding for every frame and event: UTF-8 (smaller than ASCII escapes), except that
    a lone surrogate, which UTF-8 cannot carry, is escaped so the frame can still be sent."""
    import json

    assert frames.encode({"text": "你好"}) == '{"text":"你好"}'
    escaped = frames.encode({"text": "a\ud800b"})
    assert escaped == '{"text":"a\\ud800b"}' and escaped.isascii()
    escaped.encode("utf-8")  # sendable
    assert json.loads(escaped) == {"text": "a\ud800b"}
